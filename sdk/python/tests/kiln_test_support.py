"""Helpers for the kiln-client tests: the import path, test certificates, and a small
scriptable fake kilnd (TLS, threads) that speaks enough of kiln/1 to drive the clients.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
REPO_ROOT = os.path.normpath(os.path.join(PKG_ROOT, "..", ".."))
if PKG_ROOT not in sys.path:
    sys.path.insert(0, PKG_ROOT)

from kiln.protocol import Line, quote, split_line, stuff_body  # noqa: E402

USER_TOKEN = "user-token-abc"
ADMIN_TOKEN = "admin-token-abc"


# ---------------------------------------------------------------------------- certificates


def _run(args: List[str], cwd: str) -> None:
    subprocess.run(args, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)


def _openssl_ca(d: str, name: str) -> None:
    _run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", name + ".key", "-out", name + ".crt", "-days", "2",
         "-subj", "/CN=kiln-client test " + name,
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign",
         "-addext", "subjectKeyIdentifier=hash"],
        d,
    )  # fmt: skip


def _openssl_leaf(d: str, ca: str, name: str, usage: str) -> None:
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write(
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=%s\n"
            "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid\n" % usage
        )
    _run(
        ["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=localhost"],
        d,
    )  # fmt: skip
    _run(
        ["openssl", "x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
         "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "2",
         "-out", name + ".crt", "-extfile", name + ".ext"],
        d,
    )  # fmt: skip


class Certs:
    """Test certificates in a temporary directory: ``ca`` signed ``server`` (SANs
    localhost and 127.0.0.1) and ``client``; ``other_ca`` signed nothing we use."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="kiln-client-test-")
        self.ca = os.path.join(self.dir, "ca.crt")
        self.server_crt = os.path.join(self.dir, "server.crt")
        self.server_key = os.path.join(self.dir, "server.key")
        self.client_crt = os.path.join(self.dir, "client.crt")
        self.client_key = os.path.join(self.dir, "client.key")
        self.other_ca = os.path.join(self.dir, "other", "ca.crt")

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def make_certs() -> Optional[Certs]:
    """Test certificates made with the openssl command, or with `kilnd certs` from the
    repository's build; None when neither is available."""
    c = Certs()
    os.makedirs(os.path.dirname(c.other_ca))
    if shutil.which("openssl"):
        try:
            _openssl_ca(c.dir, "ca")
            _openssl_leaf(c.dir, "ca", "server", "serverAuth")
            _openssl_leaf(c.dir, "ca", "client", "clientAuth")
            _openssl_ca(os.path.dirname(c.other_ca), "ca")
            return c
        except (subprocess.SubprocessError, OSError):
            pass
    kilnd = os.environ.get("KILND") or os.path.join(REPO_ROOT, "build", "gnu", "kilnd")
    if os.access(kilnd, os.X_OK):
        try:
            _run([kilnd, "certs", "--dir", c.dir], c.dir)
            _run([kilnd, "certs", "--dir", os.path.dirname(c.other_ca)], c.dir)
            return c
        except (subprocess.SubprocessError, OSError):
            pass
    c.cleanup()
    return None


# ---------------------------------------------------------------------------- fake server


class FakeConn:
    """One accepted connection of the fake server.

    Lines sent from another thread than the connection's own (a handler's timer) are
    queued and written by the connection's thread: an SSL socket must not be read and
    written by two threads at once.
    """

    def __init__(self, server: "FakeKiln", sock: ssl.SSLSocket) -> None:
        self.server = server
        self.sock = sock
        self.role = ""
        self.closed = False
        self.gens = 0  # GENs received on this connection
        self.state: Dict[str, object] = {}
        self._wlock = threading.Lock()
        self._owner: Optional[int] = None  # the thread that reads the socket
        self._outq: List[bytes] = []

    def send(self, *lines: str) -> None:
        """Sends lines (newlines added); ignores a closed peer."""
        self.send_raw("".join(ln + "\n" for ln in lines).encode("utf-8"))

    def send_raw(self, data: bytes) -> None:
        with self._wlock:
            if self._owner is not None and threading.get_ident() != self._owner:
                self._outq.append(data)
                return
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def flush(self) -> None:
        """Writes what other threads queued (on the connection's own thread)."""
        with self._wlock:
            todo, self._outq = self._outq, []
            for data in todo:
                try:
                    self.sock.sendall(data)
                except OSError:
                    self.closed = True

    def close(self) -> None:
        """Drops the connection at once (no TLS close_notify). Another thread than the
        reader only shuts it down (the peer sees the loss, the reader wakes to EOF) and
        leaves the close to the reader: the ssl object holds the fd by number, so a
        close under its read could let it read a later connection given that number."""
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._owner is not None and threading.get_ident() != self._owner:
            return
        try:
            self.sock.close()
        except OSError:
            pass


GenHandler = Callable[[FakeConn, Line], None]


def end_line(rid: str, reason: str = "stop", completion: int = 2, sample: Optional[int] = None) -> str:
    s = (
        "END %s reason=%s prompt_tokens=3 completion_tokens=%d cached_tokens=0 ttft_ms=1.5 "
        "tpot_ms=0.5 e2e_ms=2.5" % (rid, reason, completion)
    )
    return s + (" sample=%d" % sample if sample is not None else "")


def default_gen(conn: FakeConn, line: Line) -> None:
    """Answers a GEN with the tokens "Hello", ", ", the prompt; then END (per sample)."""
    rid = line.get("id") or "-"
    n = int(line.get("n") or "1")
    prompt = line.get("prompt") or ""
    for i in range(n):
        tail = " sample=%d" % i if n > 1 else ""
        conn.send(
            "TOK %s %s%s" % (rid, quote("Hello"), tail),
            "TOK %s %s%s" % (rid, quote(", "), tail),
            "TOK %s %s%s" % (rid, quote(prompt), tail),
        )
    for i in range(n):
        conn.send(end_line(rid, completion=3, sample=i if n > 1 else None))


class FakeKiln:
    """A fake kilnd on 127.0.0.1 (a random port) for the client tests.

    ``on_gen(conn, line)`` answers GENs (default: :func:`default_gen`); ``port`` 0
    picks a free one. Every line the
    clients send is recorded in ``lines`` (strings) and ``parsed`` (split strictly with
    kiln.protocol, so a malformed client line fails the test with ``errors``).
    """

    METRICS = "# HELP kiln_up up\n# TYPE kiln_up gauge\nkiln_up 1\n.dotted line\n..two dots\n"

    def __init__(
        self,
        certs: Certs,
        on_gen: Optional[GenHandler] = None,
        require_client_cert: bool = False,
        port: int = 0,
    ) -> None:
        self.certs = certs
        self.on_gen: GenHandler = on_gen or default_gen
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs.server_crt, certs.server_key)
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(certs.ca)
        self.ctx = ctx
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(16)
        self.port: int = self.listener.getsockname()[1]
        self.lines: List[str] = []
        self.parsed: List[Line] = []
        self.errors: List[str] = []
        self.conns: List[FakeConn] = []
        self.gen_count = 0
        self.drop_handshakes = 0  # connections to close after their ClientHello, no alert
        self.level = 0
        self.lock = threading.Lock()
        self.seen = threading.Condition(self.lock)
        self._stop = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        with self.lock:
            drop = self.drop_handshakes > 0
            self.drop_handshakes -= drop
        if drop:  # a box going down mid-handshake: the ClientHello read, then TCP closed
            try:
                raw.recv(4096)
            except OSError:
                pass
            raw.close()
            return
        try:
            sock = self.ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        conn = FakeConn(self, sock)
        conn._owner = threading.get_ident()
        with self.lock:
            self.conns.append(conn)
        buf = b""
        try:
            while not conn.closed:
                conn.flush()
                if not sock.pending() and not select.select([sock], [], [], 0.01)[0]:
                    continue
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    break
                buf += data
                while b"\n" in buf and not conn.closed:
                    line, buf = buf.split(b"\n", 1)
                    self._line(conn, line)
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def _line(self, conn: FakeConn, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        try:
            line = split_line(raw)
        except ValueError as exc:
            with self.lock:
                self.errors.append("%r: %s" % (text, exc))
            conn.send('ERR - 400 bad_request msg=%s' % quote(str(exc)))
            return
        with self.seen:
            self.lines.append(text)
            self.parsed.append(line)
            self.seen.notify_all()
        if not conn.role:
            role = {USER_TOKEN: "user", ADMIN_TOKEN: "admin"}.get(line.get("token") or "")
            if line.verb != "HELLO" or line.pos != ("kiln/1",) or role is None:
                conn.send("ERR - 401 unauthorized")
                conn.close()
                return
            conn.role = role
            conn.send('OK kiln/1 model="fake model" ctx=2048 session=%d role=%s' % (len(self.conns), role))
            return
        v = line.verb
        if v == "GEN":
            with self.lock:
                self.gen_count += 1
                conn.gens += 1
            if self.level >= 3:
                conn.send("ERR %s 503 overloaded retry_after_ms=50" % line.get("id"))
                return
            self.on_gen(conn, line)
        elif v == "CANCEL":
            conn.send(end_line(line.pos[0], reason="cancelled", completion=1))
        elif v == "HEALTH":
            conn.send("HEALTH live=1 ready=1 level=%d running=0 waiting=0 draining=0" % self.level)
        elif v == "STATS":
            conn.send("STATS uptime_s=5 running=0 kv_blocks_used=0 kv_usage=0.0000 prefix_hit_rate=0.5000")
        elif v == "METRICS":
            conn.send(*stuff_body(self.METRICS))
        elif v == "LADDER":
            if conn.role != "admin":
                conn.send('ERR - 403 forbidden msg="an admin token is needed"')
            else:
                lv = line.get("level")
                if lv is not None:
                    self.level = int(lv)
                conn.send("LADDER level=%d" % self.level)
        elif v == "QUIT":
            conn.send("OK bye")
            conn.close()
        else:
            conn.send('ERR - 400 bad_request msg="unknown verb %s"' % v)

    def wait_for(self, pred: Callable[[List[str]], bool], timeout: float = 5.0) -> bool:
        """Waits until pred(lines received so far) holds."""
        with self.seen:
            return self.seen.wait_for(lambda: pred(list(self.lines)), timeout)

    def drop_all(self) -> None:
        """Closes every open connection (the clients see a loss)."""
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            c.close()

    def close(self) -> None:
        """Stops accepting and drops every connection. The listener is shut down first,
        which wakes a blocked accept (a close alone would not, and the accept thread
        could then take a connection from a later socket given the same fd number)."""
        self._stop = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        try:
            self.listener.close()
        except OSError:
            pass
        self.drop_all()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (probably)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port
