#!/usr/bin/env bash
# cli_test.sh [KILN_IMAGE]: kiln-image's commands end to end on small files: keygen,
# sign (deterministic), verify good / tampered part / another key's signature / truncated
# bundle / garbage / bytes after the end, show, pubkey-c, sb-verify's refusals. One line
# per check.
set -uo pipefail
BIN=${1:-build/gnu/kiln-image}
[ -x "$BIN" ] || { echo "cli_test.sh: $BIN missing (make image-tools)" >&2; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fails=0
ok() { echo "ok   $1"; }
no() { echo "FAIL $1"; fails=$((fails + 1)); }
expect() { # expect RC NAME CMD...: CMD exits with RC
  local want=$1 name=$2; shift 2
  "$@" >"$T/out" 2>&1; local rc=$?
  if [ "$rc" = "$want" ]; then ok "$name"; else no "$name (rc $rc, want $want)"; sed 's/^/     | /' "$T/out"; fi
}
expect 0 "keygen a" "$BIN" keygen --key "$T/a.key" --pub "$T/a.pub"
expect 0 "keygen b" "$BIN" keygen --key "$T/b.key" --pub "$T/b.pub"
cp "$T/a.key" "$T/a.key.orig"
expect 0 "keygen --if-missing keeps the key" "$BIN" keygen --if-missing --key "$T/a.key" --pub "$T/a.pub"
cmp -s "$T/a.key" "$T/a.key.orig" && ok "key unchanged" || no "key unchanged"
[ "$(stat -c %a "$T/a.key")" = 600 ] && ok "private key mode 0600" || no "private key mode 0600"
head -c 100000 /dev/urandom >"$T/uki"; echo x >"$T/small"
expect 0 "sign" env SOURCE_DATE_EPOCH=1234 "$BIN" sign --key "$T/a.key" --version 2 --part uki="$T/uki" --part cfg="$T/small" --out "$T/v2.kimg" --manifest "$T/v2.man"
expect 0 "sign again" env SOURCE_DATE_EPOCH=1234 "$BIN" sign --key "$T/a.key" --version 2 --part uki="$T/uki" --part cfg="$T/small" --out "$T/v2b.kimg"
cmp -s "$T/v2.kimg" "$T/v2b.kimg" && ok "same inputs, same bundle bytes" || no "same inputs, same bundle bytes"
grep -qx "build-time 1234" "$T/v2.man" && ok "build time from SOURCE_DATE_EPOCH" || no "build time from SOURCE_DATE_EPOCH"
expect 0 "verify good" "$BIN" verify --pub "$T/a.pub" "$T/v2.kimg"
expect 1 "verify: another key refused" "$BIN" verify --pub "$T/b.pub" "$T/v2.kimg"
grep -q "bad signature" "$T/out" && ok "... says bad signature" || no "... says bad signature"
cp "$T/v2.kimg" "$T/flip.kimg"
printf '\x55' | dd of="$T/flip.kimg" bs=1 seek=$((4096 + 777)) conv=notrunc status=none
expect 1 "verify: one flipped byte in the UKI refused" "$BIN" verify --pub "$T/a.pub" "$T/flip.kimg"
grep -q "part \`uki\`" "$T/out" && ok "... names the part" || no "... names the part"
"$BIN" sign --key "$T/b.key" --version 2 --part uki="$T/uki" --part cfg="$T/small" --out "$T/other.kimg" 2>/dev/null
expect 1 "verify: a bundle signed by another key refused" "$BIN" verify --pub "$T/a.pub" "$T/other.kimg"
head -c 50000 "$T/v2.kimg" >"$T/trunc.kimg"
expect 1 "verify: truncated refused" "$BIN" verify --pub "$T/a.pub" "$T/trunc.kimg"
head -c 3000 "$T/v2.kimg" >"$T/trunc2.kimg"
expect 1 "verify: truncated in the manifest block refused" "$BIN" verify --pub "$T/a.pub" "$T/trunc2.kimg"
head -c 9000 /dev/urandom >"$T/garbage"
expect 1 "verify: garbage refused" "$BIN" verify --pub "$T/a.pub" "$T/garbage"
cp "$T/v2.kimg" "$T/long.kimg"; echo extra >>"$T/long.kimg"
expect 1 "verify: bytes after the last part refused" "$BIN" verify --pub "$T/a.pub" "$T/long.kimg"
expect 2 "verify: a private key is not a public key" "$BIN" verify --pub "$T/a.key" "$T/v2.kimg"
expect 0 "show" "$BIN" show "$T/v2.kimg"
grep -qx "version 2" "$T/out" && ok "show prints the version" || no "show prints the version"
expect 0 "pubkey-c" "$BIN" pubkey-c --pub "$T/a.pub" --out "$T/pub.h"
grep -q "IMG_PUBKEY_BYTES {0x04," "$T/pub.h" && ok "pubkey-c writes the point" || no "pubkey-c writes the point"
expect 2 "sign: version 0 refused" "$BIN" sign --key "$T/a.key" --version 0 --part uki="$T/uki" --out "$T/x"
# sb-verify (image/authenticode.c; signed images are qemu/secureboot's, against sbverify)
expect 2 "sb-verify: no --cert is usage" "$BIN" sb-verify "$T/uki"
expect 2 "sb-verify: a missing certificate file" "$BIN" sb-verify --cert "$T/none.crt" "$T/uki"
if openssl req -new -x509 -newkey rsa:2048 -nodes -sha256 -days 1 -subj /CN=t/ -keyout "$T/db.key" -out "$T/db.crt" 2>/dev/null; then
  expect 1 "sb-verify: a file that is no PE image is refused" "$BIN" sb-verify --cert "$T/db.crt" "$T/uki"
  grep -q "not a PE image" "$T/out" && ok "... says not a PE image" || no "... says not a PE image"
  expect 1 "sb-verify: a certificate that is not one is refused" "$BIN" sb-verify --cert "$T/small" "$T/uki"
else
  echo "SKIP sb-verify with a certificate: openssl cannot make one here"
fi
expect 2 "no command" "$BIN"
echo "cli_test: $fails failed"
[ "$fails" = 0 ]
