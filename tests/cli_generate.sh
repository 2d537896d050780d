#!/usr/bin/env bash
# cli_generate.sh KILND generate ARGS... (ARGS with --max-tokens N): the generation
# succeeds, prints text on stdout, and its closing stderr line says it generated 1..N
# tokens and why it stopped (finish=length after exactly N, or finish=stop at an end token).
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
max=
for ((i = 1; i < $#; i++)); do [ "${!i}" = --max-tokens ] && { j=$((i + 1)); max=${!j}; }; done
[ -n "$max" ] || { echo "cli_generate.sh: give --max-tokens N"; exit 1; }
"$@" >"$tmp/out" 2>"$tmp/err"; rc=$?
echo "stdout: $(head -c 300 "$tmp/out")"; echo "stderr: $(tail -n 5 "$tmp/err")"
[ $rc -eq 0 ] || { echo "FAIL: exit status $rc"; exit 1; }
grep -q '[^[:space:]]' "$tmp/out" || { echo "FAIL: no text on stdout"; exit 1; }
line=$(grep -E 'generated [0-9]+ tokens .*finish=' "$tmp/err" | tail -n 1)
[[ $line =~ generated\ ([0-9]+)\ tokens.*finish=([a-z]+) ]] ||
  { echo "FAIL: no 'generated N tokens ... finish=' line on stderr"; exit 1; }
n=${BASH_REMATCH[1]} why=${BASH_REMATCH[2]}
if { [ "$why" = length ] && [ "$n" -eq "$max" ]; } ||
   { [ "$why" = stop ] && [ "$n" -ge 1 ] && [ "$n" -le "$max" ]; }; then
  echo "ok: $n of $max tokens, finish=$why"
else
  echo "FAIL: generated $n tokens with --max-tokens $max, finish=$why"; exit 1
fi
