"""Offline tests of kiln.protocol: quoting, splitting, the typed server lines."""

from __future__ import annotations

import unittest

import kiln_test_support  # noqa: F401  (puts the package on sys.path)
from kiln.errors import KilnAuthError, KilnError
from kiln._core import gen_params
from kiln.protocol import (
    Health,
    LineError,
    Token,
    build_cancel,
    build_gen,
    build_hello,
    format_float,
    format_value,
    is_bare,
    parse_end,
    parse_err,
    parse_health,
    parse_hello_reply,
    parse_stats,
    parse_tok,
    quote,
    split_line,
    stuff_body,
    unquote,
    unstuff_body,
    valid_id,
)

SAMPLES = [
    "",
    "plain",
    "two words",
    'say "hi"',
    "back\\slash",
    "line\nbreak\r\ttab",
    "ctrl \x01\x1f\x7f",
    "héllo wörld",
    "日本語",
    "emoji 😀 and 𝄞",
    "key=value",
    "\\x41 not an escape",
    "\u2028\ufeff\uffff",
]


class QuoteTest(unittest.TestCase):
    def test_round_trip(self) -> None:
        for s in SAMPLES:
            for ascii_only in (False, True):
                with self.subTest(s=s, ascii_only=ascii_only):
                    q = quote(s, ascii_only=ascii_only)
                    self.assertTrue(q.startswith('"') and q.endswith('"'))
                    if ascii_only:
                        self.assertTrue(q.isascii(), q)
                    self.assertNotIn("\n", q)
                    self.assertEqual(unquote(q), s)
                    line = split_line("GEN id=a prompt=%s" % q)
                    self.assertEqual(line.get("prompt"), s)

    def test_escapes_written(self) -> None:
        self.assertEqual(quote('a"b\\c'), '"a\\"b\\\\c"')
        self.assertEqual(quote("\n\r\t"), '"\\n\\r\\t"')
        self.assertEqual(quote("\x01\x7f"), '"\\x01\\x7f"')
        self.assertEqual(quote("é"), '"é"')
        self.assertEqual(quote("é", ascii_only=True), '"\\u00e9"')
        self.assertEqual(quote("😀", ascii_only=True), '"\\xf0\\x9f\\x98\\x80"')

    def test_quote_refuses(self) -> None:
        with self.assertRaises(ValueError):
            quote("nul\x00")
        with self.assertRaises(ValueError):
            quote("lone \ud800 surrogate")
        with self.assertRaises(TypeError):
            quote(b"bytes")  # type: ignore[arg-type]

    def test_unquote_escapes(self) -> None:
        self.assertEqual(unquote('"\\x41\\x62"'), "Ab")
        self.assertEqual(unquote('"\\xc3\\xa9"'), "é")
        self.assertEqual(unquote('"\\xC3\\xA9"'), "é")
        self.assertEqual(unquote('"\\u00e9\\u00E9"'), "éé")
        self.assertEqual(unquote('"\\u20ac"'), "€")
        self.assertEqual(unquote('"\\xf0\\x9f\\x98\\x80"'), "😀")
        self.assertEqual(unquote('"caf\\u00e9 \\"x\\" \\\\"'), 'café "x" \\')
        self.assertEqual(unquote('"raw é"'.encode("utf-8")), "raw é")

    def test_unquote_errors(self) -> None:
        bad = [
            '"\\q"',  # unknown escape
            '"\\\'"',
            '"\\0"',
            '"\\U0001F600"',
            '"\\x00"',  # NUL
            '"\\u0000"',
            '"\\ud800"',  # surrogate
            '"\\udfff"',
            '"\\xff"',  # invalid UTF-8 after unescaping
            '"\\xc3"',  # truncated
            '"\\xc0\\x80"',  # overlong
            '"\\xed\\xa0\\x80"',  # encoded surrogate
            '"\\xf4\\x90\\x80\\x80"',  # above U+10FFFF
            '"\\x4"',  # one hex digit
            '"\\u12"',
            '"unterminated',
            '"tab\there"',  # raw control byte
            '"a"b',  # text after the quote
        ]
        for q in bad:
            with self.subTest(q=q):
                with self.assertRaises(LineError):
                    unquote(q)
        with self.assertRaises(LineError):
            unquote(b'"\xff"')
        self.assertEqual(unquote(b'"\xff"', strict=False), "\ufffd")

    def test_bare_and_values(self) -> None:
        self.assertTrue(is_bare("abc-1.5_:"))
        for s in ("", "a b", 'a"', "a=b", "é", "\t"):
            self.assertFalse(is_bare(s), s)
        self.assertEqual(format_value(True), "1")
        self.assertEqual(format_value(False), "0")
        self.assertEqual(format_value(42), "42")
        self.assertEqual(format_value(0.7), "0.7")
        self.assertEqual(format_value(1.0), "1")
        self.assertEqual(format_value(-0.0), "0")
        self.assertEqual(format_value("tok"), "tok")
        self.assertEqual(format_value("a b"), '"a b"')
        self.assertEqual(format_float(1e-5), "1e-05")
        for x in (float("inf"), float("nan")):
            with self.assertRaises(ValueError):
                format_float(x)


class SplitTest(unittest.TestCase):
    def test_basic(self) -> None:
        ln = split_line('  GEN  id=q1   prompt="a b" stop="x" stop=y  pos "quoted pos"  \r\n')
        self.assertEqual(ln.verb, "GEN")
        self.assertEqual(ln.pos, ("pos", "quoted pos"))
        self.assertEqual(ln.pos_quoted, (False, True))
        self.assertEqual(ln.get("id"), "q1")
        self.assertEqual(ln.get("prompt"), "a b")
        self.assertEqual(ln.get_all("stop"), ["x", "y"])
        self.assertEqual(ln.kv_quoted, (False, True, True, False))
        self.assertIsNone(ln.get("nope"))
        self.assertEqual(split_line(b"HEALTH").verb, "HEALTH")
        self.assertEqual(split_line('X k=""').get("k"), "")

    def test_errors_name_columns(self) -> None:
        cases = {
            'GEN id=a prompt="unterminated': "col 17: unterminated string",
            'GEN id=a prompt="bad \\q"': "col 22: bad escape \\q",
            "gen id=a prompt=hi": "col 1: verb must be upper case",
        }
        for line, msg in cases.items():
            with self.subTest(line=line):
                with self.assertRaises(LineError) as cm:
                    split_line(line)
                self.assertEqual(str(cm.exception), msg)

    def test_errors(self) -> None:
        bad = [
            "",
            "   ",
            "GEN1",
            "VERYLONGVERBNAMEXX",
            "GEN key=",
            "GEN Key=1",
            "GEN 1key=1",
            "GEN k-y=1",
            "GEN =1",
            "GEN k=a=b",
            'GEN k=a"b',
            "GEN k=é",
            "GEN a\tb",
            "GEN a b c d e",
            "GEN " + " ".join("k%d=1" % i for i in range(289)),  # MAX_KV: 32 + 256 messages
            "GEN " + "k" * 33 + "=1",
        ]
        for line in bad:
            with self.subTest(line=line):
                with self.assertRaises(LineError):
                    split_line(line)

    def test_lenient(self) -> None:
        many = "STATS " + " ".join("k%d=%d" % (i, i) for i in range(40))
        self.assertEqual(len(split_line(many, strict=False).kv), 40)
        self.assertEqual(split_line(b'TOK a "\xff"', strict=False).pos[1], "\ufffd")


class BuildTest(unittest.TestCase):
    def test_gen(self) -> None:
        line = build_gen(
            "r1",
            'say "hi"\n',
            {"chat": True, "system": "be brief", "max_tokens": 5, "temperature": 0, "top_p": 0.9,
             "seed": 2**64 - 1, "n": None, "stop": ["\n", "END"], "logprobs": False, "ignore_eos": None},
        )  # fmt: skip
        ln = split_line(line)
        self.assertEqual(ln.verb, "GEN")
        self.assertEqual(ln.get("id"), "r1")
        self.assertEqual(ln.get("prompt"), 'say "hi"\n')
        self.assertEqual(ln.get("chat"), "1")
        self.assertEqual(ln.get("system"), "be brief")
        self.assertEqual(ln.get("max_tokens"), "5")
        self.assertEqual(ln.get("temperature"), "0")
        self.assertEqual(ln.get("top_p"), "0.9")
        self.assertEqual(ln.get("seed"), str(2**64 - 1))
        self.assertEqual(ln.get_all("stop"), ["\n", "END"])
        self.assertEqual(ln.get("logprobs"), "0")
        self.assertIsNone(ln.get("n"))
        self.assertIsNone(ln.get("ignore_eos"))
        self.assertEqual(split_line(build_gen("r", "x", {"stop": "s"})).get_all("stop"), ["s"])

    def test_gen_messages(self) -> None:
        msgs = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": 'say "hi"'},
            {"role": "assistant", "content": "hi\n"},
            {"role": "user", "content": "<|im_end|> again"},
        ]
        ln = split_line(build_gen("r2", None, {"messages": msgs, "max_tokens": 4}))
        self.assertIsNone(ln.get("prompt"))
        self.assertEqual(ln.get("chat"), "1")
        self.assertEqual(ln.get("max_tokens"), "4")
        got = [(k, v) for k, v in ln.kv if k in ("system", "user", "assistant")]
        self.assertEqual(got, [(m["role"], m["content"]) for m in msgs])  # wire order kept
        # chat given by the caller is not sent twice
        ln = split_line(build_gen("r3", None, {"messages": msgs[1:2], "chat": True}))
        self.assertEqual([k for k, _ in ln.kv].count("chat"), 1)
        # 256 messages fit the splitter's limits; 257 are refused before sending
        many = [{"role": "user", "content": str(i)} for i in range(256)]
        self.assertEqual(len(split_line(build_gen("r4", None, {"messages": many, "temperature": 0})).kv), 259)
        with self.assertRaises(ValueError):
            build_gen("r", None, {"messages": many + many[:1]})
        bad = [
            ("x", {"messages": msgs}, ValueError),  # prompt and messages
            (None, {"messages": msgs, "system": "s"}, ValueError),
            (None, {"messages": msgs, "chat": False}, ValueError),
            (None, {"messages": []}, ValueError),
            (None, {"messages": [{"role": "tool", "content": "x"}]}, ValueError),
            (None, {"messages": [{"role": "user"}]}, TypeError),
            (None, {"messages": [{"role": "user", "content": 1}]}, TypeError),
            (None, {"messages": [{"role": "user", "content": "x", "name": "n"}]}, TypeError),
            (None, {"messages": "user: hi"}, TypeError),
            (None, {}, TypeError),  # neither
        ]
        for prompt, params, exc in bad:
            with self.subTest(params=params):
                with self.assertRaises(exc):
                    build_gen("r", prompt, params)
        with self.assertRaises(ValueError):
            gen_params(False, None, None, None, None, None, None, None, None, None, None, None,
                       1, None, False, False, msgs)  # fmt: skip

    def test_gen_refuses(self) -> None:
        with self.assertRaises(ValueError):
            build_gen("bad id", "x", {})
        with self.assertRaises(TypeError):
            build_gen("r", "x", {"bogus": 1})
        with self.assertRaises(TypeError):
            build_gen("r", "x", {"max_tokens": 1.5})
        with self.assertRaises(TypeError):
            build_gen("r", "x", {"temperature": "hot"})
        with self.assertRaises(TypeError):
            build_gen("r", b"x", {})  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            build_gen("r", "nul\x00", {})

    def test_ids_hello_cancel(self) -> None:
        self.assertTrue(valid_id("a-B_c.1:2"))
        self.assertFalse(valid_id(""))
        self.assertFalse(valid_id("x" * 65))
        self.assertFalse(valid_id("a b"))
        self.assertEqual(build_hello("tok123"), "HELLO kiln/1 token=tok123")
        self.assertEqual(split_line(build_hello("a b=c")).get("token"), "a b=c")
        self.assertEqual(build_cancel("q3"), "CANCEL q3")
        with self.assertRaises(ValueError):
            build_cancel("no good")


class ParseTest(unittest.TestCase):
    def test_tok(self) -> None:
        rid, t = parse_tok(split_line('TOK q1 " Paris"'))
        self.assertEqual((rid, t), ("q1", Token(" Paris")))
        rid, t = parse_tok(split_line('TOK q2 "\\u00e9\\n" sample=1 token=4796 logprob=-0.0213'))
        self.assertEqual(t, Token("é\n", 1, 4796, -0.0213))
        with self.assertRaises(LineError):
            parse_tok(split_line("TOK q1"))

    def test_end(self) -> None:
        rid, u = parse_end(split_line(
            "END q1 reason=length prompt_tokens=6 completion_tokens=3 cached_tokens=2 "
            "ttft_ms=12.1 tpot_ms=4.05 e2e_ms=20.2 sample=1"
        ))  # fmt: skip
        self.assertEqual(rid, "q1")
        self.assertEqual(u.reason, "length")
        self.assertEqual((u.prompt_tokens, u.completion_tokens, u.cached_tokens), (6, 3, 2))
        self.assertEqual((u.ttft_ms, u.tpot_ms, u.e2e_ms, u.sample), (12.1, 4.05, 20.2, 1))
        with self.assertRaises(LineError):
            parse_end(split_line("END q1 reason=stop prompt_tokens=x"))

    def test_err(self) -> None:
        e = parse_err(split_line("ERR q1 503 overloaded retry_after_ms=500"))
        self.assertIsInstance(e, KilnError)
        self.assertEqual((e.code, e.slug, e.request_id, e.retry_after_ms), (503, "overloaded", "q1", 500))
        e = parse_err(split_line('ERR - 400 bad_request msg="col 17: unterminated string"'))
        self.assertIsNone(e.request_id)
        self.assertEqual(e.msg, "col 17: unterminated string")
        self.assertIn("400 bad_request", str(e))
        e = parse_err(split_line("ERR - 401 unauthorized"))
        self.assertIsInstance(e, KilnAuthError)
        self.assertEqual(e.code, 401)
        self.assertEqual(e.copy().code, 401)
        self.assertIsInstance(e.copy(), KilnAuthError)

    def test_hello(self) -> None:
        h = parse_hello_reply(split_line('OK kiln/1 model="SmolLM2 135M" ctx=4096 session=7 role=user'))
        self.assertEqual((h.model, h.ctx, h.session, h.role), ("SmolLM2 135M", 4096, 7, "user"))
        with self.assertRaises(KilnAuthError):
            parse_hello_reply(split_line("ERR - 401 unauthorized"))
        with self.assertRaises(LineError):
            parse_hello_reply(split_line("OK kiln/2 ctx=1"))

    def test_health_stats(self) -> None:
        h = parse_health(split_line("HEALTH live=1 ready=0 level=3 running=2 waiting=5 draining=1"))
        self.assertEqual(h, Health(True, False, 3, 2, 5, True))
        s = parse_stats(split_line(
            "STATS uptime_s=10 requests_total=4 running=0 kv_blocks_used=0 kv_usage=0.2500 "
            "prefix_hit_rate=.5 odd=x"
        ))  # fmt: skip
        self.assertEqual(s["uptime_s"], 10)
        self.assertIsInstance(s["uptime_s"], int)
        self.assertEqual(s["kv_usage"], 0.25)
        self.assertIsInstance(s["kv_usage"], float)
        self.assertEqual(s["prefix_hit_rate"], 0.5)
        self.assertNotIn("odd", s)

    def test_dot_stuffing(self) -> None:
        text = "# HELP x\n.starts with a dot\n..two\n.\nlast\n"
        lines = stuff_body(text)
        self.assertEqual(lines, ["# HELP x", "..starts with a dot", "...two", "..", "last", "."])
        self.assertEqual(unstuff_body(lines[:-1]), text)
        self.assertEqual(unstuff_body([]), "")
        self.assertEqual(stuff_body(""), ["."])


if __name__ == "__main__":
    unittest.main()
