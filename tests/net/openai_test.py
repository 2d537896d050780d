#!/usr/bin/env python3
"""openai_test.py: the OpenAI-compatible API of a running `kilnd serve`, through the official
`openai` package (PyPI), curl and raw TLS sockets.

Run by tests/net/serve.sh (CHECKS=openai) with the venv's python. Each check prints one
line; the exit status is 0 only when all passed. Every request is small (at most 24
tokens) and has a timeout; nothing here runs longer than a couple of minutes.

  openai_test.py --host H --port P --metrics-port M --ca ca.crt --token T --admin-token A
      --expect expect.json

expect.json: {"prompt": "...", "max_tokens": N, "text": "<kilnd generate --chat's greedy output>"}
"""
import argparse
import json
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

import openai

from serve_client import read_response  # one HTTP/1.1 response reader for the tests

A = None
FAILED = []
T0 = time.monotonic()


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (": " + str(detail) if detail and not ok else ""), flush=True)
    if not ok:
        FAILED.append(name)
    return ok


def ctx(alpn=None):
    c = ssl.create_default_context(cafile=A.ca)
    if alpn:
        c.set_alpn_protocols(alpn)
    return c


def client(token=None):
    http = openai.DefaultHttpx2Client(verify=ctx(), timeout=60)
    return openai.OpenAI(base_url="https://%s:%d/v1" % (A.host, A.port), api_key=token or A.token,
                         http_client=http, max_retries=0)


# ---------------------------------------------------------------- raw TLS helpers

def tls_conn(alpn=None, timeout=30):
    raw = socket.create_connection((A.host, A.port), timeout=timeout)
    return ctx(alpn).wrap_socket(raw, server_hostname="localhost")


def post(path, obj, token=None):
    return ("POST %s HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (path, token or A.token, len(json.dumps(obj)))).encode() + json.dumps(obj).encode()


def line_gen(prompt, max_tokens):
    """The same prompt through the line protocol: (text, END line) -- one path for both doors."""
    s = tls_conn()
    s.sendall(("HELLO kiln/1 token=%s\n" % A.token).encode())
    buf = b""
    text = b""
    s.sendall(('GEN id=1 chat=1 temperature=0 max_tokens=%d prompt=%s\n' % (max_tokens, json.dumps(prompt))).encode())
    while True:
        while b"\n" not in buf:
            buf += s.recv(65536)
        l, buf = buf.split(b"\n", 1)
        l = l.decode()
        if l.startswith("TOK 1 "):
            text += json.loads(re.match(r'TOK 1 ("(?:[^"\\]|\\.)*")', l).group(1)).encode()
        elif l.startswith("END 1") or l.startswith("ERR 1"):
            s.close()
            return text.decode(), l


def metric(name):
    body = urllib.request.urlopen("http://%s:%d/metrics" % (A.host, A.metrics_port), timeout=10).read().decode()
    total = 0.0
    for l in body.splitlines():
        if l.startswith(name + " ") or l.startswith(name + "{"):
            total += float(l.rsplit(" ", 1)[1])
    return total


# ---------------------------------------------------------------- the checks

def test_models(c):
    models = c.models.list()
    ids = [m.id for m in models.data]
    check("/v1/models lists the served model under [model] served_model_name",
          ids == [A.served_name], (ids, A.served_name))
    try:  # the GGUF's own name is not an alias: only the served name is
        c.completions.create(model="Smollm2 135M 8k Lc100K Mix1 Ep2", prompt="hi", max_tokens=1)
        check("a request naming the GGUF's general.name: 404 model_not_found", False, "no error")
    except openai.NotFoundError as e:
        check("a request naming the GGUF's general.name: 404 model_not_found",
              e.status_code == 404 and A.served_name in str(e), str(e))
    return ids[0]


def test_chat(c, model, exp):
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": exp["prompt"]}],
                                  max_tokens=exp["max_tokens"], temperature=0)
    text = r.choices[0].message.content
    check("chat: greedy text equals kilnd generate --chat", text == exp["text"], (text, exp["text"]))
    check("chat: finish_reason length or stop", r.choices[0].finish_reason in ("length", "stop"), r.choices[0].finish_reason)
    ltext, end = line_gen(exp["prompt"], exp["max_tokens"])
    pt = int(re.search(r"prompt_tokens=(\d+)", end).group(1))
    ct = int(re.search(r"completion_tokens=(\d+)", end).group(1))
    check("chat: the same text as the line protocol's GEN", ltext == text, (ltext, text))
    check("chat: usage equals the line protocol's token counts",
          (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (pt, ct, pt + ct),
          (r.usage, end))
    # logprobs: one entry per generated token
    r2 = c.chat.completions.create(model=model, messages=[{"role": "user", "content": exp["prompt"]}],
                                   max_tokens=exp["max_tokens"], temperature=0, logprobs=True)
    lp = r2.choices[0].logprobs.content
    check("chat: logprobs, one entry per completion token (the end-of-turn token has none)",
          len(lp) + (r2.choices[0].finish_reason == "stop") == r2.usage.completion_tokens and
          all(e.logprob <= 0 for e in lp), (len(lp), r2.usage.completion_tokens))
    check("chat: logprobs' tokens spell the text", "".join(e.token for e in lp) == r2.choices[0].message.content)
    return text


def test_chat_stream(c, model, exp, whole):
    chunks = list(c.chat.completions.create(model=model, messages=[{"role": "user", "content": exp["prompt"]}],
                                            max_tokens=exp["max_tokens"], temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    fin = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    usage = [ch.usage for ch in chunks if ch.usage]
    check("chat stream: deltas add up to the whole answer", text == whole, (text, whole))
    check("chat stream: one finish_reason", len(fin) == 1, fin)
    check("chat stream: the last chunk carries usage (include_usage)",
          len(usage) == 1 and chunks[-1].usage is not None and not chunks[-1].choices and
          usage[0].completion_tokens > 0, usage)


def test_completions(c, model):
    kw = dict(model=model, prompt="The three primary colours are", max_tokens=12, temperature=0)
    r = c.completions.create(**kw)
    text = r.choices[0].text
    check("completions: text", len(text) > 0 and r.usage.completion_tokens == 12, r)
    s = "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices)
    check("completions stream: the same text", s == text, (s, text))
    r = c.completions.create(logprobs=0, **kw)
    lp = r.choices[0].logprobs
    check("completions: logprobs=0 gives one logprob per token",
          len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens, lp)
    r = c.completions.create(logprobs=3, **kw)
    lp = r.choices[0].logprobs
    tops = lp.top_logprobs or []
    check("completions: logprobs=3 gives each token its 3 most likely, greedy's the first of them",
          len(tops) == len(lp.tokens) == r.usage.completion_tokens and
          all(len(t) == 3 and abs(max(t.values()) - v) < 1e-4 for t, v in zip(tops, lp.token_logprobs)),
          (tops[:2], lp.token_logprobs[:2]))


def test_top_logprobs(c, model):
    """top_logprobs: for each token the most likely ones, most likely first, under the same
    distribution as the token's own logprob (greedy: the token is the first of them), whole
    and streamed alike."""
    msgs = [{"role": "user", "content": "Name a colour."}]
    kw = dict(model=model, messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5)
    r = c.chat.completions.create(**kw)
    ents = r.choices[0].logprobs.content
    ok = len(ents) > 0 and all(
        len(e.top_logprobs) == 5 and e.top_logprobs[0].token == e.token and
        abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6 and
        all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:])) and
        all(t.logprob <= 0 and t.bytes == list(t.token.encode()) for t in e.top_logprobs
            if "\ufffd" not in t.token) for e in ents)
    check("top_logprobs=5: five per token, sorted, the greedy token first with its own logprob", ok,
          [(e.token, [(t.token, round(t.logprob, 3)) for t in e.top_logprobs]) for e in ents[:2]])
    s = [e for ch in c.chat.completions.create(stream=True, **kw) if ch.choices and ch.choices[0].logprobs
         for e in ch.choices[0].logprobs.content]
    check("top_logprobs streamed: the same entries", [(e.token, [t.token for t in e.top_logprobs]) for e in s] ==
          [(e.token, [t.token for t in e.top_logprobs]) for e in ents], (len(s), len(ents)))
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0, logprobs=True,
                                  top_logprobs=0)
    check("top_logprobs=0: an empty list per token",
          all(e.top_logprobs == [] for e in r.choices[0].logprobs.content), r.choices[0].logprobs)


def test_n_seed_stop(c, model, exp):
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=1.0, n=2, seed=42,
                                  logprobs=True)
    check("n=2: two choices, indexed 0 and 1", sorted(ch.index for ch in r.choices) == [0, 1], r.choices)
    check("n=2: usage sums both choices' tokens",
          r.usage.completion_tokens == sum(len(ch.logprobs.content) + (ch.finish_reason == "stop")
                                           for ch in r.choices), r.usage)
    a = c.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=1.0, seed=1234)
    b = c.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=1.0, seed=1234)
    check("seed: the same seed gives the same text", a.choices[0].message.content == b.choices[0].message.content,
          (a.choices[0].message.content, b.choices[0].message.content))
    words = [w for w in re.findall(r"[A-Za-z]{3,}", exp["text"])]
    if check("stop: the expected text has words to stop at", len(words) >= 2, exp["text"]):
        stops = [words[1], words[0]]  # the earliest match wins, whatever the order
        cut = min(exp["text"].find(w) for w in stops)
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": exp["prompt"]}],
                                      max_tokens=exp["max_tokens"], temperature=0, stop=stops)
        check("stop list: the text ends before the first stop string", r.choices[0].message.content ==
              exp["text"][:cut] and r.choices[0].finish_reason == "stop", (r.choices[0].message.content, stops))


def expect_error(name, fn, cls, status, param=None):
    try:
        fn()
    except cls as e:
        ok = e.status_code == status and (param is None or (e.body or {}).get("param") == param)
        return check(name, ok, (e.status_code, e.body))
    except Exception as e:  # noqa: BLE001
        return check(name, False, repr(e))
    return check(name, False, "no error")


def test_errors(c, model):
    msgs = [{"role": "user", "content": "hi"}]
    expect_error("401 with a bad token", lambda: client("not-a-token").chat.completions.create(
        model=model, messages=msgs, max_tokens=2), openai.AuthenticationError, 401)
    expect_error("400 names an unknown field", lambda: c.chat.completions.create(
        model=model, messages=msgs, max_tokens=2, extra_body={"frobnicate": 1}), openai.BadRequestError, 400,
        "frobnicate")
    expect_error("400 names an unimplemented field (tools)", lambda: c.chat.completions.create(
        model=model, messages=msgs, max_tokens=2, tools=[{"type": "function", "function": {"name": "f"}}]),
        openai.BadRequestError, 400, "tools")
    expect_error("400 for top_logprobs without logprobs: true", lambda: c.chat.completions.create(
        model=model, messages=msgs, max_tokens=2, top_logprobs=3), openai.BadRequestError, 400, "top_logprobs")
    expect_error("400 for a value out of GEN's range", lambda: c.chat.completions.create(
        model=model, messages=msgs, max_tokens=2, temperature=500), openai.BadRequestError, 400, "temperature")
    expect_error("404 for another model", lambda: c.chat.completions.create(
        model="no-such-model", messages=msgs, max_tokens=2), openai.NotFoundError, 404, "model")


def test_curl(model):
    base = "https://%s:%d" % (A.host, A.port)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8})
    out = subprocess.run(["curl", "-sS", "--max-time", "60", "--cacert", A.ca, base + "/v1/chat/completions",
                          "-H", "Authorization: Bearer " + A.token, "-H", "Content-Type: application/json",
                          "-d", body], capture_output=True, text=True, timeout=90)
    try:
        j = json.loads(out.stdout)
        ok = j["object"] == "chat.completion" and j["usage"]["completion_tokens"] > 0
    except (ValueError, KeyError) as e:
        ok = False
        out.stderr += repr(e)
    check("curl: chat completion", ok, (out.stdout, out.stderr))
    out = subprocess.run(["curl", "-sS", "-N", "--max-time", "60", "--cacert", A.ca, base + "/v1/completions",
                          "-H", "Authorization: Bearer " + A.token, "-d",
                          json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4, "stream": True})],
                         capture_output=True, text=True, timeout=90)
    check("curl: a stream of server-sent events ends with [DONE]",
          out.stdout.count("data: {") == 5 and out.stdout.rstrip().endswith("data: [DONE]"), out.stdout)
    out = subprocess.run(["curl", "-sS", "--max-time", "20", "http://%s:%d/v1/models" % (A.host, A.port)],
                         capture_output=True, text=True, timeout=30)
    check("curl: plain HTTP to the TLS port is told it speaks HTTPS", "HTTPS (TLS) only" in out.stdout,
          (out.stdout, out.stderr))


def test_keepalive(model):
    req = {"model": model, "prompt": "One, two,", "max_tokens": 3, "temperature": 0}
    s = tls_conn(alpn=["http/1.1"])
    check("ALPN: the server picks http/1.1", s.selected_alpn_protocol() == "http/1.1", s.selected_alpn_protocol())
    rest = b""
    texts = []
    for _ in range(3):
        s.sendall(post("/v1/completions", req))
        st, hdr, body, rest = read_response(s, rest)
        texts.append(json.loads(body)["choices"][0]["text"] if st == 200 else st)
    check("keep-alive: three requests on one connection", len(set(texts)) == 1 and isinstance(texts[0], str) and
          hdr.get("connection") == "keep-alive", (texts, hdr))
    # pipelined: two requests in one write, two answers in order
    s.sendall(post("/v1/completions", req) + b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer " +
              A.token.encode() + b"\r\n\r\n")
    st1, _, b1, rest = read_response(s, rest)
    st2, _, b2, rest = read_response(s, rest)
    check("keep-alive: pipelined requests answered in order",
          st1 == 200 and json.loads(b1)["object"] == "text_completion" and st2 == 200 and
          json.loads(b2)["object"] == "list", (st1, b1[:80], st2, b2[:80]))
    s.close()
    # an HTTP request on a connection that chose the line protocol by ALPN is told so
    s = tls_conn(alpn=["kiln/1"])
    s.sendall(b"GET /v1/models HTTP/1.1\r\n\r\n")
    got = b""
    while b"\n" not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    check("ALPN kiln/1: an HTTP request gets the line protocol's answer saying so",
          got.startswith(b"ERR - 401 unauthorized") and b"ALPN http/1.1" in got, got)
    s.close()
    # without ALPN: told apart by the first bytes
    s = tls_conn()
    s.sendall(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    st, hdr, body, _ = read_response(s)
    check("no ALPN: an HTTP request line is HTTP", st == 200 and json.loads(body)["status"] == "ok" and
          hdr.get("connection") == "close", (st, hdr, body))
    s.close()


def test_disconnect(model):
    """A client that goes away mid-stream: its request is cancelled and its KV blocks freed."""
    cancelled = metric("kiln_request_cancelled_total")
    s = tls_conn()
    s.sendall(post("/v1/chat/completions", {"model": model, "max_tokens": 200, "stream": True,
                                            "messages": [{"role": "user", "content": "Count to one hundred."}]}))
    got = b""
    while got.count(b"data: ") < 2:
        got += s.recv(65536)
    s.close()
    ok = False
    for _ in range(100):
        if metric("kiln_request_cancelled_total") > cancelled and \
                metric("kiln_num_requests_running") == 0 and metric("kiln_kv_cache_usage_perc") == 0:
            ok = True
            break
        time.sleep(0.1)
    check("disconnect mid-stream: cancelled, nothing running, no KV block held", ok)


def test_slow_reader(model):
    """A stream whose client stops reading pauses (no more tokens made for it) once the
    server's output bound and the socket buffers fill, other clients are served meanwhile,
    and it completes once read (as the line protocol's slow reader, serve_client.py)."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    raw.settimeout(120)
    raw.connect((A.host, A.port))
    s = ctx().wrap_socket(raw, server_hostname="localhost")
    s.sendall(post("/v1/completions", {"model": model, "prompt": "Count: one, two, three,", "max_tokens": 600,
                                       "n": 2, "stream": True, "ignore_eos": True, "temperature": 0.8, "seed": 3}))
    prev, stalled = None, False
    for _ in range(60):  # 30 s at most
        time.sleep(0.5)
        g = metric("kiln_generation_tokens_total")
        if prev is not None and g == prev and metric("kiln_num_requests_running") >= 1:
            stalled = True
            break
        prev = g
    check("slow reader: its stream pauses", stalled, prev)
    other = client().completions.create(model=model, prompt="Hello", max_tokens=4, temperature=0)
    check("slow reader: others are served meanwhile", other.usage.completion_tokens == 4, other.usage)
    body = b""
    while not body.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
        d = s.recv(65536)
        if not d:
            break
        body += d
    s.close()
    # (an event per token with text to show: a token held back for UTF-8 shows with the next)
    check("slow reader: the paused stream resumes and completes once read",
          body.count(b'"text_completion"') >= 600 and body.count(b'"finish_reason":"length"') == 2 and
          b"data: [DONE]" in body, body[-120:])


def test_limits_drain(model):
    s = tls_conn()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer " + A.token.encode() +
              b"\r\nContent-Length: 99999999\r\n\r\n")
    st, hdr, body, _ = read_response(s)
    check("a body over max_http_body_bytes: 413, connection closed",
          st == 413 and hdr.get("connection") == "close" and json.loads(body)["error"]["code"] == "too_large",
          (st, hdr, body))
    s.close()
    admin("DRAIN")
    try:
        s = tls_conn()
        s.sendall(post("/v1/completions", {"model": model, "prompt": "x", "max_tokens": 2}))
        st, hdr, body, _ = read_response(s)
        s.close()
        check("draining: 503 draining and Connection: close (the client moves on)",
              st == 503 and hdr.get("connection") == "close" and json.loads(body)["error"]["code"] == "draining",
              (st, hdr, body))
    finally:
        admin("DRAIN off")


def admin(line):
    s = tls_conn()
    s.sendall(("HELLO kiln/1 token=%s\n%s\nQUIT\n" % (A.admin_token, line)).encode())
    out = b""
    while out.count(b"\n") < 3:
        d = s.recv(4096)
        if not d:
            break
        out += d
    s.close()
    return out.decode()


def test_shed(model):
    admin("LADDER level=3")
    try:
        s = tls_conn()
        s.sendall(post("/v1/completions", {"model": model, "prompt": "x", "max_tokens": 2}))
        st, hdr, body, _ = read_response(s)
        s.close()
        err = json.loads(body).get("error", {})
        check("shed rung: 503 with Retry-After and an OpenAI error", st == 503 and int(hdr.get("retry-after", 0)) >= 1
              and err.get("code") == "overloaded", (st, hdr, body))
    finally:
        admin("LADDER level=auto")


def test_fleet_metrics(model):
    """What the Inference Extension's model-server protocol and vLLM dashboards read: queue,
    running, KV utilisation 0..1, kiln_cache_config_info{block_size,num_gpu_blocks}, a
    model_name label equal to /v1/models' id, successes by finished_reason with cancelled and
    errored apart, build info and process metrics."""
    body = urllib.request.urlopen("http://%s:%d/metrics" % (A.host, A.metrics_port), timeout=10).read().decode()
    samples = [l for l in body.splitlines() if l and not l.startswith("#")]
    esc = model.replace("\\", "\\\\").replace('"', '\\"')
    unlabelled = [l for l in samples if l.startswith("kiln_") and not l.startswith("kiln_build_info")
                  and not l.startswith("kiln_backend_info")
                  and 'model_name="%s"' % esc not in l]
    check("/metrics: every kiln_ series carries model_name = the model's id", not unlabelled, unlabelled[:3])
    cc = [l for l in samples if l.startswith("kiln_cache_config_info{")]
    m = re.match(r'kiln_cache_config_info\{block_size="(\d+)",num_gpu_blocks="(\d+)",model_name="[^"]*"\} 1$',
                 cc[0] if cc else "")
    check("/metrics: kiln_cache_config_info{block_size,num_gpu_blocks} 1", m and int(m.group(1)) > 0
          and int(m.group(2)) > 0, cc)
    for name in ("kiln_num_requests_waiting", "kiln_num_requests_running", "kiln_kv_cache_usage_perc"):
        v = [float(l.rsplit(" ", 1)[1]) for l in samples if l.startswith(name + "{")]
        check("/metrics: %s, one series, in range" % name, len(v) == 1 and v[0] >= 0
              and (name != "kiln_kv_cache_usage_perc" or v[0] <= 1), v)
    reasons = set(re.findall(r'kiln_request_success_total\{finished_reason="(\w+)"', body))
    check("/metrics: kiln_request_success_total by finished_reason (stop, length only)",
          reasons == {"stop", "length"}, reasons)
    check("/metrics: answers counted (stop+length > 0), cancelled apart (> 0 after the disconnect)",
          metric("kiln_request_success_total") > 0 and metric("kiln_request_cancelled_total") > 0
          and "kiln_request_errored_total{" in body,
          (metric("kiln_request_success_total"), metric("kiln_request_cancelled_total")))
    check("/metrics: kiln_build_info{version} 1 and process_* metrics",
          re.search(r'^kiln_build_info\{version="[^"]+"\} 1$', body, re.M) is not None
          and metric("process_resident_memory_bytes") > 1e6 and metric("process_start_time_seconds") > 1.6e9
          and metric("process_cpu_seconds_total") > 0)
    check("/metrics: kiln_backend_info{backend=cpu,simd,fallback=0} 1 (a kilnd without CUDA)",
          re.search(r'^kiln_backend_info\{backend="cpu",simd="(scalar|avx2|avx512)",fallback="0"\} 1$', body, re.M)
          is not None, [l for l in samples if "backend_info" in l])


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--admin-token", required=True)
    ap.add_argument("--expect", required=True)
    ap.add_argument("--served-name", required=True, help="the ini's [model] served_model_name")
    ap.add_argument("--lwip", action="store_true", help="the server is on lwIP (small send buffers)")
    A = ap.parse_args()
    exp = json.load(open(A.expect, encoding="utf-8"))
    c = client()
    model = test_models(c)
    whole = test_chat(c, model, exp)
    test_chat_stream(c, model, exp, whole)
    test_completions(c, model)
    test_top_logprobs(c, model)
    test_n_seed_stop(c, model, exp)
    test_errors(c, model)
    test_curl(model)
    test_keepalive(model)
    test_disconnect(model)
    test_fleet_metrics(model)
    test_limits_drain(model)
    if A.lwip:
        test_slow_reader(model)
    else:  # loopback's autotuned kernel send buffer takes the whole answer: nothing to pause
        print("SKIP slow reader (host sockets: the kernel buffers the whole stream; run over lwIP)")
    test_shed(model)  # last: back to auto, the ladder walks down one rung per hold time
    print("%d failed (%.1f s)" % (len(FAILED), time.monotonic() - T0))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
