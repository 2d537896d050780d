"""Live tests against a running kilnd; skipped unless the environment names one:

  KILN_TEST_HOST, KILN_TEST_PORT, KILN_TEST_CA, KILN_TEST_TOKEN  (required)
  KILN_TEST_ADMIN_TOKEN  (optional: the admin checks)
  KILN_TEST_SERVER_HOSTNAME  (optional: the name on the server's certificate)
"""

from __future__ import annotations

import asyncio
import os
import time
import unittest
from typing import Dict

import kiln_test_support  # noqa: F401  (puts the package on sys.path)
from kiln import Client, KilnError
from kiln.aio import AsyncClient

ENV: Dict[str, str] = {k: os.environ.get(k, "") for k in (
    "KILN_TEST_HOST", "KILN_TEST_PORT", "KILN_TEST_CA", "KILN_TEST_TOKEN",
    "KILN_TEST_ADMIN_TOKEN", "KILN_TEST_SERVER_HOSTNAME",
)}  # fmt: skip
MISSING = [k for k in ("KILN_TEST_HOST", "KILN_TEST_PORT", "KILN_TEST_CA", "KILN_TEST_TOKEN") if not ENV[k]]
PROMPT = "What is the capital of France? Answer in one sentence."


@unittest.skipIf(MISSING, "live tests need a running kilnd: set %s" % ", ".join(MISSING))
class LiveTest(unittest.TestCase):
    def connect(self, token: str = "") -> Client:
        c = Client(ENV["KILN_TEST_HOST"], int(ENV["KILN_TEST_PORT"]), token or ENV["KILN_TEST_TOKEN"],
                   ENV["KILN_TEST_CA"], server_hostname=ENV["KILN_TEST_SERVER_HOSTNAME"] or None)  # fmt: skip
        self.addCleanup(c.close)
        return c

    def test_generate_and_stream_agree(self) -> None:
        c = self.connect()
        self.assertTrue(c.model)
        r = c.generate(PROMPT, temperature=0, max_tokens=16)
        self.assertTrue(r.text)
        self.assertIn(r.usage.reason, ("stop", "length"))
        s = c.stream(PROMPT, temperature=0, max_tokens=16)
        self.assertEqual("".join(t.text for t in s), r.text)
        assert s.usage is not None
        self.assertEqual(s.usage.completion_tokens, r.usage.completion_tokens)

    def test_logprobs_and_samples(self) -> None:
        c = self.connect()
        r = c.generate(PROMPT, max_tokens=4, n=2, logprobs=True, temperature=0.8, seed=1)
        self.assertEqual(len(r.texts), 2)
        self.assertEqual(len(r.usages), 2)
        self.assertTrue(all(t.token_id is not None and t.logprob is not None for t in r.tokens))

    def test_cancel_frees(self) -> None:
        c = self.connect()
        s = c.stream(PROMPT, max_tokens=300, ignore_eos=True)
        for i, _ in enumerate(s):
            if i == 2:
                break
        s.close()
        deadline = time.monotonic() + 5
        while True:
            st = c.stats()
            if st["running"] == 0 and st["kv_blocks_used"] == 0:
                break
            self.assertLess(time.monotonic(), deadline, "not freed: %r" % st)
            time.sleep(0.05)

    def test_async_concurrent(self) -> None:
        async def go() -> None:
            async with AsyncClient(ENV["KILN_TEST_HOST"], int(ENV["KILN_TEST_PORT"]), ENV["KILN_TEST_TOKEN"],
                                   ENV["KILN_TEST_CA"],
                                   server_hostname=ENV["KILN_TEST_SERVER_HOSTNAME"] or None) as c:  # fmt: skip
                rs = await asyncio.gather(*(c.generate(PROMPT, temperature=0, max_tokens=8) for _ in range(4)))
                self.assertEqual(len({r.text for r in rs}), 1)
                self.assertTrue((await c.health()).live)

        asyncio.run(asyncio.wait_for(go(), 120))

    def test_wrong_token(self) -> None:
        t0 = time.monotonic()
        with self.assertRaises(KilnError) as cm:
            self.connect("certainly-not-a-token")
        self.assertEqual(cm.exception.code, 401)
        self.assertLess(time.monotonic() - t0, 5)

    @unittest.skipUnless(ENV["KILN_TEST_ADMIN_TOKEN"], "set KILN_TEST_ADMIN_TOKEN for the admin checks")
    def test_admin(self) -> None:
        a = self.connect(ENV["KILN_TEST_ADMIN_TOKEN"])
        self.assertEqual(a.role, "admin")
        self.assertRegex(a.command("LADDER"), r"^LADDER level=\d+ name=\w+ pinned=[01] batch=\d+ ")
        self.assertIn("[engine]", a.command("CONFIG"))
        self.assertTrue(a.command("CONFIG key=engine.max_seq_len").startswith("CONFIG engine.max_seq_len="))


if __name__ == "__main__":
    unittest.main()
