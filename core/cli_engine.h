/* cli_engine: `kilnd bench-engine`, the offline driver through the real scheduler. */
#ifndef KILN_CLI_ENGINE_H
#define KILN_CLI_ENGINE_H
int cli_bench_engine(int argc, char **argv);
#endif
