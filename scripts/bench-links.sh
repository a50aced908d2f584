#!/usr/bin/env bash
# Throughput of a kernel client (curl) downloading one file over three paths, in one run:
#   1. flowstack serve http over a TAP            (kernel curl <- flowstack), with and without
#      the vnet header (segmentation/checksum offload)
#   2. flowstack serve http over AF_PACKET (veth) (kernel curl <- flowstack)
#   3. a kernel HTTP server over a veth pair      (kernel curl <- kernel, sendfile)
# Everything runs inside network namespaces this script creates and removes; the addresses
# (10.77.0.0/24, 10.78.0.0/24, 10.79.0.0/24) exist only there. Needs root, curl, python3.
# Usage: scripts/bench-links.sh [SIZE_MB=200] [RUNS=5]
set -euo pipefail
SIZE_MB=${1:-200}
RUNS=${2:-5}
BIN=${FLOWSTACK:-$(dirname "$0")/../target/release/flowstack}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
NS=fsbench$$
NS2=fsbench$$k
WORK=$(mktemp -d)
cleanup() {
  for p in $(ip netns pids $NS 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  for p in $(ip netns pids $NS2 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  ip netns del $NS 2>/dev/null || true
  ip netns del $NS2 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/www"
head -c $((SIZE_MB * 1024 * 1024)) /dev/urandom > "$WORK/www/f.bin"
ip netns add $NS
X="ip netns exec $NS"
$X ip link set lo up
$X ip tuntap add dev fst0 mode tap
$X ip addr add 10.77.0.1/24 dev fst0
$X ip link set fst0 up
$X ip link add fsk0 type veth peer name fsf0
$X ip addr add 10.78.0.1/24 dev fsk0
$X ip link set fsk0 up
$X ip link set fsf0 up
$X sysctl -q -w net.ipv6.conf.fsf0.disable_ipv6=1
# Kernel baseline: server in a second namespace, so traffic really crosses the veth pair.
ip netns add $NS2
K="ip netns exec $NS2"
$K ip link set lo up
$X ip link add kk0 type veth peer name kk1 netns $NS2
$K ip addr add 10.79.0.1/24 dev kk1
$X ip addr add 10.79.0.2/24 dev kk0
$X ip link set kk0 up
$K ip link set kk1 up

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

measure() { # URL -> prints MB/s of each run
  for _ in $(seq "$RUNS"); do
    $X curl -s -o /dev/null -w '%{speed_download}\n' "$1" | awk '{printf "%.1f\n", $1/1e6}'
  done
}

wait_up() { for _ in $(seq 100); do $X curl -s -o /dev/null "$1" && return 0; sleep 0.1; done; return 1; }

run_flowstack() { # LINK... -> MB/s list
  $X "$BIN" serve "$@" http --root "$WORK/www" --port 80 > "$WORK/serve.log" 2>&1 &
  local pid=$!
  wait_up "http://$SRV/f.bin"
  measure "http://$SRV/f.bin"
  kill -INT $pid; wait $pid || true
}

SRV=10.77.0.2 ; tap=$(run_flowstack --tap fst0 --ip 10.77.0.2/24)
SRV=10.77.0.2 ; tapnv=$(run_flowstack --tap fst0 --no-vnet --ip 10.77.0.2/24)
SRV=10.78.0.2 ; pkt=$(run_flowstack --packet fsf0 --ip 10.78.0.2/24)
cat > "$WORK/srv.py" <<'PY'
import http.server, os, sys
class H(http.server.SimpleHTTPRequestHandler):
    def copyfile(self, src, dst):
        dst.flush()
        self.connection.sendfile(src)
os.chdir(sys.argv[1])
http.server.ThreadingHTTPServer(("10.79.0.1", 8000), H).serve_forever()
PY
$K python3 "$WORK/srv.py" "$WORK/www" > /dev/null 2>&1 &
wait_up http://10.79.0.1:8000/f.bin
ker=$(for _ in $(seq "$RUNS"); do $X curl -s -o /dev/null -w '%{speed_download}\n' http://10.79.0.1:8000/f.bin | awk '{printf "%.1f\n", $1/1e6}'; done)

t=$(echo "$tap" | median); tn=$(echo "$tapnv" | median); p=$(echo "$pkt" | median); k=$(echo "$ker" | median)
echo "file ${SIZE_MB} MiB, ${RUNS} runs each, median MB/s (all runs)"
echo "kernel curl <- flowstack over TAP:        $t   ($(echo $tap | tr '\n' ' '))"
echo "  same, TAP without vnet header (--no-vnet): $tn   ($(echo $tapnv | tr '\n' ' '))"
echo "kernel curl <- flowstack over AF_PACKET:  $p   ($(echo $pkt | tr '\n' ' '))"
echo "kernel curl <- kernel over veth:          $k   ($(echo $ker | tr '\n' ' '))"
awk -v t="$t" -v p="$p" -v k="$k" 'BEGIN {printf "ratio flowstack/kernel: TAP %.2f, AF_PACKET %.2f\n", t/k, p/k}'
