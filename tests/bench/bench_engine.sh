#!/usr/bin/env bash
# make bench (after bench.sh): kilnd's continuous-batching engine against llama.cpp's own
# llama-batched-bench (tests/bench/peer.sh) on the same GGUF and thread count, run one
# after the other, never concurrently.
#   S streams (S in $STREAMS), each a distinct 128-token prompt + 128 generated tokens;
#   aggregate output tok/s = S*128 / wall time (prefill included), best of 2 for each.
#   llama-batched-bench -npp 128 -ntg 128 -npl S,S (two runs): S*128 / (T_PP + T_TG) of
#   its rows, the same metric (all S prompts in one batch, then 128 steps of S tokens).
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
. tests/bench/lib.sh
peer_bin

# ---------------------------------------------------------------- machine
machine_line
echo "model: $MODEL; threads $THREADS; streams $STREAMS; prompt $P + gen $G tokens per stream, best of $R"

best() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b == "" || a + 0 >= b + 0) print a; else print b }'; }

declare -A kil peer ttft itl dec
status=0
for S in $STREAMS; do
  # ---------------------------------------------------------------- kilnd
  if [ -x "$KILND" ]; then
    k="" kt="" ki="" kd=""
    for r in $(seq $R); do
      kline=$(kiln_streams "$MODEL" "$THREADS" "$S" $P $G) || {
        echo "bench-engine: kilnd bench-engine failed (S=$S)"; exit 1; }
      v=$(field output_tok_s "$kline")
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
  pline=$(llama_streams "$MODEL" "$THREADS" "$S" $P $G $R) || {
    echo "bench-engine: llama-batched-bench failed (S=$S)" >&2; exit 1; }
  peer[$S]=$(field output_tok_s "$pline")
  pline="peer-batched: streams=$S $pline"
  echo "$pline"
done
[ -x "$KILND" ] || { echo "bench-engine: $KILND not built; llama.cpp numbers only"; status=1; }

# ---------------------------------------------------------------- table
echo "--- continuous batching: kilnd bench-engine vs llama.cpp llama-batched-bench (llama-cpp-python $PEER_PIN sdist), $THREADS threads"
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
