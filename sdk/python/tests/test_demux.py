"""Offline tests of the line router shared by both clients (kiln._core.Demux)."""

from __future__ import annotations

import unittest

import kiln_test_support  # noqa: F401  (puts the package on sys.path)
from kiln._core import CommandState, Demux, RequestState, command_shape, retry_delay
from kiln.errors import KilnConnectionError, KilnError, KilnTLSError
from kiln.protocol import LineError


def end(rid: str, reason: str = "stop", sample: str = "") -> bytes:
    return (
        "END %s reason=%s prompt_tokens=4 completion_tokens=2 cached_tokens=0 ttft_ms=1 "
        "tpot_ms=1 e2e_ms=2%s" % (rid, reason, sample)
    ).encode()


class DemuxTest(unittest.TestCase):
    def test_interleaved_requests(self) -> None:
        d = Demux()
        a, b = RequestState("a", 1), RequestState("b", 2)
        d.add_request(a)
        d.add_request(b)
        woke = []
        a.notify = lambda: woke.append("a")
        for raw in [
            b'TOK a "The"',
            b'TOK b "x" sample=1',
            b'TOK b "y" sample=0',
            b'TOK a " end"\r',
            b"",
            b"   ",
            end("a"),
            b'TOK b "z" sample=1',
            end("b", "length", " sample=0"),
            b'TOK zz "unknown ids are ignored"',
            end("b", "stop", " sample=1"),
        ]:
            d.feed(raw)
        self.assertTrue(a.done and b.done)
        self.assertIsNone(a.error)
        self.assertEqual(a.result().text, "The end")
        self.assertEqual(b.texts(), ["y", "xz"])
        r = b.result()
        self.assertEqual([u.reason for u in r.usages], ["length", "stop"])
        self.assertEqual(r.usage.sample, 0)
        self.assertEqual(len(woke), 3)
        self.assertEqual(d.requests, {})

    def test_err_ends_request(self) -> None:
        d = Demux()
        st = RequestState("q", 1)
        d.add_request(st)
        d.feed(b"ERR q 503 overloaded retry_after_ms=500")
        self.assertTrue(st.done)
        assert st.error is not None
        self.assertEqual((st.error.code, st.error.retry_after_ms), (503, 500))
        self.assertNotIn("q", d.requests)

    def test_cancel_404_is_not_an_error(self) -> None:
        d = Demux()
        st = RequestState("q", 1)
        st.cancel_sent = True
        d.add_request(st)
        d.feed(b'ERR q 404 not_found msg="no such request in flight"')
        self.assertTrue(st.done)
        self.assertIsNone(st.error)

    def test_commands_in_order_with_tokens_between(self) -> None:
        d = Demux()
        st = RequestState("g", 1)
        d.add_request(st)
        h, m, l3, x = (
            CommandState("HEALTH", False),
            CommandState("METRICS", True),
            CommandState("LADDER level=3", False),
            CommandState("DRAIN", False),
        )
        for c in (h, m, l3, x):
            d.add_command(c)
        for raw in [
            b'TOK g "a"',
            b"HEALTH live=1 ready=1 level=0 running=1 waiting=0 draining=0",
            b'TOK g "b"',
            b"# HELP kiln_up up",
            b"..dotted",
            b"kiln_up 1",
            b".",
            b'ERR - 403 forbidden msg="an admin token is needed"',
            b"OK draining=1",
            end("g"),
        ]:
            d.feed(raw)
        self.assertEqual(h.result, "HEALTH live=1 ready=1 level=0 running=1 waiting=0 draining=0")
        self.assertEqual(m.result, "# HELP kiln_up up\n.dotted\nkiln_up 1\n")
        self.assertTrue(l3.done)
        assert l3.error is not None
        self.assertEqual(l3.error.code, 403)
        self.assertEqual(x.result, "OK draining=1")
        self.assertEqual(st.result().text, "ab")
        self.assertFalse(d.busy())

    def test_empty_body(self) -> None:
        d = Demux()
        c = CommandState("METRICS", True)
        d.add_command(c)
        d.feed(b".")
        self.assertEqual(c.result, "")

    def test_connection_errors(self) -> None:
        d = Demux()
        st = RequestState("g", 1)
        d.add_request(st)
        d.feed(b"ERR - 413 too_long")  # announces the close: kept for the requests
        c = CommandState("STATS", False)
        d.add_command(c)
        d.lost(lambda: KilnConnectionError("lost"))
        assert st.error is not None and c.error is not None
        self.assertEqual(st.error.code, 413)
        self.assertIsInstance(c.error, KilnConnectionError)
        with self.assertRaises(KilnConnectionError):
            d.add_request(RequestState("h", 1))

    def test_malformed(self) -> None:
        d = Demux()
        with self.assertRaises(LineError):
            d.feed(b'TOK a "unterminated')
        with self.assertRaises(LineError):
            d.feed(b"END")

    def test_unsolicited_lines_are_ignored(self) -> None:
        d = Demux()
        d.feed(b"OK bye")
        d.feed(b"ERR - 408 idle_timeout")
        assert d.conn_error is not None
        self.assertEqual(d.conn_error.code, 408)


class HelpersTest(unittest.TestCase):
    def test_command_shape(self) -> None:
        self.assertEqual(command_shape("LADDER level=3"), ("LADDER", False))
        self.assertEqual(command_shape("CONFIG"), ("CONFIG", True))
        self.assertEqual(command_shape("CONFIG key=engine.max_seq_len"), ("CONFIG", False))
        self.assertEqual(command_shape("METRICS"), ("METRICS", True))
        for bad in ("GEN id=a prompt=x", "QUIT", "HELLO kiln/1", "CANCEL a", "a\nb", "lower"):
            with self.assertRaises(ValueError):
                command_shape(bad)

    def test_retry_delay(self) -> None:
        e503 = KilnError("x", code=503, slug="overloaded", retry_after_ms=500)
        self.assertEqual(retry_delay(e503, 0, 0.2), 0.5)
        drain = KilnError("x", code=503, slug="draining")
        self.assertEqual(retry_delay(drain, 0, 0.2), 0.2)
        self.assertEqual(retry_delay(drain, 2, 0.2), 0.8)
        self.assertEqual(retry_delay(KilnConnectionError("lost"), 0, 0.2), 0.0)
        self.assertIsNone(retry_delay(KilnTLSError("bad ca"), 0, 0.2))
        self.assertIsNone(retry_delay(KilnError("x", code=400), 0, 0.2))


if __name__ == "__main__":
    unittest.main()
