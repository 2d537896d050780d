#!/usr/bin/env bash
# make bench: kilnd against llama.cpp (pinned llama-cpp-python, built from source for this
# CPU) on the same GGUF, same thread count, run one after the other, never concurrently.
#   prefill: 512 prompt tokens from an empty context (tok/s)
#   decode : 128 single-token steps after it (tok/s)
# best of 3 for each.  Env: BUILD (default build), MODEL, THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${BENCH_THREADS:-2}
P=512 G=128 R=3
KILND=$BUILD/gnu/kilnd
VENV=$BUILD/bench-venv
REQ=tests/bench/requirements.txt
PIN=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$REQ")

# ---------------------------------------------------------------- peer install (once)
have_peer() {
  [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c "import llama_cpp,sys; sys.exit(llama_cpp.__version__ != '$PIN')" 2>/dev/null
}
if ! have_peer; then
  echo "bench: installing llama-cpp-python==$PIN into $VENV (compiles llama.cpp; takes minutes)" >&2
  scripts/need.sh python3 python3 gcc gcc g++ g++ cmake cmake
  python3 -m venv "$VENV" 2>/dev/null || {
    scripts/need.sh /usr/lib/python3/dist-packages/ensurepip python3-venv; python3 -m venv "$VENV"; }
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$VENV/bin/pip" install --disable-pip-version-check --no-binary llama-cpp-python -r "$REQ" >&2
  have_peer || { echo "bench: llama-cpp-python==$PIN did not install" >&2; exit 1; }
fi

# ---------------------------------------------------------------- machine
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|avx512f|avx512_vnni|avx512vnni|avx_vnni|amx_int8' | tr '\n' ' ' || true)
echo "machine: $cpu, $(nproc) cores online, ISA: ${flags:-none of avx2/avx512}"
echo "model: $MODEL; threads $THREADS; prefill $P tokens, decode $G tokens, best of $R"

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2" | tail -1; }

# ---------------------------------------------------------------- llama.cpp
peer_out=$("$VENV/bin/python" tests/bench/peer_llamacpp.py --model "$MODEL" --threads "$THREADS" \
             --prompt-tokens $P --gen-tokens $G --repeat $R)
echo "$peer_out" | grep '^peer:' || true
lp=$(field prefill_tok_s "$(grep '^bench:' <<<"$peer_out")")
ld=$(field decode_tok_s "$(grep '^bench:' <<<"$peer_out")")

# ---------------------------------------------------------------- kilnd
kp="" kd=""
if [ -x "$KILND" ]; then
  kout=$("$KILND" bench --model "$MODEL" --threads "$THREADS" --prompt-tokens $P \
           --gen-tokens $G --repeat $R) || { echo "bench: kilnd bench failed" >&2; exit 1; }
  kline=$(grep '^bench:' <<<"$kout" | tail -1 || true)
  kp=$(field prefill_tok_s "$kline"); kd=$(field decode_tok_s "$kline")
  [ -n "$kp" ] && [ -n "$kd" ] || { echo "bench: no 'bench: prefill_tok_s=X decode_tok_s=Y' line from kilnd:"; echo "$kout"; exit 1; }
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
echo "--- llama-cpp-python $PIN vs kilnd, $THREADS threads"
row "prefill $P" "$kp" "$lp"
row "decode $G" "$kd" "$ld"
[ -x "$KILND" ] || exit 1
