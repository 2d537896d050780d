#!/usr/bin/env python3
"""secureboot_test.py: the disk image under UEFI Secure Boot with the project's own keys
(OVMF's Secure Boot build, TCG; standard library only; the QEMU, boot and GEN helpers are
boot_test.py's and disk_test.py's).

Builds nothing: `make disk-test-inputs` makes build/disk/kiln-dev.img (kiln.img, systemd-boot
and the UKI signed with the db key of build/keys/secureboot, with the development identity
provisioned on its data partition by kiln-flash), build/disk/kiln-ovmf-vars.fd (OVMF's
variable store with that PK, KEK and db enrolled, Secure Boot on), the v2 bundle, and
kiln-image / kiln-flash. One copy of the disk; its ESP is edited between boots with
mtools (the ESP starts at 1 MiB), each boot gets a fresh copy of the enrolled store, and
each boot is bounded:

  no QEMU: the UKIs and the ESP's BOOTX64.EFI verify against db.crt (sbverify); the .esl and
    .auth files for real firmware are there; kiln-image sb-verify (image/authenticode.c,
    kiln-init's check) agrees with sbverify on good, flipped, unsigned and other-key
    images; kiln-flash refuses, writing nothing, a bundle signed by the manifest key whose
    UKI is unsigned, or signed by another (fresh) db key
  boot 1: the signed disk boots to ready under OVMF_CODE_4M.secboot.fd, kiln-init says
    Secure Boot is on; there is no TPM, so the provisioned identity serves unsealed and the
    console says so plainly; a GEN is served; the same two bundles as network updates are
    refused by kiln-init (422), nothing activated; poweroff
  boots 2-4: slot a's UKI on the ESP with one byte flipped, signed by another key, and
    unsigned: systemd-boot's `Error loading \\EFI\\Linux\\kiln-a.efi: Access Denied` (the
    firmware's LoadImage refused it), the firmware's boot option fails, kiln-init never
    starts: the box stops there (slot a is the only entry)
  boot 5: v2 in slot b (kiln-flash, 1 try), its ESP entry then changed by one byte:
    systemd-boot counts the try (kiln-b+1.efi becomes kiln-b+0-1.efi) and is refused
    (`Error loading \\EFI\\Linux\\kiln-b+0-1.efi: Access Denied`); boot 6: the try is spent,
    systemd-boot falls back to slot a, which boots to ready and says ROLLBACK
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import boot_test as bt  # noqa: E402
import disk_test as dt  # noqa: E402

check, say, Abort, tail, sha, run = bt.check, bt.say, bt.Abort, bt.tail, dt.sha, dt.run
ESP = "@@%d" % (1 << 20)
DENIED = r"Error loading \\EFI\\Linux\\%s: Access Denied"


def mtools(*args):
    env = dict(os.environ, MTOOLS_SKIP_CHECK="1")
    p = subprocess.run(list(args), capture_output=True, text=True, env=env)
    if p.returncode:
        raise RuntimeError("%s: %s" % (" ".join(args), p.stderr.strip()))
    return p.stdout


def esp_get(disk, name, out):
    mtools("mcopy", "-n", "-o", "-i", disk + ESP, "::/" + name, out)


def esp_put(disk, src, name):
    mtools("mcopy", "-o", "-i", disk + ESP, src, "::/" + name)


def esp_ls(disk):
    return mtools("mdir", "-b", "-i", disk + ESP, "::/EFI/Linux")


def boot(name, disk, tmp):
    vars_fd = os.path.join(tmp, "vars-%s.fd" % name)
    shutil.copyfile(A.vars, vars_fd)
    os.environ.update(KILN_SECBOOT="1", KILN_OVMF_VARS=vars_fd)
    return dt.boot("sb-" + name, disk, A.log_dir)


def refused_boot(name, disk, tmp, entry, what):
    """A boot that systemd-boot must refuse: its line, and no kiln-init after it."""
    g = boot(name, disk, tmp)
    t0 = bt.now()
    try:
        m = g.wait(DENIED % entry.replace("+", r"\+").replace(".", r"\."), A.fail_timeout)
        check("%s: systemd-boot refuses it: `Error loading \\EFI\\Linux\\%s: Access Denied` (%.0f s)" % (what, entry, bt.now() - t0),
              m is not None, "\n" + tail(g, 15))
        m2 = g.wait(r"BdsDxe: failed to start Boot\d+ [^\n]*: Access Denied", 20)
        check("%s: the firmware's boot option fails with Access Denied" % what, m2 is not None, "\n" + tail(g, 15))
        m3 = g.wait(r"kiln-init|Linux version|EFI stub", 10)
        check("%s: nothing of it runs (no kernel, no kiln-init on the console)" % what, m3 is None,
              "\n" + tail(g, 15))
        if m:
            say("%s: %s" % (what, m.group(0)))
    finally:
        g.kill()


def no_qemu(tmp, work):
    db = os.path.join(A.keys, "db.crt")
    for f in (A.uki1, A.uki2):
        rc, out = run(["sbverify", "--cert", db, f])
        check("%s is signed by the db key (sbverify --cert db.crt)" % os.path.basename(f), rc == 0, out)
    boot_efi = os.path.join(tmp, "BOOTX64.EFI")
    esp_get(work, "EFI/BOOT/BOOTX64.EFI", boot_efi)
    rc, out = run(["sbverify", "--cert", db, boot_efi])
    check("the ESP's systemd-boot (EFI/BOOT/BOOTX64.EFI) is signed by the db key", rc == 0, out)
    missing = [n for n in ("PK.esl", "KEK.esl", "db.esl", "PK.auth", "KEK.auth", "db.auth", "guid")
               if not os.path.getsize(os.path.join(A.keys, n))]
    check("the key set has the .esl and .auth files for real firmware", not missing, repr(missing))

    # A UKI signed by a fresh key set, and one with no signature at all, each in a bundle
    # the manifest key signed: the Secure Boot check is what refuses them.
    other_keys = os.path.join(tmp, "other-keys")
    rc, out = run([os.path.join(bt.ROOT, "image", "secureboot.sh"), "keys", other_keys])
    unsigned = os.path.join(tmp, "uki-unsigned.efi")
    shutil.copyfile(A.uki1, unsigned)
    rc2, out2 = run(["sbattach", "--remove", unsigned])
    other = os.path.join(tmp, "uki-other.efi")
    rc3, out3 = run([os.path.join(bt.ROOT, "image", "secureboot.sh"), "sign", other_keys, unsigned, other])
    ok = rc == 0 and rc2 == 0 and rc3 == 0
    check("a fresh key set, an unsigned UKI (sbattach --remove) and one signed by the other db key", ok, out + out2 + out3)
    if not ok:
        raise Abort()
    rc, out = run(["sbverify", "--cert", db, other])
    check("the other key's UKI does not verify against our db.crt", rc != 0, out)
    flipped = os.path.join(tmp, "uki-flipped.efi")
    flip(A.uki1, flipped, 300000, 0x01)
    # kiln-init's own Authenticode check (image/authenticode.c, through kiln-image
    # sb-verify) says what sbverify says, on each of them
    for f, want in ((A.uki1, 0), (A.uki2, 0), (boot_efi, 0), (flipped, 1), (unsigned, 1), (other, 1)):
        rc, out = run([A.kimage, "sb-verify", "--cert", db, f])
        rc2, _ = run(["sbverify", "--cert", db, f])
        check("kiln-image sb-verify (image/authenticode.c) %s %s, as sbverify does" %
              ("accepts" if want == 0 else "refuses", os.path.basename(f)), rc == want and (rc2 == 0) == (want == 0), out)
    before = sha(work)
    kimgs = []
    for uki, what in ((unsigned, "an unsigned UKI"), (other, "a UKI signed by another db key")):
        kimg = os.path.join(tmp, "sb-%d.kimg" % len(kimgs))
        kimgs.append((kimg, what))
        rc, out = run([A.kimage, "sign", "--key", A.signing_key, "--version", "2", "--part", "uki=" + uki, "--out", kimg])
        rc, out = run([A.flash, "update", kimg, work])
        check("kiln-flash refuses a bundle the manifest key signed with %s, nothing written" % what,
              rc == 1 and "REFUSED, nothing written" in out and "not signed by the Secure Boot db key" in out, out)
    check("the disk is unchanged after both refusals", sha(work) == before)
    return unsigned, other, kimgs


def flip(src, dst, at, bit):
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(at)
        b0 = f.read(1)
        f.seek(at)
        f.write(bytes([b0[0] ^ bit]))


def main():
    global A
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(bt.ROOT, "build"))
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--ready-timeout", type=int, default=240)
    ap.add_argument("--gen-timeout", type=int, default=240)
    ap.add_argument("--fail-timeout", type=int, default=120)
    A = ap.parse_args()
    b = A.build
    d = os.path.join(b, "disk")
    A.disk, A.vars, A.v2 = (os.path.join(d, n) for n in ("kiln-dev.img", "kiln-ovmf-vars.fd", "kiln-v2.kimg"))
    A.uki1, A.uki2 = os.path.join(d, "uki-v1.efi"), os.path.join(d, "uki-v2.efi")
    A.keys = os.path.join(b, "keys", "secureboot")
    A.signing_key = os.path.join(b, "keys", "signing.key")
    A.flash, A.kimage = os.path.join(b, "gnu", "kiln-flash"), os.path.join(b, "gnu", "kiln-image")
    A.ca, A.tokens = os.path.join(b, "image", "tls", "ca.crt"), os.path.join(b, "image", "tokens.txt")
    A.log_dir = A.log_dir or os.path.join(b, "test-logs")
    for f in (A.disk, A.vars, A.v2, A.uki1, A.uki2, A.keys, A.signing_key, A.flash, A.kimage, A.ca, A.tokens,
              "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"):
        if not os.path.exists(f):
            print("secureboot_test: %s is missing (make disk-test-inputs builds it)" % f, file=sys.stderr)
            return 2
    for tool in ("sbverify", "sbattach", "mcopy"):
        if not shutil.which(tool):
            print("secureboot_test: no %s (image/disk.sh installs sbsigntool and mtools)" % tool, file=sys.stderr)
            return 2
    os.makedirs(A.log_dir, exist_ok=True)
    bt.A = types.SimpleNamespace(cmdline="", accel=None, kernel="", ca=A.ca, poweroff_timeout=60)
    dt.A = A  # disk_test's ready(), one_gen() and tokens read their settings from its A
    bt.signal.signal(bt.signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="kiln-sb-test-")
    work = os.path.join(tmp, "disk.img")
    shutil.copyfile(A.disk, work)
    try:
        unsigned, other, kimgs = no_qemu(tmp, work)

        g = boot("signed", work, tmp)
        try:
            m = g.wait(r"kiln: UEFI Secure Boot is (on|off)[^\n]*", A.ready_timeout)
            check("boot 1: kiln-init says UEFI Secure Boot is on (the SecureBoot variable)",
                  m is not None and m.group(1) == "on", "\n" + tail(g, 25))
            if m:
                say("boot 1: %s" % m.group(0))
            dt.ready(g, "boot 1 (signed, Secure Boot)")
            check("boot 1: kiln-init verified slot a too (the manifest key)",
                  g.wait(r"kiln: slot a \(version 1\) verified: signature, part hashes, its ESP entry", 5) is not None,
                  "\n" + tail(g, 25))
            check("boot 1: no TPM: the console says plainly that the provisioned identity is NOT sealed",
                  "kiln: WARNING: identity: NOT sealed (no TPM): the TLS key and tokens are in plaintext on the data "
                  "partition (/data/provision)" in g.text(), "\n" + tail(g, 25))
            dt.one_gen(g, "boot 1", "sb1")
            for kimg, what in kimgs:  # kiln-init checks the Authenticode signature as kiln-flash does
                res, err, _ = dt.net_update(g, kimg)
                check("boot 1: a network update with %s (manifest signature good) is refused by kiln-init (422)" % what,
                      err is not None and err.code == 422 and "not signed for Secure Boot by the db key" in str(err),
                      "%r %r\n%s" % (res, err, tail(g, 10)))
                if err is not None:
                    say("boot 1: %s" % err)
            out = g.cmd("version")
            check("boot 1: after the refusals nothing is activated (slot b is empty)",
                  out is not None and "other:   slot b, empty" in out, repr(out))
            bt.poweroff(g, "boot 1: `poweroff` ends QEMU with status 0")
        except Abort:
            pass
        finally:
            g.kill()

        good = os.path.join(tmp, "kiln-a.efi")
        esp_get(work, "EFI/Linux/kiln-a.efi", good)
        flipped = os.path.join(tmp, "kiln-a-flipped.efi")
        flip(good, flipped, 300000, 0x01)  # one byte inside the .linux section (the kernel)
        for name, src, what in (("flipped", flipped, "boot 2 (one UKI byte flipped)"),
                                ("other-key", other, "boot 3 (UKI signed by another key)"),
                                ("unsigned", unsigned, "boot 4 (unsigned UKI)")):
            esp_put(work, src, "EFI/Linux/kiln-a.efi")
            refused_boot(name, work, tmp, "kiln-a.efi", what)
        esp_put(work, good, "EFI/Linux/kiln-a.efi")
        esp_get(work, "EFI/Linux/kiln-a.efi", os.path.join(tmp, "back.efi"))
        check("slot a's signed UKI restored on the ESP", sha(os.path.join(tmp, "back.efi")) == sha(good))

        # Fallback: slot b (v2, newer: systemd-boot tries it first) with one try, its UKI
        # on the ESP changed by one byte after kiln-flash wrote it.
        rc, out = run([A.flash, "update", A.v2, work, "--tries", "1"])
        check("kiln-flash update v2 (signed UKI) into slot b, 1 try", rc == 0 and "kiln-b+1.efi" in out, out)
        entry_b = os.path.join(tmp, "kiln-b.efi")
        esp_get(work, "EFI/Linux/kiln-b+1.efi", entry_b)
        flip(entry_b, entry_b + ".x", 400000, 0x20)
        esp_put(work, entry_b + ".x", "EFI/Linux/kiln-b+1.efi")
        # systemd-boot renames the entry (its try counted) before it loads it: the name it
        # fails on is the new one
        refused_boot("b-flipped", work, tmp, "kiln-b+0-1.efi", "boot 5 (slot b's UKI changed on the ESP)")
        ls = esp_ls(work)
        check("boot 5: systemd-boot counted the try before loading it (kiln-b+0-1.efi)", "kiln-b+0-1.efi" in ls, ls)
        g = boot("fallback", work, tmp)
        try:
            m = g.wait(r"kiln: ROLLBACK: ([^\n]*)\n", A.ready_timeout)
            check("boot 6: systemd-boot falls back to slot a; the console says ROLLBACK",
                  m is not None and "back on slot a (version 1)" in m.group(1), "\n" + tail(g, 25))
            if m:
                say("boot 6: %s" % m.group(0).strip())
            dt.ready(g, "boot 6 (fallback to slot a)")
            dt.version_is(g, "boot 6", "a", 1)
            bt.poweroff(g, "boot 6: `poweroff` ends QEMU with status 0")
        except Abort:
            pass
        finally:
            g.kill()
    except Abort:
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say("%s (%d failed)" % ("PASS" if not bt.FAILED else "FAIL", len(bt.FAILED)))
    return 1 if bt.FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
