#!/usr/bin/env bash
# gpu.sh: `make image-gpu` — the GPU variant of the appliance image: the image of `make image`
# (same kernel, kiln-init, kilnd, config, model) plus NVIDIA's open kernel modules built here
# for that kernel and the GSP firmware they load.
#
#   build/image-gpu/vmlinuz              the kernel of build/image/ (Debian's, as shipped)
#   build/image-gpu/initramfs.cpio.gz    the initramfs of image/build.sh with, in addition,
#       /lib/modules/<ver>/extra/nvidia{,-uvm}.ko   built from Debian's nvidia-open-kernel-source
#       /etc/kiln/modules-gpu                        those modules in load order (kiln-init,
#                                                    boot/gpu.c, loads them after the NIC's)
#       /lib/firmware/nvidia/<driver>/gsp_*.bin      from Debian's firmware-nvidia-gsp, where
#                                                    the driver's request_firmware() looks
#       /bin/kilnd-cuda                              the glibc CUDA kilnd (KILND_CUDA, make
#                                                    cuda-img: kernels for this driver's CUDA)
#       /lib64/ld-linux-x86-64.so.2 -> the loader   its program interpreter, and the glibc
#       /lib/x86_64-linux-gnu/{ld-linux-x86-64.so.2,libc.so.6,...}  libraries it and libcuda
#                                                    need (the machine's libc6, by version)
#       /usr/lib/x86_64-linux-gnu/libcuda.so.1, libnvidia-ptxjitcompiler.so.1
#                                                    the driver's user-space half (libcuda1,
#                                                    libnvidia-ptxjitcompiler1 of the same
#                                                    version); both directories are the
#                                                    loader's built-in search path
#   build/image-gpu/data/lib/cuda/       not in the initramfs: cuBLAS and cuBLASLt of the
#       driver's CUDA level (libcublas12, libcublaslt12) and libgcc_s.so.1 (libgcc-s1), which
#       make disk-gpu puts on the data partition as /data/lib/cuda (only with KILND_CUDA)
#   kiln-init runs /bin/kilnd-cuda instead of /bin/kilnd when it is there (boot/gpu.c).
#   Without KILND_CUDA (no CUDA toolkit on this machine: make cuda-img needs cuda.h) the
#   image carries no CUDA userland and says so (/etc/kiln/gpu-driver cuda_kilnd=none).
#
# Which driver and why: NVIDIA 550.163.01, the open kernel modules (Debian trixie, contrib)
# and the GSP firmware of the same version (trixie, non-free-firmware). 550 is the oldest
# Debian-packaged branch whose supported-GPU list has the H200 (10de:2335); bookworm's 535
# (535.261.03 open, 535.309.01 closed) stops at H100/GH200. It is built against the image's own
# bookworm kernel (6.1.0-57), not trixie's 6.12: one kernel for the CPU and GPU images. That
# kernel's pci_resize_resource() took a fourth argument in a stable update, which 550.163.01
# predates: image/gpu/nvidia-550-pci-resize-exclude-bars.patch adds the conftest and the call
# (it builds unchanged otherwise).
#
# How (nothing is installed on this machine; its /usr/src and /lib/modules are not read):
#   1. the kernel's headers (linux-headers-<abi>-amd64, -common, linux-kbuild-<x.y>) of exactly
#      the kernel package's version, apt-get download'ed by name=version with the machine's apt
#      sources (image/build.sh fetched the kernel there), unpacked under build/gpu/headers/;
#   2. the driver and firmware packages by name=version from suite trixie through a private apt
#      configuration under build/gpu/apt/ (scripts/deps.sh's scheme: the Debian archive URI is
#      read from this machine's apt sources at run time, never stored here), each .deb checked
#      against the sha256 pinned below;
#   3. Kbuild (gcc-12, the kernel's compiler) builds nvidia.ko and nvidia-uvm.ko (not modeset,
#      drm or peermem: no display, no RDMA); paths are mapped to fixed names
#      (-ffile-prefix-map) and debug sections stripped, so the bytes do not depend on the
#      checkout's location;
#   4. checks: each module's vermagic equals the kernel's (taken from a module of the kernel
#      package), modpost reported no undefined symbol, and every module a driver module
#      depends on is in the kernel package (those come along, in order);
#   5. image/build.sh makes the initramfs with that tree laid over the root
#      (KILN_IMAGE_OVERLAY), so every reproducibility rule of the plain image holds here too.
#
# Cached: the .debs stay in build/gpu/dl/ and the built modules in build/gpu/modules/<key>/
# (key: driver version, kernel version, patches, this recipe); a second run only re-packs.
# Environment: BUILD (build), KILND_CUDA (the CUDA kilnd; unset: none), KILN_IMAGE_GPU_DIR (the output directory, default
# build/image-gpu), JOBS (module compile jobs, default nproc), KILN_GPU_FIRMWARE
# (the gsp_*.bin files to carry, default "gsp_ga10x.bin gsp_tu10x.bin": Ampere/Ada/Hopper and
# Turing), and image/build.sh's (MODEL, SOURCE_DATE_EPOCH, GZIP_LEVEL, ...).
set -Eeuo pipefail
trap 'echo "image-gpu: FAILED (line $LINENO: $BASH_COMMAND)" >&2' ERR
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PATH=$PATH:/usr/sbin:/sbin # modinfo
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
FIRMWARE=${KILN_GPU_FIRMWARE:-gsp_ga10x.bin gsp_tu10x.bin}
unset MAKEFLAGS MFLAGS MAKELEVEL # Kbuild gets its own -j

G=$BUILD/gpu
IMG=$BUILD/image
OUTD=${KILN_IMAGE_GPU_DIR:-$BUILD/image-gpu}
case $OUTD in /*) ;; *) OUTD=$ROOT/$OUTD ;; esac
APTDIR=$G/apt
DL=$G/dl
SUITE=trixie

# ---------------------------------------------------------------- pins
# The driver version is written once, in image/gpu/driver.env (the Makefile derives the
# kernels' CUDA level from it); every driver package below must be of that version.
. image/gpu/driver.env
DRIVER=$NVIDIA_DRIVER
declare -A VER SHA COMP
VER[nvidia-open-kernel-source]=550.163.01-2
SHA[nvidia-open-kernel-source]=8726fc25ee050f530e569b32cb4634d1f75585a11b5481de3dfd82b72abb0505
COMP[nvidia-open-kernel-source]=contrib
VER[firmware-nvidia-gsp]=550.163.01-2
SHA[firmware-nvidia-gsp]=e07e243f33cf7066737e3f556f3325a5e57199a9549a93f2158eec3921ea0beb
COMP[firmware-nvidia-gsp]=non-free-firmware
# The driver's user-space half for the CUDA kilnd (dlopen("libcuda.so.1")); libcuda JITs
# PTX through the PTX compiler library. Not libnvidia-pkcs11-openssl3, which libcuda1's
# package depends on: libcuda dlopens it (and OpenSSL) only in confidential-computing mode.
VER[libcuda1]=550.163.01-2
SHA[libcuda1]=8feff97aac61d6f27ded96a3c25b9e68025a680476e6072ff7eaf10623509135
COMP[libcuda1]=non-free
VER[libnvidia-ptxjitcompiler1]=550.163.01-2
SHA[libnvidia-ptxjitcompiler1]=73ce8da87e13d0cd5a7f5ec3e0b5822f91fe1cc72977542cd9a8354c25d810f4
COMP[libnvidia-ptxjitcompiler1]=non-free
DRIVER_PKGS="nvidia-open-kernel-source firmware-nvidia-gsp libcuda1 libnvidia-ptxjitcompiler1"
for p in $DRIVER_PKGS; do
  [[ ${VER[$p]} == "$DRIVER"-* ]] || { echo "image-gpu: error: $p ${VER[$p]} is not of driver $DRIVER (image/gpu/driver.env)" >&2; exit 1; }
done
# cuBLAS and cuBLASLt for the data partition (make disk-gpu puts them in /data/lib/cuda; the
# CUDA kilnd dlopens libcublas.so.12 for `cuda_prefill = cublas`): 107 + 432 MB unpacked, too
# much for an initramfs unpacked into RAM at every boot. Fetched with the CUDA userland only.
# Their CUDA release (the part after the ~) must be the driver's level (cuda_level.sh), as the
# kernels' is: a newer cuBLAS asks for a driver this one is not.
CUDA_MM=$(image/gpu/cuda_level.sh "$DRIVER" | cut -d' ' -f1)
CUBLAS_PKGS=
if [ -n "${KILND_CUDA:-}" ]; then
  CUBLAS_PKGS="libcublas12 libcublaslt12"
  VER[libcublas12]=12.4.5.8~12.4.1-2
  SHA[libcublas12]=2ddc22809d16b157021a4d57db6b2221cf7c46f42654c95df86ce73beb15c1f7
  COMP[libcublas12]=non-free
  VER[libcublaslt12]=12.4.5.8~12.4.1-2
  SHA[libcublaslt12]=2f67754a6dd7095de1a5c4503f20539981f31f0cd627565973c547e997fc7732
  COMP[libcublaslt12]=non-free
  for p in $CUBLAS_PKGS; do
    [[ ${VER[$p]} == *~"$CUDA_MM".* ]] || { echo "image-gpu: error: $p ${VER[$p]} is not of CUDA $CUDA_MM (driver $DRIVER)" >&2; exit 1; }
  done
fi
# cuBLAS needs libgcc_s.so.1 (DT_NEEDED), which glibc does not carry: Debian's libgcc-s1 of the
# machine's suite (bookworm, as the libc6 below), pinned; it goes beside cuBLAS.
LIBGCC_VER=12.2.0-14+deb12u1
LIBGCC_SHA=3016e62cb4b7cd8038822870601f5ed131befe942774d0f745622cc77d8a88f7
PATCHES=(image/gpu/nvidia-550-pci-resize-exclude-bars.patch)
NV_MODULES="nvidia nvidia-uvm"
# Bump when the build recipe below changes, so cached modules are rebuilt.
RECIPE=1

T0=$(date +%s)
say() { echo "image-gpu: $*" >&2; }
die() { echo "image-gpu: error: $*" >&2; trap - ERR; exit 1; }
sha256() { sha256sum "$1" | cut -d' ' -f1; }
since() { echo "$(( $(date +%s) - $1 )) s"; }

scripts/need.sh gcc-12 gcc-12 make make modinfo kmod dpkg-deb dpkg apt-get apt \
  strip binutils readelf binutils xz xz-utils patch patch flock util-linux

[ -f "$IMG/kernel/.from" ] && [ -f "$IMG/kernel.version" ] ||
  die "no kernel under $IMG (run make image first)"
KDEB=$(cat "$IMG/kernel/.from")                      # linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb
KVER=$(cat "$IMG/kernel.version")                    # 6.1.0-57-amd64
KPKGVER=$(dpkg-deb -f "$IMG/$KDEB" Version)          # 6.1.192-3
KMOD=$IMG/kernel/lib/modules/$KVER
mkdir -p "$G" "$DL" "$OUTD"
exec 9>"$G/.lock"
flock 9

# ---------------------------------------------------------------- 1. the kernel's headers
# apt-get download PKG=VER... into $DL with apt config $1 ("" = the machine's).
download() {
  local conf=$1; shift
  local tmp
  tmp=$(mktemp -d "$DL/dl.XXXXXX")
  chmod 0777 "$tmp" # apt downloads as _apt
  if ! (cd "$tmp" && env ${conf:+APT_CONFIG="$conf"} apt-get download "$@" >"$G/download.log" 2>&1); then
    if [ -z "$conf" ]; then
      apt-get update -qq >&2 || true
      (cd "$tmp" && apt-get download "$@" >"$G/download.log" 2>&1) ||
        { tail -n 20 "$G/download.log" >&2; rm -rf "$tmp"; die "apt-get download $* failed"; }
    else
      tail -n 20 "$G/download.log" >&2; rm -rf "$tmp"; die "apt-get download $* failed (apt config $conf)"
    fi
  fi
  mv "$tmp"/*.deb "$DL"/ && rmdir "$tmp"
}
have_deb() { ls "$DL/${1}_${2/:/%3a}_"*.deb >/dev/null 2>&1; }
deb_of() { ls "$DL/${1}_${2/:/%3a}_"*.deb | sed -n 1p; }

HPKG=linux-headers-$KVER
have_deb "$HPKG" "$KPKGVER" || { say "downloading $HPKG=$KPKGVER"; download "" "$HPKG=$KPKGVER"; }
HDEPS=$(dpkg-deb -f "$(deb_of "$HPKG" "$KPKGVER")" Depends)
COMMON=$(grep -o 'linux-headers-[^ ,]*-common' <<<"$HDEPS" | sed -n 1p)
KBUILD=$(grep -o 'linux-kbuild-[0-9.]*' <<<"$HDEPS" | sed -n 1p)
[ -n "$COMMON" ] && [ -n "$KBUILD" ] || die "$HPKG: cannot find its -common and kbuild packages in Depends: $HDEPS"
for p in "$COMMON" "$KBUILD"; do
  have_deb "$p" "$KPKGVER" || { say "downloading $p=$KPKGVER"; download "" "$p=$KPKGVER"; }
done
HDR=$G/headers/$KVER
HKEY="$HPKG $COMMON $KBUILD $KPKGVER"
if [ "$(cat "$HDR/.from" 2>/dev/null)" != "$HKEY" ]; then
  say "unpacking the headers of $KVER ($KPKGVER)"
  rm -rf "$HDR" && mkdir -p "$HDR"
  for p in "$HPKG" "$COMMON" "$KBUILD"; do dpkg-deb -x "$(deb_of "$p" "$KPKGVER")" "$HDR"; done
  # The -amd64 tree's one-line Makefile includes the -common tree by its installed path.
  sed -i "s|^include /usr/src/|include $HDR/usr/src/|" "$HDR/usr/src/$HPKG/Makefile"
  echo "$HKEY" >"$HDR/.from"
fi
SYSSRC=$HDR/usr/src/$COMMON
SYSOUT=$HDR/usr/src/$HPKG
[ -f "$SYSOUT/Module.symvers" ] && [ -f "$SYSOUT/.config" ] || die "$HPKG has no Module.symvers/.config"

# ---------------------------------------------------------------- 2. driver and firmware
# Write $APTDIR/{apt.conf,sources.list}: suite trixie, the components the pinned packages
# are in, on every Debian archive URI (path ending in /debian) of this machine's sources.
. scripts/apt_private.sh
apt_setup() {
  local comps
  comps=$(printf '%s\n' "${COMP[@]}" | LC_ALL=C sort -u | tr '\n' ' ')
  apt_private_setup "$APTDIR" deb "$SUITE" "${comps% }" image/gpu.sh ||
    die "no Debian archive entry (a URI ending in /debian) in this machine's apt sources"
}
missing=()
for p in "${!VER[@]}"; do
  if have_deb "$p" "${VER[$p]}" && [ "$(sha256 "$(deb_of "$p" "${VER[$p]}")")" = "${SHA[$p]}" ]; then continue; fi
  missing+=("$p=${VER[$p]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  t=$(date +%s)
  apt_setup
  say "apt-get update (private config, suite $SUITE: ${COMP[*]})"
  env APT_CONFIG="$APTDIR/apt.conf" apt-get update >"$APTDIR/update.log" 2>&1 ||
    { tail -n 20 "$APTDIR/update.log" >&2; die "apt-get update failed (private config $APTDIR/apt.conf)"; }
  say "downloading ${missing[*]}"
  download "$APTDIR/apt.conf" "${missing[@]}"
  say "fetched in $(since "$t")"
fi
for p in "${!VER[@]}"; do
  f=$(deb_of "$p" "${VER[$p]}")
  got=$(sha256 "$f")
  [ "$got" = "${SHA[$p]}" ] || { mv -f "$f" "$f.rejected"; die "$p: sha256 of $(basename "$f") is $got, pinned ${SHA[$p]}: rejected"; }
done

# ---------------------------------------------------------------- 3. the modules (cached)
key=$( { echo "recipe $RECIPE driver ${VER[nvidia-open-kernel-source]} ${SHA[nvidia-open-kernel-source]}"
         echo "kernel $HKEY modules $NV_MODULES"; cat "${PATCHES[@]}"; } | sha256sum | cut -c1-16)
MODS=$G/modules/$key
if [ ! -f "$MODS/.ok" ]; then
  t=$(date +%s)
  SRCX=$G/src
  rm -rf "$SRCX" "$MODS" && mkdir -p "$SRCX"
  say "unpacking nvidia-open-kernel-source ${VER[nvidia-open-kernel-source]}"
  dpkg-deb --fsys-tarfile "$(deb_of nvidia-open-kernel-source "${VER[nvidia-open-kernel-source]}")" |
    tar -xO ./usr/src/nvidia-open-kernel.tar.xz | tar -xJ -C "$SRCX" --no-same-owner
  S=$SRCX/modules/nvidia-open-kernel
  [ -f "$S/Kbuild" ] || die "nvidia-open-kernel-source: no modules/nvidia-open-kernel/Kbuild in its tarball"
  for pf in "${PATCHES[@]}"; do
    patch -d "$S" -p1 -s --no-backup-if-mismatch <"$pf" || die "$pf does not apply to ${VER[nvidia-open-kernel-source]}"
  done
  say "building $NV_MODULES for $KVER (Kbuild, -j$JOBS; log: ${G#"$ROOT"/}/modules.log)"
  # CC: the compiler that built the kernel (CONFIG_CC_VERSION_TEXT); the headers' own
  # .kernelvariables say gcc-12 too.
  if ! make -C "$S" -j"$JOBS" modules SYSSRC="$SYSSRC" SYSOUT="$SYSOUT" CC=gcc-12 \
         NV_KERNEL_MODULES="$NV_MODULES" \
         KCFLAGS="-ffile-prefix-map=$S=/usr/src/nvidia-$DRIVER -ffile-prefix-map=$HDR/usr/src=/usr/src" \
         >"$G/modules.log" 2>&1; then
    grep -E ': (fatal )?error:|undefined!|\*\*\*' "$G/modules.log" | cut -c1-400 | head -n 30 >&2 || true
    die "the module build failed (full log: $G/modules.log)"
  fi
  if grep -E 'WARNING: modpost: .*undefined!' "$G/modules.log" >&2; then
    die "modpost: the modules use symbols $KVER does not export (above; log $G/modules.log)"
  fi
  mkdir -p "$MODS.tmp"
  for m in $NV_MODULES; do
    [ -f "$S/$m.ko" ] || die "the build made no $m.ko"
    strip --strip-debug -o "$MODS.tmp/$m.ko" "$S/$m.ko"
  done
  cp "$G/modules.log" "$MODS.tmp/build.log"
  touch "$MODS.tmp/.ok"
  mv "$MODS.tmp" "$MODS"
  say "modules built in $(since "$t")"
fi

# ---------------------------------------------------------------- 4. checks, load order
# The kernel's vermagic, from a module of the kernel package itself.
ref=$(cd "$KMOD" && find kernel -name '*.ko*' | LC_ALL=C sort | sed -n 1p)
[ -n "$ref" ] || die "no module in $KMOD to read the kernel's vermagic from"
KMAGIC=$(modinfo -F vermagic "$KMOD/$ref")
for m in $NV_MODULES; do
  got=$(modinfo -F vermagic "$MODS/$m.ko")
  [ "$got" = "$KMAGIC" ] || die "$m.ko has vermagic '$got', the kernel $KVER '$KMAGIC': it would not load (headers of another kernel?)"
done
# Dependencies: the driver's own modules, or modules of the kernel package (taken along).
declare -A PATH_OF=() STATE=()
for m in $NV_MODULES; do PATH_OF[${m//-/_}]=extra/$m.ko; done
while IFS= read -r rel; do
  n=${rel##*/}; n=${n%%.ko*}; n=${n//-/_}
  PATH_OF[$n]=${PATH_OF[$n]:-$rel}
done < <(cd "$KMOD" && find kernel -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' | LC_ALL=C sort)
ORDER=()
visit() {
  local n=${1//-/_} f deps d
  case "${STATE[$n]:-}" in 2) return ;; 1) die "module dependency cycle at $n" ;; esac
  if [ -z "${PATH_OF[$n]:-}" ]; then
    grep -qE "/(${n}|${n//_/-})\.ko\$" "$KMOD/modules.builtin" 2>/dev/null && { STATE[$n]=2; return; }
    die "module $n (a dependency of the driver): neither a module nor built into $KVER"
  fi
  STATE[$n]=1
  case ${PATH_OF[$n]} in extra/*) f=$MODS/${PATH_OF[$n]#extra/} ;; *) f=$KMOD/${PATH_OF[$n]} ;; esac
  deps=$(modinfo -F depends "$f")
  for d in $(tr ',' '\n' <<<"$deps" | LC_ALL=C sort); do visit "$d"; done
  STATE[$n]=2
  ORDER+=("${PATH_OF[$n]}")
}
for m in $NV_MODULES; do visit "$m"; done

# ---------------------------------------------------------------- 5. the overlay, the image
O=$G/overlay
rm -rf "$O" && mkdir -p "$O/etc/kiln" "$O/lib/modules/$KVER" "$O/lib/firmware/nvidia/$DRIVER"
: >"$O/etc/kiln/modules-gpu"
for rel in "${ORDER[@]}"; do
  mkdir -p "$O/lib/modules/$KVER/$(dirname "$rel")"
  case $rel in extra/*) cp "$MODS/${rel#extra/}" "$O/lib/modules/$KVER/$rel" ;; *) cp "$KMOD/$rel" "$O/lib/modules/$KVER/$rel" ;; esac
  echo "$rel" >>"$O/etc/kiln/modules-gpu"
done
FWX=$G/firmware/$DRIVER
if [ "$(cat "$FWX/.from" 2>/dev/null)" != "${SHA[firmware-nvidia-gsp]}" ]; then
  rm -rf "$FWX" && mkdir -p "$FWX"
  dpkg-deb -x "$(deb_of firmware-nvidia-gsp "${VER[firmware-nvidia-gsp]}")" "$FWX"
  echo "${SHA[firmware-nvidia-gsp]}" >"$FWX/.from"
fi
for fw in $FIRMWARE; do
  src=
  for d in usr/lib lib; do [ -f "$FWX/$d/firmware/nvidia/$DRIVER/$fw" ] && src=$FWX/$d/firmware/nvidia/$DRIVER/$fw && break; done
  [ -n "$src" ] || die "firmware-nvidia-gsp ${VER[firmware-nvidia-gsp]} has no nvidia/$DRIVER/$fw"
  cp "$src" "$O/lib/firmware/nvidia/$DRIVER/$fw"
done
# ---------------------------------------------------------------- cuBLAS for the data partition
# stage_cublas (inside step 6: it needs the image's loader and glibc): libcublas.so.12,
# libcublasLt.so.12 and libgcc_s.so.1 into $OUTD/data/lib/cuda, what make disk-gpu puts on
# the data partition as /data/lib/cuda (kiln-init gives the CUDA kilnd that folder as its
# library path). Unpacked once under build/gpu/cublas/<key>; hard links from there when the
# file system allows (540 MB). Every library they name that is not beside them must be in the
# image's glibc (copied into the image from libc6 if it is not yet there), and the image's
# loader must resolve all of it inside the image's tree and that folder.
stage_cublas() {
  local f real lib n key cbx dlib out bad
  have_deb libgcc-s1 "$LIBGCC_VER" || { say "downloading libgcc-s1=$LIBGCC_VER (cuBLAS needs libgcc_s.so.1)"; download "" "libgcc-s1=$LIBGCC_VER"; }
  f=$(deb_of libgcc-s1 "$LIBGCC_VER")
  [ "$(sha256 "$f")" = "$LIBGCC_SHA" ] || { mv -f "$f" "$f.rejected"; die "libgcc-s1: sha256 of $(basename "$f") is not the pinned $LIBGCC_SHA: rejected"; }
  key=$(echo "${SHA[libcublas12]} ${SHA[libcublaslt12]} $LIBGCC_SHA" | sha256sum | cut -c1-16)
  cbx=$G/cublas/$key
  if [ ! -f "$cbx/.ok" ]; then
    say "unpacking cuBLAS ${VER[libcublas12]} and libgcc-s1 $LIBGCC_VER"
    rm -rf "$G/cublas" && mkdir -p "$cbx/x" "$cbx/lib"
    for p in $CUBLAS_PKGS; do dpkg-deb -x "$(deb_of "$p" "${VER[$p]}")" "$cbx/x"; done
    dpkg-deb -x "$f" "$cbx/x"
    for lib in libcublas libcublasLt; do
      real=$(readlink "$cbx/x/usr/lib/$MA/$lib.so.12") || die "$lib: no $lib.so.12 in its package"
      mv "$cbx/x/usr/lib/$MA/$real" "$cbx/lib/$real"
      ln -s "$real" "$cbx/lib/$lib.so.12"
    done
    [ -f "$cbx/x/lib/$MA/libgcc_s.so.1" ] || die "libgcc-s1 $LIBGCC_VER has no lib/$MA/libgcc_s.so.1"
    mv "$cbx/x/lib/$MA/libgcc_s.so.1" "$cbx/lib/"
    rm -rf "$cbx/x"
    touch "$cbx/.ok"
  fi
  dlib=$OUTD/data/lib/cuda
  rm -rf "$OUTD/data" && mkdir -p "$dlib"
  cp -al "$cbx/lib/." "$dlib/" 2>/dev/null || { rm -rf "$dlib" && mkdir -p "$dlib" && cp -a "$cbx/lib/." "$dlib/"; }
  local queue=("$dlib/libcublas.so.12" "$dlib/libcublasLt.so.12" "$dlib/libgcc_s.so.1")
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}; queue=("${queue[@]:1}")
    for n in $(need_of "$f"); do
      if [ -e "$dlib/$n" ] || [ -e "$SLIB/$n" ] || [ -e "$ULIB/$n" ]; then continue; fi
      [ -f "$GL/lib/$MA/$n" ] || die "$(basename "$f") needs $n: neither beside it nor in libc6 $LIBC_VER"
      cp "$GL/lib/$MA/$n" "$SLIB/$n"
      queue+=("$SLIB/$n")
    done
  done
  out=$("$LDSO" --library-path "$dlib:$SLIB:$ULIB" --list "$dlib/libcublas.so.12") ||
    die "the image's loader cannot load libcublas.so.12: $out"
  bad=$(O=$O D=$dlib awk '$2 == "=>" && index($3, ENVIRON["O"]) != 1 && index($3, ENVIRON["D"]) != 1 {print}' <<<"$out")
  [ -z "$bad" ] || die "libcublas.so.12 resolves outside the image's tree and $dlib: $bad"
  grep -q "libcublasLt.so.12 => $dlib/libcublasLt.so.12" <<<"$out" || die "libcublasLt.so.12 is not taken from $dlib: $out"
  say "cuBLAS for the data partition: $(du -smL "$dlib" | cut -f1) MB in ${dlib#"$ROOT"/} (/data/lib/cuda)"
}

# ---------------------------------------------------------------- 6. the CUDA userland
# The glibc CUDA kilnd, its loader and libraries, libcuda. The glibc is the libc6 package
# of exactly this machine's version (the one the kilnd was linked against here), fetched
# by name=version from this machine's Debian archive like the kernel headers (apt checks
# it against the archive's signed index; cached in build/gpu/dl), not copied from this
# machine's /lib: the image must not depend on what else was installed or changed here.
CUDA_LINE="cuda_kilnd=none"
if [ -n "${KILND_CUDA:-}" ]; then
  [ -x "$KILND_CUDA" ] || die "KILND_CUDA=$KILND_CUDA is not an executable"
  LIBC_VER=$(dpkg-query -W -f='${Version}' libc6) || die "no libc6 installed here?"
  have_deb libc6 "$LIBC_VER" || { say "downloading libc6=$LIBC_VER (the loader and libraries of the CUDA kilnd)"; download "" "libc6=$LIBC_VER"; }
  GL=$G/libc6/$LIBC_VER
  if [ ! -f "$GL/.ok" ]; then
    rm -rf "$GL" && mkdir -p "$GL"
    dpkg-deb -x "$(deb_of libc6 "$LIBC_VER")" "$GL"
    touch "$GL/.ok"
  fi
  NVX=$G/libcuda/$DRIVER
  if [ "$(cat "$NVX/.from" 2>/dev/null)" != "${SHA[libcuda1]} ${SHA[libnvidia-ptxjitcompiler1]}" ]; then
    rm -rf "$NVX" && mkdir -p "$NVX"
    for p in libcuda1 libnvidia-ptxjitcompiler1; do dpkg-deb -x "$(deb_of "$p" "${VER[$p]}")" "$NVX"; done
    echo "${SHA[libcuda1]} ${SHA[libnvidia-ptxjitcompiler1]}" >"$NVX/.from"
  fi
  MA=x86_64-linux-gnu
  SLIB=$O/lib/$MA ULIB=$O/usr/lib/$MA
  mkdir -p "$O/bin" "$O/lib64" "$SLIB" "$ULIB"
  strip --strip-debug -o "$O/bin/kilnd-cuda" "$KILND_CUDA"
  chmod 0755 "$O/bin/kilnd-cuda"
  # libcuda and the PTX compiler under their sonames (Debian keeps them in nvidia/current/
  # behind update-alternatives links; the image has one driver, so no alternatives).
  for lib in libcuda libnvidia-ptxjitcompiler; do
    f=$NVX/usr/lib/$MA/nvidia/current/$lib.so.$DRIVER
    [ -f "$f" ] || die "${lib}: no $lib.so.$DRIVER in its package"
    cp "$f" "$ULIB/$lib.so.$DRIVER"
    ln -s "$lib.so.$DRIVER" "$ULIB/$lib.so.1"
  done
  # The loader: the kilnd's PT_INTERP names /lib64/ld-linux-x86-64.so.2.
  interp=$(readelf -l "$KILND_CUDA" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
  [ "$interp" = /lib64/ld-linux-x86-64.so.2 ] || die "$KILND_CUDA asks for the loader '$interp', not /lib64/ld-linux-x86-64.so.2"
  cp "$GL/lib/$MA/ld-linux-x86-64.so.2" "$SLIB/"
  chmod 0755 "$SLIB/ld-linux-x86-64.so.2"
  ln -s ../lib/$MA/ld-linux-x86-64.so.2 "$O/lib64/ld-linux-x86-64.so.2"
  # Every library the kilnd, libcuda and the PTX compiler name (DT_NEEDED), and theirs,
  # from libc6; anything else is an error here, not a failed start on the box.
  need_of() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
  queue=("$O/bin/kilnd-cuda" "$ULIB/libcuda.so.$DRIVER" "$ULIB/libnvidia-ptxjitcompiler.so.$DRIVER")
  declare -A GOT=()
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}; queue=("${queue[@]:1}")
    for n in $(need_of "$f"); do
      [ -n "${GOT[$n]:-}" ] && continue
      GOT[$n]=1
      if [ -e "$SLIB/$n" ] || [ -e "$ULIB/$n" ]; then continue; fi
      [ -f "$GL/lib/$MA/$n" ] || die "$(basename "$f") needs $n, which libc6 $LIBC_VER does not have"
      cp "$GL/lib/$MA/$n" "$SLIB/$n"
      queue+=("$SLIB/$n")
    done
  done
  # The check the box would make: the image's own loader resolves all of it inside the
  # image's tree (its built-in search path holds both directories; no ld.so.cache).
  LDSO=$SLIB/ld-linux-x86-64.so.2
  sp=$("$LDSO" --help | sed -n '/^Shared library search path:/,/^$/p')
  for d in /lib/$MA /usr/lib/$MA; do
    grep -q "^  $d (system search path)" <<<"$sp" || die "the loader of libc6 $LIBC_VER does not search $d by itself: $sp"
  done
  for f in "$O/bin/kilnd-cuda" "$ULIB/libcuda.so.1" "$ULIB/libnvidia-ptxjitcompiler.so.1"; do
    out=$("$LDSO" --library-path "$SLIB:$ULIB" --list "$f") || die "the image's loader cannot load $(basename "$f"): $out"
    bad=$(O=$O awk '$2 == "=>" && index($3, ENVIRON["O"]) != 1 {print}' <<<"$out")
    [ -z "$bad" ] || die "$(basename "$f") resolves outside the image's tree: $bad"
  done
  stage_cublas
  CUDA_LINE="cuda_kilnd=/bin/kilnd-cuda
libcuda=libcuda1 ${VER[libcuda1]}, libnvidia-ptxjitcompiler1 ${VER[libnvidia-ptxjitcompiler1]}
glibc=libc6 $LIBC_VER: $(cd "$SLIB" && ls | LC_ALL=C sort | tr '\n' ' ' | sed 's/ $//')
cuda_level=$(image/gpu/cuda_level.sh "$DRIVER")
cublas=libcublas12 ${VER[libcublas12]}, libcublaslt12 ${VER[libcublaslt12]}, libgcc-s1 $LIBGCC_VER: on the data partition, /data/lib/cuda (make disk-gpu)"
  say "CUDA kilnd: $(basename "$KILND_CUDA") + libcuda $DRIVER + libc6 $LIBC_VER ($(du -skL "$O/bin/kilnd-cuda" "$SLIB" "$ULIB" | awk '{s += $1} END {print s}') KiB)"
else
  say "no KILND_CUDA: the image carries no CUDA userland (make cuda-img needs the CUDA toolkit's headers)"
fi

cat >"$O/etc/kiln/gpu-driver" <<EOF
driver=$DRIVER
modules=nvidia-open-kernel-source ${VER[nvidia-open-kernel-source]}
firmware=firmware-nvidia-gsp ${VER[firmware-nvidia-gsp]}
kernel=$KVER
vermagic=$KMAGIC
$CUDA_LINE
EOF

say "initramfs (image/build.sh with the overlay)"
BUILD=$BUILD KILN_IMAGE_OUT="$OUTD/initramfs.cpio.gz" KILN_IMAGE_OVERLAY="$O" image/build.sh
cp "$IMG/vmlinuz" "$OUTD/vmlinuz"
echo "$KVER" >"$OUTD/kernel.version"
# The client side of the image's TLS and tokens (the same files as in build/image/), for
# tests/qemu/boot_test.py --gpu and qemu/run.sh users.
mkdir -p "$OUTD/tls"
cp "$IMG/tls/ca.crt" "$OUTD/tls/ca.crt"
cp -p "$IMG/tokens.txt" "$OUTD/tokens.txt"
(cd "$OUTD" && sha256sum vmlinuz initramfs.cpio.gz >SHA256SUMS)
say "driver $DRIVER for $KVER: ${ORDER[*]}; firmware: $FIRMWARE"
say "done in $(since "$T0"): $OUTD/{vmlinuz,initramfs.cpio.gz}"
