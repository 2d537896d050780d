"""fleet_client.py: the load and the checks of tests/net/fleet_test.sh.

Three kilnd boxes (box0..box2) behind HAProxy: HTTP mode (the OpenAI API, a server per
request, header X-Kiln-Box naming it) and TCP mode (the line protocol). Phases:
  1. balance: sequential OpenAI requests over one keep-alive client reach all three
     boxes, and each box's /metrics counts exactly the answers it gave; one Python
     AsyncClient with connections_per_host=4 through the TCP frontend reaches two boxes
     or more, and so does one `kiln bench` client with --connections-per-host 4;
  2. failures under load: OpenAI threads (streaming and not) and `kiln bench` through
     the TCP frontend; box0 gets SIGKILL, box1 an admin DRAIN. HAProxy must mark each
     DOWN within its check interval (fall x inter, plus one interval of slack); every
     request ends in an answer or a clean error within its timeout; what box2 served is
     untouched (no cancelled or errored sample there);
  3. the survivor alone: OpenAI requests and a bench run, counted exactly on its /metrics.
Prints `ok   ...` / `FAIL ...` lines; exit 1 on any failure.
"""
import argparse
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request

import openai

A = None
FAILED = []
T0 = time.monotonic()


def check(name, ok, detail=""):
    print("%s %s%s" % ("ok  " if ok else "FAIL", name, "" if ok else ": %s" % (detail,)), flush=True)
    if not ok:
        FAILED.append(name)


def metrics(i):
    """Box i's /metrics as {name{labels but model_name}: value}."""
    url = "http://127.0.0.1:%d/metrics" % (A.base_port + 2 * i + 1)
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for l in body.splitlines():
        if l and not l.startswith("#"):
            k, _, v = l.rpartition(" ")
            k = re.sub(r',?model_name="(?:[^"\\]|\\.)*"', "", k).replace("{}", "").replace("{,", "{")
            out[k] = float(v)
    return out


def successes(m):
    return sum(v for k, v in m.items() if k.startswith("kiln_request_success_total{"))


def haproxy_status():
    """{(backend, server): status} from HAProxy's stats socket."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(os.path.join(A.dir, "haproxy.sock"))
    s.sendall(b"show stat\n")
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    lines = data.decode().splitlines()
    hdr = lines[0].lstrip("# ").split(",")
    st = {}
    for l in lines[1:]:
        row = dict(zip(hdr, l.split(",")))
        if row.get("svname", "").startswith("box"):
            st[(row["pxname"], row["svname"])] = row["status"]
    return st


def admin_line(i, line):
    ctx = ssl.create_default_context(cafile=A.ca)
    raw = socket.create_connection(("127.0.0.1", A.base_port + 2 * i), timeout=5)
    s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    s.sendall(("HELLO kiln/1 token=%s\n%s\n" % (A.admin_token, line)).encode())
    out = b""
    while out.count(b"\n") < 2:
        d = s.recv(4096)
        if not d:
            break
        out += d
    s.close()
    return out.decode()


def client(timeout):
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % A.http_port, api_key=A.token,
                         timeout=timeout, max_retries=0)


def one_request(c, model, k, stream, timeout):
    """One chat completion: a dict with box, ok, error, duration."""
    t = time.monotonic()
    r = {"t0": t - T0, "stream": stream, "box": None, "ok": False, "error": None}
    msgs = [{"role": "user", "content": "Say something about the number %d." % k}]
    try:
        if stream:
            raw = c.chat.completions.with_raw_response.create(model=model, messages=msgs, max_tokens=16,
                                                              stream=True, temperature=0.7)
            r["box"] = raw.headers.get("x-kiln-box")
            fin, text = None, ""
            for ch in raw.parse():
                if ch.choices:
                    text += ch.choices[0].delta.content or ""
                    fin = ch.choices[0].finish_reason or fin
            r["ok"] = fin in ("stop", "length") and len(text) > 0
            if not r["ok"]:
                r["error"] = "incomplete stream (finish_reason %r)" % fin
        else:
            raw = c.chat.completions.with_raw_response.create(model=model, messages=msgs, max_tokens=16,
                                                              temperature=0.7)
            r["box"] = raw.headers.get("x-kiln-box")
            cc = raw.parse()
            ch = cc.choices[0]
            r["ok"] = ch.finish_reason in ("stop", "length") and bool(ch.message.content)
            if not r["ok"]:
                r["error"] = "incomplete answer %r" % (cc,)
    except openai.APITimeoutError as e:
        r["error"] = "TIMEOUT %r" % e
        r["hung"] = True
    except Exception as e:  # noqa: BLE001 -- a clean error: a status, a reset, a cut stream
        r["error"] = "%s: %s" % (type(e).__name__, str(e)[:120])
        r["status"] = getattr(e, "status_code", None)
    r["dur"] = time.monotonic() - t
    r["t1"] = r["t0"] + r["dur"]
    return r


def bench(n, conc, timeout, extra=()):
    cmd = [A.kiln, "bench", "--host", "127.0.0.1:%d" % A.tcp_port, "--ca", A.ca, "--token", A.token,
           "--requests", str(n), "--concurrency", str(conc), "--max-tokens", "12", "--prompt-tokens", "16",
           "--json", "--no-progress"] + list(extra)
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"hung": True, "dur": time.monotonic() - t}
    try:
        j = json.loads(p.stdout)
    except ValueError:
        j = {"bad_output": p.stdout[-300:], "stderr": p.stderr[-300:]}
    j["rc"], j["dur"] = p.returncode, time.monotonic() - t
    return j


def wait_all_up(limit):
    t = time.monotonic()
    while time.monotonic() - t < limit:
        st = haproxy_status()
        if len(st) == 6 and all(v == "UP" for v in st.values()):
            return True
        time.sleep(0.1)
    return False


def phase_balance(model):
    m0 = [metrics(i) for i in range(3)]
    c = client(30)
    rs = [one_request(c, model, k, k % 2 == 1, 30) for k in range(9)]
    m1 = [metrics(i) for i in range(3)]
    per = {b: sum(1 for r in rs if r["ok"] and r["box"] == b) for b in ("box0", "box1", "box2")}
    check("balance: 9 OpenAI requests over one client all answered", all(r["ok"] for r in rs),
          [r["error"] for r in rs if not r["ok"]])
    check("balance: per request, every box served (HTTP mode, roundrobin)", all(v >= 2 for v in per.values()), per)
    d = [successes(m1[i]) - successes(m0[i]) for i in range(3)]
    check("balance: each box's kiln_request_success_total counts exactly its answers",
          d == [per["box0"], per["box1"], per["box2"]], (d, per))


def phase_sdk_spread():
    """One AsyncClient given only HAProxy's TCP address, connections_per_host=4: its
    connections land on several boxes (HAProxy balances connections) and its requests
    follow them (the SDK balances requests over its connections)."""
    import asyncio
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    from kiln.aio import AsyncClient  # noqa: E402  (the SDK from this tree)

    before = [successes(metrics(i)) for i in range(3)]

    async def go():
        async with AsyncClient("127.0.0.1", A.tcp_port, A.token, A.ca, connections_per_host=4,
                               backoff=0.05) as c:
            n_conns = len(c.connections)
            rs = await asyncio.gather(*(c.generate("Say %d" % k, max_tokens=4) for k in range(16)))
            return n_conns, sum(1 for r in rs if r.usage.reason in ("stop", "length"))

    try:
        n_conns, n_ok = asyncio.run(asyncio.wait_for(go(), 60))
    except Exception as e:  # noqa: BLE001
        n_conns, n_ok = 0, repr(e)
    gained = [successes(metrics(i)) - before[i] for i in range(3)]
    check("Python SDK: one AsyncClient, connections_per_host=4 through HAProxy TCP: 4 connections, 16 answers",
          n_conns == 4 and n_ok == 16, (n_conns, n_ok))
    check("Python SDK: its 16 requests reached at least 2 boxes (kiln_request_success_total %s)" % gained,
          sum(1 for g in gained if g > 0) >= 2 and sum(gained) == 16, gained)
    before = [successes(metrics(i)) for i in range(3)]
    b = bench(16, 8, 60, ["--connections", "1", "--connections-per-host", "4"])
    gained = [successes(metrics(i)) - before[i] for i in range(3)]
    check("C SDK: kiln bench, one client with --connections-per-host 4 through HAProxy TCP: "
          "16 of 16, on at least 2 boxes (%s)" % gained,
          b.get("completed") == 16 and sum(1 for g in gained if g > 0) >= 2 and sum(gained) == 16,
          (b, gained))


def phase_failures(model):
    m0 = [metrics(i) for i in range(3)]
    stop = threading.Event()
    res, lock = [], threading.Lock()
    timeout = 20

    def loader(w):
        c = client(timeout)
        k = 0
        # bounded by the phase's time (stop) and a count; the count must outlast the kill
        # and drain (~4.5 s in): at 40 a loader finished before both boxes were down
        while not stop.is_set() and k < 400:
            r = one_request(c, model, 100 * w + k, (w + k) % 2 == 0, timeout)
            with lock:
                res.append(r)
            k += 1

    ths = [threading.Thread(target=loader, args=(w,)) for w in range(4)]
    bres = {}
    bth = threading.Thread(target=lambda: bres.update(bench(48, 4, 60)))
    for t in ths + [bth]:
        t.start()
    down = {}
    t_kill = t_drain = None
    t_start = time.monotonic()
    while time.monotonic() - t_start < 12:
        el = time.monotonic() - t_start
        if t_kill is None and el >= 1.5:
            os.kill(A.pids[0], signal.SIGKILL)
            t_kill = time.monotonic() - T0
        if t_drain is None and el >= 3.5:
            rep = admin_line(1, "DRAIN")
            t_drain = time.monotonic() - T0
            check("DRAIN box1 answered OK draining=1", "OK draining=1" in rep, rep)
        for key, v in haproxy_status().items():
            if v.startswith("DOWN") and key not in down:
                down[key] = time.monotonic() - T0
        if len(down) >= 4 and el >= 7:
            break
        time.sleep(0.05)
    # the rest of the load: every box that is left is box2
    time.sleep(2.0)
    stop.set()
    for t in ths:
        t.join(timeout + 5)
    bth.join(70)
    m1 = [None, metrics(1), metrics(2)]

    limit = (A.fall + 1) * A.inter_ms / 1e3 + 0.5
    for be in ("kiln_http", "kiln_tcp"):
        for box, t_ev, what in (("box0", t_kill, "SIGKILL"), ("box1", t_drain, "DRAIN")):
            t_down = down.get((be, box))
            dt = None if t_down is None else round(t_down - t_ev, 2)
            check("%s: HAProxy marks %s DOWN within %.1f s of its %s (%s s)" % (be, box, limit, what, dt),
                  dt is not None and dt <= limit)
        check("%s: box2 stays UP" % be, (be, "box2") not in down, down)
    hung = [r for r in res if r.get("hung") or r["dur"] > timeout + 1]
    check("OpenAI: %d requests, none past its %d s timeout" % (len(res), timeout), res and not hung, hung[:3])
    bad = [r for r in res if not r["ok"] and not r["error"]]
    check("OpenAI: each request an answer or a clean error", not bad, bad[:3])
    n_ok = sum(r["ok"] for r in res)
    errs = [r["error"] for r in res if not r["ok"]]
    print("     OpenAI under failures: %d answered, %d clean errors %s" % (n_ok, len(errs), errs[:4]))
    check("OpenAI: most requests answered (HAProxy retries what never reached a box)", n_ok >= 0.8 * len(res),
          "%d of %d" % (n_ok, len(res)))
    t_all_down = max(down.get(("kiln_http", "box0"), 1e9), down.get(("kiln_http", "box1"), 1e9))
    late = [r for r in res if r["t0"] > t_all_down + 0.2]
    check("OpenAI: after both went DOWN, every request answered by box2 (%d)" % len(late),
          late and all(r["ok"] and r["box"] == "box2" for r in late),
          [(r["box"], r["error"]) for r in late if not (r["ok"] and r["box"] == "box2")][:3])
    on2 = [r for r in res if r["box"] == "box2"]
    check("OpenAI: the requests box2 served are untouched (%d, all answered)" % len(on2),
          on2 and all(r["ok"] for r in on2), [r["error"] for r in on2 if not r["ok"]][:3])
    for i in (1, 2):
        dc = m1[i]["kiln_request_cancelled_total"] - m0[i]["kiln_request_cancelled_total"]
        de = m1[i]["kiln_request_errored_total"] - m0[i]["kiln_request_errored_total"]
        check("box%d: no cancelled or errored sample on /metrics (%g, %g)" % (i, dc, de), dc == 0 and de == 0)
    b_ok = bres.get("completed", -1)
    check("kiln bench (TCP mode): ended in time, every request accounted for",
          not bres.get("hung") and bres.get("requests") == 48
          and b_ok + bres.get("errors", 0) + bres.get("lost", 0) == 48 and b_ok >= 24, bres)
    print("     kiln bench under failures: %s completed, %s errors %s" % (
        b_ok, bres.get("errors"), bres.get("errors_by_code")))
    # what box1 and box2 count is what the clients saw them answer: the OpenAI answers
    # tagged with them plus some of bench's (bench cannot tell which box served it)
    srv = sum(successes(m1[i]) - successes(m0[i]) for i in (1, 2))
    oai = sum(1 for r in res if r["ok"] and r["box"] in ("box1", "box2"))
    check("/metrics of box1+box2: %g answers = %d OpenAI + %g of bench's %d" % (srv, oai, srv - oai, b_ok),
          0 <= srv - oai <= b_ok, (srv, oai, b_ok))


def phase_survivor(model):
    m0 = metrics(2)
    c = client(30)
    rs = [one_request(c, model, k, k % 2 == 0, 30) for k in range(6)]
    check("survivor: 6 OpenAI requests answered by box2", all(r["ok"] and r["box"] == "box2" for r in rs),
          [(r["box"], r["error"]) for r in rs])
    b = bench(8, 2, 60)
    check("survivor: kiln bench 8 of 8 completed through the TCP frontend", b.get("completed") == 8, b)
    m1 = metrics(2)
    d = successes(m1) - successes(m0)
    check("survivor: box2's kiln_request_success_total +%g = 6 + 8" % d, d == 14)
    check("survivor: /readyz of box1 (drained) is 503, box2's 200", readyz(1) == 503 and readyz(2) == 200)


def phase_goaway():
    """box1 is draining: a line-protocol client gets GOAWAY after its HELLO and the idle
    connection closes; the Python and C SDKs given [box1, box2] move on to box2."""
    ctx = ssl.create_default_context(cafile=A.ca)
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", A.base_port + 2), timeout=5),
                        server_hostname="127.0.0.1")
    s.sendall(("HELLO kiln/1 token=%s\n" % A.token).encode())
    got = b""
    try:
        while True:
            d = s.recv(4096)
            if not d:
                break
            got += d
    except (ssl.SSLError, OSError) as e:
        got += b"<%r>" % e
    s.close()
    lines = got.decode(errors="replace").splitlines()
    check("draining box: HELLO, then GOAWAY reason=draining, then the idle connection closes",
          len(lines) == 2 and lines[0].startswith("OK kiln/1") and lines[1] == "GOAWAY reason=draining", lines)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import kiln  # noqa: E402  (the SDK from this tree)
    b1, b2 = ("127.0.0.1", A.base_port + 2), ("127.0.0.1", A.base_port + 4)
    try:
        c = kiln.Client(None, None, A.token, A.ca, hosts=[b1, b2], backoff=0.05)
        r = c.generate("Hello", max_tokens=4)
        ok, detail = bool(r.text) and c.endpoint == b2, (r.text, c.endpoint)
        c.close()
    except Exception as e:  # noqa: BLE001
        ok, detail = False, repr(e)
    check("Python SDK, hosts [box1 draining, box2]: GOAWAY moves it to box2", ok, detail)
    p = subprocess.run([A.kiln, "generate", "--host", "127.0.0.1:%d,127.0.0.1:%d" % (b1[1], b2[1]), "--ca", A.ca,
                        "--token", A.token, "--max-tokens", "4", "-v", "Hello"],
                       capture_output=True, text=True, timeout=30)
    check("C SDK (kiln generate), hosts [box1 draining, box2]: an answer, from box2",
          p.returncode == 0 and p.stdout.strip() != "", (p.returncode, p.stdout[-200:], p.stderr[-300:]))


def hello(i, token):
    ctx = ssl.create_default_context(cafile=A.ca)
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", A.base_port + 2 * i), timeout=5),
                        server_hostname="127.0.0.1")
    s.sendall(("HELLO kiln/1 token=%s\n" % token).encode())
    got = b""
    while b"\n" not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    s.close()
    return got.decode(errors="replace").strip()


def phase_ops():
    """Operating box2: its log lines carry UTC timestamps, one access line per request
    (peer, id, tokens, reason, TTFT, e2e), a refused HELLO names the peer; SIGHUP reloads
    the tokens file and [log] level (as RELOAD, without stopping kilnd)."""
    err = os.path.join(A.dir, "box2", "kilnd.err")
    log = open(err, encoding="utf-8", errors="replace").read()
    ts = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z kilnd: "
    acc = re.findall(ts + r"info: access: peer=127\.0\.0\.1:\d+ session=\d+ id=\S+ door=(http|line) n=1 "
                     r"reason=(stop|length) prompt_tokens=\d+ completion_tokens=\d+ ttft_ms=[\d.]+ e2e_ms=[\d.]+\n", log)
    doors = {d for d, _ in acc}
    check("box2's log: timestamped access lines for both doors (%d)" % len(acc), doors == {"http", "line"}, doors)
    check("a wrong token's HELLO is refused", hello(2, "wrong-token-0123456789").startswith("ERR - 401"))
    time.sleep(0.2)
    log = open(err, encoding="utf-8", errors="replace").read()
    check("the refused HELLO is logged with its peer",
          re.search(ts + r"info: session \d+: HELLO refused from 127\.0\.0\.1:\d+", log) is not None)
    new_tok = "user-reloaded-%d" % os.getpid()
    with open(os.path.join(A.dir, "box2", "tokens.txt"), "a") as f:
        f.write("user %s\n" % new_tok)
    with open(os.path.join(A.dir, "box2", "kiln.ini"), "a") as f:
        f.write("[log]\nlevel = warn\n")
    check("before SIGHUP the new token is refused", hello(2, new_tok).startswith("ERR - 401"))
    os.kill(A.pids[2], signal.SIGHUP)
    time.sleep(0.5)
    alive = True
    try:
        os.kill(A.pids[2], 0)
    except OSError:
        alive = False
    check("SIGHUP: kilnd goes on serving", alive and readyz(2) == 200)
    check("SIGHUP: the new token is taken (tokens file reloaded)", hello(2, new_tok).startswith("OK kiln/1"))
    n0 = len(re.findall("access: ", open(err, encoding="utf-8", errors="replace").read()))
    r = one_request(client(30), client(10).models.list().data[0].id, 1, False, 30)
    time.sleep(0.2)
    n1 = len(re.findall("access: ", open(err, encoding="utf-8", errors="replace").read()))
    check("SIGHUP: [log] level = warn taken (no access line for the next request)", r["ok"] and n1 == n0, (r, n0, n1))


def readyz(i):
    try:
        return urllib.request.urlopen("http://127.0.0.1:%d/readyz" % (A.base_port + 2 * i + 1), timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code


def main():
    global A
    ap = argparse.ArgumentParser()
    for k in ("--dir", "--ca", "--token", "--admin-token", "--kiln", "--pids"):
        ap.add_argument(k, required=True)
    for k in ("--base-port", "--http-port", "--tcp-port", "--inter-ms", "--fall"):
        ap.add_argument(k, type=int, required=True)
    A = ap.parse_args()
    A.pids = [int(p) for p in A.pids.split()]
    check("HAProxy: all six servers UP", wait_all_up(20), haproxy_status())
    model = client(10).models.list().data[0].id
    phase_balance(model)
    phase_sdk_spread()
    phase_failures(model)
    phase_survivor(model)
    phase_goaway()
    phase_ops()
    print("%d failed (%.1f s)" % (len(FAILED), time.monotonic() - T0))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
