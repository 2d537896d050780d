#!/usr/bin/env bash
# quality.sh FILE...: what the default (8-bit activation) path costs in accuracy, per
# GGUF, against kilnd --exact (the same weights dequantized, f32 activations: the
# f32 reference the parity tests hold to numpy). For each of a few fixed prompts:
#   KL(exact || default) of the last prompt position's logits, and how many of 16
#   greedy tokens agree before the first difference.
# Prints one line per file:
#   "quality: FILE prompts=N kl_mean=X kl_max=Y greedy_same=K/N agree_mean=A/16".
# Benchmarks, not tests: the figures go to BENCHMARKS.md. Env: BUILD, PY, THREADS.
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
PY=${PY:-$BUILD/venv/bin/python}
THREADS=${THREADS:-2}
KILND=$BUILD/gnu/kilnd
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Prompts as ids (the shapes borrow the default model's tokenizer, so ids under 49152
# are real tokens): three lengths, none with an end-of-generation id.
prompts=(
  "$(seq -s, 1000 37 3331)"
  "$(seq -s, 200 101 6600)"
  "$(seq -s, 5000 13 5819)"
)

for f in "$@"; do
  kls=() same=0 n=0 agree=0
  for p in "${prompts[@]}"; do
    n=$((n + 1))
    "$KILND" generate --model "$f" --threads "$THREADS" --prompt-ids "$p" --max-tokens 16 --temperature 0 --ids \
      --exact --dump-logits "$tmp/exact.f32" >"$tmp/exact.ids" 2>"$tmp/exact.err" ||
      { echo "quality: $f: kilnd --exact failed: $(tail -1 "$tmp/exact.err")"; exit 1; }
    "$KILND" generate --model "$f" --threads "$THREADS" --prompt-ids "$p" --max-tokens 16 --temperature 0 --ids \
      --dump-logits "$tmp/q8.f32" >"$tmp/q8.ids" 2>"$tmp/q8.err" ||
      { echo "quality: $f: kilnd failed: $(tail -1 "$tmp/q8.err")"; exit 1; }
    agree=$((agree + $(awk 'NR == FNR { for (i = 1; i <= NF; i++) a[i] = $i; na = NF; next }
      { n = 0; while (n < na && n < NF && a[n + 1] == $(n + 1)) n++; print n; exit }' \
      "$tmp/exact.ids" "$tmp/q8.ids")))
    kls+=("$("$PY" - "$tmp/exact.f32" "$tmp/q8.f32" <<'EOF'
import sys
import numpy as np
p, q = (np.fromfile(a, dtype=np.float32).astype(np.float64) for a in sys.argv[1:3])
def logsm(x):
    x = x - x.max()
    return x - np.log(np.exp(x).sum())
lp, lq = logsm(p), logsm(q)
print(f"{float(np.sum(np.exp(lp) * (lp - lq))):.3e}")
EOF
)")
    cmp -s "$tmp/exact.ids" "$tmp/q8.ids" && same=$((same + 1))
  done
  printf '%s\n' "${kls[@]}" | awk -v f="$f" -v s="$same" -v n="$n" -v a="$agree" '
    { t += $1; if ($1 > m) m = $1 }
    END { printf "quality: %s prompts=%d kl_mean=%.3e kl_max=%.3e greedy_same=%d/%d agree_mean=%.1f/16\n",
                 f, n, t / n, m, s, n, a / n }'
done
