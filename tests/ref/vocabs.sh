#!/usr/bin/env bash
# vocabs.sh [--templates] NAME...: llama.cpp's test vocabularies ggml-vocab-NAME.gguf with
# their test inputs and expected ids (.gguf.inp, .gguf.out) under $BUILD/vocabs, for
# tests/ref/vocab_parity.py; --templates: also the models' chat templates llama.cpp keeps
# (models/templates/*.jinja, and tests/test-chat-template.cpp, which holds more as C
# strings) under $BUILD/vocabs/templates, for tests/ref/chat_parity.py.
# They are data of the pinned llama-cpp-python sdist (scripts/llama_sdist.sh downloads it
# from PyPI by name, once); only these files are extracted from it, and nothing of it is
# kept in the repository. Prints the folder.
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
OUT=$BUILD/vocabs
templates=0
[ "${1:-}" = --templates ] && { templates=1; shift; }
[ $# -gt 0 ] || [ $templates = 1 ] || { echo "usage: vocabs.sh [--templates] NAME..." >&2; exit 2; }
want_tmpl=0
[ $templates = 1 ] && ! [ -f "$OUT/templates/.ok" ] && want_tmpl=1
missing=()
for n in "$@"; do
  for ext in gguf gguf.inp gguf.out; do
    [ -f "$OUT/ggml-vocab-$n.$ext" ] || { missing+=("$n"); break; }
  done
done
if [ ${#missing[@]} -gt 0 ] || [ $want_tmpl = 1 ]; then
  t0=$EPOCHREALTIME
  sdist=$(BUILD=$BUILD scripts/llama_sdist.sh)
  top=$(basename "$sdist" .tar.gz)
  members=()
  for n in "${missing[@]}"; do
    for ext in gguf gguf.inp gguf.out; do members+=("$top/vendor/llama.cpp/models/ggml-vocab-$n.$ext"); done
  done
  [ $want_tmpl = 1 ] && members+=("$top/vendor/llama.cpp/models/templates/*.jinja"
    "$top/vendor/llama.cpp/tests/test-chat-template.cpp")
  rm -rf "$OUT.tmp"
  mkdir -p "$OUT.tmp" "$OUT"
  tar -xzf "$sdist" -C "$OUT.tmp" --strip-components=4 --wildcards "${members[@]}"
  if [ ${#missing[@]} -gt 0 ]; then mv "$OUT.tmp"/ggml-vocab-* "$OUT"/; fi
  if [ $want_tmpl = 1 ]; then
    rm -rf "$OUT/templates"
    mv "$OUT.tmp/templates" "$OUT/templates"
    mv "$OUT.tmp/test-chat-template.cpp" "$OUT/templates/"
    touch "$OUT/templates/.ok"
  fi
  rm -rf "$OUT.tmp"
  awk -v a="$t0" -v b="$EPOCHREALTIME" -v w="${missing[*]}$([ $want_tmpl = 1 ] && echo ' templates/*.jinja')" -v s="$(basename "$sdist")" \
    'BEGIN { printf "vocabs: %s from %s (download when not cached, extract): %.1f s\n", w, s, b - a }' >&2
fi
echo "$OUT"
