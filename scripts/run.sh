#!/usr/bin/env bash
# run.sh: `make run` — serve the default model on this machine for a first try.
#
# Host sockets (no root needed), development certificates and tokens made on first use
# under build/run/ (kept across runs), a config written there from the defaults. Prints
# how to connect, then runs kilnd serve in the foreground until Ctrl-C (which drains).
#   KILND, MODEL, THREADS, PORT (8443), METRICS_PORT (9100) from the environment.
set -euo pipefail
KILND=${KILND:-build/gnu/kilnd}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-$(nproc)}
PORT=${PORT:-8443} METRICS_PORT=${METRICS_PORT:-9100}
D=build/run
mkdir -p "$D"

[ -f "$D/tls/server.crt" ] || "$KILND" certs --dir "$D/tls"
if [ ! -f "$D/tokens.txt" ]; then
  umask 077
  printf '# role token (one per line); kilnd reads this at start and on RELOAD\nuser %s\nadmin %s\n' \
    "user-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')" \
    "admin-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')" >"$D/tokens.txt"
fi
cat >"$D/kiln.ini" <<EOF
; written by scripts/run.sh for \`make run\`; see docs/CONFIG.md
[model]
path = $MODEL
[engine]
threads = $THREADS
max_seq_len = 2048
kv_pool_mb = 512
[net]
driver = host
listen = 127.0.0.1:$PORT
metrics_port = $METRICS_PORT
cert = $D/tls/server.crt
key = $D/tls/server.key
tokens_file = $D/tokens.txt
EOF

UTOK=$(awk '$1 == "user" {print $2; exit}' "$D/tokens.txt")
cat <<EOF
----------------------------------------------------------------------------
kiln: serving $MODEL on 127.0.0.1:$PORT (TLS), metrics on http://127.0.0.1:$METRICS_PORT/metrics
Connect by hand (docs/PROTOCOL.md):
  openssl s_client -quiet -CAfile $D/tls/ca.crt -servername localhost -connect 127.0.0.1:$PORT
then type:
  HELLO kiln/1 token=$UTOK
  GEN id=1 chat=1 max_tokens=64 prompt="Why is the sky blue?"
or the OpenAI API on the same port (README.md has a chat completion):
  curl --cacert $D/tls/ca.crt https://127.0.0.1:$PORT/v1/models -H "Authorization: Bearer $UTOK"
Tokens (user, admin): $D/tokens.txt   Stop: Ctrl-C (drains running requests).
----------------------------------------------------------------------------
EOF
exec "$KILND" serve --config "$D/kiln.ini"
