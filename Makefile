# kiln: build, test and run. `make run` and `make test` work on a fresh Debian machine:
# they install what is missing (apt packages, PyPI wheels into build/venv) and build all.
SHELL := /bin/bash
.DEFAULT_GOAL := all
.DELETE_ON_ERROR:
.SECONDARY:

BUILD   ?= build
MODEL   ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
THREADS ?= $(shell nproc)

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -I. -pthread -MMD -MP
OPT         ?= -O2 -g
AVX2_FLAGS  := -mavx2 -mfma -mf16c
AVX512_FLAGS := $(AVX2_FLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni
# Files named *_avx2.c / *_avx512.c hold SIMD paths chosen at run time; only they get
# the ISA flags, so the rest of the binary runs on any x86-64.
simdflags = $(if $(findstring _avx512,$(1)),$(AVX512_FLAGS),$(if $(findstring _avx2,$(1)),$(AVX2_FLAGS)))

# core/backend_cuda.c needs cuda.h and cuda/: only the CUDA kilnd has it (see `make cuda`).
CUDA_GLUE := core/backend_cuda.c
LIB_SRCS  := $(sort $(filter-out $(CUDA_GLUE),$(wildcard core/*.c core/cpu/*.c mm/*.c sched/*.c net/*.c)))
# The kilnd program (kilnd/: main and its subcommands) on top of the library.
KILND_SRCS := $(sort $(wildcard kilnd/*.c))
TEST_SRCS := $(sort $(wildcard tests/unit/test_*.c))
FUZZ_SRCS := $(sort $(wildcard tests/fuzz/fuzz_*.c))
# Test programs that are not unit tests (e.g. the transport echo server of tests/net/).
TOOL_SRCS := $(sort $(wildcard tests/net/*.c))
# The dependency libraries (scripts/deps.sh), in link order; static, so a program
# takes only what it uses.
DEP_LIBS  := -lmbedtls -lmbedx509 -lmbedcrypto -llwip -linih -lyyjson

# ---------------------------------------------------------------- one build variant
# $(1) variant dir, $(2) compiler, $(3) extra cflags, $(4) extra ldflags, $(5) deps toolchain
# (the libraries built by `make deps`: inih, lwIP, mbedTLS, per toolchain)
define variant
$(1)_OBJS := $$(patsubst %.c,$(BUILD)/$(1)/obj/%.o,$$(LIB_SRCS))
$(1)_KILND_OBJS := $$(patsubst %.c,$(BUILD)/$(1)/obj/%.o,$$(KILND_SRCS))
$(1)_DEPS := $(BUILD)/$(5)/deps
$(BUILD)/$(1)/obj/%.o: %.c | $(BUILD)/$(5)/deps/.ok
	@mkdir -p $$(@D)
	$(2) $$(CFLAGS_BASE) -I$(BUILD)/$(5)/deps/include $(3) $$(call simdflags,$$<) -c $$< -o $$@
$(BUILD)/$(1)/libkilnd.a: $$($(1)_OBJS)
	@rm -f $$@
	ar rcs $$@ $$^
$(BUILD)/$(1)/kilnd: $$($(1)_KILND_OBJS) $(BUILD)/$(1)/libkilnd.a
	$(2) $(3) $$^ -o $$@ -L$(BUILD)/$(5)/deps/lib $$(DEP_LIBS) -lm -pthread $(4)
$(BUILD)/$(1)/tests/net/%: $(BUILD)/$(1)/obj/tests/net/%.o $(BUILD)/$(1)/libkilnd.a
	@mkdir -p $$(@D)
	$(2) $(3) $$^ -o $$@ -L$(BUILD)/$(5)/deps/lib $$(DEP_LIBS) -lm -pthread $(4)
$(BUILD)/$(1)/tests/%: $(BUILD)/$(1)/obj/tests/unit/%.o $(BUILD)/$(1)/libkilnd.a
	@mkdir -p $$(@D)
	$(2) $(3) $$^ -o $$@ -L$(BUILD)/$(5)/deps/lib $$(DEP_LIBS) -lm -pthread $(4)
$(1)_TESTS := $$(patsubst tests/unit/%.c,$(BUILD)/$(1)/tests/%,$$(TEST_SRCS))
$(1)_TOOLS := $$(patsubst tests/net/%.c,$(BUILD)/$(1)/tests/net/%,$$(TOOL_SRCS))
-include $$(shell find $(BUILD)/$(1)/obj -name '*.d' 2>/dev/null)
endef

SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
$(eval $(call variant,gnu,gcc,$(OPT),,gnu))
$(eval $(call variant,asan,gcc,-O1 -g $(SAN),$(SAN),gnu))
$(eval $(call variant,musl,musl-gcc,$(OPT) -Ibuild/musl/include,-static,musl))

# The dependency libraries, built once per toolchain (scripts/deps.sh is cached; it
# rebuilds lwIP when its configuration changes, mbedTLS when our patches to it do).
$(BUILD)/gnu/deps/.ok $(BUILD)/musl/deps/.ok: scripts/deps.sh scripts/deps/lwip/lwipopts.h scripts/deps/lwip/arch/cc.h \
    $(wildcard scripts/deps/mbedtls/*.patch)
	BUILD=$(BUILD) scripts/deps.sh
	@touch $(BUILD)/gnu/deps/.ok $(BUILD)/musl/deps/.ok

KILND := $(BUILD)/gnu/kilnd

.PHONY: cuda gpu-progs test-gpu
.PHONY: all kilnd musl tools model deps venv test test-unit fuzz bench bench-kernels shapes run clean distclean sdk sdk-musl kiln-init image qemu test-qemu soak soak-heavy
all: $(KILND) $(gnu_TESTS) $(gnu_TOOLS) sdk
kilnd: $(KILND)

# The image's kilnd: static musl. musl-gcc cannot see <linux/*.h>; give it the uapi headers.
musl: tools-musl
	$(MAKE) $(BUILD)/musl/kilnd $(BUILD)/musl/sdk/libkiln.a $(BUILD)/musl/kiln $(BUILD)/musl/kiln-init
tools-musl:
	@scripts/need.sh musl-gcc musl-tools
	@mkdir -p build/musl/include
	@for d in linux asm asm-generic; do \
	  src=/usr/include/$$d; [ -d $$src ] || src=/usr/include/x86_64-linux-gnu/$$d; \
	  ln -sfn $$src build/musl/include/$$d; done

tools:
	@scripts/need.sh gcc gcc make make python3 python3 clang clang
	@# the network tests: namespaces, TAP and veth devices, TLS and HTTP clients
	@scripts/need.sh ip iproute2 ping iputils-ping openssl openssl curl curl sysctl procps
	@# a TPM 2.0 for test_tpm and the disk's QEMU test (kiln-init measures the running slot)
	@scripts/need.sh swtpm swtpm

# ---------------------------------------------------------------- the CUDA backend (cuda/)
# A glibc kilnd with the CUDA backend: the driver and cuBLAS are dlopen'ed at run time,
# so it builds on any machine with the toolkit (nvcc, cuda.h) and no GPU. The kernels are
# one fatbin (SASS for each listed architecture plus PTX for later ones) embedded with
# .incbin. cuda/ (driver, kernels, launches, cuBLAS) is a leaf; the backend glue on top of
# it, core/backend_cuda.c, is compiled here with cuda.h. They are linked as objects, ahead
# of libkilnd.a, so they replace core/backend_nocuda.o (the stubs every other kilnd gets).
# core/cuda_plan.c, free of CUDA, is in libkilnd.a like the rest of core/.
# gpu-progs (tests/gpu/) needs no network dependency: tests/gpu/run.sh builds it on the
# GPU machine, which has the toolkit but no registry to fetch from.
NVCC      ?= $(or $(shell command -v nvcc 2>/dev/null),/usr/local/cuda/bin/nvcc)
CUDA_INC  ?= $(patsubst %/bin/nvcc,%/include,$(NVCC))
CUDA_ARCH := $(foreach a,80 86 89 90 90a,-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_90,code=compute_90
CUDA_SRCS := cuda/cu.c cuda/kern.c cuda/blas.c $(CUDA_GLUE)
CUDA_OBJS := $(patsubst %.c,$(BUILD)/cuda/obj/%.o,$(CUDA_SRCS)) $(BUILD)/cuda/obj/fatbin.o
# What the GPU programs take from the engine: no network, no config parser (no deps).
CORE_SRCS := $(sort $(filter-out core/config.c $(CUDA_GLUE),$(wildcard core/*.c core/cpu/*.c mm/*.c)))
CORE_OBJS := $(patsubst %.c,$(BUILD)/cuda/obj/%.o,$(CORE_SRCS))
GPU_PROGS := $(BUILD)/cuda/gpu_test $(BUILD)/cuda/gpu_bench $(BUILD)/cuda/kiln-shape
# kernels.cu takes the type numbers from core/cpu/qtypes.h, the CPU side's definition.
$(BUILD)/cuda/kernels.fatbin: cuda/kernels.cu core/cpu/qtypes.h
	@mkdir -p $(@D)
	$(NVCC) -O3 -t 0 -fatbin -I. $(CUDA_ARCH) $< -o $@
$(BUILD)/cuda/obj/fatbin.o: cuda/fatbin.S $(BUILD)/cuda/kernels.fatbin
	@mkdir -p $(@D)
	gcc -c -DFATBIN='"$(BUILD)/cuda/kernels.fatbin"' $< -o $@
$(BUILD)/cuda/obj/%.o: %.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_BASE) -I$(CUDA_INC) $(OPT) $(call simdflags,$<) -c $< -o $@
$(BUILD)/cuda/libcore.a: $(CORE_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/cuda/kilnd: $(gnu_KILND_OBJS) $(CUDA_OBJS) $(BUILD)/gnu/libkilnd.a
	gcc $(OPT) $^ -o $@ -L$(BUILD)/gnu/deps/lib $(DEP_LIBS) -ldl -lm -pthread
$(BUILD)/cuda/gpu_%: $(BUILD)/cuda/obj/tests/gpu/gpu_%.o $(CUDA_OBJS) $(BUILD)/cuda/libcore.a
	gcc $(OPT) $^ -o $@ -ldl -lm -pthread
# `kilnd shape` alone (core/ only): real-shape models made on the GPU machine itself
$(BUILD)/cuda/kiln-shape: $(BUILD)/cuda/obj/tests/gpu/kiln_shape.o $(BUILD)/cuda/obj/kilnd/shape.o $(BUILD)/cuda/libcore.a
	gcc $(OPT) $^ -o $@ -lm -pthread
-include $(shell find $(BUILD)/cuda/obj -name '*.d' 2>/dev/null)
cuda: $(BUILD)/cuda/kilnd $(GPU_PROGS)

# The GPU image's CUDA kilnd ($(BUILD)/cuda-img/kilnd): the objects above with the kernels
# built for the image's driver instead. The driver (image/gpu/driver.env) fixes the CUDA level
# (image/gpu/cuda_level.sh: 550 -> CUDA 12.4, PTX ISA 8.4, SASS up to sm_90); the kernels are
# compiled by that CUDA's NVRTC and packed by its nvFatbin (PyPI wheels, pinned in
# image/gpu/cuda-wheels.txt, installed here by pip when missing), and scripts/cuda_fatbin.py
# fails the build when the fatbin's PTX or SASS is above that level. sm_90a is left out:
# its SASS runs on sm_90 only and 90a code is not portable to later chips, so the compute_90
# PTX covers what comes after Hopper.
GPU_DRIVER    := $(shell sed -n 's/^NVIDIA_DRIVER=//p' image/gpu/driver.env)
GPU_LEVEL     := $(shell image/gpu/cuda_level.sh $(GPU_DRIVER))
GPU_SASS      := 80,86,89,90
GPU_PTX       := 90
CUDA_IMG      := $(BUILD)/cuda-img
$(CUDA_IMG)/wheels/.ok: image/gpu/cuda-wheels.txt | $(BUILD)/venv/.ok
	rm -rf $(@D) && mkdir -p $(@D)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
	  --only-binary :all: --target $(@D) -r $<
	@touch $@
$(CUDA_IMG)/kernels.fatbin: cuda/kernels.cu core/cpu/qtypes.h scripts/cuda_fatbin.py image/gpu/driver.env \
    image/gpu/cuda_level.sh $(CUDA_IMG)/wheels/.ok
	@test -n "$(GPU_LEVEL)" || { echo "no CUDA level for driver '$(GPU_DRIVER)' (image/gpu/driver.env)"; exit 1; }
	python3 scripts/cuda_fatbin.py --wheels $(CUDA_IMG)/wheels --src $< -I . --sass $(GPU_SASS) --ptx $(GPU_PTX) \
	  --cuda $(word 1,$(GPU_LEVEL)) --max-ptx $(word 2,$(GPU_LEVEL)) --max-sm $(word 3,$(GPU_LEVEL)) -o $@
$(CUDA_IMG)/fatbin.o: cuda/fatbin.S $(CUDA_IMG)/kernels.fatbin
	gcc -c -DFATBIN='"$(CUDA_IMG)/kernels.fatbin"' $< -o $@
$(CUDA_IMG)/kilnd: $(gnu_KILND_OBJS) $(filter-out $(BUILD)/cuda/obj/fatbin.o,$(CUDA_OBJS)) $(CUDA_IMG)/fatbin.o $(BUILD)/gnu/libkilnd.a
	gcc $(OPT) $^ -o $@ -L$(BUILD)/gnu/deps/lib $(DEP_LIBS) -ldl -lm -pthread
cuda-img: $(CUDA_IMG)/kilnd
.PHONY: cuda-img
gpu-progs: $(GPU_PROGS)
# On a machine with a GPU (the device tool): tests/gpu/run.sh builds, tests, benchmarks.
test-gpu: model
	BUILD=$(BUILD) MODEL=$(MODEL) tests/gpu/run.sh

# ---------------------------------------------------------------- the client SDK (sdk/)
# libkiln (sdk/c/kiln.h; sources sdk/c/lib/*.c plus the protocol's splitter, shared with
# the server) as a static and a shared library, and the `kiln` CLI (sdk/c/cli/*.c) on it.
# Only the kiln_* API is exported from the shared library; mbedTLS is linked inside it.
SDK_SRCS := $(sort $(wildcard sdk/c/lib/*.c)) net/proto.c
CLI_SRCS := $(sort $(wildcard sdk/c/cli/*.c))
SDK_CFLAGS := -fPIC -fvisibility=hidden
define sdk_variant
$(1)_SDK_OBJS := $$(patsubst %.c,$(BUILD)/$(1)/sdk/obj/%.o,$$(SDK_SRCS))
$(1)_CLI_OBJS := $$(patsubst %.c,$(BUILD)/$(1)/sdk/obj/%.o,$$(CLI_SRCS))
$(BUILD)/$(1)/sdk/obj/%.o: %.c | $(BUILD)/$(1)/deps/.ok
	@mkdir -p $$(@D)
	$(2) $$(CFLAGS_BASE) -I$(BUILD)/$(1)/deps/include -Isdk/c $(3) $$(SDK_CFLAGS) -c $$< -o $$@
$(BUILD)/$(1)/sdk/libkiln.a: $$($(1)_SDK_OBJS)
	@rm -f $$@
	ar rcs $$@ $$^
$(BUILD)/$(1)/kiln: $$($(1)_CLI_OBJS) $(BUILD)/$(1)/sdk/libkiln.a
	$(2) $(3) $$^ -o $$@ -L$(BUILD)/$(1)/deps/lib -lmbedtls -lmbedx509 -lmbedcrypto -lm -pthread $(4)
-include $$(shell find $(BUILD)/$(1)/sdk/obj -name '*.d' 2>/dev/null)
endef
$(eval $(call sdk_variant,gnu,gcc,$(OPT),))
$(eval $(call sdk_variant,musl,musl-gcc,$(OPT) -Ibuild/musl/include,-static))
$(BUILD)/gnu/sdk/libkiln.so: $(gnu_SDK_OBJS)
	gcc -shared -Wl,-soname,libkiln.so.1 -Wl,--exclude-libs,ALL $^ -o $@ \
	  -L$(BUILD)/gnu/deps/lib -lmbedtls -lmbedx509 -lmbedcrypto -pthread
	ln -sfn libkiln.so $(@D)/libkiln.so.1
# The C API's acceptance test (tests/net/serve.sh ... sdk runs it against a server).
$(BUILD)/gnu/tests/sdk_test: tests/sdk/sdk_test.c $(BUILD)/gnu/sdk/libkiln.a
	@mkdir -p $(@D)
	gcc $(CFLAGS_BASE) -Isdk/c -I$(BUILD)/gnu/deps/include $(OPT) $^ -o $@ \
	  -L$(BUILD)/gnu/deps/lib -lmbedtls -lmbedx509 -lmbedcrypto -lm -pthread
SDK_GNU := $(BUILD)/gnu/sdk/libkiln.a $(BUILD)/gnu/sdk/libkiln.so $(BUILD)/gnu/kiln \
           $(BUILD)/gnu/tests/sdk_test
sdk: $(SDK_GNU)
sdk-musl: tools-musl
	$(MAKE) $(BUILD)/musl/sdk/libkiln.a $(BUILD)/musl/kiln

# ---------------------------------------------------------------- kiln-init (boot/): PID 1
# Static musl for the image; a sanitized glibc build for its host test (tests/boot/).
# Built in one step from its few files, image/'s manifest and bundle code (console `slot`
# verifies a slot before booting it), libmbedcrypto and libinih (kiln.ini, read as kilnd
# reads it), with the public key of $(BUILD)/keys/pubkey.h (see the image section below).
# Unused code is dropped (--gc-sections): mbedcrypto adds ~100 KB.
IMG_SRCS   := image/manifest.c image/bundle.c
IMG_HDRS   := image/manifest.h image/bundle.h image/img_err.h
# Authenticode (a UKI signed for Secure Boot by the db key): kiln-init checks an update's UKI.
AC_SRCS    := image/authenticode.c image/authenticode.h image/img_err.h
BOOT_SRCS  := $(sort $(wildcard boot/*.c))
BOOT_DEPS  := $(BOOT_SRCS) $(wildcard boot/*.h) $(IMG_SRCS) $(IMG_HDRS) $(AC_SRCS) $(BUILD)/keys/pubkey.h $(BUILD)/keys/sbcert.h
BOOT_FLAGS := $(filter-out -pthread -MMD -MP,$(CFLAGS_BASE))
BOOT_GC    := -ffunction-sections -fdata-sections -Wl,--gc-sections
$(BUILD)/musl/kiln-init: $(BOOT_DEPS) | tools-musl $(BUILD)/musl/deps/.ok
	@mkdir -p $(@D)
	musl-gcc $(BOOT_FLAGS) $(OPT) $(BOOT_GC) -Ibuild/musl/include -I$(BUILD)/musl/deps/include -I$(BUILD)/keys -static \
	  $(BOOT_SRCS) $(IMG_SRCS) image/authenticode.c -o $@ -L$(BUILD)/musl/deps/lib -lmbedx509 -lmbedcrypto -linih
$(BUILD)/gnu/kiln-init: $(BOOT_DEPS) | $(BUILD)/gnu/deps/.ok
	@mkdir -p $(@D)
	gcc $(BOOT_FLAGS) -O1 -g $(SAN) -I$(BUILD)/gnu/deps/include -I$(BUILD)/keys $(BOOT_SRCS) $(IMG_SRCS) image/authenticode.c -o $@ \
	  -L$(BUILD)/gnu/deps/lib -lmbedx509 -lmbedcrypto -linih
# When a slot on trial is blessed (boot/disk.c's disk_tick); tests/boot/init_test.sh runs it.
$(BUILD)/gnu/tests/disk_tick_test: tests/boot/disk_tick_test.c $(BOOT_DEPS) | $(BUILD)/gnu/deps/.ok
	@mkdir -p $(@D)
	gcc $(BOOT_FLAGS) -O1 -g $(SAN) -I$(BUILD)/gnu/deps/include -I$(BUILD)/keys $< boot/util.c boot/logring.c $(IMG_SRCS) image/authenticode.c \
	  -o $@ -L$(BUILD)/gnu/deps/lib -lmbedx509 -lmbedcrypto
# How a provisioned identity's plaintext is destroyed (boot/identity.c id_wipe_dir); init_test.sh runs it.
$(BUILD)/gnu/tests/identity_test: tests/boot/identity_test.c $(BOOT_DEPS) | $(BUILD)/gnu/deps/.ok
	@mkdir -p $(@D)
	gcc $(BOOT_FLAGS) -O1 -g $(SAN) -I$(BUILD)/gnu/deps/include -I$(BUILD)/keys $< boot/tpm.c boot/ini.c boot/disk.c boot/util.c \
	  boot/logring.c $(IMG_SRCS) image/authenticode.c -o $@ -L$(BUILD)/gnu/deps/lib -lmbedx509 -lmbedcrypto -linih
kiln-init: $(BUILD)/musl/kiln-init

# ---------------------------------------------------------------- the appliance image, QEMU
# image/build.sh: Debian's kernel (apt-get download, unpacked, never installed), the
# modules virtio-net and the watchdog need, kiln-init, the static kilnd, config,
# certificates and the model in a reproducible initramfs under build/image/.
image: musl model $(BUILD)/musl/kiln-init
	BUILD=$(BUILD) MODEL=$(MODEL) image/build.sh
# image/gpu.sh: the same image plus NVIDIA's open kernel modules built for its kernel (from
# Debian's nvidia-open-kernel-source) and the GSP firmware, under build/image-gpu/.
# With the CUDA toolkit's headers here (nvcc), the image also carries the glibc CUDA kilnd
# of `make cuda-img`, libcuda of the same driver and the glibc it needs (docs/IMAGE.md).
HAVE_NVCC := $(if $(wildcard $(NVCC)),1)
image-gpu: image $(if $(HAVE_NVCC),$(CUDA_IMG)/kilnd)
	BUILD=$(BUILD) MODEL=$(MODEL) $(if $(HAVE_NVCC),KILND_CUDA=$(CUDA_IMG)/kilnd) image/gpu.sh
qemu: image
	qemu/run.sh
test-qemu: image $(KILND)
	python3 tests/qemu/boot_test.py

# ---------------------------------------------------------------- signed images, the disk (image/)
# kiln-image (keys, signed slot bundles) and kiln-flash (writes a disk or a slot, boot
# counting) are host programs on libmbedcrypto. The signing key is made on first use under
# $(BUILD)/keys (never committed); its public half is compiled into kiln-flash (and
# kiln-init) through $(BUILD)/keys/pubkey.h, rewritten only when the key changes.
# docs/IMAGE.md has the formats.
KILN_KEY ?= $(BUILD)/keys/signing.key
KILN_PUB := $(BUILD)/keys/signing.pub
# UEFI Secure Boot (image/secureboot.sh): PK, KEK and db, made on first use under
# $(BUILD)/keys/secureboot (or the operator's KILN_SB_KEYS); disk.sh signs systemd-boot and
# every UKI with db, and kiln-flash is built with db.crt (sbcert.h) to refuse a UKI it did
# not sign.
KILN_SB_KEYS ?= $(BUILD)/keys/secureboot
$(KILN_SB_KEYS)/db.crt:
	BUILD=$(BUILD) image/secureboot.sh keys $(KILN_SB_KEYS)
# Rewritten only when the certificate changes (another KILN_SB_KEYS too): what includes it
# rebuilds only then.
$(BUILD)/keys/sbcert.h: $(KILN_SB_KEYS)/db.crt FORCE
	@mkdir -p $(@D)
	@{ echo '/* the Secure Boot db certificate (image/secureboot.sh; generated by make) */'; \
	  echo '#define IMG_SB_DB_CERT \'; sed 's/.*/    "&\\n" \\/' $<; echo '    ""'; } >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(BUILD)/gnu/kiln-image: image/kiln_image.c $(IMG_SRCS) $(IMG_HDRS) $(AC_SRCS) | $(BUILD)/gnu/deps/.ok
	@mkdir -p $(@D)
	gcc $(BOOT_FLAGS) $(OPT) -I$(BUILD)/gnu/deps/include image/kiln_image.c $(IMG_SRCS) image/authenticode.c -o $@ \
	  -L$(BUILD)/gnu/deps/lib -lmbedx509 -lmbedcrypto
$(BUILD)/keys/pubkey.h: $(BUILD)/gnu/kiln-image FORCE
	@mkdir -p $(@D)
	@$(BUILD)/gnu/kiln-image keygen --if-missing --key $(KILN_KEY) --pub $(KILN_PUB)
	@$(BUILD)/gnu/kiln-image pubkey-c --pub $(KILN_PUB) --out $@
$(BUILD)/gnu/tests/image_test: tests/image/image_test.c $(IMG_SRCS) $(IMG_HDRS) | $(BUILD)/gnu/deps/.ok
	@mkdir -p $(@D)
	gcc $(BOOT_FLAGS) -O1 -g $(SAN) -I$(BUILD)/gnu/deps/include tests/image/image_test.c $(IMG_SRCS) -o $@ -L$(BUILD)/gnu/deps/lib -lmbedcrypto
$(BUILD)/gnu/kiln-flash: image/kiln_flash.c $(IMG_SRCS) $(IMG_HDRS) $(BUILD)/keys/pubkey.h $(BUILD)/keys/sbcert.h | $(BUILD)/gnu/deps/.ok
	gcc $(BOOT_FLAGS) $(OPT) -I$(BUILD)/gnu/deps/include -I$(BUILD)/keys image/kiln_flash.c $(IMG_SRCS) -o $@ -L$(BUILD)/gnu/deps/lib -lmbedx509 -lmbedcrypto
IMG_TOOLS := $(BUILD)/gnu/kiln-image $(BUILD)/gnu/tests/image_test $(BUILD)/gnu/kiln-flash \
             $(BUILD)/gnu/tests/disk_tick_test $(BUILD)/gnu/tests/identity_test
image-tools: $(IMG_TOOLS)
# image/disk.sh: the GPT disk image build/disk/kiln.img (ESP with systemd-boot and slot A's
# UKI, slots A and B, the data partition) and the signed bundle build/disk/kiln-v1.kimg.
# KILN_VERSION=N picks the version; KILN_BUNDLE_ONLY=1 makes only the bundle (an update).
# Neither carries an identity (TLS key, tokens); the test disk build/disk/kiln-dev.img is
# kiln.img installed by kiln-flash with the development identity (build/image's) on its
# data partition, as an operator installs theirs (docs/IMAGE.md).
# $(1): a disk's folder; its kiln.img installed as kiln-dev.img with the development identity.
define dev_disk
	rm -rf $(1)/dev-identity $(1)/kiln-dev.img && mkdir -m 700 $(1)/dev-identity
	cp $(BUILD)/image/tls/server.key $(BUILD)/image/tls/server.crt $(BUILD)/image/tokens.txt $(1)/dev-identity/
	$(BUILD)/gnu/kiln-flash install $(1)/kiln.img $(1)/kiln-dev.img --identity $(1)/dev-identity
endef
disk: musl model $(BUILD)/musl/kiln-init $(IMG_TOOLS) $(BUILD)/keys/pubkey.h
	BUILD=$(BUILD) MODEL=$(MODEL) KILN_KEY=$(KILN_KEY) KILN_SB_KEYS=$(KILN_SB_KEYS) image/disk.sh
	$(call dev_disk,$(BUILD)/disk)
# The GPU disk (image/disk.sh with KILN_DISK_GPU=1) under $(BUILD)/disk-gpu/, the same names:
# make image-gpu's initramfs (it needs the CUDA kilnd: nvcc here) with cuBLAS on the data
# partition (/data/lib/cuda), larger partitions (docs/IMAGE.md).
disk-gpu: image-gpu $(BUILD)/musl/kiln-init $(IMG_TOOLS) $(BUILD)/keys/pubkey.h
	BUILD=$(BUILD) MODEL=$(MODEL) KILN_KEY=$(KILN_KEY) KILN_SB_KEYS=$(KILN_SB_KEYS) KILN_DISK_GPU=1 image/disk.sh
	$(call dev_disk,$(BUILD)/disk-gpu)
FORCE:
# The disk's QEMU test (OVMF, TCG): also version 2 (good) and version 3 (a kilnd that never
# becomes healthy: a bad key in its kiln.ini) as update bundles.
disk-test-inputs: disk $(BUILD)/gnu/kiln-flash
	BUILD=$(BUILD) MODEL=$(MODEL) KILN_KEY=$(KILN_KEY) KILN_SB_KEYS=$(KILN_SB_KEYS) KILN_VERSION=2 KILN_BUNDLE_ONLY=1 image/disk.sh
	BUILD=$(BUILD) MODEL=$(MODEL) KILN_KEY=$(KILN_KEY) KILN_SB_KEYS=$(KILN_SB_KEYS) KILN_VERSION=3 KILN_BUNDLE_ONLY=1 \
	  KILN_IMAGE_INI_EXTRA="max_conections = 8" image/disk.sh
test-disk: disk-test-inputs
	python3 tests/qemu/disk_test.py --build $(BUILD)
# The GPU disk's test inputs: version 3 as an update bundle that never becomes healthy (the
# same bad key as the CPU disk's v3), for its update and rollback (qemu/disk-gpu).
disk-gpu-test-inputs: disk-gpu
	BUILD=$(BUILD) MODEL=$(MODEL) KILN_KEY=$(KILN_KEY) KILN_SB_KEYS=$(KILN_SB_KEYS) KILN_DISK_GPU=1 KILN_VERSION=3 \
	  KILN_BUNDLE_ONLY=1 KILN_IMAGE_INI_EXTRA="max_conections = 8" image/disk.sh
test-disk-gpu: disk-gpu-test-inputs
	python3 tests/qemu/disk_test.py --gpu --build $(BUILD)
# The same disk under UEFI Secure Boot (OVMF's Secure Boot build, the dev keys enrolled).
test-secureboot: disk-test-inputs
	python3 tests/qemu/secureboot_test.py --build $(BUILD)
.PHONY: image-gpu image-tools disk disk-test-inputs test-disk test-secureboot FORCE
.PHONY: disk-gpu disk-gpu-test-inputs test-disk-gpu

# ---------------------------------------------------------------- model, deps, venv
model: $(MODEL)
$(MODEL): scripts/model.sh
	scripts/model.sh

deps:
	scripts/deps.sh

VENV := $(BUILD)/venv
PY   := $(VENV)/bin/python
venv: $(VENV)/.ok
$(VENV)/.ok: tests/requirements.txt
	@scripts/need.sh python3 python3
	@python3 -m venv $(VENV) 2>/dev/null || { scripts/need.sh /usr/lib/python3/dist-packages/ensurepip python3-venv; python3 -m venv $(VENV); }
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/requirements.txt
	@touch $@

# ---------------------------------------------------------------- fuzzers (clang libFuzzer)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -I. -I$(BUILD)/gnu/deps/include -O1 -g -MMD -MP
FUZZ_SAN := -fsanitize=address,undefined
# Library objects get -fsanitize=fuzzer-no-link and their own SIMD flags only (as in
# the other builds), so a fuzzer never runs an instruction the machine lacks.
FUZZ_OBJS := $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(LIB_SRCS))
$(BUILD)/fuzz/obj/%.o: %.c | $(BUILD)/gnu/deps/.ok
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(FUZZ_SAN) $(call simdflags,$<) -c $< -o $@
$(BUILD)/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJS) | $(BUILD)/gnu/deps/.ok
	@mkdir -p $(@D)
	clang $(filter-out -MMD -MP,$(FUZZ_CFLAGS)) -fsanitize=fuzzer $(FUZZ_SAN) $< $(FUZZ_OBJS) -o $@ \
	  -L$(BUILD)/gnu/deps/lib $(DEP_LIBS) -lm -pthread
-include $(shell find $(BUILD)/fuzz/obj -name '*.d' 2>/dev/null)
fuzz: $(FUZZ_BINS)
	@for f in $(FUZZ_BINS); do n=$$(basename $$f); mkdir -p $(BUILD)/fuzz/corpus/$$n; \
	  $$f -max_total_time=$${FUZZ_SECONDS:-60} $(BUILD)/fuzz/corpus/$$n tests/fuzz/corpus/$$n || exit 1; done

# ---------------------------------------------------------------- tests
# T: the tests/run.sh entries to run, shell globs separated by spaces, matched against
# their names (make test T='unit/*', T='*kv*', T='unit/* asan/*'); unset: all of them.
# make test builds the same with or without T.
# The LD_PRELOAD shim counting kilnd's loop-thread allocations (tests/net/alloc_test.py)
ALLOC_SHIM := $(BUILD)/gnu/tests/alloc_count.so
$(ALLOC_SHIM): tests/shim/alloc_count.c
	@mkdir -p $(@D)
	gcc -std=c11 -Wall -Wextra -Werror -O2 -fPIC -shared -pthread $< -o $@

# GPU_IMAGE=0: without the GPU image (make image-gpu, 3-4.5 min from nothing on 2 cores: the
# NVIDIA modules' compile) and its tests qemu/boot-gpu and image/reproducible-gpu, and the GPU
# disk (make disk-gpu-test-inputs, ~2 min with the GPU image's caches) and its qemu/disk-gpu.
GPU_IMAGE ?= 1
test: tools model venv deps $(KILND) $(gnu_TESTS) $(gnu_TOOLS) $(BUILD)/gnu/kbench $(ALLOC_SHIM) $(SDK_GNU) $(BUILD)/gnu/kiln-init $(asan_TESTS) $(BUILD)/asan/kilnd $(BUILD)/asan/tests/net/net_probe $(FUZZ_BINS) $(IMG_TOOLS)
	$(MAKE) musl image disk-test-inputs $(if $(filter 0,$(GPU_IMAGE)),,image-gpu $(if $(HAVE_NVCC),disk-gpu-test-inputs))
	@# the CUDA kilnd must compile and link wherever the toolkit is (no GPU needed)
	if [ -x "$(NVCC)" ]; then $(MAKE) cuda cuda-img; else echo "make test: no nvcc: the CUDA build is skipped"; fi
	BUILD=$(BUILD) MODEL=$(MODEL) PY=$(PY) T="$(T)" GPU_IMAGE=$(GPU_IMAGE) tests/run.sh

# The unit tests alone, plain and under ASan+UBSan: run.sh's unit/* and asan/* entries
# (and ref/quant-vectors, the input test_quant needs).
test-unit: model venv $(gnu_TESTS) $(asan_TESTS)
	BUILD=$(BUILD) MODEL=$(MODEL) PY=$(PY) T="unit/* asan/*" tests/run.sh

# ---------------------------------------------------------------- run and bench
run: tools model $(KILND)
	KILND=$(KILND) MODEL=$(MODEL) THREADS=$(THREADS) scripts/run.sh

# The packed CPU kernels, one thread, beside the rates of the instructions they stand
# on, measured in the same run, then each type's decode streamed from memory beside a
# plain read (tests/bench/kernels.c; seconds, no peer): first in make bench, and where
# a kernel change is measured.
$(BUILD)/gnu/kbench: $(BUILD)/gnu/obj/tests/bench/kernels.o $(BUILD)/gnu/libkilnd.a
	gcc $(OPT) $^ -o $@ -lm -pthread
bench-kernels: $(BUILD)/gnu/kbench
	$(BUILD)/gnu/kbench

# The peer is llama.cpp's own tools (tests/bench/peer.sh, built once, ~25 min); after the
# default model, the real shapes: SHAPES and FORMATS (make bench SHAPES="llama-3.1-8b"
# FORMATS=Q4_K_M) as tests/shapes/shapes.sh takes them; then a mixture of experts,
# MOE_SHAPES in Q4_K_M (Qwen3-30B-A3B's shape with 32 of its 128 experts: the same active
# parameters per token in a 5 GB file; its F16 intermediate needs 17 GB of disk once).
MOE_SHAPES ?= qwen3-30b-a3b-e32
bench: tools model venv $(KILND) $(BUILD)/gnu/kiln $(BUILD)/gnu/kbench
	$(BUILD)/gnu/kbench
	BUILD=$(BUILD) MODEL=$(MODEL) PY=$(PY) tests/bench/bench.sh
	BUILD=$(BUILD) MODEL=$(MODEL) PY=$(PY) tests/bench/bench_engine.sh
	BUILD=$(BUILD) MODEL=$(MODEL) tests/bench/bench_openai.sh
	BUILD=$(BUILD) PY=$(PY) tests/bench/bench_shapes.sh
	BUILD=$(BUILD) PY=$(PY) SHAPES="$(MOE_SHAPES)" FORMATS=Q4_K_M tests/bench/bench_shapes.sh
	BUILD=$(BUILD) PY=$(PY) tests/bench/quality.sh $$(BUILD=$(BUILD) PY=$(PY) tests/shapes/shapes.sh)

# Random-weight models of real shapes, quantized by llama-quantize: build/shapes/*.gguf
# (SHAPES, FORMATS as above; `tests/shapes/gen_shape.py --list` names the shapes).
shapes: model venv
	BUILD=$(BUILD) PY=$(PY) tests/shapes/shapes.sh

# The long reliability soak (not in CI): 20,000 requests from 64 clients through lwIP
# with cancels, disconnects and slow readers, a KV pool small enough to preempt; nothing
# may be lost or leaked (tests/reliability/, RELIABILITY.md). The short run's request
# shape, ten times the requests and twice the clients (~10 min on 2 cores); soak-heavy
# has long prompts and outputs (8..200 words, up to 64 tokens: hours).
soak: tools model $(KILND)
	BUILD=$(BUILD) MODEL=$(MODEL) tests/reliability/soak.sh --requests 20000 --clients 64 \
	  --max-tokens 8 --slow-max-tokens 16 --prompt-max 16 --kv-pool-mb 12 \
	  --time-limit 2700 --request-timeout 300 --hard-limit 3300
soak-heavy: tools model $(KILND)
	BUILD=$(BUILD) MODEL=$(MODEL) tests/reliability/soak.sh --requests 20000 --clients 64

clean:
	rm -rf $(BUILD)/gnu $(BUILD)/asan $(BUILD)/musl/obj $(BUILD)/fuzz $(BUILD)/cuda
	rm -f $(BUILD)/cuda-img/kilnd $(BUILD)/cuda-img/fatbin.o $(BUILD)/cuda-img/kernels.fatbin
distclean:
	rm -rf $(BUILD) models
