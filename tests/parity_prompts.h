/* parity_prompts.h: tests/ref/parity.py's seven prompts, for the C programs that measure
 * against them (tests/unit/test_kv8.c, tests/gpu/gpu_test.c, tests/gpu/gpu_bench.c).
 * The chat ones go through ChatML with SmolLM2's system message, exactly as
 * ref_llama.chatml writes them; parity_text renders a prompt for tok_encode with
 * special tokens parsed and no BOS. */
#ifndef KILN_TESTS_PARITY_PROMPTS_H
#define KILN_TESTS_PARITY_PROMPTS_H

#include <stdio.h>

typedef struct {
    const char *name, *text;
    int chat;
} parity_prompt;

static const parity_prompt PARITY_PROMPTS[] = {
    {"chatml-capital", "What is the capital of France?", 1},
    {"chatml-code", "Write a Python function that reverses a string.", 1},
    {"fr-accents", "Le café où j'ai rencontré Hélène était très agréable ; "
                   "nous avons parlé de l'été à Montréal et", 0},
    {"zh", "北京是中国的首都，也是一座历史悠久的城市。它的著名景点包括", 0},
    {"emoji", "My favourite foods are pizza 🍕, sushi 🍣 and ice cream 🍦 because", 0},
    {"code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
             "    if n < 2:\n", 0},
    {"digits", "The year 1969 saw 3 astronauts travel 384400 km; in 2024, ", 0},
};
#define N_PARITY_PROMPTS ((int)(sizeof PARITY_PROMPTS / sizeof PARITY_PROMPTS[0]))

#define PARITY_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

/* The text to tokenize into buf: its length, or -1 when cap is too small. */
static inline int parity_text(const parity_prompt *p, char *buf, size_t cap) {
    int n = p->chat ? snprintf(buf, cap,
                               "<|im_start|>system\n" PARITY_SYSTEM "<|im_end|>\n<|im_start|>user\n"
                               "%s<|im_end|>\n<|im_start|>assistant\n", p->text)
                    : snprintf(buf, cap, "%s", p->text);
    return n >= 0 && (size_t)n < cap ? n : -1;
}

#endif
