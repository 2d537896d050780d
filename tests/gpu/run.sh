#!/bin/bash
# tests/gpu/run.sh: everything the CUDA backend must prove on a real GPU, in one go
# (under 8 minutes on an H200): build the GPU programs, run the GPU tests (every kernel
# against its CPU reference, the whole model against the CPU backend, batch invariance,
# paged attention over random block tables, 8-bit KV accuracy), then the GPU benchmark,
# then, when a CUDA kilnd is at hand, kilnd itself on the GPU end to end.
#
#   BUILD=build MODEL=models/...gguf OUT=dir [KILND=build/cuda/kilnd] [SHAPES=...] tests/gpu/run.sh
#
# SHAPES (off by default: it adds about a minute per model): "SHAPE:TYPE ..." (e.g.
# "llama-3-8b:Q4_K_M llama-3-8b:Q8_0 qwen2.5-7b:BF16") makes each real-shape model here
# with kiln-shape (`kilnd shape`, this machine's cores; models this size cannot travel
# to it) and runs gpu_bench on it; results in gpu_bench-SHAPE-TYPE.txt. The CUDA
# backend refuses what it does not implement yet (MoE, Gemma, LongRoPE): llama-3-8b,
# llama-3.1-8b (its RoPE factors from the CPU's angle table), qwen3-8b and qwen2.5-7b
# are the 8B-class shapes it runs.
#
# Results go to $OUT: run.log (this script), gpu_test.txt, gpu_bench.txt, kilnd.txt,
# families.txt.
# The build needs the CUDA toolkit and gcc, nothing from the network (gpu-progs has no
# dependency on lwIP, mbedTLS or inih). Exit status: 0 when every test passed.
set -u
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-$BUILD/gpu-out}
KILND=${KILND:-$BUILD/cuda/kilnd}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
fail=0
step() { echo; echo "== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
export PATH=$PATH:/usr/local/cuda/bin
nvcc --version | tail -1

step "build"
make -j"$(nproc)" BUILD="$BUILD" gpu-progs >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "run.sh: build failed"; exit 1; }
tail -3 "$OUT/build.txt"; rm -f "$OUT/build.txt"

step "gpu_test on $MODEL"
timeout 300 "$BUILD/cuda/gpu_test" --model "$MODEL" --out "$OUT/gpu_test.txt" || fail=1

step "gpu_bench on $MODEL"
timeout 240 "$BUILD/cuda/gpu_bench" --model "$MODEL" --out "$OUT/gpu_bench.txt" || fail=1

# kilnd end to end: the engine driving the CUDA backend (greedy tokens identical to the
# CPU backend's with f32 activations, --exact: the GPU computes in f32 too, and the
# default CPU path's 8-bit activations can flip a near tie; the engine's own benchmark
# on the GPU). Needs a CUDA kilnd built where
# the network dependencies are (make cuda); skipped, and said so, when there is none.
step "kilnd on the GPU"
if "$KILND" version >/dev/null 2>&1; then
  {
    for p in "The capital of France is" "def fibonacci(n):" "Le café où j'ai rencontré Hélène"; do
      g=$(timeout 60 "$KILND" generate --backend cuda --model "$MODEL" --prompt "$p" --max-tokens 24 --temperature 0 --ids 2>/dev/null)
      c=$(timeout 60 "$KILND" generate --backend cpu --exact --model "$MODEL" --prompt "$p" --max-tokens 24 --temperature 0 --ids 2>/dev/null)
      if [ -n "$g" ] && [ "$g" = "$c" ]; then echo "PASS generate '$p': cuda = cpu --exact ($g)"
      else echo "FAIL generate '$p': cuda [$g] cpu [$c]"; fail=1; fi
    done
    timeout 60 "$KILND" generate --backend cuda --model "$MODEL" --prompt "x" --max-tokens 4 2>&1 | tail -2
    for c in 1 16 64; do
      timeout 120 "$KILND" bench-engine --backend cuda --model "$MODEL" --requests $((c * 2)) \
        --concurrency $c --max-batch $c --max-batched-tokens 2048 --prompt-tokens 128 --gen-tokens 128 2>&1 | tail -1
    done
  } 2>&1 | tee "$OUT/kilnd.txt"
  grep -q '^FAIL' "$OUT/kilnd.txt" && fail=1
else
  echo "run.sh: no runnable CUDA kilnd at $KILND: the end-to-end part is skipped"
fi

# The families' own math on the GPU, each tiny model's greedy tokens against the CPU's
# --exact: Llama 3.1+ rope_freqs (tiny-llama3), Qwen3's per-head q/k norms and YaRN
# (tiny-qwen3), YaRN with a log multiplier (tiny-mistral3), Qwen2's biases (tiny-qwen2).
# They are made on the build machine (tests/ref/make_tiny_models.py $BUILD/tiny-models,
# which `make test` does) and travel with the tree (the device tool's carry:
# build/tiny-models); skipped, and said so, without them.
step "tiny models of the families on the GPU"
if "$KILND" version >/dev/null 2>&1 && [ -d "$BUILD/tiny-models" ]; then
  for name in tiny-llama3 tiny-qwen3 tiny-mistral3 tiny-qwen2; do
    m=$BUILD/tiny-models/$name.gguf
    [ -f "$m" ] || { echo "run.sh: no $m"; continue; }
    a=(generate --model "$m" --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 16 --temperature 0 --ids)
    g=$(timeout 60 "$KILND" "${a[@]}" --backend cuda 2>"$OUT/$name.err")
    c=$(timeout 60 "$KILND" "${a[@]}" --backend cpu --exact 2>/dev/null)
    if [ -n "$g" ] && [ "$g" = "$c" ]; then echo "PASS $name: cuda = cpu --exact ($g)"
    else echo "FAIL $name: cuda [$g] cpu [$c] $(tail -1 "$OUT/$name.err")"; fi
  done 2>&1 | tee "$OUT/families.txt"
  grep -q '^FAIL' "$OUT/families.txt" && fail=1
else
  echo "run.sh: no CUDA kilnd or no $BUILD/tiny-models: the families' step is skipped"
fi

for st in ${SHAPES:-}; do
  shape=${st%%:*} type=${st#*:} f=$BUILD/gpu-shapes/$shape-$type.gguf
  step "real shape $shape $type"
  mkdir -p "$BUILD/gpu-shapes"
  [ -f "$f" ] || timeout 180 "$BUILD/cuda/kiln-shape" "$shape" "$f" --type "$type" --tokenizer "$MODEL" || {
    echo "run.sh: kiln-shape $shape $type failed"; fail=1; continue; }
  timeout 240 "$BUILD/cuda/gpu_bench" --model "$f" --out "$OUT/gpu_bench-$shape-$type.txt" || fail=1
done

step "done"
[ $fail = 0 ] && echo "run.sh: all GPU checks passed" || echo "run.sh: SOME GPU CHECKS FAILED"
exit $fail
