#!/usr/bin/env bash
# bench_openai.sh: kilnd's OpenAI HTTP path against llama.cpp's llama-server (built from
# the same llama.cpp source as the other peer tools, tests/bench/peer.sh) on the same
# GGUF and threads, measured by one client: `kiln bench --openai URL` (streaming chat,
# a fixed synthetic prompt, max_tokens G, temperature 0, ignore_eos so every request
# makes G tokens on both) at 1, 16 and 32 concurrent clients. Then kilnd's line protocol
# (`kiln bench --chat`, the same prompts) at 32, for the HTTP path's cost. The servers run
# one after the other, never together; every process this starts is killed by pid on exit.
# Env: BUILD, MODEL, BENCH_THREADS (2), OAI_G (128), OAI_LEVELS ("1 16 32").
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${BENCH_THREADS:-2}
G=${OAI_G:-128} P=128
read -ra LEVELS <<<"${OAI_LEVELS:-1 16 32}"
MAXC=${LEVELS[-1]}
. tests/bench/lib.sh
. tests/net/kilnd_env.sh
peer_bin
KILN=$BUILD/gnu/kiln
[ -x "$KILND" ] && [ -x "$KILN" ] || { echo "bench_openai: build $KILND and $KILN first" >&2; exit 1; }

W=$BUILD/bench-openai
rm -rf "$W"; mkdir -p "$W"
PID=""
stop() { # the server started last, by pid
  [ -n "$PID" ] || return 0
  kill "$PID" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=""
}
trap stop EXIT

# requests per level: enough for a steady state, bounded in time
nreq() { [ "$1" -le 1 ] && echo 4 || echo $(($1 * 2)); }

# measure NAME CONC ARGS...: one `kiln bench` run, its JSON in $W/NAME-CONC.json. Not
# lib.sh's _run_logged: the server is not the shell's waited-for child, so its CPU would
# count as other work; the load average before each run is logged instead.
measure() {
  local name=$1 c=$2 rc=0; shift 2
  wait_quiet
  echo "$name at $c: load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$W/load.txt"
  timeout 600 "$KILN" bench --concurrency "$c" --requests "$(nreq "$c")" --prompt-tokens $P \
    --max-tokens "$G" --temperature 0 --no-progress --json "$@" >"$W/$name-$c.json" 2>"$W/$name-$c.log" || rc=$?
  [ $rc = 0 ] && return 0
  echo "bench_openai: $name at $c clients failed ($rc):" >&2
  tail -5 "$W/$name-$c.log" >&2
  return $rc
}

machine_line
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (per run: $W/load.txt)"
echo "model: $MODEL; threads $THREADS; streaming chat, prompt ~$P tokens + chat template, max_tokens $G, ignore_eos"

# ---------------------------------------------------------------- kilnd (TLS)
PORT=$((20000 + RANDOM % 12000))
kt_certs_tokens "$W" "$KILND" 127.0.0.1
kt_ini "$W" "$(realpath "$MODEL")" "driver = host" "$PORT" $((PORT + 1)) \
  $'max_seq_len = 2048\nkv_pool_mb = 512'
kt_start bench_openai "$W" "$KILND" serve --config "$W/kiln.ini" >/dev/null
K=(--ca "$W/tls/ca.crt" --token "$UTOK")
for c in "${LEVELS[@]}"; do measure kiln-http "$c" "${K[@]}" --openai "https://127.0.0.1:$PORT"; done
# one connection per client as for HTTP, so only the protocol differs
measure kiln-line "$MAXC" "${K[@]}" --host "127.0.0.1:$PORT" --chat --connections "$MAXC"
stop

# ---------------------------------------------------------------- llama-server (plain http)
LPORT=$((PORT + 2))
# one slot per client, each with room for the prompt, its template and G tokens;
# continuous batching (-cb) so slots join and leave the batch between steps
"$PEER_BIN/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$LPORT" -t "$THREADS" -tb "$THREADS" \
  -np "$MAXC" -cb -c $((MAXC * (P + G + 128))) --no-webui >"$W/llama-server.log" 2>&1 &
PID=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$LPORT/health" >/dev/null 2>&1 && break
  kill -0 "$PID" 2>/dev/null || { echo "bench_openai: llama-server exited:" >&2; tail -5 "$W/llama-server.log" >&2; exit 1; }
  sleep 0.1
done
for c in "${LEVELS[@]}"; do measure llama-http "$c" --openai "http://127.0.0.1:$LPORT"; done
stop

# ---------------------------------------------------------------- table
python3 - "$W" "$MAXC" "${LEVELS[@]}" <<'PY'
import json, sys
w, maxc, levels = sys.argv[1], sys.argv[2], sys.argv[3:]
def get(name, c):
    return json.load(open("%s/%s-%s.json" % (w, name, c)))
def f(v, fmt="%.1f"):
    return "-" if v is None else fmt % v
print("--- kiln bench --openai: kilnd (https) vs llama-server (http), same client")
print("%-5s | %-28s | %-28s | %s" % ("conc", "kilnd tok/s  TTFT p50/p99 ms", "llama-server tok/s  TTFT p50/p99", "tok/s ratio, TTFT p50 ratio, errors k/l"))
for c in levels:
    k, l = get("kiln-http", c), get("llama-http", c)
    r = k["output_tok_s"] / l["output_tok_s"] if l["output_tok_s"] else 0
    t = (k["ttft_ms_p50"] / l["ttft_ms_p50"]) if k["ttft_ms_p50"] and l["ttft_ms_p50"] else None
    print("%-5s | %8s  %9s/%-9s | %8s  %9s/%-9s | %.2fx, %s, %d/%d" % (
        c, f(k["output_tok_s"]), f(k["ttft_ms_p50"], "%.0f"), f(k["ttft_ms_p99"], "%.0f"),
        f(l["output_tok_s"]), f(l["ttft_ms_p50"], "%.0f"), f(l["ttft_ms_p99"], "%.0f"),
        r, f(t, "%.2fx"), k["errors"], l["errors"]))
    print("      | e2e p50/p99 ms: kilnd %s/%s, llama-server %s/%s" % (
        f(k["e2e_ms_p50"], "%.0f"), f(k["e2e_ms_p99"], "%.0f"), f(l["e2e_ms_p50"], "%.0f"), f(l["e2e_ms_p99"], "%.0f")))
h, ln = get("kiln-http", maxc), get("kiln-line", maxc)
print("kilnd at %s: HTTP %.1f tok/s, line protocol %.1f tok/s: HTTP/line %.3f (TTFT p50 %s vs %s ms)" % (
    maxc, h["output_tok_s"], ln["output_tok_s"], h["output_tok_s"] / ln["output_tok_s"] if ln["output_tok_s"] else 0,
    f(h["ttft_ms_p50"], "%.0f"), f(ln["ttft_ms_p50"], "%.0f")))
bad = [n for n in ("kiln-http", "llama-http") for c in levels if get(n, c)["errors"]]
sys.exit(1 if bad or ln["errors"] else 0)
PY
