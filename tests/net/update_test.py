#!/usr/bin/env python3
"""update_test.py: the network update verb (UPDATE, REBOOT; docs/PROTOCOL.md) on a real
`kilnd serve` over host sockets, fast and without QEMU (the image's end-to-end test is
tests/qemu/disk_test.py).

kilnd gets `--update-slot b:FILE`, a file standing in for the inactive slot's partition,
and this script plays kiln-init on the control socket: it answers kilnd's
`ASK update-begin b` and `ASK update-activate b tries=T` as kiln-init would (it checks
that the file holds the bytes sent; the signature check itself is kiln-init's, covered
in QEMU). Checked: a user connection gets 403; bad keys 400; too large 413; no kiln-init
503; a good transfer with progress lines and `OK update done`, while another admin's
UPDATE gets 409 and other sessions are served; a wrong sha256 refused (422) with no
activation asked; a disconnect mid-stream frees the slot for the next UPDATE and
activates nothing; bytes before OK close the session; kiln-init's refusal reaches the
client; REBOOT reaches kiln-init. With --cli, the C SDK's kiln_update through `kiln update`. Standard library and the kiln package (sdk/python).

  tests/net/update_test.py --kilnd build/gnu/kilnd --model MODEL [--cli build/gnu/kiln]
"""
import argparse
import hashlib
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "sdk", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "qemu"))
import boot_test as bt  # noqa: E402
import kiln  # noqa: E402

FAILED = []
SLOT_BYTES = 8 << 20


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": %s" % (detail,)), flush=True)
    if not ok:
        FAILED.append(name)
    return ok


def connect(port, token):
    """A raw protocol connection (boot_test's), for lines and UPDATE's bytes."""
    c = bt.Conn(port, token, 20)
    c.ask = lambda line: (c.send(line), c.line())[1]
    return c


class FakeInit:
    """kiln-init's side of the control socket: records kilnd's ASK lines and answers
    them the way the scenario wants (answer(what) returns the line to send, or None)."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.asks = []
        self.answer = lambda what: None
        self.lock = threading.Lock()
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        buf = b""
        self.s.settimeout(0.2)
        while not self.stop:
            try:
                d = self.s.recv(4096)
            except socket.timeout:
                continue
            if not d:
                return
            buf += d
            while b"\n" in buf:
                l, buf = buf.split(b"\n", 1)
                l = l.decode()
                if l.startswith("ASK "):
                    with self.lock:
                        self.asks.append(l[4:])
                    reply = self.answer(l[4:])
                    if reply:
                        self.s.sendall(reply.encode() + b"\n")

    def asked(self, prefix, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            with self.lock:
                if any(a.startswith(prefix) for a in self.asks):
                    return True
            time.sleep(0.05)
        return False


def upd_line(data, sha=None, tries=None):
    line = "UPDATE size=%d sha256=%s" % (len(data), sha or hashlib.sha256(data).hexdigest())
    return line + (" tries=%d" % tries if tries else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cli", help="the kiln CLI (sdk/c): also `kiln update`")
    A = ap.parse_args()
    d = tempfile.mkdtemp(prefix="kiln-update-")
    proc = None
    try:
        subprocess.run([A.kilnd, "certs", "--dir", d + "/tls"], check=True, capture_output=True)
        utok, atok = "user-token-upd-123456", "admin-token-upd-123456"
        with open(d + "/tokens.txt", "w") as f:
            f.write("user %s\nadmin %s\n" % (utok, atok))
        slot = d + "/slot-b.img"
        with open(slot, "wb") as f:
            f.truncate(SLOT_BYTES)
        port = 20000 + random.randrange(20000)
        ca = d + "/tls/ca.crt"
        bt.A = argparse.Namespace(ca=ca)
        args = [A.kilnd, "serve", "--model", A.model, "--set", "net.listen=127.0.0.1:%d" % port,
                "--set", "net.metrics_port=0", "--set", "net.cert=%s/tls/server.crt" % d,
                "--set", "net.key=%s/tls/server.key" % d, "--set", "net.tokens_file=%s/tokens.txt" % d,
                "--set", "engine.kv_pool_mb=64", "--set", "engine.max_seq_len=512", "--set", "engine.threads=1",
                "--control", d + "/ctl.sock", "--update-slot", "b:" + slot]
        err = open(d + "/kilnd.err", "w")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
        line = proc.stdout.readline()
        if not check("kilnd serves with --update-slot", "kilnd: serving" in line, line):
            return 1

        u = connect(port, utok)
        data = os.urandom(3 * (1 << 20) + 12345)
        check("a user connection gets 403", u.ask(upd_line(data)).startswith("ERR - 403 forbidden"))
        u.close()
        a = connect(port, atok)
        r = a.ask("UPDATE size=10 sha256=abc")
        check("a short sha256 is 400", r.startswith("ERR - 400 bad_request") and "sha256" in r, r)
        r = a.ask("UPDATE size=10")
        check("a missing sha256 is 400", r.startswith("ERR - 400 bad_request"), r)
        r = a.ask(upd_line(b"x" * 10, tries=12))
        check("tries=12 is 400", r.startswith("ERR - 400 bad_request") and "tries" in r, r)
        r = a.ask("UPDATE size=%d sha256=%s" % (SLOT_BYTES + 1, "0" * 64))
        check("larger than the slot is 413", r.startswith("ERR - 413 too_long"), r)
        r = a.ask(upd_line(data))
        check("no kiln-init on the control socket: 503", r.startswith("ERR - 503 unavailable"), r)

        init = FakeInit(d + "/ctl.sock")
        time.sleep(0.3)
        state = {"tries": None}

        def good(what):
            if what.startswith("update-begin b"):
                return "update ready b"
            if what.startswith("update-activate b"):  # answered below, after the 409 check
                state["tries"] = what
            return None
        init.answer = good
        seen = []
        box = {}

        def run_update():
            with kiln.Client("127.0.0.1", port, token=atok, cafile=ca, server_hostname="localhost") as c:
                f = d + "/good.kimg"
                with open(f, "wb") as out:
                    out.write(data)
                try:
                    box["res"] = c.update(f, tries=2, progress=lambda k, n: seen.append((k, n)))
                except kiln.KilnError as e:
                    box["err"] = e
        t = threading.Thread(target=run_update)
        t.start()
        # while it runs: another admin's UPDATE is 409, and other sessions are served
        check("kiln-init is asked to clear slot b first", init.asked("update-begin b"))
        b = connect(port, atok)
        r = b.ask(upd_line(b"y" * 100))
        check("a second UPDATE while one runs is 409", r.startswith("ERR - 409 busy"), r)
        check("HEALTH is answered during the update", b.ask("HEALTH").startswith("HEALTH live=1"))
        b.close()
        check("kiln-init is asked to verify and activate once the bytes are in", init.asked("update-activate b"))
        with open(slot, "rb") as f:
            same = f.read(len(data)) == data
        init.s.sendall(b"update done b version=7 tries=2 entry=kiln-b+2.efi\n" if same else b"update refused b not the bytes sent\n")
        t.join(60)
        check("the good transfer ends in OK update done", box.get("res", {}).get("slot") == "b" and
              box["res"].get("version") == "7" and box["res"].get("tries") == "2", box)
        check("progress lines every MiB up to the total", len(seen) >= 3 and seen[-1] == (len(data), len(data)) and
              all(n == len(data) for _, n in seen), seen)
        check("activation asked with tries=2", state["tries"] == "update-activate b tries=2", state)
        with open(slot, "rb") as f:
            check("the slot file holds the bytes sent", f.read(len(data)) == data)

        # the C SDK through the CLI: `kiln update`, kiln-init answering at once
        if A.cli:
            init.answer = lambda what: ("update ready b" if what.startswith("update-begin") else
                                        "update done b version=8 tries=4 entry=kiln-b+4.efi" if what.startswith("update-activate b tries=4")
                                        else None)
            p = subprocess.run([A.cli, "--host", "127.0.0.1:%d" % port, "--ca", ca, "--server-name", "localhost",
                                "--token", atok, "update", d + "/good.kimg", "--tries", "4"],
                               capture_output=True, text=True, timeout=60)
            check("kiln update (libkiln's kiln_update): OK update done, progress on stderr",
                  p.returncode == 0 and p.stdout.strip() == "OK update done slot=b version=8 tries=4" and
                  "of %d bytes" % len(data) in p.stderr, (p.returncode, p.stdout, p.stderr[-300:]))
            p = subprocess.run([A.cli, "--host", "127.0.0.1:%d" % port, "--ca", ca, "--server-name", "localhost",
                                "--token", utok, "update", d + "/good.kimg"], capture_output=True, text=True, timeout=60)
            check("kiln update with a user token fails (403)", p.returncode == 1 and "403" in p.stderr + p.stdout,
                  (p.returncode, p.stdout, p.stderr))
            init.answer = good

        # a wrong sha256: refused, no activation asked
        init.asks.clear()
        r = a.ask(upd_line(data, sha="ab" * 32))
        check("OK update slot=b max=<slot bytes>", r == "OK update slot=b max=%d" % SLOT_BYTES, r)
        a.s.sendall(data)
        lines = []
        while True:
            l = a.line()
            lines.append(l)
            if not l.startswith("UPDATE "):
                break
        check("a wrong sha256 is refused (422), nothing activated",
              lines[-1].startswith("ERR - 422 refused") and "sha256" in lines[-1] and not init.asked("update-activate", 1),
              lines[-3:])
        check("the session goes on in lines after the bytes", a.ask("HEALTH").startswith("HEALTH live=1"))

        # a disconnect in the middle
        c = connect(port, atok)
        r = c.ask(upd_line(data))
        c.s.sendall(data[: len(data) // 2])
        time.sleep(0.3)
        c.close()
        time.sleep(0.5)
        with open(d + "/kilnd.err") as f:
            log = f.read()
        check("a disconnect mid-stream is logged: nothing activated", "lost after" in log and "nothing activated" in log,
              log[-400:])
        init.asks.clear()

        # kiln-init refuses (e.g. the running slot is on trial): the client hears it
        init.answer = lambda what: "update refused b slot a runs on trial" if what.startswith("update-begin") else None
        r = a.ask(upd_line(data))
        check("the slot is free again after the broken transfer; kiln-init's refusal is 422",
              r.startswith("ERR - 422 refused") and "on trial" in r, r)
        check("the session goes on after the refusal", a.ask("HEALTH").startswith("HEALTH live=1"))

        # bytes before OK: kiln-init is slow to answer; the session is closed
        init.answer = lambda what: None
        e = connect(port, atok)
        e.send(upd_line(data))
        e.s.sendall(data[:4096])
        try:
            r = e.line()
        except (EOFError, OSError) as x:
            r = str(x)
        check("bytes before OK update: 400 and the session closes", r.startswith("ERR - 400 bad_request"), r)
        e.close()
        time.sleep(0.3)

        init.answer = lambda what: None
        r = a.ask("REBOOT")
        check("REBOOT: OK rebooting, kiln-init asked", r == "OK rebooting" and init.asked("reboot"), r)
        a.close()
        init.stop = True
    finally:
        if proc:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            with open(d + "/kilnd.err") as f:
                log = f.read()
            check("kilnd stopped cleanly (exit 0, no sanitizer report)", proc.returncode == 0 and "Sanitizer" not in log,
                  "exit %s" % proc.returncode)
        if FAILED:
            try:
                print(open(d + "/kilnd.err").read()[-2000:])
            except OSError:
                pass
        shutil.rmtree(d, ignore_errors=True)
    print("%s (%d failed)" % ("PASS" if not FAILED else "FAIL", len(FAILED)))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
