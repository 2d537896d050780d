# shellcheck shell=bash
# lib.sh: the measurements the bench scripts share, sourced by bench.sh, bench_engine.sh
# and bench_shapes.sh (from the repository root, with BUILD set). The peer is llama.cpp's
# own tools from tests/bench/peer.sh; each function runs one program at a time, so kilnd
# and llama.cpp never run concurrently. Programs' stderr goes to $BUILD/bench-logs/; on a
# failure its tail is printed to stderr and the function returns nonzero.

BENCH_LOGS=$BUILD/bench-logs
mkdir -p "$BENCH_LOGS"
KILND=${KILND:-$BUILD/gnu/kilnd}

# field NAME LINE: the number after "NAME=" (the last one) in LINE
field() { sed -n "s/.*[ :]$1=\([0-9.]*\).*/\1/p" <<<" $2" | tail -1; }

machine_line() {
  local cpu flags
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
  flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
          grep -xE 'avx2|avx512f|avx512_vnni|avx512vnni|avx_vnni|amx_int8' | tr '\n' ' ' || true)
  echo "machine: ${cpu:-unknown CPU}, $(nproc) cores online, ISA: ${flags:-none of avx2/avx512}"
  busy_check
}

# busy_check: warns when other work is using the CPUs (measured over one second).
# llama.cpp's threads spin-wait for each other, so one core busy elsewhere costs it far
# more than its share (seen: its decode 8x slower during a `make test`).
busy_check() {
  local p
  p=$(busy_pct 1)
  [ "$p" -le 15 ] ||
    echo "bench: WARNING: the CPUs are $p% busy before starting: other work is running, the figures are not reliable"
}

# busy_pct SECONDS: percent of all CPUs' time not idle over the next SECONDS
busy_pct() {
  local a b
  a=$(head -1 /proc/stat); sleep "$1"; b=$(head -1 /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN{
    n = split(a, x); split(b, y); t = 0
    for (i = 2; i <= n; i++) t += y[i] - x[i]
    printf "%d\n", (t > 0) ? 100 * (t - (y[5] - x[5]) - (y[6] - x[6])) / t : 0 }'
}

# wait_quiet: with BENCH_WAIT_QUIET=N (seconds), before each measurement wait up to N s
# for the CPUs to be under 10% busy over 2 s (a machine shared with other builds)
wait_quiet() {
  local max=${BENCH_WAIT_QUIET:-0} t0=$SECONDS p
  [ "$max" -gt 0 ] || return 0
  while p=$(busy_pct 2); [ "$p" -ge 10 ]; do
    if [ $((SECONDS - t0)) -ge "$max" ]; then
      echo "bench: the CPUs are still $p% busy after ${max} s; measuring anyway" >&2
      return 0
    fi
  done
}

# peer_bin: sets PEER_BIN (builds llama.cpp's tools the first time, ~25 min on 2 cores)
peer_bin() {
  [ -n "${PEER_BIN:-}" ] || PEER_BIN=$(BUILD=$BUILD tests/bench/peer.sh)
  # shellcheck disable=SC2034 # read by the scripts that source this file
  PEER_PIN=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' tests/bench/requirements.txt)
}

# _cpu_s: the machine's busy and total CPU-seconds so far; _child_s: this shell's
# waited-for children's CPU-seconds so far
_cpu_s() { awk '/^cpu /{ t = 0; for (i = 2; i <= NF; i++) t += $i; print (t - $5 - $6) / 100, t / 100 }' /proc/stat; }
# (`times` itself runs in this shell, not in a substitution's subshell)
_child_s() {
  times > "$BENCH_LOGS/.times"
  awk 'NR == 2 { split($1 " " $2, v, "[ ms]+"); print v[1] * 60 + v[2] + v[3] * 60 + v[4] }' "$BENCH_LOGS/.times"
}

# _run_logged LOG CMD...: CMD's stdout on stdout, its stderr into LOG; on failure the tail.
# CPU time used meanwhile by anything but CMD (another build on a shared machine) is
# reported on stderr and appended to $BENCH_LOGS/contended when over 5% of the machine.
_run_logged() {
  local log=$1 rc=0 s0 c0 s1 c1; shift
  s0=$(_cpu_s)
  _child_s > "$BENCH_LOGS/.c0"
  "$@" 2>"$log" || rc=$?
  s1=$(_cpu_s)
  _child_s > "$BENCH_LOGS/.c1"
  c0=$(cat "$BENCH_LOGS/.c0") c1=$(cat "$BENCH_LOGS/.c1")
  awk -v a="$s0" -v b="$s1" -v c0="$c0" -v c1="$c1" -v cmd="$(basename "$1") ${*:2}" 'BEGIN{
    split(a, x, " "); split(b, y, " "); t = y[2] - x[2]
    o = (y[1] - x[1]) - (c1 - c0)
    if (t > 0 && o / t > 0.05)
      printf "other work used %.0f%% of the CPUs during %s\n", 100 * o / t, cmd }' |
    tee -a "$BENCH_LOGS/contended" >&2
  [ $rc = 0 ] && return 0
  echo "bench: '$*' failed ($rc); the end of $log:" >&2
  tail -15 "$log" >&2
  return $rc
}

_tag() { basename "$1" .gguf; }

# kiln_single MODEL THREADS P G R: kilnd bench (prefill P from empty, G decode steps after
# it, best of R) -> "prefill_tok_s=X decode_tok_s=Y"
kiln_single() {
  local out line
  wait_quiet
  out=$(_run_logged "$BENCH_LOGS/kilnd-bench-$(_tag "$1").log" "$KILND" bench --model "$1" \
          --threads "$2" --prompt-tokens "$3" --gen-tokens "$4" --repeat "$5") || return 1
  line=$(grep '^bench:' <<<"$out" | tail -1 || true)
  [ -n "$(field decode_tok_s "$line")" ] || { echo "bench: no 'bench: ... decode_tok_s=Y' from kilnd: $out" >&2; return 1; }
  echo "prefill_tok_s=$(field prefill_tok_s "$line") decode_tok_s=$(field decode_tok_s "$line")"
}

# llama_single MODEL THREADS P G R: llama-bench pp P (-p P -n 0) and tg G after P tokens
# of context (-p 0 -n G -d P), R repetitions after its warm-up run; best and mean of the
# repetitions -> "prefill_tok_s=X prefill_mean=X decode_tok_s=Y decode_mean=Y"
llama_single() {
  local log pp tg
  log=$BENCH_LOGS/llama-bench-$(_tag "$1").log
  wait_quiet
  pp=$(_run_logged "$log" "$PEER_BIN/llama-bench" -m "$1" -t "$2" -p "$3" -n 0 -r "$5" -o json) || return 1
  wait_quiet
  tg=$(_run_logged "$log.tg" "$PEER_BIN/llama-bench" -m "$1" -t "$2" -p 0 -n "$4" -d "$3" -r "$5" -o json) || return 1
  python3 -c '
import json, sys
pp, tg = (json.loads(a)[0] for a in sys.argv[1:3])
print("prefill_tok_s=%.1f prefill_mean=%.1f decode_tok_s=%.1f decode_mean=%.1f" % (
    max(pp["samples_ts"]), pp["avg_ts"], max(tg["samples_ts"]), tg["avg_ts"]))
' "$pp" "$tg"
}

# kiln_streams MODEL THREADS S P G: kilnd bench-engine, S concurrent requests of P prompt +
# G generated tokens -> its "bench-engine: ... output_tok_s=X ..." line
kiln_streams() {
  local out line
  wait_quiet
  out=$(_run_logged "$BENCH_LOGS/kilnd-engine-$(_tag "$1")-S$3.log" "$KILND" bench-engine \
          --model "$1" --threads "$2" --requests "$3" --concurrency "$3" --prompt-tokens "$4" \
          --gen-tokens "$5" --max-batch 32 --max-batched-tokens 512) || return 1
  line=$(grep '^bench-engine:' <<<"$out" | tail -1 || true)
  [ -n "$(field output_tok_s "$line")" ] || { echo "bench: no 'bench-engine: ... output_tok_s=X' from kilnd: $out" >&2; return 1; }
  echo "$line"
}

# llama_streams MODEL THREADS S P G R: llama-batched-bench, S sequences of P prompt tokens
# (one batch, prefill timed) then G steps of one token per sequence, R runs; the same
# metric as kilnd's: output_tok_s = S*G / (T_PP + T_TG), decode_tok_s = S*G / T_TG, best
# of the runs -> "output_tok_s=X decode_tok_s=Y elapsed_s=T prefill_s=T1 decode_s=T2"
llama_streams() {
  local npl=$3 i out
  for ((i = 1; i < $6; i++)); do npl+=",$3"; done
  wait_quiet
  out=$(_run_logged "$BENCH_LOGS/llama-batched-$(_tag "$1")-S$3.log" "$PEER_BIN/llama-batched-bench" \
          -m "$1" -t "$2" -c $(($3 * ($4 + $5))) -npp "$4" -ntg "$5" -npl "$npl" \
          --output-format jsonl) || return 1
  python3 -c '
import json, sys
runs = [json.loads(l) for l in sys.stdin if l.startswith("{")]
if not runs:
    sys.exit("bench: no jsonl rows from llama-batched-bench")
out = lambda r: r["pl"] * r["tg"] / r["t"]
b = max(runs, key=out)
print("output_tok_s=%.1f decode_tok_s=%.1f elapsed_s=%.3f prefill_s=%.3f decode_s=%.3f" % (
    out(b), max(r["pl"] * r["tg"] / r["t_tg"] for r in runs), b["t"], b["t_pp"], b["t_tg"]))
' <<<"$out"
}
