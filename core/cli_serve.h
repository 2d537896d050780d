/* cli_serve: `kilnd serve` (the server on the configured transport) and `kilnd certs`
 * (development TLS certificates). See core/cli_serve.c for the flags. */
#ifndef KILN_CLI_SERVE_H
#define KILN_CLI_SERVE_H

int cli_serve(int argc, char **argv);
int cli_certs(int argc, char **argv);
int cli_check_config(int argc, char **argv);

#endif
