#!/usr/bin/env bash
# run.sh: every test kiln has, in one pass, ending with the line
# "N passed, N failed, N skipped" (alone, the last line; CI reads it).
# Called by `make test` (which builds everything first) with BUILD, MODEL and PY set;
# by hand it needs what make test builds for the entries it runs.
#
# T: the entries to run, one or more shell globs separated by spaces, matched against
# each entry's name (unit/test_kv, asan/test_kv, net/serve-host, parity/model, ...):
#   T='unit/*'   T='*kv*'   T='unit/* asan/*'   (unset or empty: every entry)
# A T that matches nothing is an error (exit 2), so a typo never passes.
#
# Each entry passes (exit 0), fails, or is skipped: exit status 77 (the automake
# convention; a unit test's check_done gives it when every check it has was skipped,
# tests/unit/check.h), or an entry whose program this machine cannot have (the CUDA
# kilnd without nvcc). A skip is counted as a skip, never as a pass. An entry that
# passes but printed "SKIP ..." lines (checks it could not make here, e.g. a SIMD level
# the CPU lacks) counts as passed; its SKIP lines are shown under it and it is listed
# as partly skipped at the end.
set -uo pipefail
BUILD=${BUILD:-build} MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PY=${PY:-$BUILD/venv/bin/python}
# test_quant's cross-check vectors (made by the ref/quant-vectors entry)
QUANT_VECTORS=$BUILD/quant_vectors.bin
export MODEL KILN_FUZZ_MODEL=$MODEL QUANT_VECTORS
pass=0 fail=0 skip=0 failed=() skipped=() partly=()
log=$BUILD/test-logs; mkdir -p "$log"
read -ra globs <<<"${T:-}" # read -a: no pathname expansion of the globs
[ ${#globs[@]} -gt 0 ] || globs=('*')

# want NAME: NAME matches one of T's globs.
want() {
  local g
  for g in "${globs[@]}"; do [[ $1 == $g ]] && return 0; done
  return 1
}

# run NAME CMD...: one test, when T wants it; its output goes to a log, shown only when
# it fails (its SKIP lines when it skips checks).
run() { want "$1" || return 0; run_one "$@"; }
run_one() {
  local name=$1; shift
  local t0=$SECONDS out=$log/$name.log rc nskip
  mkdir -p "$(dirname "$out")"
  "$@" >"$out" 2>&1; rc=$?
  nskip=$(grep -c '^SKIP ' "$out")
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1)); printf 'ok   %-32s %3ds' "$name" $((SECONDS - t0))
    if [ "$nskip" -gt 0 ]; then
      partly+=("$name"); printf '  %d skipped\n' "$nskip"
      grep '^SKIP ' "$out" | sed 's/^/     | /'
    else echo; fi
  elif [ $rc -eq 77 ]; then
    skip=$((skip + 1)); skipped+=("$name"); printf 'skip %-32s %3ds\n' "$name" $((SECONDS - t0))
    grep '^SKIP ' "$out" | sed 's/^/     | /'
  else
    fail=$((fail + 1)); failed+=("$name"); printf 'FAIL %-32s %3ds\n' "$name" $((SECONDS - t0))
    tail -n 40 "$out" | sed 's/^/     | /'
  fi
}

# skip_entry NAME WHY: an entry this machine cannot run, when T wants it: counted and said.
skip_entry() {
  want "$1" || return 0
  skip=$((skip + 1)); skipped+=("$1"); printf 'skip %-32s %s\n' "$1" "$2"
}

# Cross-check vectors from the gguf package for test_quant (bit-exact dequant/quantize).
# test_quant fails without them, so they are made whenever T picks a test_quant too.
if want ref/quant-vectors || want unit/test_quant || want asan/test_quant; then
  run_one "ref/quant-vectors" "$PY" tests/ref/quant_vectors.py "$QUANT_VECTORS"
fi

# Unit tests, plain and under ASan+UBSan.
# (one per source file, so a stale binary of a removed test never runs)
for src in tests/unit/test_*.c; do
  t=$(basename "$src" .c); run "unit/$t" "$BUILD/gnu/tests/$t"; done
for src in tests/unit/test_*.c; do
  t=$(basename "$src" .c); run "asan/$t" "$BUILD/asan/tests/$t"; done

# Fuzz targets: replay the kept corpus, then fuzz briefly (bounded in time).
for src in tests/fuzz/fuzz_*.c; do
  n=$(basename "$src" .c); f=$BUILD/fuzz/$n; c=tests/fuzz/corpus/$n
  mkdir -p "$c" "$BUILD/fuzz/work/$n"
  run "fuzz/$n" "$f" -max_total_time="${FUZZ_SECONDS:-20}" -rss_limit_mb=4096 \
    -print_final_stats=1 "$BUILD/fuzz/work/$n" "$c"
done

# The engine end to end: reference parity for the tokenizer and the forward pass.
run "parity/tokenizer" "$PY" tests/ref/tok_parity.py --kilnd "$BUILD/gnu/kilnd" --model "$MODEL" \
  --corpus tests/data/tok_corpus.jsonl
# ... and on the same corpus with Llama 3's, Qwen2's and Qwen3.5's vocabularies (llama.cpp's test
# vocabularies, tests/ref/vocabs.sh below), against their tokenizer.json pre-tokenizers
for v in llama-bpe qwen2 qwen35; do
  run "parity/tokenizer-$v" sh -c 'd=$(BUILD="$1" tests/ref/vocabs.sh "$3") &&
    "$2" tests/ref/tok_parity.py --kilnd "$1/gnu/kilnd" --model "$d/ggml-vocab-$3.gguf" \
      --corpus tests/data/tok_corpus.jsonl' _ "$BUILD" "$PY" "$v"
done
# ... and on llama.cpp's own tokenizer tests for each family's vocabulary (llama-bpe,
# qwen2, qwen35, llama-spm, phi-3, gpt-2, starcoder, refact, gemma-4): every input's ids identical
# and decoded back. The vocabularies come from the pinned llama-cpp-python sdist
# (tests/ref/vocabs.sh: downloaded once into $BUILD/peer/dl, ~25 s; then cached).
run "parity/vocabs" env BUILD="$BUILD" "$PY" tests/ref/vocab_parity.py --kilnd "$BUILD/gnu/kilnd" \
  --fetch tests/ref/vocabs.sh
# core/chat's templates against the models' own Jinja templates (llama.cpp's
# models/templates, same sdist): Qwen3, Gemma, Gemma 4 (and its interleaved one), Phi-3,
# Phi-4, Mistral (v3-tekken; Small 3.2, Devstral and Ministral 3's [SYSTEM_PROMPT] ones),
# Granite 3.x, Llama 3.1-3.3, Qwen2.5 byte for byte over 17 conversations with and without
# the generation prompt; and every other template there kiln claims (--tree).
run "parity/chat-templates" env BUILD="$BUILD" "$PY" tests/ref/chat_parity.py --kilnd "$BUILD/gnu/kilnd" \
  --fetch tests/ref/vocabs.sh --tree
# User and system text cannot write the template's markup: every special token text of
# the vocabulary inside a message stays text (the default model under each template kind,
# Llama 3's, Qwen2's, Phi-3's and Gemma 4's vocabularies under their own).
run "parity/chat-injection" "$PY" tests/ref/chat_injection.py --kilnd "$BUILD/gnu/kilnd" --model "$MODEL"
for vt in llama-bpe:llama3.1,llama3.2 qwen2:qwen2.5,qwen3 phi-3:phi3,phi3-legacy gemma-4:gemma4; do
  run "parity/chat-injection-${vt%%:*}" sh -c 'd=$(BUILD="$1" tests/ref/vocabs.sh "$3") &&
    "$2" tests/ref/chat_injection.py --kilnd "$1/gnu/kilnd" --model "$d/ggml-vocab-$3.gguf" \
      --templates "$4"' _ "$BUILD" "$PY" "${vt%%:*}" "${vt#*:}"
done
# --exact: f32 activations, held to the f32 reference tightly (all 32 ids equal);
# default: the production 8-bit-activation path, within its stated tolerance.
run "parity/model-exact" "$PY" tests/ref/parity.py --kilnd "$BUILD/gnu/kilnd" --model "$MODEL" --exact
run "parity/model" "$PY" tests/ref/parity.py --kilnd "$BUILD/gnu/kilnd" --model "$MODEL"
# Small random models for what the default model does not use: NeoX RoPE, biases, a
# separate output matrix, K-quants, Q4_0/Q5_x, F16/BF16/F32 weights.
# ... and the families' own math: Llama 3.1+ rope_freqs, Qwen3 q/k norms and YaRN,
# Granite's multipliers, mixtures of experts (Qwen3-MoE, Mixtral, Qwen2-MoE with its
# shared expert), Gemma 3 (GeGLU, post-norms, sliding windows, soft-capped logits),
# Gemma 2 (soft-capped attention), Phi-3 (fused tensors, LongRoPE), Ministral 3 (YaRN
# with mscale_all_dim): make_tiny_models' MODELS.
run "parity/tiny-models" "$PY" tests/ref/tiny_parity.py --kilnd "$BUILD/gnu/kilnd" --outdir "$BUILD/tiny-models"
# The loader refuses, by name, any key or tensor it does not implement.
run "parity/strict-load" "$PY" tests/ref/strict_load.py --kilnd "$BUILD/gnu/kilnd"
# The same models against llama.cpp's logits at every prompt position (top-1 outside its
# own near-ties, KL per model), each also as an f32 twin; the references were recorded
# from the peer by tests/ref/record_logits.sh and committed (llama.cpp is not built here).
run "parity/llama-cpp" "$PY" tests/ref/llama_parity.py --kilnd "$BUILD/gnu/kilnd" --outdir "$BUILD/tiny-models"
# test_engine's batch invariance and scheduling beyond the default model's Q4_1: packed
# Q4_K, Q5_K, Q6_K tiles (kquants), tokens grouped per expert (qwen3moe), sliding-window
# layers under chunked prefill and prefix sharing (gemma3: some layers, phi3: all, with
# fused q/k/v and gate/up tensors).
# gemma3-quarters: one global layer of four, so a block behind every window keeps a quarter.
for tiny in llama-kquants:kquants qwen3moe:moe gemma3:gemma3 gemma2:gemma2 phi3:phi3 \
            engine/tiny-gemma3-quarters:gemma3-quarters; do
  name=parity/engine-${tiny#*:} file=$BUILD/tiny-models/${tiny%%:*}.gguf
  case $tiny in engine/*) ;; *) file=$BUILD/tiny-models/tiny-${tiny%%:*}.gguf ;; esac
  if want "$name" && ! [ -f "$file" ]; then "$PY" tests/ref/make_tiny_models.py "$BUILD/tiny-models" >/dev/null; fi
  run "$name" env MODEL="$file" "$BUILD/gnu/tests/test_engine"
done

# The CLI: a sanitized end-to-end generation (text out, and the closing line's token
# count), and clear errors on bad input.
run "cli/asan-generate" tests/cli_generate.sh "$BUILD/asan/kilnd" generate --model "$MODEL" --chat --max-tokens 8 \
  --threads 2 --prompt "Say hi"
run "cli/musl-generate" tests/cli_generate.sh "$BUILD/musl/kilnd" generate --model "$MODEL" --max-tokens 8 \
  --threads 2 --prompt "The three primary colours are"
run "cli/errors" tests/cli_errors.sh "$BUILD/gnu/kilnd" "$MODEL"
# kilnd shape: llama-quantize's type mix (recorded from the peer), files gguf-py reads
run "shapes/kilnd-shape" tests/shapes/shape_test.sh "$BUILD/gnu/kilnd" "$MODEL" "$PY" "$BUILD/asan/kilnd"
# The CUDA kilnd (make cuda; built wherever nvcc is, no GPU needed): without a driver it
# says why, and `auto` falls back to the CPU with the same tokens.
if [ -x "$BUILD/cuda/kilnd" ]; then
  if want cuda/no-gpu-fallback && ! [ -f "$BUILD/tiny-models/tiny-qwen3moe.gguf" ]; then
    "$PY" tests/ref/make_tiny_models.py "$BUILD/tiny-models" >/dev/null
  fi
  run "cuda/no-gpu-fallback" tests/gpu/nogpu.sh "$BUILD/cuda/kilnd" "$MODEL" "$BUILD/tiny-models/tiny-qwen3moe.gguf" \
    "$BUILD/tiny-models/tiny-llama3.gguf" "$BUILD/tiny-models/tiny-qwen3.gguf"
else
  skip_entry "cuda/no-gpu-fallback" "no $BUILD/cuda/kilnd (make cuda: needs nvcc)"
fi
# The GPU image's CUDA kilnd (make cuda-img: kernels by CUDA 12.4's NVRTC for driver 550):
# its fatbin's level agrees with the pinned driver and the build check refuses what would
# not; and it too falls back to the CPU with the same tokens when there is no GPU.
if [ -x "$BUILD/cuda-img/kilnd" ]; then
  run "cuda/fatbin-level" tests/gpu/fatbin_level.sh "$BUILD"
  run "cuda/img-no-gpu-fallback" tests/gpu/nogpu.sh "$BUILD/cuda-img/kilnd" "$MODEL"
else
  skip_entry "cuda/fatbin-level" "no $BUILD/cuda-img/kilnd (make cuda-img: needs nvcc)"
  skip_entry "cuda/img-no-gpu-fallback" "no $BUILD/cuda-img/kilnd (make cuda-img: needs nvcc)"
fi

# The network: the transports alone (an echo server over host sockets, lwIP on a TAP
# device in a namespace, lwIP over AF_PACKET on a veth pair), then `kilnd serve` end to
# end over each: TLS 1.3 clients (Python ssl, openssl s_client), the protocol's verbs
# and limits, /metrics. The appliance's static musl kilnd takes the AF_PACKET run.
run "net/transport-echo" tests/net/echo.sh "$BUILD"
run "net/serve-host" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host all
run "net/serve-tap" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh tap all
run "net/serve-packet-musl" env BUILD="$BUILD" MODEL="$MODEL" KILND="$BUILD/musl/kilnd" \
  tests/net/serve.sh packet basic
# The OpenAI-compatible API on the same TLS port: the official `openai` package (the venv's),
# curl, keep-alive and pipelining on raw sockets, errors by name, a body over the limit, a
# disconnect mid-stream, drain, 503 + Retry-After under a pinned ladder, a slow reader
# (lwIP only); over host sockets, over lwIP on TAP, and under ASan+UBSan.
run "net/openai-host" env BUILD="$BUILD" MODEL="$MODEL" PY="$PY" tests/net/serve.sh host openai
run "net/openai-tap" env BUILD="$BUILD" MODEL="$MODEL" PY="$PY" tests/net/serve.sh tap openai
run "net/openai-asan" env BUILD="$BUILD" MODEL="$MODEL" PY="$PY" KILND="$BUILD/asan/kilnd" \
  tests/net/serve.sh host openai
# A fleet: three kilnd boxes on loopback behind HAProxy (Debian's; installed when missing),
# HTTP mode per request for the OpenAI API and TCP mode for the line protocol, checked on
# /readyz; under the openai package's and kiln bench's load one box is killed, one drained
# (docs/FLEET.md).
run "net/fleet-haproxy" env BUILD="$BUILD" MODEL="$MODEL" PY="$PY" tests/net/fleet_test.sh
# One client trying to take the box from the others (issue 24): an empty-line flood before and
# after HELLO, 300 silent TCP connections, 256 idle greeted sessions, 80 half-sent requests on
# the metrics port, 100,000 pipelined HEALTHs; meanwhile a client's connect + HELLO + 8 tokens
# stays within 2x its unloaded time + 100 ms, /healthz answers every probe, and the loop's
# longest pass stays under 100 ms. Also under ASan+UBSan.
run "net/abuse" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host abuse
run "net/abuse-asan" env BUILD="$BUILD" MODEL="$MODEL" KILND="$BUILD/asan/kilnd" tests/net/serve.sh host abuse
# No allocation on kilnd's loop thread per connection or request (issue 17): under an
# LD_PRELOAD shim counting its mallocs, new TLS line-protocol, keep-alive HTTPS (the OpenAI
# API) and metrics connections after a warm-up add none, over host sockets and over lwIP on
# TAP (gnu build only: ASan's runtime cannot sit behind a preloaded allocator).
run "net/alloc-host" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host alloc
run "net/alloc-tap" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh tap alloc
run "net/serve-mtls" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host mtls
run "net/serve-limits" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host limits
# TLS policy through openssl s_client: X25519, P-256, P-384 only (no FFDHE, no DHE suite),
# and TLS 1.3 KeyUpdates from the client (kiln's mbedTLS patch) taken on the same session,
# each "K" answered by one of kilnd's, logged at debug level. The KeyUpdate check also runs
# in the "all" sets: net/serve-host, net/serve-tap and net/serve-tap-asan (lwIP, ASan).
run "net/serve-tls-policy" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host tls
run "net/serve-hung-step" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host fault
# The degrade ladder: a small KV pool under 32 streams climbs 0 -> 1 -> 2 -> 3 (shed with
# retry_after_ms), every request ends, it walks back to 0; LADDER pinning; drain_timeout_ms.
run "net/serve-ladder" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host ladder
run "net/control-socket" tests/net/ctl_test.sh "$BUILD/gnu/kilnd" "$MODEL"
# The network update verbs (UPDATE, REBOOT; ASan kilnd) on host sockets, a file standing in for the
# inactive slot and this test playing kiln-init on the control socket (the image's own
# end-to-end update is qemu/disk).
run "net/update" python3 tests/net/update_test.py --kilnd "$BUILD/asan/kilnd" --model "$MODEL" --cli "$BUILD/gnu/kiln"
# kiln-init (PID 1) in its host test mode, supervising a fake kilnd: console, restarts,
# heartbeat loss, crash loop and safe mode, bad config, drain and power-off
run "boot/kiln-init" tests/boot/init_test.sh "$BUILD/gnu/kiln-init"
# The real kilnd under kiln-init, made to hang (FAULT drop_step): its clients get 503
# restarting, kilnd exits 75, kiln-init starts it again, readiness and service return.
run "reliability/hang-restart" python3 tests/reliability/hang_restart.py "$BUILD/gnu/kiln-init" \
  "$BUILD/gnu/kilnd" "$MODEL"
# The short reliability soak (RELIABILITY.md): kilnd on lwIP over a TAP device with a
# 12 MiB KV pool (it preempts); 2,000 TLS requests from 32 clients, exactly 10% cancelled,
# 10% disconnected, 5% slow readers, 10% over the OpenAI API (a quarter of those cut
# mid-stream); 0 lost, 0 leaked blocks, both sides' counters equal,
# a clean drain; then a client that stops reading must not stall the others. Killed at 510 s.
run "reliability/soak-short" env BUILD="$BUILD" MODEL="$MODEL" tests/reliability/soak.sh \
  --requests 2000 --clients 32 --max-tokens 8 --slow-max-tokens 16 --prompt-max 12 \
  --kv-pool-mb 12 --time-limit 390 --request-timeout 120 --hard-limit 510 \
  --json "$log/reliability/soak-short.json"
# Signed images: manifests and bundles (ASan+UBSan), kiln-image's commands.
run "image/manifest" "$BUILD/gnu/tests/image_test"
run "image/cli" tests/image/cli_test.sh "$BUILD/gnu/kiln-image"
# make disk's reproducibility: disk.sh twice more from the same inputs, the same sha256
# as the disk image make made (~20 s)
run "image/reproducible" tests/image/repro_test.sh "$BUILD" "$MODEL"
gpu_image_why="no $BUILD/image-gpu (make image-gpu)"
[ "${GPU_IMAGE:-1}" != 0 ] || gpu_image_why="GPU_IMAGE=0: the GPU image is left out"
# make image-gpu's too: image/gpu.sh once more, the same initramfs (~20 s)
if [ "${GPU_IMAGE:-1}" != 0 ] && [ -f "$BUILD/image-gpu/initramfs.cpio.gz" ]; then
  run "image/reproducible-gpu" tests/image/repro_gpu_test.sh "$BUILD" "$MODEL"
else
  skip_entry "image/reproducible-gpu" "$gpu_image_why"
fi
# The appliance: the image boots in QEMU (TCG) to ready; a TLS GEN through the forwarded
# port, served by lwIP on virtio-net in the guest, equals the host's greedy text; the
# serial console; kilnd killed / hung → restarted; a bad config; poweroff → status 0.
run "qemu/boot" python3 tests/qemu/boot_test.py --image-dir "$BUILD/image" \
  --ref-kilnd "$BUILD/gnu/kilnd" --model "$MODEL" --log-dir "$log"
# The GPU image (make image-gpu: the same image plus NVIDIA's open modules built for its
# kernel and the GSP firmware) under TCG, where QEMU has no NVIDIA device: kiln-init tries
# the driver, whose init refuses with ENODEV (symbols resolved, vermagic matched; an unknown
# symbol or version error fails), the console says "no NVIDIA GPU" and that the driver fits,
# and the same GEN is served from the CPU; then an nvidia.ko with a changed vermagic: a clear
# line, the CPU serves (~45 s both; the image itself 3-4.5 min from nothing).
if [ "${GPU_IMAGE:-1}" != 0 ] && [ -f "$BUILD/image-gpu/initramfs.cpio.gz" ]; then
  run "qemu/boot-gpu" python3 tests/qemu/boot_test.py --gpu --image-dir "$BUILD/image-gpu" \
    --ref-kilnd "$BUILD/gnu/kilnd" --model "$MODEL" --log-dir "$log"
else
  skip_entry "qemu/boot-gpu" "$gpu_image_why"
fi
# The A/B disk image under UEFI (OVMF, TCG): tampered bundles refused before writing; v1
# boots to ready and serves; kiln-flash update to v2 boots and is blessed; a v3 that never
# gets healthy is tried twice, then the box is back on v2 and says ROLLBACK. Every boot has a
# TPM 2.0 (swtpm): PCR 15 measured from the slot's manifest, the identity sealed to it (a
# moved disk, a kiln-flashed v3 and a slot that does not verify do not unseal it: safe mode).
run "qemu/disk" python3 tests/qemu/disk_test.py --build "$BUILD" --log-dir "$log"
# The GPU disk (make disk-gpu: make image-gpu's initramfs in the same A/B scheme, cuBLAS on the
# data partition) under OVMF, TCG, no GPU: kiln-init runs the CUDA kilnd, the image's loader
# resolves libcublas.so.12 on /data/lib/cuda, no CUDA device, a GEN from the CPU; a network
# update to a v3 that never becomes healthy, and the rollback to v1 (~4 min).
if [ "${GPU_IMAGE:-1}" != 0 ] && [ -f "$BUILD/disk-gpu/kiln-v3.kimg" ]; then
  run "qemu/disk-gpu" python3 tests/qemu/disk_test.py --gpu --build "$BUILD" --log-dir "$log"
else
  why=$gpu_image_why
  [ "${GPU_IMAGE:-1}" = 0 ] || why="no $BUILD/disk-gpu/kiln-v3.kimg (make disk-gpu-test-inputs: the CUDA kilnd needs nvcc)"
  skip_entry "qemu/disk-gpu" "$why"
fi
# The same disk under UEFI Secure Boot (OVMF's Secure Boot build, the project's PK/KEK/db
# enrolled): it boots to ready and serves, kiln-init says Secure Boot is on; slot a's UKI
# with one flipped byte, signed by another key, or unsigned is refused by the firmware (no
# kiln-init); a changed slot b spends its try and the box falls back to slot a (ROLLBACK);
# kiln-flash refuses a manifest-signed bundle whose UKI db did not sign.
run "qemu/secureboot" python3 tests/qemu/secureboot_test.py --build "$BUILD" --log-dir "$log"
# the client SDKs (libkiln's C API, the kiln CLI, the Python package) against kilnd over
# host sockets and over lwIP
run "sdk/host" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh host sdk
run "sdk/tap" env BUILD="$BUILD" MODEL="$MODEL" tests/net/serve.sh tap sdk
run "sdk/python-unit" python3 -m unittest discover -s sdk/python/tests
# every check again under ASan+UBSan (LeakSanitizer at exit): sessions, TLS and lwIP
run "net/serve-tap-asan" env BUILD="$BUILD" MODEL="$MODEL" KILND="$BUILD/asan/kilnd" \
  tests/net/serve.sh tap all

echo
if [ $((pass + fail + skip)) -eq 0 ]; then
  echo "run.sh: T='${T:-}' matches no test" >&2
  exit 2
fi
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
[ ${#skipped[@]} -gt 0 ] && echo "skipped: ${skipped[*]}"
[ ${#partly[@]} -gt 0 ] && echo "partly skipped (passed; their SKIP lines are above): ${partly[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
