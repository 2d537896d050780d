#!/usr/bin/env bash
# soak.sh: the reliability soak. kilnd serves over lwIP on a TAP device in a network
# namespace this script creates (or over host sockets with --host), with a KV pool too
# small for its batch so that the engine preempts; tests/reliability/soak.py then drives
# many concurrent TLS clients with random cancels, disconnects and slow readers, and
# checks that no request is lost and nothing leaks (see soak.py for the accounting).
#
#   tests/reliability/soak.sh [--host] [--requests N] [--clients C] [--max-tokens M]
#       [--prompt-max W] [--slow-max-tokens M] [--kv-pool-mb N] [--time-limit S]
#       [--request-timeout S] [--hard-limit S] [--seed N] [--json FILE]
#       [--no-stuck-reader] [--ladder]
#   After the load, a client that stops reading altogether must not stall the others
#   (--no-stuck-reader skips that check; kilnd passes it since the engine preempts
#   paused requests first, see RELIABILITY.md).
#   --ladder: leave kilnd's degrade ladder at its defaults. Off otherwise (ladder_high =
#   1): with a pool this small the ladder would keep halving the batch, and the soak is
#   meant to test preemption under a full batch (net/serve-ladder tests the ladder).
#   --hard-limit: soak.py is killed (and the soak fails) after this many seconds
#   (default: --time-limit + --request-timeout + 300).
#   (BUILD, MODEL, KILND from the environment, as tests/net/serve.sh)
#
# Short run (tests/run.sh): 2,000 requests from 32 clients with --max-tokens 8
# --slow-max-tokens 16 --prompt-max 12 --kv-pool-mb 12, killed at 510 s
# (2 minutes on 2 lightly loaded cores, 5 under heavy load: the prompt tokens are most
# of the work, and half the requests are chats, ~30 tokens of template; RELIABILITY.md
# has the figures). Long run (make soak):
# --requests 20000 --clients 64 with the default mix (hours on 2 cores).
# The namespace, its TAP device and kilnd are removed on exit whatever happens; every
# step is bounded in time. Needs root for the namespace (--host does not).
set -euo pipefail
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
KILND=${KILND:-$BUILD/gnu/kilnd}
HERE=$(cd "$(dirname "$0")" && pwd)

# The defaults are the issue's mix: prompts of 8..200 words, max_tokens 4..64. No new
# request starts after --time-limit seconds (default: 600 + 0.5 s per request, about
# 2x what 2 busy cores need); those not started then fail the run.
EXTRA=() MODE=tap REQUESTS=2000 CLIENTS=32 MAXT=64 PMAX=200 TLIMIT="" RTIMEOUT=300 SEED="" JSON=""
HLIMIT="" LADDER=0 KVMB=24
while [ $# -gt 0 ]; do
  case $1 in
  --host) MODE=host ;;
  --no-stuck-reader) EXTRA+=(--no-stuck-reader) ;;
  --ladder) LADDER=1 ;;
  --hard-limit) HLIMIT=$2; shift ;;
  --kv-pool-mb) KVMB=$2; shift ;;
  --slow-max-tokens) EXTRA+=(--slow-max-tokens "$2"); shift ;;
  --requests) REQUESTS=$2; shift ;;
  --clients) CLIENTS=$2; shift ;;
  --max-tokens) MAXT=$2; shift ;;
  --prompt-max) PMAX=$2; shift ;;
  --request-timeout) RTIMEOUT=$2; shift ;;
  --time-limit) TLIMIT=$2; shift ;;
  --seed) SEED=$2; shift ;;
  --json) JSON=$2; shift ;;
  *) echo "usage: soak.sh [--host] [--requests N] [--clients C] [--max-tokens M]" \
          "[--prompt-max W] [--slow-max-tokens M] [--time-limit S] [--request-timeout S]" \
          "[--kv-pool-mb N] [--hard-limit S] [--seed N] [--json FILE] [--no-stuck-reader] [--ladder]" >&2; exit 2 ;;
  esac
  shift
done
TLIMIT=${TLIMIT:-$((600 + REQUESTS / 2))}
HLIMIT=${HLIMIT:-$((TLIMIT + RTIMEOUT + 300))}
[ -x "$KILND" ] || { echo "soak.sh: $KILND is missing (make -j2 $KILND)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "soak.sh: $MODEL is missing (make model)" >&2; exit 2; }

W=$BUILD/test-reliability/soak-$MODE
rm -rf "$W"; mkdir -p "$W"
W=$(cd "$W" && pwd)
KILND=$(cd "$(dirname "$KILND")" && pwd)/$(basename "$KILND")
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")

NS="" PID=""
cleanup() {
  # kilnd first (by its pid: other tests may run kilnds of their own), then the
  # namespace, which takes the TAP device with it
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
    kill -TERM "$PID" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$PID" 2>/dev/null || true
  fi
  [ -n "$NS" ] && ip netns del "$NS" 2>/dev/null
  true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- certificates and tokens
ADDR=10.79.0.2  # lwIP's address in the namespace; the kernel's end of the TAP is .1
. "$HERE/../net/kilnd_env.sh"
kt_certs_tokens "$W" "$KILND" "$ADDR"

# ---- the network
RUN=()
if [ "$MODE" = tap ]; then
  NS=kiln-soak$$
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" tuntap add dev ksoak0 mode tap
  ip -n "$NS" addr add 10.79.0.1/24 dev ksoak0
  ip -n "$NS" link set ksoak0 up
  HOST=$ADDR PORT=8443 MPORT=9100
  NET=$'driver = tap\ninterface = ksoak0\naddress = '$ADDR/24
  RUN=(ip netns exec "$NS")
else
  HOST=127.0.0.1 PORT=$((20000 + RANDOM % 20000)); MPORT=$((PORT + 1))
  NET="driver = host"
fi

# A KV pool far below what the batch could use: 24 MiB of 16-token blocks is about
# 1,000 tokens (a block is 16 x 30 layers x 2 x 3 KV heads x 64 x 2 bytes = 360 KiB),
# while 32 sequences of up to ~300 tokens each want ~9,000: the engine must preempt.
# (The short run's 12 MiB are 34 blocks, against 32 sequences of 10..50 tokens.)
# max_output_bytes at its minimum, so that slow readers reach the output budget and
# their requests pause (holding KV blocks) as well. The degrade ladder off (see --ladder):
# pressure is never above 1.
kt_ini "$W" "$MODEL" "$NET" "$PORT" "$MPORT" "max_seq_len = 512
max_batch_size = 32
block_size = 16
kv_pool_mb = $KVMB
$([ "$LADDER" = 1 ] || echo "ladder_high = 1")"

# ---- kilnd
kt_start soak.sh "$W" "${RUN[@]}" "$KILND" serve --config "$W/kiln.ini"
if [ "$MODE" = tap ]; then
  timeout 10 "${RUN[@]}" ping -c 1 -W 2 "$HOST" >/dev/null \
    || { echo "soak.sh: no ping reply from lwIP at $HOST"; exit 1; }
fi

# a sanitizer build's memory use says nothing about the server's bounds
case $KILND in *asan*) EXTRA+=(--rss-growth-pct 0) ;; esac

# ---- the soak itself; soak.py bounds its own run by --time-limit, and the hard limit
# catches a client that hangs anyway (or a machine too loaded to finish in time)
rc=0
timeout -k 10 "$HLIMIT" "${RUN[@]}" python3 "$HERE/soak.py" --host "$HOST" \
  --port "$PORT" --metrics-port "$MPORT" --ca "$W/tls/ca.crt" --token "$UTOK" --kilnd-pid "$PID" \
  --requests "$REQUESTS" --clients "$CLIENTS" --max-tokens "$MAXT" --prompt-max "$PMAX" \
  --time-limit "$TLIMIT" --request-timeout "$RTIMEOUT" --smaps-dir "$W" \
  --transport "$([ "$MODE" = tap ] && echo lwip-tap || echo host)" \
  ${SEED:+--seed "$SEED"} ${JSON:+--json "$JSON"} "${EXTRA[@]}" || rc=$?
case $rc in 124 | 137) echo "soak.sh: FAIL soak.py ran past the hard limit of $HLIMIT s" ;; esac

# ---- after the abuse, a clean stop: SIGTERM drains and exits 0
if kill -0 "$PID" 2>/dev/null; then
  kill -TERM "$PID"
  for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$PID" 2>/dev/null; then
    echo "soak.sh: FAIL kilnd did not stop within 10 s of SIGTERM"; rc=1
  else
    st=0; wait "$PID" || st=$?
    [ "$st" -eq 0 ] && echo "soak.sh: kilnd drained and exited 0 on SIGTERM" \
      || { echo "soak.sh: FAIL kilnd exited $st on SIGTERM"; rc=1; }
  fi
else
  st=0; wait "$PID" || st=$?
  echo "soak.sh: FAIL kilnd died during the soak (exit status $st)"; rc=1
fi
PID=""
if [ $rc -ne 0 ]; then echo "--- kilnd stderr (tail; all of it in $W/kilnd.err)"; tail -n 40 "$W/kilnd.err"; fi
exit $rc
