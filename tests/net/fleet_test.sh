#!/usr/bin/env bash
# fleet_test.sh: three kilnd boxes on loopback behind HAProxy (docs/FLEET.md), under a
# bounded load from the official `openai` package (HTTP mode, balanced per request) and
# `kiln bench` (TCP mode, the line protocol end to end in TLS). One box is killed with
# SIGKILL, another drained (DRAIN); tests/net/fleet_client.py drives the load and checks
# that HAProxy routes around both within its check interval, that every request ends in
# an answer or a clean error in time, and the counts against the survivors' /metrics.
#
#   tests/net/fleet_test.sh      (BUILD, MODEL, KILND, KILN, PY from the environment)
#
# HAProxy comes from the Debian package (scripts/need.sh installs it when missing). Only
# the processes this script starts are stopped, by pid. Everything is bounded in time.
set -euo pipefail
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
KILND=${KILND:-$BUILD/gnu/kilnd}
KILN=${KILN:-$BUILD/gnu/kiln}
PY=${PY:-$BUILD/venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
"$HERE/../../scripts/need.sh" haproxy haproxy
W=$BUILD/test-net/fleet
rm -rf "$W"; mkdir -p "$W"
W=$(cd "$W" && pwd)
KILND=$(cd "$(dirname "$KILND")" && pwd)/$(basename "$KILND")
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")

PIDS=() HAPID=""
cleanup() {  # (set -e holds here too: a kill of a process already gone must not fail it)
  local p
  [ -n "$HAPID" ] && { kill "$HAPID" 2>/dev/null || true; }
  for p in "${PIDS[@]}"; do [ -n "$p" ] && { kill "$p" 2>/dev/null || true; }; done
  sleep 0.3
  for p in "${PIDS[@]}"; do [ -n "$p" ] && { kill -9 "$p" 2>/dev/null || true; }; done
  [ -n "$HAPID" ] && { kill -9 "$HAPID" 2>/dev/null || true; }
  true
}
trap cleanup EXIT

. "$HERE/kilnd_env.sh"
kt_certs_tokens "$W" "$KILND" 127.0.0.1
# ports below the ephemeral range (see serve.sh); box i: BASE+2i (TLS) and BASE+2i+1 (metrics)
BASE=$((20000 + RANDOM % 11000)) HTTP_PORT=$((BASE + 6)) TCP_PORT=$((BASE + 7))
INTER_MS=500 FALL=2 RISE=2
for i in 0 1 2; do
  d=$W/box$i; mkdir -p "$d/tls"; cp "$W"/tls/* "$d/tls/"; cp "$W/tokens.txt" "$d/"
  kt_ini "$d" "$MODEL" "driver = host" $((BASE + 2 * i)) $((BASE + 2 * i + 1)) \
    $'threads = 1\nmax_seq_len = 512\nkv_pool_mb = 32\ndrain_timeout_ms = 60000'
  sed -i "s/^threads = 2$//" "$d/kiln.ini"  # one thread a box: three share two cores
  kt_start "fleet box$i" "$d" "$KILND" serve --config "$d/kiln.ini"
  PIDS+=("$PID")
done

# HAProxy: HTTP mode for the OpenAI API (a server chosen per request, TLS to the boxes
# with kiln's CA), TCP mode for the line protocol (TLS end to end); both checked on each
# box's metrics port, GET /readyz, every INTER_MS.
{
  printf 'global\n  stats socket %s/haproxy.sock level admin\n' "$W"
  printf 'defaults\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n'
  printf '  default-server inter %dms fall %d rise %d\n' $INTER_MS $FALL $RISE
  printf 'frontend openai\n  mode http\n  bind 127.0.0.1:%d\n  default_backend kiln_http\n' $HTTP_PORT
  printf 'backend kiln_http\n  mode http\n  balance roundrobin\n'
  printf '  option httpchk GET /readyz\n  http-check expect status 200\n'
  printf '  retries 2\n  option redispatch 1\n  retry-on conn-failure empty-response 503\n'
  printf '  http-response set-header X-Kiln-Box %%s\n'
  for i in 0 1 2; do
    printf '  server box%d 127.0.0.1:%d ssl alpn http/1.1 ca-file %s verify required check port %d no-check-ssl\n' \
      $i $((BASE + 2 * i)) "$W/tls/ca.crt" $((BASE + 2 * i + 1))
  done
  printf 'frontend line\n  mode tcp\n  bind 127.0.0.1:%d\n  default_backend kiln_tcp\n' $TCP_PORT
  printf 'backend kiln_tcp\n  mode tcp\n  balance roundrobin\n'
  printf '  option httpchk GET /readyz\n  http-check expect status 200\n'
  for i in 0 1 2; do
    printf '  server box%d 127.0.0.1:%d check port %d\n' $i $((BASE + 2 * i)) $((BASE + 2 * i + 1))
  done
} >"$W/haproxy.cfg"
haproxy -c -q -f "$W/haproxy.cfg"
haproxy -db -f "$W/haproxy.cfg" >"$W/haproxy.out" 2>&1 &
HAPID=$!

rc=0
timeout 150 "$PY" "$HERE/fleet_client.py" --dir "$W" --base-port $BASE --http-port $HTTP_PORT \
  --tcp-port $TCP_PORT --ca "$W/tls/ca.crt" --token "$UTOK" --admin-token "$ATOK" \
  --kiln "$KILN" --pids "${PIDS[*]}" --inter-ms $INTER_MS --fall $FALL || rc=1

kill -9 "${PIDS[0]}" 2>/dev/null || true  # box0: SIGKILLed by the client (again here if it stopped early)
wait "${PIDS[0]}" 2>/dev/null || true; PIDS[0]=""  # reaped: never signalled again
# the drained box and the survivor stop cleanly on SIGTERM (drain, exit 0)
for i in 1 2; do
  p=${PIDS[$i]}; kill -TERM "$p"
  for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  st=0
  if kill -0 "$p" 2>/dev/null; then echo "FAIL box$i did not stop after SIGTERM"; rc=1
  else
    wait "$p" || st=$?
    PIDS[$i]=""
    [ $st -eq 0 ] && echo "ok   box$i: SIGTERM drained and exited 0" || { echo "FAIL box$i: exit $st"; rc=1; }
  fi
done
if [ $rc -ne 0 ]; then
  for i in 0 1 2; do echo "--- box$i stderr (tail)"; tail -n 15 "$W/box$i/kilnd.err"; done
  echo "--- haproxy"; tail -n 20 "$W/haproxy.out"
fi
exit $rc
