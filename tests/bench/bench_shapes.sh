#!/usr/bin/env bash
# make bench (after the default model's benches): kilnd against llama.cpp on random-weight
# models of real shapes in the formats users download (tests/shapes/shapes.sh makes them
# with llama-quantize), one table row per (shape, format):
#   prefill 512 from empty, decode 128 after it (kilnd bench; llama-bench), best of 3
#   32 streams of 128 prompt + 128 generated tokens, aggregate output tok/s over the whole
#     wall time (kilnd bench-engine; llama-batched-bench), best of $BENCH_SHAPES_REPEAT (1)
#   decode's share of the machine's read bandwidth: bytes of weights a decode token reads
#     (tests/bench/decode_bytes.py; the KV cache's few MB are left out) x tok/s, against
#     tests/bench/membw.c's best read rate with the same threads (start and end of the run)
# kilnd and llama.cpp run one after the other, never concurrently, with the same threads.
# Targets, printed beside the figures (met / not met; they do not change the exit status):
#   prefill >= 2x llama.cpp, decode >= 1.25x llama.cpp and >= 70% of the read bandwidth,
#   32 streams >= 3x llama.cpp. A step that fails prints its error and n/a; exit status 1.
# A step during which other programs used over 5% of the CPUs is named under the table.
# Env: BUILD, PY, SHAPES, FORMATS (as shapes.sh), BENCH_THREADS (2), BENCH_SHAPES_REPEAT,
#   BENCH_WAIT_QUIET=N: before each step wait up to N s for the CPUs to go quiet.
# At AVX2 (a CPU without AVX-512): PEER_BIN=$(PEER_ISA=avx2 tests/bench/peer.sh)
#   KILN_SIMD=avx2 tests/bench/bench_shapes.sh (both programs then run AVX2 code).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
PY=${PY:-$BUILD/venv/bin/python}
THREADS=${BENCH_THREADS:-2}
SR=${BENCH_SHAPES_REPEAT:-1}
P=512 G=128 R=3 S=32 SP=128 SG=128
. tests/bench/lib.sh
peer_bin

files=$(BUILD=$BUILD PY=$PY tests/shapes/shapes.sh)

# ---------------------------------------------------------------- read bandwidth
MEMBW=$BUILD/membw
if [ ! -x "$MEMBW" ] || [ tests/bench/membw.c -nt "$MEMBW" ]; then
  gcc -O3 -march=native -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pthread \
    tests/bench/membw.c -o "$MEMBW"
fi
# measured at the start and again at the end: on a VM it varies with the neighbours
# (31 to 55 GB/s within minutes on one 2-core machine), so the share uses the higher figure
membw() { # -> GB/s; notes a contended measurement
  local line
  : > "$BENCH_LOGS/contended"
  wait_quiet
  line=$(_run_logged "$BENCH_LOGS/membw.log" "$MEMBW" --threads "$THREADS")
  echo "$line" >&2
  while read -r c; do echo "membw: $c: not reliable" >> "$BENCH_LOGS/membw.notes"; done < "$BENCH_LOGS/contended"
  field read_gb_s "$line"
}
machine_line
: > "$BENCH_LOGS/membw.notes"
BW0=$(membw)

# ---------------------------------------------------------------- measurements
rows=() notes=() status=0
fail() { # what log: a note with the log's last line
  notes+=("$name: $1 failed: $(grep -v '^[[:space:]]*$' "$2" 2>/dev/null | tail -1)")
  status=1
}
fig() { # NAME LINE: the figure, or "-" when the step failed
  if [ -n "$2" ]; then field "$1" "$2"; else echo -; fi
}
for f in $files; do
  name=$(basename "$f" .gguf)
  fmt=${name##*-} shape=${name%-*}
  echo "bench-shapes: $name ($(du -h "$f" | cut -f1))" >&2
  bytes=$(field decode_bytes "$("$PY" tests/bench/decode_bytes.py "$f")")
  : > "$BENCH_LOGS/contended"
  k=$(kiln_single "$f" "$THREADS" $P $G $R) || { fail "kilnd bench" "$BENCH_LOGS/kilnd-bench-$name.log"; k=""; }
  l=$(llama_single "$f" "$THREADS" $P $G $R) || { fail "llama-bench" "$BENCH_LOGS/llama-bench-$name.log"; l=""; }
  ks=$(kiln_streams "$f" "$THREADS" $S $SP $SG) ||
    { fail "kilnd bench-engine" "$BENCH_LOGS/kilnd-engine-$name-S$S.log"; ks=""; }
  ls_=$(llama_streams "$f" "$THREADS" $S $SP $SG "$SR") ||
    { fail "llama-batched-bench" "$BENCH_LOGS/llama-batched-$name-S$S.log"; ls_=""; }
  echo "bench-shapes: $name: kilnd: $k; $S streams: $ks" >&2
  echo "bench-shapes: $name: llama.cpp: $l; $S streams: $ls_" >&2
  while read -r c; do notes+=("$name: $c: not reliable"); done < "$BENCH_LOGS/contended"
  rows+=("$shape $fmt $bytes $(fig prefill_tok_s "$k") $(fig prefill_tok_s "$l") \
$(fig decode_tok_s "$k") $(fig decode_tok_s "$l") $(fig output_tok_s "$ks") $(fig output_tok_s "$ls_")")
done

BW1=$(membw)
BW=$(awk -v a="$BW0" -v b="$BW1" 'BEGIN{ print (a + 0 > b + 0) ? a : b }')
while read -r c; do notes+=("$c"); done < "$BENCH_LOGS/membw.notes"

# ---------------------------------------------------------------- table
echo "--- real shapes, random weights: kilnd vs llama.cpp (llama-bench, llama-batched-bench;" \
     "llama-cpp-python $PEER_PIN sdist), $THREADS threads"
echo "read bandwidth: $BW GB/s (membw, $THREADS threads, 1 GiB, best of 8 passes; $BW0 at the start," \
     "$BW1 at the end); tok/s; goal: met or not met"
printf '%-13s %-7s| %-33s | %-37s | %-33s | %s\n' "" "" "prefill $P" "decode $G after $P" \
  "$S streams x ($SP+$SG) output" "decode weight reads GB/s (% of $BW)"
printf '%-13s %-7s| %7s %9s %5s %-9s | %7s %9s %5s %-13s | %7s %9s %5s %-9s | %7s %-13s %-8s %s\n' \
  shape format kilnd llama.cpp ratio "goal 2x" kilnd llama.cpp ratio "goal 1.25x" kilnd llama.cpp \
  ratio "goal 3x" "MB/tok" kilnd "goal 70%" llama.cpp
for r in "${rows[@]}"; do
  awk -v bw="$BW" -v r="$r" 'BEGIN{
    split(r, v, " "); b = v[3]
    printf "%-13s %-7s| %s | %s | %s | %7.1f %-13s %-8s %s\n", v[1], v[2],
      cell(v[4], v[5], 2, 9), cell(v[6], v[7], 1.25, 13), cell(v[8], v[9], 3, 9), b / 1e6,
      share(v[6], b, bw), goal(v[6] == "-" ? "" : pct(v[6], b, bw), 70), share(v[7], b, bw) }
  function fig(x) { return x == "-" ? "n/a" : sprintf("%.1f", x) }
  function goal(x, g) { return x == "" ? "n/a" : (x + 0 >= g ? "met" : "not met") }
  function cell(k, l, g, w,   ra) {
    ra = (k == "-" || l == "-" || l <= 0) ? "" : k / l
    return sprintf("%7s %9s %5s %-" w "s", fig(k), fig(l), ra == "" ? "n/a" : sprintf("%.2f", ra), goal(ra, g)) }
  function pct(t, b, bw) { return bw > 0 ? 100 * t * b / 1e9 / bw : "" }
  function share(t, b, bw) {
    return t == "-" ? "n/a" : sprintf("%.1f (%.0f%%)", t * b / 1e9, pct(t, b, bw)) }'
done
for n in "${notes[@]}"; do echo "bench-shapes: $n"; done
exit $status
