#!/bin/bash
# fatbin_level.sh BUILD: the GPU image's kernels are of a level its driver loads (no GPU
# needed). The level comes from the pinned driver (image/gpu/driver.env through
# image/gpu/cuda_level.sh); the fatbin scripts/cuda_fatbin.py made holds PTX of that ISA
# or older only, the image's CUDA kilnd embeds exactly that fatbin, and the build check
# refuses PTX or SASS above the level.
set -u
B=$1
F=$B/cuda-img/kernels.fatbin K=$B/cuda-img/kilnd W=$B/cuda-img/wheels
fail() { echo "FAIL: $*"; exit 1; }
drv=$(sed -n 's/^NVIDIA_DRIVER=//p' image/gpu/driver.env)
read -r cuda ptx sm < <(image/gpu/cuda_level.sh "$drv") || fail "no CUDA level for driver $drv"
echo "driver $drv: CUDA $cuda, PTX ISA <= $ptx, SASS <= sm_$sm"
[ "$drv" != 550.163.01 ] || [ "$cuda $ptx $sm" = "12.4 8.4 90" ] || fail "550.163.01 should run CUDA 12.4 (PTX 8.4, sm_90), got $cuda $ptx $sm"
image/gpu/cuda_level.sh 470.256.02 >/dev/null 2>&1 && fail "cuda_level.sh gave a level to a pre-CUDA-12 driver"
python3 - "$F" "$K" "$ptx" <<'PY' || exit 1
import re, sys
fat = open(sys.argv[1], "rb").read()
kilnd = open(sys.argv[2], "rb").read()
mx = tuple(int(x) for x in sys.argv[3].split("."))
vs = [(int(a), int(b)) for a, b in re.findall(rb"^\s*\.version\s+(\d+)\.(\d+)\s*$", fat, re.M)]
if not vs: sys.exit("FAIL: no PTX .version in the fatbin")
bad = [v for v in vs if v > mx]
if bad: sys.exit(f"FAIL: PTX ISA {bad} above {mx}")
if fat[:4] != bytes.fromhex("50ed55ba"): sys.exit("FAIL: not a fatbin (magic)")
if fat not in kilnd: sys.exit("FAIL: the image's CUDA kilnd does not embed this fatbin")
print(f"fatbin: {len(fat)} bytes, PTX ISA {sorted(set(vs))}, embedded in {sys.argv[2]}")
PY
# The build check refuses what the driver would not load (PTX first: one cheap compile).
out=$(python3 scripts/cuda_fatbin.py --wheels "$W" --src cuda/kernels.cu -I . --sass 80 --ptx 90 \
      --cuda "$cuda" --max-ptx 8.3 --max-sm "$sm" -o "$B/cuda-img/refused.fatbin" 2>&1)
rc=$?
[ $rc = 1 ] && grep -q "the driver reads 8.3 at most" <<<"$out" || fail "PTX above the level was not refused (rc $rc: $out)"
[ ! -e "$B/cuda-img/refused.fatbin" ] || fail "a refused fatbin was written"
out=$(python3 scripts/cuda_fatbin.py --wheels "$W" --src cuda/kernels.cu -I . --sass 100 --ptx 90 \
      --cuda "$cuda" --max-ptx "$ptx" --max-sm "$sm" -o "$B/cuda-img/refused.fatbin" 2>&1)
rc=$?
[ $rc = 1 ] && grep -q "SASS sm_100 is newer than the driver runs" <<<"$out" || fail "sm_100 SASS was not refused (rc $rc: $out)"
out=$(python3 scripts/cuda_fatbin.py --wheels "$W" --src cuda/kernels.cu -I . --sass 80 --ptx 90 \
      --cuda 12.8 --max-ptx "$ptx" --max-sm "$sm" -o "$B/cuda-img/refused.fatbin" 2>&1)
rc=$?
[ $rc = 1 ] && grep -q "NVRTC is (12, 4), not CUDA (12, 8)" <<<"$out" || fail "a compiler of another CUDA was not refused (rc $rc: $out)"
echo "ok: kernels at CUDA $cuda's level; PTX above $ptx, SASS above sm_$sm and another compiler version refused"
