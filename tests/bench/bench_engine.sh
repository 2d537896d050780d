#!/usr/bin/env bash
# make bench (after bench.sh): kilnd's continuous-batching engine against llama.cpp's
# batched decoding (tests/bench/peer_batched.py, same pinned llama-cpp-python) on the same
# GGUF and thread count, run one after the other, never concurrently.
#   S streams (S in $STREAMS), each a distinct 128-token prompt + 128 generated tokens;
#   aggregate output tok/s = S*128 / wall time (prefill included), best of 2 for each.
# Targets: 32-stream kilnd >= 1.5x llama.cpp's 32-stream rate, and >= 4x kilnd's own
# 1-stream rate (reported met / not met; they do not change the exit status).
# Env: BUILD (default build), MODEL, BENCH_THREADS (default 2), BENCH_STREAMS ("1 4 16 32").
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${BENCH_THREADS:-2}
STREAMS=${BENCH_STREAMS:-1 4 16 32}
P=128 G=128 R=2
KILND=$BUILD/gnu/kilnd
VENV=$BUILD/bench-venv
REQ=tests/bench/requirements.txt
PIN=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$REQ")

# ---------------------------------------------------------------- peer install (once)
# bench.sh owns the install: run its "peer install" section (have_peer + pip install,
# which use VENV/REQ/PIN above) rather than keeping a second copy of it here.
install=$(sed -n '/^# -* peer install/,/^# -* machine/p' tests/bench/bench.sh)
if [ -n "$install" ]; then
  eval "$install"
elif ! [ -x "$VENV/bin/python" ]; then
  # section markers gone: fall back to a full bench.sh run, which installs the peer
  BUILD=$BUILD MODEL=$MODEL tests/bench/bench.sh >&2 || true
fi
[ -x "$VENV/bin/python" ] || { echo "bench-engine: no peer venv at $VENV" >&2; exit 1; }

# ---------------------------------------------------------------- machine
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "machine: ${cpu:-unknown CPU}, $(nproc) cores online"
echo "model: $MODEL; threads $THREADS; streams $STREAMS; prompt $P + gen $G tokens per stream, best of $R"

field() { sed -n "s/.*[ :]$1=\([0-9.]*\).*/\1/p" <<<"$2" | tail -1; }
best() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b == "" || a + 0 >= b + 0) print a; else print b }'; }

declare -A kil peer ttft itl dec
status=0
for S in $STREAMS; do
  # ---------------------------------------------------------------- kilnd
  if [ -x "$KILND" ]; then
    k="" kt="" ki="" kd=""
    for r in $(seq $R); do
      kout=$("$KILND" bench-engine --model "$MODEL" --threads "$THREADS" --requests "$S" \
               --concurrency "$S" --prompt-tokens $P --gen-tokens $G --max-batch 32 \
               --max-batched-tokens 512 2>&1) || {
        echo "bench-engine: kilnd bench-engine failed (S=$S):"; echo "$kout"; exit 1; }
      kline=$(grep '^bench-engine:' <<<"$kout" | tail -1 || true)
      v=$(field output_tok_s "$kline")
      [ -n "$v" ] || { echo "bench-engine: no 'bench-engine: ... output_tok_s=X' line from kilnd:"; echo "$kout"; exit 1; }
      echo "kilnd: S=$S run $r: $kline" >&2
      if [ "$(best "$v" "$k")" = "$v" ]; then
        k=$v
        kt=$(sed -n 's/.*ttft_ms p50=\([0-9.]*\).*/\1/p' <<<"$kline")
        ki=$(sed -n 's/.*itl_ms p50=\([0-9.]*\).*/\1/p' <<<"$kline")
        kd=$(field decode_tok_s "$kline") # steps with no prompt work (kilnd bench-engine)
      fi
    done
    kil[$S]=$k ttft[$S]=$kt itl[$S]=$ki dec[$S]=$kd
  fi
  # ---------------------------------------------------------------- llama.cpp
  pout=$("$VENV/bin/python" tests/bench/peer_batched.py --model "$MODEL" --threads "$THREADS" \
           --streams "$S" --prompt-tokens $P --gen-tokens $G --repeat $R) || {
    echo "bench-engine: peer_batched.py failed (S=$S)" >&2; exit 1; }
  pline=$(grep '^peer-batched: streams=' <<<"$pout" | tail -1 || true)
  peer[$S]=$(field output_tok_s "$pline")
  [ -n "${peer[$S]}" ] || { echo "bench-engine: no output_tok_s from peer_batched.py:"; echo "$pout"; exit 1; }
  echo "$pline"
done
[ -x "$KILND" ] || { echo "bench-engine: $KILND not built; llama.cpp numbers only"; status=1; }

# ---------------------------------------------------------------- table
echo "--- continuous batching: kilnd bench-engine vs llama-cpp-python $PIN batched, $THREADS threads"
printf '%-8s %14s %14s %7s %12s %11s %10s %13s\n' streams "kilnd tok/s" "llama.cpp" ratio "kilnd vs 1" "ttft p50ms" "itl p50ms" "decode tok/s"
k1=${kil[1]:-}
for S in $STREAMS; do
  awk -v s="$S" -v k="${kil[$S]:-}" -v p="${peer[$S]}" -v k1="$k1" \
      -v t="${ttft[$S]:-}" -v i="${itl[$S]:-}" -v d="${dec[$S]:-}" 'BEGIN{
    ks = (k == "") ? "n/a" : sprintf("%.1f", k)
    r  = (k == "" || p <= 0) ? "n/a" : sprintf("%.2f", k / p)
    sc = (k == "" || k1 == "" || k1 <= 0) ? "n/a" : sprintf("%.2fx", k / k1)
    printf "%-8s %14s %14.1f %7s %12s %11s %10s %13s\n", s, ks, p, r, sc, (t == "" ? "n/a" : t), (i == "" ? "n/a" : i), (d == "" ? "n/a" : d)
  }'
done

target() { # label value goal
  awk -v l="$1" -v v="$2" -v g="$3" 'BEGIN{
    if (v == "") printf "target: %-44s n/a\n", l
    else printf "target: %-44s %.2fx (goal %.1fx): %s\n", l, v, g, (v >= g ? "met" : "not met") }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a != "" && b != "" && b > 0) printf "%.4f", a / b }'; }
target "32-stream aggregate vs llama.cpp's 32-stream" "$(ratio "${kil[32]:-}" "${peer[32]:-}")" 1.5
target "32-stream aggregate vs kilnd's 1-stream" "$(ratio "${kil[32]:-}" "${kil[1]:-}")" 4
# the same goal on the decode phase alone (informative: the goal is the line above)
target "32-stream decode phase vs kilnd's 1-stream's" "$(ratio "${dec[32]:-}" "${dec[1]:-}")" 4
exit $status
