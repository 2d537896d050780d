#!/bin/bash
# nogpu.sh CUDA_KILND MODEL: the CUDA kilnd on a machine without a GPU (CI): asked for
# cuda it refuses with the reason; with `auto` it says why it uses the CPU and gives the
# CPU's tokens. On a machine that does have a GPU, cuda and cpu must agree instead.
set -u
K=$1 M=$2
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
