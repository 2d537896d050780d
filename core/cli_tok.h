/* cli_tok: `kilnd tokenize` and `kilnd detokenize` (argv[0] is the subcommand name).
 *   tokenize   --model PATH (--text TEXT | --hex) [--special]
 *              --hex: each stdin line is hex-encoded UTF-8; prints its ids per line
 *   detokenize --model PATH [--hex] [--special] [--ids "1 2 3"]
 *              each stdin line holds space-separated ids; prints the text (--hex: hex)
 * Return the process exit status: 0 ok, 1 runtime error, 2 usage. */
#ifndef KILN_CLI_TOK_H
#define KILN_CLI_TOK_H
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
#endif
