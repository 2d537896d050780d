#!/usr/bin/env bash
# run.sh: `make qemu` — boot the appliance image (build/image/{vmlinuz,initramfs.cpio.gz},
# from `make image`) in QEMU, the serial console on this terminal.
#
# KVM when /dev/kvm is usable, else TCG (QEMU falls back by itself: -accel kvm -accel tcg).
# The guest gets 2 CPUs and 2 GiB, an i6300esb watchdog (kiln-init pets it), and a
# virtio-net NIC on QEMU's user network (the guest is 10.0.2.15, the gateway 10.0.2.2);
# the host reaches kilnd through forwarded ports on 127.0.0.1:
#   127.0.0.1:$KILN_PORT (8443)          -> 10.0.2.15:8443  TLS line protocol
#   127.0.0.1:$KILN_METRICS_PORT (9100)  -> 10.0.2.15:9100  /metrics, /healthz
# -no-reboot: a guest reboot or poweroff ends QEMU (status 0), as does a watchdog reset.
# Leave QEMU: the console's `poweroff`, or Ctrl-A x.
#
# Environment:
#   KILN_KERNEL, KILN_INITRD   the images (default build/image/vmlinuz, initramfs.cpio.gz)
#   KILN_PORT, KILN_METRICS_PORT, KILN_HOSTFWD_ADDR (127.0.0.1)
#   KILN_CMDLINE               appended to "console=ttyS0 quiet" (e.g. kiln.test=1)
#   KILN_ACCEL                 kvm, tcg, or auto (default: kvm when /dev/kvm exists, else tcg)
#   KILN_QEMU_MEM (2048), KILN_QEMU_SMP (2)
#   KILN_QEMU_CPU              QEMU -cpu model (default max: all the accelerator offers;
#                              under TCG that is AVX2 + FMA but no AVX-512)
#   KILN_SERIAL                a QEMU -serial backend instead of this terminal
#                              (e.g. unix:/tmp/kiln.sock,server=on,wait=off)
#   KILN_DISK                  boot this GPT disk image (`make disk`) through UEFI instead:
#                              OVMF firmware, the disk on virtio-blk (written in place), no
#                              -kernel; KILN_OVMF_VARS names the writable UEFI variable store
#                              (default: a fresh copy of OVMF's template next to the disk)
#   KILN_SECBOOT=1             with KILN_DISK: OVMF's Secure Boot build (OVMF_CODE_4M.secboot.fd:
#                              SMM, so the q35 machine with smm=on and a secure pflash);
#                              KILN_OVMF_VARS then defaults to a fresh copy of the enrolled
#                              store make disk wrote beside the disk (kiln-ovmf-vars.fd)
#   KILN_TPM_SOCK              a TPM 2.0 on the TIS interface: the control socket of an swtpm
#                              the caller started (swtpm socket --tpm2 --tpmstate dir=D
#                              --ctrl type=unixio,path=SOCK); kiln-init measures the slot into it
# Extra arguments are passed to QEMU as they are.
set -euo pipefail
cd "$(dirname "$0")/.."

KERNEL=${KILN_KERNEL:-build/image/vmlinuz}
INITRD=${KILN_INITRD:-build/image/initramfs.cpio.gz}
PORT=${KILN_PORT:-8443}
METRICS_PORT=${KILN_METRICS_PORT:-9100}
FWD_ADDR=${KILN_HOSTFWD_ADDR:-127.0.0.1}
MEM=${KILN_QEMU_MEM:-2048}
SMP=${KILN_QEMU_SMP:-2}
CPU=${KILN_QEMU_CPU:-max}
CMDLINE="console=ttyS0 quiet${KILN_CMDLINE:+ $KILN_CMDLINE}"

BOOT=(-kernel "$KERNEL" -initrd "$INITRD" -append "$CMDLINE")
if [ -n "${KILN_DISK:-}" ]; then
  [ -f "$KILN_DISK" ] || { echo "qemu: $KILN_DISK is missing: run 'make disk' first" >&2; exit 1; }
  scripts/need.sh /usr/share/OVMF/OVMF_CODE_4M.fd ovmf
  CODE=/usr/share/OVMF/OVMF_CODE_4M.fd TEMPLATE=/usr/share/OVMF/OVMF_VARS_4M.fd
  VARS=${KILN_OVMF_VARS:-$KILN_DISK.vars}
  BOOT=()
  if [ "${KILN_SECBOOT:-0}" = 1 ]; then
    # The Secure Boot build keeps its variables in SMM: without smm=on and a secure flash
    # it stops before the boot manager.
    CODE=/usr/share/OVMF/OVMF_CODE_4M.secboot.fd
    TEMPLATE=$(dirname "$KILN_DISK")/$(basename "$KILN_DISK" .img)-ovmf-vars.fd
    VARS=${KILN_OVMF_VARS:-$KILN_DISK.sbvars}
    [ -f "$VARS" ] || [ -f "$TEMPLATE" ] || { echo "qemu: $TEMPLATE is missing: run 'make disk' first" >&2; exit 1; }
    BOOT=(-machine q35,smm=on -global driver=cfi.pflash01,property=secure,value=on)
  fi
  scripts/need.sh "$CODE" ovmf
  [ -f "$VARS" ] || cp "$TEMPLATE" "$VARS"
  BOOT+=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$CODE"
         -drive "if=pflash,format=raw,unit=1,file=$VARS"
         -drive "if=virtio,format=raw,file=$KILN_DISK")
else
  for f in "$KERNEL" "$INITRD"; do
    [ -f "$f" ] || { echo "qemu: $f is missing: run 'make image' first" >&2; exit 1; }
  done
fi
# need.sh installs with --no-install-recommends: the recommends pull in ~170 packages a
# headless boot never uses.
scripts/need.sh qemu-system-x86_64 qemu-system-x86

# Acceleration. auto: KVM when /dev/kvm exists and the CPU shows vmx or svm. Some sandboxes
# have a /dev/kvm that opens but cannot run a guest (QEMU aborts setting MSRs, so its own
# "-accel kvm -accel tcg" fallback does not help); their CPUs show no vmx/svm.
case "${KILN_ACCEL:-auto}" in
  auto) if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qw -e vmx -e svm /proc/cpuinfo; then
          ACCEL=(-accel kvm); else ACCEL=(-accel tcg); fi ;;
  kvm) ACCEL=(-accel kvm) ;;
  tcg) ACCEL=(-accel tcg) ;;
  *) echo "qemu: KILN_ACCEL must be auto, kvm or tcg" >&2; exit 2 ;;
esac

TPM=()
if [ -n "${KILN_TPM_SOCK:-}" ]; then
  TPM=(-chardev "socket,id=chrtpm,path=$KILN_TPM_SOCK" -tpmdev emulator,id=tpm0,chardev=chrtpm
       -device tpm-tis,tpmdev=tpm0)
fi

SERIAL=(-nographic)
if [ -n "${KILN_SERIAL:-}" ]; then
  SERIAL=(-display none -monitor none -serial "$KILN_SERIAL")
fi

NETDEV="user,id=n0,net=10.0.2.0/24"
NETDEV+=",hostfwd=tcp:$FWD_ADDR:$PORT-10.0.2.15:8443"
NETDEV+=",hostfwd=tcp:$FWD_ADDR:$METRICS_PORT-10.0.2.15:9100"

# -cpu max: every feature the accelerator can give (under KVM: the host's), so kilnd's
# run-time choice of SIMD kernels sees what the machine has.
# romfile= (empty) on the NIC: no iPXE option ROM, ~2 s less under TCG.
exec qemu-system-x86_64 \
  "${ACCEL[@]}" -cpu "$CPU" -m "$MEM" -smp "$SMP" \
  -no-reboot "${SERIAL[@]}" \
  "${BOOT[@]}" \
  -netdev "$NETDEV" -device virtio-net-pci,netdev=n0,romfile= \
  -device i6300esb "${TPM[@]}" \
  "$@"
