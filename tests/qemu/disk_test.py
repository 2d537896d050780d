#!/usr/bin/env python3
"""disk_test.py: the A/B disk image under UEFI (OVMF, TCG): boot, update, bless, rollback,
tamper (standard library only; the QEMU and protocol helpers are boot_test.py's).

Builds nothing: `make test-disk` makes build/disk/kiln.img (version 1 in slot a; no
identity), build/disk/kiln-dev.img (kiln.img installed by kiln-flash with the development
identity on its data partition), the signed bundles kiln-v2.kimg (good) and kiln-v3.kimg (a
kilnd that never becomes healthy: a bad key in its kiln.ini), and kiln-image / kiln-flash.
On a copy of the test disk:

  no identity in the image (no QEMU): the initramfs of v1, v2 and v3 (gunzipped, its cpio
    names and bytes), their UKIs (which hold those initramfs) and bundles (which hold those
    UKIs), and the whole of kiln.img hold no private key (PEM header), no line of the
    development key and none of its tokens; kiln-dev.img's data partition holds them, in
    provision/ (kiln-flash --identity), and kiln-flash refuses a key that is not the
    certificate's
  tamper (no QEMU): a bundle with one flipped byte in its UKI, and one signed by another
    key, are refused by kiln-flash before anything is written (the disk's bytes unchanged);
    so is a disk image whose slot a was changed, for a first install (no target written)
  kiln-flash v2 (a second disk: kiln.img installed onto a target 256 MiB larger, whose
    kiln-data then reaches the target's end, the GPT checked by sgdisk -v): `kiln-flash
    update` writes v2 into slot b; kiln-init grows the data partition's file system into
    the larger partition (console line, `status`); it boots on trial, is not blessed before
    a GEN and is blessed after one
  boot 1: version 1 boots to ready, kiln-init says slot a verified; console `version` says
    slot a, version 1; a GEN; over the network (the admin verb UPDATE, the kiln SDK's
    update()): a v2 bundle with one flipped byte in its UKI, and one signed by another key,
    are refused by kiln-init's verification, nothing activated; a transfer broken in the middle (the client closes)
    activates nothing; REBOOT (the verb)
  boot 1b: still slot a, version 1, ready and serving; the network update of v2 into
    slot b, with progress lines, `OK update done slot=b version=2 tries=3`; REBOOT
  boot 2: slot b, version 2, ready but not blessed before it has served a GEN; a GEN;
    then blessed (its ESP entry loses the boot counter); console `slot a` verifies slot a
    (signature, hashes, its ESP entry) and makes it next, `slot b` back; a network update
    broken in the middle: slot a's entry went before its first byte, nothing activated
  kiln-flash update v3 --tries 2 → boots 3 and 4: version 3 on trial goes to safe mode and
    reboots; boot 5: systemd-boot is back on version 2 and the console says ROLLBACK, ready,
    a GEN; boot 6: slot a (version 3) was changed on the disk (one flipped byte in its UKI):
    `slot a` refuses it, nothing changed; slot b's partition (not its ESP entry) was changed
    too: it boots,
    kiln-init's boot check warns that the running slot does not verify, and it stays in
    safe mode (its sealed identity does not unseal)

Measured boot: every boot has a TPM 2.0 (swtpm, Debian package; one state directory for the
whole test, one swtpm process per boot, ended by its pid). kiln-init extends PCR 15 with the
SHA-256 of the running slot's manifest; boots 1, 2 and 6 check that the console's `status`
says `measured: pcr15=<hex>` with the value computed here from the manifest's bytes,
SHA-256(32 zero bytes || SHA-256(manifest)): v1's on slot a, v2's once slot b runs (a
different signed image, a different PCR), and in boot 6 (slot b does not verify) one more
extend, SHA-256("kiln: the running slot did not verify").

PCR 15 capped: once the identity is unsealed (or enrolled), kiln-init extends PCR 15 with a
fixed separator; boots 1, 1b, 2 and 5 check `status`'s capped value against the extend
computed here. Boot 1b's update seals for slot b after its cap, and boot 2 unseals there.

Sealed identity (boot/identity.h): boot 1 (the disk's first with a TPM) seals the provisioned
TLS key and tokens to the TPM and slot a and destroys their plaintext: after it the whole
disk image holds no private key, no line of the key and no token (read here, QEMU ended),
and its data partition has no provision/ (debugfs); boot 1b unseals them and serves with them; the network
update seals them for slot b too (to v2's PCR 15, computed here); boot 2 (v2) unseals and
serves. The same disk booted with another TPM (a moved disk): the console says the sealed
identity does not load on this TPM, SAFE MODE, `restart` refused, kilnd never started.
A copy of it re-provisioned (kiln-flash identity) and booted there again: the console says a
new identity waits, `identity enrol` seals it to that TPM and starts kilnd, a GEN serves with
the new tokens and certificate, and the disk then holds none of them in the clear.
A new box provisioned with tokens alone makes its own TLS key at its first boot, prints its
certificate's fingerprint (the served certificate has it), seals it, and serves a GEN to a
client that pins that certificate; the disk keeps no private key and no token.
Boot 3 (v3, swapped in with kiln-flash: validly signed, a different manifest): it does not
unseal, the console says so, SAFE MODE (its try ends). Boot 5 (the rollback to v2) unseals
and serves a GEN with the provisioned tokens. Boot 6 (slot b's partition changed: it does
not verify): it does not unseal either, SAFE MODE: the box does not serve.

--gpu: the GPU disk instead (make disk-gpu, build/disk-gpu/: make image-gpu's initramfs in
the same A/B scheme, cuBLAS on the data partition; no GPU under TCG), gpu_main():
  no QEMU: the partitions (found by GPT name) are the GPU layout's and the bundles fit their
    slots, two UKIs the ESP; the data partition holds /data/lib/cuda (libcublas.so.12,
    libcublasLt.so.12, libgcc_s.so.1, the sizes make image-gpu staged), the initramfs holds
    the CUDA kilnd, libcuda and the NVIDIA modules and no cuBLAS
  boot g1 (v1): ready; kiln-init ran the CUDA kilnd and its image's loader resolved
    libcublas.so.12 with /data/lib/cuda as the library path, libcublasLt.so.12 from there (the
    line kiln-init prints: the same path the CUDA kilnd gets); no NVIDIA GPU, the driver fits;
    the CUDA kilnd found no CUDA device and serves from the CPU (`status` backend=cpu); a
    GEN; the network update of v3 (a kilnd that never becomes healthy) into slot b, tries=1,
    kiln-init verifies and activates it; REBOOT
  boot g2 (v3 on trial): not healthy, reboots; boot g3: ROLLBACK to slot a (version 1),
    ready, the cuBLAS line again, a GEN.

Each boot is one QEMU run (-no-reboot: a reboot ends it); every wait is bounded. v2 goes
in over the network on the main disk (and with kiln-flash on a copy), v3 with kiln-flash:
both writers of a slot are exercised, and kiln-init blesses and rolls back the same way
whoever wrote it.
"""
import argparse
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import boot_test as bt  # noqa: E402

sys.path.insert(0, os.path.join(bt.ROOT, "sdk", "python"))
import kiln  # noqa: E402

check, say, Abort, tail = bt.check, bt.say, bt.Abort, bt.tail


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


DATA_OFF, DATA_LEN = 193 << 20, 160 << 20  # the data partition (image/disk.sh's layout)


def debugfs(disk, req):
    """debugfs -R req on the disk's data partition (ext4 at DATA_OFF): its output."""
    tool = shutil.which("debugfs") or "/sbin/debugfs"
    return run([tool, "-R", req, "%s?offset=%d" % (disk, DATA_OFF)])[1]


PEM_KEY = re.compile(rb"PRIVATE KEY-----\r?\n[A-Za-z0-9+/]{16}")  # a key; mbedTLS's own header strings are not


def secrets(key_path=None, tokens_path=None):
    """What must never be readable on a disk or in an image (patterns): any PEM private key,
    each line of the (development) key's body, each of its tokens."""
    key = open(key_path or A.key, "rb").read()
    lines = [l for l in key.splitlines() if l.strip() and not l.startswith(b"-----")]
    toks = [l.split()[1].encode() for l in open(tokens_path or A.tokens) if l.strip() and not l.startswith("#")]
    return [PEM_KEY] + [re.compile(re.escape(n)) for n in lines + toks]


def hits(data, pats):
    return [p.pattern[:24] for p in pats if p.search(data)]


def scan(path, needles, off=0, length=None):
    """The patterns found in path's bytes [off, off+length), read in chunks that overlap."""
    found, keep = set(), 256
    end = os.path.getsize(path) if length is None else off + length
    with open(path, "rb") as f:
        f.seek(off)
        tail_ = b""
        while off < end:
            b = f.read(min(8 << 20, end - off))
            if not b:
                break
            off += len(b)
            buf = tail_ + b
            found.update(n for n in needles if n.search(buf))
            tail_ = buf[-keep:]
    return found


def cpio_names(data):
    """The entry names of a cpio newc archive."""
    names, at = [], 0
    while at + 110 <= len(data) and data[at:at + 6] == b"070701":
        size, nsize = int(data[at + 54:at + 62], 16), int(data[at + 94:at + 102], 16)
        name = data[at + 110:at + 110 + nsize - 1].decode()
        if name == "TRAILER!!!":
            break
        names.append(name)
        at = (at + 110 + nsize + 3) & ~3
        at = (at + size + 3) & ~3
    return names


def no_identity_in_image():
    """The product (kiln.img, the bundles, their UKIs and initramfs) carries no identity; the
    test disk carries the development one on its data partition only."""
    import gzip
    sec = secrets()
    for v in (1, 2, 3):
        d = os.path.join(A.build, "disk")
        gz = open(os.path.join(d, "initramfs-v%d.cpio.gz" % v), "rb").read()
        cpio = gzip.decompress(gz)
        names = cpio_names(cpio)
        bad = [n for n in names if n.endswith(("server.key", "tokens.txt", ".key"))]
        check("no identity: v%d's initramfs (%d entries) has no key or tokens file" % (v, len(names)),
              len(names) > 20 and not bad and "etc/kiln/kiln.ini" in names, str(bad or names[:5]))
        check("no identity: v%d's initramfs bytes hold no private key, no line of the key, no token" % v,
              not hits(cpio, sec), str(hits(cpio, sec)))
        uki = open(os.path.join(d, "uki-v%d.efi" % v), "rb").read()
        kimg = open(os.path.join(d, "kiln-v%d.kimg" % v), "rb").read()
        check("no identity: v%d's UKI holds that initramfs, its bundle that UKI, and neither a secret in the clear" % v,
              gz in uki and uki in kimg and not hits(uki, sec) and not hits(kimg, sec))
    dev = gzip.decompress(open(os.path.join(A.build, "image", "initramfs.cpio.gz"), "rb").read())
    check("the scan finds what it looks for: the development image (make run, qemu/boot) carries the key and tokens",
          len(hits(dev, sec)) == len(sec), str(hits(dev, sec)))
    found = scan(A.disk, sec)
    check("no identity: the whole of kiln.img holds no private key, no line of the key, no token",
          not found, str([n.pattern[:24] for n in found]))
    found = scan(A.dev, sec, DATA_OFF, DATA_LEN)
    out = debugfs(A.dev, "ls -l provision")
    check("kiln-dev.img: kiln-flash --identity put the key and tokens on the data partition (provision/, mode 0600)",
          len(found) == len(sec) and all(re.search(r"100600 .* %s\b" % n, out) for n in ("server.key", "server.crt", "tokens.txt")),
          "%d of %d found\n%s" % (len(found), len(sec), out))


def flash_identity_refusals(tmp):
    """kiln-flash --identity checks the identity before it writes anything."""
    bad = os.path.join(tmp, "bad-identity")
    os.makedirs(bad)
    tls = os.path.dirname(A.key)
    shutil.copyfile(os.path.join(tls, "client.key"), os.path.join(bad, "server.key"))
    shutil.copyfile(os.path.join(tls, "server.crt"), os.path.join(bad, "server.crt"))
    shutil.copyfile(A.tokens, os.path.join(bad, "tokens.txt"))
    target = os.path.join(tmp, "never.img")
    rc, out = run([A.flash, "install", A.disk, target, "--identity", bad])
    check("kiln-flash install --identity: a key that is not the certificate's is refused, nothing written",
          rc == 1 and "not the key of server.crt" in out and not os.path.exists(target), out)
    os.unlink(os.path.join(bad, "tokens.txt"))
    rc, out = run([A.flash, "install", A.disk, target, "--identity", bad])
    check("kiln-flash install --identity: a missing tokens.txt is refused, nothing written",
          rc == 1 and "tokens.txt" in out and not os.path.exists(target), out)
    shutil.rmtree(bad)


def no_plaintext_after_boot(disk, what):
    """After the box enrolled: the disk holds no secret in the clear, only the sealed form."""
    found = scan(disk, secrets())
    check("%s: the whole disk image holds no private key, no line of the key, no token (the plaintext was destroyed)" % what,
          not found, str([n.pattern[:24] for n in found]))
    top, ident = debugfs(disk, "ls /"), debugfs(disk, "ls identity")
    check("%s: the data partition has no provision/; identity/ has identity.enc, sealed-a, server.crt" % what,
          "provision" not in top and all(n in ident for n in ("identity.enc", "sealed-a", "server.crt")),
          "%s\n%s" % (top, ident))


def reenrol_moved(work, tmp, other):
    """The moved disk (a copy), re-provisioned with a new identity (kiln-flash identity) and
    booted in the box it moved to (other: that box's TPM): safe mode, the console says a new
    identity waits; `identity enrol` seals it there and kilnd starts; a GEN authenticates
    with the new tokens over the new certificate; afterwards the disk holds none of it."""
    disk = os.path.join(tmp, "moved-disk.img")
    shutil.copyfile(work, disk)
    new = os.path.join(tmp, "new-identity")
    rc, out = run([A.kilnd, "certs", "--dir", new, "--hosts", "10.0.2.15,127.0.0.1"])
    toks = os.path.join(new, "tokens.txt")
    with open(toks, "w") as f:
        f.write("user user-%s\nadmin admin-%s\n" % (os.urandom(12).hex(), os.urandom(12).hex()))
    rc, out = run([A.flash, "identity", new, disk])
    check("moved disk, re-provisioned: kiln-flash identity writes the new identity onto the installed disk",
          rc == 0 and "provision/" in out, out)
    g = boot("moved-enrol", disk, A.log_dir, other)
    old_ca, old_tokens = bt.A.ca, A.tokens
    try:
        m = g.wait(r"kiln: SAFE MODE: [^\n]*does NOT load on this TPM", A.ready_timeout)
        m2 = g.wait(r"kiln: WARNING: identity: another identity is provisioned in /data/provision \(plaintext, NOT sealed, not used\)", 5)
        check("moved disk, re-provisioned: SAFE MODE (the old identity does not load), and the console says a new one waits",
              m is not None and m2 is not None, "\n" + tail(g, 25))
        out = g.cmd("identity enrol", 120)
        check("moved disk: console `identity enrol` seals the new identity to this TPM and slot b, and starts kilnd",
              out is not None and "the provisioned identity is sealed to this TPM and slot b" in out and "starting kilnd" in out, repr(out))
        ready(g, "moved disk, enrolled on the console")
        bt.A.ca, A.tokens = os.path.join(new, "ca.crt"), toks
        one_gen(g, "moved disk (the new tokens, the new certificate)", "m1")
        out = g.cmd("status")
        check("moved disk: `status` says identity: sealed (enrolled at this boot), PCR 15 capped",
              out is not None and "identity: sealed to this TPM and slot (enrolled at this boot; PCR 15 capped" in out, repr(out))
        bt.poweroff(g, "moved disk, enrolled: `poweroff` ends QEMU with status 0")
    except Abort:
        pass
    finally:
        bt.A.ca, A.tokens = old_ca, old_tokens
    g.kill()
    found = scan(disk, secrets(os.path.join(new, "server.key"), toks))
    check("moved disk, enrolled: the disk image holds no private key, no line of the new key, none of its tokens", not found,
          str([n.pattern[:24] for n in found]))
    os.unlink(disk)


def made_key(tmp):
    """A box provisioned with tokens alone (kiln-flash --identity, no key): at its first boot
    (a fresh TPM: a new box) it makes its own TLS key and a self-signed certificate and
    prints the certificate's fingerprint; the certificate it serves has that fingerprint and
    names its address; a GEN authenticates with the provisioned tokens, pinned to that
    certificate; the key is sealed, and the disk then holds no private key and no token."""
    import ssl
    d = os.path.join(tmp, "tokens-only")
    os.makedirs(d)
    toks = os.path.join(d, "tokens.txt")
    with open(toks, "w") as f:
        f.write("user user-%s\nadmin admin-%s\n" % (os.urandom(12).hex(), os.urandom(12).hex()))
    disk = os.path.join(tmp, "made-key.img")
    rc, out = run([A.flash, "install", A.disk, disk, "--identity", d])
    check("made key: kiln-flash install --identity with tokens.txt alone (the box makes its key)",
          rc == 0 and "the box makes its own TLS key" in out, out)
    state = os.path.join(tmp, "tpm-new-box")
    os.makedirs(state)
    g = boot("made-key", disk, A.log_dir, state)
    old_ca, old_tokens, old_host = bt.A.ca, A.tokens, bt.HOSTNAME
    try:
        m = g.wait(r"kiln: identity: no TLS key was provisioned: made one on this box \(EC P-256, a self-signed certificate\): "
                   r"SHA-256 fingerprint ([0-9A-F:]{95})", A.ready_timeout)
        check("made key: no key provisioned: the box makes one and prints its certificate's fingerprint", m is not None,
              "\n" + tail(g, 25))
        ready(g, "made key")
        check("made key: sealed to the TPM like a provisioned one",
              "kiln: identity: the made TLS key and tokens (/data/provision) sealed to this TPM and slot a's PCR 15" in g.text(),
              "\n" + tail(g, 25))
        pem = ssl.get_server_certificate(("127.0.0.1", g.port))
        fp = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest().upper()
        fp = ":".join(fp[i:i + 2] for i in range(0, 64, 2))
        check("made key: the certificate the box serves has the fingerprint its console printed",
              m is not None and fp == m.group(1), "served %s" % fp)
        crt = os.path.join(tmp, "made.crt")
        with open(crt, "w") as f:
            f.write(pem)
        bt.A.ca, A.tokens, bt.HOSTNAME = crt, toks, "10.0.2.15"
        one_gen(g, "made key (pinned to that certificate, for its address 10.0.2.15; the provisioned tokens)", "k1")
        bt.poweroff(g, "made key: `poweroff` ends QEMU with status 0")
    except Abort:
        pass
    finally:
        bt.A.ca, A.tokens, bt.HOSTNAME = old_ca, old_tokens, old_host
    g.kill()
    found = scan(disk, secrets(A.key, toks)[:1] + secrets(A.key, toks)[-2:])
    top = debugfs(disk, "ls /")
    check("made key: the disk holds no private key and none of the tokens; no provision/",
          not found and "provision" not in top, str([n.pattern[:24] for n in found]) + top)
    os.unlink(disk)


class Tpm:
    """swtpm as the box's TPM 2.0: the same state directory every boot (a box keeps its TPM
    when its slots change), a fresh swtpm process for each QEMU run (a power cycle: the PCRs
    start at zero), ended by its pid."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "tpm")
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, "ctrl.sock")
        self.p = None

    def start(self, log_path, state=None):
        """state: another state directory (another box's TPM) for this boot."""
        self.stop()
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        log = open(log_path, "wb")
        # --terminate: it also ends by itself when QEMU closes the control channel.
        self.p = subprocess.Popen(["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + (state or self.dir),
                                   "--ctrl", "type=unixio,path=" + self.sock, "--terminate"],
                                  stdout=log, stderr=subprocess.STDOUT)
        log.close()
        end = bt.now() + 10
        while not os.path.exists(self.sock) and self.p.poll() is None and bt.now() < end:
            time.sleep(0.05)
        os.environ["KILN_TPM_SOCK"] = self.sock

    def stop(self):
        if self.p is None:
            return
        if self.p.poll() is None:
            os.kill(self.p.pid, bt.signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.p.pid, bt.signal.SIGKILL)
                self.p.wait()
        self.p = None


TPM = None  # set by main(); None (secureboot_test's boots through boot()): no TPM


def boot(name, disk, log_dir, tpm_state=None):
    os.environ["KILN_DISK"] = disk
    if TPM is not None:
        TPM.start(os.path.join(log_dir, "swtpm-disk-%s.log" % name), tpm_state)
    else:
        os.environ.pop("KILN_TPM_SOCK", None)
    return bt.Guest(name, "", os.path.join(log_dir, "qemu-disk-%s.log" % name))


def manifest_sha(path, off=0):
    """SHA-256 of the manifest text at off (a bundle's first block, up to its NUL)."""
    with open(path, "rb") as f:
        f.seek(off)
        block = f.read(4096)
    return hashlib.sha256(block.split(b"\0", 1)[0]).digest()


def extend(pcr, digest):
    return hashlib.sha256(pcr + digest).digest()


UNVERIFIED = hashlib.sha256(b"kiln: the running slot did not verify").digest()
CAP = hashlib.sha256(b"kiln: identity: PCR 15 capped for this boot").digest()


def capped_is(g, what, pcr):
    """Console `status`: once the identity is out of the TPM, PCR 15 was extended with the
    cap separator (pcr: its value before), so nothing later in this boot can unseal it."""
    out = g.cmd("status")
    m = re.search(r"^identity: [^\n]*PCR 15 capped: pcr15=([0-9a-f]{64})", out or "", re.M)
    want = extend(pcr, CAP).hex()
    check("%s: PCR 15 capped after the unseal: `status` says pcr15=%s... (the separator's extend, computed here)" % (what, want[:16]),
          m is not None and m.group(1) == want, "want %s\n%s" % (want, out))


def measured_is(g, what, slot, digest, pcr):
    """Console `status` shows PCR 15 as pcr (bytes), measured from slot's manifest digest."""
    out = g.cmd("status")
    m = re.search(r"^measured: pcr15=([0-9a-f]{64}) \(slot ([ab])'s manifest sha256 ([0-9a-f]{64})", out or "", re.M)
    check("%s: console `status` says measured: pcr15=%s... (slot %s's manifest %s..., SHA-256 extends computed here)" %
          (what, pcr.hex()[:16], slot, digest.hex()[:16]),
          m is not None and m.group(1) == pcr.hex() and m.group(2) == slot and m.group(3) == digest.hex(),
          "want pcr15=%s manifest %s\n%s" % (pcr.hex(), digest.hex(), out))
    if m:
        say("%s: measured: pcr15=%s" % (what, m.group(1)))


def token(role="user"):
    tokens = dict(l.split()[:2] for l in open(A.tokens) if l.strip() and not l.startswith("#"))
    return tokens[role]


def user_token():
    return token("user")


def admin(g):
    """An admin client of the kiln SDK on the guest's forwarded port."""
    return kiln.Client("127.0.0.1", g.port, token=token("admin"), cafile=A.ca, server_hostname="localhost",
                       timeout=120, retries=0)


def net_update(g, bundle, tries=3):
    """The SDK's update(): (the final line's pairs or None, the KilnError or None, progress calls)."""
    seen = []
    t0 = bt.now()
    try:
        with admin(g) as c:
            res = c.update(bundle, tries=tries, progress=lambda k, n: seen.append((k, n)), timeout=300)
        say("network update of %s: %.1f s (%d progress lines)" % (os.path.basename(bundle), bt.now() - t0, len(seen)))
        return res, None, seen
    except kiln.KilnError as e:
        return None, e, seen


def net_reboot(g, what):
    try:
        with admin(g) as c:
            r = c.reboot()
    except kiln.KilnError as e:
        r = str(e)
    rc = g.exited(120)
    check("%s: REBOOT over the network reboots the box (QEMU ends, -no-reboot)" % what, r == "OK rebooting" and rc is not None,
          "%r rc %s\n%s" % (r, rc, tail(g, 15)))


def broken_transfer(g, bundle):
    """UPDATE, half the bytes, then the connection closes."""
    data = open(bundle, "rb").read()
    c = bt.Conn(g.port, token("admin"), 60)
    try:
        c.send("UPDATE size=%d sha256=%s" % (len(data), hashlib.sha256(data).hexdigest()))
        ok = c.line()
        c.s.sendall(data[: len(data) // 2])
    finally:
        c.close()
    return ok


def ready(g, what):
    m = g.wait(r"kiln: ready in (\d+\.\d+) s", A.ready_timeout)
    if not check("%s: boots to ready within %d s" % (what, A.ready_timeout), m is not None, "\n" + tail(g, 25)):
        raise Abort()
    say("%s: ready %.1f s after QEMU started (kiln-init: %s s)" % (what, bt.now() - g.started, m.group(1)))


def one_gen(g, what, rid):
    line = 'GEN id=%s chat=0 temperature=0 max_tokens=2 prompt="The capital of France is"' % rid
    try:
        text, end = bt.gen_retry(g.port, user_token(), line, rid, bt.now() + A.gen_timeout)
        check("%s: a GEN is served" % what, end.startswith("END %s " % rid) and text, end)
    except Exception as e:  # noqa: BLE001
        check("%s: a GEN is served" % what, False, str(e))


def version_is(g, what, slot, version):
    out = g.cmd("version")
    check("%s: console `version` says slot %s, version %d" % (what, slot, version),
          out is not None and re.search(r"running: slot %s, version %d\b" % (slot, version), out), repr(out))
    return out


def tamper(work, tmp):
    before = sha(work)
    flip = os.path.join(tmp, "flip.kimg")
    shutil.copyfile(A.v2, flip)
    with open(flip, "r+b") as f:  # one byte inside the UKI (the first part starts at 4096)
        f.seek(4096 + 100000)
        b = f.read(1)
        f.seek(4096 + 100000)
        f.write(bytes([b[0] ^ 0x01]))
    rc, out = run([A.flash, "update", flip, work])
    check("tamper: one flipped byte in the UKI is refused", rc == 1 and "REFUSED" in out and "uki" in out, out)
    key, pub = os.path.join(tmp, "other.key"), os.path.join(tmp, "other.pub")
    run([A.kimage, "keygen", "--key", key, "--pub", pub])
    uki = os.path.join(tmp, "uki.efi")
    shutil.copyfile(A.uki2, uki)
    other = os.path.join(tmp, "other.kimg")
    rc, out = run([A.kimage, "sign", "--key", key, "--version", "2", "--part", "uki=" + uki, "--out", other])
    rc, out = run([A.flash, "update", other, work])
    check("tamper: a bundle signed by another key is refused", rc == 1 and "bad signature" in out, out)
    check("tamper: the disk is unchanged after both refusals", sha(work) == before)
    bad_disk = os.path.join(tmp, "bad-disk.img")
    shutil.copyfile(A.disk, bad_disk)
    with open(bad_disk, "r+b") as f:  # slot a starts at 65 MiB; its UKI 4 KiB later
        f.seek((65 << 20) + 4096 + 5000)
        b = f.read(1)
        f.seek((65 << 20) + 4096 + 5000)
        f.write(bytes([b[0] ^ 0x80]))
    target = os.path.join(tmp, "never.img")
    rc, out = run([A.flash, "install", bad_disk, target])
    check("tamper: installing a disk image with a changed slot is refused, nothing written",
          rc == 1 and not os.path.exists(target), out)
    os.unlink(bad_disk)


def flash_update(tmp):
    """kiln-flash's own update path, on a second disk: v2 written into slot b of the image
    file boots next, is not blessed before a GEN and is blessed after one. (The main disk
    takes v2 over the network below, so both ways of updating are proven.) That disk is
    kiln.img installed (with the development identity, as kiln-dev.img is) onto a target
    256 MiB larger, as onto a box's own disk: kiln-data then reaches the target's end, and
    at its first boot kiln-init grows the file system into it."""
    disk = os.path.join(tmp, "flash-disk.img")
    with open(disk, "wb") as f:
        f.truncate(os.path.getsize(A.disk) + (256 << 20))
    rc, out = run([A.flash, "install", A.disk, disk, "--identity", os.path.join(os.path.dirname(A.disk), "dev-identity")])
    check("kiln-flash install onto a disk 256 MiB larger than the image: kiln-data reaches its end",
          rc == 0 and "kiln-data now reaches the end of the target (256 MiB more)" in out, out)
    sg = subprocess.run(["sgdisk", "-v", disk], capture_output=True, text=True)
    check("the grown GPT verifies (sgdisk -v: both headers, CRCs, the backup at the end)",
          sg.returncode == 0 and "No problems found" in sg.stdout, sg.stdout + sg.stderr)
    rc, out = run([A.flash, "update", A.v2, disk])
    check("kiln-flash update v2 into the image file's slot b", rc == 0 and "slot b" in out, out)
    vars_before = os.environ["KILN_OVMF_VARS"]
    os.environ["KILN_OVMF_VARS"] = os.path.join(tmp, "flash-vars.fd")
    g = boot("flash-v2", disk, A.log_dir)
    blessed = r"kiln: slot b \(version 2\) is healthy: blessed"
    try:
        ready(g, "kiln-flash v2")
        m = g.wait(r"kiln: data partition: its file system grew from (\d+) to (\d+) MiB", 1)
        check("kiln-flash v2: kiln-init grew the data partition's file system into the larger disk",
              m is not None and int(m.group(1)) == DATA_LEN >> 20 and int(m.group(2)) == (DATA_LEN >> 20) + 256,
              m.group(0) if m else "\n" + tail(g, 25))
        st = g.cmd("status")
        m = re.search(r"data: /dev/\w+ on /data, (\d+) MiB, (\d+) free", st or "")
        check("kiln-flash v2: `status` shows the grown data partition", m is not None and int(m.group(1)) > 320, repr(st))
        m = g.wait(r"kiln: slot b \(version 2\) on trial is ready; blessed once it has served a GEN", 30)
        check("kiln-flash v2: boots version 2 on trial, not blessed before a GEN", m is not None, "\n" + tail(g, 25))
        one_gen(g, "kiln-flash v2", "f2")
        check("kiln-flash v2: blessed after one GEN", g.wait(blessed, 30) is not None, "\n" + tail(g, 25))
        version_is(g, "kiln-flash v2", "b", 2)
        bt.poweroff(g, "kiln-flash v2: `poweroff` ends QEMU with status 0")
    except Abort:
        pass
    g.kill()
    os.environ["KILN_OVMF_VARS"] = vars_before
    rc, out = run([A.flash, "status", disk])
    check("kiln-flash v2: slot b's entry is blessed on the disk (kiln-b.efi)", rc == 0 and "boot entry kiln-b.efi" in out, out)
    os.unlink(disk)


# ---------------------------------------------------------------- the GPU disk (--gpu)

GPU_LAYOUT_MB = {"kiln-esp": 512, "kiln-a": 256, "kiln-b": 256, "kiln-data": 1024}  # image/disk.sh, KILN_DISK_GPU=1
CUDA_LIBS = ("libcublas.so.12", "libcublasLt.so.12", "libgcc_s.so.1")


def gpt_parts(path):
    """{GPT partition name: (byte offset, byte length)}, from the primary header (LBA 1)."""
    with open(path, "rb") as f:
        f.seek(512)
        hdr = f.read(92)
        lba, count, size = struct.unpack_from("<QII", hdr, 72)
        f.seek(lba * 512)
        raw = f.read(count * size)
    parts = {}
    for i in range(count):
        e = raw[i * size:(i + 1) * size]
        if e[:16] == bytes(16):
            continue
        first, last = struct.unpack_from("<QQ", e, 32)
        parts[e[56:128].decode("utf-16-le").rstrip("\0")] = (first * 512, (last - first + 1) * 512)
    return parts


def gpu_no_qemu(d):
    """The GPU disk as built: its layout, what its data partition and initramfs hold."""
    import gzip
    global DATA_OFF
    parts = gpt_parts(A.disk)
    got = {n: parts.get(n, (0, 0))[1] >> 20 for n in GPU_LAYOUT_MB}
    check("GPU disk: the partitions, by GPT name, are the GPU layout's (MiB: %s)" % got, got == GPU_LAYOUT_MB, str(parts))
    uki = os.path.getsize(os.path.join(d, "uki-v1.efi"))
    fits = all(os.path.getsize(b) <= (GPU_LAYOUT_MB["kiln-a"] << 20) for b in (os.path.join(d, "kiln-v1.kimg"), A.v3))
    check("GPU disk: the bundles fit a slot, and two UKIs and a third being copied fit the ESP (UKI %.1f MiB)" % (uki / 2**20),
          fits and 3 * uki < (GPU_LAYOUT_MB["kiln-esp"] << 20))
    DATA_OFF = parts["kiln-data"][0]
    out = debugfs(A.dev, "ls -l lib/cuda")
    staged = os.path.join(A.build, "image-gpu", "data", "lib", "cuda")
    want = {n: os.path.getsize(os.path.join(staged, n)) for n in CUDA_LIBS}
    ok = all(re.search(r"\b%d .*\b%s\b" % (want[n], re.escape(os.path.realpath(os.path.join(staged, n)).rsplit("/", 1)[1])), out)
             for n in CUDA_LIBS)
    links = all(re.search(r"\b%s\b" % re.escape(n), out) for n in CUDA_LIBS)
    check("GPU disk: the data partition holds /data/lib/cuda: %s (the files and sizes make image-gpu staged)" % ", ".join(CUDA_LIBS),
          ok and links, out)
    names = cpio_names(gzip.decompress(open(os.path.join(d, "initramfs-v1.cpio.gz"), "rb").read()))
    need = ("bin/kilnd-cuda", "usr/lib/x86_64-linux-gnu/libcuda.so.1", "etc/kiln/modules-gpu", "lib64/ld-linux-x86-64.so.2")
    check("GPU disk: its initramfs holds the CUDA kilnd, its loader, libcuda and the NVIDIA module list, and no cuBLAS",
          all(n in names for n in need) and not [n for n in names if "cublas" in n], str([n for n in need if n not in names]))


CUBLAS_LINE = (r"kiln: cuBLAS: /data/lib/cuda is the CUDA kilnd's library path; the image's loader resolves libcublas\.so\.12 "
               r"there \((\d+) libraries, libcublasLt\.so\.12 from the data partition\)")


def gpu_serves(g, what, rid):
    """The CUDA kilnd on the GPU disk without a GPU: cuBLAS resolves from the data partition,
    no CUDA device, the CPU serves a GEN."""
    ready(g, what)
    check("%s: kiln-init runs the glibc CUDA kilnd (backend = auto)" % what,
          "kiln: kilnd: the CUDA kilnd (glibc), backend = auto" in g.text(), "\n" + tail(g, 30))
    m = re.search(CUBLAS_LINE, g.text())
    check("%s: the image's loader, in the box, resolves libcublas.so.12 on the data partition (/data/lib/cuda, "
          "the CUDA kilnd's library path), libcublasLt.so.12 from there" % what, m is not None, "\n" + tail(g, 30))
    if m:
        say("%s: cuBLAS: %s libraries resolved" % (what, m.group(1)))
    check("%s: no NVIDIA GPU; the image's driver fits this kernel" % what,
          re.search(r"kiln: gpu: no NVIDIA GPU on the PCI bus \(\d+ devices\); the driver fits this kernel", g.text()) is not None,
          "\n" + tail(g, 30))
    out = g.cmd("gpu")
    check("%s: console `gpu` repeats the cuBLAS line" % what, out is not None and re.search(CUBLAS_LINE[len("kiln: "):], out),
          repr(out))
    out = g.cmd("log 200")
    check("%s: the CUDA kilnd loaded libcuda, found no CUDA device and serves from the CPU" % what,
          out is not None and re.search(r"no GPU \(no CUDA device \(.*\)\): using the CPU", out) is not None, repr(out))
    out = g.cmd("status")
    check("%s: console `status`: backend=cpu" % what, out is not None and re.search(r"^\s*backend=cpu$", out, re.M) is not None,
          repr(out))
    one_gen(g, what, rid)


def gpu_main(tmp):
    d = os.path.join(A.build, "disk-gpu")
    gpu_no_qemu(d)
    work = os.path.join(tmp, "disk.img")
    shutil.copyfile(A.dev, work)
    g = boot("gpu-v1", work, A.log_dir)
    try:
        gpu_serves(g, "GPU boot 1 (v1)", "g1")
        version_is(g, "GPU boot 1", "a", 1)
        res, err, seen = net_update(g, A.v3, tries=1)
        check("GPU boot 1: the network update of v3 into slot b (1 try): OK update done slot=b version=3 tries=1",
              err is None and res == {"slot": "b", "version": "3", "tries": "1"}, "%r %r\n%s" % (res, err, tail(g, 10)))
        m = g.wait(r"kiln: network update: slot b has version 3 \(signature and hashes good[^\n]*kiln-b\+1\.efi", 30)
        check("GPU boot 1: kiln-init verified slot b's GPU bundle and put its UKI on the ESP (kiln-b+1.efi)", m is not None,
              "\n" + tail(g, 10))
        net_reboot(g, "GPU boot 1")
    except Abort:
        pass
    g.kill()
    g = boot("gpu-v3", work, A.log_dir)
    m = g.wait(r"slot b \(version 3\) on trial is not healthy", A.fail_timeout)
    check("GPU boot 2 (v3 on trial): not healthy, reboots (its one try spent)", m is not None, "\n" + tail(g, 25))
    check("GPU boot 2: why: the CUDA kilnd's config check refused v3's kiln.ini (SAFE MODE)",
          re.search(r"kiln: SAFE MODE: config check failed: [^\n]*max_conections: unknown key", g.text()) is not None,
          "\n" + tail(g, 25))
    check("GPU boot 2: the reboot ends QEMU (-no-reboot)", g.exited(120) is not None, "still running")
    g.kill()
    g = boot("gpu-rollback", work, A.log_dir)
    try:
        m = g.wait(r"kiln: ROLLBACK: ([^\n]*)\n", A.ready_timeout)
        check("GPU boot 3: the console says ROLLBACK to slot a (version 1)", m is not None and "back on slot a (version 1)" in m.group(1),
              "\n" + tail(g, 25))
        gpu_serves(g, "GPU boot 3 (rolled back to v1)", "g3")
        bt.poweroff(g, "GPU boot 3: `poweroff` ends QEMU with status 0")
    except Abort:
        pass
    g.kill()


def main():
    global A
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(bt.ROOT, "build"))
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--ready-timeout", type=int, default=240)
    ap.add_argument("--gen-timeout", type=int, default=240)
    ap.add_argument("--fail-timeout", type=int, default=300)
    ap.add_argument("--gpu", action="store_true", help="the GPU disk (make disk-gpu-test-inputs) instead")
    A = ap.parse_args()
    b = A.build
    dd = os.path.join(b, "disk-gpu" if A.gpu else "disk")
    A.disk, A.v2, A.v3 = (os.path.join(dd, n) for n in ("kiln.img", "kiln-v2.kimg", "kiln-v3.kimg"))
    A.dev = os.path.join(dd, "kiln-dev.img")
    A.uki2 = os.path.join(dd, "uki-v2.efi")
    if A.gpu:  # no v2: its update is v3's, its rollback back to v1
        A.v2 = A.uki2 = A.v3
    A.flash, A.kimage = os.path.join(b, "gnu", "kiln-flash"), os.path.join(b, "gnu", "kiln-image")
    A.kilnd = os.path.join(b, "gnu", "kilnd")
    A.ca, A.tokens = os.path.join(b, "image", "tls", "ca.crt"), os.path.join(b, "image", "tokens.txt")
    A.key = os.path.join(b, "image", "tls", "server.key")
    A.log_dir = A.log_dir or os.path.join(b, "test-logs")
    for f in (A.disk, A.dev, A.key, A.kilnd, A.v2, A.v3, A.uki2, A.flash, A.kimage, A.ca, A.tokens):
        if not os.path.exists(f):
            print("disk_test: %s is missing (make test-disk%s builds it)" % (f, "-gpu" if A.gpu else ""), file=sys.stderr)
            return 2
    os.makedirs(A.log_dir, exist_ok=True)
    # boot_test's Guest and gen read their settings from its A.
    bt.A = types.SimpleNamespace(cmdline="", accel=None, kernel="", ca=A.ca, poweroff_timeout=60)
    bt.signal.signal(bt.signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="kiln-disk-test-")
    global TPM
    if shutil.which("swtpm") is None:
        subprocess.run([os.path.join(bt.ROOT, "scripts", "need.sh"), "swtpm", "swtpm"], check=False)
    TPM = Tpm(tmp)
    if A.gpu:
        os.environ["KILN_OVMF_VARS"] = os.path.join(tmp, "ovmf-vars.fd")
        try:
            gpu_main(tmp)
        finally:
            TPM.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        say("%s (%d failed)" % ("PASS" if not bt.FAILED else "FAIL", len(bt.FAILED)))
        return 1 if bt.FAILED else 0
    # What PCR 15 must say: slot a of the disk image holds v1 (it starts at 65 MiB).
    d_v1, d_v2 = manifest_sha(A.disk, 65 << 20), manifest_sha(A.v2)
    pcr_v1, pcr_v2 = extend(bytes(32), d_v1), extend(bytes(32), d_v2)
    work = os.path.join(tmp, "disk.img")
    shutil.copyfile(A.dev, work)
    os.environ["KILN_OVMF_VARS"] = os.path.join(tmp, "ovmf-vars.fd")
    guests = []
    try:
        no_identity_in_image()
        flash_identity_refusals(tmp)
        tamper(work, tmp)
        flash_update(tmp)

        g = boot("v1", work, A.log_dir); guests.append(g)
        try:
            ready(g, "boot 1 (v1)")
            check("boot 1: kiln-init verified the running slot at boot",
                  g.wait(r"kiln: slot a \(version 1\) verified: signature, part hashes, its ESP entry", 5) is not None,
                  "\n" + tail(g, 25))
            version_is(g, "boot 1", "a", 1)
            m = g.wait(r"kiln: measured boot: pcr15=([0-9a-f]{64}) \(TPM /dev/tpm", 5)
            check("boot 1: kiln-init measured the boot into the TPM at boot (its log line)",
                  m is not None and m.group(1) == pcr_v1.hex(), "want %s\n%s" % (pcr_v1.hex(), tail(g, 25)))
            measured_is(g, "boot 1", "a", d_v1, pcr_v1)
            m = g.wait(r"kiln: identity: the provisioned TLS key and tokens \(/data/provision\) sealed to this TPM and slot a's PCR 15", 5)
            check("boot 1: the first boot with a TPM seals the provisioned identity (TLS key, tokens) to it and slot a", m is not None,
                  "\n" + tail(g, 25))
            m = g.wait(r"kiln: identity: the provisioned plaintext \(/data/provision\) overwritten, synced and removed", 5)
            check("boot 1: then it destroys the provisioned plaintext (overwritten, synced, removed)", m is not None, "\n" + tail(g, 25))
            capped_is(g, "boot 1", pcr_v1)
            one_gen(g, "boot 1", "1")
            res, err, _ = net_update(g, os.path.join(tmp, "flip.kimg"))
            check("boot 1: a network update with a flipped byte in its UKI is refused (422, kiln-init's verification)",
                  err is not None and err.code == 422 and "does not verify" in str(err), "%r %r" % (res, err))
            m = g.wait(r"kiln: network update REFUSED: slot b does not verify, nothing activated", 10)
            res, err2, _ = net_update(g, os.path.join(tmp, "other.kimg"))
            check("boot 1: a network update signed by another key is refused (422, bad signature)",
                  err2 is not None and err2.code == 422 and "bad signature" in str(err2), "%r %r" % (res, err2))
            out = g.cmd("version")
            check("boot 1: after the refusal nothing is activated (the console says so; slot b is empty)",
                  m is not None and out is not None and "other:   slot b, empty" in out, "%r\n%s" % (out, tail(g, 10)))
            ok = broken_transfer(g, A.v2)
            m = g.wait(r"kilnd: warn: update refused: session \d+ lost after \d+ of \d+ bytes: nothing activated", 30)
            check("boot 1: a transfer broken in the middle activates nothing (kilnd says so)",
                  ok.startswith("OK update slot=b") and m is not None, "%r\n%s" % (ok, tail(g, 10)))
            out = version_is(g, "boot 1", "a", 1)
            check("boot 1: after the broken transfer slot b has no boot entry", out is not None and "slot b, empty" in out, repr(out))
            net_reboot(g, "boot 1")
        except Abort:
            pass
        g.kill()
        no_plaintext_after_boot(work, "after boot 1")

        g = boot("v1-again", work, A.log_dir); guests.append(g)
        try:
            ready(g, "boot 1b (v1 after the broken transfer)")
            check("boot 1b: the identity is unsealed for slot a (and serves: the GEN below authenticates with it)",
                  g.wait(r"kiln: identity: unsealed for slot a \(PCR 15\)", 5) is not None, "\n" + tail(g, 25))
            check("boot 1b: a later boot finds only the sealed form (nothing provisioned)", "/data/provision" not in g.text(),
                  "\n" + tail(g, 25))
            version_is(g, "boot 1b", "a", 1)
            capped_is(g, "boot 1b", pcr_v1)
            one_gen(g, "boot 1b", "1b")
            res, err, seen = net_update(g, A.v2)
            check("boot 1b: the network update of v2: OK update done slot=b version=2 tries=3",
                  err is None and res == {"slot": "b", "version": "2", "tries": "3"}, "%r %r\n%s" % (res, err, tail(g, 10)))
            size = os.path.getsize(A.v2)
            check("boot 1b: progress lines up to the bundle's size", len(seen) >= 10 and seen[-1] == (size, size), seen[-3:])
            m = g.wait(r"kiln: network update: slot b has version 2 \(signature and hashes good[^\n]*kiln-b\+3\.efi", 10)
            check("boot 1b: kiln-init verified and activated slot b (kiln-b+3.efi)", m is not None, "\n" + tail(g, 10))
            m = g.wait(r"kiln: identity: sealed for slot b too: it unseals there when PCR 15 is ([0-9a-f]{16})", 10)
            check("boot 1b: the activation sealed the identity for slot b, to v2's PCR 15",
                  m is not None and m.group(1) == pcr_v2.hex()[:16], "\n" + tail(g, 10))
            net_reboot(g, "boot 1b")
        except Abort:
            pass
        g.kill()

        g = boot("v2", work, A.log_dir); guests.append(g)
        blessed = r"kiln: slot b \(version 2\) is healthy: blessed"
        try:
            ready(g, "boot 2 (v2)")
            m = g.wait(r"kiln: slot b \(version 2\) on trial is ready; blessed once it has served a GEN", 30)
            check("boot 2: ready, but waiting for a GEN before blessing", m is not None, "\n" + tail(g, 25))
            m = g.wait(blessed, 5)  # heartbeats (served=0) come every 500 ms meanwhile
            out = g.cmd("version")
            check("boot 2: before any GEN the slot is not blessed (still on trial)",
                  m is None and out is not None and "version 2 (on trial)" in out, repr(out))
            one_gen(g, "boot 2", "2")
            m = g.wait(blessed, 30)
            check("boot 2: after one GEN version 2 is blessed", m is not None, "\n" + tail(g, 25))
            version_is(g, "boot 2", "b", 2)
            check("boot 2: v2's manifest differs from v1's, so does its PCR 15", d_v2 != d_v1 and pcr_v2 != pcr_v1)
            measured_is(g, "boot 2", "b", d_v2, pcr_v2)
            capped_is(g, "boot 2 (sealed for slot b after boot 1b's cap: the prediction does not need PCR 15)", pcr_v2)
            check("boot 2: the network-updated slot b unseals the identity (its GEN authenticated with it)",
                  "kiln: identity: unsealed for slot b (PCR 15)" in g.text(), "\n" + tail(g, 25))
            out = g.cmd("slot a", 120)
            check("boot 2: `slot a` verifies slot a (version 1) and makes it next",
                  out is not None and "slot a (version 1, signature and hashes good) boots next" in out, repr(out))
            out = g.cmd("slot b", 120)
            check("boot 2: `slot b` makes the running slot next again",
                  out is not None and "slot b (version 2, signature and hashes good) is running and boots next" in out, repr(out))
            m = re.search(r"verified in ([\d.]+) s", g.cmd("log 10") or "")
            if m:
                say("boot 2: a slot verified in %s s (TCG)" % m.group(1))
            ok = broken_transfer(g, A.v2)  # now slot a has an entry (kiln-a+0.efi) to lose first
            m = g.wait(r"kiln: network update: slot a's boot entry kiln-a\+0\.efi removed, kilnd writes the slot", 30)
            m2 = g.wait(r"kilnd: warn: update refused: session \d+ lost after", 30, m.end() if m else 0)
            out = g.cmd("version")
            check("boot 2: a network update removes slot a's entry before its first byte; broken, it activates nothing",
                  ok.startswith("OK update slot=a") and m is not None and m2 is not None and out is not None and
                  "other:   slot a, empty" in out, "%r %r\n%s" % (ok, out, tail(g, 10)))
            bt.poweroff(g, "boot 2: `poweroff` ends QEMU with status 0")
        except Abort:
            pass
        g.kill()
        rc, out = run([A.flash, "status", work])
        check("after boot 2: slot b's entry is blessed (kiln-b.efi)", rc == 0 and "boot entry kiln-b.efi" in out, out)

        # The disk moved to another box: another TPM (its own state), the same image.
        other = os.path.join(tmp, "tpm-other-box")
        os.makedirs(other)
        g = boot("moved", work, A.log_dir, other); guests.append(g)
        try:
            m = g.wait(r"kiln: SAFE MODE: ([^\n]*)\n", A.ready_timeout)
            check("moved disk: another TPM does not load the sealed identity: the console says so, SAFE MODE",
                  m is not None and "does NOT load on this TPM (a disk from another box?)" in m.group(1), "\n" + tail(g, 25))
            if m:
                say("moved disk: SAFE MODE: %s" % m.group(1))
            out = g.cmd("restart")
            check("moved disk: `restart` is refused: no serving without the identity",
                  out is not None and "refused: safe mode for this boot" in out, repr(out))
            out = g.cmd("status")
            check("moved disk: `status` says identity: FAILED", out is not None and "identity: FAILED" in out, repr(out))
            check("moved disk: kilnd never started", "kiln: ready in" not in g.text() and "starting kilnd" not in g.text(),
                  "\n" + tail(g, 25))
            bt.poweroff(g, "moved disk: `poweroff` ends QEMU with status 0")
        except Abort:
            pass
        g.kill()
        reenrol_moved(work, tmp, other)
        made_key(tmp)

        rc, out = run([A.flash, "update", A.v3, work, "--tries", "2"])
        check("kiln-flash update v3 (never healthy) into slot a, 2 tries", rc == 0 and "slot a" in out, out)
        for n in (1, 2):
            g = boot("v3-try%d" % n, work, A.log_dir); guests.append(g)
            m = g.wait(r"slot a \(version 3\) on trial is not healthy", A.fail_timeout)
            check("boot %d (v3, try %d): not healthy, reboots for its next try" % (2 + n, n), m is not None, "\n" + tail(g, 25))
            if n == 1:  # v3 was swapped in with kiln-flash: validly signed, but this box did not seal for it
                m = re.search(r"kiln: SAFE MODE: ([^\n]*)\n", g.text())
                check("boot 3: the kiln-flashed v3 does not unseal the identity sealed for slot a (v1): the console says so, SAFE MODE",
                      m is not None and "the sealed identity does NOT unseal for slot a" in m.group(1) and
                      "this is not the image it was sealed for" in m.group(1), "\n" + tail(g, 25))
                if m:
                    say("boot 3: SAFE MODE: %s" % m.group(1))
            rc = g.exited(120)
            check("boot %d: the reboot ends QEMU (-no-reboot)" % (2 + n), rc is not None, "still running")
            g.kill()
        g = boot("rollback", work, A.log_dir); guests.append(g)
        try:
            m = g.wait(r"kiln: ROLLBACK: ([^\n]*)\n", A.ready_timeout)
            check("boot 5: the console says ROLLBACK to version 2", m is not None and "back on slot b (version 2)" in m.group(1),
                  "\n" + tail(g, 25))
            if m:
                say("boot 5: %s" % m.group(1))
            ready(g, "boot 5 (rolled back to v2)")
            check("boot 5: after the update and the rollback the identity unseals for slot b",
                  "kiln: identity: unsealed for slot b (PCR 15)" in g.text(), "\n" + tail(g, 25))
            capped_is(g, "boot 5", pcr_v2)
            one_gen(g, "boot 5 (the provisioned tokens, after updates, reboots and a rollback)", "5")
            bt.poweroff(g, "boot 5: `poweroff` ends QEMU with status 0")
        except Abort:
            pass
        g.kill()
        with open(work, "r+b") as f:  # slot a (v3) changed on the disk: one byte of its UKI
            f.seek((65 << 20) + 4096 + 7000)
            b = f.read(1)
            f.seek((65 << 20) + 4096 + 7000)
            f.write(bytes([b[0] ^ 0x04]))
            # and slot b's partition (v2, what boot 6 runs), not its ESP entry: it boots, and
            # kiln-init's check of the running slot at boot says it does not verify
            f.seek((129 << 20) + 4096 + 9000)
            b = f.read(1)
            f.seek((129 << 20) + 4096 + 9000)
            f.write(bytes([b[0] ^ 0x10]))
        g = boot("tampered", work, A.log_dir); guests.append(g)
        try:
            m = g.wait(r"kiln: WARNING: the running slot b does NOT verify: [^\n]*`uki`", A.ready_timeout)
            check("boot 6: slot b's partition changed: kiln-init warns on the console that the running slot does not verify",
                  m is not None, "\n" + tail(g, 25))
            # Its partition does not verify, so PCR 15 has the extra extend: the identity sealed for
            # slot b does not unseal, and the box does not serve (before the identity, it did).
            m = g.wait(r"kiln: SAFE MODE: ([^\n]*)\n", 30)
            check("boot 6: slot b did not verify: its sealed identity does not unseal: the console says so, SAFE MODE",
                  m is not None and "does NOT unseal for slot b" in m.group(1) and "the running slot did not verify" in m.group(1),
                  "\n" + tail(g, 25))
            if m:
                say("boot 6: SAFE MODE: %s" % m.group(1))
            version_is(g, "boot 6", "b", 2)
            measured_is(g, "boot 6 (slot b does not verify: one more extend)", "b", d_v2, extend(pcr_v2, UNVERIFIED))
            out = g.cmd("slot a", 120)
            check("boot 6: `slot a` refuses the changed slot a (its UKI's hash)",
                  out is not None and "REFUSED: slot a does not verify, nothing changed" in out and "`uki`" in out, repr(out))
            if out:
                say("boot 6: %s" % out.strip())
            out = version_is(g, "boot 6", "b", 2)
            check("boot 6: after the refusal slot a's entry is untouched (no tries left)",
                  out is not None and "kiln-a+0-2.efi" in out, repr(out))
            bt.poweroff(g, "boot 6: `poweroff` ends QEMU with status 0")
        except Abort:
            pass
        g.kill()
    finally:
        for g in guests:
            g.kill()
        TPM.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    say("%s (%d failed)" % ("PASS" if not bt.FAILED else "FAIL", len(bt.FAILED)))
    return 1 if bt.FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
