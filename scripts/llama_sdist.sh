#!/usr/bin/env bash
# llama_sdist.sh: the pinned llama-cpp-python sdist (tests/bench/requirements.txt), which
# carries llama.cpp's source tree, downloaded once from PyPI by name with pip and cached
# in $BUILD/peer/dl. Prints the tarball's path on stdout. Its users: tests/bench/peer.sh
# (builds llama.cpp's tools from it) and tests/ref/vocabs.sh (takes its test vocabularies).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
DL=$BUILD/peer/dl
PIN=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' tests/bench/requirements.txt)
[ -n "$PIN" ] || { echo "llama_sdist: no llama-cpp-python pin in tests/bench/requirements.txt" >&2; exit 1; }
sdist=$DL/llama_cpp_python-$PIN.tar.gz
if ! [ -f "$sdist" ]; then
  scripts/need.sh python3 python3 >&2
  mkdir -p "$DL"
  echo "llama_sdist: downloading the llama-cpp-python==$PIN sdist" >&2
  # pip prepares the sdist's metadata, with its build backend: the one installed when
  # there is one, else in an isolated build environment (not both: each try downloads)
  iso=--no-build-isolation
  python3 -c 'import scikit_build_core' 2>/dev/null || iso=
  python3 -m pip download --disable-pip-version-check --no-deps --no-binary :all: $iso \
    -d "$DL" "llama-cpp-python==$PIN" >&2
  [ -f "$sdist" ] || { echo "llama_sdist: pip did not leave $sdist" >&2; exit 1; }
fi
echo "$sdist"
