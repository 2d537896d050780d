#!/usr/bin/env bash
# build.sh: `make image` — the appliance's kernel and initramfs, reproducibly.
#
#   build/image/vmlinuz            Debian's kernel (bookworm linux-image-6.1.*-amd64), as shipped
#   build/image/initramfs.cpio.gz  cpio newc, gzip -n: kiln-init as PID 1, the static musl
#                                  kilnd, its config, the NIC and watchdog modules of that
#                                  kernel, the default model, and the DEVELOPMENT identity
#                                  (TLS key and certificate, tokens): the development image
#                                  that `make run` / qemu/boot boot without a disk. The disk's
#                                  initramfs (image/disk.sh: KILN_IMAGE_IDENTITY=none) carries
#                                  no identity: kiln-flash provisions one (docs/IMAGE.md)
#
# Same inputs, same bytes: every entry has mtime SOURCE_DATE_EPOCH (default 0), uid/gid 0,
# a fixed mode, and the entries are sorted; cpio --reproducible numbers inodes itself and
# gzip -n stores no name or time. The inputs made once and then kept under build/image/
# (the kernel .deb, the development certificates, the token file) are part of "same inputs":
# delete them to make new ones.
#
# Layout of the initramfs (agreed with kiln-init, boot/):
#   /init -> /sbin/init            the kernel runs /init
#   /sbin/init                     kiln-init (build/musl/kiln-init)
#   /bin/kilnd                     build/musl/kilnd (static musl)
#   /etc/kiln/kiln.ini             the image's configuration (below)
#   /etc/kiln/tls/{server.crt,server.key,ca.crt}, /etc/kiln/tokens.txt
#                                  the development identity (KILN_IMAGE_IDENTITY=dev only)
#   /etc/kiln/modules              modules to load, relative to /lib/modules/<ver>/, in
#                                  dependency order (computed here with modinfo -F depends)
#   /lib/modules/<ver>/...         those modules
#   /models/<model file>
#   /proc /sys /dev /run /tmp      empty mount points
# /dev/console comes from the kernel's own built-in initramfs (usr/default_cpio_list), which
# the kernel unpacks before this one, so building needs no mknod (and no root for that).
#
# Environment (all optional):
#   BUILD (build), MODEL (models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   KILND_MUSL (build/musl/kilnd), KILN_INIT (build/musl/kiln-init),
#   KILND (build/gnu/kilnd: makes the certificates on first use)
#   KILN_KERNEL_PKG        a concrete linux-image package instead of linux-image-amd64's choice
#   KILN_IMAGE_OUT         where to write the initramfs (default build/image/initramfs.cpio.gz)
#   KILN_IMAGE_INI_EXTRA   text appended to kiln.ini (e.g. a bad key, for a test variant;
#                          use it with KILN_IMAGE_OUT so the real image is not replaced)
#   KILN_MODULES           the root modules (default "virtio_pci virtio_net i6300esb")
#   KILN_IMAGE_MODEL_DIR   where kiln.ini looks for the model (default /models, in the
#                          initramfs); any other folder leaves the model out of the
#                          initramfs (the disk image keeps it on its data partition)
#   KILN_IMAGE_OVERLAY     a directory whose tree is laid over the initramfs root before it
#                          is archived (image/gpu.sh: the NVIDIA modules, their list
#                          /etc/kiln/modules-gpu, the GSP firmware, the CUDA kilnd and its
#                          libraries); same times, modes 0644/0755 (its executables 0755),
#                          symbolic links kept
#   KILN_IMAGE_IDENTITY    dev (default): the development TLS key, certificate and tokens
#                          in /etc/kiln; none: no private key and no tokens file anywhere in
#                          the archive (the disk's and the bundles' initramfs: the box gets
#                          its identity from the data partition, kiln-flash --identity)
#   SOURCE_DATE_EPOCH      mtime of every entry (default 0)
#   GZIP_LEVEL             1..9 (default 9)
set -euo pipefail
cd "$(dirname "$0")/.."
PATH=$PATH:/usr/sbin:/sbin # modinfo

BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
KILND_MUSL=${KILND_MUSL:-$BUILD/musl/kilnd}
KILN_INIT=${KILN_INIT:-$BUILD/musl/kiln-init}
KILND=${KILND:-$BUILD/gnu/kilnd}
D=$BUILD/image
OUT=${KILN_IMAGE_OUT:-$D/initramfs.cpio.gz}
EPOCH=${SOURCE_DATE_EPOCH:-0}
LEVEL=${GZIP_LEVEL:-9}
ROOTS=${KILN_MODULES:-virtio_pci virtio_net i6300esb}
IDENTITY=${KILN_IMAGE_IDENTITY:-dev}

say() { echo "image: $*" >&2; }
die() { echo "image: error: $*" >&2; exit 1; }
case $IDENTITY in dev | none) ;; *) die "KILN_IMAGE_IDENTITY is dev or none, not '$IDENTITY'" ;; esac

scripts/need.sh cpio cpio modinfo kmod gzip gzip dpkg-deb dpkg apt-get apt strip binutils

for f in "$KILND_MUSL" "$KILN_INIT" "$MODEL" "$KILND"; do
  [ -f "$f" ] || die "$f is missing (make musl / make model / make; kiln-init: boot/*.c)"
done
# Both programs run before any library exists: they must be static.
for f in "$KILND_MUSL" "$KILN_INIT"; do
  if command -v readelf >/dev/null && readelf -l "$f" 2>/dev/null | grep -q 'INTERP'; then
    die "$f is dynamically linked (it names a program interpreter); the image needs static binaries"
  fi
done
mkdir -p "$D"

# ---------------------------------------------------------------- the kernel (cached)
# The .deb is downloaded once and kept: later builds reuse it even when the archive has
# moved on, so the image does not change under us. Never installed on this machine.
deb=$(ls "$D"/linux-image-*-amd64_*.deb 2>/dev/null | LC_ALL=C sort | tail -n 1 || true)
if [ -n "${KILN_KERNEL_PKG:-}" ] && [ -n "$deb" ] && [[ $(basename "$deb") != "${KILN_KERNEL_PKG}"_* ]]; then
  deb=""
fi
if [ -z "$deb" ]; then
  pkg=${KILN_KERNEL_PKG:-}
  if [ -z "$pkg" ]; then
    # linux-image-amd64 is a metapackage; its dependency names the concrete kernel.
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
          awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9].*-amd64$/ {print $2; exit}')
    if [ -z "$pkg" ]; then
      apt-get update -qq >&2 || true
      pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
            awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9].*-amd64$/ {print $2; exit}')
    fi
    [ -n "$pkg" ] || die "cannot resolve linux-image-amd64 to a concrete kernel package (apt sources?)"
  fi
  say "downloading $pkg (apt-get download; not installed)"
  tmp=$(mktemp -d "$D/dl.XXXXXX")
  # apt drops privileges to _apt for downloads; a directory it cannot write only costs a
  # warning, so give it one it can.
  chmod 0777 "$tmp"
  (cd "$tmp" && apt-get download "$pkg" >&2) ||
    { apt-get update -qq >&2 || true; (cd "$tmp" && apt-get download "$pkg" >&2); } ||
    { rm -rf "$tmp"; die "apt-get download $pkg failed"; }
  mv "$tmp"/*.deb "$D"/ && rmdir "$tmp"
  deb=$(ls "$D/${pkg}"_*.deb | LC_ALL=C sort | tail -n 1)
  rm -rf "$D/kernel"
fi
K=$D/kernel
if [ ! -f "$K/.from" ] || [ "$(cat "$K/.from")" != "$(basename "$deb")" ]; then
  say "unpacking $(basename "$deb") into $K"
  rm -rf "$K" && mkdir -p "$K"
  dpkg-deb -x "$deb" "$K"
  basename "$deb" >"$K/.from"
fi
vmlinuz=$(ls "$K"/boot/vmlinuz-* | LC_ALL=C sort | tail -n 1)
VER=${vmlinuz##*/vmlinuz-}
MODDIR=$K/lib/modules/$VER
[ -d "$MODDIR" ] || die "no modules for $VER in $deb"

# ---------------------------------------------------------------- modules, in dependency order
# The .deb has no modules.dep (depmod runs at install time), so ask each module itself.
declare -A PATH_OF=()
while IFS= read -r rel; do
  n=${rel##*/}; n=${n%%.ko*}; n=${n//-/_}
  PATH_OF[$n]=$rel
done < <(cd "$MODDIR" && find kernel -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz' | LC_ALL=C sort)
builtin() { grep -q "/${1}.ko\$" "$MODDIR/modules.builtin" 2>/dev/null ||
            grep -q "/${1//_/-}.ko\$" "$MODDIR/modules.builtin" 2>/dev/null; }
declare -A STATE=()   # 1: being visited, 2: done
ORDER=()
visit() {
  local n=${1//-/_} deps d
  case "${STATE[$n]:-}" in 2) return ;; 1) die "module dependency cycle at $n" ;; esac
  if [ -z "${PATH_OF[$n]:-}" ]; then
    builtin "$n" && { STATE[$n]=2; return; }
    die "module $n: neither a module file nor built into $VER"
  fi
  STATE[$n]=1
  deps=$(modinfo -F depends "$MODDIR/${PATH_OF[$n]}")
  for d in $(tr ',' '\n' <<<"$deps" | LC_ALL=C sort); do visit "$d"; done
  STATE[$n]=2
  ORDER+=("${PATH_OF[$n]}")
}
for r in $ROOTS; do visit "$r"; done

# ---------------------------------------------------------------- made once, then kept
# The development identity: built into the development image (KILN_IMAGE_IDENTITY=dev),
# and what `make disk` provisions onto its test disk (kiln-flash --identity); made even
# for KILN_IMAGE_IDENTITY=none, which only keeps it out of the archive.
if [ ! -f "$D/tls/server.crt" ] || [ ! -f "$D/tls/server.key" ] || [ ! -f "$D/tls/ca.crt" ]; then
  rm -rf "$D/tls"
  "$KILND" certs --dir "$D/tls" --hosts 10.0.2.15,127.0.0.1 >&2
fi
if [ ! -f "$D/tokens.txt" ]; then
  ( umask 077
    printf '# kiln image tokens (development): role token\nuser %s\nadmin %s\n' \
      "user-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')" \
      "admin-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')" >"$D/tokens.txt" )
fi

# ---------------------------------------------------------------- the tree
# The main image is staged in build/image/root (kept: it shows what the image holds); a
# variant (KILN_IMAGE_OUT elsewhere) in a directory of its own, removed at the end.
if [ "$OUT" = "$D/initramfs.cpio.gz" ]; then
  R=$D/root
  rm -rf "$R"
else
  R=$(mktemp -d "$D/root-variant.XXXXXX")
  trap 'rm -rf "$R"' EXIT
fi
mkdir -p "$R"/{bin,sbin,etc/kiln/tls,lib/modules/"$VER",models,proc,sys,dev,run,tmp}
ln -s sbin/init "$R/init"
# kiln-init without its debug sections (mostly mbedcrypto's, ~1.6 MB; the symbols stay)
strip --strip-debug -o "$R/sbin/init" "$KILN_INIT"
cp "$KILND_MUSL" "$R/bin/kilnd"
MODEL_FILE=$(basename "$MODEL")
MODEL_DIR=${KILN_IMAGE_MODEL_DIR:-/models}
[ "$MODEL_DIR" = /models ] && cp "$MODEL" "$R/models/$MODEL_FILE"
if [ "$IDENTITY" = dev ]; then
  cp "$D/tls/server.crt" "$D/tls/server.key" "$D/tls/ca.crt" "$R/etc/kiln/tls/"
  cp "$D/tokens.txt" "$R/etc/kiln/tokens.txt"
fi
: >"$R/etc/kiln/modules"
for rel in "${ORDER[@]}"; do
  mkdir -p "$R/lib/modules/$VER/$(dirname "$rel")"
  cp "$MODDIR/$rel" "$R/lib/modules/$VER/$rel"
  echo "$rel" >>"$R/etc/kiln/modules"
done
cat >"$R/etc/kiln/kiln.ini" <<EOF
; kiln.ini of the image (image/build.sh); keys and ranges: docs/CONFIG.md
[model]
path = $MODEL_DIR/$MODEL_FILE

[engine]
threads = 0
max_seq_len = 1024
kv_pool_mb = 128
; TCG emulates the CPU many times slower than the host: a prefill step takes long
step_timeout_ms = 600000

[net]
driver = packet
interface = eth0
address = 10.0.2.15/24
gateway = 10.0.2.2
listen = 0.0.0.0:8443
metrics_port = 9100
$( [ "$IDENTITY" = dev ] && echo "; the development identity, in this image" ||
   echo "; not in this image: kiln-init puts the provisioned or sealed identity here (docs/IMAGE.md)" )
cert = /etc/kiln/tls/server.crt
key = /etc/kiln/tls/server.key
tokens_file = /etc/kiln/tokens.txt
EOF
if [ -n "${KILN_IMAGE_INI_EXTRA:-}" ]; then
  printf '%s\n' "$KILN_IMAGE_INI_EXTRA" >>"$R/etc/kiln/kiln.ini"
fi

if [ -n "${KILN_IMAGE_OVERLAY:-}" ]; then
  [ -d "$KILN_IMAGE_OVERLAY" ] || die "KILN_IMAGE_OVERLAY=$KILN_IMAGE_OVERLAY is not a directory"
  cp -R --no-preserve=all "$KILN_IMAGE_OVERLAY"/. "$R"/
fi

# Fixed modes and times: nothing of this machine (umask, clock) gets into the archive.
find "$R" -type d -exec chmod 0755 {} +
find "$R" -type f -exec chmod 0644 {} +
chmod 0755 "$R/sbin/init" "$R/bin/kilnd"
# The overlay's programs (image/gpu.sh: the CUDA kilnd and its loader) stay executable.
if [ -n "${KILN_IMAGE_OVERLAY:-}" ]; then
  (cd "$KILN_IMAGE_OVERLAY" && find . -type f -perm -u+x -printf '%P\n') | while IFS= read -r f; do chmod 0755 "$R/$f"; done
fi
chmod 1777 "$R/tmp"
[ "$IDENTITY" = none ] || chmod 0600 "$R/etc/kiln/tls/server.key" "$R/etc/kiln/tokens.txt"
find "$R" -exec touch -h -d "@$EPOCH" {} +

# ---------------------------------------------------------------- archive
mkdir -p "$(dirname "$OUT")"
tmp=$OUT.tmp
(cd "$R" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
   cpio -o -H newc --reproducible -R 0:0 --quiet) | gzip -n -"$LEVEL" >"$tmp"
mv "$tmp" "$OUT"

if [ "$OUT" = "$D/initramfs.cpio.gz" ]; then
  cp "$vmlinuz" "$D/vmlinuz"
  echo "$VER" >"$D/kernel.version"
  (cd "$D" && sha256sum vmlinuz initramfs.cpio.gz >SHA256SUMS)
fi
say "kernel $VER; modules: ${ORDER[*]##*/}"
say "$OUT: $(stat -c %s "$OUT") bytes ($(du -sk "$R" | cut -f1) KiB unpacked)"
