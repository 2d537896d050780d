#!/usr/bin/env bash
# cli_test.sh: the `kiln` CLI against a running kilnd.
# usage: cli_test.sh KILN_BIN HOST:PORT METRICS_HOST:PORT CA USER_TOKEN ADMIN_TOKEN \
#                    EXPECT_TEXT_FILE PROMPT MAX_TOKENS WRONG_CA
# EXPECT_TEXT_FILE holds the greedy chat answer to PROMPT (MAX_TOKENS tokens at most),
# without a trailing newline. The server must be otherwise idle (the bench check compares
# its /metrics counters before and after). Prints `ok   name` or `FAIL name: detail` per
# check; exit status 0 only when all passed. Every command is bounded by `timeout`.
set -u
if [ $# -ne 10 ]; then
  echo "usage: $0 KILN_BIN HOST:PORT METRICS_HOST:PORT CA USER_TOKEN ADMIN_TOKEN EXPECT_TEXT_FILE PROMPT MAX_TOKENS WRONG_CA" >&2
  exit 2
fi
kiln=$1 host=$2 metrics=$3 ca=$4 utok=$5 atok=$6 expect=$7 prompt=$8 maxtok=$9 wrongca=${10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Only what each check passes: no settings from the caller's environment or config file.
unset KILN_HOST KILN_TOKEN KILN_CA KILN_CERT KILN_KEY
export XDG_CONFIG_HOME=$tmp/xdg HOME=$tmp
failed=0
ok() { echo "ok   $1"; }
fail() { echo "FAIL $1: $2"; failed=1; }
conn=(--host "$host" --ca "$ca" --token "$utok")
{ cat "$expect"; printf '\n'; } >"$tmp/want"

# check NAME: compares $tmp/out with $tmp/want after a command that exited with $rc.
same_text() {
  local name=$1 rc=$2
  if [ "$rc" -ne 0 ]; then fail "$name" "exit $rc: $(head -c 300 "$tmp/err")"
  elif ! cmp -s "$tmp/out" "$tmp/want"; then
    fail "$name" "got '$(head -c 300 "$tmp/out")', want '$(cat "$tmp/want")'"
  else ok "$name"; fi
}

# ---- 1. generate, prompt from the argument
timeout 60 "$kiln" generate "${conn[@]}" --temperature 0 --max-tokens "$maxtok" "$prompt" \
  >"$tmp/out" 2>"$tmp/err"
same_text generate_arg $?

# ---- 2. the same prompt on stdin (and the settings from the environment)
printf '%s\n' "$prompt" | KILN_HOST=$host KILN_CA=$ca KILN_TOKEN=$utok \
  timeout 60 "$kiln" generate --temperature 0 --max-tokens "$maxtok" >"$tmp/out" 2>"$tmp/err"
same_text generate_stdin_env $?

# ---- 3. failover: the first host refuses, the second serves
timeout 60 "$kiln" generate --host "127.0.0.1:1,$host" --ca "$ca" --token "$utok" \
  --temperature 0 --max-tokens "$maxtok" "$prompt" >"$tmp/out" 2>"$tmp/err"
same_text failover $?

# ---- 4. bench, checked against the server's own counters
# metric NAME: the sum of NAME's samples (all label sets) in $tmp/m.
metric_sum() {
  awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.0f\n", s }' "$tmp/m"
}
scrape() { timeout 10 curl -sf "http://$metrics/metrics" >"$tmp/m"; }
# json KEY: a number from the bench's flat JSON object.
json() { grep -o "\"$1\":[-0-9.e]*" "$tmp/bench.json" | head -1 | cut -d: -f2; }
if ! scrape; then
  fail bench "cannot fetch http://$metrics/metrics"
else
  gen0=$(metric_sum kiln_generation_tokens_total) ok0=$(metric_sum kiln_request_success_total)
  timeout 300 "$kiln" bench "${conn[@]}" --concurrency 16 --requests 64 --max-tokens 16 \
    --prompt-tokens 32 --json >"$tmp/bench.json" 2>"$tmp/err"
  rc=$?
  out=$(json output_tokens) lost=$(json lost) errs=$(json errors) done_=$(json completed)
  # the counters move as ENDs are sent; give a scrape that raced the last one a moment
  for _ in 1 2 3 4 5; do
    scrape; gen1=$(metric_sum kiln_generation_tokens_total) ok1=$(metric_sum kiln_request_success_total)
    [ $((gen1 - gen0)) -eq "${out:-0}" ] && [ $((ok1 - ok0)) -eq 64 ] && break
    sleep 0.4
  done
  if [ $rc -ne 0 ]; then fail bench "exit $rc: $(head -c 300 "$tmp/err")"
  elif [ "$lost" != 0 ] || [ "$errs" != 0 ] || [ "$done_" != 64 ]; then
    fail bench "lost=$lost errors=$errs completed=$done_: $(cat "$tmp/bench.json")"
  elif [ "$out" != $((64 * 16)) ]; then fail bench "output_tokens=$out, want $((64 * 16))"
  elif [ $((gen1 - gen0)) -ne "$out" ]; then
    fail bench "server generated $((gen1 - gen0)) tokens, bench counted $out"
  elif [ $((ok1 - ok0)) -ne 64 ]; then fail bench "server finished $((ok1 - ok0)) requests, want 64"
  else ok bench; fi
fi

# ---- 4b. bench --openai: the same load over the server's OpenAI HTTP path (SSE)
timeout 30 "$kiln" bench --openai "https://$host" --ca "$ca" --token "$utok" --concurrency 4 \
  --requests 8 --max-tokens 8 --prompt-tokens 16 --json >"$tmp/bench.json" 2>"$tmp/err"
rc=$?
out=$(json output_tokens) errs=$(json errors) done_=$(json completed) lost=$(json lost)
if [ $rc -ne 0 ]; then fail bench_openai "exit $rc: $(head -c 300 "$tmp/err")"
elif [ "$done_" != 8 ] || [ "$errs" != 0 ] || [ "$lost" != 0 ] || [ "$out" != 64 ]; then
  fail bench_openai "completed=$done_ errors=$errs lost=$lost output_tokens=$out (want 8 0 0 64)"
else ok bench_openai; fi
# a port nobody listens on, and a URL that is not one: exit 1 / 2 with one clear line
timeout 10 "$kiln" bench --openai "https://127.0.0.1:1" --ca "$ca" --token "$utok" --retries 0 \
  --requests 2 >"$tmp/out" 2>"$tmp/err"
rc1=$? e1=$(head -c 300 "$tmp/err")
timeout 10 "$kiln" bench --openai "ftp://$host" --requests 2 >"$tmp/out" 2>"$tmp/err"
rc2=$? e2=$(head -c 300 "$tmp/err")
# one raw connection per client: --connections-per-host is refused, not ignored
timeout 10 "$kiln" bench --openai "https://$host" --connections-per-host 2 --requests 2 \
  >"$tmp/out" 2>"$tmp/err"
rc3=$? e3=$(head -c 300 "$tmp/err")
if [ $rc1 -ne 1 ] || ! grep -qi 'refused' <<<"$e1" || [ $rc2 -ne 2 ] || ! grep -qF 'want http:' <<<"$e2" ||
   [ $rc3 -ne 2 ] || ! grep -q -- '--connections-per-host' <<<"$e3"; then
  fail bench_openai_errors "wrong port: exit $rc1 '$e1'; bad URL: exit $rc2 '$e2'; per host: exit $rc3 '$e3'"
else ok bench_openai_errors; fi

# ---- 5. Ctrl-C cancels on the server and exits 130; nothing stays allocated
timeout 60 "$kiln" generate "${conn[@]}" --max-tokens 400 --ignore-eos "$prompt" \
  >"$tmp/out" 2>"$tmp/err" &
pid=$!
sleep 1
kill -INT $pid # timeout passes the SIGINT on to kiln
wait $pid
rc=$?
clean=0
for _ in $(seq 1 25); do # up to 5 s
  timeout 10 "$kiln" stats "${conn[@]}" >"$tmp/stats" 2>>"$tmp/err"
  if grep -qx 'running=0' "$tmp/stats" && grep -qx 'kv_blocks_used=0' "$tmp/stats"; then
    clean=1; break
  fi
  sleep 0.2
done
if [ $rc -ne 130 ]; then fail cancel "exit $rc, want 130: $(head -c 300 "$tmp/err")"
elif [ $clean -ne 1 ]; then fail cancel "server not idle after the cancel: $(tr '\n' ' ' <"$tmp/stats")"
else ok cancel; fi

# ---- 6. wrong CA, wrong token: exit 1 with a clear line, quickly
timeout 5 "$kiln" health --host "$host" --ca "$wrongca" --token "$utok" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -qi 'certificate' "$tmp/err"; then
  fail wrong_ca "exit $rc: $(head -c 300 "$tmp/err")"
else ok wrong_ca; fi
timeout 5 "$kiln" health --host "$host" --ca "$ca" --token "not-$utok" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -q '401' "$tmp/err"; then
  fail wrong_token "exit $rc: $(head -c 300 "$tmp/err")"
else ok wrong_token; fi

# ---- 7. health and metrics (admin token: the read-only verbs work for both roles)
timeout 10 "$kiln" health --host "$host" --ca "$ca" --token "$atok" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ]; then fail health "exit $rc: $(cat "$tmp/out" "$tmp/err" | head -c 300)"
else ok health; fi
timeout 10 "$kiln" metrics "${conn[@]}" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] || ! grep -q '^kiln_generation_tokens_total' "$tmp/out"; then
  fail metrics "exit $rc: $(head -c 300 "$tmp/err")"
else ok metrics; fi

# ---- 8. the config file, and flags over it
mkdir -p "$tmp/xdg/kiln"
printf '# test\nhost = %s\nca = %s\ntoken = wrong-token\n' "$host" "$ca" >"$tmp/xdg/kiln/client.ini"
timeout 10 "$kiln" health --token "$utok" >"$tmp/out" 2>"$tmp/err"
rc1=$?
timeout 10 "$kiln" health >"$tmp/out2" 2>"$tmp/err2"
rc2=$?
if [ $rc1 -ne 0 ] || [ $rc2 -ne 1 ] || ! grep -q 401 "$tmp/err2"; then
  fail config "with --token: exit $rc1 $(head -c 200 "$tmp/err"); file token: exit $rc2 $(head -c 200 "$tmp/err2")"
else ok config; fi
rm -f "$tmp/xdg/kiln/client.ini"

# ---- 9. chat: two turns, the history sent as messages; the first answer is the chat prompt's
printf '%s\n%s\n' "$prompt" "Say that again." | timeout 120 "$kiln" chat "${conn[@]}" --temperature 0 \
  --max-tokens "$maxtok" -v >"$tmp/out" 2>"$tmp/err"
rc=$?
p1=$(grep -o 'reason=[a-z]* prompt_tokens=[0-9]*' "$tmp/err" | sed -n 1p | cut -d= -f3)
p2=$(grep -o 'reason=[a-z]* prompt_tokens=[0-9]*' "$tmp/err" | sed -n 2p | cut -d= -f3)
if [ $rc -ne 0 ]; then fail chat "exit $rc: $(head -c 300 "$tmp/err")"
elif ! head -c "$(wc -c <"$tmp/want")" "$tmp/out" | cmp -s - "$tmp/want"; then
  fail chat "first answer '$(head -c 300 "$tmp/out")', want '$(cat "$tmp/want")'"
elif [ -z "$p1" ] || [ -z "$p2" ] || [ "$p2" -le $((p1 + 4)) ]; then
  fail chat "prompt_tokens $p1 then $p2: the second turn lacks the first: $(head -c 300 "$tmp/err")"
else ok chat; fi
timeout 5 "$kiln" chat "${conn[@]}" --no-chat </dev/null >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q -- '--no-chat' "$tmp/err"; then
  fail chat_no_chat "exit $rc: $(head -c 300 "$tmp/err")"
else ok chat_no_chat; fi

# ---- 10. usage errors exit 2 with one line, before any connection
timeout 5 "$kiln" generate "${conn[@]}" --temperature hot "$prompt" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q -- '--temperature' "$tmp/err"; then
  fail usage "exit $rc: $(head -c 300 "$tmp/err")"
else ok usage; fi

exit $failed
