#!/usr/bin/env bash
# shapes.sh (make shapes): random-weight models of real shapes in the formats users
# download, for the benchmarks. For each shape in SHAPES and format in FORMATS it makes
# $BUILD/shapes/<shape>-<FORMAT>.gguf if missing: the F16 file once with gen_shape.py, then
# llama.cpp's own llama-quantize (tests/bench/peer.sh) into each other format. The F16
# intermediate is deleted afterwards unless F16 is in FORMATS: left in the page cache it
# evicts a large model's mmapped pages while that model is benchmarked (PLATFORM-NOTES).
# Prints the files' paths on stdout, one a line; progress on stderr.
# Env: BUILD (build), PY (build/venv/bin/python, with tests/requirements.txt),
#   SHAPES ("llama-3.2-1b"; `gen_shape.py --list` names them all),
#   FORMATS ("Q4_K_M Q8_0 F16"; any llama-quantize type name, F16 as generated).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
PY=${PY:-$BUILD/venv/bin/python}
SHAPES=${SHAPES:-llama-3.2-1b}
FORMATS=${FORMATS:-Q4_K_M Q8_0 F16}
OUT=$BUILD/shapes
GEN=tests/shapes/gen_shape.py

mkdir -p "$OUT"
want_f16=0
for f in $FORMATS; do [ "$f" = F16 ] && want_f16=1; done
known=$("$PY" "$GEN" --list | cut -d' ' -f1)

quantize=""
for shape in $SHAPES; do
  grep -qx -- "$shape" <<<"$known" || {
    echo "shapes: unknown shape '$shape' (known: $(tr '\n' ' ' <<<"$known"))" >&2; exit 2; }
  f16=$OUT/$shape-F16.gguf
  made_f16=0
  for fmt in $FORMATS; do
    dst=$OUT/$shape-$fmt.gguf
    if [ ! -f "$dst" ]; then
      if [ ! -f "$f16" ]; then
        echo "shapes: generating $f16" >&2
        "$PY" "$GEN" "$shape" "$f16" >&2
        made_f16=1
      fi
      if [ "$fmt" != F16 ]; then
        [ -n "$quantize" ] || quantize=$(tests/bench/peer.sh)/llama-quantize
        echo "shapes: llama-quantize $f16 -> $dst ($fmt)" >&2
        t0=$SECONDS
        "$quantize" "$f16" "$dst.part" "$fmt" "$(nproc)" > "$OUT/$shape-$fmt.quantize.log" 2>&1 || {
          tail -20 "$OUT/$shape-$fmt.quantize.log" >&2
          rm -f "$dst.part"
          echo "shapes: llama-quantize $fmt failed (log: $OUT/$shape-$fmt.quantize.log)" >&2
          exit 1; }
        mv "$dst.part" "$dst"
        echo "shapes: $dst: $(du -h "$dst" | cut -f1) in $((SECONDS - t0)) s" >&2
      fi
    fi
    echo "$dst"
  done
  if [ "$want_f16" = 0 ] && [ "$made_f16" = 1 ]; then
    echo "shapes: removing the F16 intermediate $f16" >&2
    rm -f "$f16"
  fi
done
