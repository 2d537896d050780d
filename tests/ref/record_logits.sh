#!/usr/bin/env bash
# record_logits.sh: llama.cpp's logits on the tiny random models, recorded as the
# references that tests/ref/llama_parity.py (make test's parity/llama-cpp) holds kilnd to.
# NOT run by make test: CI never builds llama.cpp. Run it by hand, and commit what it
# writes (tests/ref/logits/<model>.json and <model>.f32.json, ~35 KB each), whenever
# tests/ref/make_tiny_models.py adds a model or changes one (llama_parity.py fails on a
# changed model's sha256 and names this script; it reports a model with no reference):
#
#   tests/ref/record_logits.sh [NAME.gguf ...]   default: every model make_tiny_models.py writes
#
# Steps: tests/bench/peer.sh (builds llama.cpp from the pinned llama-cpp-python sdist of
# tests/bench/requirements.txt, ~25 min on 2 cores the first time; a stamp check after);
# tests/ref/llama_logits.c compiled against the peer's static libraries (build/peer/cmake);
# make_tiny_models.py into $BUILD/tiny-models (deterministic from its seeds); per model,
# tests/ref/llama_compat.py (the file llama.cpp can run: F16/BF16 norm vectors widened to
# F32, exactly; the pre-tokenizer name llama.cpp spells differently overridden at load),
# then llama_logits over PROMPTS below on 1 thread, llama.cpp's defaults otherwise (flash
# attention auto: on, for the CPU; f16 KV cache): per position the top-32 ids with their
# log-softmax and llama.cpp's top-2 margin, plus both files' sha256 and the pin. Twice
# per model: <model>.json on the model as it is, <model>.f32.json on its f32 twin (every
# weight dequantized to F32: the same function without llama.cpp's activation rounding;
# llama_compat.py says why).
# Env: BUILD (build), PY (a python with numpy and gguf; default $BUILD/venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
PY=${PY:-$BUILD/venv/bin/python}
OUT=tests/ref/logits
TINY=$BUILD/tiny-models
PIN=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' tests/bench/requirements.txt)
TOP_K=32
# Fixed prompts (ids; no BOS is added): numpy default_rng(19000 + 100*len + k)
# .integers(3, 256, len), written out. Byte tokens 3..255 are in every vocabulary
# make_tiny_models.py writes (its GPT-2 byte-level BPE puts the 256 byte symbols first)
# and clear of the low control ids of SentencePiece vocabularies; llama_logits refuses an
# id that is an end-of-generation id of the model or outside its vocabulary.
PROMPTS=(
  p8=91,148,147,11,4,32,171,35
  p12=171,151,55,32,109,13,19,87,75,48,39,64
  p17=140,218,164,224,123,214,250,218,235,117,50,164,165,236,201,95,161
  p24=11,144,129,219,172,93,25,176,80,188,30,224,184,150,10,208,172,197,163,106,209,198,191,113
)

[ -n "$PIN" ] || { echo "record_logits: no llama-cpp-python pin in tests/bench/requirements.txt" >&2; exit 1; }
[ -x "$PY" ] || { echo "record_logits: no python at $PY (make venv, or set PY)" >&2; exit 1; }

tests/bench/peer.sh >/dev/null
P=$BUILD/peer/cmake
LL=$BUILD/ref/llama_logits
mkdir -p "$BUILD/ref" "$OUT"
# the peer's CMake build uses OpenMP (GGML_OPENMP=ON) and C++: -fopenmp -lstdc++
cc -O2 -Wall -Wextra -std=c11 -I"$BUILD/peer/src/include" -I"$BUILD/peer/src/ggml/include" \
  tests/ref/llama_logits.c "$P/src/libllama.a" "$P/ggml/src/libggml.a" \
  "$P/ggml/src/libggml-cpu.a" "$P/ggml/src/libggml-base.a" -lstdc++ -fopenmp -lm -lpthread -o "$LL"

made=$("$PY" tests/ref/make_tiny_models.py "$TINY" | sed -n 's/: [0-9]* bytes$//p')
if [ $# -gt 0 ]; then
  models=()
  for n in "$@"; do
    f=$TINY/$(basename "$n")
    grep -qxF "$f" <<<"$made" || { echo "record_logits: make_tiny_models.py writes no $(basename "$n")" >&2; exit 2; }
    models+=("$f")
  done
else
  mapfile -t models <<<"$made"
fi

prompt_args=() failed=()
for p in "${PROMPTS[@]}"; do prompt_args+=(--prompt "$p"); done
for mv in "${models[@]/%/ as-is}" "${models[@]/%/ f32}"; do
  m=${mv% *} variant=${mv##* }
  name=$(basename "$m" .gguf)
  if [ "$variant" = f32 ]; then
    name=$name.f32
    plan=$("$PY" tests/ref/llama_compat.py --f32 "$m" "$TINY/llama-compat")
  else
    plan=$("$PY" tests/ref/llama_compat.py "$m" "$TINY/llama-compat")
  fi
  run=$(sed -n 's/^file //p' <<<"$plan")
  changes=$(sed -n 's/^widen //p' <<<"$plan" | paste -sd';' - | sed 's/;/; /g')
  ov_args=()
  while read -r kv; do [ -n "$kv" ] && ov_args+=(--override "$kv"); done < <(sed -n 's/^override //p' <<<"$plan")
  "$LL" --model "$run" --top-k "$TOP_K" --threads 1 "${ov_args[@]}" \
    --meta "model=$(basename "$m")" --meta "sha256=$(sha256sum "$m" | cut -d' ' -f1)" \
    --meta "variant=$variant" \
    --meta "llama_cpp_model=${run#"$TINY"/}" \
    --meta "llama_cpp_sha256=$(sha256sum "$run" | cut -d' ' -f1)" \
    --meta "llama_cpp_changes=${changes:-none}" \
    --meta "peer=llama-cpp-python==$PIN (its vendored llama.cpp, built by tests/bench/peer.sh)" \
    --meta "recorded_by=tests/ref/record_logits.sh" \
    "${prompt_args[@]}" >"$OUT/$name.json.tmp" 2>"$BUILD/ref/$name.log" || {
      echo "record_logits: llama.cpp failed on $run (no reference written; its log's end):" >&2
      grep -v '^\.*$' "$BUILD/ref/$name.log" | tail -n 12 | sed 's/^/  | /' >&2
      rm -f "$OUT/$name.json.tmp"; failed+=("$name"); continue; }
  mv "$OUT/$name.json.tmp" "$OUT/$name.json"
  echo "record_logits: $OUT/$name.json ($(wc -c <"$OUT/$name.json") bytes) from $run"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "record_logits: no reference for: ${failed[*]}" >&2
  exit 1
fi
