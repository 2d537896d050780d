/* kilnd: the kiln engine. `kilnd serve` is the appliance's main job (kilnd/serve.c);
 * the other subcommands run the engine core from the command line:
 *   kilnd serve [--config kiln.ini] [--set section.key=value]...
 *   kilnd certs --dir DIR
 *   kilnd generate --model PATH --prompt TEXT [--chat] [sampling flags]
 *   kilnd bench    --model PATH [--threads N] [--prompt-tokens N] [--gen-tokens N]
 *   kilnd tokenize / detokenize --model PATH ...   (see kilnd/tokenize.c) */
#include <stdio.h>
#include <string.h>

#include "kilnd/kilnd.h"

void kd_usage(void) {
    fprintf(stderr,
            "kilnd " KILN_VERSION " - the kiln inference engine\n"
            "usage:\n"
            "  kilnd serve [--config kiln.ini] [--model PATH] [--threads N]\n"
            "      [--set section.key=value]... [--control PATH]\n"
            "      serve the line protocol over TLS (PATH: kiln-init's control socket)\n"
            "  kilnd check-config [the same flags]   check config, model and TLS files\n"
            "  kilnd certs --dir DIR [--hosts h1,h2] [--force]\n"
            "      development CA, server and client certificates\n"
            "  kilnd generate --model PATH (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
            "      --chat              wrap the prompt in the model's chat template\n"
            "      --system TEXT       system message (with --chat)\n"
            "      --max-tokens N      tokens to generate (default 128)\n"
            "      --temperature F --top-k N --top-p F --min-p F --seed N\n"
            "      --repeat-penalty F --repeat-last-n N --presence-penalty F\n"
            "      --frequency-penalty F --stop TEXT (up to 8)\n"
            "      --threads N --ctx N --chunk N (prefill tokens per step)\n"
            "      --backend auto|cpu|cuda (auto: the GPU when this kilnd has CUDA and one)\n"
            "      --ids               print generated token ids instead of text\n"
            "      --dump-logits FILE  write the last prompt position's logits (f32)\n"
            "      --dump-prompt-logits FILE  every prompt position's logits, [n][n_vocab]\n"
            "                          f32 (the prompt run once more, straight through\n"
            "                          the backend, before the request)\n"
            "      --exact             f32 activations, no 8-bit rounding (slow; for\n"
            "                          comparing with an f32 reference)\n"
            "  kilnd bench --model PATH [--threads N] [--prompt-tokens 512] [--gen-tokens 128]\n"
            "      [--repeat 3]\n"
            "  kilnd bench-engine --model PATH [--requests N] [--concurrency C]\n"
            "      [--prompt-tokens P | --prompt-file F] [--gen-tokens G] [--max-batch B]\n"
            "      [--max-batched-tokens T] [--kv-blocks N] [--prefix-caching 0|1] [--backend B] [--json]\n"
            "  kilnd tokenize --model PATH (--text TEXT | --hex) [--special]\n"
            "  kilnd detokenize --model PATH --hex\n"
            "  kilnd shape SHAPE OUT.gguf [--type Q4_K_M] [--threads N] | SHAPE --plan | --list\n"
            "      a random-weight model of a real model's shape (see kilnd shape --list)\n"
            "  kilnd version\n");
}

/* ------------------------------------------------------------------ main */

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"serve", kd_serve},       {"certs", kd_certs},       {"check-config", kd_check_config},
    {"generate", kd_generate}, {"bench", kd_bench},       {"bench-engine", kd_bench_engine},
    {"tokenize", kd_tokenize}, {"detokenize", kd_detokenize}, {"shape", kd_shape},
};

int main(int argc, char **argv) {
    if (argc < 2) { kd_usage(); return 2; }
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("kilnd " KILN_VERSION "\n");
        return 0;
    }
    int help = !strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h");
    if (!help) fprintf(stderr, "kilnd: unknown command '%s'\n", cmd);
    kd_usage();
    return help ? 0 : 2;
}
