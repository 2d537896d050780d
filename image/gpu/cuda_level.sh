#!/usr/bin/env bash
# cuda_level.sh DRIVER: what an NVIDIA driver of version DRIVER (e.g. 550.163.01) runs, as
# "CUDA PTX SM": the newest CUDA toolkit version whose code it loads, that toolkit's PTX ISA
# version, and the newest SASS architecture (sm_XY as XY) that toolkit's compilers emit.
# From NVIDIA's release notes: each CUDA 12.x/13.x toolkit names the minimum Linux driver
# it needs (CUDA 12.4: 550.54.14), and each PTX ISA version the CUDA release that brought
# it (ISA 8.4: CUDA 12.4). Exit 1 for a driver older than CUDA 12.0's (kiln's CUDA
# backend needs 12.0, cuda/cu.c) or not a version at all.
set -euo pipefail
d=${1:-}
[[ $d =~ ^([0-9]+)\.([0-9]+)(\.([0-9]+))?$ ]] || { echo "cuda_level.sh: '$d' is not a driver version" >&2; exit 1; }
key=$(printf '%05d%05d%05d' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[4]:-0}")
# minimum driver   CUDA  PTX  SM   (newest first)
best=
while read -r min cuda ptx sm; do
  [[ $min =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]
  mkey=$(printf '%05d%05d%05d' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}")
  if [[ ! $key < $mkey ]]; then best="$cuda $ptx $sm"; break; fi
done <<'TABLE'
580.65.06 13.0 9.0 121
575.51.03 12.9 8.8 121
570.26.0 12.8 8.7 120
560.28.03 12.6 8.5 90
555.42.02 12.5 8.5 90
550.54.14 12.4 8.4 90
545.23.06 12.3 8.3 90
535.54.03 12.2 8.2 90
530.30.02 12.1 8.1 90
525.60.13 12.0 8.0 90
TABLE
[ -n "$best" ] || { echo "cuda_level.sh: driver $d is older than CUDA 12.0's (525.60.13)" >&2; exit 1; }
echo "$best"
