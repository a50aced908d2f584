#!/usr/bin/env bash
# Does a crowd of idle connections slow everyone else down? nginx (1 worker) on loopback with
# IDLE connections held open by a python client, and `ab -n N -c 1` against it, on the kernel
# and under `flowstack run`, alternating; prints requests/s and (flowstack) the daemon's CPU
# per request, medians of RUNS.
#
# usage: scripts/bench-idle.sh [RUNS] [IDLE] [N]   (defaults 3, 2000, 5000; needs a release
#        build — cargo build --release -p flowstack-cli -p flowstack-preload — nginx, ab,
#        python3)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
IDLE=${2:-2000}
N=${3:-5000}
FS=${FLOWSTACK:-target/release/flowstack}
export FLOWSTACK_PRELOAD=${FLOWSTACK_PRELOAD:-$PWD/target/release/libflowstack_preload.so}
[ -x "$FS" ] && [ -f "$FLOWSTACK_PRELOAD" ] || {
  echo "bench-idle: build first: cargo build --release -p flowstack-cli -p flowstack-preload" >&2
  exit 2
}
for p in nginx ab python3; do
  command -v $p >/dev/null || { echo "bench-idle: $p not found" >&2; exit 2; }
done
# The daemon keeps one descriptor per socket of each side: raise the limit before it starts.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
SOCK=$TMP/fs.sock
"$FS" daemon --socket "$SOCK" >"$TMP/daemon.log" 2>&1 &
DAEMON=$!
PIDS+=("$DAEMON")
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
wrap() { if [ "$1" = flowstack ]; then echo "$FS run --socket $SOCK --"; fi; }
cat >"$TMP/idle.py" <<'PY'
import socket, sys, time
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(int(sys.argv[2]))]
print("open", len(socks), flush=True)
time.sleep(3600)
PY
port=$((20000 + RANDOM % 20000))
declare -A RES
for r in $(seq "$RUNS"); do
  for mode in kernel flowstack; do
    port=$((port + 1))
    d=$TMP/nginx-$port
    mkdir -p "$d/www"
    echo '<h1>flowstack</h1>' >"$d/www/index.html"
    cat >"$d/nginx.conf" <<CONF
daemon off; user root; master_process on; worker_processes 1; pid $d/nginx.pid;
error_log $d/error.log; events { worker_connections 16384; }
http { access_log off; client_body_temp_path $d/b; proxy_temp_path $d/p;
  fastcgi_temp_path $d/f; uwsgi_temp_path $d/u; scgi_temp_path $d/s; keepalive_timeout 3600;
  server { listen 127.0.0.1:$port; root $d/www; } }
CONF
    $(wrap $mode) nginx -c "$d/nginx.conf" -e "$d/stderr.log" >/dev/null 2>&1 &
    ng=$!
    for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
    $(wrap $mode) python3 "$TMP/idle.py" "$port" "$IDLE" >"$TMP/idle.out" 2>&1 &
    idle=$!
    for _ in $(seq 1200); do grep -q open "$TMP/idle.out" && break; sleep 0.1; done
    grep -q "open $IDLE" "$TMP/idle.out" || { echo "bench-idle: $mode: idle client failed: $(cat "$TMP/idle.out")" >&2; exit 1; }
    t0=$(awk '{print $14+$15}' /proc/$DAEMON/stat)
    out=$($(wrap $mode) ab -q -n "$N" -c 1 "http://127.0.0.1:$port/index.html" 2>&1 || true)
    t1=$(awk '{print $14+$15}' /proc/$DAEMON/stat)
    rps=$(echo "$out" | awk '/Requests per second/ {print $4}')
    echo "bench-idle: run $r $mode: $rps req/s" >&2
    RES[$mode]+="$rps "
    [ $mode = flowstack ] && RES[daemon]+="$(echo "($t1-$t0)*1000000/$(getconf CLK_TCK)/$N" | bc -l) "
    kill $idle $ng 2>/dev/null || true
    wait $idle $ng 2>/dev/null || true
  done
done
median() { tr ' ' '\n' | { grep -v '^$' || true; } | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else printf "%.1f\n", a[int((NR+1)/2)]}'; }
k=$(echo "${RES[kernel]}" | median)
f=$(echo "${RES[flowstack]}" | median)
echo "idle connections: $IDLE; ab -n $N -c 1; medians of $RUNS"
echo "kernel req/s:          $k"
echo "flowstack req/s:       $f   (ratio $(printf '%.2f' "$(echo "$f / $k" | bc -l)"))"
echo "daemon CPU us/request: $(echo "${RES[daemon]}" | median)"
