#!/usr/bin/env bash
# cli_errors.sh KILND MODEL: bad input gets a clear message and a nonzero exit, never a crash.
set -u
kilnd=$1 model=$2 bad=0 tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# expect WORDS CMD...: the command must fail (exit 1 or 2, not a signal) and say WORDS.
expect() {
  local words=$1; shift
  "$@" >"$tmp/out" 2>&1; local rc=$?
  if [ $rc -eq 0 ] || [ $rc -gt 2 ] || ! grep -qi -- "$words" "$tmp/out"; then
    echo "FAIL (rc=$rc): $* -> $(head -c 300 "$tmp/out")"; bad=1
  else echo "ok: $words"; fi
}
expect "no such file" "$kilnd" generate --model "$tmp/missing.gguf" --prompt hi
head -c 1000 "$model" >"$tmp/trunc.gguf"
expect "gguf" "$kilnd" generate --model "$tmp/trunc.gguf" --prompt hi
printf 'not a model at all' >"$tmp/junk.gguf"
expect "gguf" "$kilnd" generate --model "$tmp/junk.gguf" --prompt hi
expect "unknown flag" "$kilnd" generate --model "$model" --bogus
expect "exceeds the context" "$kilnd" generate --model "$model" --prompt hi --ctx 64 --max-tokens 100
expect "prompt-ids" "$kilnd" generate --model "$model" --prompt-ids 1,x,3
expect "prompt-ids" "$kilnd" generate --model "$model" --prompt-ids 99999999
expect "unknown command" "$kilnd" frobnicate
printf '[engine]\nmax_batch_size = 0\n' >"$tmp/bad.ini"
expect "max_batch_size = 0: must be" "$kilnd" bench-engine --config "$tmp/bad.ini"
printf '[engine]\nthreads = 2\nbogus_knob = 1\n' >"$tmp/typo.ini"
expect "bogus_knob" "$kilnd" bench-engine --config "$tmp/typo.ini"
expect "cannot open\|no such file" "$kilnd" bench-engine --config "$tmp/none.ini"
exit $bad
