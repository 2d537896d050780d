#!/usr/bin/env python3
"""alloc_test.py: kilnd's loop thread allocates nothing per connection or per request.

Run by tests/net/serve.sh host alloc, with kilnd under the LD_PRELOAD shim
tests/shim/alloc_count.c (standard library only). After a warm-up that takes every path
once (TLS + HELLO + GEN with and without logprobs and n=2, /v1/completions and
/v1/chat/completions on keep-alive HTTPS streamed and whole, /v1/models, a /metrics
scrape), it reads the loop thread's allocation count, runs N more rounds of the same on
new connections, lets them close, and reads it again: the difference must be 0, and 0
again after a quiet spell (the loop's timers alone). On failure it asks the shim for the
backtraces of one more round (in kilnd's stderr).

  alloc_test.py --host H --port P --metrics-port M --ca ca.crt --token T --sock S [--rounds N]
"""
import argparse
import json
import socket
import ssl
import sys
import time

import serve_client as sc
from serve_client import Conn, collect, gen_line, http_get, read_response, read_to_close

A = None


def shim(cmd):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(A.sock)
    s.sendall(cmd.encode())
    return read_to_close(s).decode().strip()


def count():
    return int(dict(kv.split("=") for kv in shim("count").split())["allocs"])


def line_round(i):
    c = Conn()
    assert c.hello.startswith("OK "), c.hello
    c.send(gen_line("a%d" % i, "Count to five.", 6))
    r = collect(c, ["a%d" % i], samples=1)
    c.send(gen_line("b%d" % i, "Hello", 4, extra="logprobs=1 n=2", temperature="0.7"))
    r.update(collect(c, ["b%d" % i], samples=2))
    assert all(v[1].startswith("END ") for v in r.values()), r
    c.send("HEALTH")
    l = c.line()
    assert l.startswith("HEALTH "), l
    c.close()


def post(path, obj):
    b = json.dumps(obj).encode()
    return ("POST %s HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (path, A.token, len(b))).encode() + b


def https():
    raw = socket.create_connection((A.host, A.port), timeout=60)
    c = ssl.create_default_context(cafile=A.ca)
    c.set_alpn_protocols(["http/1.1"])
    return c.wrap_socket(raw, server_hostname="localhost")


def models(s, rest):
    s.sendall(("GET /v1/models HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n" % A.token).encode())
    st, _, body, rest = read_response(s, rest)
    assert st == 200, (st, body[:200])
    return json.loads(body)["data"][0]["id"], rest


def http_round(model):
    s, rest = https(), b""
    chat = [{"role": "user", "content": "Hi"}]
    for path, obj in [
            ("/v1/completions", {"prompt": "One, two,", "max_tokens": 4, "temperature": 0}),
            ("/v1/completions", {"prompt": "One, two,", "max_tokens": 4, "logprobs": 0, "n": 2}),
            ("/v1/chat/completions", {"messages": chat, "max_tokens": 4, "stream": True,
                                      "stream_options": {"include_usage": True}}),
            ("/v1/chat/completions", {"messages": chat, "max_tokens": 4, "logprobs": True})]:
        s.sendall(post(path, dict(obj, model=model)))
        st, _, body, rest = read_response(s, rest)
        assert st == 200, (path, st, body[:200])
    models(s, rest)
    s.close()


def rounds(n, model):
    for i in range(n):
        line_round(i)
        http_round(model)
        st, _ = http_get("/metrics")
        assert st == 200, st


def main():
    global A
    ap = argparse.ArgumentParser()
    for k in ("host", "ca", "token", "sock"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=8)
    A = ap.parse_args()
    A.user_token = A.token
    sc.A = A  # serve_client's helpers read the address, CA and token from it
    s = https()
    model, _ = models(s, b"")
    s.close()
    rounds(3, model)  # warm-up: every path once, the server's scratch at its size
    time.sleep(3)     # the closed connections' lingers end (their memory goes back then)
    c0 = count()
    rounds(A.rounds, model)
    time.sleep(3)
    c1 = count()
    time.sleep(2)     # idle: the loop's timers (sweep, ladder, transport ticks) alone
    c2 = count()
    ok = c1 == c0 and c2 == c1
    print(("ok   " if ok else "FAIL ") + "loop-thread allocations: %d over %d new connections (%d requests), %d idle"
          % (c1 - c0, A.rounds * 3, A.rounds * 9, c2 - c1), flush=True)
    if not ok:
        shim("trace 1")
        rounds(1, model)
        time.sleep(1)
        shim("trace 0")
        print("     (backtraces of one more round are in kilnd's stderr)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
