#!/usr/bin/env bash
# shape_test.sh KILND MODEL PY [ASAN_KILND]: `kilnd shape` (core/shape.c) against what it stands in for.
#  - its type mix and dims are llama-quantize's, tensor by tensor, for every shape and
#    format recorded from the peer in tests/shapes/ref/ (tests/shapes/record_types.sh);
#  - the files it writes are read by an independent reader (gguf-py) as the plan says,
#    are the same bytes whatever the thread count, load and generate in kilnd, and a
#    padded vocabulary tokenizes text as the borrowed tokenizer does;
#  - bad requests fail clearly and leave no partial file;
#  - under ASan/UBSan (ASAN_KILND) it writes the same bytes.
set -u
kilnd=$1 model=$2 py=$3 asan=${4:-} bad=0 tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
say() { echo "$*"; }
fail() { echo "FAIL $*"; bad=1; }

n=0
for ref in tests/shapes/ref/*.types; do
  name=$(basename "$ref" .types) fmt=${name##*-} shape=${name%-*}
  if ! "$kilnd" shape "$shape" --plan --type "$fmt" 2>"$tmp/err" | LC_ALL=C sort >"$tmp/plan"; then
    fail "$name: kilnd shape --plan failed: $(cat "$tmp/err")"; continue; fi
  if ! diff "$tmp/plan" "$ref" >"$tmp/diff"; then
    fail "$name: the plan is not llama-quantize's ($(grep -c '^[<>]' "$tmp/diff") lines differ):"
    head -6 "$tmp/diff"
  fi
  n=$((n + 1))
done
say "ok: $n plans are llama-quantize's, tensor by tensor (types and dims)"

# written files: the default model's shape in every type (small), one padded vocabulary
for fmt in Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 F16 BF16 F32; do
  f=$tmp/s-$fmt.gguf
  "$kilnd" shape smollm2-135m "$f" --type "$fmt" --tokenizer "$model" --threads 2 2>"$tmp/err" ||
    { fail "smollm2-135m $fmt: $(cat "$tmp/err")"; continue; }
  "$kilnd" shape smollm2-135m --plan --type "$fmt" >"$tmp/plan" 2>/dev/null
  "$py" tests/shapes/check_gguf.py "$f" "$tmp/plan" 49152 || fail "smollm2-135m $fmt: gguf-py disagrees"
  ids=$("$kilnd" generate --model "$f" --prompt-ids 1,2,3 --max-tokens 4 --ids --threads 2 2>"$tmp/err")
  [ "$(wc -w <<<"$ids")" = 4 ] || fail "smollm2-135m $fmt: kilnd generate gave '$ids': $(tail -2 "$tmp/err")"
  [ "$fmt" = Q4_K_M ] || rm -f "$f"
done
say "ok: smollm2-135m in 11 types: gguf-py reads each as planned, kilnd generates from each"

"$kilnd" shape smollm2-135m "$tmp/one.gguf" --type Q4_K_M --tokenizer "$model" --threads 1 2>/dev/null
cmp -s "$tmp/one.gguf" "$tmp/s-Q4_K_M.gguf" && say "ok: 1 and 2 threads write the same bytes" ||
  fail "1 and 2 threads wrote different files"
"$kilnd" shape smollm2-135m "$tmp/seed.gguf" --type Q4_K_M --tokenizer "$model" --seed 7 2>/dev/null
cmp -s "$tmp/seed.gguf" "$tmp/s-Q4_K_M.gguf" && fail "another seed wrote the same weights" ||
  say "ok: another seed, other weights"
if [ -n "$asan" ]; then
  "$asan" shape smollm2-135m "$tmp/asan.gguf" --type Q4_K_M --tokenizer "$model" 2>"$tmp/err" &&
    cmp -s "$tmp/asan.gguf" "$tmp/s-Q4_K_M.gguf" && say "ok: under ASan/UBSan, the same bytes" ||
    fail "under ASan: $(tail -5 "$tmp/err")"
fi
rm -f "$tmp/one.gguf" "$tmp/seed.gguf" "$tmp/asan.gguf" "$tmp/s-Q4_K_M.gguf"

# expect RC WORDS CMD...: fails with status RC, says WORDS, leaves no file behind
expect() {
  local want=$1 words=$2; shift 2
  "$@" >"$tmp/out" 2>&1; local rc=$?
  if [ $rc -ne "$want" ] || ! grep -qiF -- "$words" "$tmp/out"; then
    fail "(rc=$rc, want $want and \"$words\"): $* -> $(head -c 300 "$tmp/out")"
  elif ls "$tmp"/bad* >/dev/null 2>&1; then fail "$*: left $(ls "$tmp"/bad*)"
  else say "ok: $words"; fi
}
f=$tmp/qwen3.gguf
if "$kilnd" shape qwen3-0.6b "$f" --type Q4_0 --tokenizer "$model" 2>"$tmp/err"; then
  "$kilnd" shape qwen3-0.6b --plan --type Q4_0 >"$tmp/plan" 2>/dev/null
  "$py" tests/shapes/check_gguf.py "$f" "$tmp/plan" 151936 || fail "qwen3-0.6b: gguf-py disagrees"
  text="Hello world, the kiln is hot: 123 + 456!"
  a=$("$kilnd" tokenize --model "$f" --text "$text" 2>&1) b=$("$kilnd" tokenize --model "$model" --text "$text" 2>&1)
  [ -n "$a" ] && [ "$a" = "$b" ] && say "ok: the padded vocabulary tokenizes as the borrowed one ($a)" ||
    fail "tokenize: padded [$a] borrowed [$b]"
  last=$("$kilnd" detokenize --model "$f" --special --ids "151935" 2>&1)
  [ "$last" = "<|reserved_102783|>" ] && say "ok: the last token is $last" || fail "the last token is '$last'"
  ids=$("$kilnd" generate --model "$f" --prompt "$text" --max-tokens 4 --ids --threads 2 2>"$tmp/err")
  [ "$(wc -w <<<"$ids")" = 4 ] || fail "qwen3-0.6b: kilnd generate gave '$ids': $(tail -2 "$tmp/err")"
  expect 1 "the tokenizer has 151936 tokens, more than smollm2-135m's 49152" \
    "$kilnd" shape smollm2-135m "$tmp/bad.gguf" --tokenizer "$f"
  rm -f "$f"
else fail "qwen3-0.6b Q4_0: $(cat "$tmp/err")"; fi

expect 2 "unknown shape 'llama-9b'" "$kilnd" shape llama-9b "$tmp/bad.gguf"
expect 2 "unknown type 'Q3_K_XL'" "$kilnd" shape smollm2-135m "$tmp/bad.gguf" --type Q3_K_XL
expect 2 "usage" "$kilnd" shape smollm2-135m
expect 1 "nothere.gguf: cannot open" "$kilnd" shape smollm2-135m "$tmp/bad.gguf" --tokenizer "$tmp/nothere.gguf"
expect 1 "no/dir/bad.gguf.part: no such file" "$kilnd" shape smollm2-135m "$tmp/no/dir/bad.gguf" --tokenizer "$model"
exit $bad
