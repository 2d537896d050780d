#!/usr/bin/env bash
# echo.sh BUILD_DIR: the transport test (root: it makes network namespaces).
#
# Runs BUILD_DIR/gnu/tests/net/net_echo, each time in network namespaces of its own:
#   1. host   kernel TCP on 127.0.0.1
#   2. tap    lwIP on a TAP device (kernel side 10.77.0.1/24, lwIP 10.77.0.2/24)
#   3. packet lwIP over AF_PACKET on one end of a veth pair (no kernel address there),
#             the other end 10.78.0.1/24 in a second namespace with its offloads left ON
#             (partial checksums and TSO-sized frames reach lwIP)
# and checks with a Python client (standard library only): ping (the lwIP cases), 1 MiB
# of random bytes echoed intact, 64 concurrent connections each echoing 64 KiB intact;
# also max_conns (one connection over the limit is closed at once), peer resets, and
# net_close delivering a 1 MiB answer in full while the peer's input stays unread; for
# lwIP also IPv6 link-local (ping and echo), and over TAP an address from DHCP (a tiny
# DHCP server here). The server must survive it all and end with no connection open
# (and, under ASan, no leak).
# Then the outgoing connect probe (net_probe, net.h) over host sockets and over lwIP on
# TAP: BUILD_DIR/gnu/tests/net/net_probe and its ASan build (BUILD_DIR/asan/..., a SKIP
# line when it is not built) against a port that listens, a closed one, an address that
# never answers, one without a route, bad arguments, cancels, NET_PROBES_MAX + 1 at once,
# and net_free with probes in flight. What each driver gives:
#   host  listening: connected; closed: ECONNREFUSED; a neighbour that takes the SYN and
#         never answers: ETIMEDOUT at the timeout; an "unreachable" route: EHOSTUNREACH
#         at once; an on-link address nobody answers ARP for: EHOSTUNREACH after the
#         kernel's ~3 s of ARP (ETIMEDOUT with a shorter timeout); no route: ENETUNREACH
#   lwIP  listening: connected; closed: ECONNREFUSED; an on-link address nobody answers
#         ARP for: EHOSTUNREACH at the timeout; beyond the gateway, nobody answers:
#         ETIMEDOUT at the timeout; off the subnet without a gateway, or no address yet
#         (DHCP): ENETUNREACH at once
# Every command is bounded in time; namespaces and processes go away on exit, whatever
# happens. Exit 0 only when everything passed; what failed is printed.
set -uo pipefail

BUILD=${1:?usage: tests/net/echo.sh BUILD_DIR}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
BIN=$BUILD/gnu/tests/net/net_echo
PROBE=$BUILD/gnu/tests/net/net_probe PROBE_ASAN=$BUILD/asan/tests/net/net_probe
PORT=7007
MAXC=80 # the server's max_conns: above the 64 of the concurrency check

[ "$(id -u)" = 0 ] || { echo "echo.sh: must run as root (network namespaces)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "echo.sh: $BIN missing (make $BIN)" >&2; exit 1; }
[ -x "$PROBE" ] || { echo "echo.sh: $PROBE missing (make $PROBE)" >&2; exit 1; }
"$ROOT/scripts/need.sh" ip iproute2 ping iputils-ping python3 python3 timeout coreutils || exit 1

TMP=$(mktemp -d /tmp/kiln-echo.XXXXXX)
NS_H=kiln-h$$ NS_T=kiln-t$$ NS_A=kiln-a$$ NS_B=kiln-b$$
SERVER_PID= DHCPD_PID= LISTEN_PID= DNSD_PID=
failed=()

cleanup() {
  local ns p
  for p in $SERVER_PID $DHCPD_PID $LISTEN_PID $DNSD_PID; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  for ns in "$NS_H" "$NS_T" "$NS_A" "$NS_B"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "echo.sh: interrupted" >&2; exit 130' INT TERM HUP

cat >"$TMP/client.py" <<'EOF'
"""Clients for net_echo (standard library only). Modes:
  echo HOST PORT N SIZE   N connections at once, each sends SIZE random bytes then EOF,
                          and must get exactly those bytes back, then the server's EOF
  greet HOST PORT SIZE    (net_echo --greet SIZE) keeps sending, and the server never
                          reads: its SIZE bytes and a clean EOF must still arrive
  limit HOST PORT MAX     MAX connections are served at once, one more is closed at
                          once, and once they are closed a new one is served again
  reset HOST PORT         connections reset by the client mid-transfer, then an echo"""
import os, selectors, socket, struct, sys, time

DEADLINE = time.monotonic() + 60

def fail(msg):
    sys.exit(msg)

def echo(host, port, nconn, size):
    sel = selectors.DefaultSelector()
    conns = []
    for _ in range(nconn):
        s = socket.create_connection((host, port), timeout=10)
        s.setblocking(False)
        c = {"s": s, "out": os.urandom(size), "sent": 0, "back": bytearray()}
        conns.append(c)
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
    live = nconn
    while live:
        if time.monotonic() > DEADLINE:
            got = sum(len(c["back"]) for c in conns)
            fail(f"timeout: {got} of {nconn * size} bytes back, {live} conns open")
        for key, ev in sel.select(timeout=1):
            c = key.data
            s = c["s"]
            if ev & selectors.EVENT_WRITE and c["sent"] < size:
                try:
                    c["sent"] += s.send(c["out"][c["sent"]:c["sent"] + 262144])
                except BlockingIOError:
                    pass
                if c["sent"] == size:
                    s.shutdown(socket.SHUT_WR)
                    sel.modify(s, selectors.EVENT_READ, c)
            if ev & selectors.EVENT_READ:
                try:
                    b = s.recv(262144)
                except BlockingIOError:
                    continue
                except ConnectionError as e:
                    fail(f"connection error after {len(c['back'])} bytes back: {e}")
                if b:
                    c["back"] += b
                    if len(c["back"]) > size:
                        fail("more bytes back than sent")
                else:
                    if c["sent"] < size:
                        fail(f"server closed early: {c['sent']} of {size} sent")
                    sel.unregister(s)
                    s.close()
                    live -= 1
    bad = [i for i, c in enumerate(conns) if bytes(c["back"]) != c["out"]]
    if bad:
        c = conns[bad[0]]
        fail(f"{len(bad)} of {nconn} connections echoed wrong data "
             f"(first: {len(c['back'])} of {size} bytes)")
    return f"{nconn} x {size} bytes echoed"

def greet(host, port, size):
    want = bytes(i % 251 for i in range(size))
    s = socket.socket()
    # A small receive window keeps most of the answer queued on the server's side.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    s.settimeout(10)
    s.connect((host, port))
    s.setblocking(False)
    junk = os.urandom(65536)
    back = bytearray()
    sent = 0
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    # Stop reading for a while near the end: our receive window fills, so the server
    # closes with the rest of its answer still queued unsent, which a close that resets
    # would lose.
    paused = 0
    while True:
        if time.monotonic() > DEADLINE:
            fail(f"timeout: {len(back)} of {size} bytes")
        if not paused and len(back) >= size - 200000:
            paused = time.monotonic() + 0.5
            sel.modify(s, selectors.EVENT_WRITE)
        elif paused > 1 and time.monotonic() > paused:
            paused = 1
            sel.modify(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        for _, ev in sel.select(timeout=0.1):
            if ev & selectors.EVENT_WRITE:
                try:
                    sent += s.send(junk)  # never read by the server
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass
            if ev & selectors.EVENT_READ:
                try:
                    b = s.recv(262144)
                except BlockingIOError:
                    continue
                except ConnectionError as e:
                    fail(f"reset after {len(back)} of {size} bytes: {e}")
                if not b:
                    s.close()
                    if bytes(back) != want:
                        fail(f"got {len(back)} bytes, not the {size} expected")
                    return f"{size} bytes and EOF while {sent} bytes went unread"
                back += b

def roundtrip(s, data):
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        b = s.recv(65536)
        if not b:
            break
        got += b
    return got

def limit(host, port, nmax):
    held = []
    for i in range(nmax):
        s = socket.create_connection((host, port), timeout=5)
        if roundtrip(s, b"x") != b"x":
            fail(f"connection {i + 1} of {nmax} not served")
        held.append(s)
    try:
        extra = None
        extra = socket.create_connection((host, port), timeout=5)
        extra.sendall(b"y")
        got = extra.recv(1)
        how = "EOF"
    except ConnectionError as e:
        got, how = b"", type(e).__name__
    except socket.timeout:
        fail(f"connection {nmax + 1} was left open")
    if got != b"":
        fail(f"connection {nmax + 1} was served: {got!r}")
    if extra:
        extra.close()
    for s in held:
        s.close()
    t = time.monotonic() + 5
    while True:  # the server needs a moment to see the closes
        try:
            s = socket.create_connection((host, port), timeout=2)
            ok = roundtrip(s, b"z") == b"z"
            s.close()
            if ok:
                break
        except (ConnectionError, socket.timeout):
            pass
        if time.monotonic() > t:
            fail("no connection served after the others were closed")
        time.sleep(0.1)
    return f"{nmax} served at once, one more closed at once ({how})"

def reset(host, port):
    for _ in range(10):
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(os.urandom(100000))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST, with the echo still in flight
    time.sleep(0.2)
    return "10 resets, then " + echo(host, port, 1, 65536)

if __name__ == "__main__":
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    args = [int(x) for x in sys.argv[4:]]
    print({"echo": echo, "greet": greet, "limit": limit, "reset": reset}[mode](host, port, *args))
EOF

cat >"$TMP/dhcpd.py" <<'EOF'
"""dhcpd.py IFACE SERVER-IP OFFER-IP: offers one address (/24, router SERVER-IP) to
whoever asks on IFACE; enough for lwIP's DHCP client."""
import socket, struct, sys
iface, server, offer = sys.argv[1:4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
s.setsockopt(socket.SOL_SOCKET, 25, iface.encode() + b"\0")  # SO_BINDTODEVICE
s.bind(("0.0.0.0", 67))
print("ready", flush=True)
while True:
    data, _ = s.recvfrom(2048)
    if len(data) < 240 or data[0] != 1:
        continue
    opts, i, mtype = data[240:], 0, None
    while i + 1 < len(opts) and opts[i] != 255:
        if opts[i] == 0:
            i += 1
            continue
        if opts[i] == 53:
            mtype = opts[i + 2]
        i += 2 + opts[i + 1]
    reply = {1: 2, 3: 5}.get(mtype)  # DISCOVER -> OFFER, REQUEST -> ACK
    if not reply:
        continue
    pkt = bytearray(240)
    pkt[0:4] = bytes([2, 1, 6, 0])
    pkt[4:8] = data[4:8]  # xid
    pkt[10:12] = data[10:12]  # flags
    pkt[16:20] = socket.inet_aton(offer)
    pkt[20:24] = socket.inet_aton(server)
    pkt[28:44] = data[28:44]  # chaddr
    pkt[236:240] = b"\x63\x82\x53\x63"
    pkt += bytes([53, 1, reply, 54, 4]) + socket.inet_aton(server)
    pkt += bytes([51, 4]) + struct.pack("!I", 3600)
    pkt += bytes([1, 4]) + socket.inet_aton("255.255.255.0")
    pkt += bytes([3, 4]) + socket.inet_aton(server)
    pkt += bytes([6, 4]) + socket.inet_aton(server) + bytes([255])  # DNS server: itself
    s.sendto(pkt, ("255.255.255.255", 68))
EOF

cat >"$TMP/dnsd.py" <<'EOF'
"""dnsd.py ADDR NAME=IP...: a DNS server on ADDR:53 for lwIP's resolver: an A record
for each NAME, NXDOMAIN for any other name, and no answer at all for names starting
with "silent." (a server that does not answer)."""
import socket, struct, sys
addr, table = sys.argv[1], dict(a.split("=") for a in sys.argv[2:])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, 53))
print("ready", flush=True)
while True:
    q, peer = s.recvfrom(512)
    if len(q) < 12:
        continue
    i, labels = 12, []
    while i < len(q) and q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode("ascii", "replace"))
        i += 1 + q[i]
    name, end = ".".join(labels).lower(), i + 5  # the zero label, QTYPE, QCLASS
    print("query", name, flush=True)
    if name.startswith("silent."):
        continue
    ip = table.get(name)
    flags = 0x8180 if ip else 0x8183  # a response, recursion: NOERROR or NXDOMAIN
    r = q[:2] + struct.pack("!HHHHH", flags, 1, 1 if ip else 0, 0, 0) + q[12:end]
    if ip:
        r += struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(ip)
    s.sendto(r, peer)
EOF

cat >"$TMP/listen.py" <<'EOF'
"""listen.py HOST PORT: accepts connections and closes them (the probes' open port)."""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
print("ready", flush=True)
while True:
    s.accept()[0].close()
EOF

# link_local MAC: the IPv6 link-local address derived from MAC (modified EUI-64).
link_local() {
  python3 -c 'import sys; m = [int(x, 16) for x in sys.argv[1].split(":")]; m[0] ^= 2
e = m[:3] + [0xff, 0xfe] + m[3:]
print("fe80::" + ":".join("%x" % (e[i] << 8 | e[i + 1]) for i in range(0, 8, 2)))' "$1"
}

# check NAME CMD...: one check; a failure is recorded with the command's output.
check() {
  local name=$1; shift
  local out
  if out=$("$@" 2>&1); then
    printf 'ok   %-18s %s\n' "$name" "${out##*$'\n'}"
  else
    printf 'FAIL %-18s %s\n' "$name" "${out//$'\n'/$'\n'     | }"
    failed+=("$name")
  fi
}

# setup NAME CMD...: a setup step; on failure the case is skipped.
setup() {
  local name=$1; shift
  local out
  out=$(timeout 20 "$@" 2>&1) && return 0
  printf 'FAIL %s/setup: %s: %s\n' "$name" "$*" "$out"
  failed+=("$name/setup")
  return 1
}

# start_server NAME NS ARGS...: net_echo in namespace NS; waits for its "listening" line
# (left in LISTENING).
start_server() {
  local name=$1 ns=$2; shift 2
  LISTENING=
  local log=$TMP/$name.log
  # --foreground: a TERM for timeout goes to net_echo alone, not to its process group
  # (where it would also kill the leak checker's helper at exit and hang net_echo).
  timeout --foreground -s TERM 300 ip netns exec "$ns" "$BIN" "$@" --port "$PORT" --max-conns "$MAXC" \
    >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 100); do
    if grep -q '^listening ' "$log"; then
      LISTENING=$(grep -m1 '^listening ' "$log")
      printf '     %-18s %s\n' "$name" "$LISTENING"
      return 0
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  printf 'FAIL %-18s server not ready; its output:\n' "$name/start"
  sed 's/^/     | /' "$log"
  failed+=("$name/start")
  stop_server "$name" quiet
  return 1
}

# stop_server NAME [quiet]: SIGTERM; the server must have lived through the checks, and
# end with no connection open and no sanitizer report.
stop_server() {
  local name=$1 log=$TMP/$1.log st
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    wait "$SERVER_PID" 2>/dev/null
    st=$?
    SERVER_PID=
    [ "${2:-}" = quiet ] && return
    printf 'FAIL %-18s exited during the checks (status %s); its output:\n' "$name/server" "$st"
    sed 's/^/     | /' "$log" | head -n 60
    failed+=("$name/server")
    return
  fi
  sleep 0.5 # the last clients' FINs are on their way
  kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  st=$?
  SERVER_PID=
  [ "${2:-}" = quiet ] && return
  if [ "$st" != 0 ] || ! grep -q '^exit open_conns=0$' "$log" ||
     grep -qE 'ERROR: |runtime error|Assertion' "$log"; then
    printf 'FAIL %-18s status %s at exit; its output:\n' "$name/server" "$st"
    sed 's/^/     | /' "$log" | head -n 60
    failed+=("$name/server")
  else
    printf 'ok   %-18s %s\n' "$name/server" "$(grep '^exit ' "$log")$(grep -m1 warning "$log" |
      sed 's/^/, /')"
  fi
}

# probes NAME NS ARGS...: net_probe ARGS in namespace NS, then its ASan build; every
# line it printed is shown.
probes() {
  local name=$1 ns=$2; shift 2
  local bin tag out st
  for bin in "$PROBE" "$PROBE_ASAN"; do
    tag=$name/probe; [ "$bin" = "$PROBE" ] || tag=$name/probe-asan
    if [ ! -x "$bin" ]; then
      echo "SKIP $tag: $bin missing (make $bin)"
      continue
    fi
    out=$(timeout 90 ip netns exec "$ns" "$bin" "$@" 2>&1)
    st=$?
    if [ $st = 0 ] && ! grep -qE 'ERROR: |runtime error|Assertion' <<<"$out"; then
      printf 'ok   %-18s %s\n' "$tag" "${out##*$'\n'}"
    else
      printf 'FAIL %-18s status %s\n' "$tag" "$st"
      failed+=("$tag")
    fi
    sed 's/^/     | /' <<<"$out"
  done
}

# ping6 NS ADDR: a few tries: lwIP's link-local address is tentative for a second (DAD).
ping6() {
  local ns=$1 addr=$2 i
  for i in 1 2 3 4 5; do
    timeout 5 ip netns exec "$ns" ping -6 -c 1 -W 1 "$addr" && return 0
  done
  return 1
}

# checks NAME SERVER-NS CLIENT-NS ADDR SERVER-ARGS...: the whole battery against one
# transport; the server runs in SERVER-NS, the clients in CLIENT-NS talk to ADDR; with
# V6 set (an IPv6 address with its %scope), over IPv6 too.
checks() {
  local name=$1 sns=$2 ns=$3 addr=$4; shift 4
  local c="timeout 90 ip netns exec $ns python3 $TMP/client.py"
  start_server "$name" "$sns" "$@" || return
  case $name in host) ;; *) check "$name/ping" timeout 10 ip netns exec "$ns" ping -c 1 -W 2 "$addr" ;; esac
  check "$name/1MiB" $c echo "$addr" "$PORT" 1 1048576
  check "$name/64x64KiB" $c echo "$addr" "$PORT" 64 65536
  check "$name/max_conns" $c limit "$addr" "$PORT" "$MAXC"
  check "$name/reset" $c reset "$addr" "$PORT"
  if [ -n "${V6:-}" ]; then
    check "$name/ipv6-ping" ping6 "$ns" "$V6"
    check "$name/ipv6-echo" $c echo "$V6" "$PORT" 4 65536
  fi
  stop_server "$name"
  start_server "$name-close" "$sns" "$@" --greet 1048576 || return
  check "$name/close" $c greet "$addr" "$PORT" 1048576
  stop_server "$name-close"
}

# ---------------------------------------------------------------- 1. host
echo "== host transport (kernel TCP, 127.0.0.1)"
if setup host ip netns add "$NS_H" && setup host ip -n "$NS_H" link set lo up; then
  checks host "$NS_H" "$NS_H" 127.0.0.1 --driver host --address 127.0.0.1
  # A TAP device nobody reads (no carrier: what is sent there is lost): 10.79.0.2 has a
  # fixed neighbour entry, so its SYNs go out and nothing answers; 10.79.0.3 has none,
  # so ARP fails. 10.80.0.0/24 is an "unreachable" route; 10.99.0.0/24 has none.
  if setup host-probe ip -n "$NS_H" tuntap add dev kp0 mode tap &&
     setup host-probe ip -n "$NS_H" addr add 10.79.0.1/24 dev kp0 &&
     setup host-probe ip -n "$NS_H" link set kp0 up &&
     setup host-probe ip -n "$NS_H" neigh add 10.79.0.2 lladdr 02:00:00:00:79:02 dev kp0 nud permanent &&
     setup host-probe ip -n "$NS_H" route add unreachable 10.80.0.0/24; then
    probes host "$NS_H" --driver host --listen 7009 --open 127.0.0.1:7009 --silent 10.79.0.2:80 \
      --expect 127.0.0.1:7010:2000:ECONNREFUSED --expect 10.79.0.2:80:700:ETIMEDOUT \
      --expect 10.80.0.1:80:2000:EHOSTUNREACH --expect 10.99.0.1:80:2000:ENETUNREACH \
      --expect 10.79.0.3:80:6000:EHOSTUNREACH \
      --resolve localhost:3000:127.0.0.1 --resolve no-such-name.invalid:3000:ENOENT/EAGAIN/ETIMEDOUT
  fi
fi

# ---------------------------------------------------------------- 2. lwIP over TAP
echo "== lwIP over TAP"
if setup tap ip netns add "$NS_T" && setup tap ip -n "$NS_T" link set lo up &&
   setup tap ip -n "$NS_T" tuntap add dev ktap0 mode tap &&
   setup tap ip -n "$NS_T" addr add 10.77.0.1/24 dev ktap0 &&
   setup tap ip -n "$NS_T" link set ktap0 up; then
  # a fixed MAC (instead of a random one) gives a known link-local address
  V6=$(link_local 02:00:00:00:77:02)%ktap0 checks tap "$NS_T" "$NS_T" 10.77.0.2 \
    --driver tap --ifname ktap0 --address 10.77.0.2/24 --mac 02:00:00:00:77:02
  timeout 60 ip netns exec "$NS_T" python3 "$TMP/dhcpd.py" ktap0 10.77.0.1 10.77.0.50 \
    >"$TMP/dhcpd.log" 2>&1 &
  DHCPD_PID=$!
  for _ in $(seq 50); do grep -q ready "$TMP/dhcpd.log" && break; sleep 0.1; done
  if start_server tap-dhcp "$NS_T" --driver tap --ifname ktap0 --address dhcp; then
    check tap/dhcp-address grep -x "listening 10.77.0.50:$PORT" "$TMP/tap-dhcp.log"
    check tap/dhcp-echo timeout 90 ip netns exec "$NS_T" python3 "$TMP/client.py" echo \
      10.77.0.50 "$PORT" 4 65536
    stop_server tap-dhcp
  fi
  kill "$DHCPD_PID" 2>/dev/null
  wait "$DHCPD_PID" 2>/dev/null
  DHCPD_PID=
  # Probes from lwIP: the kernel's end (10.77.0.1) listens on 7008 and refuses 7010;
  # nobody answers ARP for 10.77.0.9; beyond the gateway (the kernel, which does not
  # forward) nobody answers at all; without a gateway there is no route.
  timeout 120 ip netns exec "$NS_T" python3 "$TMP/listen.py" 10.77.0.1 7008 >"$TMP/listen.log" 2>&1 &
  LISTEN_PID=$!
  for _ in $(seq 50); do grep -q ready "$TMP/listen.log" && break; sleep 0.1; done
  # lwIP's DNS client against dnsd.py on the kernel's end: a name, NXDOMAIN, a server
  # that never answers; with no server configured, no lookup at all; with DHCP, the
  # server DHCP offers.
  timeout 120 ip netns exec "$NS_T" python3 "$TMP/dnsd.py" 10.77.0.1 box.kiln.test=10.77.0.1 \
    >"$TMP/dnsd.log" 2>&1 &
  DNSD_PID=$!
  for _ in $(seq 50); do grep -q ready "$TMP/dnsd.log" && break; sleep 0.1; done
  probes tap "$NS_T" --driver tap --ifname ktap0 --address 10.77.0.2/24 --gateway 10.77.0.1 \
    --open 10.77.0.1:7008 --silent 10.99.0.1:80 --einval 10.77.0.255 \
    --expect 10.77.0.1:7010:2000:ECONNREFUSED --expect 10.77.0.9:80:700:EHOSTUNREACH~ \
    --expect 10.99.0.1:80:700:ETIMEDOUT --dns 10.77.0.1 \
    --resolve box.kiln.test:3000:10.77.0.1 --resolve nope.kiln.test:3000:ENOENT \
    --resolve silent.kiln.test:700:ETIMEDOUT --resolve 10.77.0.5:700:10.77.0.5
  probes tap-nogw "$NS_T" --driver tap --ifname ktap0 --address 10.77.0.2/24 \
    --expect 10.99.0.1:80:700:ENETUNREACH --resolve box.kiln.test:700:ENETUNREACH
  timeout 60 ip netns exec "$NS_T" python3 "$TMP/dhcpd.py" ktap0 10.77.0.1 10.77.0.50 \
    >"$TMP/dhcpd-dns.log" 2>&1 &
  DHCPD_PID=$!
  for _ in $(seq 50); do grep -q ready "$TMP/dhcpd-dns.log" && break; sleep 0.1; done
  probes tap-dhcp-dns "$NS_T" --driver tap --ifname ktap0 --address dhcp --wait-address 10000 \
    --resolve box.kiln.test:3000:10.77.0.1
  kill "$DHCPD_PID" "$DNSD_PID" 2>/dev/null
  wait "$DHCPD_PID" "$DNSD_PID" 2>/dev/null
  DHCPD_PID= DNSD_PID=
  # DHCP with no server: no address yet, so no route even on the kernel's subnet
  probes tap-noaddr "$NS_T" --driver tap --ifname ktap0 --address dhcp \
    --expect 10.77.0.1:7008:700:ENETUNREACH
  kill "$LISTEN_PID" 2>/dev/null
  wait "$LISTEN_PID" 2>/dev/null
  LISTEN_PID=
fi

# ---------------------------------------------------------------- 3. lwIP over AF_PACKET
echo "== lwIP over AF_PACKET (veth, peer offloads on)"
# B's kernel keeps no address on kvb0: IPv6 off there, or it would claim the link-local
# address lwIP derives from the same MAC.
if setup packet ip netns add "$NS_A" && setup packet ip netns add "$NS_B" &&
   setup packet ip -n "$NS_A" link set lo up &&
   setup packet ip -n "$NS_A" link add kva0 type veth peer name kvb0 netns "$NS_B" &&
   setup packet ip netns exec "$NS_B" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/kvb0/disable_ipv6' &&
   setup packet ip -n "$NS_A" addr add 10.78.0.1/24 dev kva0 &&
   setup packet ip -n "$NS_A" link set kva0 up &&
   setup packet ip -n "$NS_B" link set kvb0 up; then
  if command -v ethtool >/dev/null; then
    printf '     %-18s %s\n' "peer offloads" "$(timeout 5 ip netns exec "$NS_A" ethtool -k kva0 2>/dev/null |
      grep -E '^(tx-checksumming|tcp-segmentation-offload):' | tr -s ' \n' ' ')"
  fi
  mac=$(timeout 5 ip netns exec "$NS_B" cat /sys/class/net/kvb0/address)
  V6=$(link_local "$mac")%kva0 checks packet "$NS_B" "$NS_A" 10.78.0.2 \
    --driver packet --ifname kvb0 --address 10.78.0.2/24
fi

echo
if [ ${#failed[@]} -eq 0 ]; then
  echo "echo.sh: all passed"
  exit 0
fi
echo "echo.sh: FAILED: ${failed[*]}"
exit 1
