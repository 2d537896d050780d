#!/usr/bin/env bash
# serve.sh: `kilnd serve` end to end over one transport, with tests/net/serve_client.py.
#
#   tests/net/serve.sh host|tap|packet [all|basic|mtls|limits|tls|sdk|openai|fault|ladder]
#   (BUILD, MODEL, KILND, PY from the environment; limits: short handshake and idle timeouts, 4
#   connections at most; tls: the key-exchange groups and suites offered, and TLS 1.3
#   KeyUpdates from the client, through openssl s_client; sdk: the client SDKs' acceptance tests, tests/sdk/, instead of
#   serve_client.py; openai: the OpenAI API through the official `openai` package
#   (tests/net/openai_test.py, the venv's python), curl and raw sockets;
#   fault: kilnd --faults, a step that never completes → ERR 503 restarting, exit 75;
#   abuse: tests/net/abuse_test.py, one client trying to take the box from the others;
#   alloc: tests/net/alloc_test.py under tests/shim/alloc_count.c, no loop-thread malloc
#   per connection or request)
#
# host:   kernel sockets on 127.0.0.1.
# tap:    lwIP on a TAP device in a network namespace this script creates; the client
#         runs in the same namespace against lwIP's address.
# packet: lwIP over AF_PACKET on one end of a veth pair (its own namespace, no kernel
#         address); the client is in a second namespace on the other end, whose
#         offloads are left on (checksum-partial and GSO frames reach lwIP).
# The namespaces and kilnd are removed on exit whatever happens. Needs root for tap and
# packet. Everything is bounded in time.
set -euo pipefail
MODE=${1:?usage: serve.sh host|tap|packet [all|basic|...]}
CHECKS=${2:-all}
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
KILND=${KILND:-$BUILD/gnu/kilnd}
PY=${PY:-$BUILD/venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$BUILD/test-net/$MODE
rm -rf "$W"; mkdir -p "$W"
W=$(cd "$W" && pwd)
KILND=$(cd "$(dirname "$KILND")" && pwd)/$(basename "$KILND")
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")

NS_S="" NS_C="" PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && sleep 0.2 && kill -9 "$PID" 2>/dev/null
  [ -n "$NS_S" ] && ip netns del "$NS_S" 2>/dev/null
  [ -n "$NS_C" ] && [ "$NS_C" != "$NS_S" ] && ip netns del "$NS_C" 2>/dev/null
  true
}
trap cleanup EXIT

# ---- certificates, tokens, the expected greedy text
. "$HERE/kilnd_env.sh"
kt_certs_tokens "$W" "$KILND" 10.77.0.2,10.78.0.2  # lwIP's addresses below
PROMPT="What is the capital of France? Answer in one sentence."
MAXT=24
timeout 120 "$KILND" generate --model "$MODEL" --chat --temperature 0 --max-tokens $MAXT --threads 2 \
  --prompt "$PROMPT" >"$W/generate.out" 2>"$W/generate.err"
python3 - "$W" "$PROMPT" $MAXT <<'EOF'
import json, sys
w, prompt, maxt = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(w + "/generate.out", encoding="utf-8").read()
assert text.endswith("\n")
json.dump({"prompt": prompt, "max_tokens": maxt, "text": text[:-1]}, open(w + "/expect.json", "w"))
EOF

# ---- the network
PORT=8443 MPORT=9100 HOST=127.0.0.1 RUN_S=() RUN_C=()
case $MODE in
host)
  # below the kernel's ephemeral range (32768..), so no client socket of this or another
  # test holds the port (make test once failed on "bind: Address already in use")
  PORT=$((20000 + RANDOM % 12000)); MPORT=$((PORT + 1))
  NET="driver = host" ;;
tap)
  NS_S=kiln-t$$; NS_C=$NS_S
  ip netns add "$NS_S"
  ip -n "$NS_S" link set lo up
  ip -n "$NS_S" tuntap add dev ktap0 mode tap
  ip -n "$NS_S" addr add 10.77.0.1/24 dev ktap0
  ip -n "$NS_S" link set ktap0 up
  HOST=10.77.0.2
  NET=$'driver = tap\ninterface = ktap0\naddress = 10.77.0.2/24'
  RUN_S=(ip netns exec "$NS_S"); RUN_C=(ip netns exec "$NS_C") ;;
packet)
  NS_S=kiln-ps$$; NS_C=kiln-pc$$
  ip netns add "$NS_S"; ip netns add "$NS_C"
  ip link add kveth$$c type veth peer name kveth$$s
  ip link set kveth$$c netns "$NS_C"; ip link set kveth$$s netns "$NS_S"
  ip -n "$NS_C" link set lo up; ip -n "$NS_S" link set lo up
  ip -n "$NS_C" addr add 10.78.0.1/24 dev kveth$$c
  # the kernel must hold no address on the NIC lwIP drives (IPv6 link-local included)
  ip netns exec "$NS_S" sysctl -qw net.ipv6.conf.kveth$$s.disable_ipv6=1
  ip -n "$NS_C" link set kveth$$c up; ip -n "$NS_S" link set kveth$$s up
  HOST=10.78.0.2
  NET=$'driver = packet\ninterface = kveth'$$$'s\naddress = 10.78.0.2/24'
  RUN_S=(ip netns exec "$NS_S"); RUN_C=(ip netns exec "$NS_C") ;;
*) echo "serve.sh: unknown mode $MODE" >&2; exit 2 ;;
esac

kt_ini "$W" "$MODEL" "$NET" "$PORT" "$MPORT" $'max_seq_len = 1024\nkv_pool_mb = 256'
[ "$CHECKS" = mtls ] && echo "client_ca = $W/tls/ca.crt" >>"$W/kiln.ini"
# openai: the box serves under a name of the operator's (what /v1/models lists, requests
# name and metrics label), not the GGUF's general.name
SERVED=kiln-test/SmolLM2-135M:q4_1
[ "$CHECKS" = openai ] && sed -i "s|^path = .*|&\nserved_model_name = $SERVED|" "$W/kiln.ini"
[ "$CHECKS" = fault ] && printf '[engine]\nstep_timeout_ms = 1000\n' >>"$W/kiln.ini"
# the ladder: a pool of 34 blocks (544 tokens in f16, twice that in 8 bits) and a ladder
# fast enough to watch
[ "$CHECKS" = ladder ] && sed -i 's/^kv_pool_mb = 256$/kv_pool_mb = 12/' "$W/kiln.ini" && \
  printf '[engine]\nladder_tick_ms = 50\nladder_hold_ms = 1000\ndrain_timeout_ms = 1500\n' >>"$W/kiln.ini"
# abuse: a small prefill budget, so a prompt of the context's size spans 14 steps and a
# short request behind it shows whether it waits for all of them
[ "$CHECKS" = abuse ] && printf '[engine]\nmax_batched_tokens = 64\n' >>"$W/kiln.ini"
# tls: kilnd's debug lines say when it processed a client's KeyUpdate
[ "$CHECKS" = tls ] && printf '[log]\nlevel = debug\n' >>"$W/kiln.ini"
[ "$CHECKS" = limits ] && printf 'handshake_timeout_ms = 1000\nidle_timeout_ms = 2000\nmax_connections = 4\n' >>"$W/kiln.ini"
# a sanitizer build's memory use says nothing about the server's bounds
case $KILND in *asan*) export KILN_NO_RSS=1 ;; esac

# alloc: kilnd under the allocation-counting shim (the gnu build's: glibc, no sanitizer)
PRELOAD=()
if [ "$CHECKS" = alloc ]; then
  SHIM=$BUILD/gnu/tests/alloc_count.so
  [ -f "$SHIM" ] || { echo "serve.sh: no $SHIM (make $SHIM)"; exit 1; }
  PRELOAD=(env LD_PRELOAD="$(cd "$(dirname "$SHIM")" && pwd)/$(basename "$SHIM")" KILN_ALLOC_SOCK="$W/alloc.sock")
fi

# ---- kilnd
kt_start serve.sh "$W" "${RUN_S[@]}" "${PRELOAD[@]}" "$KILND" serve --config "$W/kiln.ini" \
  $([ "$CHECKS" = fault ] && echo --faults)
if [ "$MODE" != host ]; then
  timeout 10 "${RUN_C[@]}" ping -c 1 -W 2 "$HOST" >/dev/null && echo "ok   ping $HOST (lwIP ICMP)" \
    || { echo "FAIL ping $HOST"; exit 1; }
fi

rc=0
if [ "$CHECKS" = sdk ]; then
  # the client SDKs against this server: libkiln's C API, the kiln CLI, the Python package
  SDKD=$(cd "$HERE/../sdk" && pwd) BIN=$(dirname "$KILND")
  "$KILND" certs --dir "$W/tls-other" >/dev/null  # a CA the server's certificate is not from
  python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["text"])' \
    "$W/expect.json" >"$W/expect.txt"
  timeout 300 "${RUN_C[@]}" "$BIN/tests/sdk_test" --hosts "$HOST:$PORT" --ca "$W/tls/ca.crt" \
    --token "$UTOK" --admin-token "$ATOK" --expect-text-file "$W/expect.txt" --prompt "$PROMPT" \
    --max-tokens $MAXT --wrong-ca "$W/tls-other/ca.crt" || rc=1
  timeout 300 "${RUN_C[@]}" "$SDKD/cli_test.sh" "$BIN/kiln" "$HOST:$PORT" "$HOST:$MPORT" \
    "$W/tls/ca.crt" "$UTOK" "$ATOK" "$W/expect.txt" "$PROMPT" $MAXT "$W/tls-other/ca.crt" || rc=1
  timeout 300 "${RUN_C[@]}" python3 "$SDKD/py_test.py" --host "$HOST" --port "$PORT" \
    --ca "$W/tls/ca.crt" --token "$UTOK" --admin-token "$ATOK" --expect-file "$W/expect.txt" \
    --prompt "$PROMPT" --max-tokens $MAXT --wrong-ca "$W/tls-other/ca.crt" || rc=1
elif [ "$CHECKS" = abuse ]; then
  timeout 600 "${RUN_C[@]}" python3 "$HERE/abuse_test.py" --host "$HOST" --port "$PORT" \
    --metrics-port "$MPORT" --ca "$W/tls/ca.crt" --user-token "$UTOK" --admin-token "$ATOK" \
    --expect "$W/expect.json" ${ABUSE_ONLY:+--only "$ABUSE_ONLY"} \
    $(case $KILND in *asan*) echo --sanitized ;; esac) || rc=1
elif [ "$CHECKS" = alloc ]; then
  timeout 300 "${RUN_C[@]}" python3 "$HERE/alloc_test.py" --host "$HOST" --port "$PORT" \
    --metrics-port "$MPORT" --ca "$W/tls/ca.crt" --token "$UTOK" --sock "$W/alloc.sock" || rc=1
elif [ "$CHECKS" = openai ]; then
  timeout 300 "${RUN_C[@]}" "$PY" "$HERE/openai_test.py" --host "$HOST" --port "$PORT" \
    --metrics-port "$MPORT" --ca "$W/tls/ca.crt" --token "$UTOK" --admin-token "$ATOK" \
    --expect "$W/expect.json" --served-name "$SERVED" $([ "$MODE" != host ] && echo --lwip) || rc=1
else
  timeout 900 "${RUN_C[@]}" python3 "$HERE/serve_client.py" --host "$HOST" --port "$PORT" \
    --metrics-port "$MPORT" --ca "$W/tls/ca.crt" --user-token "$UTOK" --admin-token "$ATOK" \
    --expect "$W/expect.json" --checks "$CHECKS" --kilnd-pid "$PID" --kilnd-log "$W/kilnd.err" \
    $([ "$MODE" != host ] && echo --lwip) || rc=1
fi

# ---- a clean stop: over host sockets an admin's RESTART (exit 75, for the supervisor),
# over lwIP SIGTERM (drain, exit 0)
if [ "$CHECKS" = fault ]; then
  want=75 how="a hung step"  # kilnd leaves by itself, for its supervisor to restart it
elif [ "$MODE" = host ] && [ "$CHECKS" != openai ]; then
  # (not after openai: its requests warm the prefix cache for the restart check's prompt,
  # whose first request can then end before RESTART arrives, a race in that check)
  want=75 how="RESTART"
  timeout 120 "${RUN_C[@]}" python3 "$HERE/serve_client.py" --host "$HOST" --port "$PORT" \
    --metrics-port "$MPORT" --ca "$W/tls/ca.crt" --user-token "$UTOK" --admin-token "$ATOK" \
    --expect "$W/expect.json" --checks restart || rc=1
else
  want=0 how="SIGTERM"
  kill -TERM "$PID"
fi
st=0
for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$PID" 2>/dev/null; then echo "FAIL kilnd did not stop after $how"; rc=1
else
  wait "$PID" || st=$?
  [ "$st" -eq "$want" ] && echo "ok   $how: kilnd drained and exited $want" \
    || { echo "FAIL $how: kilnd exit status $st, want $want"; rc=1; }
fi
PID=""
if [ $rc -ne 0 ]; then echo "--- kilnd stderr (tail)"; tail -n 30 "$W/kilnd.err"; fi
exit $rc
