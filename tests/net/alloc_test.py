#!/usr/bin/env python3
"""alloc_test.py: kilnd's loop thread allocates nothing per connection or per request.

Run by tests/net/serve.sh host alloc, with kilnd under the LD_PRELOAD shim
tests/shim/alloc_count.c (standard library only). After a warm-up that takes every path
once (TLS + HELLO + GEN with and without logprobs, /v1/completions and
/v1/chat/completions on keep-alive HTTPS streamed and whole, a /metrics scrape), it reads
the loop thread's allocation count, runs N more rounds of the same on new connections,
lets them close, and reads it again: the difference must be 0. On failure it asks the
shim for the backtraces of one more round (in kilnd's stderr).

  alloc_test.py --host H --port P --metrics-port M --ca ca.crt --token T --sock S [--rounds N]
"""
import argparse
import json
import socket
import ssl
import sys
import time

A = None


def shim(cmd):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(A.sock)
    s.sendall(cmd.encode())
    out = b""
    while True:
        d = s.recv(256)
        if not d:
            break
        out += d
    s.close()
    return out.decode().strip()


def count():
    return int(dict(kv.split("=") for kv in shim("count").split())["allocs"])


def tls(alpn):
    raw = socket.create_connection((A.host, A.port), timeout=60)
    c = ssl.create_default_context(cafile=A.ca)
    c.set_alpn_protocols([alpn])
    return c.wrap_socket(raw, server_hostname="localhost")


def lines_until(s, buf, prefixes):
    while True:
        while b"\n" not in buf:
            d = s.recv(65536)
            if not d:
                raise EOFError("closed")
            buf += d
        l, buf = buf.split(b"\n", 1)
        l = l.decode("utf-8", "replace")
        if l.startswith(prefixes):
            return l, buf


def line_round(i):
    s = tls("kiln/1")
    s.sendall(("HELLO kiln/1 token=%s\n" % A.token).encode())
    l, buf = lines_until(s, b"", ("OK", "ERR"))
    assert l.startswith("OK"), l
    s.sendall(('GEN id=a%d chat=1 temperature=0 max_tokens=6 prompt="Count to five."\n'
               'GEN id=b%d temperature=0.7 max_tokens=4 logprobs=1 n=2 prompt="Hello"\n' % (i, i)).encode())
    ends = 0
    while ends < 3:  # a: one sample, b: two
        l, buf = lines_until(s, buf, ("END", "ERR"))
        assert l.startswith("END"), l
        ends += 1
    s.sendall(b"HEALTH\n")
    l, buf = lines_until(s, buf, ("HEALTH", "ERR"))
    assert l.startswith("HEALTH"), l
    s.close()


def read_response(s, buf):
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise EOFError("closed before the head")
        buf += d
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    hdr = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:]}
    if "content-length" in hdr:
        n = int(hdr["content-length"])
        while len(buf) < n:
            buf += s.recv(65536)
        return status, buf[:n], buf[n:]
    body = b""
    while True:
        while b"\r\n" not in buf:
            buf += s.recv(65536)
        size, buf = buf.split(b"\r\n", 1)
        n = int(size, 16)
        while len(buf) < n + 2:
            buf += s.recv(65536)
        body, buf = body + buf[:n], buf[n + 2:]
        if n == 0:
            return status, body, buf


def post(path, obj):
    b = json.dumps(obj).encode()
    return ("POST %s HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (path, A.token, len(b))).encode() + b


def http_round(model):
    s = tls("http/1.1")
    buf = b""
    reqs = [("/v1/completions", {"model": model, "prompt": "One, two,", "max_tokens": 4, "temperature": 0}),
            ("/v1/completions", {"model": model, "prompt": "One, two,", "max_tokens": 4, "logprobs": 0, "n": 2}),
            ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                      "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}),
            ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                      "max_tokens": 4, "logprobs": True})]
    for path, obj in reqs:
        s.sendall(post(path, obj))
        st, body, buf = read_response(s, buf)
        assert st == 200, (path, st, body[:200])
    s.sendall(("GET /v1/models HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n" % A.token).encode())
    st, body, buf = read_response(s, buf)
    assert st == 200, (st, body[:200])
    s.close()


def metrics():
    s = socket.create_connection((A.host, A.metrics_port), timeout=20)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: kiln\r\n\r\n")
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    return data


def model_name():
    s = tls("http/1.1")
    s.sendall(("GET /v1/models HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n" % A.token).encode())
    st, body, _ = read_response(s, b"")
    s.close()
    return json.loads(body)["data"][0]["id"]


def rounds(n, model):
    for i in range(n):
        line_round(i)
        http_round(model)
        metrics()


def settle(seconds=3.0):
    """Wait for the closed connections' lingers to end (their memory goes back then)."""
    time.sleep(seconds)


def main():
    global A
    ap = argparse.ArgumentParser()
    for k in ("host", "ca", "token", "sock"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=8)
    A = ap.parse_args()
    model = model_name()
    rounds(3, model)  # warm-up: every path once, the server's scratch at its size
    settle()
    c0 = count()
    rounds(A.rounds, model)
    settle()
    c1 = count()
    # idle: the loop's timers (sweep, ladder, transport ticks) alone
    time.sleep(2)
    c2 = count()
    per = A.rounds * 3  # connections per round: line, HTTP, metrics
    ok = c1 == c0 and c2 == c1
    print(("ok   " if ok else "FAIL ") + "loop-thread allocations: %d over %d new connections (%d requests), %d idle"
          % (c1 - c0, per, A.rounds * 8, c2 - c1), flush=True)
    if not ok:
        shim("trace 1")
        rounds(1, model)
        settle(1)
        shim("trace 0")
        print("     (backtraces of one more round are in kilnd's stderr)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
