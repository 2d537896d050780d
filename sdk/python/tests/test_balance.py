"""Balancing across the host list: the Pool's rule (fewest in flight, ties in turn,
backoff), then both clients against two fake kilnds (or one, over several
connections).

The fake-server cases are skipped when neither the openssl command nor a built kilnd
is there to make the certificates.
"""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from typing import List, Optional

from kiln_test_support import USER_TOKEN, Certs, FakeConn, FakeKiln, default_gen, free_port, make_certs
from kiln import Client
from kiln._core import RECONNECT_MAX, RECONNECT_MIN, Demux, Pool, RequestState
from kiln.aio import AsyncClient
from kiln.protocol import Line

CERTS: Optional[Certs] = None


def setUpModule() -> None:
    global CERTS
    CERTS = make_certs()


def tearDownModule() -> None:
    if CERTS is not None:
        CERTS.cleanup()


class _C:
    """A stand-in connection for the Pool: a demux and an endpoint."""

    def __init__(self, ep: object) -> None:
        self.endpoint = ep
        self.demux = Demux()
        self.dead = False


class PoolTest(unittest.TestCase):
    def pool(self, hosts: int, per_host: int = 1) -> Pool:
        p = Pool([("h%d" % i, 1) for i in range(hosts)], per_host)
        for s in p.slots:
            p.attach(s, _C(s.endpoint), 0.0)
        return p

    def test_slots_interleave_hosts(self) -> None:
        p = Pool([("a", 1), ("b", 1)], 2)
        self.assertEqual([(s.endpoint[0], s.index) for s in p.slots],
                         [("a", 0), ("b", 0), ("a", 1), ("b", 1)])  # fmt: skip

    def test_fewest_in_flight_ties_in_turn(self) -> None:
        p = self.pool(3)
        got: List[str] = []
        for i in range(6):
            s = p.pick()
            assert s is not None
            got.append(s.endpoint[0])
            s.conn.demux.add_request(RequestState("r%d" % i, 1))
        self.assertEqual(got, ["h0", "h1", "h2", "h0", "h1", "h2"])
        p.slots[1].conn.demux.requests.clear()  # h1 finished its two
        s = p.pick()
        assert s is not None
        self.assertEqual(s.endpoint[0], "h1")
        self.assertEqual(s.load(), 0)

    def test_goaway_and_dead_take_nothing(self) -> None:
        p = self.pool(2)
        p.slots[0].conn.demux.going_away = True
        for _ in range(4):
            s = p.pick()
            assert s is not None
            self.assertEqual(s.endpoint[0], "h1")
        p.slots[1].conn.dead = True
        self.assertIsNone(p.pick())
        s = p.pick(draining_too=True)
        assert s is not None
        self.assertEqual(s.endpoint[0], "h0")

    def test_backoff_doubles_to_the_cap_and_starts_over(self) -> None:
        p = Pool([("a", 1), ("b", 1)], 1)
        a = p.slots[0]
        waits = []
        for _ in range(8):
            p.failed(a, 100.0)
            waits.append(a.retry_at - 100.0)
        self.assertEqual(waits[:4], [RECONNECT_MIN, 2 * RECONNECT_MIN, 4 * RECONNECT_MIN, 8 * RECONNECT_MIN])
        self.assertEqual(waits[-1], RECONNECT_MAX)
        self.assertEqual(p.due(100.0), [p.slots[1]])
        self.assertEqual(p.due(100.0 + RECONNECT_MAX), p.slots)
        c = _C(a.endpoint)
        p.attach(a, c, 200.0)
        p.detach(c, 200.0 + RECONNECT_MAX)  # it stayed up long enough: from the start
        self.assertEqual(a.retry_at, 200.0 + RECONNECT_MAX + RECONNECT_MIN)

    def test_dial_order_is_the_failover_order(self) -> None:
        p = Pool([("a", 1), ("b", 1), ("c", 1)], 2)
        order = [(s.endpoint[0], s.index) for s in p.dial_order(("b", 1))]
        self.assertEqual(order, [("c", 0), ("c", 1), ("a", 0), ("a", 1), ("b", 0), ("b", 1)])


def slow_gen(delay: float):  # type: ignore[no-untyped-def]
    """A GEN handler that answers after delay seconds (without holding up the
    connection's other lines)."""

    def gen(conn: FakeConn, line: Line) -> None:
        threading.Timer(delay, default_gen, (conn, line)).start()

    return gen


def gated_gen(gate: threading.Event):  # type: ignore[no-untyped-def]
    """A GEN handler that answers once gate is set (so that every request is routed
    before any END can lower a connection's load)."""

    def gen(conn: FakeConn, line: Line) -> None:
        threading.Thread(target=lambda: (gate.wait(5), default_gen(conn, line))).start()

    return gen


class TwoBoxes(unittest.TestCase):
    def setUp(self) -> None:
        if CERTS is None:
            self.skipTest("no openssl command and no built kilnd to make test certificates")
        self.certs = CERTS
        self.a = FakeKiln(CERTS)
        self.addCleanup(self.a.close)
        self.b = FakeKiln(CERTS)
        self.addCleanup(self.b.close)
        self.hosts = [("127.0.0.1", self.a.port), ("127.0.0.1", self.b.port)]

    def aclient(self, **kw: object) -> AsyncClient:
        kw.setdefault("backoff", 0.01)
        kw.setdefault("hosts", self.hosts)
        return AsyncClient(None, None, USER_TOKEN, self.certs.ca, **kw)  # type: ignore[arg-type]

    def client(self, **kw: object) -> Client:
        kw.setdefault("backoff", 0.01)
        kw.setdefault("hosts", self.hosts)
        c = Client(None, None, USER_TOKEN, self.certs.ca, **kw)  # type: ignore[arg-type]
        self.addCleanup(c.close)
        return c

    def run_async(self, coro: object) -> None:
        asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ asyncio

    def test_async_16_split_evenly(self) -> None:
        async def go() -> None:
            async with self.aclient() as c:
                self.assertEqual(sorted(c.connections), sorted(self.hosts))
                rs = await asyncio.gather(*(c.generate("p%d" % i) for i in range(16)))
                self.assertEqual([r.text for r in rs], ["Hello, p%d" % i for i in range(16)])

        self.run_async(go())
        self.assertEqual((self.a.gen_count, self.b.gen_count), (8, 8))

    def test_async_slow_host_gets_fewer(self) -> None:
        self.a.on_gen = slow_gen(0.3)

        async def go() -> None:
            async with self.aclient() as c:
                tasks = []
                for i in range(16):
                    tasks.append(asyncio.ensure_future(c.generate("p%d" % i)))
                    await asyncio.sleep(0.02)
                rs = await asyncio.gather(*tasks)
                self.assertEqual([r.text for r in rs], ["Hello, p%d" % i for i in range(16)])

        self.run_async(go())
        self.assertEqual(self.a.gen_count + self.b.gen_count, 16)
        self.assertLessEqual(self.a.gen_count, 4, (self.a.gen_count, self.b.gen_count))

    def test_async_goaway_host_gets_nothing_new(self) -> None:
        def draining(conn: FakeConn, line: Line) -> None:
            conn.send("GOAWAY reason=draining", "ERR %s 503 draining" % line.get("id"))

        self.a.on_gen = draining

        async def go() -> None:
            async with self.aclient() as c:
                rs = await asyncio.gather(*(c.generate("p%d" % i) for i in range(16)))
                self.assertEqual([r.text for r in rs], ["Hello, p%d" % i for i in range(16)])
                self.assertEqual(self.a.gen_count, 8)  # the first round, before the GOAWAY
                rs = await asyncio.gather(*(c.generate("q%d" % i) for i in range(8)))
                self.assertEqual(len(rs), 8)
                self.assertEqual(c.connections, [self.hosts[1]])  # idle and draining: closed
                self.assertEqual(c.endpoint, self.hosts[1])

        self.run_async(go())
        self.assertEqual((self.a.gen_count, self.b.gen_count), (8, 24))

    def test_async_down_host_skipped_then_dialled_after_backoff(self) -> None:
        port = free_port()
        hosts = [("127.0.0.1", port), ("127.0.0.1", self.b.port)]

        async def go() -> None:
            async with self.aclient(hosts=hosts) as c:
                self.assertEqual(c.connections, [hosts[1]])
                for i in range(4):
                    self.assertEqual((await c.generate("x%d" % i)).text, "Hello, x%d" % i)
                late = FakeKiln(self.certs, port=port)
                self.addCleanup(late.close)
                await asyncio.sleep(RECONNECT_MIN + 0.1)
                await c.generate("wake")  # the backoff is over: dialled in the background
                for _ in range(50):
                    if len(c.connections) == 2:
                        break
                    await asyncio.sleep(0.02)
                self.assertEqual(sorted(c.connections), sorted(hosts))
                await asyncio.gather(*(c.generate("p%d" % i) for i in range(16)))
                self.assertEqual(late.gen_count, 8)

        self.run_async(go())

    def test_async_connections_per_host(self) -> None:
        async def go() -> None:
            hosts = [self.hosts[0]]
            async with self.aclient(hosts=hosts, connections_per_host=4) as c:
                self.assertEqual(c.connections, hosts * 4)
                await asyncio.gather(*(c.generate("p%d" % i) for i in range(16)))

        self.run_async(go())
        self.assertEqual(len([x for x in self.a.lines if x.startswith("HELLO")]), 4)
        self.assertEqual(sorted(cn.gens for cn in self.a.conns), [4, 4, 4, 4])

    # ------------------------------------------------------------------ blocking

    def test_sync_16_split_evenly(self) -> None:
        # both boxes answer once all 16 are sent: equally fast, whatever the scheduling
        # (the client reads the ENDs that have come before each pick)
        gate = threading.Event()
        self.a.on_gen = self.b.on_gen = gated_gen(gate)
        c = self.client()
        streams = [c.stream("p%d" % i) for i in range(16)]  # all in flight at once
        gate.set()
        self.assertEqual(["".join(t.text for t in s) for s in streams], ["Hello, p%d" % i for i in range(16)])
        self.assertEqual((self.a.gen_count, self.b.gen_count), (8, 8))
        for i in range(4):  # one at a time: ties, in turn
            c.generate("s%d" % i)
        self.assertEqual((self.a.gen_count, self.b.gen_count), (10, 10))

    def test_sync_slow_host_gets_fewer(self) -> None:
        self.a.on_gen = slow_gen(0.3)
        c = self.client()
        streams = []
        for i in range(16):  # read each box's answers that have come before the next
            streams.append(c.stream("p%d" % i))
            time.sleep(0.02)
            for s in streams:
                if s.done or s._conn is None or s._conn.endpoint != self.hosts[1]:
                    continue
                list(s)
        for s in streams:
            list(s)
        self.assertEqual([s.text for s in streams], ["Hello, p%d" % i for i in range(16)])
        self.assertLessEqual(self.a.gen_count, 4, (self.a.gen_count, self.b.gen_count))
        self.assertEqual(self.a.gen_count + self.b.gen_count, 16)

    def test_sync_goaway_host_gets_nothing_new(self) -> None:
        def draining(conn: FakeConn, line: Line) -> None:
            conn.send("GOAWAY reason=draining", "ERR %s 503 draining" % line.get("id"))

        self.a.on_gen = draining
        c = self.client()
        streams = [c.stream("p%d" % i) for i in range(8)]
        self.assertEqual(["".join(t.text for t in s) for s in streams], ["Hello, p%d" % i for i in range(8)])
        first = self.a.gen_count  # up to 4: the client sees the GOAWAY before sending more
        self.assertTrue(1 <= first <= 4, first)
        for i in range(4):
            self.assertEqual(c.generate("q%d" % i).text, "Hello, q%d" % i)
        self.assertEqual((self.a.gen_count, self.b.gen_count), (first, 12))
        self.assertEqual(c.connections, [self.hosts[1]])

    def test_sync_connections_per_host(self) -> None:
        gate = threading.Event()
        self.a.on_gen = gated_gen(gate)
        c = self.client(hosts=[self.hosts[0]], connections_per_host=4)
        self.assertEqual(c.connections, [self.hosts[0]] * 4)
        streams = [c.stream("p%d" % i) for i in range(16)]
        gate.set()
        for s in streams:
            list(s)
        self.assertEqual(sorted(cn.gens for cn in self.a.conns), [4, 4, 4, 4])
        with self.assertRaises(ValueError):
            self.client(connections_per_host=0)


if __name__ == "__main__":
    unittest.main()
