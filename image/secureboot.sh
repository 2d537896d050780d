#!/usr/bin/env bash
# secureboot.sh: UEFI Secure Boot with the operator's own keys (docs/IMAGE.md, "Secure Boot").
#
#   image/secureboot.sh keys DIR           PK, KEK and db (RSA 2048 keys, X.509 certificates)
#                                          in DIR, made when missing; their EFI signature
#                                          lists and signed updates for real firmware:
#                                          DIR/{PK,KEK,db}.{key,crt,esl,auth}, DIR/guid
#   image/secureboot.sh vars DIR OUT       OVMF's variable store (OVMF_VARS_4M.fd) with DIR's
#                                          PK, KEK and db enrolled and Secure Boot on: OUT
#   image/secureboot.sh sign DIR IN OUT    IN signed with DIR's db key (sbsign), checked
#                                          against DIR/db.crt (sbverify): OUT
#   image/secureboot.sh verify DIR FILE    exit 0 when FILE carries a signature by DIR's db
#
# A shell script, not a kiln-image subcommand: kiln-image is the project's own ECDSA
# manifest format on mbedcrypto, while Secure Boot is X.509, EFI signature lists,
# PKCS#7-signed authenticated variables and Authenticode: openssl, efitools, sbsigntool and
# virt-firmware (PyPI) already do each of those; redoing them in C would add nothing.
#
# The owner GUID is made once per key set (DIR/guid) and used for every list. The dev key
# set is BUILD/keys/secureboot (never committed, like BUILD/keys/signing.key); an operator
# passes their own directory (KILN_SB_KEYS for make disk) holding at least db.key and
# db.crt to sign, and PK/KEK too for the variable store and the .auth files.
# RSA, because firmware in practice verifies db signatures with RSA-2048 only.
# Signing is deterministic for the same key and input (RSA PKCS#1 v1.5; sbsign's signing
# time is SOURCE_DATE_EPOCH, under faketime): tests/image/repro_test.sh relies on it.
#
# Environment: BUILD (build), KILN_FW_VENV (BUILD/fwvenv: virt-firmware, from
# image/requirements.txt, made when missing), OVMF_VARS_TEMPLATE.
set -euo pipefail
cd "$(dirname "$0")/.."
PATH=$PATH:/usr/sbin:/sbin
BUILD=${BUILD:-build}

say() { echo "secureboot: $*" >&2; }
die() { echo "secureboot: error: $*" >&2; exit 1; }
usage() { sed -n '3,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# ---------------------------------------------------------------- keys
keys() {
  local d=$1 n cn
  scripts/need.sh openssl openssl cert-to-efi-sig-list efitools
  mkdir -p "$d"
  if [ ! -s "$d/guid" ]; then
    # a random version-4 GUID, fixed for this key set from now on
    local h; h=$(openssl rand -hex 16)
    printf '%s-%s-4%s-%x%s-%s\n' "${h:0:8}" "${h:8:4}" "${h:13:3}" $(( (0x${h:16:1} & 3) | 8 )) "${h:17:3}" "${h:20:12}" >"$d/guid"
  fi
  local guid; guid=$(cat "$d/guid")
  for n in PK KEK db; do
    [ -f "$d/$n.key" ] && [ -f "$d/$n.crt" ] && continue
    case $n in PK) cn="kiln platform key" ;; KEK) cn="kiln key exchange key" ;; db) cn="kiln image signing key (db)" ;; esac
    say "making $d/$n.key and $n.crt (RSA 2048, 10 years)"
    (umask 077; openssl req -new -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj "/CN=$cn/" \
      -keyout "$d/$n.key" -out "$d/$n.crt" 2>/dev/null) || die "openssl req ($n) failed"
    chmod 0644 "$d/$n.crt"
    rm -f "$d/$n.esl" "$d/$n.auth"
  done
  # EFI signature lists, and the authenticated updates real firmware takes in setup mode
  # (PK signed by itself, KEK by PK, db by KEK; KeyTool or the firmware's own menu
  # enrolls them: docs/IMAGE.md)
  for n in PK KEK db; do
    [ -f "$d/$n.esl" ] || cert-to-efi-sig-list -g "$guid" "$d/$n.crt" "$d/$n.esl" >/dev/null
  done
  [ -f "$d/PK.auth" ] || sign-efi-sig-list -g "$guid" -k "$d/PK.key" -c "$d/PK.crt" PK "$d/PK.esl" "$d/PK.auth" >/dev/null
  [ -f "$d/KEK.auth" ] || sign-efi-sig-list -g "$guid" -k "$d/PK.key" -c "$d/PK.crt" KEK "$d/KEK.esl" "$d/KEK.auth" >/dev/null
  [ -f "$d/db.auth" ] || sign-efi-sig-list -g "$guid" -k "$d/KEK.key" -c "$d/KEK.crt" db "$d/db.esl" "$d/db.auth" >/dev/null
  return 0
}

# ---------------------------------------------------------------- the OVMF variable store
fw_venv() {
  local v=${KILN_FW_VENV:-$BUILD/fwvenv}
  if [ ! -f "$v/.ok" ] || [ image/requirements.txt -nt "$v/.ok" ]; then
    scripts/need.sh python3 python3
    python3 -m venv "$v" 2>/dev/null || { scripts/need.sh /usr/lib/python3/dist-packages/ensurepip python3-venv; python3 -m venv "$v"; }
    say "installing virt-firmware into $v (image/requirements.txt)"
    "$v/bin/pip" install --quiet --disable-pip-version-check -r image/requirements.txt >&2 || die "pip install -r image/requirements.txt failed"
    touch "$v/.ok"
  fi
  echo "$v"
}

vars() {
  local d=$1 out=$2 tpl=${OVMF_VARS_TEMPLATE:-/usr/share/OVMF/OVMF_VARS_4M.fd} v guid
  [ -f "$d/PK.crt" ] && [ -f "$d/KEK.crt" ] && [ -f "$d/db.crt" ] && [ -s "$d/guid" ] ||
    die "$d needs PK.crt, KEK.crt, db.crt and guid (image/secureboot.sh keys $d)"
  scripts/need.sh "$tpl" ovmf
  v=$(fw_venv); guid=$(cat "$d/guid")
  "$v/bin/virt-fw-vars" --input "$tpl" --output "$out.tmp" --set-pk "$guid" "$d/PK.crt" \
    --add-kek "$guid" "$d/KEK.crt" --add-db "$guid" "$d/db.crt" --secure-boot >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; rm -f "$out.tmp"; die "virt-fw-vars failed"; }
  rm -f "$out.log"
  mv "$out.tmp" "$out"
}

# ---------------------------------------------------------------- signing
sign() {
  local d=$1 in=$2 out=$3
  scripts/need.sh sbsign sbsigntool faketime faketime
  [ -f "$d/db.key" ] && [ -f "$d/db.crt" ] || die "$d has no db.key and db.crt (image/secureboot.sh keys $d)"
  # sbsign puts the time of day in its PKCS#7 (signingTime, and so the PE checksum): the
  # clock frozen at SOURCE_DATE_EPOCH (libfaketime; -f, or the clock starts there and
  # ticks, and a signing that crosses a second differs) makes it the same bytes every time.
  # Firmware does not check times (EDK2 verifies with X509_V_FLAG_NO_CHECK_TIME).
  local when; when=$(TZ=UTC date -d "@${SOURCE_DATE_EPOCH:-0}" '+%Y-%m-%d %H:%M:%S')
  TZ=UTC faketime -f "$when" sbsign --key "$d/db.key" --cert "$d/db.crt" --output "$out.tmp" "$in" >/dev/null 2>"$out.err" ||
    { cat "$out.err" >&2; rm -f "$out.tmp" "$out.err"; die "sbsign $in failed"; }
  sbverify --cert "$d/db.crt" "$out.tmp" >/dev/null 2>"$out.err" ||
    { cat "$out.err" >&2; rm -f "$out.tmp" "$out.err"; die "sbverify: $out does not verify with $d/db.crt"; }
  rm -f "$out.err"
  mv "$out.tmp" "$out"
}

verify() {
  scripts/need.sh sbverify sbsigntool
  sbverify --cert "$1/db.crt" "$2" >/dev/null 2>&1
}

[ $# -ge 2 ] || usage
case $1 in
  keys) [ $# = 2 ] || usage; keys "$2" ;;
  vars) [ $# = 3 ] || usage; vars "$2" "$3" ;;
  sign) [ $# = 4 ] || usage; sign "$2" "$3" "$4" ;;
  verify) [ $# = 3 ] || usage; verify "$2" "$3" ;;
  *) usage ;;
esac
