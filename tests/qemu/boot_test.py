#!/usr/bin/env python3
"""boot_test.py: the appliance image boots in QEMU and serves (standard library only).

Builds nothing: run `make image` first (build/image/{vmlinuz,initramfs.cpio.gz}, tls/,
tokens.txt) and have build/gnu/kilnd and the default model. Boots the image twice with
qemu/run.sh (kiln.test=1, free host ports, the serial console on QEMU's stdin/stdout):

  boot 1, the image as built:
    - the console prints `kiln: ready in X.XX s` (bounded; TCG is slow)
    - a TLS GEN through the forwarded port returns what `kilnd generate` gives on the host
    - /metrics answers through the other forwarded port
    - console `help`, `status`, `stats`, `log`, `gpu` answer; DEBUG over TLS and `debug`
    - `test-kill-kilnd`: kiln-init restarts kilnd, and the next GEN succeeds
    - `test-hang-kilnd`: the lost heartbeat gets kilnd killed and restarted; next GEN succeeds
    - `poweroff`: QEMU ends with status 0
  boot 2, the same image with a bad key in kiln.ini (an uncompressed cpio appended to the
  initramfs, replacing /etc/kiln/kiln.ini: the kernel unpacks concatenated archives in
  order), no rebuild:
    - the console says what is wrong (the key's name, SAFE MODE) and still answers `status`
    - `poweroff`: QEMU ends with status 0

--gpu: the GPU variant (`make image-gpu`, build/image-gpu/): the image's NVIDIA modules are
tried although QEMU has no NVIDIA device, and the driver's init must refuse with ENODEV (its
symbols resolved, its vermagic matched: an "Unknown symbol" or a version error is a failure),
the console must say "no NVIDIA GPU" and that the driver fits the kernel, and kilnd serves the
same GEN from the CPU. When the image carries the glibc CUDA kilnd (/etc/kiln/gpu-driver
cuda_kilnd=), kiln-init must run it, and it must load the image's libcuda, find no CUDA
device and say it serves from the CPU (its log, `status`, `stats`, /metrics
kiln_backend_info fallback="1"): the GEN above is then its. No restart checks nor
bad-config boot (kiln-init's, the same in both images). Boot 2 is the same image with one byte of nvidia.ko's vermagic changed (overlaid as
above): the kernel refuses it (ENOEXEC), the console names the module and says the image's
driver does not load on this kernel, and the box still comes up on the CPU.

Every wait is bounded; QEMU is killed by its pid in a finally block. Each check prints one
line; the exit status is 0 only when all passed. Console transcripts: --log-dir.

The reference text: greedy decoding is exact only for the same arithmetic. kilnd picks its
SIMD kernels at run time, and their float sums differ in order: under TCG the guest's CPU
(QEMU -cpu max) has AVX2 but no AVX-512, while the host may use AVX-512. When the host
kilnd has `--simd`, the reference is made at the guest's level; --ref-simd overrides the
guess and --ref-kilnd names another host kilnd.
"""
import argparse
import gzip
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT_TEXT = "What is the capital of France?"
BAD_KEY = "max_conections"  # a typo of [net] max_connections: check-config must name it

A = None
FAILED = []
T0 = time.monotonic()


def now():
    return time.monotonic() - T0


def say(msg):
    print("[%6.1f s] %s" % (now(), msg), flush=True)


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (": " + detail if detail and not ok else ""), flush=True)
    if not ok:
        FAILED.append(name)
    return ok


class Abort(Exception):
    """A step failed in a way that makes the rest of this boot pointless."""


# ------------------------------------------------------------------ the protocol (docs/PROTOCOL.md)

def quote(s):
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\x%02x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def unquote(s):
    """The bytes of a quoted protocol string."""
    b = bytearray()
    body = s[1:-1].encode()
    i = 0
    while i < len(body):
        c = body[i]
        if c != 0x5C:
            b.append(c)
            i += 1
            continue
        n = chr(body[i + 1])
        if n in '"\\':
            b.append(ord(n)); i += 2
        elif n in "nrt":
            b.append({"n": 10, "r": 13, "t": 9}[n]); i += 2
        elif n == "x":
            b.append(int(body[i + 2:i + 4], 16)); i += 4
        elif n == "u":
            b += chr(int(body[i + 2:i + 6], 16)).encode(); i += 6
        else:
            raise ValueError("bad escape in %r" % s)
    return bytes(b)


TOK_RE = re.compile(r'^TOK (\S+) ("(?:[^"\\]|\\.)*")')


HOSTNAME = "localhost"  # the name Conn checks the box's certificate for


class Conn:
    """One TLS connection to kilnd in the guest, through QEMU's forwarded port."""

    def __init__(self, port, token, timeout):
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        ctx = ssl.create_default_context(cafile=A.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        # The certificate names 10.0.2.15, 127.0.0.1 and localhost (one made on the box: its
        # address; disk_test sets HOSTNAME for it).
        self.s = ctx.wrap_socket(raw, server_hostname=HOSTNAME)
        self.buf = b""
        self.send("HELLO kiln/1 token=" + token)
        self.hello = self.line()

    def send(self, line):
        self.s.sendall(line.encode() + b"\n")

    def line(self):
        while b"\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                raise EOFError("connection closed")
            self.buf += d
        l, self.buf = self.buf.split(b"\n", 1)
        return l.decode("utf-8", "replace")

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def gen(port, token, line, rid, timeout):
    """Runs one GEN; returns (text bytes, END/ERR line)."""
    c = Conn(port, token, timeout)
    try:
        if not c.hello.startswith("OK "):
            raise RuntimeError("HELLO answered %r" % c.hello)
        c.send(line)
        text = b""
        while True:
            l = c.line()
            m = TOK_RE.match(l)
            if m and m.group(1) == rid:
                text += unquote(m.group(2))
            elif l.startswith("END %s " % rid) or l.startswith("ERR %s " % rid):
                return text, l
    finally:
        c.close()


def gen_retry(port, token, line, rid, deadline):
    """GEN, retrying connection failures (a kilnd restarting) until deadline."""
    last = None
    while now() < deadline:
        try:
            return gen(port, token, line, rid, max(5.0, deadline - now()))
        except (OSError, EOFError, ssl.SSLError, RuntimeError) as e:
            last = e
            time.sleep(1.0)
    raise TimeoutError("no GEN answer before the deadline (last error: %s)" % last)


def http_get(port, path, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(("GET %s HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n" % path).encode())
        data = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode("utf-8", "replace")


# ------------------------------------------------------------------ the guest

# The console is a tty: kiln-init echoes keys and takes its prompt off the line with
# "\r ESC[K" before printing other text. Undo that, then drop what is left of escapes.
ERASE_RE = re.compile(r"[^\n]*\r\x1b\[K")
ESC_RE = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|[@-Z\\-_]|c)")


def clean(raw):
    t = raw.decode("utf-8", "replace")
    t = ERASE_RE.sub("", t)
    t = ESC_RE.sub("", t)
    return t.replace("\r", "")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Guest:
    """qemu/run.sh in its own session, console on pipes, read by a thread."""

    def __init__(self, name, initrd, log_path):
        self.name = name
        self.port, self.mport = free_port(), free_port()
        while self.mport == self.port:
            self.mport = free_port()
        env = dict(os.environ)
        env.update(KILN_PORT=str(self.port), KILN_METRICS_PORT=str(self.mport),
                   KILN_CMDLINE=("kiln.test=1 " + A.cmdline).strip(), KILN_INITRD=initrd,
                   KILN_KERNEL=A.kernel)
        if A.accel:
            env["KILN_ACCEL"] = A.accel
        self.raw = bytearray()
        self.cond = threading.Condition()
        self.eof = False
        self.log = open(log_path, "wb")
        self.started = now()
        # run.sh execs QEMU: this pid is QEMU's.
        self.p = subprocess.Popen([os.path.join(ROOT, "qemu", "run.sh")], cwd=ROOT, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        fd = self.p.stdout.fileno()
        while True:
            try:
                d = os.read(fd, 65536)
            except OSError:
                d = b""
            with self.cond:
                if not d:
                    self.eof = True
                    self.cond.notify_all()
                    return
                self.raw += d
                self.cond.notify_all()
            self.log.write(d)
            self.log.flush()

    def text(self):
        with self.cond:
            return clean(bytes(self.raw))

    def wait(self, pattern, timeout, start=0):
        """The first match of pattern in the console text from offset start, or None."""
        rx = re.compile(pattern, re.M | re.S)
        end = now() + timeout
        with self.cond:
            while True:
                m = rx.search(clean(bytes(self.raw)), start)
                if m or self.eof:
                    return m
                left = end - now()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 1.0))

    def type(self, line):
        try:
            self.p.stdin.write(line.encode() + b"\r")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def cmd(self, line, timeout=30):
        """Types a console command; returns its output (up to the next prompt), or None."""
        t = self.text()
        start = t.rfind("\n") + 1  # the prompt this line is typed after may be there already
        self.type(line)
        m = self.wait(r"^kiln> " + re.escape(line) + r"\n(.*?)^kiln> ", timeout, start)
        return m.group(1) if m else None

    def exited(self, timeout):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGKILL)  # QEMU itself, by its pid
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.reader.join(timeout=5)
        for f in (self.p.stdin, self.p.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.log.close()


def tail(g, n=15):
    return "\n".join("    | " + l for l in g.text().splitlines()[-n:])


# ------------------------------------------------------------------ the reference

def guess_simd():
    """The SIMD level kilnd will choose in the guest."""
    accel = A.accel or ("kvm" if os.access("/dev/kvm", os.R_OK | os.W_OK) and
                        re.search(r"\b(vmx|svm)\b", open("/proc/cpuinfo").read()) else "tcg")
    cpu = os.environ.get("KILN_QEMU_CPU", "max")
    if accel == "kvm" and cpu in ("max", "host"):
        return None  # the host's own CPU: the host's choice
    if cpu != "max":
        return "scalar"
    # QEMU >= 7.2 emulates AVX2 + FMA (+ F16C) under TCG; no AVX-512.
    out = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    return "avx2" if m and (int(m.group(1)), int(m.group(2))) >= (7, 2) else "scalar"


def reference(result):
    """Host `kilnd generate` with the GEN's parameters (runs while the guest boots)."""
    cmd = [A.ref_kilnd, "generate", "--model", A.model, "--chat", "--temperature", "0",
           "--max-tokens", "16", "--prompt", PROMPT_TEXT]
    level = A.ref_simd or guess_simd()
    h = subprocess.run([A.ref_kilnd, "help"], capture_output=True, text=True, timeout=30)
    helptext = h.stdout + h.stderr
    env = dict(os.environ)
    if level and "--simd" in helptext:
        cmd += ["--simd", level]
    if level:
        env["KILN_SIMD"] = level  # the same request, should kilnd take it from the environment
    result["level"] = level
    result["cmd"] = " ".join(cmd)
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=300, env=env)
        result["rc"] = p.returncode
        # generate ends its output with one "\n" of its own
        result["text"] = p.stdout[:-1] if p.stdout.endswith(b"\n") else p.stdout
        result["err"] = p.stderr.decode("utf-8", "replace").strip()[-300:]
        result["simd_flag"] = "--simd" in cmd
    except subprocess.TimeoutExpired:
        result["rc"] = "timeout"


# ------------------------------------------------------------------ the overlay (boot 2)

def newc_entry(name, data, mode, ino):
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
    hdr = b"070701" + b"".join(b"%08X" % v for v in fields) + name.encode() + b"\0"
    hdr += b"\0" * (-len(hdr) % 4)
    return hdr + data + b"\0" * (-len(data) % 4)


def overlay_initrd(base, path, ini_text=None, files=()):
    """base + zero padding to 4 bytes + an uncompressed cpio holding /etc/kiln/kiln.ini
    (ini_text) and/or other (name, bytes) files, each replacing the image's."""
    shutil.copyfile(base, path)
    if ini_text is not None:
        files = [("etc/kiln/kiln.ini", ini_text.encode())] + list(files)
    arch = b"".join(newc_entry(name, data, 0o100644, i + 1) for i, (name, data) in enumerate(files))
    arch += newc_entry("TRAILER!!!", b"", 0, 0)
    with open(path, "ab") as f:
        f.write(b"\0" * (-os.path.getsize(base) % 4))
        f.write(arch)


def image_file(initrd, name):
    """One file's bytes from the image's initramfs (gzip, cpio newc; entries are sorted,
    so etc/ comes early and only the start is decompressed)."""
    with gzip.open(initrd, "rb") as f:
        while True:
            hdr = f.read(110)
            if len(hdr) < 110 or hdr[:6] != b"070701":
                raise ValueError("%s: not a cpio newc archive" % initrd)
            size, namesize = int(hdr[54:62], 16), int(hdr[94:102], 16)
            entry = f.read(namesize)[:-1].decode()
            f.read(-(110 + namesize) % 4)
            data = f.read(size)
            f.read(-size % 4)
            if entry == name:
                return data
            if entry == "TRAILER!!!":
                raise KeyError("%s: no %s" % (initrd, name))


# ------------------------------------------------------------------ boot 1

def poweroff(g, name):
    """`poweroff` on the console; QEMU (-no-reboot) must end with 0 after the kernel's
    "Power down" (a watchdog reset would end it with 0 too, but without that line)."""
    g.type("poweroff")
    rc = g.exited(A.poweroff_timeout)
    g.reader.join(timeout=5)
    check(name, rc == 0 and "reboot: Power down" in g.text(), "rc %s\n%s" % (rc, tail(g)))


def read_body(c):
    lines = []
    while True:
        l = c.line()
        if l == ".":
            return lines
        lines.append(l[1:] if l.startswith("..") else l)


def debug_path(g, admin):
    """DEBUG in the image itself: kilnd reads the NIC's state, the kernel log and the GPU
    view as root there, and probes out through its own stack (lwIP on the virtio NIC) to a
    port this test listens on (QEMU's user network takes the gateway 10.0.2.2 to the
    host's loopback); the console uses the same window."""
    lis = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lis.bind(("127.0.0.1", 0))
    lis.listen(2)
    try:
        c = Conn(g.port, admin, 60)
        c.send("DEBUG open minutes=5")
        l = c.line()
        check("DEBUG open (admin, in the image)", l.startswith("DEBUG window=open remaining_s=300 "), l)
        c.send("DEBUG net")
        body = read_body(c)
        nic = [x for x in body if x.startswith("link eth0:")]
        check("DEBUG net: lwIP on eth0, and the kernel's view of the NIC with its counters",
              "driver=packet" in body and "interface=eth0" in body and nic and "operstate=" in nic[0]
              and "rx_packets=" in nic[0], repr(body))
        c.send("DEBUG kmsg lines=10")
        head = c.line()
        body = read_body(c)
        check("DEBUG kmsg: the guest kernel's log", re.match(r"^# the last 10 of \d+ kernel log lines$", head)
              and len(body) == 10 and all(x.startswith("[") for x in body), repr([head] + body[:3]))
        if A.gpu:
            c.send("DEBUG kmsg lines=400")
            head = c.line()
            klog = "\n".join(read_body(c))
            bad = [l for l in klog.splitlines() if re.search(r"Unknown symbol|disagrees about version|"
                                                               r"version magic|nvidia.*(?:Invalid|Exec format)", l)]
            check("GPU image, kernel log: the driver ran its init and found no GPU (NVRM: No NVIDIA GPU found)",
                  "NVRM: No NVIDIA GPU found" in klog, "\n" + klog[-2000:])
            check("GPU image, kernel log: no unknown symbol, no version mismatch", not bad, repr(bad))
            for l in klog.splitlines():
                if re.search(r"nvidia|NVRM", l, re.I):
                    say("kernel log: " + l.strip())
        c.send("DEBUG gpu")
        body = read_body(c)
        check("DEBUG gpu: the CPU backend, no NVIDIA driver %s" % ("loaded (no GPU)" if A.gpu else "in this image"),
              "backend=cpu" in body and "nvidia_driver=not loaded (no /proc/driver/nvidia)" in body, repr(body))
        c.send("DEBUG probe host=10.0.2.2 port=%d timeout_ms=5000" % lis.getsockname()[1])
        l = c.line()
        check("DEBUG probe to the gateway: connected through the box's own stack", " result=connected ms=" in l, l)
        c.close()
    except Exception as e:  # noqa: BLE001 - any failure is this check's failure
        check("DEBUG over TLS in the image", False, repr(e))
    finally:
        lis.close()
    out = g.cmd("debug")
    check("console `debug`: the window the admin opened", out is not None and "DEBUG window=open" in out
          and "by=\"session" in out, repr(out))
    out = g.cmd("debug kmsg 3")
    check("console `debug kmsg 3`", out is not None and "# the last 3 of" in out, repr(out))
    out = g.cmd("debug close")
    check("console `debug close`", out is not None and "DEBUG window=closed" in out, repr(out))


def gpu_userland(g):
    """The GPU image's CUDA userland under TCG: kiln-init runs the glibc CUDA kilnd (its
    loader, glibc and libcuda in the image), which loads libcuda, finds no CUDA device (no
    GPU, nvidia.ko refused) and serves from the CPU, saying so in its log, the console's
    `status` and `stats` and /metrics. The GEN compared with the host above came from it."""
    info = image_file(A.initrd, "etc/kiln/gpu-driver").decode()
    if "cuda_kilnd=/bin/kilnd-cuda" not in info:
        check("GPU image without a CUDA kilnd (built without the CUDA toolkit): kiln-init runs the CPU one and says why",
              "kiln: kilnd: the CPU kilnd (static musl): this image has no CUDA kilnd" in g.text(), "\n" + tail(g, 40))
        return
    say("image: " + "; ".join(l for l in info.splitlines() if l.split("=")[0] in ("cuda_kilnd", "libcuda", "cuda_level")))
    check("GPU image: kiln-init runs the glibc CUDA kilnd (backend = auto)",
          "kiln: kilnd: the CUDA kilnd (glibc), backend = auto" in g.text(), "\n" + tail(g, 40))
    out = g.cmd("log 200")
    m = re.search(r"no GPU \(no CUDA device \(.*\)\): using the CPU", out or "")
    check("GPU image: the CUDA kilnd loaded libcuda (the image's loader found it), found no CUDA device and "
          "serves from the CPU", m is not None, repr(out))
    if m:
        say("kilnd: " + m.group(0))
    check("GPU image: libcuda was found (not 'libcuda.so.1 not found')",
          out is not None and "libcuda.so.1 not found" not in out, repr(out))
    out = g.cmd("status")
    check("GPU image, console `status`: kilnd reports backend=cpu", out is not None and
          re.search(r"^\s*backend=cpu$", out, re.M) is not None, repr(out))
    out = g.cmd("stats")
    check("GPU image, console `stats`: backend=cpu", out is not None and " backend=cpu" in out, repr(out))
    try:
        code, body = http_get(g.mport, "/metrics")
        m = re.search(r'^kiln_backend_info\{backend="cpu",simd="[a-z0-9]+",fallback="1"\} 1$', body, re.M)
        check("GPU image, /metrics: kiln_backend_info{backend=\"cpu\",...,fallback=\"1\"} (auto fell back)",
              code == 200 and m is not None, "\n".join(l for l in body.splitlines() if "backend" in l))
    except OSError as e:
        check("GPU image, /metrics", False, str(e))


def boot_main(g, ref_thread, ref):
    m = g.wait(r"kiln: ready in (\d+\.\d+) s[^\n]*?(?:kernel uptime (\d+\.\d+) s)?\n", A.ready_timeout)
    if not check("boot: console shows `kiln: ready in X.XX s` within %d s" % A.ready_timeout, m is not None,
                 "not seen (QEMU %s)\n%s" % ("ended" if g.eof else "running", tail(g))):
        raise Abort()
    say("kiln: ready in %s s after kiln-init started; kernel uptime %s s; %.1f s after QEMU started (wall)" % (
        m.group(1), m.group(2) or "?", now() - g.started))

    # (2) GEN through the forwarded port, compared with the host.
    ref_thread.join(timeout=300)
    # kilnd names the SIMD level it chose on its "serving" line (kiln-init echoes it):
    # the host reference must be computed at the same level, whatever was guessed.
    lv = re.search(r"kilnd: serving [^\n]*simd (scalar|avx2|avx512)", g.text())
    if lv and lv.group(1) != ref.get("level") and not A.ref_simd:
        say("guest kilnd uses simd %s; recomputing the host reference at that level" % lv.group(1))
        A.ref_simd = lv.group(1)
        reference(ref)
    tokens = dict(l.split()[:2] for l in open(A.tokens) if l.strip() and not l.startswith("#"))
    user = tokens.get("user")
    line = "GEN id=1 chat=1 temperature=0 max_tokens=16 prompt=" + quote(PROMPT_TEXT)
    t = now()
    try:
        text, end = gen_retry(g.port, user, line, "1", now() + A.gen_timeout)
    except Exception as e:  # noqa: BLE001 - any failure is this check's failure
        check("GEN over TLS through the forwarded port", False, str(e))
        text, end = None, ""
    if text is not None:
        say("GEN: %.1f s, %r; %s" % (now() - t, text.decode("utf-8", "replace"), end))
        check("GEN over TLS through the forwarded port ends with END", end.startswith("END 1 "), end)
        if ref.get("rc") != 0:
            check("host reference `kilnd generate`", False, "%s: rc %s %s" % (ref.get("cmd"), ref.get("rc"), ref.get("err")))
        else:
            note = ""
            if ref.get("level") and not ref.get("simd_flag"):
                note = (" (the host kilnd has no --simd: its reference used the host's own SIMD level,"
                        " the guest's is %s; greedy text can differ in the last tokens)" % ref["level"])
            check("GEN text equals the host's `kilnd generate`", text == ref["text"],
                  "guest %r, host %r%s" % (text, ref["text"], note))

    # /metrics through the second forwarded port.
    try:
        code, body = http_get(g.mport, "/metrics")
        check("GET /metrics through the forwarded port", code == 200 and "kiln_up" in body, "status %d" % code)
    except OSError as e:
        check("GET /metrics through the forwarded port", False, str(e))

    debug_path(g, tokens.get("admin"))

    # (3) the console.
    out = g.cmd("help")
    check("console `help` lists the test commands", out is not None and "test-kill-kilnd" in out, repr(out))
    out = g.cmd("status")
    check("console `status` answers (kiln-init and kilnd)",
          out is not None and "boot to READY" in out and "kilnd reports:" in out, repr(out))
    check("console `status`: no TPM here, said plainly (measured boot is off, the box serves as before)",
          out is not None and "measured: no TPM (no /dev/tpmrm0 or /dev/tpm0)" in out, repr(out))
    if out:
        print("\n".join("    | " + l for l in out.splitlines()))
    out = g.cmd("stats")
    check("console `stats` answers", out is not None and out.strip() != "" and "not reachable" not in out, repr(out))
    out = g.cmd("log 50")
    check("console `log` shows the boot", out is not None and "kiln: ready in" in out, repr(out))
    out = g.cmd("gpu")
    if A.gpu:
        check("console `gpu`: no NVIDIA GPU, the image's driver fits the kernel (nvidia.ko: no device), the CPU serves",
              out is not None and re.search(r"gpu: no NVIDIA GPU on the PCI bus \(\d+ devices\); the driver fits this "
                                            r"kernel \(nvidia\.ko: no device to drive\): kilnd serves from the CPU", out),
              repr(out))
        check("GPU image, console: kiln-init tried nvidia.ko and the driver refused (No such device)",
              re.search(r"kiln-init: module /lib/modules/[^/]+/extra/nvidia\.ko: finit_module: No such device", g.text())
              is not None, "\n" + tail(g, 40))
        check("GPU image, console: nvidia-uvm.ko not tried after nvidia.ko failed",
              "nvidia-uvm.ko" not in g.text(), "\n" + tail(g, 40))
        m = re.search(r"kiln: gpu: [^\n]*", g.text())
        if m:
            say("console: " + m.group(0))
        gpu_userland(g)
        poweroff(g, "`poweroff` ends QEMU with status 0 (within %d s)" % A.poweroff_timeout)
        return
    check("console `gpu`: QEMU's PCI bus scanned, no NVIDIA GPU, the CPU serves",
          out is not None and re.search(r"gpu: no NVIDIA GPU on the PCI bus \(\d+ devices\): kilnd serves from the CPU", out),
          repr(out))

    starts = 1
    short = "GEN id=%s chat=0 temperature=0 max_tokens=2 prompt=\"The capital of France is\""
    for cmd, what, rid in (("test-kill-kilnd", "SIGKILL", "2"), ("test-hang-kilnd", "SIGSTOP", "3")):
        pos = len(g.text())
        t = now()
        out = g.cmd(cmd)
        check("console `%s` sends %s" % (cmd, what), out is not None and what in out, repr(out))
        m = g.wait(r"kiln: kilnd ready again \(start (\d+)", A.restart_timeout, pos)
        ok = check("`%s`: kiln-init restarts kilnd (ready again within %d s)" % (cmd, A.restart_timeout),
                   m is not None and int(m.group(1)) > starts, "\n" + tail(g, 25))
        if not ok:
            continue
        starts = int(m.group(1))
        say("%s: kilnd ready again %.1f s later" % (cmd, now() - t))
        if cmd == "test-hang-kilnd":
            seen = g.text()[pos:]
            check("`test-hang-kilnd`: the lost heartbeat is what killed it", "heartbeat" in seen,
                  "\n" + tail(g, 25))
        try:
            text, end = gen_retry(g.port, user, short % rid, rid, now() + A.gen_timeout)
            check("GEN after `%s` succeeds" % cmd, end.startswith("END %s " % rid) and text, end)
        except Exception as e:  # noqa: BLE001
            check("GEN after `%s` succeeds" % cmd, False, str(e))

    # (5) poweroff ends QEMU with status 0.
    poweroff(g, "`poweroff` ends QEMU with status 0 (within %d s)" % A.poweroff_timeout)


# ------------------------------------------------------------------ boot 2

def boot_bad_config(g):
    m = g.wait(r"SAFE MODE: ([^\n]*)\n", A.ready_timeout)
    msg = m.group(1) if m else ""
    if m:
        say("bad config: %s" % msg)
    check("bad config: the console says what is wrong (SAFE MODE, names `%s`)" % BAD_KEY,
          m is not None and BAD_KEY in msg, "\n" + tail(g, 25))
    if not m:
        raise Abort()
    out = g.cmd("status")
    check("bad config: console `status` still answers (SAFE MODE)", out is not None and "SAFE MODE" in out, repr(out))
    if out:
        print("\n".join("    | " + l for l in out.splitlines()))
    poweroff(g, "bad config: `poweroff` ends QEMU with status 0")


# ------------------------------------------------------------------ boot 2 of --gpu

def bad_vermagic(ko):
    """nvidia.ko with one byte of its vermagic changed ("SMP" -> "XMP"): the kernel refuses
    it (ENOEXEC), as it would a module built for another kernel configuration."""
    i = ko.find(b"vermagic=")
    j = ko.find(b" SMP ", i)
    if i < 0 or j < 0 or j > ko.find(b"\0", i):
        raise ValueError("nvidia.ko: no 'vermagic=... SMP ...' in its .modinfo")
    return ko[:j + 1] + b"X" + ko[j + 2:]


def boot_bad_driver(g):
    """A driver that does not fit the kernel: a clear line, no boot loop, the CPU serves."""
    m = g.wait(r"kiln: ready in (\d+\.\d+) s", A.ready_timeout)
    check("bad driver: the box still comes up (`kiln: ready`)", m is not None, "\n" + tail(g, 25))
    if not m:
        raise Abort()
    check("bad driver: kiln-init's line names the module and the kernel's refusal",
          re.search(r"kiln-init: module /lib/modules/[^/]+/extra/nvidia\.ko: finit_module: Exec format error",
                    g.text()) is not None, "\n" + tail(g, 40))
    out = g.cmd("gpu")
    check("bad driver: console `gpu` says the image's driver does not load on this kernel, the CPU serves",
          out is not None and re.search(r"gpu: no NVIDIA GPU on the PCI bus \(\d+ devices\); the image's driver does "
                                        r"not load on this kernel \(nvidia\.ko: Exec format error\): kilnd serves "
                                        r"from the CPU", out), repr(out))
    poweroff(g, "bad driver: `poweroff` ends QEMU with status 0")


# ------------------------------------------------------------------ main

def main():
    global A
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image-dir", default=os.path.join(ROOT, "build", "image"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ref-kilnd", default=os.path.join(ROOT, "build", "gnu", "kilnd"),
                    help="the host kilnd that makes the reference text")
    ap.add_argument("--ref-simd", default=None, help="scalar|avx2|avx512: the reference's SIMD level (default: the guest's, guessed)")
    ap.add_argument("--accel", default=None, help="kvm|tcg (default: qemu/run.sh's choice)")
    ap.add_argument("--cmdline", default="", help="more kernel command line")
    ap.add_argument("--log-dir", default=os.path.join(ROOT, "build", "test-logs"))
    ap.add_argument("--ready-timeout", type=int, default=240)
    ap.add_argument("--gen-timeout", type=int, default=240)
    ap.add_argument("--restart-timeout", type=int, default=120)
    ap.add_argument("--poweroff-timeout", type=int, default=60)
    ap.add_argument("--skip-bad-config", action="store_true")
    ap.add_argument("--skip-bad-driver", action="store_true", help="--gpu: without the boot with a broken nvidia.ko")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU image (default --image-dir build/image-gpu): its driver is tried and refuses (no GPU)")
    A = ap.parse_args()
    if A.gpu:
        A.skip_bad_config = True
        if A.image_dir == os.path.join(ROOT, "build", "image"):
            A.image_dir = os.path.join(ROOT, "build", "image-gpu")
    A.kernel = os.path.join(A.image_dir, "vmlinuz")
    A.initrd = os.path.join(A.image_dir, "initramfs.cpio.gz")
    A.ca = os.path.join(A.image_dir, "tls", "ca.crt")
    A.tokens = os.path.join(A.image_dir, "tokens.txt")
    for f in (A.kernel, A.initrd, A.ca, A.tokens, A.ref_kilnd, A.model):
        if not os.path.exists(f):
            print("boot_test: %s is missing (make image%s; make; make model)" % (f, "-gpu" if A.gpu else ""), file=sys.stderr)
            return 2
    os.makedirs(A.log_dir, exist_ok=True)

    # A SIGTERM (say, from `timeout`) unwinds through the finally below: QEMU is killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ref = {}
    ref_thread = threading.Thread(target=reference, args=(ref,), daemon=True)
    ref_thread.start()
    tmp = tempfile.mkdtemp(prefix="kiln-boot-test-")
    guests = []
    try:
        log = os.path.join(A.log_dir, "qemu-boot-gpu.log" if A.gpu else "qemu-boot.log")
        say("boot 1: %s (console: %s)" % (A.initrd, log))
        g = Guest("boot", A.initrd, log)
        guests.append(g)
        try:
            boot_main(g, ref_thread, ref)
        except Abort:
            pass
        g.kill()
        say("boot 1 done")

        if not A.skip_bad_config:
            bad = os.path.join(tmp, "initramfs-bad.cpio.gz")
            ini = image_file(A.initrd, "etc/kiln/kiln.ini").decode().rstrip("\n") + "\n%s = 8\n" % BAD_KEY  # the last section is [net]
            overlay_initrd(A.initrd, bad, ini)
            say("boot 2: bad config (%s = 8 appended to kiln.ini)" % BAD_KEY)
            g2 = Guest("bad-config", bad, os.path.join(A.log_dir, "qemu-boot-bad-config.log"))
            guests.append(g2)
            try:
                boot_bad_config(g2)
            except Abort:
                pass
            g2.kill()
            say("boot 2 done")
        if A.gpu and not A.skip_bad_driver:
            ver = open(os.path.join(A.image_dir, "kernel.version")).read().strip()
            name = "lib/modules/%s/extra/nvidia.ko" % ver
            bad = os.path.join(tmp, "initramfs-bad-driver.cpio.gz")
            overlay_initrd(A.initrd, bad, files=[(name, bad_vermagic(image_file(A.initrd, name)))])
            say("boot 2: a driver that does not fit (one byte of nvidia.ko's vermagic changed)")
            g2 = Guest("bad-driver", bad, os.path.join(A.log_dir, "qemu-boot-gpu-bad-driver.log"))
            guests.append(g2)
            try:
                boot_bad_driver(g2)
            except Abort:
                pass
            g2.kill()
            say("boot 2 done")
    finally:
        for g in guests:
            g.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    say("%s (%d failed)" % ("PASS" if not FAILED else "FAIL", len(FAILED)))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
