"""The clients against a fake kilnd in this process (TLS with throwaway certificates).

Skipped when neither the openssl command nor a built kilnd is there to make the
certificates.
"""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from typing import List, Optional

from kiln_test_support import (
    ADMIN_TOKEN,
    USER_TOKEN,
    Certs,
    FakeConn,
    FakeKiln,
    default_gen,
    end_line,
    free_port,
    make_certs,
)
from kiln import (
    Client,
    KilnAuthError,
    KilnConnectionError,
    KilnError,
    KilnProtocolError,
    KilnTimeoutError,
    KilnTLSError,
)
from kiln.aio import AsyncClient
from kiln.protocol import Line, quote

CERTS: Optional[Certs] = None


def setUpModule() -> None:
    global CERTS
    CERTS = make_certs()


def tearDownModule() -> None:
    if CERTS is not None:
        CERTS.cleanup()


class FakeServerCase(unittest.TestCase):
    server: FakeKiln

    def setUp(self) -> None:
        if CERTS is None:
            self.skipTest("no openssl command and no built kilnd to make test certificates")
        self.certs = CERTS
        self.server = FakeKiln(CERTS)
        self.addCleanup(self.server.close)

    def client(self, **kw: object) -> Client:
        kw.setdefault("backoff", 0.01)
        c = Client("127.0.0.1", self.server.port, USER_TOKEN, self.certs.ca, **kw)  # type: ignore[arg-type]
        self.addCleanup(c.close)
        return c

    def aclient(self, **kw: object) -> AsyncClient:
        kw.setdefault("backoff", 0.01)
        return AsyncClient("127.0.0.1", self.server.port, USER_TOKEN, self.certs.ca, **kw)  # type: ignore[arg-type]

    def gens(self) -> List[Line]:
        return [ln for ln in self.server.parsed if ln.verb == "GEN"]


class SyncClientTest(FakeServerCase):
    def test_hello_and_generate(self) -> None:
        c = self.client()
        self.assertEqual((c.model, c.ctx, c.role), ("fake model", 2048, "user"))
        self.assertEqual(c.endpoint, ("127.0.0.1", self.server.port))
        prompt = 'a "quoted"\n prompt é 😀 \\ \t'
        r = c.generate(prompt, max_tokens=5, temperature=0.5, stop=["\n", "x"], seed=7)
        self.assertEqual(r.text, "Hello, " + prompt)
        self.assertEqual(r.usage.reason, "stop")
        self.assertEqual(r.usage.completion_tokens, 3)
        g = self.gens()[-1]
        self.assertEqual(g.get("prompt"), prompt)
        self.assertEqual(g.get("chat"), "1")
        self.assertEqual(g.get("max_tokens"), "5")
        self.assertEqual(g.get("temperature"), "0.5")
        self.assertEqual(g.get("seed"), "7")
        self.assertEqual(g.get_all("stop"), ["\n", "x"])
        for absent in ("top_p", "n", "logprobs", "ignore_eos", "system"):
            self.assertIsNone(g.get(absent), absent)
        self.assertEqual(self.server.errors, [])
        r = c.generate("p", chat=False)
        self.assertIsNone(self.gens()[-1].get("chat"))

    def test_n_samples(self) -> None:
        c = self.client()
        r = c.generate("p", n=3)
        self.assertEqual(r.texts, ["Hello, p"] * 3)
        self.assertEqual([u.sample for u in r.usages], [0, 1, 2])

    def test_stream_and_usage(self) -> None:
        c = self.client()
        s = c.stream("q")
        self.assertIsNone(s.usage)
        toks = list(s)
        self.assertEqual([t.text for t in toks], ["Hello", ", ", "q"])
        assert s.usage is not None
        self.assertEqual(s.usage.reason, "stop")
        self.assertEqual(s.text, "Hello, q")

    def test_two_streams_in_flight(self) -> None:
        c = self.client()
        s1 = c.stream("one")
        s2 = c.stream("two")
        self.assertEqual("".join(t.text for t in s2), "Hello, two")
        self.assertEqual("".join(t.text for t in s1), "Hello, one")
        self.assertNotEqual(s1.id, s2.id)

    def test_commands(self) -> None:
        c = self.client()
        self.assertTrue(c.health().live)
        self.assertEqual(c.stats()["kv_usage"], 0.0)
        self.assertEqual(c.metrics(), FakeKiln.METRICS)
        with self.assertRaises(KilnError) as cm:
            c.command("LADDER level=3")
        self.assertEqual(cm.exception.code, 403)
        with self.assertRaises(ValueError):
            c.command("GEN id=x prompt=y")
        a = Client("127.0.0.1", self.server.port, ADMIN_TOKEN, self.certs.ca)
        self.addCleanup(a.close)
        self.assertEqual(a.role, "admin")
        self.assertEqual(a.command("LADDER level=3"), "LADDER level=3")

    def test_wrong_token(self) -> None:
        t0 = time.monotonic()
        with self.assertRaises(KilnAuthError) as cm:
            Client("127.0.0.1", self.server.port, "wrong", self.certs.ca)
        self.assertEqual(cm.exception.code, 401)
        self.assertLess(time.monotonic() - t0, 2)

    def test_closed_during_handshake_is_retried(self) -> None:
        # a box closing the connection mid-handshake (no TLS alert) is worth another
        # round, as libkiln's KILN_ECLOSED; a certificate fault is not (test_wrong_ca)
        self.server.drop_handshakes = 2
        c = self.client(retries=2)
        self.assertEqual(c.generate("r").text, "Hello, r")
        self.assertEqual(self.server.drop_handshakes, 0)
        self.server.drop_handshakes = 1
        with self.assertRaises(KilnConnectionError) as cm:
            Client("127.0.0.1", self.server.port, USER_TOKEN, self.certs.ca, retries=0)
        self.assertNotIsInstance(cm.exception, KilnTLSError)
        self.assertIn("closed the connection", str(cm.exception))

    def test_wrong_ca(self) -> None:
        with self.assertRaises(KilnTLSError) as cm:
            Client("127.0.0.1", self.server.port, USER_TOKEN, self.certs.other_ca)
        self.assertIn("certificate verify failed", str(cm.exception))
        with self.assertRaises(KilnTLSError):
            Client("127.0.0.1", self.server.port, USER_TOKEN, self.certs.ca, server_hostname="other.example")

    def test_client_certificate(self) -> None:
        srv = FakeKiln(self.certs, require_client_cert=True)
        self.addCleanup(srv.close)
        c = Client("localhost", srv.port, USER_TOKEN, self.certs.ca,
                   certfile=self.certs.client_crt, keyfile=self.certs.client_key)  # fmt: skip
        self.addCleanup(c.close)
        self.assertEqual(c.generate("m").text, "Hello, m")
        with self.assertRaises(KilnConnectionError):
            Client("localhost", srv.port, USER_TOKEN, self.certs.ca, retries=0)

    def test_unreachable(self) -> None:
        t0 = time.monotonic()
        with self.assertRaises(KilnConnectionError) as cm:
            Client("127.0.0.1", free_port(), USER_TOKEN, self.certs.ca, retries=2, backoff=0.05)
        self.assertNotIsInstance(cm.exception, KilnTLSError)
        self.assertGreaterEqual(time.monotonic() - t0, 0.15)  # 0.05 + 0.1 of backoff

    def test_failover(self) -> None:
        dead = free_port()
        c = Client("127.0.0.1", dead, USER_TOKEN, self.certs.ca,
                   hosts=[("127.0.0.1", dead), ("127.0.0.1", self.server.port)])  # fmt: skip
        self.addCleanup(c.close)
        self.assertEqual(c.endpoint, ("127.0.0.1", self.server.port))
        self.assertEqual(c.generate("f").text, "Hello, f")

    def goaway_pair(self) -> FakeKiln:
        """self.server answers one GEN, saying GOAWAY (draining) before its END; the
        second box (returned) serves normally."""
        def gen(conn: FakeConn, line: Line) -> None:
            rid = line.get("id") or "-"
            conn.send("TOK %s %s" % (rid, quote("A")), "GOAWAY reason=draining", end_line(rid))
        self.server.on_gen = gen
        other = FakeKiln(self.certs)
        self.addCleanup(other.close)
        return other

    def test_goaway_moves_to_next_host(self) -> None:
        other = self.goaway_pair()
        a, b = ("127.0.0.1", self.server.port), ("127.0.0.1", other.port)
        c = Client(None, None, USER_TOKEN, self.certs.ca, hosts=[a, b])
        self.addCleanup(c.close)
        self.assertEqual(c.generate("x").text, "A")  # GOAWAY is no request's line
        self.assertEqual(c.generate("y").text, "Hello, y")  # idle: left for the next box
        self.assertEqual(c.endpoint, b)
        self.assertEqual(self.server.gen_count, 1)

    def test_lazy_and_hosts_only(self) -> None:
        c = Client(None, None, USER_TOKEN, self.certs.ca, hosts=[("127.0.0.1", self.server.port)], connect=False)
        self.addCleanup(c.close)
        self.assertFalse(c.connected)
        self.assertIsNone(c.model)
        self.assertEqual(c.generate("lazy").text, "Hello, lazy")
        self.assertTrue(c.connected)
        self.assertEqual(c.model, "fake model")
        with self.assertRaises(ValueError):
            Client(None, None, USER_TOKEN, self.certs.ca)

    def test_503_retry(self) -> None:
        self.server.level = 3
        c = self.client(retries=2)
        t0 = time.monotonic()
        with self.assertRaises(KilnError) as cm:
            c.generate("x")
        self.assertEqual((cm.exception.code, cm.exception.retry_after_ms), (503, 50))
        self.assertGreaterEqual(time.monotonic() - t0, 0.1)
        self.assertEqual(self.server.gen_count, 3)
        threading.Timer(0.08, lambda: setattr(self.server, "level", 0)).start()
        self.assertEqual(self.client(retries=5).generate("y").text, "Hello, y")

    def test_503_in_stream_before_first_token(self) -> None:
        self.server.level = 3
        threading.Timer(0.08, lambda: setattr(self.server, "level", 0)).start()
        s = self.client(retries=5).stream("z")
        self.assertEqual("".join(t.text for t in s), "Hello, z")

    def test_loss_before_first_token_retries(self) -> None:
        def gen(conn: FakeConn, line: Line) -> None:
            if self.server.gen_count == 1:
                conn.close()
            else:
                default_gen(conn, line)

        self.server.on_gen = gen
        c = self.client()
        first = c.session
        self.assertEqual(c.generate("again").text, "Hello, again")
        self.assertEqual(self.server.gen_count, 2)
        self.assertNotEqual(c.session, first)

    def test_loss_after_first_token_raises(self) -> None:
        def gen(conn: FakeConn, line: Line) -> None:
            conn.send("TOK %s %s" % (line.get("id"), quote("partial")))
            time.sleep(0.1)
            conn.close()

        self.server.on_gen = gen
        c = self.client()
        s = c.stream("x")
        self.assertEqual(next(s).text, "partial")
        with self.assertRaises(KilnConnectionError):
            next(s)
        self.server.on_gen = default_gen
        self.assertEqual(c.generate("next").text, "Hello, next")  # reconnects

    def test_close_sends_cancel(self) -> None:
        def gen(conn: FakeConn, line: Line) -> None:
            conn.send("TOK %s %s" % (line.get("id"), quote("t")))  # and no END

        self.server.on_gen = gen
        c = self.client()
        s = c.stream("long")
        next(s)
        s.close()
        rid = s.id
        self.assertTrue(self.server.wait_for(lambda ls: ("CANCEL " + rid) in ls))
        c.health()  # reads the END that answers the CANCEL
        assert s.usage is not None
        self.assertEqual(s.usage.reason, "cancelled")
        # a stream dropped mid-loop is cancelled too
        for _ in c.stream("dropped"):
            break
        rid2 = "r%d" % (int(rid[1:]) + 1)
        self.assertTrue(self.server.wait_for(lambda ls: ("CANCEL " + rid2) in ls))
        self.assertTrue(c.cancel(c.stream("third").id))

    def test_timeout(self) -> None:
        self.server.on_gen = lambda conn, line: None  # never answers
        c = self.client(timeout=0.2)
        t0 = time.monotonic()
        with self.assertRaises(KilnTimeoutError):
            c.generate("slow")
        self.assertLess(time.monotonic() - t0, 2)
        self.assertTrue(self.server.wait_for(lambda ls: any(x.startswith("CANCEL") for x in ls)))

    def test_overlong_line(self) -> None:
        self.server.on_gen = lambda conn, line: conn.send_raw(b"TOK " + b"x" * 10000 + b"\n")
        c = self.client(max_line_bytes=4096)
        with self.assertRaises(KilnProtocolError):
            c.generate("big")

    def test_malformed_line(self) -> None:
        self.server.on_gen = lambda conn, line: conn.send('TOK %s "bad \\q"' % line.get("id"))
        with self.assertRaises(KilnProtocolError):
            self.client().generate("x")

    def test_request_error(self) -> None:
        self.server.on_gen = lambda conn, line: conn.send(
            'ERR %s 400 bad_request msg="top_p must be a number in (0, 1]"' % line.get("id"))
        with self.assertRaises(KilnError) as cm:
            self.client().generate("x", top_p=1.0)
        self.assertEqual(cm.exception.code, 400)
        self.assertIn("top_p", str(cm.exception))


class AsyncClientTest(FakeServerCase):
    def run_async(self, coro: "asyncio.Future[None] | object") -> None:
        asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]

    def test_concurrent(self) -> None:
        async def go() -> None:
            async with self.aclient() as c:
                self.assertEqual(c.role, "user")
                rs = await asyncio.gather(*(c.generate("p%d" % i) for i in range(8)))
                self.assertEqual([r.text for r in rs], ["Hello, p%d" % i for i in range(8)])
                s = c.stream("s", n=2)
                toks = [t async for t in s]
                self.assertEqual(len(toks), 6)
                self.assertEqual(s.texts, ["Hello, s", "Hello, s"])
                h, st, m = await asyncio.gather(c.health(), c.stats(), c.metrics())
                self.assertTrue(h.ready)
                self.assertEqual(st["uptime_s"], 5)
                self.assertEqual(m, FakeKiln.METRICS)
                with self.assertRaises(KilnError) as cm:
                    await c.command("LADDER")
                self.assertEqual(cm.exception.code, 403)
            self.assertEqual(len([x for x in self.server.lines if x.startswith("HELLO")]), 1)

        self.run_async(go())

    def test_errors(self) -> None:
        async def go() -> None:
            with self.assertRaises(KilnAuthError):
                await AsyncClient("127.0.0.1", self.server.port, "bad", self.certs.ca).connect()
            with self.assertRaises(KilnTLSError):
                await AsyncClient("127.0.0.1", self.server.port, USER_TOKEN, self.certs.other_ca).connect()
            self.server.drop_handshakes = 1  # closed mid-handshake: the next round connects
            c = AsyncClient("127.0.0.1", self.server.port, USER_TOKEN, self.certs.ca, backoff=0.01)
            self.assertEqual((await c.generate("h")).text, "Hello, h")
            self.assertEqual(self.server.drop_handshakes, 0)
            await c.close()
            dead = free_port()
            c = AsyncClient("127.0.0.1", dead, USER_TOKEN, self.certs.ca, backoff=0.01,
                            hosts=[("127.0.0.1", self.server.port)])  # fmt: skip
            self.assertEqual((await c.generate("f")).text, "Hello, f")
            self.assertEqual(c.endpoint, ("127.0.0.1", self.server.port))
            await c.close()

        self.run_async(go())

    def test_goaway_moves_to_next_host(self) -> None:
        other = SyncClientTest.goaway_pair(self)  # type: ignore[arg-type]

        async def go() -> None:
            a, b = ("127.0.0.1", self.server.port), ("127.0.0.1", other.port)
            c = AsyncClient(None, None, USER_TOKEN, self.certs.ca, hosts=[a, b])
            self.assertEqual((await c.generate("x")).text, "A")
            self.assertEqual((await c.generate("y")).text, "Hello, y")
            self.assertEqual(c.endpoint, b)
            self.assertEqual(self.server.gen_count, 1)
            await c.close()

        self.run_async(go())

    def test_retries(self) -> None:
        def gen(conn: FakeConn, line: Line) -> None:
            if self.server.gen_count == 1:
                conn.close()
            else:
                default_gen(conn, line)

        async def go() -> None:
            self.server.level = 3
            async with self.aclient(retries=1) as c:
                with self.assertRaises(KilnError) as cm:
                    await c.generate("x")
                self.assertEqual(cm.exception.code, 503)
            self.server.level = 0
            self.server.gen_count = 0
            self.server.on_gen = gen
            async with self.aclient() as c:
                self.assertEqual((await c.generate("again")).text, "Hello, again")

        self.run_async(go())

    def test_cancel_and_timeout(self) -> None:
        def gen(conn: FakeConn, line: Line) -> None:
            conn.send("TOK %s %s" % (line.get("id"), quote("t")))

        self.server.on_gen = gen

        async def go() -> None:
            async with self.aclient(timeout=0.3) as c:
                s = c.stream("x")
                async for _ in s:
                    break
                await s.aclose()
                self.assertTrue(self.server.wait_for(lambda ls: ("CANCEL " + s.id) in ls))
                await c.health()
                assert s.usage is not None
                self.assertEqual(s.usage.reason, "cancelled")
                with self.assertRaises(KilnTimeoutError):
                    await c.generate("never ends")
                # a cancelled task cancels its request
                task = asyncio.ensure_future(c.generate("cancel me"))
                await asyncio.sleep(0.1)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self.assertTrue(self.server.wait_for(
                    lambda ls: sum(x.startswith("CANCEL") for x in ls) >= 3))  # fmt: skip

        self.run_async(go())

    def test_overlong_line(self) -> None:
        self.server.on_gen = lambda conn, line: conn.send_raw(b"TOK " + b"x" * 10000 + b"\n")

        async def go() -> None:
            async with self.aclient(max_line_bytes=4096) as c:
                with self.assertRaises(KilnProtocolError):
                    await c.generate("big")

        self.run_async(go())

    def test_loss_after_first_token(self) -> None:
        def gen(conn: FakeConn, line: Line) -> None:
            conn.send("TOK %s %s" % (line.get("id"), quote("partial")))
            time.sleep(0.1)
            conn.close()

        self.server.on_gen = gen

        async def go() -> None:
            async with self.aclient() as c:
                s = c.stream("x")
                self.assertEqual((await s.__anext__()).text, "partial")
                with self.assertRaises(KilnConnectionError):
                    await s.__anext__()

        self.run_async(go())


if __name__ == "__main__":
    unittest.main()
