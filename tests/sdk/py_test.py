#!/usr/bin/env python3
"""py_test.py: acceptance test of the Python client (sdk/python) against a running kilnd.

  python3 tests/sdk/py_test.py --host H --port P --ca CA --token T --admin-token A \\
      --expect-file F --prompt P --max-tokens N --wrong-ca WCA

F holds `kilnd generate --chat --temperature 0 --prompt P --max-tokens N` output without
the trailing newline. The package is imported from sdk/python (no install needed; an
installed kiln-client is used only if that directory is missing). Each check prints
`ok   name` or `FAIL name: detail`; the exit status is 0 only when all passed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import traceback
from typing import Callable, List

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.normpath(os.path.join(HERE, "..", "..", "sdk", "python"))
if os.path.isdir(os.path.join(SDK, "kiln")):
    sys.path.insert(0, SDK)

import kiln  # noqa: E402
from kiln import Client, KilnError, KilnTLSError  # noqa: E402
from kiln.aio import AsyncClient  # noqa: E402

FAILED: List[str] = []


def check(name: str, fn: Callable[[], str]) -> None:
    """Runs fn; it returns "" when the check passed, else what went wrong."""
    try:
        detail = fn()
    except Exception as exc:  # noqa: BLE001 - a check that raises has failed
        detail = "%s: %s" % (type(exc).__name__, exc)
        if os.environ.get("KILN_TEST_VERBOSE"):
            traceback.print_exc()
    if detail:
        print("FAIL %s: %s" % (name, detail), flush=True)
        FAILED.append(name)
    else:
        print("ok   %s" % name, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--admin-token", required=True)
    ap.add_argument("--expect-file", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--wrong-ca", required=True)
    a = ap.parse_args()

    with open(a.expect_file, "rb") as f:
        expect = f.read().decode("utf-8")
    H, P = a.host, a.port
    greedy = dict(chat=True, temperature=0, max_tokens=a.max_tokens)
    print("kiln-client %s from %s" % (kiln.__version__, os.path.dirname(kiln.__file__)), flush=True)

    def user(retries: int = 3) -> Client:
        return Client(H, P, a.token, a.ca, retries=retries)

    def admin() -> Client:
        return Client(H, P, a.admin_token, a.ca)

    c = user()

    # 1. generate(), greedy
    def t_generate() -> str:
        r = c.generate(a.prompt, **greedy)
        if r.text != expect:
            return "got %r, want %r" % (r.text, expect)
        u = r.usage
        if u.reason not in ("stop", "length") or u.completion_tokens < 1 or u.prompt_tokens < 1:
            return "odd usage %r" % (u,)
        if c.role != "user" or not c.model or not c.ctx:
            return "hello attributes model=%r ctx=%r role=%r" % (c.model, c.ctx, c.role)
        return ""

    check("generate greedy matches kilnd generate", t_generate)

    # 1b. messages=: a conversation instead of a prompt
    def t_messages() -> str:
        one = [{"role": "user", "content": a.prompt}]
        r1 = c.generate(messages=one, **greedy)
        if r1.text != expect:
            return "one user message: got %r, want %r" % (r1.text, expect)
        more = [{"role": "user", "content": "Remember the word otter."},
                {"role": "assistant", "content": "Noted: otter."}] + one
        s = c.stream(messages=more, **greedy)
        text = "".join(t.text for t in s)
        if not text or s.usage is None or s.usage.prompt_tokens <= r1.usage.prompt_tokens:
            return "three messages: %r usage %r (one message: %r)" % (text, s.usage, r1.usage)
        try:
            c.generate(messages=more[:2], **greedy)
            return "a conversation ending with assistant was accepted"
        except KilnError as exc:
            if exc.code != 400:
                return "last message assistant: %r" % exc
        try:
            c.generate(a.prompt, messages=one)
            return "prompt and messages together were accepted"
        except ValueError:
            pass
        return ""

    check("generate/stream with messages=", t_messages)

    # 2. stream(), AsyncClient, concurrency
    def t_stream() -> str:
        s = c.stream(a.prompt, **greedy)
        toks = list(s)
        text = "".join(t.text for t in toks)
        if text != expect:
            return "got %r, want %r" % (text, expect)
        if s.usage is None or s.usage.completion_tokens < len(toks):
            return "usage after exhaustion: %r (%d TOKs)" % (s.usage, len(toks))
        return ""

    check("stream gives the same text and usage", t_stream)

    async def t_async_main() -> str:
        async with AsyncClient(H, P, a.token, a.ca) as ac:
            r = await ac.generate(a.prompt, **greedy)
            if r.text != expect:
                return "AsyncClient.generate got %r, want %r" % (r.text, expect)
            conns = ac._pool.conns()  # one host, connections_per_host=1: one
            rs = await asyncio.wait_for(
                asyncio.gather(*(ac.generate(a.prompt, **greedy) for _ in range(4))),
                120,
            )
            bad = [x.text for x in rs if x.text != expect]
            if bad:
                return "concurrent results differ: %r" % bad
            if len(conns) != 1 or ac._pool.conns() != conns:
                return "the concurrent requests did not share one connection"
            s = ac.stream(a.prompt, **greedy)
            text = "".join([t.text async for t in s])
            if text != expect or s.usage is None:
                return "AsyncClient.stream got %r usage %r" % (text, s.usage)
        return ""

    check("AsyncClient generate, stream and 4 concurrent requests on one connection",
          lambda: asyncio.run(t_async_main()))

    # 3. failover
    def t_failover() -> str:
        fc = Client("127.0.0.1", 1, a.token, a.ca, hosts=[("127.0.0.1", 1), (H, P)], backoff=0.05)
        try:
            if fc.endpoint != (H, P):
                return "connected to %r" % (fc.endpoint,)
            r = fc.generate(a.prompt, **greedy)
            return "" if r.text == expect else "got %r" % r.text
        finally:
            fc.close()

    check("failover past a dead host", t_failover)

    # 4. 503 and retries
    adm = admin()

    def t_shed() -> str:
        rep = adm.command("LADDER level=3")
        if not rep.startswith("LADDER level=3 "):
            return "LADDER level=3 replied %r" % rep
        c0 = user(retries=0)
        try:
            c0.generate(a.prompt, **greedy)
            return "a GEN was accepted while shedding"
        except KilnError as e:
            if e.code != 503 or e.retry_after_ms != 500:
                return "want 503 retry_after_ms=500, got %r retry_after_ms=%r" % (e, e.retry_after_ms)
        finally:
            c0.close()
        c1 = user(retries=1)
        t0 = time.monotonic()
        try:
            c1.generate(a.prompt, **greedy)
            return "retries=1: a GEN was accepted while shedding"
        except KilnError as e:
            dt = time.monotonic() - t0
            if e.code != 503:
                return "retries=1: want code 503, got %r" % (e,)
            if dt < 0.5:
                return "retries=1 gave up after %.3f s (< 0.5 s: no retry?)" % dt
        finally:
            c1.close()
        c5 = user(retries=5)
        adm2 = admin()
        timer = threading.Timer(0.8, lambda: adm2.command("LADDER level=0"))
        t0 = time.monotonic()
        timer.start()
        try:
            r = c5.generate(a.prompt, **greedy)
            dt = time.monotonic() - t0
            if r.text != expect:
                return "retries=5 got %r" % r.text
            if dt < 0.8:
                return "retries=5 succeeded after %.3f s, before the ladder was lowered" % dt
        finally:
            timer.join()
            adm2.close()
            c5.close()
        return ""

    try:
        check("503 retry_after_ms: retries=1 raises 503, retries=5 outlasts the shed", t_shed)
    finally:
        try:
            adm.command("LADDER level=0")
        except KilnError as e:
            print("FAIL reset LADDER level=0: %s" % e)
            FAILED.append("ladder reset")

    def t_admin_forbidden() -> str:
        try:
            c.command("LADDER")
            return "a user connection ran LADDER"
        except KilnError as e:
            return "" if e.code == 403 else "want 403, got %r" % (e,)

    check("admin verbs refused on a user connection (403)", t_admin_forbidden)

    # 5. cancel frees the request's memory
    def t_cancel() -> str:
        s = c.stream(a.prompt, max_tokens=400, ignore_eos=True)
        got = []
        for t in s:
            got.append(t)
            if len(got) == 3:
                break
        s.close()
        if len(got) != 3:
            return "only %d tokens before the END" % len(got)
        deadline = time.monotonic() + 5
        st = c.stats()
        while time.monotonic() < deadline:
            st = c.stats()
            if st.get("running") == 0 and st.get("kv_blocks_used") == 0:
                break
            time.sleep(0.05)
        else:
            return "after 5 s: running=%r kv_blocks_used=%r" % (st.get("running"), st.get("kv_blocks_used"))
        if s.usage is not None and s.usage.reason != "cancelled":
            return "END reason %r, want cancelled" % s.usage.reason
        if s.usage is not None and s.usage.completion_tokens >= 400:
            return "the request ran to the end: %r" % (s.usage,)
        return ""

    check("closing a stream cancels it and frees its KV blocks", t_cancel)

    def t_info() -> str:
        h = c.health()
        if not (h.live and h.ready and h.level == 0):
            return "health %r" % (h,)
        m = c.metrics()
        if "kiln_up" not in m or not m.endswith("\n"):
            return "metrics text %r..." % m[:80]
        return ""

    check("health and metrics", t_info)

    # 6. TLS and token errors
    def t_wrong_ca() -> str:
        t0 = time.monotonic()
        try:
            Client(H, P, a.token, a.wrong_ca)
            return "connected with the wrong CA"
        except KilnTLSError as e:
            dt = time.monotonic() - t0
            if "certificate" not in str(e).lower() and "verify" not in str(e).lower():
                return "the message does not say why: %s" % e
            return "" if dt < 5 else "took %.1f s" % dt

    check("wrong CA raises KilnTLSError", t_wrong_ca)

    def t_wrong_token() -> str:
        t0 = time.monotonic()
        try:
            Client(H, P, "not-a-token-000000", a.ca)
            return "connected with a wrong token"
        except KilnError as e:
            dt = time.monotonic() - t0
            if e.code != 401:
                return "want code 401, got %r" % (e,)
            return "" if dt < 5 else "took %.1f s" % dt

    check("wrong token raises KilnError 401 within 5 s", t_wrong_token)

    def t_wrong_token_async() -> str:
        async def go() -> str:
            try:
                await asyncio.wait_for(AsyncClient(H, P, "not-a-token-000000", a.ca).connect(), 5)
                return "connected with a wrong token"
            except KilnError as e:
                return "" if e.code == 401 else "want 401, got %r" % (e,)

        return asyncio.run(go())

    check("AsyncClient: wrong token raises KilnError 401", t_wrong_token_async)

    c.close()
    adm.close()
    print("%d failed" % len(FAILED) if FAILED else "all passed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
