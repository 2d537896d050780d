"""The parts of the client shared by the blocking and the asyncio clients (no I/O).

:class:`Demux` routes the server's lines of one connection: ``TOK``/``END``/``ERR <id>``
to the request they name, everything else (replies to HEALTH, STATS, METRICS, admin
verbs, and ``ERR -``) to the oldest command waiting for a reply, since the server
answers those in order. Multi-line bodies (METRICS, CONFIG) are collected until their
``.`` line; nothing else is sent in the middle of one.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import (
    KilnAuthError,
    KilnConnectionError,
    KilnError,
    KilnProtocolError,
    KilnTLSError,
)
from .protocol import (
    Line,
    LineError,
    Result,
    Token,
    Usage,
    parse_end,
    parse_err,
    parse_tok,
    split_line,
)

Endpoint = Tuple[str, int]
Notify = Callable[[], None]

#: The longest server line the client accepts (a longer one is a protocol error).
DEFAULT_MAX_LINE = 16 * 1024 * 1024

#: Verbs that have their own methods and cannot go through ``command()``.
RESERVED_VERBS = frozenset({"HELLO", "GEN", "CANCEL", "QUIT", "UPDATE"})

#: Admin or info verbs whose replies are multi-line bodies ending with ``.``.
BODY_VERBS = frozenset({"METRICS"})


def decode(raw: bytes) -> str:
    """Server bytes as text (UTF-8; invalid bytes become U+FFFD)."""
    return raw.decode("utf-8", errors="replace")


class RequestState:
    """One GEN in flight: what the server has sent for it so far."""

    def __init__(self, request_id: str, n: int) -> None:
        self.id = request_id
        self.n = n
        self.events: Deque[Token] = deque()  # TOKs not yet handed to the caller
        self.tokens: List[Token] = []  # every TOK, in order
        self.parts: List[List[str]] = [[] for _ in range(n)]
        self.usages: Dict[int, Usage] = {}
        self.error: Optional[KilnError] = None
        self.done = False
        self.cancel_sent = False
        self.notify: Optional[Notify] = None

    def _wake(self) -> None:
        if self.notify is not None:
            self.notify()

    def on_tok(self, tok: Token) -> None:
        while tok.sample >= len(self.parts):
            self.parts.append([])
        self.parts[tok.sample].append(tok.text)
        self.tokens.append(tok)
        self.events.append(tok)
        self._wake()

    def on_end(self, usage: Usage) -> bool:
        """Records an END; True when the request is over (every sample ended)."""
        self.usages[usage.sample] = usage
        if len(self.usages) >= self.n:
            self.done = True
        self._wake()
        return self.done

    def fail(self, err: KilnError) -> None:
        if self.done:
            return
        self.error = err
        self.done = True
        self._wake()

    def texts(self) -> List[str]:
        return ["".join(p) for p in self.parts]

    def usage_list(self) -> List[Usage]:
        return [self.usages[k] for k in sorted(self.usages)]

    def result(self) -> Result:
        texts = self.texts()
        usages = self.usage_list()
        return Result(
            text=texts[0] if texts else "",
            usage=self.usages.get(0) or (usages[0] if usages else Usage(reason="")),
            texts=texts,
            usages=usages,
            tokens=list(self.tokens),
            id=self.id,
        )


class CommandState:
    """A non-GEN request waiting for its reply (one line, or a body)."""

    def __init__(self, line: str, body: bool) -> None:
        self.line = line
        self.body = body
        self.result: Optional[str] = None
        self.error: Optional[KilnError] = None
        self.done = False
        self.notify: Optional[Notify] = None

    def finish(self, result: Optional[str], error: Optional[KilnError]) -> None:
        if self.done:
            return
        self.result, self.error, self.done = result, error, True
        if self.notify is not None:
            self.notify()


def _first_two_words(raw: bytes) -> Tuple[bytes, bytes]:
    parts = raw.lstrip(b" ").split(b" ", 2)
    return parts[0], (parts[1] if len(parts) > 1 else b"")


class Demux:
    """Routes the lines of one connection to requests and commands."""

    def __init__(self) -> None:
        self.requests: Dict[str, RequestState] = {}
        self.commands: Deque[CommandState] = deque()
        self.conn_error: Optional[KilnError] = None  # an ERR - that concerned the connection
        # GOAWAY: the box is draining; the client leaves it once nothing waits on it
        self.going_away = False
        self.closed = False
        self._body: Optional[List[str]] = None

    def add_request(self, st: RequestState) -> None:
        if self.closed:
            raise KilnConnectionError("the connection is closed")
        self.requests[st.id] = st

    def add_command(self, cmd: CommandState) -> None:
        if self.closed:
            raise KilnConnectionError("the connection is closed")
        self.commands.append(cmd)

    def busy(self) -> bool:
        """True while a request or command waits for the server."""
        return bool(self.requests or self.commands)

    def feed(self, raw: bytes) -> None:
        """Handles one line from the server (without its ``\\n``).

        Raises LineError when the line is not the protocol (the connection cannot go
        on: the caller drops it).
        """
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if self._body is not None:
            self._body_line(raw)
            return
        if not raw.strip(b" "):
            return  # empty lines are allowed
        verb, second = _first_two_words(raw)
        if verb == b"GOAWAY":  # never a command's reply (docs/PROTOCOL.md)
            self.going_away = True
            return
        if verb in (b"TOK", b"END") or (verb == b"ERR" and second != b"-"):
            self._request_line(split_line(raw, strict=False))
            return
        head = self.commands[0] if self.commands else None
        if verb == b"ERR":
            err = parse_err(split_line(raw, strict=False))
            if head is None or err.code in (401, 408, 413):
                # idle timeout, an overlong line of ours: the server closes next
                self.conn_error = err
                return
            self.commands.popleft()
            head.finish(None, err)
            return
        if head is None:
            return  # unsolicited (e.g. "OK bye")
        if head.body:
            self._body = []
            self._body_line(raw)
            return
        self.commands.popleft()
        head.finish(decode(raw), None)

    def _body_line(self, raw: bytes) -> None:
        assert self._body is not None
        if raw == b".":
            lines, self._body = self._body, None
            if self.commands:
                cmd = self.commands.popleft()
                cmd.finish("".join(ln + "\n" for ln in lines), None)
            return
        text = decode(raw)
        self._body.append(text[1:] if text.startswith(".") else text)

    def _request_line(self, line: Line) -> None:
        if len(line.pos) < 1:
            raise LineError("%s without a request id" % line.verb)
        st = self.requests.get(line.pos[0])
        if line.verb == "TOK":
            rid, tok = parse_tok(line)
            if st is not None:
                st.on_tok(tok)
        elif line.verb == "END":
            rid, usage = parse_end(line)
            if st is not None and st.on_end(usage):
                self.requests.pop(rid, None)
        else:
            err = parse_err(line)
            if st is None:
                return
            self.requests.pop(st.id, None)
            if st.cancel_sent and err.code == 404:
                st.done = True  # it ended as we cancelled it
                if st.notify is not None:
                    st.notify()
                return
            st.fail(err)

    def lost(self, make_err: Callable[[], KilnError]) -> None:
        """The connection is gone: every request and command still waiting fails with a
        fresh error from make_err (or the ERR that announced the close)."""
        self.closed = True
        ce = self.conn_error
        reqs = list(self.requests.values())
        cmds = list(self.commands)
        self.requests.clear()
        self.commands.clear()
        self._body = None
        for st in reqs:
            st.fail(ce.copy() if ce is not None and ce.code == 413 else make_err())
        for cmd in cmds:
            cmd.finish(None, make_err())


# ---------------------------------------------------------------------------- options


def make_ssl_context(
    cafile: Optional[str],
    certfile: Optional[str] = None,
    keyfile: Optional[str] = None,
) -> ssl.SSLContext:
    """A client context: verifies the server against cafile (the system's CAs when
    None), TLS 1.2 or newer, host name checked; a client certificate for mTLS."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx


@dataclass
class Options:
    """The settings both clients share (see :class:`kiln.Client`)."""

    endpoints: List[Endpoint]
    token: str
    ssl_context: ssl.SSLContext
    server_hostname: Optional[str]
    connect_timeout: float
    timeout: Optional[float]
    retries: int
    backoff: float
    max_line_bytes: int
    connections_per_host: int = 1

    def sni(self, ep: Endpoint) -> str:
        """The name the server's certificate is checked against for ep."""
        return self.server_hostname or ep[0]


def make_options(
    host: Optional[str],
    port: Optional[int],
    token: str,
    cafile: Optional[str],
    hosts: Optional[Sequence[Endpoint]],
    certfile: Optional[str],
    keyfile: Optional[str],
    server_hostname: Optional[str],
    connect_timeout: float,
    timeout: Optional[float],
    retries: int,
    backoff: float,
    ssl_context: Optional[ssl.SSLContext],
    max_line_bytes: int,
    connections_per_host: int = 1,
) -> Options:
    """Checks and gathers the constructor's arguments. The endpoints are (host, port)
    first, then those of ``hosts`` not already listed, in order."""
    eps: List[Endpoint] = []
    if host is not None:
        eps.append((str(host), int(port if port is not None else 8443)))
    for h in hosts or ():
        ep = (str(h[0]), int(h[1]))
        if ep not in eps:
            eps.append(ep)
    if not eps:
        raise ValueError("no server: give host and port, or hosts")
    if not isinstance(token, str) or not token:
        raise ValueError("token must be a non-empty str")
    if retries < 0:
        raise ValueError("retries must be >= 0")
    if max_line_bytes < 1024:
        raise ValueError("max_line_bytes must be at least 1024")
    cph = connections_per_host
    if isinstance(cph, bool) or not isinstance(cph, int) or cph < 1:
        raise ValueError("connections_per_host must be an int >= 1")
    ctx = ssl_context or make_ssl_context(cafile, certfile, keyfile)
    return Options(
        endpoints=eps,
        token=token,
        ssl_context=ctx,
        server_hostname=server_hostname,
        connect_timeout=float(connect_timeout),
        timeout=None if timeout is None else float(timeout),
        retries=int(retries),
        backoff=float(backoff),
        max_line_bytes=int(max_line_bytes),
        connections_per_host=connections_per_host,
    )


def gen_params(
    chat: bool,
    system: Optional[str],
    max_tokens: Optional[int],
    temperature: Optional[float],
    top_p: Optional[float],
    top_k: Optional[int],
    min_p: Optional[float],
    repeat_penalty: Optional[float],
    repeat_last_n: Optional[int],
    presence_penalty: Optional[float],
    frequency_penalty: Optional[float],
    seed: Optional[int],
    n: int,
    stop: Union[None, str, Sequence[str]],
    logprobs: bool,
    ignore_eos: bool,
    messages: Optional[Sequence[Mapping[str, str]]] = None,
) -> Dict[str, object]:
    """The GEN keys to send: only those that differ from the protocol's defaults."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError("n must be an int >= 1")
    if messages is not None and not chat:
        raise ValueError("messages need chat=True (the model's template renders them)")
    return {
        "messages": messages,
        "chat": True if chat else None,
        "system": system,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "repeat_penalty": repeat_penalty,
        "repeat_last_n": repeat_last_n,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "seed": seed,
        "n": n if n != 1 else None,
        "stop": stop,
        "logprobs": True if logprobs else None,
        "ignore_eos": True if ignore_eos else None,
    }


def command_shape(line: str) -> Tuple[str, bool]:
    """(verb, whether the reply is a multi-line body) of a command() line; ValueError
    for lines that command() cannot send."""
    if "\n" in line or "\r" in line:
        raise ValueError("a command is one line (no CR or LF)")
    try:
        parsed = split_line(line)
    except LineError as exc:
        raise ValueError("not a protocol line: %s" % exc) from None
    if parsed.verb in RESERVED_VERBS:
        raise ValueError("%s has its own method; command() sends other verbs" % parsed.verb)
    body = parsed.verb in BODY_VERBS or (parsed.verb == "CONFIG" and parsed.get("key") is None)
    return parsed.verb, body


def retry_delay(err: KilnError, attempt: int, backoff: float) -> Optional[float]:
    """Seconds to wait before trying a request again after err (attempt counts from
    0), or None when err is not worth a retry. 503 waits retry_after_ms when the server
    gave it, else the backoff (doubling); a lost connection retries at once (the
    reconnect has its own backoff); TLS failures and other errors do not retry."""
    if err.code == 503:
        if err.retry_after_ms is not None:
            return max(0.0, err.retry_after_ms / 1000.0)
        return backoff * (2.0**attempt)
    if isinstance(err, KilnConnectionError) and not isinstance(err, KilnTLSError):
        return 0.0
    return None


def connect_failure(exc: BaseException, ep: Endpoint, during: str) -> KilnError:
    """A KilnError for an exception raised while connecting to ep."""
    where = "%s:%d" % ep
    if isinstance(exc, KilnError):
        return exc
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or exc.reason or str(exc)
        return KilnTLSError(
            "TLS handshake with %s failed: certificate verify failed: %s (%s)"
            % (where, reason, exc.reason or "CERTIFICATE_VERIFY_FAILED")
        )
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        # The server closed the TCP connection (no TLS alert): a box restarting or
        # shedding, worth another round as libkiln's KILN_ECLOSED, not a TLS setup fault.
        return KilnConnectionError(
            "%s: the server closed the connection %s (a client certificate may be required)"
            % (where, during)
        )
    if isinstance(exc, ssl.SSLError):
        return KilnTLSError("TLS error with %s %s: %s" % (where, during, exc.reason or exc))
    if isinstance(exc, (socket.timeout, TimeoutError, asyncio.TimeoutError)):
        return KilnConnectionError("%s: timed out %s" % (where, during))
    if isinstance(exc, OSError):
        return KilnConnectionError("%s: %s %s" % (where, exc.strerror or exc, during))
    if isinstance(exc, LineError):
        return KilnProtocolError("%s: bad reply to HELLO: %s" % (where, exc))
    return KilnConnectionError("%s: %s %s" % (where, exc, during))


class ConnectFailures:
    """Collects the failures of a connect round to decide what to raise."""

    def __init__(self) -> None:
        self.errors: List[KilnError] = []

    def add(self, err: KilnError) -> None:
        """Records a failure; re-raises at once when retrying cannot help (401)."""
        if isinstance(err, KilnAuthError) or err.code == 401:
            raise err
        self.errors.append(err)

    def hopeless(self, since: int) -> bool:
        """True when every failure from index since on was a TLS or protocol failure
        (another round would fail the same way)."""
        errs = self.errors[since:]
        return bool(errs) and all(
            isinstance(e, (KilnTLSError, KilnProtocolError)) for e in errs
        )

    def final(self) -> KilnError:
        """The error to raise after the last round: a TLS error when there was one
        (the most useful to read), else the last failure, listing the others."""
        for e in self.errors:
            if isinstance(e, KilnTLSError):
                return e
        for e in self.errors:
            if isinstance(e, KilnProtocolError):
                return e
        if not self.errors:
            return KilnConnectionError("could not connect")
        seen: List[str] = []
        for e in self.errors:
            if e.msg not in seen:
                seen.append(e.msg)
        return KilnConnectionError("could not connect: " + "; ".join(seen[-4:]))


def rotated(endpoints: Sequence[Endpoint], after: Optional[Endpoint]) -> List[Endpoint]:
    """The host list starting just past ``after`` (a box that said GOAWAY), or as given."""
    eps = list(endpoints)
    if after in eps:
        k = eps.index(after) + 1
        eps = eps[k:] + eps[:k]
    return eps


# ---------------------------------------------------------------------------- balancing

#: The first wait before a host whose connection failed or broke is dialled again;
#: it doubles on each further failure up to RECONNECT_MAX, and starts over once a
#: connection has stayed up for RECONNECT_MAX.
RECONNECT_MIN = 1.0
RECONNECT_MAX = 30.0


class Slot:
    """One of the connections a client keeps: the index-th to endpoint."""

    def __init__(self, endpoint: Endpoint, index: int) -> None:
        self.endpoint = endpoint
        self.index = index
        self.conn: Optional[Any] = None  # a _Conn or _AConn (has demux, dead, endpoint)
        self.dialing = False  # a background dial is under way (asyncio client)
        self.retry_at = 0.0  # time.monotonic() before which it is not dialled again
        self.delay = RECONNECT_MIN  # the wait after its next failure
        self.since = 0.0  # when conn was attached

    def usable(self) -> bool:
        """True when the slot's connection takes new requests (live, no GOAWAY)."""
        c = self.conn
        return c is not None and not c.dead and not c.demux.going_away

    def load(self) -> int:
        """Requests and commands in flight on the slot's connection."""
        d = self.conn.demux if self.conn is not None else None
        return len(d.requests) + len(d.commands) if d is not None else 0


class Pool:
    """The connections of one client: connections_per_host to each endpoint, and which
    one a new request goes to (the fewest in flight; ties in turn).

    Slots are interleaved by host (a0 b0 a1 b1 ...) so that taking ties in turn
    alternates hosts. Only bookkeeping: the clients do the dialling and the I/O.
    """

    def __init__(self, endpoints: Sequence[Endpoint], per_host: int) -> None:
        self.slots: List[Slot] = [Slot(ep, k) for k in range(per_host) for ep in endpoints]
        self._next = 0  # where the turn for ties starts

    def pick(self, draining_too: bool = False) -> Optional[Slot]:
        """The usable slot with the fewest requests in flight, or None. draining_too:
        a live connection that said GOAWAY will do too (when nothing else is left:
        the box answers 503 draining, which the request retries)."""
        n = len(self.slots)
        best: Optional[Slot] = None
        best_at = 0
        for k in range(n):
            i = (self._next + k) % n
            s = self.slots[i]
            ok = s.usable() or (draining_too and s.conn is not None and not s.conn.dead)
            if ok and (best is None or s.load() < best.load()):
                best, best_at = s, i
        if best is not None:
            self._next = (best_at + 1) % n
        return best

    def conns(self) -> List[Any]:
        """The live connections (GOAWAY or not)."""
        return [s.conn for s in self.slots if s.conn is not None and not s.conn.dead]

    def usable(self) -> bool:
        return any(s.usable() for s in self.slots)

    def due(self, now: float) -> List[Slot]:
        """Slots with no connection whose backoff is over (to dial in the background)."""
        return [
            s for s in self.slots
            if (s.conn is None or s.conn.dead) and not s.dialing and s.retry_at <= now
        ]  # fmt: skip

    def dial_order(self, gone_from: Optional[Endpoint]) -> List[Slot]:
        """Every slot without a live connection, by endpoint in the host list's order
        starting past gone_from (the failover order when nothing is usable)."""
        order = rotated([s.endpoint for s in self.slots if s.index == 0], gone_from)
        free = [s for s in self.slots if (s.conn is None or s.conn.dead) and not s.dialing]
        return sorted(free, key=lambda s: (order.index(s.endpoint), s.index))

    def attach(self, slot: Slot, conn: Any, now: float) -> None:
        slot.conn, slot.since, slot.retry_at = conn, now, 0.0

    def failed(self, slot: Slot, now: float) -> None:
        """A dial of slot failed: it waits its backoff, which doubles."""
        slot.retry_at = now + slot.delay
        slot.delay = min(RECONNECT_MAX, slot.delay * 2.0)

    def detach(self, conn: Any, now: float) -> Optional[Slot]:
        """conn is gone (broken, GOAWAY, closed): its slot waits its backoff."""
        for s in self.slots:
            if s.conn is conn:
                s.conn = None
                if now - s.since >= RECONNECT_MAX:
                    s.delay = RECONNECT_MIN
                self.failed(s, now)
                return s
        return None

    def idle_going_away(self) -> List[Any]:
        """Connections that said GOAWAY and have nothing in flight (to close)."""
        return [
            s.conn for s in self.slots
            if s.conn is not None and not s.conn.dead and s.conn.demux.going_away
            and not s.conn.demux.busy()
        ]  # fmt: skip

    def find_request(self, request_id: str) -> Tuple[Optional[Any], Optional[RequestState]]:
        """The live connection and state of an unfinished request, or (None, None)."""
        for c in self.conns():
            st = c.demux.requests.get(request_id)
            if st is not None and not st.done:
                return c, st
        return None, None
