"""The asyncio kiln client: many concurrent requests over TLS connections to one or
more boxes.

Example::

    import asyncio
    from kiln.aio import AsyncClient

    async def main() -> None:
        async with AsyncClient("kiln.local", 8443, token="...", cafile="ca.crt") as c:
            results = await asyncio.gather(*(c.generate(p) for p in ["a", "b", "c"]))
            async for tok in c.stream("Count to ten:"):
                print(tok.text, end="")

    asyncio.run(main())

The API mirrors :class:`kiln.Client`, with coroutines and async iterators. A reader
task routes the server's lines to the requests waiting for them, so any number of
coroutines may use one AsyncClient at once. The client connects on ``await
client.connect()``, on entering ``async with``, or on first use. With several hosts
(or ``connections_per_host`` > 1) it keeps a connection to each and sends each new
request over the one with the fewest requests in flight (ties in turn).
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from typing import AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Set, Union

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
    parse_health,
    parse_hello_reply,
    parse_stats,
    split_line,
)

__all__ = ["AsyncClient", "AsyncStream"]


class _AConn:
    """One TLS connection: its streams, demultiplexer and reader task."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        endpoint: Endpoint,
        hello: HelloInfo,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.endpoint = endpoint
        self.hello = hello
        self.demux = Demux()
        self.dead = False
        self.task: Optional["asyncio.Task[None]"] = None
        self.drain_lock = asyncio.Lock()

    def write(self, line: str) -> bool:
        """Queues a line for sending; False when the connection cannot take it."""
        if self.dead or self.writer.transport.is_closing():
            return False
        self.writer.write((line + "\n").encode("utf-8"))
        return True


class AsyncStream(AsyncIterator[Token]):
    """The tokens of one generation (returned by :meth:`AsyncClient.stream`).

    The GEN is sent when iteration starts (or on ``async with``). Iterate with
    ``async for``; afterwards :attr:`usage` and :attr:`usages` hold the END lines.
    :meth:`aclose` (or leaving ``async with``, or cancelling the task that iterates)
    sends CANCEL. Before the first token, a 503 or a lost connection is retried up to
    the client's ``retries``.
    """

    def __init__(
        self,
        client: "AsyncClient",
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
        self._started = False
        self._closed = False
        self._conn: Optional[_AConn] = None
        self._state: Optional[RequestState] = None
        self._event: Optional[asyncio.Event] = None

    async def start(self) -> "AsyncStream":
        """Sends the GEN now (iteration does it when not done before)."""
        if not self._started:
            self._started = True
            await self._start()
        return self

    async def _start(self) -> None:
        client = self._client
        conn = await client._ensure()
        rid = client._new_id()
        line = build_gen(rid, self._prompt, self._params)
        st = RequestState(rid, self._n)
        ev = asyncio.Event()
        st.notify = ev.set
        self._state, self._conn, self._event = st, conn, ev
        try:
            conn.demux.add_request(st)
        except KilnConnectionError as exc:
            st.fail(exc)
            return
        await client._send(conn, line)

    async def _retry(self, err: KilnError) -> bool:
        opts = self._client._opts
        if self._attempt >= opts.retries:
            return False
        delay = retry_delay(err, self._attempt, opts.backoff)
        if delay is None:
            return False
        self._attempt += 1
        if delay > 0:
            await asyncio.sleep(delay)
        self._delivered = 0
        await self._start()
        return True

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> Token:
        if not self._started:
            await self.start()
        while True:
            st, ev = self._state, self._event
            if self._closed or st is None or ev is None:
                raise StopAsyncIteration
            if (
                st.error is not None
                and (self._delivered == 0 or self._restartable)
                and await self._retry(st.error)
            ):
                continue
            if st.events:
                self._delivered += 1
                return st.events.popleft()
            if st.done:
                self._closed = True
                if st.error is not None:
                    raise st.error
                raise StopAsyncIteration
            try:
                await self._client._wait(lambda: bool(st.events) or st.done, ev)
            except KilnTimeoutError as exc:
                self.close()
                exc.request_id = st.id
                raise
            except BaseException:  # cancelled: stop the request too
                self.close()
                raise

    def close(self) -> None:
        """Stops reading and queues a CANCEL if the request is still running (no
        waiting: usable outside a coroutine)."""
        if self._closed:
            return
        self._closed = True
        st, conn = self._state, self._conn
        if st is not None and conn is not None and not st.done and not st.cancel_sent:
            st.cancel_sent = True
            try:
                conn.write(build_cancel(st.id))
            except (RuntimeError, OSError):
                pass

    async def aclose(self) -> None:
        """Stops reading and sends CANCEL if the request is still running."""
        conn = self._conn
        self.close()
        if conn is not None and not conn.dead:
            await self._client._drain(conn)

    async def __aenter__(self) -> "AsyncStream":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def id(self) -> str:
        """The request id of the current attempt ("" before the GEN is sent)."""
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


class AsyncClient:
    """An asyncio client of one kilnd server, or of several it balances across.

    Takes the arguments of :class:`kiln.Client` (except ``connect``): it connects on
    ``await connect()``, in ``async with``, or on first use, to every host of the list
    (``connections_per_host`` connections to each). ``model``, ``ctx``, ``role``,
    ``session`` and ``endpoint`` are None until then, and then describe the connection
    the last request went to. Requests of any number of coroutines share the
    connections: each new one goes to the connection with the fewest in flight (ties
    in turn), never to one that said GOAWAY. A host whose connection failed or broke
    is dialled again in the background after a backoff (1 s doubling to 30 s); when
    no connection is left, the next request reconnects (failover over the host list,
    with rounds). Requests that had no token yet are sent again (elsewhere).
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
    ) -> None:
        self._opts: Options = make_options(
            host, port, token, cafile, hosts, certfile, keyfile, server_hostname,
            connect_timeout, timeout, retries, backoff, ssl_context, max_line_bytes,
            connections_per_host,
        )  # fmt: skip
        self._pool = Pool(self._opts.endpoints, self._opts.connections_per_host)
        self._dialers: Set["asyncio.Task[None]"] = set()  # background dials
        self._ids = itertools.count(1)
        self._gone_from: Optional[Endpoint] = None  # the last box that said GOAWAY
        self._closed = False
        self._connect_lock: Optional[asyncio.Lock] = None
        self.model: Optional[str] = None
        self.ctx: Optional[int] = None
        self.role: Optional[str] = None
        self.session: Optional[int] = None
        self.endpoint: Optional[Endpoint] = None

    # ------------------------------------------------------------------ connection

    async def connect(self) -> "AsyncClient":
        """Connects now (to every host; a no-op when connected). Returns self."""
        await self._prepare()
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
        return "a%d" % next(self._ids)

    async def _ensure(self) -> _AConn:
        """The connection for a new request: the usable one with the fewest in flight
        (ties in turn). Nothing awaits between the choice and the caller's
        add_request, so concurrent requests see each other's load."""
        await self._prepare()
        pool = self._pool
        slot = pool.pick() or pool.pick(draining_too=True)
        if slot is None or slot.conn is None:
            raise KilnConnectionError("no connection to any host")
        conn: _AConn = slot.conn
        self._describe(conn)
        return conn

    def _describe(self, conn: _AConn) -> None:
        h = conn.hello
        self.model, self.ctx, self.role, self.session = h.model, h.ctx, h.role, h.session
        self.endpoint = conn.endpoint

    async def _prepare(self) -> None:
        """Closes idle connections that said GOAWAY; when none is usable, reconnects
        (failover, with rounds; raises when that fails) and dials the other hosts
        whose backoff is over; else dials those in the background."""
        if self._closed:
            raise KilnError("the client is closed")
        pool = self._pool
        for conn in pool.idle_going_away():
            self._gone_from = conn.endpoint  # draining: the next box in the list
            msg = "%s:%d is draining (GOAWAY)" % conn.endpoint
            self._drop(conn, KilnConnectionError(msg), abort=False)
        if pool.usable():
            for slot in pool.due(time.monotonic()):
                self._spawn_dial(slot)
            return
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._closed:
                raise KilnError("the client is closed")
            if pool.usable() or not pool.dial_order(self._gone_from):
                return  # another coroutine connected; or only draining ones are left
            try:
                await self._dial()
            except KilnError:
                if not pool.conns():
                    raise  # else: the draining ones answer (503, retried)
            due = pool.due(time.monotonic())
            if due:
                await asyncio.gather(*(self._dial_slot(s) for s in due))

    def _spawn_dial(self, slot: Slot) -> None:
        slot.dialing = True  # before the task runs: due() skips it from now on
        task = asyncio.ensure_future(self._dial_slot(slot))
        self._dialers.add(task)
        task.add_done_callback(self._dialers.discard)

    async def _dial_slot(self, slot: Slot) -> None:
        """One try at slot's host; a failure only sets its backoff."""
        slot.dialing = True
        try:
            conn = await self._dial_one(slot.endpoint)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - tried again after the backoff
            self._pool.failed(slot, time.monotonic())
            return
        finally:
            slot.dialing = False
        if self._closed:
            conn.writer.transport.abort()
            return
        self._attach(slot, conn)

    def _attach(self, slot: Slot, conn: _AConn) -> None:
        self._pool.attach(slot, conn, time.monotonic())
        conn.task = asyncio.ensure_future(self._read_loop(conn))

    async def _dial(self) -> None:
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
                if pool.usable():
                    return  # a background dial got there first
                if slot.endpoint in seen:
                    continue  # one try per host and round
                seen.append(slot.endpoint)
                ep = slot.endpoint
                slot.dialing = True
                try:
                    conn = await self._dial_one(ep)
                except KilnAuthError:
                    raise
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - every failure is classified
                    pool.failed(slot, time.monotonic())
                    fails.add(connect_failure(exc, ep, "while connecting"))
                    continue
                finally:
                    slot.dialing = False
                self._attach(slot, conn)
                return
            if rnd == opts.retries or fails.hopeless(start):
                break
            await asyncio.sleep(delay)
            delay *= 2
        raise fails.final()

    async def _dial_one(self, ep: Endpoint) -> _AConn:
        opts = self._opts
        loop = asyncio.get_running_loop()
        deadline = loop.time() + opts.connect_timeout
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                ep[0],
                ep[1],
                ssl=opts.ssl_context,
                server_hostname=opts.sni(ep),
                limit=opts.max_line_bytes + 1,
                ssl_handshake_timeout=opts.connect_timeout,
            ),
            opts.connect_timeout,
        )
        try:
            writer.write((build_hello(opts.token) + "\n").encode("utf-8"))
            try:
                raw = await asyncio.wait_for(
                    reader.readuntil(b"\n"), max(0.001, deadline - loop.time())
                )
            except asyncio.TimeoutError:
                raise KilnConnectionError(
                    "%s:%d: no reply to HELLO within %.1f s" % (ep + (opts.connect_timeout,))
                ) from None
            except asyncio.IncompleteReadError:
                raise KilnConnectionError(
                    "%s:%d: the server closed the connection before replying to HELLO" % ep
                ) from None
            except asyncio.LimitOverrunError:
                raise KilnProtocolError("%s:%d: the HELLO reply is too long" % ep) from None
            hello = parse_hello_reply(split_line(raw[:-1], strict=False))
        except BaseException:
            writer.transport.abort()
            raise
        return _AConn(reader, writer, ep, hello)

    async def _read_loop(self, conn: _AConn) -> None:
        ep = "%s:%d" % conn.endpoint
        err: KilnError = KilnConnectionError("connection to %s lost: closed by the server" % ep)
        try:
            while True:
                try:
                    raw = await conn.reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    break
                except asyncio.LimitOverrunError:
                    err = KilnProtocolError(
                        "the server sent a line longer than %d bytes" % self._opts.max_line_bytes
                    )
                    break
                try:
                    conn.demux.feed(raw[:-1])
                except LineError as exc:
                    err = KilnProtocolError("the server sent a malformed line: %s" % exc)
                    break
        except asyncio.CancelledError:
            err = KilnConnectionError("the client was closed")
            raise
        except (OSError, ssl.SSLError) as exc:
            err = KilnConnectionError("connection to %s lost: %s" % (ep, exc))
        except Exception as exc:  # noqa: BLE001 - never leave requests hanging
            err = KilnProtocolError("reading from %s failed: %r" % (ep, exc))
        finally:
            if not conn.dead:
                self._drop(conn, err)

    def _drop(self, conn: _AConn, err: KilnError, abort: bool = True) -> None:
        """Marks conn dead, closes it and fails everything in flight on it."""
        conn.dead = True
        try:
            if abort:
                conn.writer.transport.abort()
            else:
                conn.writer.close()
        except (RuntimeError, OSError):
            pass
        self._pool.detach(conn, time.monotonic())
        conn.demux.lost(err.copy)

    async def _drain(self, conn: _AConn) -> None:
        try:
            async with conn.drain_lock:
                await conn.writer.drain()
        except (OSError, ssl.SSLError, RuntimeError) as exc:
            if not conn.dead:
                self._drop(conn, KilnConnectionError("connection to %s:%d lost: %s" % (conn.endpoint + (exc,))))

    async def _send(self, conn: _AConn, line: str) -> None:
        """Sends one line; a failure drops the connection (what waits on it fails)."""
        if not conn.write(line):
            if not conn.dead:
                self._drop(conn, KilnConnectionError("the connection is closing"))
            return
        await self._drain(conn)

    async def _wait(self, cond: Callable[[], bool], ev: asyncio.Event) -> None:
        """Waits until cond() holds (ev is set whenever it may have changed);
        KilnTimeoutError after the client's timeout."""
        t = self._opts.timeout
        loop = asyncio.get_running_loop()
        deadline = None if t is None else loop.time() + t
        while not cond():
            ev.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise KilnTimeoutError("no reply from the server in time")
            try:
                await asyncio.wait_for(ev.wait(), remaining)
            except asyncio.TimeoutError:
                raise KilnTimeoutError("no reply from the server in time") from None

    async def close(self) -> None:
        """Closes the connections (the servers cancel what is still running)."""
        if self._closed:
            return
        self._closed = True
        dialers = list(self._dialers)
        for t in dialers:
            t.cancel()
        await asyncio.gather(*dialers, return_exceptions=True)
        conns = self._pool.conns()
        for conn in conns:
            try:
                conn.write("QUIT")
            except (RuntimeError, OSError):
                pass
            self._drop(conn, KilnConnectionError("the client was closed"), abort=False)
        await asyncio.gather(*(self._close_conn(c) for c in conns))

    async def _close_conn(self, conn: _AConn) -> None:
        task = conn.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            await asyncio.wait_for(conn.writer.wait_closed(), 1.0)
        except (asyncio.TimeoutError, OSError, ssl.SSLError, RuntimeError):
            pass
        except asyncio.CancelledError:
            raise
        finally:
            try:
                conn.writer.transport.abort()
            except (RuntimeError, OSError):
                pass

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
    ) -> AsyncStream:
        """An :class:`AsyncStream` of a GEN's tokens (sent when iteration starts).
        Parameters as :meth:`kiln.Client.stream` (``messages`` included); None ones are
        not sent."""
        params = gen_params(
            chat, system, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty,
            repeat_last_n, presence_penalty, frequency_penalty, seed, n, stop, logprobs,
            ignore_eos, messages,
        )  # fmt: skip
        build_gen("check", prompt, params)  # type errors before anything is sent
        return AsyncStream(self, prompt, params, n)

    async def generate(
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
        """Generates and returns the whole :class:`~kiln.protocol.Result` (retries as
        :meth:`kiln.Client.generate`). Cancelling the awaiting task sends CANCEL."""
        params = gen_params(
            chat, system, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty,
            repeat_last_n, presence_penalty, frequency_penalty, seed, n, stop, logprobs,
            ignore_eos, messages,
        )  # fmt: skip
        build_gen("check", prompt, params)
        s = AsyncStream(self, prompt, params, n, restartable=True)
        try:
            async for _ in s:
                pass
        finally:
            if not s.done:
                s.close()
        return s.result()

    async def cancel(self, request_id: str) -> bool:
        """Sends CANCEL for a request in flight (``AsyncStream.id``) on whichever
        connection carries it; False (nothing sent) when there is none."""
        conn, st = self._pool.find_request(request_id)
        if conn is None or st is None:
            return False
        st.cancel_sent = True
        await self._send(conn, build_cancel(request_id))
        return True

    # ------------------------------------------------------------------ commands

    async def _command(self, line: str, body: bool, retryable: bool = True) -> str:
        attempt = 0
        while True:
            conn = await self._ensure()
            cmd = CommandState(line, body)
            ev = asyncio.Event()
            cmd.notify = ev.set
            try:
                conn.demux.add_command(cmd)
            except KilnConnectionError as exc:
                cmd.finish(None, exc)
            else:
                # queued in the same step as the FIFO entry: replies come in this order
                if conn.write(line):
                    await self._drain(conn)
                elif not conn.dead:
                    self._drop(conn, KilnConnectionError("the connection is closing"))
                await self._wait(lambda: cmd.done, ev)
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

    async def health(self) -> Health:
        """HEALTH: liveness, readiness, the ladder's level, running and waiting."""
        return parse_health(split_line(await self._command("HEALTH", False), strict=False))

    async def stats(self) -> Dict[str, Union[int, float]]:
        """STATS as a dict of numbers."""
        return parse_stats(split_line(await self._command("STATS", False), strict=False))

    async def metrics(self) -> str:
        """METRICS: the Prometheus text, dot-unstuffed."""
        return await self._command("METRICS", True)

    async def command(self, line: str) -> str:
        """Another verb (admin verbs ...); the reply line, or a body's text. See
        :meth:`kiln.Client.command`."""
        verb, body = command_shape(line)
        return await self._command(line.strip(" "), body, retryable=verb != "RESTART")
