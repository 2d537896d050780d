#!/usr/bin/env bash
# passthrough.sh: boot the appliance image with KVM and a real GPU handed to the guest with
# VFIO, for hardware tests on a machine that has one.
#
#   qemu/passthrough.sh [--check-only] PCI_ADDRESS [PCI_ADDRESS...] [-- QEMU_ARGS...]
#
#   PCI_ADDRESS   the GPU, as lspci shows it: 0000:41:00.0 or 41:00.0. More addresses pass
#                 more functions or devices (the GPU's audio function, a second GPU).
#   --check-only  print what was found and what is missing, change nothing, boot nothing;
#                 exit 0 when the machine is ready to boot, 1 when not.
#
# Before QEMU starts, every check below must pass; each failure says how to fix it:
#   1. the device exists (sysfs) and what it is
#   2. KVM: /dev/kvm usable, the CPU has VT-x/AMD-V (vmx/svm)
#   3. the IOMMU is on: /sys/kernel/iommu_groups is populated (dmesg shows DMAR/AMD-Vi)
#   4. the device's IOMMU group: every member is bound to vfio-pci (VFIO hands over a whole
#      group or nothing; PCI bridges in the group may keep their driver), and the group's
#      /dev/vfio/N node exists
#   5. memory: VFIO pins all guest RAM; RLIMIT_MEMLOCK must allow it (root: unlimited)
# This script never binds or unbinds drivers itself: taking a device from its driver can
# take the console or the disk controller with it. It prints the commands instead.
#
# QEMU: q35, KVM, -cpu host with the host's physical address bits (a GPU's 64-bit BARs can
# be tens of GiB: the guest must be able to address them, and the 64-bit PCI hole is sized
# from the devices' BARs), the image of `make image` (kernel, initramfs), the serial
# console on this terminal, the i6300esb watchdog, virtio-net with the same forwarded ports
# as qemu/run.sh. A CPU image runs as is (the GPU is just present); a CUDA image
# (kilnd glibc + the NVIDIA modules) uses it.
#
# Environment: KILN_KERNEL, KILN_INITRD, KILN_PORT (8443), KILN_METRICS_PORT (9100),
# KILN_CMDLINE, KILN_QEMU_MEM (MiB, default 16384), KILN_QEMU_SMP (default 8).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

CHECK_ONLY=0
ADDRS=()
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --check-only) CHECK_ONLY=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    -*) echo "passthrough: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) ADDRS+=("$1") ;;
  esac
  shift
done
[ ${#ADDRS[@]} -gt 0 ] || { echo "usage: qemu/passthrough.sh [--check-only] PCI_ADDRESS [...] [-- QEMU_ARGS]" >&2; exit 2; }

KERNEL=${KILN_KERNEL:-build/image/vmlinuz}
INITRD=${KILN_INITRD:-build/image/initramfs.cpio.gz}
PORT=${KILN_PORT:-8443}
METRICS_PORT=${KILN_METRICS_PORT:-9100}
MEM=${KILN_QEMU_MEM:-16384}
SMP=${KILN_QEMU_SMP:-8}
CMDLINE="console=ttyS0 quiet${KILN_CMDLINE:+ $KILN_CMDLINE}"
# Where sysfs and the VFIO nodes are: only a test of this script changes them.
SYS=${KILN_SYSFS:-/sys}
VFIO_DIR=${KILN_VFIO_DIR:-/dev/vfio}

PROBLEMS=0
ok()   { echo "  ok    $*"; }
info() { echo "        $*"; }
bad()  { echo "  FAIL  $*"; PROBLEMS=$((PROBLEMS + 1)); }
warn() { echo "  warn  $*"; }

# 0000:41:00.0 from 41:00.0; anything else is refused (it ends up in sysfs paths).
norm_addr() {
  local a=${1,,}
  [[ $a =~ ^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]] && a=0000:$a
  [[ $a =~ ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]] || return 1
  echo "$a"
}

describe() { # a device in one line: lspci when there, sysfs ids otherwise
  local d=$SYS/bus/pci/devices/$1 l=""
  command -v lspci >/dev/null && l=$(lspci -nns "$1" 2>/dev/null | cut -d' ' -f2- | head -n 1)
  if [ -n "$l" ]; then echo "$l"
  else echo "vendor $(cat "$d/vendor") device $(cat "$d/device") class $(cat "$d/class")"; fi
}

driver_of() { # the bound driver's name, or "" when none
  local l=$SYS/bus/pci/devices/$1/driver
  [ -e "$l" ] && basename "$(readlink -f "$l")" || echo ""
}

# A bridge (header type 1 or 2, not 0) may stay with its driver: VFIO allows that.
is_bridge() {
  local cfg=$SYS/bus/pci/devices/$1/config ht
  ht=$(od -An -tx1 -j14 -N1 "$cfg" 2>/dev/null | tr -d ' ')
  [ -n "$ht" ] && [ $(( 0x$ht & 0x7f )) -ne 0 ]
}

bind_help() { # how to hand one device to vfio-pci
  local a=$1 cur=$2 ids
  ids="$(sed 's/^0x//' "$SYS/bus/pci/devices/$a/vendor"):$(sed 's/^0x//' "$SYS/bus/pci/devices/$a/device")"
  info "to bind $a to vfio-pci now (as root; the device stops working on the host):"
  info "    modprobe vfio-pci"
  [ -n "$cur" ] && info "    echo $a > /sys/bus/pci/devices/$a/driver/unbind      # from $cur"
  info "    echo vfio-pci > /sys/bus/pci/devices/$a/driver_override"
  info "    echo $a > /sys/bus/pci/drivers_probe"
  info "or at every boot: kernel command line 'vfio-pci.ids=$ids' (and keep the host's GPU"
  info "driver off it, e.g. 'modprobe.blacklist=nouveau,nvidia' or a softdep on vfio-pci)"
}

echo "kiln passthrough checks"

# ---------------------------------------------------------------- 1. the devices
NORM=()
for a in "${ADDRS[@]}"; do
  n=$(norm_addr "$a") || { bad "'$a' is not a PCI address (DDDD:BB:DD.F or BB:DD.F)"; continue; }
  if [ -d "$SYS/bus/pci/devices/$n" ]; then
    ok "device $n: $(describe "$n")"
    NORM+=("$n")
  else
    bad "device $n: not in /sys/bus/pci/devices (lspci -D lists the addresses)"
  fi
done

# ---------------------------------------------------------------- 2. KVM
if [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
  ok "/dev/kvm is there and usable by $(id -un)"
else
  bad "/dev/kvm is missing or not usable by $(id -un)"
  info "load the module (modprobe kvm_intel or kvm_amd), enable VT-x/AMD-V (SVM) in the"
  info "firmware setup, or add $(id -un) to the kvm group"
fi
if grep -qw -e vmx -e svm /proc/cpuinfo; then
  ok "the CPU has $(grep -ow -m1 -e vmx -e svm /proc/cpuinfo | head -n 1) (hardware virtualization)"
else
  bad "the CPU shows neither vmx nor svm: virtualization is off in the firmware, or this is a VM without nested virtualization"
fi

# ---------------------------------------------------------------- 3. the IOMMU
ngroups=$(find "$SYS"/kernel/iommu_groups -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
if [ "$ngroups" -gt 0 ]; then
  ok "IOMMU on: $ngroups IOMMU groups"
else
  bad "no IOMMU groups (/sys/kernel/iommu_groups is empty): the IOMMU is off"
  info "enable VT-d / AMD-Vi (IOMMU) in the firmware setup, and on Intel add 'intel_iommu=on'"
  info "(and 'iommu=pt' to keep host DMA fast) to the kernel command line, then reboot"
fi
if msg=$(dmesg 2>/dev/null | grep -i -m3 -e 'DMAR: IOMMU enabled' -e 'AMD-Vi: ' -e 'iommu: Default domain'); then
  while IFS= read -r l; do info "dmesg: ${l#*] }"; done <<<"$msg"
else
  info "dmesg: not readable here or no IOMMU lines (kernel command line: $(cat /proc/cmdline))"
fi

# ---------------------------------------------------------------- 4. the IOMMU groups
GROUPS_SEEN=()
for a in "${NORM[@]}"; do
  gl=$SYS/bus/pci/devices/$a/iommu_group
  if [ ! -e "$gl" ]; then
    bad "$a: in no IOMMU group (IOMMU off, see above)"
    continue
  fi
  g=$(basename "$(readlink -f "$gl")")
  case " ${GROUPS_SEEN[*]-} " in *" $g "*) continue ;; esac
  GROUPS_SEEN+=("$g")
  members=$(ls "$SYS/kernel/iommu_groups/$g/devices")
  echo "  IOMMU group $g of $a: $(wc -w <<<"$members") device(s)"
  for m in $members; do
    d=$(driver_of "$m")
    line="$m $(describe "$m") [driver: ${d:-none}]"
    if [ "$d" = vfio-pci ]; then
      ok "$line"
    elif is_bridge "$m"; then
      ok "$line (a bridge: may keep its driver)"
    elif [ -z "$d" ] || [ "$d" = pci-stub ]; then
      warn "$line: not vfio-pci, but VFIO accepts it; bind it to vfio-pci to be sure it stays unused"
    else
      bad "$line: must be bound to vfio-pci (VFIO gives the guest the whole group or nothing)"
      bind_help "$m" "$d"
    fi
  done
  if [ -c "$VFIO_DIR/$g" ]; then
    ok "/dev/vfio/$g exists"
  else
    bad "/dev/vfio/$g is missing: vfio-pci is not loaded or does not own the group yet (see above)"
  fi
  if [ "$(wc -w <<<"$members")" -gt 1 ]; then
    info "devices that share the group cannot be split across host and guest; if that group holds"
    info "something the host needs, put the GPU in another slot (or check the firmware's ACS setting)"
  fi
done
if [ -c "$VFIO_DIR/vfio" ]; then ok "/dev/vfio/vfio exists"; else bad "/dev/vfio/vfio is missing: modprobe vfio-pci"; fi

# ---------------------------------------------------------------- 5. memory
lim=$(ulimit -l)
if [ "$(id -u)" = 0 ]; then
  ok "locked memory: root (CAP_IPC_LOCK): the guest's ${MEM} MiB can be pinned"
elif [ "$lim" = unlimited ] || [ "$lim" -ge $((MEM * 1024)) ] 2>/dev/null; then
  ok "locked memory: ${lim} KiB allowed; the guest's ${MEM} MiB can be pinned"
else
  bad "locked memory limit ${lim} KiB < the guest's ${MEM} MiB: VFIO pins all guest RAM"
  info "run as root, or raise 'memlock' in /etc/security/limits.conf, or lower KILN_QEMU_MEM"
fi
avail=$(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo)
if [ "${avail:-0}" -gt "$MEM" ]; then ok "memory: ${avail} MiB available for a ${MEM} MiB guest"
else bad "memory: only ${avail} MiB available for a ${MEM} MiB guest (KILN_QEMU_MEM)"; fi

# The 64-bit PCI hole: at least twice the devices' 64-bit memory BARs, a power of two, >= 32 GiB.
bars=0
for a in "${NORM[@]}"; do
  while read -r start end flags; do
    [ $((start)) -eq 0 ] && continue
    (( flags & 0x200 )) || continue # IORESOURCE_MEM
    bars=$(( bars + end - start + 1 ))
  done < <(head -n 6 "$SYS/bus/pci/devices/$a/resource" 2>/dev/null)
done
hole=$((32 << 30))
while [ "$hole" -lt $((bars * 2)) ]; do hole=$((hole * 2)); done
info "BARs of the passed devices: $((bars >> 20)) MiB; 64-bit PCI hole: $((hole >> 30)) GiB"

for f in "$KERNEL" "$INITRD"; do
  if [ -f "$f" ]; then ok "image: $f"; else bad "image: $f is missing (make image)"; fi
done
if command -v qemu-system-x86_64 >/dev/null; then ok "qemu-system-x86_64: $(qemu-system-x86_64 --version | head -n 1)"
else bad "qemu-system-x86_64 is missing: apt-get install --no-install-recommends qemu-system-x86"; fi

echo
if [ "$PROBLEMS" -gt 0 ]; then
  echo "passthrough: $PROBLEMS problem(s) above; nothing started"
  exit 1
fi
if [ "$CHECK_ONLY" = 1 ]; then
  echo "passthrough: ready (--check-only: not starting QEMU)"
  exit 0
fi

VFIO=()
for a in "${NORM[@]}"; do VFIO+=(-device "vfio-pci,host=$a"); done
NETDEV="user,id=n0,net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:$PORT-10.0.2.15:8443,hostfwd=tcp:127.0.0.1:$METRICS_PORT-10.0.2.15:9100"
echo "passthrough: starting QEMU (KVM, ${MEM} MiB, ${SMP} CPUs, ${NORM[*]}); leave with the console's 'poweroff' or Ctrl-A x"
exec qemu-system-x86_64 \
  -machine q35,accel=kvm -cpu host,host-phys-bits=on -m "$MEM" -smp "$SMP" \
  -global "q35-pcihost.pci-hole64-size=$hole" \
  -no-reboot -nographic \
  -kernel "$KERNEL" -initrd "$INITRD" -append "$CMDLINE" \
  -netdev "$NETDEV" -device virtio-net-pci,netdev=n0,romfile= \
  -device i6300esb \
  "${VFIO[@]}" \
  "${EXTRA[@]}"
