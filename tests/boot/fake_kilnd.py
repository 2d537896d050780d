#!/usr/bin/env python3
"""fake_kilnd.py: a stand-in for kilnd that tests/boot/init_test.py hands to kiln-init
(--kilnd). It speaks kiln-init's side of kilnd: the two subcommands kiln-init runs and the
control socket protocol (HB every 500 ms with served=, READY once serving, commands answered
with lines and a "." line).

  fake_kilnd.py check-config --config ROOT/etc/kiln/kiln.ini
      exit 0, or print one line saying what is wrong and exit 1: when ROOT/fake/check-fail
      exists (its text is the message) or when [model] path names no file.
  fake_kilnd.py serve --config ROOT/etc/kiln/kiln.ini --control SOCK

Behaviours are switched by files in ROOT/fake/ (ROOT: three folders above the config):
  crash        serve prints an error line and exits 1 at once (every start)
  hang-once    1 s after READY, stop heartbeating (alive, silent); the file is removed
  exit75-once  0.5 s after READY, exit 75 ("restart me"); the file is removed
  ready-delay  seconds from start to READY (default 0.3)
  served       the GENs served that heartbeats report (default 0), read at every HB
Each serve start appends its pid to ROOT/fake/pids; each command received goes to
ROOT/fake/commands. Standard library only."""
import os
import select
import signal
import socket
import sys
import time


def root_of(config):
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(config))))


def fake_file(root, name):
    return os.path.join(root, "fake", name)


def take_once(root, name):
    """True (and the file removed) if ROOT/fake/name exists."""
    try:
        os.unlink(fake_file(root, name))
        return True
    except FileNotFoundError:
        return False


def ini_get(path, section, key):
    cur = None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("["):
                cur = line.strip("[] ")
            elif cur == section and "=" in line and line.split("=", 1)[0].strip() == key:
                value = line.split("=", 1)[1]
                for c in (" ;", " #"):
                    if c in value:
                        value = value[: value.index(c)]
                return value.strip()
    return None


def args_of(argv):
    opts = {}
    for i in range(0, len(argv) - 1, 2):
        opts[argv[i]] = argv[i + 1]
    return opts


def check_config(opts):
    config = opts["--config"]
    root = root_of(config)
    try:
        with open(fake_file(root, "check-fail")) as f:
            print("kilnd: " + f.read().strip())
        return 1
    except FileNotFoundError:
        pass
    try:
        model = ini_get(config, "model", "path")
    except OSError as e:
        print(f"kilnd: {config}: {e.strerror}")
        return 1
    if not model:
        print(f"kilnd: {config}: [model] path is not set")
        return 1
    if not os.path.isabs(model):
        model = os.path.join(os.path.dirname(config), model)
    if not os.path.exists(model):
        print(f"kilnd: [model] path {model}: no such file")
        return 1
    return 0


class Serve:
    def __init__(self, opts):
        self.config = opts["--config"]
        self.root = root_of(self.config)
        self.sock_path = opts["--control"]
        self.start = time.monotonic()
        self.clients = {}  # socket -> input bytes
        self.hb = 0
        self.next_hb = self.start + 0.5
        self.ready = False
        self.hanging = False
        self.draining = 0
        self.stop_at = None
        self.exit_code = 0
        try:
            with open(fake_file(self.root, "ready-delay")) as f:
                self.ready_delay = float(f.read())
        except FileNotFoundError:
            self.ready_delay = 0.3
        self.hang_at = self.start + self.ready_delay + 1.0 if take_once(self.root, "hang-once") else None
        self.exit75_at = self.start + self.ready_delay + 0.5 if take_once(self.root, "exit75-once") else None

    def served(self):
        try:
            with open(fake_file(self.root, "served")) as f:
                return int(f.read())
        except (FileNotFoundError, ValueError):
            return 0

    def log(self, line):
        print(line, flush=True)

    def record(self, name, text):
        with open(fake_file(self.root, name), "a") as f:
            f.write(text + "\n")

    def send(self, c, lines):
        try:
            c.sendall("".join(l + "\n" for l in lines).encode())
        except OSError:
            self.drop(c)

    def drop(self, c):
        self.clients.pop(c, None)
        c.close()

    def answer(self, cmd):
        words = cmd.split()
        up = time.monotonic() - self.start
        if cmd == "status":
            return [
                "model=fake.gguf", f"uptime_s={up:.0f}", "level=0", "running=0", "waiting=0",
                f"draining={self.draining}", "address=10.0.2.15/24", f"ready={int(self.ready)}",
                f"served={self.served()}",
            ]
        if cmd == "stats":
            return ["STATS running=0 waiting=0 kv_used=0 kv_total=512 level=0 tokens_out=0"]
        if cmd == "drain":
            self.draining = 1
            return ["ok"]
        if cmd == "drain off":
            self.draining = 0
            return ["ok"]
        if cmd == "net":
            return ["address=10.0.2.15/24", "mac=52:54:00:12:34:56", "link=up", "rx_packets=10 tx_packets=12"]
        if cmd == "restart":
            self.stop_at = time.monotonic() + 0.1
            self.exit_code = 75
            return ["ok"]
        if len(words) == 3 and words[:2] == ["config", "get"]:
            sec, _, key = words[2].partition(".")
            value = ini_get(self.config, sec, key)
            return [f"{words[2]} = {value}"] if value is not None else [f"error: unknown key {words[2]}"]
        if len(words) >= 4 and words[:2] == ["config", "set"]:
            if words[2].startswith("bogus."):
                return [f"error: unknown key {words[2]}"]
            return ["ok"]
        if words[:1] == ["debug"]:  # what the console made of its words
            return [f"DEBUG fake {cmd}"]
        return [f"error: unknown command {cmd}"]

    def on_input(self, c):
        try:
            data = c.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.drop(c)
            return
        buf = self.clients[c] + data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            cmd = line.decode(errors="replace").strip()
            self.record("commands", cmd)
            if not self.hanging:
                self.send(c, self.answer(cmd) + ["."])
        if c in self.clients:
            self.clients[c] = buf

    def on_term(self, signo, frame):
        if self.stop_at is None:
            self.log(f"kilnd: signal {signo}: draining (again to stop now)")
            self.stop_at = time.monotonic() + 0.2
            self.exit_code = 0
        else:
            sys.exit(0)

    def timers(self, now):
        if not self.ready and now - self.start >= self.ready_delay:
            self.ready = True
            self.log("kilnd: serving fake.gguf on host 127.0.0.1:8443 (TLS)")
            for c in list(self.clients):
                self.send(c, [f"READY {now - self.start:.2f}"])
        if self.hang_at and now >= self.hang_at and not self.hanging:
            self.hanging = True
            self.log("kilnd: info: fake hang: heartbeats stop")
        if self.exit75_at and now >= self.exit75_at:
            self.log("kilnd: info: fake restart request: exit 75")
            sys.exit(75)
        if now >= self.next_hb:
            self.next_hb += 0.5
            if not self.hanging:
                self.hb += 1
                for c in list(self.clients):
                    self.send(c, [f"HB {self.hb} served={self.served()}"])

    def run(self):
        self.record("pids", str(os.getpid()))
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        if os.path.exists(fake_file(self.root, "crash")):
            self.log("kilnd: error: fake crash at start")
            return 1
        self.log("kilnd: info: loading fake.gguf")
        try:
            os.unlink(self.sock_path)
        except FileNotFoundError:
            pass
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(self.sock_path)
        srv.listen(4)
        while True:
            now = time.monotonic()
            if self.stop_at and now >= self.stop_at:
                return self.exit_code
            self.timers(now)
            r, _, _ = select.select([srv] + list(self.clients), [], [], 0.05)
            for s in r:
                if s is srv:
                    c, _ = srv.accept()
                    self.clients[c] = b""
                    if self.ready:  # connected after kilnd began serving: READY on connect
                        self.send(c, [f"READY {time.monotonic() - self.start:.2f}"])
                elif s in self.clients:
                    self.on_input(s)


def main(argv):
    if len(argv) < 2:
        print("usage: fake_kilnd.py check-config|serve ...", file=sys.stderr)
        return 2
    opts = args_of(argv[2:])
    if argv[1] == "check-config":
        return check_config(opts)
    if argv[1] == "serve":
        return Serve(opts).run()
    print(f"fake_kilnd: unknown subcommand {argv[1]}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
