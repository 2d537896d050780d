#!/usr/bin/env bash
# deps.sh: the third-party C libraries (DESIGN.md §7), from Debian source packages.
#
#  1. fetch: a private apt configuration under build/deps/apt/ whose deb-src lines reuse the
#     Debian archive URI configured on this machine (read at run time, never stored in the
#     repo) downloads the pinned source packages from suite trixie. The machine's own apt
#     state is not touched.
#  2. verify: each upstream orig tarball must match the sha256 pinned below.
#  3. unpack the upstream tarball only (no Debian patches) into build/deps/src/<pkg>/, then
#     apply our own patches to it (scripts/deps/<pkg>/, listed in PATCHES below).
#  4. build static libraries per toolchain into build/<tc>/deps/{lib,include}:
#     gnu (gcc) and musl (musl-gcc): libmbedtls.a libmbedx509.a libmbedcrypto.a liblwip.a
#     libinih.a libyyjson.a; then build and run tests/deps/deps_smoke.c against them.
#
# Cached: tarballs stay in build/deps/dl/, a stamp per package and toolchain records what
# was built; a second run only re-runs the smoke tests.
# Environment: JOBS (parallel compiles, default nproc), DEPS_TOOLCHAINS (default "gnu musl"),
# LWIP_CONFIG_DIR (lwipopts.h + arch/cc.h, default scripts/deps/lwip), BUILD (default build).
set -Eeuo pipefail
trap 'echo "deps: FAILED (line $LINENO: $BASH_COMMAND)" >&2' ERR

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
TOOLCHAINS=${DEPS_TOOLCHAINS:-gnu musl}
LWIP_CONFIG_DIR=${LWIP_CONFIG_DIR:-scripts/deps/lwip}
case $LWIP_CONFIG_DIR in /*) ;; *) LWIP_CONFIG_DIR=$ROOT/$LWIP_CONFIG_DIR ;; esac
# Inner builds (cmake --build, make -f lib.mk) get their own -j; a parent make's jobserver
# is not passed to this script.
unset MAKEFLAGS MFLAGS MAKELEVEL

DEPS=$BUILD/deps
# make -j can start this script twice at once (the deps target and the .ok stamps): the
# second waits for the first, then finds its stamps and only re-runs the smoke tests.
mkdir -p "$DEPS"
exec 9>"$DEPS/.lock"
flock 9
APTDIR=$DEPS/apt
DL=$DEPS/dl
SRC=$DEPS/src
SUITE=trixie

# ---------------------------------------------------------------- pins
# Source package versions in trixie, the upstream tarball each .dsc names, and its sha256
# (copied from the .dsc's Checksums-Sha256; a changed tarball is rejected).
PKGS=(lwip mbedtls libinih yyjson)
declare -A VER ORIG SHA
VER[lwip]=2.2.1+dfsg1-1+deb13u1
ORIG[lwip]=lwip_2.2.1+dfsg1.orig.tar.xz
SHA[lwip]=83729c274c499d3348e9fbbe043a3113f3fa8953e7efddc7c21c7fcbb1f2b7b1
VER[mbedtls]=3.6.6-0.1~deb13u1
ORIG[mbedtls]=mbedtls_3.6.6.orig.tar.bz2
SHA[mbedtls]=8fb65fae8dcae5840f793c0a334860a411f884cc537ea290ce1c52bb64ca007a
VER[libinih]=59-1
ORIG[libinih]=libinih_59.orig.tar.gz
SHA[libinih]=062279922805f5e9a369551a08d5ddb506140fe50774183ffdbb7c22bb97e3f4
VER[yyjson]=0.10.0+ds-1
ORIG[yyjson]=yyjson_0.10.0+ds.orig.tar.xz
SHA[yyjson]=ae6fde69a193e10afab426ef13f113d6903446405f9db9ee98bfb572bd6c961a

# Our own patches on top of a pinned tarball, applied in the order listed (patch -p1, no fuzz:
# a patch that does not apply exactly stops the build). Like Debian's own patches, they
# change the source we build, not what we fetch: the tarball still comes from the
# registry by package name and is checked against its pin first.
#  mbedtls: keyupdate.patch, TLS 1.3 KeyUpdate (RFC 8446 §4.6.3). mbedTLS 3.6 has no
#    KeyUpdate code at all (upstream Mbed-TLS/mbedtls#10781 and #10881 are open), so a
#    client that updates its keys, as any TLS 1.3 peer may at any time, loses its
#    session. The patch is kiln's own, written against 3.6.6; drop it when upstream
#    ships KeyUpdate. Its hash is part of the unpack marker and the build stamp, so a
#    changed patch re-unpacks and rebuilds mbedTLS.
declare -A PATCHES
PATCHES[mbedtls]="scripts/deps/mbedtls/keyupdate.patch"

# Bump when a build recipe below changes, so existing stamps no longer match.
RECIPE=2
# -fPIC: the client SDK links mbedTLS into a shared libkiln.so as well
DEPS_CFLAGS="-O2 -g -fPIC -ffunction-sections -fdata-sections"
INIH_DEFS="-DINI_MAX_LINE=4096"
# The OpenAI API's bodies are read only (responses are written by net/): no writer, no
# JSON5/comment extensions compiled in, so the reader cannot be asked to be lenient.
YYJSON_DEFS="-DYYJSON_DISABLE_WRITER=1 -DYYJSON_DISABLE_NON_STANDARD=1 -DYYJSON_DISABLE_UTILS=1"

T0=$(date +%s.%N)
log() { printf 'deps: %s\n' "$*" >&2; }
die() { printf 'deps: error: %s\n' "$*" >&2; trap - ERR; exit 1; }
need() { "$ROOT/scripts/need.sh" "$@" || die "missing tool (Debian package named above)"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }
sha256() { sha256sum "$1" | cut -d' ' -f1; }

# run_logged LOGFILE WHAT CMD...: run CMD with output to LOGFILE; on failure show its tail.
run_logged() {
  local logf=$1 what=$2; shift 2
  mkdir -p "$(dirname "$logf")"
  if ! "$@" >"$logf" 2>&1; then
    echo "deps: $what failed; last lines of $logf:" >&2
    tail -n 40 "$logf" >&2
    trap - ERR; exit 1
  fi
}

need sha256sum coreutils tar tar xz xz-utils bzip2 bzip2 gzip gzip awk mawk \
     make make gcc gcc ar binutils cmake cmake patch patch

# ---------------------------------------------------------------- private apt configuration
. "$ROOT/scripts/apt_private.sh"

# Write build/deps/apt/{apt.conf,sources.list}: deb-src lines for suite trixie on every main
# Debian archive URI (path ending in /debian; not -security, not third-party) found here.
apt_setup() {
  need apt-get apt apt-config apt gpgv gpgv
  apt_private_setup "$APTDIR" deb-src "$SUITE" main scripts/deps.sh ||
    die "no Debian archive entry (a URI ending in /debian) in this machine's apt sources: cannot derive a deb-src mirror"
}

# fetch PKG...: download the pinned source packages into build/deps/dl/.
fetch() {
  local t p args=()
  t=$(date +%s.%N)
  apt_setup
  for p in "$@"; do args+=("$p=${VER[$p]}"); done
  log "apt-get update (private config, suite $SUITE, $(wc -l <"$APTDIR/sources.list") mirror(s))"
  run_logged "$APTDIR/update.log" "apt-get update (private config $APTDIR/apt.conf)" \
    env APT_CONFIG="$APTDIR/apt.conf" apt-get update
  log "apt-get source --download-only ${args[*]}"
  mkdir -p "$DL"
  # Only the upstream tarballs are used (checked against the pins below). The mirror may
  # lack a package's .dsc or Debian diff while its orig tarball is there (yyjson in trixie,
  # seen on this project's mirror): apt-get then fails, and that is fine as long as
  # every orig tarball arrived.
  if ! ( cd "$DL" && env APT_CONFIG="$APTDIR/apt.conf" apt-get source --download-only "${args[@]}" \
           >"$APTDIR/source.log" 2>&1 ); then
    for p in "$@"; do
      if [ ! -f "$DL/${ORIG[$p]}" ]; then
        echo "deps: apt-get source ${args[*]} failed; last lines of $APTDIR/source.log:" >&2
        tail -n 40 "$APTDIR/source.log" >&2
        die "$p ${VER[$p]}: no ${ORIG[$p]} from the mirror"
      fi
    done
    log "apt-get source: the mirror lacks some .dsc/.debian files (see $APTDIR/source.log);" \
        "every orig tarball arrived and is checked against its pin"
  fi
  log "fetched in $(elapsed "$t")"
}

# ---------------------------------------------------------------- fetch, verify, unpack
declare -A PATCHID
for p in "${!PATCHES[@]}"; do
  for pf in ${PATCHES[$p]}; do [ -f "$pf" ] || die "$p: patch $pf is missing"; done
  # shellcheck disable=SC2086 # a list of paths without spaces
  PATCHID[$p]=$(cat ${PATCHES[$p]} | sha256sum | cut -c1-16)
done
# What an unpacked tree is made of: the tarball's sha256, plus the patches' hash.
unpack_id() { printf '%s%s\n' "${SHA[$1]}" "${PATCHID[$1]:+ patches=${PATCHID[$1]}}"; }

missing=()
for p in "${PKGS[@]}"; do
  f=$DL/${ORIG[$p]}
  if [ -f "$f" ] && [ "$(cat "$SRC/$p/.kiln-unpacked" 2>/dev/null)" = "$(unpack_id "$p")" ]; then
    continue  # unpacked from this very tarball (checked when it was unpacked), patched
  fi
  if [ -f "$f" ] && [ "$(sha256 "$f")" = "${SHA[$p]}" ]; then continue; fi
  missing+=("$p")
done
[ ${#missing[@]} = 0 ] || fetch "${missing[@]}"

for p in "${PKGS[@]}"; do
  f=$DL/${ORIG[$p]} d=$SRC/$p
  [ "$(cat "$d/.kiln-unpacked" 2>/dev/null)" = "$(unpack_id "$p")" ] && continue
  [ -f "$f" ] || die "$p ${VER[$p]}: apt-get source did not produce ${ORIG[$p]} (see $APTDIR/source.log)"
  got=$(sha256 "$f")
  if [ "$got" != "${SHA[$p]}" ]; then
    mv -f "$f" "$f.rejected"
    die "$p: sha256 of ${ORIG[$p]} is $got, pinned ${SHA[$p]}: rejected (kept as $f.rejected)"
  fi
  log "unpack ${ORIG[$p]} (upstream, no Debian patches) -> ${d#"$ROOT"/}"
  rm -rf "$d" && mkdir -p "$d"
  tar -xf "$f" -C "$d" --strip-components=1 --no-same-owner
  for pf in ${PATCHES[$p]:-}; do
    log "patch ${d#"$ROOT"/} with $pf"
    run_logged "$DEPS/log/patch-$p-$(basename "$pf").log" "$pf (on $p ${VER[$p]})" \
      patch -d "$d" -p1 --forward --batch --fuzz=0 -i "$ROOT/$pf"
  done
  unpack_id "$p" >"$d/.kiln-unpacked"
done
[ -f "$SRC/mbedtls/framework/CMakeLists.txt" ] || die "mbedtls: framework/ missing from the orig tarball"

# ---------------------------------------------------------------- build per toolchain
# stamp_ok TC PKG KEY FILE...: the stamp matches KEY and every output FILE exists.
stamp_ok() {
  local s=$BUILD/$1/deps/stamp/$2 key=$3 f; shift 3
  [ "$(cat "$s" 2>/dev/null)" = "$key" ] || return 1
  for f in "$@"; do [ -e "$f" ] || return 1; done
}
stamp_set() { mkdir -p "$BUILD/$1/deps/stamp"; printf '%s\n' "$3" >"$BUILD/$1/deps/stamp/$2"; }

build_mbedtls() {  # TC CC
  need python3 python3
  local tc=$1 cc=$2 out=$BUILD/$1/deps b=$BUILD/$1/deps/build/mbedtls
  rm -rf "$b"
  # Thread-safe crypto state (locks around the RNG and key slots): the client SDK's
  # users may run several connections on several threads. Set in the header itself, so
  # every program compiled against it agrees on the structures' layout.
  python3 "$SRC/mbedtls/scripts/config.py" -f "$SRC/mbedtls/include/mbedtls/mbedtls_config.h" \
    set MBEDTLS_THREADING_C
  python3 "$SRC/mbedtls/scripts/config.py" -f "$SRC/mbedtls/include/mbedtls/mbedtls_config.h" \
    set MBEDTLS_THREADING_PTHREAD
  # mbedtls_platform_set_calloc_free: kilnd gives the loop thread's TLS sessions (record
  # buffers, handshake state) memory from an arena reserved at init (net/tls.c), not malloc
  python3 "$SRC/mbedtls/scripts/config.py" -f "$SRC/mbedtls/include/mbedtls/mbedtls_config.h" \
    set MBEDTLS_PLATFORM_MEMORY
  run_logged "$out/log/mbedtls.log" "mbedtls ($tc) cmake" \
    cmake -S "$SRC/mbedtls" -B "$b" -G "Unix Makefiles" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=None -DCMAKE_C_FLAGS="$DEPS_CFLAGS" \
      -DENABLE_PROGRAMS=OFF -DENABLE_TESTING=OFF -DGEN_FILES=OFF \
      -DMBEDTLS_FATAL_WARNINGS=OFF -DUSE_SHARED_MBEDTLS_LIBRARY=OFF \
      -DUSE_STATIC_MBEDTLS_LIBRARY=ON
  run_logged "$out/log/mbedtls-build.log" "mbedtls ($tc) build" \
    cmake --build "$b" -j "$JOBS"
  rm -rf "$out/include/mbedtls" "$out/include/psa"
  cp -r "$SRC/mbedtls/include/mbedtls" "$SRC/mbedtls/include/psa" "$out/include/"
  cp "$b/library/libmbedtls.a" "$b/library/libmbedx509.a" "$b/library/libmbedcrypto.a" "$out/lib/"
}

build_lwip() {  # TC CC
  local tc=$1 cc=$2 out=$BUILD/$1/deps s=$SRC/lwip srcs
  rm -rf "$out/build/lwip"
  srcs=$(cd "$s" && echo src/core/*.c src/core/ipv4/*.c src/core/ipv6/*.c src/netif/ethernet.c)
  run_logged "$out/log/lwip.log" "lwip ($tc) build" \
    make -f "$ROOT/scripts/deps/lib.mk" -j "$JOBS" LIB="$out/lib/liblwip.a" \
      SRCDIR="$s" OBJDIR="$out/build/lwip" SRCS="$srcs" CC="$cc" \
      CFLAGS="$DEPS_CFLAGS -I$LWIP_CONFIG_DIR -I$s/src/include"
  rm -rf "$out/include/lwip" "$out/include/netif" "$out/include/arch" "$out/include/lwipopts.h"
  cp -r "$s/src/include/lwip" "$s/src/include/netif" "$out/include/"
  mkdir -p "$out/include/arch"
  cp "$LWIP_CONFIG_DIR/lwipopts.h" "$out/include/"
  cp "$LWIP_CONFIG_DIR/arch/cc.h" "$out/include/arch/"
}

build_libinih() {  # TC CC
  local tc=$1 cc=$2 out=$BUILD/$1/deps
  rm -rf "$out/build/inih"
  run_logged "$out/log/inih.log" "inih ($tc) build" \
    make -f "$ROOT/scripts/deps/lib.mk" LIB="$out/lib/libinih.a" \
      SRCDIR="$SRC/libinih" OBJDIR="$out/build/inih" SRCS=ini.c CC="$cc" \
      CFLAGS="$DEPS_CFLAGS $INIH_DEFS"
  cp "$SRC/libinih/ini.h" "$out/include/"
}

build_yyjson() {  # TC CC
  local tc=$1 cc=$2 out=$BUILD/$1/deps
  rm -rf "$out/build/yyjson"
  run_logged "$out/log/yyjson.log" "yyjson ($tc) build" \
    make -f "$ROOT/scripts/deps/lib.mk" LIB="$out/lib/libyyjson.a" \
      SRCDIR="$SRC/yyjson/src" OBJDIR="$out/build/yyjson" SRCS=yyjson.c CC="$cc" \
      CFLAGS="$DEPS_CFLAGS $YYJSON_DEFS"
  # the header must see the same switches as the library (they remove declarations)
  { printf '/* scripts/deps.sh: the switches libyyjson.a was built with */\n'
    for d in $YYJSON_DEFS; do d=${d#-D}; printf '#define %s %s\n' "${d%%=*}" "${d#*=}"; done
    cat "$SRC/yyjson/src/yyjson.h"; } >"$out/include/yyjson.h"
}

declare -A LIBS=(
  [mbedtls]="libmbedtls.a libmbedx509.a libmbedcrypto.a"
  [lwip]="liblwip.a"
  [libinih]="libinih.a"
  [yyjson]="libyyjson.a"
)
lwip_cfg_sha=$(cat "$LWIP_CONFIG_DIR/lwipopts.h" "$LWIP_CONFIG_DIR/arch/cc.h" | sha256sum | cut -c1-16)

for tc in $TOOLCHAINS; do
  case $tc in
    gnu)  cc=gcc ldflags= ;;
    musl) cc=musl-gcc ldflags=-static; need musl-gcc musl-tools ;;
    *) die "unknown toolchain '$tc' (gnu or musl)" ;;
  esac
  out=$BUILD/$tc/deps
  mkdir -p "$out/lib" "$out/include"
  ccver=$("$cc" -dumpfullversion -dumpversion 2>/dev/null | head -n1)
  for p in "${PKGS[@]}"; do
    key="recipe=$RECIPE $p=${VER[$p]} sha=${SHA[$p]} cc=$cc-$ccver cflags=$DEPS_CFLAGS"
    case $p in
      lwip) key+=" config=$lwip_cfg_sha" ;;
      libinih) key+=" defs=$INIH_DEFS" ;;
      yyjson) key+=" defs=$YYJSON_DEFS" ;;
      mbedtls) key+=" platform_memory=1 patches=${PATCHID[mbedtls]}" ;;
    esac
    files=()
    for l in ${LIBS[$p]}; do files+=("$out/lib/$l"); done
    stamp_ok "$tc" "$p" "$key" "${files[@]}" && continue
    rm -f "$out/stamp/$p"
    t=$(date +%s.%N)
    "build_$p" "$tc" "$cc"
    stamp_set "$tc" "$p" "$key"
    log "$tc: built $p ${VER[$p]} in $(elapsed "$t")"
  done

  # Smoke test: one program using all three; rebuilt when it or a library is newer.
  exe=$out/deps_smoke
  if [ ! -x "$exe" ] || [ -n "$(find tests/deps/deps_smoke.c "$out/lib" "$out/include/lwipopts.h" \
        -newer "$exe" -print -quit)" ]; then
    run_logged "$out/log/smoke.log" "deps_smoke ($tc) build" \
      "$cc" -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -I"$out/include" \
        -DKILN_INIH_VERSION="\"${VER[libinih]%-*}\"" tests/deps/deps_smoke.c -o "$exe" \
        -L"$out/lib" -lmbedtls -lmbedx509 -lmbedcrypto -llwip -linih -lyyjson $ldflags
  fi
  if [ "$tc" = musl ] && readelf -l "$exe" 2>/dev/null | grep -q INTERP; then
    die "deps_smoke ($tc) is not a static executable"
  fi
  run_logged "$out/log/smoke-run.log" "deps_smoke ($tc) run" "$exe"
  log "$tc: $(cat "$out/log/smoke-run.log")"
done

log "ok ($(elapsed "$T0"))"
