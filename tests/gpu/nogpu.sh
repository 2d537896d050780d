#!/bin/bash
# nogpu.sh CUDA_KILND MODEL [EXTRAS_MODEL]: the CUDA kilnd on a machine without a GPU
# (CI): asked for cuda it refuses with the reason; with `auto` it says why it uses the CPU
# and gives the CPU's tokens. On a machine that does have a GPU, cuda and cpu must agree
# instead. EXTRAS_MODEL (a model with math the CUDA kernels lack, e.g. tiny-qwen3moe): cuda
# refuses it naming what, before looking for a device, and auto runs it on the CPU.
# FAMILY... (models whose math the CUDA backend does implement: tiny-llama3's RoPE
# factors, tiny-qwen3's q/k norms and YaRN): cuda takes them up to the device, so
# without a GPU it refuses them only for the missing driver or device, never by name.
set -u
K=$1 M=$2 X=${3:-}
shift $(($# < 3 ? $# : 3))
for f in "$@"; do
  if err=$("$K" generate --model "$f" --prompt-ids 1,2,3 --max-tokens 2 --ids --backend cuda 2>&1 >/dev/null); then
    echo "a GPU ran $(basename "$f")"; continue
  fi
  echo "--backend cuda on $(basename "$f"): $err"
  grep -q "does not implement" <<<"$err" && { echo "FAIL: cuda refused $f by name"; exit 1; }
  grep -Eq "no NVIDIA driver|no CUDA device|driver is too old" <<<"$err" || { echo "FAIL: no clear reason"; exit 1; }
done
if [ -n "$X" ]; then
  xargs_=(generate --model "$X" --prompt-ids 1,2,3 --max-tokens 4 --temperature 0 --ids --threads 2)
  if "$K" "${xargs_[@]}" --backend cuda >/dev/null 2>/tmp/nogpu.$$; then
    echo "FAIL: --backend cuda ran $X"; rm -f /tmp/nogpu.$$; exit 1
  fi
  err=$(cat /tmp/nogpu.$$); rm -f /tmp/nogpu.$$
  echo "--backend cuda on $(basename "$X"): $err"
  grep -q "does not implement this model's" <<<"$err" || { echo "FAIL: no clear reason"; exit 1; }
  xcpu=$("$K" "${xargs_[@]}" --backend cpu 2>/dev/null) || { echo "FAIL: cpu failed on $X"; exit 1; }
  xauto=$("$K" "${xargs_[@]}" --backend auto 2>/dev/null) || { echo "FAIL: auto failed on $X"; exit 1; }
  [ "$xauto" = "$xcpu" ] || { echo "FAIL: auto [$xauto] != cpu [$xcpu] on $X"; exit 1; }
fi
args=(generate --model "$M" --prompt "The capital of France is" --max-tokens 12 --temperature 0 --ids --threads 2)
cpu=$("$K" "${args[@]}" --backend cpu 2>/dev/null) || { echo "FAIL: --backend cpu failed"; exit 1; }
if out=$("$K" "${args[@]}" --backend cuda 2>/tmp/nogpu.$$); then
  echo "a GPU is usable here: cuda [$out] cpu [$cpu]"
  rm -f /tmp/nogpu.$$
  [ "$out" = "$cpu" ] || { echo "FAIL: the backends disagree"; exit 1; }
  exit 0
fi
err=$(cat /tmp/nogpu.$$); rm -f /tmp/nogpu.$$
echo "--backend cuda: $err"
grep -Eq "no NVIDIA driver|no CUDA device|driver is too old" <<<"$err" || { echo "FAIL: no clear reason"; exit 1; }
auto=$("$K" "${args[@]}" --backend auto 2>/tmp/nogpu.$$) || { echo "FAIL: --backend auto failed"; exit 1; }
err=$(cat /tmp/nogpu.$$); rm -f /tmp/nogpu.$$
echo "--backend auto: $err"
grep -q "using the CPU" <<<"$err" || { echo "FAIL: auto did not say it fell back"; exit 1; }
[ "$auto" = "$cpu" ] || { echo "FAIL: auto [$auto] != cpu [$cpu]"; exit 1; }
echo "ok: refused with a reason, auto fell back to the CPU with the same tokens ($cpu)"
