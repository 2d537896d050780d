#!/usr/bin/env bash
# cli_errors.sh KILND MODEL: bad input gets a clear message and a nonzero exit, never a crash.
# Each case names the words kilnd's message must carry (the reason, not only the file or
# flag it echoes back), so a wrong message fails as well as a wrong status.
set -u
kilnd=$1 model=$2 bad=0 tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# expect RC WORDS CMD...: the command must fail with status RC (kilnd's: 2 for a bad
# command line or config file, 1 for bad input met while running; never 0 or a signal)
# and say WORDS (a fixed string, any case).
expect() {
  local want=$1 words=$2; shift 2
  "$@" >"$tmp/out" 2>&1; local rc=$?
  if [ $rc -ne "$want" ] || ! grep -qiF -- "$words" "$tmp/out"; then
    echo "FAIL (rc=$rc, want $want and \"$words\"): $* -> $(head -c 300 "$tmp/out")"; bad=1
  else echo "ok: $words"; fi
}
expect 1 "missing.gguf: cannot open: no such file" "$kilnd" generate --model "$tmp/missing.gguf" --prompt hi
head -c 1000 "$model" >"$tmp/trunc.gguf"
expect 1 "tensors but the file is too small to describe them" \
  "$kilnd" generate --model "$tmp/trunc.gguf" --prompt hi
printf 'not a model at all' >"$tmp/junk.gguf"
expect 1 "junk.gguf: file is 18 bytes, too small for a gguf header" \
  "$kilnd" generate --model "$tmp/junk.gguf" --prompt hi
expect 2 "unknown flag '--bogus'" "$kilnd" generate --model "$model" --bogus
expect 1 "prompt (1 tokens) + max_tokens (100) exceeds the context (64)" \
  "$kilnd" generate --model "$model" --prompt hi --ctx 64 --max-tokens 100
expect 1 "bad --prompt-ids near 'x,3'" "$kilnd" generate --model "$model" --prompt-ids 1,x,3
expect 1 "bad --prompt-ids near '99999999'" "$kilnd" generate --model "$model" --prompt-ids 99999999
expect 1 "cannot write logits to $tmp/no/dir/p.f32: no such file" \
  "$kilnd" generate --model "$model" --prompt-ids 1,2,3 --max-tokens 0 --dump-prompt-logits "$tmp/no/dir/p.f32"
expect 2 "--dump-prompt-logits needs a value" "$kilnd" generate --model "$model" --dump-prompt-logits
expect 2 "unknown command 'frobnicate'" "$kilnd" frobnicate
printf '[engine]\nmax_batch_size = 0\n' >"$tmp/bad.ini"
expect 2 "bad.ini:2: [engine] max_batch_size = 0: must be 1..1024" \
  "$kilnd" bench-engine --config "$tmp/bad.ini"
printf '[engine]\nthreads = 2\nbogus_knob = 1\n' >"$tmp/typo.ini"
expect 2 "typo.ini:3: [engine] bogus_knob: unknown key" "$kilnd" bench-engine --config "$tmp/typo.ini"
expect 2 "none.ini: cannot open: no such file" "$kilnd" bench-engine --config "$tmp/none.ini"
exit $bad
