#!/usr/bin/env python3
"""init_test.py KILN_INIT: kiln-init in test mode (--test ROOT --kilnd fake_kilnd.py),
its console driven through a pipe. Each scenario runs its own kiln-init in its own ROOT;
every wait is bounded; kiln-init's process group is killed whatever happens. Exit 0 only
when every scenario passed. Standard library only."""
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_kilnd.py")
BIN = None


class Fail(Exception):
    pass


class Init:
    """One kiln-init in test mode with a fresh ROOT."""

    def __init__(self, files=None, model="fake.gguf", cmdline="kiln.test=1", backend=None, kilnd=None):
        backend = f"backend = {backend}   ; the compute backend\n" if backend else ""
        self.root = tempfile.mkdtemp(prefix="kiln-init-test.")
        for d in ("etc/kiln", "models", "fake", "dev"):
            os.makedirs(os.path.join(self.root, d))
        open(self.path("models/fake.gguf"), "w").close()
        open(self.path("dev/watchdog"), "w").close()  # pets append a byte each
        with open(self.ini, "w") as f:
            f.write(f"; kiln.ini for init_test\n[model]\npath = {self.root}/models/{model}   ; the model\n\n"
                    f"[engine]\n{backend}threads = 0\nmax_batch_size = 8\n\n[net]\ndriver = packet\n")
        for name, text in (files or {}).items():
            os.makedirs(os.path.dirname(self.path(name)), exist_ok=True)
            with open(self.path(name), "w") as f:
                f.write(text)
        self.out = ""
        self.pos = 0
        self.lock = threading.Condition()
        self.t0 = time.monotonic()
        # kilnd: a program in ROOT to run first, with the fake kilnd as its fallback (the GPU
        # image's CUDA kilnd and the CPU one behind it)
        args = ["--kilnd", FAKE]
        if kilnd:
            os.chmod(self.path(kilnd), 0o755)
            args = ["--kilnd", self.path(kilnd), "--kilnd-fallback", FAKE]
        self.p = subprocess.Popen([BIN, "--test", self.root] + args + ["--cmdline", cmdline],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    @property
    def ini(self):
        return self.path("etc/kiln/kiln.ini")

    def path(self, rel):
        return os.path.join(self.root, rel)

    def read(self):
        while True:
            data = self.p.stdout.read1(4096)
            with self.lock:
                if data:
                    self.out += data.decode(errors="replace")
                self.lock.notify_all()
            if not data:
                return

    def expect(self, pattern, timeout):
        """Waits for pattern after what earlier expects matched; returns the match."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        with self.lock:
            while True:
                m = rx.search(self.out, self.pos)
                if m:
                    self.pos = m.end()
                    return m
                left = end - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not self.reader.is_alive()):
                    raise Fail(f"no /{pattern}/ within {timeout} s; output since the last match:\n"
                               + self.out[self.pos:][-3000:])
                self.lock.wait(min(left, 0.2))

    def absent(self, pattern, since):
        """pattern must not appear in the output from offset since on."""
        with self.lock:
            m = re.search(pattern, self.out[since:])
        if m:
            raise Fail(f"unexpected /{pattern}/: {m.group(0)!r}")

    def mark(self):
        with self.lock:
            return len(self.out)

    def send(self, line):
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()

    def pids(self):
        try:
            with open(self.path("fake/pids")) as f:
                return [int(x) for x in f.read().split()]
        except FileNotFoundError:
            return []

    def finish(self, how="poweroff"):
        """Ends kiln-init (console poweroff, SIGTERM or end of input): exit 0, no kilnd left."""
        if how in ("poweroff", "reboot"):
            self.send(how)
        elif how == "sigterm":
            self.p.send_signal(signal.SIGTERM)
        elif how == "eof":
            self.p.stdin.close()
        try:
            rc = self.p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise Fail(f"kiln-init did not exit within 15 s after {how}")
        self.reader.join(5)
        if rc != 0:
            raise Fail(f"kiln-init exited {rc} after {how}; output tail:\n{self.out[-2000:]}")
        if not re.search(r"kiln: (poweroff|reboot) \(test mode: exiting\)", self.out):
            raise Fail("no exit line")
        end = time.monotonic() + 3
        alive = self.pids()
        while alive and time.monotonic() < end:
            alive = [p for p in alive if os.path.exists(f"/proc/{p}") and not zombie(p)]
            time.sleep(0.05)
        if alive:
            raise Fail(f"fake kilnd processes left after kiln-init exited: {alive}")

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(5)
        for pid in self.pids():  # setsid() put each fake kilnd in its own group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].startswith("Z")
    except OSError:
        return True


READY = r"kiln: ready in \d+\.\d\d s \(boot to READY\); kernel uptime \d+\.\d\d s"
AGAIN = r"kiln: kilnd ready again"

# ---------------------------------------------------------------- scenarios


def t_console(k):
    """Boot to READY, then every console command that answers."""
    k.expect(READY, 10)
    k.send("status")
    k.expect(r"kilnd: running, pid \d+", 3)
    k.expect(r"starts 1, failures 0", 3)
    k.expect(r"memory: \d+ MiB available", 3)
    k.expect(r"watchdog: .*armed, petted", 3)
    k.expect(r"kilnd reports:\n  model=fake.gguf\n(  .*\n)*  ready=1\n", 3)
    with open(k.path("fake/served"), "w") as f:  # the HB's served= reaches the supervisor
        f.write("2")
    time.sleep(1.2)
    k.send("status")
    k.expect(r"kilnd: running, pid \d+, .*, 2 GENs served", 3)
    k.send("stats")
    k.expect(r"  STATS running=0", 3)
    k.send("net")
    k.expect(r"  mac=52:54:00:12:34:56", 3)
    k.send("drain")
    k.expect(r"  ok", 3)
    k.send("drain off")
    k.expect(r"  ok", 3)
    k.send("config get model.path")
    k.expect(r"  model.path = .*/models/fake.gguf", 3)
    k.send("config set engine.max_batch_size 4")
    k.expect(r"  ok\nsaved in .*kiln.ini\nnote: without a data partition", 3)
    text = open(k.ini).read()
    if "max_batch_size = 4\n" not in text or "; the model" not in text:
        raise Fail("kiln.ini not rewritten in place:\n" + text)
    k.send("config set bogus.key 1")
    k.expect(r"  error: unknown key bogus.key", 3)
    if "bogus" in open(k.ini).read():
        raise Fail("a refused setting was saved")
    k.send("config set net.newkey 7")
    k.expect(r"saved in", 3)
    if "[net]\ndriver = packet\nnewkey = 7\n" not in open(k.ini).read():
        raise Fail("a new key did not land in its section:\n" + open(k.ini).read())
    k.send("config set sampling.top_k 5")
    k.expect(r"saved in", 3)
    if not open(k.ini).read().endswith("\n[sampling]\ntop_k = 5\n"):
        raise Fail("a new section was not appended:\n" + open(k.ini).read())
    k.send("log 50")
    k.expect(r"\] kilnd: serving fake.gguf", 3)
    k.send("help")
    k.expect(r"test-hang-kilnd", 3)
    k.send("identity")
    k.expect(r"identity: test mode", 3)
    k.send("identity enrol")  # nothing to seal to, or from, in test mode
    k.expect(r"kiln: identity: refused: test mode", 3)
    k.send("frobnicate")
    k.expect(r"unknown command `frobnicate`", 3)
    k.send("log x")
    k.expect(r"usage: log \[n\]", 3)
    # debug: the console's words become kilnd's DEBUG keys
    for typed, sent in (("debug", "debug status"), ("debug open 5", "debug open minutes=5"),
                        ("debug kmsg 20", "debug kmsg lines=20"), ("debug net", "debug net"),
                        ("debug probe 10.0.2.2 443", "debug probe host=10.0.2.2 port=443"),
                        ("debug probe 10.0.2.2 443 500", "debug probe host=10.0.2.2 port=443 timeout_ms=500"),
                        ("debug probe registry.example.internal 443",
                         "debug probe host=registry.example.internal port=443")):
        k.send(typed)
        k.expect(r"  DEBUG fake " + re.escape(sent) + "\n", 3)
    k.send("debug kmsg 101")
    k.expect(r"usage: debug \[open", 3)
    k.send("debug kmsg 1 2")
    k.expect(r"usage: debug \[open", 3)
    k.send('debug open "5')
    k.expect(r"usage: debug \[open", 3)
    # typed ahead while a relayed command waits: taken afterwards, in order
    k.p.stdin.write(b"stats\nnet\nconfig get model.path\nlog 1\n")
    k.p.stdin.flush()
    k.expect(r"  STATS running=0[\s\S]*  mac=52:54[\s\S]*  model.path = [\s\S]*console: log 1", 5)
    if os.path.getsize(k.path("dev/watchdog")) < 1:
        raise Fail("the watchdog was never petted")
    cmds = open(k.path("fake/commands")).read().split("\n")
    for c in ("status", "stats", "net", "drain", "drain off", "config get model.path", "config set engine.max_batch_size 4"):
        if c not in cmds:
            raise Fail(f"kilnd never got {c!r}")


def t_kill(k):
    """test-kill-kilnd: a crash; restarted after the 1 s backoff, READY again."""
    k.expect(READY, 10)
    k.send("test-kill-kilnd")
    k.expect(r"kilnd failed \(killed by signal 9[^)]*\)\); restarting in 1 s", 5)
    k.expect(AGAIN, 8)
    k.send("status")
    k.expect(r"starts 2, failures 1; last exit: killed by signal 9", 3)
    if len(k.pids()) != 2:
        raise Fail(f"expected 2 kilnd starts, got {k.pids()}")


def t_hang(k):
    """test-hang-kilnd (SIGSTOP): local commands still work at once, relayed ones time out
    in 2 s, the watchdog pauses, kilnd is killed after 5 s without heartbeat and comes back."""
    k.expect(READY, 10)
    t = time.monotonic()
    k.send("test-hang-kilnd")
    k.expect(r"sent SIGSTOP", 3)
    k.send("status")
    k.expect(r"kilnd: running, pid \d+", 2)  # the local part does not wait on kilnd
    k.expect(r"kilnd is not answering \(no reply within 2 s\)", 4)
    k.send("log 3")
    k.expect(r"\] kiln-init: console: log 3", 2)
    k.expect(r"kiln: watchdog: not petting: kilnd heartbeat [3-4]\.\d s old", 6)
    size = os.path.getsize(k.path("dev/watchdog"))
    k.expect(r"kiln: killing kilnd \(pid \d+\): no heartbeat for 5\.\d s \(hung\)", 6)
    k.expect(r"kiln: watchdog: petting again", 3)
    k.expect(AGAIN, 6)
    took = time.monotonic() - t
    if took > 9:
        raise Fail(f"hang to READY again took {took:.1f} s")
    time.sleep(1.5)
    if os.path.getsize(k.path("dev/watchdog")) <= size:
        raise Fail("the watchdog is not petted again after the restart")
    print(f"    (hang to READY again: {took:.1f} s)")


def t_hang_file(k):
    """A kilnd that stops heartbeating by itself (alive, silent) is killed and restarted."""
    k.expect(READY, 10)
    k.expect(r"kiln: killing kilnd \(pid \d+\): no heartbeat", 9)
    k.expect(AGAIN, 6)


def t_crash_loop(k):
    """kilnd dies at every start: backoff 1, 2, 4, 8 s, then safe mode; the console works
    there; `restart` leaves it."""
    k.expect(r"restarting in 1 s", 5)
    k.expect(r"restarting in 2 s", 5)
    k.expect(r"restarting in 4 s", 6)
    k.expect(r"restarting in 8 s", 8)
    k.expect(r"kiln: SAFE MODE: crash loop: 5 failures within 60 s; last: exit status 1; "
             r"its last line: kilnd: error: fake crash at start", 12)
    m = k.mark()
    time.sleep(2)
    k.absent(r"starting kilnd", m)
    k.send("status")
    k.expect(r"kilnd: SAFE MODE\nsafe mode: crash loop", 3)
    k.expect(r"kilnd: control socket not connected", 3)
    os.unlink(k.path("fake/crash"))
    k.send("restart")
    k.expect(r"kiln: starting kilnd \(leaving safe mode\)", 3)
    k.expect(READY, 8)
    if len(k.pids()) != 6:
        raise Fail(f"expected 6 starts, got {len(k.pids())}")


def t_bad_config(k):
    """check-config fails: safe mode with its message; the console stays usable; fixing
    the file from the console and `restart` brings kilnd up."""
    k.expect(r"kiln: SAFE MODE: config check failed: kilnd: \[model\] path .*/models/missing.gguf: no such file", 10)
    k.send("status")
    k.expect(r"safe mode: config check failed", 3)
    k.send("config get model.path")
    k.expect(r"model.path = .*missing.gguf   \(from .*kiln.ini; kilnd is not running\)", 3)
    k.send(f"config set model.path {k.root}/models/fake.gguf")
    k.expect(r"saved in .*kiln.ini only \(kilnd is not running", 3)
    if k.pids():
        raise Fail("kilnd serve ran despite a failing config check")
    if not re.search(rf"\npath = {re.escape(k.root)}/models/fake.gguf +; the model\n", open(k.ini).read()):
        raise Fail("model.path not rewritten in place with its comment:\n" + open(k.ini).read())
    k.send("restart")
    k.expect(READY, 8)


def t_check_message(k):
    """check-config's own one-line message is what the console shows."""
    k.expect(r"kiln: SAFE MODE: config check failed: kilnd: tls/server.crt: no such file", 10)
    k.send("help")
    k.expect(r"poweroff", 3)


def t_exit75(k):
    """Exit 75 (kilnd asks for a restart): restarted at once, not a failure."""
    k.expect(READY, 10)
    k.expect(r"kiln: kilnd asked for a restart \(exit 75\); starting it again", 5)
    t = time.monotonic()
    k.expect(AGAIN, 5)
    if time.monotonic() - t > 2.5:
        raise Fail("exit 75 was not restarted at once")
    k.send("status")
    k.expect(r"starts 2, failures 0; last exit: exit status 75", 3)


def t_restart(k):
    """The console's restart: graceful over the control socket (kilnd exits 75)."""
    k.expect(READY, 10)
    k.send("restart")
    k.expect(r"kiln: asked kilnd to restart \(graceful\)", 3)
    k.expect(r"kiln: kilnd stopped \(exit status 75\); starting it again", 5)
    k.expect(AGAIN, 5)
    k.send("status")
    k.expect(r"starts 2, failures 0", 3)


def t_restart_hung(k):
    """restart of a hung kilnd: no answer in 2 s, SIGTERM, then the heartbeat kill; it is
    started again without waiting for a backoff."""
    k.expect(READY, 10)
    k.send("test-hang-kilnd")
    k.expect(r"sent SIGSTOP", 3)
    k.send("restart")
    k.expect(r"kiln: asked kilnd to restart \(graceful\)", 3)
    k.expect(r"kilnd did not answer `restart`: sending SIGTERM", 4)
    k.expect(r"kiln: killing kilnd", 6)
    k.expect(r"kiln: kilnd stopped \(killed by signal 9[^)]*\)\); starting it again", 3)
    k.expect(AGAIN, 5)


def t_password(k):
    """console.pass: the shell wants it; 3 wrong tries lock the console for 10 s."""
    k.expect(r"password: ", 5)
    k.send("status")
    k.expect(r"wrong password", 3)
    k.send("guess")
    k.send("guess2")
    k.expect(r"wrong password 3 times: wait 10 s", 3)
    t = time.monotonic()
    k.send("letmein")  # typed during the pause: dropped
    k.expect(r"password: ", 12)
    if time.monotonic() - t < 8:
        raise Fail("the console was not locked for 10 s")
    k.send("letmein")
    k.expect(r"console unlocked", 3)
    k.send("status")
    k.expect(r"kilnd: (checking the config|starting|running)", 3)


def t_sigterm(k):
    """SIGTERM to kiln-init: kilnd drains (SIGTERM), then kiln-init exits 0 (test mode)."""
    k.expect(READY, 10)
    k.finish("sigterm")
    if "kiln: power off (SIGTERM): stopping kilnd first" not in k.out:
        raise Fail("no shutdown line")
    if "kiln: kilnd stopped (exit status 0)" not in k.out:
        raise Fail("kilnd did not stop by itself (drain)")


def t_eof(k):
    """The console's input ends (the harness is gone): kiln-init powers off, exit 0."""
    k.expect(READY, 10)
    k.finish("eof")


def t_no_test_cmds(k):
    """Without kiln.test=1 the test commands do not exist."""
    k.expect(READY, 10)
    k.send("test-kill-kilnd")
    k.expect(r"unknown command `test-kill-kilnd`", 3)
    k.finish("reboot")
    if "kiln: reboot (console): stopping kilnd first" not in k.out:
        raise Fail("no reboot line")


PCI = {  # a host bridge and one H200 (a 3D controller), as sysfs shows them
    "sys/bus/pci/devices/0000:00:00.0/vendor": "0x8086\n",
    "sys/bus/pci/devices/0000:00:00.0/device": "0x1237\n",
    "sys/bus/pci/devices/0000:00:00.0/class": "0x060000\n",
    "sys/bus/pci/devices/0000:01:00.0/vendor": "0x10de\n",
    "sys/bus/pci/devices/0000:01:00.0/device": "0x2335\n",
    "sys/bus/pci/devices/0000:01:00.0/class": "0x030200\n",
}
NVIDIA = {  # the driver's own /proc view once it is loaded
    "etc/kiln/modules-gpu": "kernel/drivers/video/nvidia.ko\n",
    "proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.163.01\n"
                                  "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
    "proc/driver/nvidia/gpus/0000:01:00.0/information": "Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\n",
    "proc/devices": "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n\nBlock devices:\n"
                    "195 nvidia-frontend\n  8 sd\n",
}


def t_gpu_no_driver(k):
    """An NVIDIA GPU on the bus, no driver in the image: said plainly, kilnd comes up."""
    k.expect(READY, 10)
    k.send("gpu")
    k.expect(r"gpu: 1 NVIDIA GPU\(s\) \(0000:01:00\.0, 10de:2335\), but this image carries no NVIDIA driver "
             r"\(no /etc/kiln/modules-gpu\): kilnd serves from the CPU\ngpu 0000:01:00\.0: 10de:2335, class 030200\n", 3)
    k.send("status")
    k.expect(r"gpu: 1 NVIDIA GPU\(s\) .*carries no NVIDIA driver", 3)
    k.send("log 50")
    k.expect(r"kiln: gpu: 1 NVIDIA GPU", 3)


def t_gpu_driver(k):
    """The driver listed (test mode loads nothing) and its /proc view: the console shows it."""
    k.expect(READY, 10)
    k.send("gpu")
    k.expect(r"gpu: 1 NVIDIA GPU\(s\); test mode: the driver's modules are not loaded, 4 device nodes\n"
             r"gpu 0000:01:00\.0: 10de:2335, class 030200\n"
             r"driver: NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550\.163\.01\n"
             r"driver: GCC version: .*\n"
             r"gpu 0000:01:00\.0: Model: \t\t NVIDIA H200\n", 3)
    # the nodes the CUDA driver opens, with the majors /proc/devices gave
    want = {"nvidiactl": (195, 255), "nvidia0": (195, 0), "nvidia-uvm": (508, 0), "nvidia-uvm-tools": (508, 1)}
    for name, (major, minor) in want.items():
        st = os.stat(k.path("dev/" + name))
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
            raise Fail(f"/dev/{name}: not the character device {major}:{minor}")


def t_gpu_none(k):
    """No NVIDIA device among the PCI functions."""
    k.expect(READY, 10)
    k.send("gpu")
    k.expect(r"gpu: no NVIDIA GPU on the PCI bus \(1 devices\): kilnd serves from the CPU\n", 3)


def t_kilnd_pick(k):
    """The GPU image's CUDA kilnd and its loader in ROOT: chosen for backend = auto."""
    k.expect(r"kiln: kilnd: the CUDA kilnd \(glibc\), backend = auto \(test mode runs --kilnd\)", 5)
    k.expect(READY, 10)


def t_kilnd_pick_cpu(k):
    """backend = cpu in kiln.ini: the static musl kilnd even in the GPU image."""
    k.expect(r"kiln: kilnd: the CPU kilnd \(static musl\): backend = cpu \(test mode", 5)
    k.expect(READY, 10)


def t_kilnd_pick_none(k):
    """No CUDA kilnd (the plain image): the CPU one, and why."""
    k.expect(r"kiln: kilnd: the CPU kilnd \(static musl\): this image has no CUDA kilnd", 5)
    k.expect(READY, 10)


CUDA_KILND = {"bin/kilnd-cuda": "", "lib64/ld-linux-x86-64.so.2": ""}


def t_fallback_exec(k):
    """A kilnd that cannot be executed (its interpreter is missing, as a CUDA kilnd whose
    loader is gone): the fallback (the CPU kilnd) serves instead of safe mode."""
    k.expect(r"kiln: \S+/bin/kilnd-cuda cannot serve \(its config check exit status 127[^\n]*\): "
             r"running \S+fake_kilnd\.py instead", 10)
    k.expect(READY, 10)
    k.send("status")
    k.expect(r"kilnd: running", 3)


def t_fallback_crash(k):
    """A kilnd whose config check passes but which dies at every start (a driver crash):
    after the crash loop the fallback serves, not safe mode."""
    k.expect(r"kiln: \S+/bin/kilnd-cuda cannot serve \(crash loop: 5 failures within 60 s; last: [^\n]*\): "
             r"running \S+fake_kilnd\.py instead", 40)
    k.expect(READY, 10)
    if "SAFE MODE" in k.out:
        raise Fail("safe mode entered although a fallback was there")

SCENARIOS = [
    ("console commands", t_console, {}, {}),
    ("test-kill-kilnd restarts", t_kill, {}, {}),
    ("hung kilnd killed and restarted", t_hang, {}, {}),
    ("silent kilnd killed and restarted", t_hang_file, {"fake/hang-once": ""}, {}),
    ("crash loop -> safe mode -> restart", t_crash_loop, {"fake/crash": ""}, {}),
    ("bad config -> safe mode, fixed from the console", t_bad_config, {}, {"model": "missing.gguf"}),
    ("check-config message shown", t_check_message, {"fake/check-fail": "tls/server.crt: no such file"}, {}),
    ("exit 75 -> immediate restart", t_exit75, {"fake/exit75-once": ""}, {}),
    ("console restart (graceful)", t_restart, {}, {}),
    ("console restart of a hung kilnd", t_restart_hung, {}, {}),
    ("console password", t_password, {"etc/kiln/console.pass": "letmein\n"}, {}),
    ("SIGTERM -> drain -> exit 0", t_sigterm, {}, {"finish": None}),
    ("end of input -> exit 0", t_eof, {}, {"finish": None}),
    ("test commands need kiln.test=1; reboot -> exit 0", t_no_test_cmds, {}, {"cmdline": "quiet", "finish": None}),
    ("gpu: an NVIDIA GPU, no driver in the image", t_gpu_no_driver, PCI, {}),
    ("gpu: the driver's view", t_gpu_driver, {**PCI, **NVIDIA}, {}),
    ("gpu: none on the bus", t_gpu_none, {k: v for k, v in PCI.items() if "0000:00:00.0" in k}, {}),
    ("kilnd: the CUDA one in a GPU image", t_kilnd_pick, CUDA_KILND, {}),
    ("kilnd: backend = cpu picks the CPU one", t_kilnd_pick_cpu, CUDA_KILND, {"backend": "cpu"}),
    ("kilnd: the CPU one without a CUDA kilnd", t_kilnd_pick_none, {}, {}),
    ("kilnd: one that cannot execute gives way to the fallback", t_fallback_exec,
     {"bin/kilnd-cuda": "#!/nonexistent/ld-linux-x86-64.so.2\n"}, {"kilnd": "bin/kilnd-cuda"}),
    ("kilnd: a crash loop gives way to the fallback", t_fallback_crash,
     {"bin/kilnd-cuda": "#!/bin/sh\n[ \"$1\" = check-config ] && exit 0\necho 'libcuda: segfault (test)'\nexit 139\n"},
     {"kilnd": "bin/kilnd-cuda"}),
]


def main(argv):
    global BIN
    BIN = os.path.abspath(argv[1])
    only = argv[2:]  # optional scenario name substrings
    failed = []
    for name, fn, files, opts in SCENARIOS:
        if only and not any(o in name for o in only):
            continue
        t = time.monotonic()
        k = Init(files=files, model=opts.get("model", "fake.gguf"), cmdline=opts.get("cmdline", "kiln.test=1"),
                 backend=opts.get("backend"), kilnd=opts.get("kilnd"))
        try:
            fn(k)
            if opts.get("finish", "poweroff"):
                k.finish("poweroff")
            print(f"ok   {name} ({time.monotonic() - t:.1f} s)", flush=True)
        except Fail as e:
            failed.append(name)
            print(f"FAIL {name}: {e}", flush=True)
        finally:
            k.kill()
    if failed:
        print(f"init_test: {len(failed)} failed: {', '.join(failed)}")
        return 1
    print("init_test: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
