#!/usr/bin/env bash
# ctl_test.sh: kilnd's control socket (net/ctl.h), as kiln-init uses it, and
# `kilnd check-config`. Host sockets, no root needed; bounded in time.
#   tests/net/ctl_test.sh KILND MODEL
set -euo pipefail
KILND=${1:?usage: ctl_test.sh KILND MODEL} MODEL=${2:?usage: ctl_test.sh KILND MODEL}
D=$(mktemp -d /tmp/kiln-ctl.XXXXXX)
PID=""
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$D"' EXIT
"$KILND" certs --dir "$D/tls" >/dev/null
printf 'user user-token-123456\nadmin admin-token-123456\n' >"$D/tokens.txt"
PORT=$((20000 + RANDOM % 20000))
ARGS=(--model "$MODEL" --set "net.listen=127.0.0.1:$PORT" --set "net.metrics_port=$((PORT + 1))"
      --set "net.cert=$D/tls/server.crt" --set "net.key=$D/tls/server.key"
      --set "net.tokens_file=$D/tokens.txt" --set engine.kv_pool_mb=64 --set engine.max_seq_len=512
      --set engine.threads=1)
fail=0
"$KILND" check-config "${ARGS[@]}" >/dev/null && echo "ok   check-config: a good config" \
  || { echo "FAIL check-config rejects a good config"; fail=1; }
msg=$("$KILND" check-config "${ARGS[@]}" --set net.tokens_file="$D/none" 2>&1 >/dev/null) && rc=0 || rc=$?
[ "$rc" -eq 1 ] && [[ $msg == *"tokens file"* ]] && echo "ok   check-config: a missing tokens file named" \
  || { echo "FAIL check-config: rc $rc, '$msg'"; fail=1; }
msg=$("$KILND" check-config "${ARGS[@]}" --model "$D/none.gguf" 2>&1 >/dev/null) && rc=0 || rc=$?
[ "$rc" -eq 1 ] && [[ $msg == *"none.gguf"* ]] && echo "ok   check-config: a missing model named" \
  || { echo "FAIL check-config: rc $rc, '$msg'"; fail=1; }

"$KILND" serve "${ARGS[@]}" --control "$D/ctl.sock" >"$D/out" 2>"$D/err" &
PID=$!
for _ in $(seq 1 100); do [ -S "$D/ctl.sock" ] && break; sleep 0.1; done
timeout 60 python3 - "$D/ctl.sock" <<'EOF' || fail=1
import socket, sys, time
fails = 0
def check(name, ok, detail=""):
    global fails
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)))
    fails += not ok
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(5)
buf = b""
def lines_until(pred, limit=5.0):
    global buf
    end, got = time.time() + limit, []
    while time.time() < end:
        while b"\n" in buf:
            l, buf = buf.split(b"\n", 1)
            got.append(l.decode())
            if pred(got[-1]):
                return got
        buf += s.recv(4096)
    return got
t0 = time.time()
got = lines_until(lambda l: l.startswith("HB 4"))
hb = [l for l in got if l.startswith("HB ")]
# the heartbeat timer starts with kilnd, so on a loaded machine HB 1 can tick before this
# client connects: HB 2..4 in order are enough
check("READY first, then heartbeats every 500 ms", got and got[0].startswith("READY ") and len(hb) >= 3
      and [int(l.split()[1]) for l in hb[-3:]] == [2, 3, 4]
      and time.time() - t0 < 3.5, got)
def cmd(c):
    s.sendall(c.encode() + b"\n")
    return [l for l in lines_until(lambda l: l == ".") if not l.startswith("HB ")][:-1]
st = cmd("status")
check("status", "ready=1" in st and "live=1" in st and any(l.startswith("model=") for l in st), st)
check("stats", cmd("stats")[0].startswith("STATS uptime_s="))
check("config get", cmd("config get engine.max_seq_len") == ["engine.max_seq_len=512"])
check("config set (live key)", cmd("config set sampling.temperature 0.5") == ["ok"] and
      cmd("config get sampling.temperature") == ["sampling.temperature=0.5"])
r = cmd("config set engine.max_batch_size 8")
check("config set (needs a restart) says so", r and r[0].startswith("later:"), r)
r = cmd("config set sampling.top_p 7")
check("config set (bad value) refused", r and r[0].startswith("error:"), r)
check("drain", cmd("drain") == ["draining=1"] and "ready=0" in cmd("status") and cmd("drain off") == ["draining=0"])
check("unknown command", cmd("bogus")[0].startswith("error:"))
# the console's debug: kilnd's DEBUG over the control socket, the same window
r = cmd("debug net")
check("debug net with the window closed: refused", r and r[0].startswith("error: 403 debug_closed"), r)
check("debug open", cmd("debug open minutes=2") == ['DEBUG window=open remaining_s=120 by="console"'])
r = cmd("debug net")
check("debug net: lines, then the end", any(l.startswith("driver=host") for l in r)
      and any(l.startswith("link lo:") for l in r), r)
r = cmd("debug gpu")
check("debug gpu", "backend=cpu" in r and "cuda_built=0" in r, r)
r = cmd("debug kmsg lines=3")
check("debug kmsg lines=3", r and r[0].startswith("# the last ") and len(r) <= 4, r)
r = cmd("debug kmsg lines=400")
check("debug kmsg lines=400: answered whole or cut, the socket kept", r and r[0].startswith("# the last ")
      and cmd("debug")[0].startswith("DEBUG window=open"), r[:2])
r = cmd("debug kmsg lines=x")
check("debug kmsg lines=x: refused", r and r[0].startswith("error: 400"), r)
lis = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lis.bind(("127.0.0.1", 0))
lis.listen(1)
r = cmd("debug probe host=127.0.0.1 port=%d" % lis.getsockname()[1])
check("debug probe: its answer, then the end", len(r) == 1 and " result=connected ms=" in r[0], r)
lis.close()
check("debug close", cmd("debug close") == ["DEBUG window=closed"])
check("restart", cmd("restart") == ["restarting"])
sys.exit(1 if fails else 0)
EOF
st=0
for _ in $(seq 1 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
wait "$PID" || st=$?
PID=""
[ "$st" -eq 75 ] && echo "ok   restart: kilnd exited 75" || { echo "FAIL restart: exit $st"; fail=1; }
[ ! -e "$D/ctl.sock" ] && echo "ok   the socket file is removed" || { echo "FAIL socket file left"; fail=1; }
exit $fail
