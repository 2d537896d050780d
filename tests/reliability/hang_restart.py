#!/usr/bin/env python3
"""hang_restart.py KILN_INIT KILND MODEL: the real kilnd under kiln-init (test mode, host
sockets), made to hang by fault injection: the clients of the hung requests get
`ERR id 503 restarting` (not silence), kilnd exits 75, kiln-init starts it again, and
readiness and service return. Every wait is bounded. Exit 0 when all checks passed.

kilnd gets --faults through a wrapper (tests only), and the server's step_timeout_ms is
1 s so the hang is declared quickly."""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "boot"))
import init_test  # noqa: E402  (its Init class runs kiln-init in test mode)
sys.path.insert(0, os.path.join(HERE, "..", "net"))
import serve_client  # noqa: E402  (its Conn speaks the line protocol)

FAILED = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)), flush=True)
    if not ok:
        FAILED.append(name)


def connect(port, ca, token, seconds):
    """serve_client's TLS line client (HELLO sent), retried while kilnd starts."""
    serve_client.A = argparse.Namespace(host="127.0.0.1", port=port, ca=ca, user_token=token)
    end = time.time() + seconds
    while True:
        try:
            return serve_client.Conn(token=token)
        except OSError:
            if time.time() > end:
                raise
            time.sleep(0.2)


def until(c, prefix):
    l = c.line()
    while not l.startswith(prefix):
        l = c.line()
    return l


def kill_kilnds(root):
    """Any kilnd of this run left behind (kiln-init starts it in its own session)."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if pid.isdigit() and b" serve" not in cmd and root.encode() in cmd and b"serve" in cmd:
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass


def main():
    init_bin, kilnd, model = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    init_test.BIN = init_bin
    work = tempfile.mkdtemp(prefix="kiln-hang.")
    subprocess.run([kilnd, "certs", "--dir", work + "/tls"], check=True, capture_output=True)
    utok, atok = "u" * 32, "a" * 32
    with open(work + "/tokens.txt", "w") as f:
        f.write(f"user {utok}\nadmin {atok}\n")
    wrapper = work + "/kilnd"
    with open(wrapper, "w") as f:  # serve gets --faults; check-config is left alone
        f.write(f'#!/bin/sh\nif [ "$1" = serve ]; then exec {kilnd} "$@" --faults; fi\nexec {kilnd} "$@"\n')
    os.chmod(wrapper, 0o755)
    port = 21000 + os.getpid() % 20000
    ini = (f"[model]\npath = {model}\n[engine]\nthreads = 2\nmax_seq_len = 512\nkv_pool_mb = 64\n"
           f"step_timeout_ms = 1000\n[net]\ndriver = host\nlisten = 127.0.0.1:{port}\nmetrics_port = 0\n"
           f"cert = {work}/tls/server.crt\nkey = {work}/tls/server.key\ntokens_file = {work}/tokens.txt\n")
    init_test.FAKE = wrapper
    k = init_test.Init(files={"etc/kiln/kiln.ini": ini})
    try:
        k.expect(init_test.READY, 60)
        check("kiln-init: the real kilnd comes up to READY", True)
        ca = work + "/tls/ca.crt"
        a = connect(port, ca, atok, 20)
        u = connect(port, ca, utok, 20)
        a.send("FAULT drop_step")
        l = a.line()
        check("FAULT drop_step armed", l == "OK fault=drop_step", l)
        u.send('GEN id=h1 max_tokens=16 temperature=0 prompt="Hello there"')
        u.send('GEN id=h2 max_tokens=16 temperature=0 prompt="The sky is"')
        got = {}
        t0 = time.time()
        try:
            while len(got) < 2:
                l = u.line()
                p = l.split(" ")
                if p[0] in ("END", "ERR") and p[1] in ("h1", "h2"):
                    got[p[1]] = l
        except (EOFError, OSError) as e:
            got["closed"] = repr(e)
        check("hung step: each client of a hung request gets ERR 503 restarting",
              all(got.get(i, "").startswith(f"ERR {i} 503 restarting") for i in ("h1", "h2")),
              f"{got} after {time.time() - t0:.1f} s")
        k.expect(r"kilnd asked for a restart \(exit 75\)", 30)
        check("kiln-init: kilnd exited 75 and is started again", True)
        k.expect(r"kilnd ready again", 60)
        check("kiln-init: readiness returns", True)
        c = connect(port, ca, utok, 30)
        c.send("HEALTH")
        h = until(c, "HEALTH ")
        c.send('GEN id=after max_tokens=4 temperature=0 prompt="Hello"')
        l = until(c, "END after")
        check("after the restart: ready and serving", "ready=1" in h and l.startswith("END after"), f"{h} / {l}")
        k.finish("poweroff")
        check("kiln-init: poweroff stops kilnd and exits 0", True)
    except (init_test.Fail, OSError, EOFError) as e:
        check("kiln-init scenario", False, e)
    finally:
        k.kill()
        kill_kilnds(k.root)
    print("%d failed" % len(FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
