#!/usr/bin/env bash
# peer.sh: llama.cpp's own tools, the benchmarks' peer, built once with cmake from the
# llama.cpp source inside the pinned llama-cpp-python sdist (the PyPI package by name,
# scripts/llama_sdist.sh), cached under $BUILD/peer. Prints the bin directory on stdout.
#   $BUILD/peer/bin: llama-bench llama-batched-bench llama-quantize llama-server
#   $BUILD/peer/src: the sdist's llama.cpp (its gguf-py is the shape generator's writer)
# Takes ~25 min on 2 cores the first time; afterwards it only checks the stamp.
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
# PEER_ISA=avx2: the same tools built for AVX2 without AVX-512, into $BUILD/peer-avx2: the
# peer of kiln at KILN_SIMD=avx2, for the CPUs without AVX-512 (EPYC before Zen 4, most
# client parts), measured on an AVX-512 machine.
case ${PEER_ISA:=native} in
native) PEER=$BUILD/peer isa=(-DGGML_NATIVE=ON) ;;
avx2)
  PEER=$BUILD/peer-avx2
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF)
  ;;
*) echo "peer.sh: PEER_ISA=$PEER_ISA: native or avx2" >&2; exit 2 ;;
esac
REQ=tests/bench/requirements.txt
PIN=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$REQ")
TOOLS="llama-bench llama-batched-bench llama-quantize llama-server"
# the recipe's version is in the stamp, so a peer cached by an older recipe is rebuilt
STAMP=$PEER/bin/.built-$PIN-noamx

if [ -f "$STAMP" ]; then echo "$PEER/bin"; exit 0; fi

scripts/need.sh python3 python3 gcc gcc g++ g++ cmake cmake make make >&2
sdist=$(BUILD=$BUILD scripts/llama_sdist.sh)

rm -rf "$PEER/src" "$PEER/x" "$PEER/bin"
mkdir -p "$PEER/x"
tar -xzf "$sdist" -C "$PEER/x"
mv "$PEER/x"/llama_cpp_python-"$PIN"/vendor/llama.cpp "$PEER/src"
rm -rf "$PEER/x"

echo "peer: building $TOOLS (cmake, $PEER_ISA ISA; minutes)" >&2
# Without ggml's AMX backend (its code is compiled only where __AMX_INT8__ is defined,
# which -march=native does on a CPU with AMX): on the Intel build VMs with AMX-INT8 its
# matmul crashes on the first Q4_K_M prompt (SIGSEGV in ggml_backend_amx_mul_mat, the
# open llama.cpp issue #20824), so the peer is llama.cpp's fastest build that runs here:
# native AVX-512 VNNI with its CPU repacking. A no-op on a CPU without AMX.
noamx="-U__AMX_INT8__ -U__AMX_TILE__"
cmake -S "$PEER/src" -B "$PEER/cmake" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
  -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF >&2
# shellcheck disable=SC2086
cmake --build "$PEER/cmake" -j "$(nproc)" --target $TOOLS >&2
mkdir -p "$PEER/bin"
for t in $TOOLS; do cp "$PEER/cmake/bin/$t" "$PEER/bin/"; done
touch "$STAMP"
echo "$PEER/bin"
