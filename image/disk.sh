#!/usr/bin/env bash
# disk.sh: `make disk` — the flashable GPT disk image, and the signed slot bundle in it.
#
#   build/disk/kiln.img        GPT: ESP (systemd-boot, loader.conf, the UKI of slot A),
#                              slot A (this version's signed bundle), slot B (empty), and the
#                              data partition (ext4: the model, persistent config)
#   build/disk/kiln-vN.kimg    the signed slot bundle of version N (manifest + UKI): what
#                              kiln-flash writes into a slot (docs/IMAGE.md)
#   build/disk/uki-vN.efi      the UKI: systemd's stub + os-release + command line + Debian's
#                              kernel + the disk's initramfs (no model: it is on the data
#                              partition, /data/models; no identity: no TLS key, no tokens),
#                              signed for Secure Boot with the db key
#   build/disk/kiln-ovmf-vars.fd  (beside KILN_DISK_OUT) OVMF's variable store with the Secure Boot keys enrolled
#                              and Secure Boot on (image/secureboot.sh vars); the keys'
#                              .esl/.auth files for real firmware are in the key directory
#
# Nothing here carries the box's identity (TLS key, certificate, tokens): the operator's
# goes onto the data partition when flashing (kiln-flash install ... --identity DIR) and
# kiln-init seals it to the TPM at the first boot; `make disk` makes the test disk
# build/disk/kiln-dev.img so, with the development identity (docs/IMAGE.md).
#
# Same inputs, same bytes: fixed GUIDs and volume ids, every time SOURCE_DATE_EPOCH (default
# 0), sorted trees, deterministic ECDSA, RSA Authenticode signatures whose signing time
# is SOURCE_DATE_EPOCH (image/secureboot.sh sign). No loop devices, no mounting: sgdisk, mkfs.vfat -C
# + mtools, mkfs.ext4 -d, dd. systemd-boot and the stub come from Debian's systemd-boot-efi,
# downloaded (apt-get download) and unpacked, never installed (installing it upgrades
# systemd on this machine).
#
# Environment (all optional): BUILD, MODEL, KILN_VERSION (1), KILN_KEY (BUILD/keys/signing.key),
#   KILN_DISK_OUT (BUILD/disk/kiln.img), KILN_BUNDLE_ONLY=1 (only the bundle and its UKI:
#   an update), KILN_IMAGE_INI_EXTRA (passed to build.sh: a test variant),
#   KILN_CMDLINE_EXTRA (appended to the UKI's command line), SOURCE_DATE_EPOCH,
#   KILN_SB_KEYS (BUILD/keys/secureboot: the dev Secure Boot key set, made there when missing;
#   an operator's directory needs db.key and db.crt, and PK.crt, KEK.crt, guid for the
#   variable store), KILN_DISK_GPU=1 (below), KILN_DATA_MB (the data partition's size;
#   default: the layout's below, or what the model needs when that is more).
#
# KILN_DISK_GPU=1: `make disk-gpu`, the same disk for a GPU server, under BUILD/disk-gpu/
# (the same names: kiln.img, kiln-vN.kimg, uki-vN.efi, ...). Its initramfs is make
# image-gpu's (image/gpu.sh's overlay, BUILD/gpu/overlay: the NVIDIA modules, GSP firmware,
# the CUDA kilnd, its glibc and libcuda) and its data partition also holds cuBLAS, from
# BUILD/image-gpu/data/lib/cuda, as /data/lib/cuda. Larger partitions (the layout below).
set -euo pipefail
cd "$(dirname "$0")/.."
PATH=$PATH:/usr/sbin:/sbin

BUILD=${BUILD:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
VERSION=${KILN_VERSION:-1}
KEY=${KILN_KEY:-$BUILD/keys/signing.key}
GPU=${KILN_DISK_GPU:-0}
D=$BUILD/disk
[ "$GPU" = 1 ] && D=$BUILD/disk-gpu
OUT=${KILN_DISK_OUT:-$D/kiln.img}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
EPOCH=$SOURCE_DATE_EPOCH
KIMG=$BUILD/gnu/kiln-image

say() { echo "disk: $*" >&2; }
die() { echo "disk: error: $*" >&2; exit 1; }

scripts/need.sh sgdisk gdisk mcopy mtools mkfs.vfat dosfstools mkfs.ext4 e2fsprogs objcopy binutils \
  dpkg-deb dpkg apt-get apt
[[ $VERSION =~ ^[1-9][0-9]{0,8}$ ]] || die "KILN_VERSION must be a number from 1"
[ -x "$KIMG" ] || die "$KIMG is missing (make image-tools)"
[ -f "$KEY" ] || die "$KEY is missing (make $BUILD/keys/pubkey.h makes one)"
mkdir -p "$D" "$BUILD/disk"
# Secure Boot: the dev key set is made on first use; an operator's is used as it is.
SBKEYS=${KILN_SB_KEYS:-$BUILD/keys/secureboot}
[ "$SBKEYS" != "$BUILD/keys/secureboot" ] || BUILD=$BUILD image/secureboot.sh keys "$SBKEYS"
[ -f "$SBKEYS/db.key" ] && [ -f "$SBKEYS/db.crt" ] || die "$SBKEYS has no db.key and db.crt (image/secureboot.sh keys)"

# ---------------------------------------------------------------- layout (MiB)
# GPT partition names are how kiln-init and kiln-flash find them.
ESP_MB=64 SLOT_MB=64 DATA_MB=160
# The GPU disk: its UKI is ~6x the CPU one's (the NVIDIA modules, GSP firmware, the CUDA
# kilnd's glibc and libcuda; docs/IMAGE.md has the figures). A slot holds one bundle, with
# room for a later driver's larger one; the ESP holds systemd-boot and two UKIs (the running
# slot's and the other's, the fallback), and a network update's temporary copy of the new
# one beside them; the data partition holds cuBLAS (~540 MB) beside the model and config.
if [ "$GPU" = 1 ]; then ESP_MB=512 SLOT_MB=256 DATA_MB=1024; fi
DISK_GUID=6b696c6e-0000-4000-8000-000000000000
ESP_TYPE=C12A7328-F81F-11D2-BA4B-00A0C93EC93B
SLOT_TYPE=6b696c6e-736c-4f74-8000-000000000001   # kiln slot (raw signed bundle)
DATA_TYPE=0FC63DAF-8483-4772-8E79-3D69D8477DE4   # Linux filesystem
VOLID=6b696c6e
DATA_UUID=6b696c6e-6461-4461-8000-000000000003

# ---------------------------------------------------------------- systemd-boot and the stub (cached)
# One cache for both disks: BUILD/disk's.
SBD=$BUILD/disk
SB=$SBD/systemd-boot
if [ ! -f "$SB/.ok" ]; then
  rm -rf "$SB" && mkdir -p "$SB"
  deb=$(ls "$SBD"/systemd-boot-efi_*.deb 2>/dev/null | LC_ALL=C sort | tail -n 1 || true)
  if [ -z "$deb" ]; then
    tmp=$(mktemp -d "$SBD/dl.XXXXXX"); chmod 0777 "$tmp"
    say "downloading systemd-boot-efi (apt-get download; not installed)"
    (cd "$tmp" && apt-get download systemd-boot-efi >&2) ||
      { apt-get update -qq >&2 || true; (cd "$tmp" && apt-get download systemd-boot-efi >&2); } ||
      { rm -rf "$tmp"; die "apt-get download systemd-boot-efi failed"; }
    mv "$tmp"/*.deb "$SBD"/ && rmdir "$tmp"
    deb=$(ls "$SBD"/systemd-boot-efi_*.deb | LC_ALL=C sort | tail -n 1)
  fi
  dpkg-deb -x "$deb" "$SB/x"
  cp "$SB/x/usr/lib/systemd/boot/efi/linuxx64.efi.stub" "$SB/x/usr/lib/systemd/boot/efi/systemd-bootx64.efi" "$SB/"
  rm -rf "$SB/x"
  basename "$deb" >"$SB/.ok"
fi

# ---------------------------------------------------------------- the initramfs (no model)
MODEL_FILE=$(basename "$MODEL")
INITRD=$D/initramfs-v$VERSION.cpio.gz
# The GPU disk: image/gpu.sh's tree over the root, as make image-gpu lays it over its image.
OVERLAY= DATALIB=
if [ "$GPU" = 1 ]; then
  OVERLAY=$BUILD/gpu/overlay DATALIB=$BUILD/image-gpu/data/lib/cuda
  [ -f "$OVERLAY/etc/kiln/gpu-driver" ] || die "no $OVERLAY (make image-gpu first)"
  grep -q '^cuda_kilnd=/bin/kilnd-cuda' "$OVERLAY/etc/kiln/gpu-driver" ||
    die "$OVERLAY has no CUDA kilnd (make image-gpu with nvcc here: make cuda-img)"
  [ -e "$DATALIB/libcublas.so.12" ] || die "no cuBLAS in $DATALIB (make image-gpu)"
fi
# The disk's modules: the image's, plus the block device and the filesystems of the data
# partition (ext4) and the ESP (vfat, for blessing a slot), and efivarfs (which entry
# systemd-boot booted).
KILN_MODULES="virtio_pci virtio_net i6300esb virtio_blk ext4 crc32c_generic vfat nls_cp437 nls_ascii efivarfs" \
KILN_IMAGE_OUT=$INITRD KILN_IMAGE_MODEL_DIR=/data/models KILN_IMAGE_IDENTITY=none \
KILN_IMAGE_INI_EXTRA="${KILN_IMAGE_INI_EXTRA:-}" KILN_IMAGE_OVERLAY=$OVERLAY BUILD=$BUILD MODEL=$MODEL image/build.sh
# build.sh unpacked the kernel it used into BUILD/image/kernel.
VMLINUZ=$(ls "$BUILD"/image/kernel/boot/vmlinuz-* 2>/dev/null | LC_ALL=C sort | tail -n 1 || true)
[ -n "$VMLINUZ" ] || die "no kernel under $BUILD/image/kernel (image/build.sh)"

# ---------------------------------------------------------------- the UKI
UKI=$D/uki-v$VERSION.efi
W=$(mktemp -d "$D/work.XXXXXX")
trap 'rm -rf "$W"' EXIT
printf 'ID=kiln\nNAME="kiln"\nPRETTY_NAME="kiln %s"\nVERSION_ID=%s\nIMAGE_ID=kiln\nIMAGE_VERSION=%s\n' \
  "$VERSION" "$VERSION" "$VERSION" >"$W/osrel"
printf 'console=ttyS0 quiet panic=-1%s' "${KILN_CMDLINE_EXTRA:+ $KILN_CMDLINE_EXTRA}" >"$W/cmdline"
# Each section on the next 4 KiB boundary after the stub's last one (ImageBase is 0 in
# systemd's stub: VMAs are offsets).
end=0
while read -r idx name size vma _; do
  [[ $idx =~ ^[0-9]+$ ]] || continue
  e=$(( 0x$vma + 0x$size )); [ $e -gt $end ] && end=$e
done < <(objdump -h "$SB/linuxx64.efi.stub")
[ $end -gt 0 ] || die "cannot read the stub's sections (objdump -h)"
args=()
for s in osrel:"$W/osrel" cmdline:"$W/cmdline" linux:"$VMLINUZ" initrd:"$INITRD"; do
  name=${s%%:*} file=${s#*:}
  at=$(( (end + 0xfff) / 0x1000 * 0x1000 ))
  args+=(--add-section ".$name=$file" --change-section-vma ".$name=$(printf 0x%x "$at")")
  end=$(( at + $(stat -c %s "$file") ))
done
objcopy "${args[@]}" "$SB/linuxx64.efi.stub" "$UKI.tmp"
# objcopy stamps the PE header with the time of day: put SOURCE_DATE_EPOCH there, and 0 in
# the checksum that covered it (UEFI does not check it).
pe=$(od -An -tu4 -j 60 -N 4 "$UKI.tmp" | tr -d ' ')
le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(( $1 & 255 )) $(( $1 >> 8 & 255 )) $(( $1 >> 16 & 255 )) $(( $1 >> 24 & 255 )); }
printf "$(le32 "$EPOCH")" | dd of="$UKI.tmp" bs=1 seek=$((pe + 8)) conv=notrunc status=none
printf "$(le32 0)" | dd of="$UKI.tmp" bs=1 seek=$((pe + 88)) conv=notrunc status=none
# Signed with the db key (Authenticode, sbsign): what the bundle carries, so what either
# writer (kiln-flash, a network update) puts on the ESP is the signed UKI.
BUILD=$BUILD image/secureboot.sh sign "$SBKEYS" "$UKI.tmp" "$UKI"
rm -f "$UKI.tmp"

# ---------------------------------------------------------------- the signed bundle
BUNDLE=$D/kiln-v$VERSION.kimg
"$KIMG" sign --key "$KEY" --version "$VERSION" --part uki="$UKI" --out "$BUNDLE" --manifest "$D/kiln-v$VERSION.manifest"
[ "$(stat -c %s "$BUNDLE")" -le $((SLOT_MB << 20)) ] || die "the bundle is larger than a slot ($SLOT_MB MiB)"
if [ "${KILN_BUNDLE_ONLY:-0}" = 1 ]; then
  say "$BUNDLE: version $VERSION ($(stat -c %s "$BUNDLE") bytes)"
  exit 0
fi

# ---------------------------------------------------------------- the ESP (FAT32, no mount)
mkdir -p "$W/esp/EFI/BOOT" "$W/esp/EFI/Linux" "$W/esp/loader"
BUILD=$BUILD image/secureboot.sh sign "$SBKEYS" "$SB/systemd-bootx64.efi" "$W/esp/EFI/BOOT/BOOTX64.EFI"
# No default: systemd-boot orders the UKIs by their os-release version, newest first, and a
# UKI whose boot tries ran out (kiln-b+0-3.efi) after every other one: the fallback.
printf 'timeout 0\neditor no\nauto-entries no\nauto-firmware no\nconsole-mode keep\n' >"$W/esp/loader/loader.conf"
cp "$UKI" "$W/esp/EFI/Linux/kiln-a.efi"
# FAT cannot hold times before 1980: the ESP's files get 1980-01-01 or SOURCE_DATE_EPOCH.
FAT_EPOCH=$(( EPOCH > 315532800 ? EPOCH : 315532800 ))
find "$W/esp" -exec touch -h -d "@$FAT_EPOCH" {} +
rm -f "$W/esp.img"
mkfs.vfat -C -F 32 -n KILN-ESP -i "$VOLID" --invariant "$W/esp.img" $((ESP_MB * 1024)) >/dev/null
export MTOOLS_SKIP_CHECK=1
mcopy -s -m -i "$W/esp.img" "$W/esp/EFI" "$W/esp/loader" ::/

# ---------------------------------------------------------------- the data partition (ext4)
mkdir -p "$W/data/models" "$W/data/config"
cp "$MODEL" "$W/data/models/$MODEL_FILE"
# cuBLAS: hard links into the staging tree where the file system allows (540 MB); kiln-init
# puts /data/lib/cuda on the CUDA kilnd's library path when it is there.
if [ -n "$DATALIB" ]; then
  mkdir -p "$W/data/lib"
  cp -al "$DATALIB" "$W/data/lib/cuda" 2>/dev/null || { rm -rf "$W/data/lib/cuda"; cp -a "$DATALIB" "$W/data/lib/cuda"; }
fi
# Its size: the layout's, unless the model (a real one is GBs) and cuBLAS need more: then
# what they hold plus 6% (ext4's inode tables, 1.6%, and its journal, up to 1 GiB past
# 16 GiB) and 48 MiB for config, identity and what a box writes. KILN_DATA_MB sets it.
content_mb=$(( ($(du -sb --apparent-size "$W/data" | cut -f1) + (1 << 20) - 1) >> 20 ))
need_mb=$(( content_mb + content_mb * 6 / 100 + 48 ))
[ "$need_mb" -le "$DATA_MB" ] || DATA_MB=$need_mb
DATA_MB=${KILN_DATA_MB:-$DATA_MB}
[[ $DATA_MB =~ ^[1-9][0-9]{0,7}$ ]] || die "KILN_DATA_MB must be a size in MiB"
[ "$DATA_MB" -ge "$content_mb" ] || die "the data partition ($DATA_MB MiB) is smaller than what it holds ($content_mb MiB)"
say "data partition: $DATA_MB MiB (it holds $content_mb MiB: the model, config${DATALIB:+, cuBLAS})"
find "$W/data" -exec touch -h -d "@$EPOCH" {} +
E2FSPROGS_FAKE_TIME=$(( EPOCH > 0 ? EPOCH : 1 )) mkfs.ext4 -q -F -L kiln-data -U "$DATA_UUID" -E "hash_seed=$DATA_UUID,root_owner=0:0" -b 4096 \
  -d "$W/data" "$W/data.img" "${DATA_MB}M" >/dev/null
# mkfs.ext4 -d copies each file's ctime, which is when it was staged here (touch cannot
# set it): set every inode's times to SOURCE_DATE_EPOCH (debugfs rewrites the checksums).
{ for f in / /lost+found $(cd "$W/data" && find . -mindepth 1 | LC_ALL=C sort | sed 's|^\.||'); do
    for t in atime ctime mtime crtime; do echo "set_inode_field $f $t @$EPOCH"; echo "set_inode_field $f ${t}_extra 0"; done
  done; } >"$W/times.debugfs"
debugfs -w -f "$W/times.debugfs" "$W/data.img" >/dev/null 2>"$W/debugfs.err" ||
  { cat "$W/debugfs.err" >&2; die "debugfs (fixing the data partition's times) failed"; }

# ---------------------------------------------------------------- GPT and assembly
rm -f "$OUT.tmp"
total=$((1 + ESP_MB + 2 * SLOT_MB + DATA_MB + 1))
truncate -s "${total}M" "$OUT.tmp"
sgdisk -U "$DISK_GUID" \
  -n "1:1M:+${ESP_MB}M" -t "1:$ESP_TYPE" -c 1:kiln-esp -u "1:6b696c6e-6573-4570-8000-000000000001" \
  -n "2:0:+${SLOT_MB}M" -t "2:$SLOT_TYPE" -c 2:kiln-a -u "2:6b696c6e-736c-4f61-8000-00000000000a" \
  -n "3:0:+${SLOT_MB}M" -t "3:$SLOT_TYPE" -c 3:kiln-b -u "3:6b696c6e-736c-4f62-8000-00000000000b" \
  -n "4:0:+${DATA_MB}M" -t "4:$DATA_TYPE" -c 4:kiln-data -u "4:$DATA_UUID" \
  "$OUT.tmp" >/dev/null
put() { dd if="$1" of="$OUT.tmp" bs=1M seek="$2" conv=notrunc,sparse status=none; }
put "$W/esp.img" 1
put "$BUNDLE" $((1 + ESP_MB))
put "$W/data.img" $((1 + ESP_MB + 2 * SLOT_MB))
mv "$OUT.tmp" "$OUT"
# The variable store to enrol (OVMF; real firmware takes SBKEYS' .auth files: docs/IMAGE.md).
if [ -f "$SBKEYS/PK.crt" ] && [ -f "$SBKEYS/KEK.crt" ] && [ -s "$SBKEYS/guid" ]; then
  BUILD=$BUILD image/secureboot.sh vars "$SBKEYS" "$(dirname "$OUT")/$(basename "$OUT" .img)-ovmf-vars.fd"
else
  say "$SBKEYS has no PK/KEK: no variable store made"
fi
# each file named in its own folder (KILN_DISK_OUT may be elsewhere: tests/image/repro_test.sh)
{ (cd "$(dirname "$OUT")" && sha256sum "$(basename "$OUT")"); (cd "$(dirname "$BUNDLE")" && sha256sum "$(basename "$BUNDLE")"); } >"$OUT.sha256.tmp"
mv "$OUT.sha256.tmp" "$OUT.sha256"
say "$OUT: ${total} MiB; slot A version $VERSION; UKI $(stat -c %s "$UKI") bytes; $(cut -c1-16 "$OUT.sha256" | head -n 1)"
