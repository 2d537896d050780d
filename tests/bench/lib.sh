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
  local a b
  a=$(head -1 /proc/stat); sleep 1; b=$(head -1 /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN{
    n = split(a, x); split(b, y); t = 0
    for (i = 2; i <= n; i++) t += y[i] - x[i]
    idle = (y[5] - x[5]) + (y[6] - x[6])
    if (t > 0 && (t - idle) / t > 0.15)
      printf "bench: WARNING: the CPUs are %.0f%% busy before starting: other work is running, the figures are not reliable\n", 100 * (t - idle) / t }'
}

# peer_bin: sets PEER_BIN (builds llama.cpp's tools the first time, ~25 min on 2 cores)
peer_bin() {
  [ -n "${PEER_BIN:-}" ] || PEER_BIN=$(BUILD=$BUILD tests/bench/peer.sh)
  # shellcheck disable=SC2034 # read by the scripts that source this file
  PEER_PIN=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' tests/bench/requirements.txt)
}

# _run_logged LOG CMD...: CMD's stdout on stdout, its stderr into LOG; on failure the tail
_run_logged() {
  local log=$1; shift
  "$@" 2>"$log" && return 0
  local rc=$?
  echo "bench: '$*' failed ($rc); the end of $log:" >&2
  tail -15 "$log" >&2
  return $rc
}

_tag() { basename "$1" .gguf; }

# kiln_single MODEL THREADS P G R: kilnd bench (prefill P from empty, G decode steps after
# it, best of R) -> "prefill_tok_s=X decode_tok_s=Y"
kiln_single() {
  local out line
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
  pp=$(_run_logged "$log" "$PEER_BIN/llama-bench" -m "$1" -t "$2" -p "$3" -n 0 -r "$5" -o json) || return 1
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
