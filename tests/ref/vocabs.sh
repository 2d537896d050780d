#!/usr/bin/env bash
# vocabs.sh NAME...: llama.cpp's test vocabularies ggml-vocab-NAME.gguf with their test
# inputs and expected ids (.gguf.inp, .gguf.out) under $BUILD/vocabs, for
# tests/ref/vocab_parity.py. They are data of the pinned llama-cpp-python sdist
# (scripts/llama_sdist.sh downloads it from PyPI by name, once); only these files are
# extracted from it, and nothing of it is kept in the repository. Prints the folder.
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
OUT=$BUILD/vocabs
[ $# -gt 0 ] || { echo "usage: vocabs.sh NAME..." >&2; exit 2; }
missing=()
for n in "$@"; do
  for ext in gguf gguf.inp gguf.out; do
    [ -f "$OUT/ggml-vocab-$n.$ext" ] || { missing+=("$n"); break; }
  done
done
if [ ${#missing[@]} -gt 0 ]; then
  t0=$EPOCHREALTIME
  sdist=$(BUILD=$BUILD scripts/llama_sdist.sh)
  top=$(basename "$sdist" .tar.gz)
  members=()
  for n in "${missing[@]}"; do
    for ext in gguf gguf.inp gguf.out; do members+=("$top/vendor/llama.cpp/models/ggml-vocab-$n.$ext"); done
  done
  rm -rf "$OUT.tmp"
  mkdir -p "$OUT.tmp"
  tar -xzf "$sdist" -C "$OUT.tmp" --strip-components=4 "${members[@]}"
  mkdir -p "$OUT"
  mv "$OUT.tmp"/ggml-vocab-* "$OUT"/
  rmdir "$OUT.tmp"
  awk -v a="$t0" -v b="$EPOCHREALTIME" -v w="${missing[*]}" -v s="$(basename "$sdist")" \
    'BEGIN { printf "vocabs: %s from %s (download when not cached, extract): %.1f s\n", w, s, b - a }' >&2
fi
echo "$OUT"
