#!/usr/bin/env bash
# make bench: kilnd against llama.cpp's own llama-bench (tests/bench/peer.sh builds it from
# the pinned llama-cpp-python sdist) on the same GGUF, same thread count, run one after the
# other, never concurrently.
#   prefill: 512 prompt tokens from an empty context (tok/s)      llama-bench -p 512 -n 0
#   decode : 128 single-token steps after it (tok/s)               llama-bench -p 0 -n 128 -d 512
# best of 3 for each (llama-bench: 3 repetitions after its warm-up run; their mean is
# printed too). Env: BUILD (default build), MODEL, BENCH_THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${BENCH_THREADS:-2}
P=512 G=128 R=3
. tests/bench/lib.sh
peer_bin

machine_line
echo "model: $MODEL; threads $THREADS; prefill $P tokens, decode $G tokens, best of $R"

# ---------------------------------------------------------------- llama.cpp
peer=$(llama_single "$MODEL" "$THREADS" $P $G $R) || { echo "bench: llama-bench failed" >&2; exit 1; }
echo "peer: llama-bench: $peer"
lp=$(field prefill_tok_s "$peer") ld=$(field decode_tok_s "$peer")

# ---------------------------------------------------------------- kilnd
kp="" kd=""
if [ -x "$KILND" ]; then
  k=$(kiln_single "$MODEL" "$THREADS" $P $G $R) || { echo "bench: kilnd bench failed" >&2; exit 1; }
  kp=$(field prefill_tok_s "$k") kd=$(field decode_tok_s "$k")
else
  echo "bench: $KILND not built; llama.cpp numbers only"
fi

# ---------------------------------------------------------------- table
row() { # name kilnd peer
  if [ -n "$2" ]; then
    awk -v n="$1" -v k="$2" -v p="$3" 'BEGIN{printf "%-11s kilnd %7.1f tok/s, llama.cpp %7.1f tok/s, ratio %.2f\n", n":", k, p, (p>0?k/p:0)}'
  else
    awk -v n="$1" -v p="$3" 'BEGIN{printf "%-11s kilnd     n/a, llama.cpp %7.1f tok/s\n", n":", p}'
  fi
}
echo "--- llama.cpp llama-bench (llama-cpp-python $PEER_PIN sdist) vs kilnd, $THREADS threads"
row "prefill $P" "$kp" "$lp"
row "decode $G" "$kd" "$ld"
[ -x "$KILND" ] || exit 1
