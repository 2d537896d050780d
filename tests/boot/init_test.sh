#!/usr/bin/env bash
# init_test.sh [KILN_INIT] [SCENARIO...]: kiln-init's host-side test (no root needed).
#
# Runs kiln-init in test mode (--test ROOT --kilnd tests/boot/fake_kilnd.py) once per
# scenario and drives its console through a pipe (tests/boot/init_test.py): boot to READY,
# the console commands, kill/hang/crash-loop/bad-config/exit-75 handling, safe mode, the
# password, and shutdown by poweroff, SIGTERM and end of input. KILN_INIT defaults to
# build/gnu/kiln-init (build it with ASan/UBSan for this test). The whole run is bounded.
# First, with no scenario named, tests/disk_tick_test and tests/identity_test beside
# KILN_INIT (make builds them): when a slot on trial is blessed; how a provisioned
# identity's plaintext is destroyed.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${1:-$ROOT/build/gnu/kiln-init}
shift || true
[ -x "$BIN" ] || { echo "init_test.sh: $BIN missing (build kiln-init first)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "init_test.sh: python3 missing" >&2; exit 1; }
# ASan: a leak or an error fails the run (kiln-init exits through exit(0) in test mode).
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
if [ $# -eq 0 ]; then
  T=$(dirname "$BIN")/tests/disk_tick_test
  [ -x "$T" ] || { echo "init_test.sh: $T missing (make $T)" >&2; exit 1; }
  timeout -k 5 60 "$T" || exit 1
  T=$(dirname "$BIN")/tests/identity_test
  [ -x "$T" ] || { echo "init_test.sh: $T missing (make $T)" >&2; exit 1; }
  timeout -k 5 60 "$T" || exit 1
fi
exec timeout -k 5 300 python3 "$ROOT/tests/boot/init_test.py" "$BIN" "$@"
