#!/usr/bin/env bash
# repro_gpu_test.sh: `make image-gpu` makes the same bytes from the same inputs. image/gpu.sh
# runs once more into a temporary directory (its modules come from the cache under
# BUILD/gpu/modules/: this checks the packing; a build from an empty BUILD/gpu, compile
# included, gave the same bytes too, docs/IMAGE.md): the initramfs must have the sha256 of
# the one make image-gpu made, BUILD/image-gpu/initramfs.cpio.gz. With the CUDA kilnd in
# it: its glibc and libcuda from the cached .debs, the kilnd as built (its fatbin: NVRTC and
# nvFatbin gave the same bytes twice, docs/IMAGE.md).
#   tests/image/repro_gpu_test.sh [BUILD] [MODEL]
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
cd "$(dirname "$0")/../.."
[ -f "$BUILD/image-gpu/initramfs.cpio.gz" ] || { echo "repro_gpu_test: $BUILD/image-gpu/initramfs.cpio.gz is missing (make image-gpu)"; exit 2; }
T=$(mktemp -d /tmp/kiln-repro-gpu.XXXXXX)
trap 'rm -rf "$T"' EXIT
want=$(sha256sum <"$BUILD/image-gpu/initramfs.cpio.gz" | cut -d' ' -f1)
t0=$(date +%s.%N)
# The CUDA kilnd goes in when make image-gpu had one to put in (make cuda-img: nvcc here).
cuda=
[ -x "$BUILD/cuda-img/kilnd" ] && cuda=$BUILD/cuda-img/kilnd
if ! KILN_IMAGE_GPU_DIR="$T/out" BUILD="$BUILD" MODEL="$MODEL" KILND_CUDA="$cuda" image/gpu.sh >"$T/log" 2>&1; then
  echo "FAIL image/gpu.sh:"; tail -n 20 "$T/log"; exit 1
fi
got=$(sha256sum <"$T/out/initramfs.cpio.gz" | cut -d' ' -f1)
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ "$got" = "$want" ]; then echo "ok   the GPU image again: the same sha256 as make image-gpu's (${got:0:16}, $secs s)"
else echo "FAIL the GPU image again: sha256 ${got:0:16}, make image-gpu made ${want:0:16}"; exit 1; fi
