#!/usr/bin/env bash
# record_types.sh: what llama.cpp's llama-quantize made of each tensor, from the logs
# tests/shapes/shapes.sh keeps ($BUILD/shapes/SHAPE-FORMAT.quantize.log), into
# tests/shapes/ref/SHAPE-FORMAT.types ("name TYPE dims..." a line, sorted, trailing 1s of
# the dims dropped): the peer's tensors and type mix,
# which `kilnd shape --plan` must give too (tests/shapes/shape_test.sh). Run after
# `make shapes SHAPES=... FORMATS=...`; commits the small files, not the models.
#   BUILD=build tests/shapes/record_types.sh [SHAPE-FORMAT ...]   (default: every log)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in "$BUILD"/shapes/*.quantize.log; do [ -f "$f" ] && names+=("$(basename "$f" .quantize.log)"); done
fi
[ ${#names[@]} -gt 0 ] || { echo "record_types: no logs in $BUILD/shapes (make shapes first)" >&2; exit 2; }
mkdir -p tests/shapes/ref
for n in "${names[@]}"; do
  log=$BUILD/shapes/$n.quantize.log
  # "[  5/ 292]  blk.0.attn_k.weight  - [ 4096, 1024, 1, 1], type = f16, converting to q4_K .."
  # or "... type = f32, size = ..." for a tensor kept as it was
  grep -E '^\[ *[0-9]+/ *[0-9]+\]' "$log" |
    sed -E 's/^\[[^]]*\] *([A-Za-z0-9_.]+) *- *\[([ 0-9,]+)\].*type = *([A-Za-z0-9_]+)(, converting to ([A-Za-z0-9_]+))?.*/\1 \3 \5 | \2/' |
    awk -F' [|] ' '{ split($1, a, " "); t = a[3] != "" ? a[3] : a[2]; n = split($2, d, ", *");
                     while (n > 1 && d[n] + 0 == 1) n--; s = a[1] " " toupper(t);
                     for (i = 1; i <= n; i++) s = s " " (d[i] + 0); print s }' |
    LC_ALL=C sort >"tests/shapes/ref/$n.types.part"
  [ -s "tests/shapes/ref/$n.types.part" ] || { echo "record_types: nothing read from $log" >&2; exit 1; }
  mv "tests/shapes/ref/$n.types.part" "tests/shapes/ref/$n.types"
  echo "record_types: tests/shapes/ref/$n.types ($(wc -l <"tests/shapes/ref/$n.types") tensors)"
done
