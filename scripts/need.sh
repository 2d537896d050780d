#!/usr/bin/env bash
# need.sh CMD PACKAGE [CMD PACKAGE ...]: make sure each command exists, installing the
# Debian package that provides it when missing (we run as root on build machines and CI).
# A machine where apt cannot install gets a message naming the package to install.
set -euo pipefail
updated=0
while [ $# -ge 2 ]; do
  cmd=$1 pkg=$2; shift 2
  # A CMD with a slash is a path the package provides (a firmware file, a directory).
  have() { case $1 in */*) [ -e "$1" ] ;; *) command -v "$1" >/dev/null 2>&1 ;; esac; }
  have "$cmd" && continue
  echo "need: '$cmd' is missing; installing Debian package '$pkg'" >&2
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "need: cannot install '$pkg' here: install it (apt-get install $pkg) and rerun" >&2
    exit 1
  fi
  # make -j runs several of these at once; apt takes one at a time, so they queue here
  # (and a second one may then find the command its neighbour just installed).
  if [ "${NEED_LOCKED:-}" != 1 ]; then exec 8>/tmp/kiln-need.lock; flock 8; NEED_LOCKED=1; have "$cmd" && continue; fi
  if [ $updated = 0 ]; then apt-get update -qq >&2 || true; updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >&2 || {
    echo "need: apt-get install $pkg failed: install it by hand and rerun" >&2; exit 1; }
  have "$cmd" || { echo "need: '$pkg' did not provide '$cmd'" >&2; exit 1; }
done
