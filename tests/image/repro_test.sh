#!/usr/bin/env bash
# repro_test.sh: `make disk` makes the same bytes from the same inputs (docs/IMAGE.md).
# image/disk.sh runs twice more, each time rebuilding the initramfs, the UKI, the signed
# bundle and the disk image (into temporary files): both disk images must have the sha256
# of the one `make disk` made, BUILD/disk/kiln.img.
#   tests/image/repro_test.sh [BUILD] [MODEL]
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
cd "$(dirname "$0")/../.."
T=$(mktemp -d /tmp/kiln-repro.XXXXXX)
trap 'rm -rf "$T"' EXIT
[ -f "$BUILD/disk/kiln.img" ] || { echo "repro_test: $BUILD/disk/kiln.img is missing (make disk)"; exit 2; }
want=$(sha256sum <"$BUILD/disk/kiln.img" | cut -d' ' -f1)
fail=0
for i in 1 2; do
  t0=$(date +%s.%N)
  if ! KILN_DISK_OUT="$T/kiln-$i.img" BUILD="$BUILD" MODEL="$MODEL" image/disk.sh >"$T/log-$i" 2>&1; then
    echo "FAIL disk.sh run $i:"; tail -n 20 "$T/log-$i"; exit 1
  fi
  got=$(sha256sum <"$T/kiln-$i.img" | cut -d' ' -f1)
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$got" = "$want" ]; then echo "ok   build $i: the same sha256 as make disk's (${got:0:16}, $secs s)"
  else echo "FAIL build $i: sha256 ${got:0:16}, make disk made ${want:0:16}"; fail=1; fi
  rm -f "$T/kiln-$i.img"
done
exit $fail
