"""The blocking kiln client: TLS connections to one or more boxes, many requests in
flight on each.

Example::

    from kiln import Client

    with Client("kiln.local", 8443, token="...", cafile="ca.crt") as c:
        print(c.generate("Why is the sky blue?", max_tokens=40).text)
        s = c.stream("Count to ten:", temperature=0)
        for tok in s:
            print(tok.text, end="", flush=True)
        print(s.usage)

The client connects in its constructor (pass ``connect=False`` to connect on first use)
and reconnects by itself when the connection is lost. It is **not thread-safe**: use
one client per thread (or :class:`kiln.aio.AsyncClient` for concurrency in one thread).
Several streams may still be in flight at once on one client: reading one stream's
tokens queues the lines of the others, which are handed out when those are iterated.
With several hosts (or ``connections_per_host`` > 1) it keeps a connection to each and
sends each new request over the one with the fewest requests in flight.
"""

from __future__ import annotations

import hashlib
import itertools
import select
import socket
import ssl
import time
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ._core import (
    DEFAULT_MAX_LINE,
    CommandState,
    ConnectFailures,
    Demux,
    Endpoint,
    Options,
    Pool,
    RequestState,
    Slot,
    command_shape,
    connect_failure,
    gen_params,
    make_options,
    retry_delay,
)
from .errors import (
    KilnAuthError,
    KilnConnectionError,
    KilnError,
    KilnProtocolError,
    KilnTimeoutError,
)
from .protocol import (
    Health,
    HelloInfo,
    LineError,
    Result,
    Token,
    Usage,
    build_cancel,
    build_gen,
    build_hello,
    parse_err,
    parse_health,
    parse_hello_reply,
    parse_stats,
    split_line,
)

__all__ = ["Client", "Stream"]

_RECV = 65536


class _Conn:
    """One TLS connection with its line buffer and demultiplexer."""

    def __init__(self, sock: ssl.SSLSocket, endpoint: Endpoint, max_line: int) -> None:
        self.sock = sock
        self.endpoint = endpoint
        self.max_line = max_line
        self.demux = Demux()
        self.dead = False
        self.hello: Optional[HelloInfo] = None
        self._buf = bytearray()
        self._scan = 0

    def send(self, data: bytes, timeout: Optional[float]) -> None:
        """Writes data (raises OSError/ssl.SSLError when the connection fails)."""
        self.sock.settimeout(timeout)
        self.sock.sendall(data)

    def read_line(self, deadline: Optional[float]) -> bytes:
        """The next line without its ``\\n``. Raises KilnTimeoutError at the deadline
        (time.monotonic()), EOFError when the server closed the connection,
        KilnProtocolError for a line over max_line bytes, OSError/SSLError."""
        while True:
            i = self._buf.find(b"\n", self._scan)
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 1]
                self._scan = 0
                return line
            self._scan = len(self._buf)
            if len(self._buf) > self.max_line:
                raise KilnProtocolError(
                    "the server sent a line longer than %d bytes" % self.max_line
                )
            timeout: Optional[float] = None
            if deadline is not None:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    raise KilnTimeoutError("no reply from the server in time")
            self.sock.settimeout(timeout)
            try:
                data = self.sock.recv(_RECV)
            except socket.timeout:
                raise KilnTimeoutError("no reply from the server in time") from None
            if not data:
                raise EOFError("the server closed the connection")
            self._buf += data

    def poll(self) -> bool:
        """Reads what has already arrived, without waiting; True when a whole line is
        buffered. Raises EOFError when the server closed, OSError/SSLError."""
        while len(self._buf) <= self.max_line and (
            self.sock.pending() or select.select([self.sock], [], [], 0)[0]
        ):
            self.sock.settimeout(0.0)
            try:
                data = self.sock.recv(_RECV)
            except (ssl.SSLWantReadError, BlockingIOError):
                break
            if not data:
                raise EOFError("the server closed the connection")
            self._buf += data
        return self.has_line()

    def has_line(self) -> bool:
        return self._buf.find(b"\n") >= 0

    def close(self) -> None:
        self.dead = True
        try:
            self.sock.close()
        except OSError:
            pass


class Stream(Iterator[Token]):
    """The tokens of one generation, as they arrive (returned by
    :meth:`Client.stream`; the GEN is already sent when you get it).

    Iterate it for :class:`~kiln.protocol.Token` objects. After the last one,
    :attr:`usage` (sample 0) and :attr:`usages` (every sample) hold the END lines.
    :meth:`close` (or leaving a ``with`` block, or dropping the last reference to an
    unfinished stream) sends CANCEL. Before the first token is handed out, a 503 or a
    lost connection is retried (up to the client's ``retries``); after it, errors are
    raised from the iteration.
    """

    def __init__(
        self,
        client: "Client",
        prompt: Optional[str],
        params: Dict[str, object],
        n: int,
        restartable: bool = False,
    ) -> None:
        self._client = client
        self._prompt = prompt
        self._params = params
        self._n = n
        self._restartable = restartable
        self._attempt = 0
        self._delivered = 0
        self._closed = False
        self._conn: Optional[_Conn] = None
        self._state: Optional[RequestState] = None
        self._start()

    def _start(self) -> None:
        client = self._client
        conn = client._ensure()
        rid = client._new_id()
        line = build_gen(rid, self._prompt, self._params)
        st = RequestState(rid, self._n)
        conn.demux.add_request(st)
        self._state, self._conn = st, conn
        client._send(conn, line)

    def _retry(self, err: KilnError) -> bool:
        opts = self._client._opts
        if self._attempt >= opts.retries:
            return False
        delay = retry_delay(err, self._attempt, opts.backoff)
        if delay is None:
            return False
        self._attempt += 1
        if delay > 0:
            time.sleep(delay)
        self._delivered = 0
        self._start()
        return True

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Token:
        while True:
            st = self._state
            if self._closed or st is None or self._conn is None:
                raise StopIteration
            if (
                st.error is not None
                and (self._delivered == 0 or self._restartable)
                and self._retry(st.error)
            ):
                continue
            if st.events:
                self._delivered += 1
                return st.events.popleft()
            if st.done:
                self._closed = True
                if st.error is not None:
                    raise st.error
                raise StopIteration
            try:
                self._client._wait(self._conn, lambda: bool(st.events) or st.done)
                if not (st.events or st.done):  # the connection went away under it
                    st.fail(KilnConnectionError("the connection is closed"))
            except KilnTimeoutError as exc:
                self.close()
                exc.request_id = st.id
                raise
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Stops reading; sends CANCEL if the request is still running. The END that
        answers it still fills :attr:`usage` when the client reads it later."""
        if self._closed:
            return
        self._closed = True
        st, conn = self._state, self._conn
        if st is not None and conn is not None and not st.done and not st.cancel_sent:
            self._client._cancel_state(conn, st)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            st, conn = self._state, self._conn
            if not self._closed and st is not None and conn is not None and not st.done:
                self._closed = True
                self._client._cancel_state(conn, st)
        except Exception:
            pass

    @property
    def id(self) -> str:
        """The request id of the current attempt."""
        return self._state.id if self._state is not None else ""

    @property
    def done(self) -> bool:
        """True once the request is over (END of every sample, or an error)."""
        return self._state is not None and self._state.done

    @property
    def usage(self) -> Optional[Usage]:
        """The END of sample 0, once it has come (None before)."""
        return self._state.usages.get(0) if self._state is not None else None

    @property
    def usages(self) -> List[Usage]:
        """The END of every sample that has ended, by sample."""
        return self._state.usage_list() if self._state is not None else []

    @property
    def text(self) -> str:
        """The text of sample 0 received so far."""
        return self._state.texts()[0] if self._state is not None else ""

    @property
    def texts(self) -> List[str]:
        """The text of each sample received so far."""
        return self._state.texts() if self._state is not None else []

    def result(self) -> Result:
        """Everything received so far as a Result (complete once the stream is done)."""
        if self._state is None:
            raise KilnError("the stream never started")
        return self._state.result()


class Client:
    """A blocking client of one kilnd server, or of several it balances across.

    Args:
        host, port: the server. ``hosts`` adds more (host, port) pairs, listed after
            (host, port) (duplicates are skipped); ``host`` may be None when ``hosts``
            is given. The client keeps a connection to every host that answers and
            sends each new request (or command) over the connection with the fewest
            requests in flight, taking ties in turn. A host that fails to connect, or
            whose connection broke, is dialled again after a backoff (1 s doubling to
            30 s); one that said GOAWAY (draining) takes no new requests. When no
            connection is left, the next request reconnects trying the hosts in order
            (after the one that said GOAWAY), as a failover.
        token: the HELLO token (a user or admin token of the server's tokens file).
        cafile: the CA certificate that signed the server's; None: the system's CAs.
        certfile, keyfile: a client certificate for mTLS.
        server_hostname: the name checked against the server's certificate (default:
            the host being connected to).
        connect_timeout: seconds for TCP + TLS + HELLO, per host.
        timeout: the longest wait, in seconds, for the next line of a request
            (first token, next token, END, a command's reply); None waits forever.
        retries: how many times a request is tried again after a 503 or a lost
            connection (before its first token), and how many extra rounds over the
            hosts a reconnect makes.
        backoff: the first wait between connect rounds (and for a 503 without
            retry_after_ms), doubling each time.
        ssl_context: use this context instead of building one from cafile/certfile.
        max_line_bytes: the longest server line accepted (16 MiB by default).
        connections_per_host: how many connections to keep to each host (default 1);
            more spread one balancer address (HAProxy in TCP mode balances
            connections) over several boxes.
        connect: connect in the constructor (default: to every host, one after
            another); False: on first use.

    Attributes ``model``, ``ctx``, ``role``, ``session`` and ``endpoint`` describe the
    connection the last request went to (None before the first).

    Errors: a wrong token raises :class:`~kiln.errors.KilnAuthError` (``code`` 401)
    at once; a certificate the CA did not sign raises
    :class:`~kiln.errors.KilnTLSError`; an unreachable server raises
    :class:`~kiln.errors.KilnConnectionError` after ``retries`` rounds.

    Not thread-safe: one thread at a time may use a Client.
    """

    def __init__(
        self,
        host: Optional[str],
        port: Optional[int],
        token: str,
        cafile: Optional[str] = None,
        *,
        hosts: Optional[Sequence[Endpoint]] = None,
        certfile: Optional[str] = None,
        keyfile: Optional[str] = None,
        server_hostname: Optional[str] = None,
        connect_timeout: float = 5.0,
        timeout: Optional[float] = 60.0,
        retries: int = 3,
        backoff: float = 0.2,
        ssl_context: Optional[ssl.SSLContext] = None,
        max_line_bytes: int = DEFAULT_MAX_LINE,
        connections_per_host: int = 1,
        connect: bool = True,
    ) -> None:
        self._opts: Options = make_options(
            host, port, token, cafile, hosts, certfile, keyfile, server_hostname,
            connect_timeout, timeout, retries, backoff, ssl_context, max_line_bytes,
            connections_per_host,
        )  # fmt: skip
        self._pool = Pool(self._opts.endpoints, self._opts.connections_per_host)
        self._ids = itertools.count(1)
        self._gone_from: Optional[Endpoint] = None  # the last box that said GOAWAY
        self._busy = False
        self._closed = False
        self._deferred: List[Tuple[_Conn, RequestState]] = []
        self.model: Optional[str] = None
        self.ctx: Optional[int] = None
        self.role: Optional[str] = None
        self.session: Optional[int] = None
        self.endpoint: Optional[Endpoint] = None
        if connect:
            self.connect()

    # ------------------------------------------------------------------ connection

    def connect(self) -> "Client":
        """Connects now (to every host; a no-op when connected). Returns self."""
        self._prepare()
        conns = self._pool.conns()
        if conns and self.endpoint is None:
            self._describe(conns[0])
        return self

    @property
    def connected(self) -> bool:
        """True while the client holds a live connection."""
        return bool(self._pool.conns())

    @property
    def connections(self) -> List[Endpoint]:
        """The endpoint of each live connection (one per connection)."""
        return [c.endpoint for c in self._pool.conns()]

    def _new_id(self) -> str:
        return "r%d" % next(self._ids)

    def _ensure(self) -> _Conn:
        """The connection for a new request: the usable one with the fewest in flight
        (ties in turn)."""
        self._prepare()
        pool = self._pool
        slot = pool.pick() or pool.pick(draining_too=True)
        if slot is None or slot.conn is None:
            raise KilnConnectionError("no connection to any host")
        conn: _Conn = slot.conn
        self._describe(conn)
        return conn

    def _describe(self, conn: _Conn) -> None:
        hello = conn.hello
        assert hello is not None
        self.model, self.ctx, self.role, self.session = (
            hello.model, hello.ctx, hello.role, hello.session,
        )  # fmt: skip
        self.endpoint = conn.endpoint

    def _prepare(self) -> None:
        """Closes idle connections that said GOAWAY, reconnects when none is usable
        (failover over the host list, with rounds; raises when that fails), then dials
        the hosts whose backoff is over."""
        if self._closed:
            raise KilnError("the client is closed")
        pool = self._pool
        if not self._busy:
            for conn in pool.conns():
                self._poll(conn)
        for conn in pool.idle_going_away():
            self._gone_from = conn.endpoint  # draining: the next box in the list
            self._drop(conn, KilnConnectionError("%s:%d is draining (GOAWAY)" % conn.endpoint))
        if not pool.usable() and pool.dial_order(self._gone_from):
            try:
                self._dial()
            except KilnError:
                if not pool.conns():
                    raise  # else: the draining ones answer (503, retried)
        for slot in pool.due(time.monotonic()):
            self._dial_slot(slot)
        if self._deferred and not self._busy:
            self._flush_cancels()

    def _dial_slot(self, slot: Slot) -> None:
        """One try at slot's host; a failure only sets its backoff."""
        try:
            conn = self._dial_one(slot.endpoint)
        except Exception:  # noqa: BLE001 - tried again after the backoff
            self._pool.failed(slot, time.monotonic())
            return
        self._pool.attach(slot, conn, time.monotonic())

    def _dial(self) -> _Conn:
        """Connects one slot, trying the hosts in order (past the one that said
        GOAWAY) for up to retries + 1 rounds; raises when every try failed."""
        opts = self._opts
        pool = self._pool
        fails = ConnectFailures()
        delay = opts.backoff
        for rnd in range(opts.retries + 1):
            start = len(fails.errors)
            seen: List[Endpoint] = []
            for slot in pool.dial_order(self._gone_from):
                if slot.endpoint in seen:
                    continue  # one try per host and round
                seen.append(slot.endpoint)
                ep = slot.endpoint
                try:
                    conn = self._dial_one(ep)
                except KilnAuthError:
                    raise
                except Exception as exc:  # noqa: BLE001 - every failure is classified
                    pool.failed(slot, time.monotonic())
                    fails.add(connect_failure(exc, ep, "while connecting"))
                    continue
                pool.attach(slot, conn, time.monotonic())
                return conn
            if rnd == opts.retries or fails.hopeless(start):
                break
            time.sleep(delay)
            delay *= 2
        raise fails.final()

    def _dial_one(self, ep: Endpoint) -> _Conn:
        opts = self._opts
        deadline = time.monotonic() + opts.connect_timeout
        raw = socket.create_connection(ep, timeout=opts.connect_timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = opts.ssl_context.wrap_socket(raw, server_hostname=opts.sni(ep))
        except BaseException:
            raw.close()
            raise
        conn = _Conn(sock, ep, opts.max_line_bytes)
        try:
            conn.send((build_hello(opts.token) + "\n").encode("utf-8"), opts.connect_timeout)
            try:
                line = conn.read_line(deadline)
            except KilnTimeoutError:
                raise KilnConnectionError(
                    "%s:%d: no reply to HELLO within %.1f s" % (ep + (opts.connect_timeout,))
                ) from None
            except EOFError:
                raise KilnConnectionError(
                    "%s:%d: the server closed the connection before replying to HELLO" % ep
                ) from None
            conn.hello = parse_hello_reply(split_line(line, strict=False))
        except BaseException:
            conn.close()
            raise
        return conn

    def _drop(self, conn: _Conn, err: KilnError) -> None:
        """Closes conn and fails everything in flight on it with copies of err."""
        conn.close()
        conn.demux.lost(err.copy)
        self._pool.detach(conn, time.monotonic())

    def _lost(self, conn: _Conn, why: object) -> None:
        ep = "%s:%d" % conn.endpoint
        self._drop(conn, KilnConnectionError("connection to %s lost: %s" % (ep, why)))

    def _send(self, conn: _Conn, line: str) -> None:
        """Sends one line; a failure drops the connection (what waits on it fails)."""
        if conn.dead:
            conn.demux.lost(lambda: KilnConnectionError("the connection is closed"))
            return
        self._busy = True
        try:
            conn.send((line + "\n").encode("utf-8"), self._opts.timeout)
        except (OSError, ssl.SSLError) as exc:
            self._lost(conn, exc)
        finally:
            self._busy = False

    def _pump(self, conn: _Conn, deadline: Optional[float]) -> None:
        """Reads and routes one line (KilnTimeoutError at the deadline)."""
        self._busy = True
        try:
            line = conn.read_line(deadline)
            conn.demux.feed(line)
        except KilnTimeoutError:
            raise
        except KilnProtocolError as exc:
            self._drop(conn, exc)
        except LineError as exc:
            self._drop(conn, KilnProtocolError("the server sent a malformed line: %s" % exc))
        except EOFError as exc:
            self._lost(conn, exc)
        except (OSError, ssl.SSLError) as exc:
            self._lost(conn, exc)
        finally:
            self._busy = False

    def _poll(self, conn: _Conn) -> None:
        """Routes the lines conn already has, without waiting: ENDs of other streams
        lower its load, a GOAWAY is seen before a request is sent there."""
        try:
            if not conn.poll():
                return
        except (EOFError, OSError, ssl.SSLError) as exc:
            self._lost(conn, exc)
            return
        while not conn.dead and conn.has_line():
            self._pump(conn, None)

    def _wait(self, conn: _Conn, cond: Callable[[], bool]) -> None:
        """Reads lines until cond() holds or conn is gone; KilnTimeoutError when no
        line makes it true within the client's timeout."""
        t = self._opts.timeout
        deadline = None if t is None else time.monotonic() + t
        while not cond():
            if conn.dead:
                return
            self._pump(conn, deadline)

    def _cancel_state(self, conn: _Conn, st: RequestState, defer: bool = False) -> None:
        st.cancel_sent = True
        if conn.dead or st.done:
            return
        if defer or self._busy:
            self._deferred.append((conn, st))
            return
        self._send(conn, build_cancel(st.id))

    def _flush_cancels(self) -> None:
        todo, self._deferred = self._deferred, []
        for c, st in todo:
            if not c.dead and not st.done:
                self._send(c, build_cancel(st.id))

    def close(self) -> None:
        """Closes the connections (the servers cancel what is still running)."""
        if self._closed:
            return
        self._closed = True
        for conn in self._pool.conns():
            try:
                conn.send(b"QUIT\n", 0.5)
            except (OSError, ssl.SSLError):
                pass
            self._drop(conn, KilnConnectionError("the client was closed"))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            for conn in self._pool.conns():
                conn.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ generation

    def stream(
        self,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Sequence[Mapping[str, str]]] = None,
        chat: bool = True,
        system: Optional[str] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        seed: Optional[int] = None,
        n: int = 1,
        stop: Union[None, str, Sequence[str]] = None,
        logprobs: bool = False,
        ignore_eos: bool = False,
    ) -> Stream:
        """Sends a GEN and returns a :class:`Stream` of its tokens.

        ``chat`` applies the model's chat template (the protocol's default is off;
        this client's is on). Parameters left None are not sent: the server's
        configured defaults apply. See docs/PROTOCOL.md for the ranges.

        ``messages=[{"role": "system"|"user"|"assistant", "content": "..."}, ...]``
        sends a whole conversation instead of ``prompt`` (give one or the other; the
        system message then goes first in the list, not in ``system``): the server
        renders it through the model's chat template, as the OpenAI API does, and the
        last message must be the user's.
        """
        params = gen_params(
            chat, system, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty,
            repeat_last_n, presence_penalty, frequency_penalty, seed, n, stop, logprobs,
            ignore_eos, messages,
        )  # fmt: skip
        build_gen("check", prompt, params)  # type errors before anything is sent
        return Stream(self, prompt, params, n)

    def generate(
        self,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Sequence[Mapping[str, str]]] = None,
        chat: bool = True,
        system: Optional[str] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        seed: Optional[int] = None,
        n: int = 1,
        stop: Union[None, str, Sequence[str]] = None,
        logprobs: bool = False,
        ignore_eos: bool = False,
    ) -> Result:
        """Generates and waits for the whole output; returns a :class:`Result`.

        Takes the parameters of :meth:`stream`. A 503 is retried after the server's
        retry_after_ms; a lost connection is retried from the start on a new one
        (nothing was handed out yet), both up to ``retries`` times; then the error is
        raised (:class:`~kiln.errors.KilnError` with ``code`` 503, or
        :class:`~kiln.errors.KilnConnectionError`).
        """
        params = gen_params(
            chat, system, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty,
            repeat_last_n, presence_penalty, frequency_penalty, seed, n, stop, logprobs,
            ignore_eos, messages,
        )  # fmt: skip
        build_gen("check", prompt, params)
        s = Stream(self, prompt, params, n, restartable=True)
        try:
            for _ in s:
                pass
        finally:
            if not s.done:
                s.close()
        return s.result()

    def cancel(self, request_id: str) -> bool:
        """Sends CANCEL for a request of this client in flight (``Stream.id``) on
        whichever connection carries it; False (nothing sent) when there is none."""
        conn, st = self._pool.find_request(request_id)
        if conn is None or st is None:
            return False
        self._cancel_state(conn, st)
        return True

    # ------------------------------------------------------------------ commands

    def _command(
        self, line: str, body: bool, retryable: bool = True, on: Optional[_Conn] = None
    ) -> str:
        """Sends a command over the least busy connection (or over ``on``) and returns
        its reply; a lost connection retries it (elsewhere) when retryable."""
        attempt = 0
        while True:
            conn = on if on is not None else self._ensure()
            cmd = CommandState(line, body)
            conn.demux.add_command(cmd)
            self._send(conn, line)
            self._wait(conn, lambda: cmd.done)
            if not cmd.done:  # the connection went away under it
                cmd.finish(None, KilnConnectionError("the connection is closed"))
            if cmd.error is not None:
                if (
                    retryable
                    and attempt < self._opts.retries
                    and retry_delay(cmd.error, attempt, self._opts.backoff) == 0.0
                ):
                    attempt += 1
                    continue
                raise cmd.error
            assert cmd.result is not None
            return cmd.result

    def health(self) -> Health:
        """HEALTH: liveness, readiness, the ladder's level, running and waiting."""
        return parse_health(split_line(self._command("HEALTH", False), strict=False))

    def stats(self) -> Dict[str, Union[int, float]]:
        """STATS as a dict of numbers (running, kv_blocks_used, requests_total ...)."""
        return parse_stats(split_line(self._command("STATS", False), strict=False))

    def metrics(self) -> str:
        """METRICS: the Prometheus text, dot-unstuffed."""
        return self._command("METRICS", True)

    def command(self, line: str) -> str:
        """Sends another verb (admin verbs: ``"LADDER level=3"``, ``"DRAIN"``,
        ``"CONFIG key=engine.max_seq_len"``, ``"RELOAD"`` ...) and returns the reply
        line (for CONFIG without a key and METRICS: the body's text). An ERR reply
        raises KilnError (403 on a user connection). HELLO, GEN, CANCEL and QUIT
        have their own methods and raise ValueError here."""
        verb, body = command_shape(line)
        return self._command(line.strip(" "), body, retryable=verb not in ("RESTART", "REBOOT"))

    def update(
        self,
        path: str,
        tries: int = 3,
        progress: Optional[Callable[[int, int], None]] = None,
        timeout: float = 300.0,
    ) -> Dict[str, str]:
        """UPDATE (admin): streams the signed image bundle at ``path`` (what
        ``kiln-image sign`` makes) into the box's inactive slot; kiln-init verifies it
        with its built-in key and makes it the next boot, tried ``tries`` times (then
        :meth:`reboot`). ``progress(bytes, total)`` is called for each progress line.
        Returns the final line's pairs (``{"slot": "b", "version": "2", "tries": "3"}``).
        Raises KilnError: 422 refused (the bundle does not verify, or its bytes changed on
        the way; nothing is activated), 409 busy, 413 too_long, 403 on a user connection,
        501 on a box not booted from an A/B disk. Not retried: a broken transfer is
        reported, and the running slot is untouched."""
        h, size = hashlib.sha256(), 0
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
        line = "UPDATE size=%d sha256=%s tries=%d" % (size, h.hexdigest(), tries)
        conn = self._ensure()  # the bundle follows on the connection that took UPDATE
        self._command(line, False, retryable=False, on=conn)  # "OK update slot=S max=N"
        deadline = time.monotonic() + timeout
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 16), b""):
                    conn.send(chunk, self._opts.timeout)
            while True:
                raw = conn.read_line(deadline)
                got = split_line(raw, strict=False)
                if got.verb == "UPDATE":
                    if progress is not None and got.pos[:1] == ("progress",):
                        progress(int(got.get("bytes", "0") or 0), int(got.get("total", "0") or 0))
                elif got.verb == "OK" and got.pos[:2] == ("update", "done"):
                    return got.as_dict()
                elif got.verb == "ERR" and got.pos[:1] == ("-",):
                    raise parse_err(got)
                else:  # a line of another request on this connection
                    conn.demux.feed(raw)
        except (OSError, ssl.SSLError, EOFError) as exc:
            self._lost(conn, exc)
            raise KilnConnectionError("the update's connection was lost: %s" % exc) from None

    def reboot(self) -> str:
        """REBOOT (admin): kiln-init drains kilnd and reboots the box (into the slot an
        :meth:`update` made next). The connection closes soon after the reply."""
        return self._command("REBOOT", False, retryable=False)
