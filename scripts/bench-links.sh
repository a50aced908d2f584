#!/usr/bin/env bash
# flowstack on real links next to the kernel over a veth pair, in one run, medians of RUNS.
#
# For every link kind flowstack has here (TAP, TAP without vnet header, AF_PACKET on a veth,
# AF_XDP on a veth when the binary and the kernel allow it):
#   send  kernel curl <- flowstack serve http   vs  kernel curl <- kernel server (veth)
#   recv  flowstack get <- kernel server        vs  kernel curl <- kernel server (veth)
# and, over TAP and AF_PACKET, HTTP against `flowstack serve` next to nginx (one worker) on
# the kernel over a veth:
#   ab    ab -c32 short connections (requests/s)
#   wrk   wrk -c32 -t1 keep-alive requests (requests/s)
# Kernel and flowstack runs alternate, so both see the same load. The kernel server is nginx
# (one worker, sendfile) when installed, else python3's http.server with sendfile.
# Everything runs inside network namespaces this script creates and removes; the addresses
# (10.77.0.0/24, 10.78.0.0/24, 10.79.0.0/24) exist only there. Needs root, curl, python3;
# nginx, ab and wrk for the HTTP rows (missing tools are named and their rows skipped;
# this script installs nothing).
# Usage: scripts/bench-links.sh [--json FILE] [--only send,recv,ab,wrk]
#                               [--links tap,tap-novnet,packet,xdp] [SIZE_MB=200] [RUNS=5]
# FLOWSTACK=PATH measures another binary (e.g. a copy of the previous build, for before/after).
set -euo pipefail
JSON=
ONLY=send,recv,ab,wrk
LINKS=tap,tap-novnet,packet,xdp
while [ $# -gt 0 ]; do
  case $1 in
    --json) JSON=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --links) LINKS=$2; shift 2 ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    --*) echo "bench-links: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
SIZE_MB=${1:-200}
RUNS=${2:-5}
BIN=${FLOWSTACK:-$(dirname "$0")/../target/release/flowstack}
BIN=$(readlink -f "$BIN")
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
for t in curl python3 ip; do
  command -v $t > /dev/null || { echo "bench-links: $t is missing" >&2; exit 2; }
done
NGINX=$(command -v nginx || ls /usr/sbin/nginx 2> /dev/null || true)
missing=
[ -n "$NGINX" ] || missing="$missing nginx"
command -v ab > /dev/null || missing="$missing ab(apache2-utils)"
command -v wrk > /dev/null || missing="$missing wrk"
[ -z "$missing" ] || echo "bench-links: missing:$missing (install nginx-light apache2-utils wrk); their rows are skipped" >&2
want() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
want_link() { case ",$LINKS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

NS=fsbench$$
NS2=fsbench$$k
WORK=$(mktemp -d)
chmod 755 "$WORK"
cleanup() {
  for n in $NS $NS2; do
    for p in $(ip netns pids $n 2> /dev/null); do kill -9 "$p" 2> /dev/null || true; done
  done
  ip netns del $NS 2> /dev/null || true
  ip netns del $NS2 2> /dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/www"
chmod 755 "$WORK/www"
head -c $((SIZE_MB * 1024 * 1024)) /dev/urandom > "$WORK/www/f.bin"
head -c 1024 /dev/urandom | base64 -w 64 | head -c 1024 > "$WORK/www/small.html"
chmod 644 "$WORK/www/"*
ip netns add $NS
ip netns add $NS2
X="ip netns exec $NS"
K="ip netns exec $NS2"
$X ip link set lo up
$K ip link set lo up
# flowstack's links: a TAP (fst0) and a veth pair (fsk0 kernel side, fsf0 flowstack side).
$X ip tuntap add dev fst0 mode tap
$X ip addr add 10.77.0.1/24 dev fst0
$X ip link set fst0 up
$X ip link add fsk0 type veth peer name fsf0
$X ip addr add 10.78.0.1/24 dev fsk0
$X ip link set fsk0 up
$X ip link set fsf0 up
$X sysctl -q -w net.ipv6.conf.fsf0.disable_ipv6=1
# Kernel baseline: the server in a second namespace, so traffic really crosses a veth pair.
$X ip link add kk0 type veth peer name kk1 netns $NS2
$K ip addr add 10.79.0.1/24 dev kk1
$X ip addr add 10.79.0.2/24 dev kk0
$X ip link set kk0 up
$K ip link set kk1 up

# Kernel servers: one in NS2 (the baseline, 10.79.0.1) and one in NS (what `flowstack get`
# downloads from, on 10.77.0.1 and 10.78.0.1), both on port 8000.
start_kernel_server() { # NETNS-PREFIX TAG
  if [ -n "$NGINX" ]; then
    cat > "$WORK/nginx-$2.conf" << EOF
worker_processes 1;
daemon off;
pid $WORK/nginx-$2.pid;
error_log $WORK/nginx-$2.err;
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  client_body_temp_path $WORK/ngtmp-$2;
  server { listen 8000 reuseport backlog=4096; root $WORK/www; }
}
EOF
    ( $1 "$NGINX" -c "$WORK/nginx-$2.conf" > /dev/null 2>&1 & )
  else
    cat > "$WORK/srv.py" << 'PY'
import http.server, os, sys
class H(http.server.SimpleHTTPRequestHandler):
    def copyfile(self, src, dst):
        dst.flush()
        self.connection.sendfile(src)
    def log_message(self, *a): pass
os.chdir(sys.argv[1])
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
PY
    ( $1 python3 "$WORK/srv.py" "$WORK/www" > /dev/null 2>&1 & )
  fi
}
wait_up() { # NETNS-PREFIX URL
  for _ in $(seq 100); do $1 curl -s -m 2 -o /dev/null "$2" && return 0; sleep 0.1; done
  echo "bench-links: $2 did not answer" >&2
  return 1
}
start_kernel_server "$K" base
start_kernel_server "$X" peer
wait_up "$X" http://10.79.0.1:8000/small.html
wait_up "$X" http://10.78.0.1:8000/small.html

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print 0}'; }
now() { date +%s.%N; }
bytes=$((SIZE_MB * 1024 * 1024))
# Each throughput run is timed the same way for both sides: the whole client command,
# start to exit (process start and connection setup included), in MB/s.
rate() { awk -v s="$1" -v e="$2" -v b="$bytes" 'BEGIN {printf "%.1f", b / (e - s) / 1e6}'; }
kernel_get() { # one kernel curl <- kernel run over the veth pair
  local s e
  s=$(now); $X timeout 60 curl -s -o /dev/null http://10.79.0.1:8000/f.bin; e=$(now)
  rate "$s" "$e"
}
curl_get() { # URL: one kernel curl <- flowstack run
  local s e
  s=$(now); $X timeout 60 curl -s -o /dev/null "$1" || { echo 0; return; }; e=$(now)
  rate "$s" "$e"
}
GET_N=0
fs_get() { # IP LINK...: one flowstack get <- kernel run (IP: a fresh address, see below)
  local ip=$1 s e; shift
  s=$(now)
  $X timeout 60 "$BIN" get "$@" --ip "$ip/24" "http://${ip%.*}.1:8000/f.bin" -o /dev/null 2> "$WORK/get.log" || { echo 0; return; }
  e=$(now)
  rate "$s" "$e"
}
ab_rps() { # URL
  $X timeout 60 ab -q -c32 -n "$AB_N" "$1" 2> /dev/null | awk '/Requests per second/ {print $4}' | grep . || echo 0
}
wrk_rps() { # URL
  $X timeout 60 wrk -t1 -c32 -d"${WRK_SECS}s" "$1" 2> /dev/null | awk '/Requests\/sec/ {print $2}' | grep . || echo 0
}
AB_N=${AB_N:-20000}
WRK_SECS=${WRK_SECS:-3}

ROWS=()
row() { # TEST LINK UNIT FS_RUNS KERNEL_RUNS
  local f k
  f=$(echo "$4" | median); k=$(echo "$5" | median)
  ROWS+=("$1|$2|$3|$f|$k|$4|$5")
}

serve_on() { # IP LINK... : starts flowstack serve, sets SERVE_PID
  local ip=$1; shift
  $X "$BIN" serve "$@" --ip "$ip/24" http --root "$WORK/www" --port 80 > "$WORK/serve.log" 2>&1 &
  SERVE_PID=$!
  wait_up "$X" "http://$ip/small.html"
}
stop_serve() { kill -INT "$SERVE_PID" 2> /dev/null || true; wait "$SERVE_PID" 2> /dev/null || true; }

bench_link() { # NAME IP LINK...
  local name=$1 ip=$2; shift 2
  local fs ks
  want_link "$name" || return 0
  if want send || want ab || want wrk; then
    if serve_on "$ip" "$@"; then
      if want send; then
        fs=; ks=
        for _ in $(seq "$RUNS"); do
          ks="$ks $(kernel_get)"; fs="$fs $(curl_get "http://$ip/f.bin")"
        done
        row send "$name" MB/s "$fs" "$ks"
      fi
      if [ "$name" = tap ] || [ "$name" = packet ] || [ "$name" = xdp ]; then
        if want ab && command -v ab > /dev/null && [ -n "$NGINX" ]; then
          fs=; ks=
          for _ in $(seq "$RUNS"); do
            ks="$ks $(ab_rps http://10.79.0.1:8000/small.html)"; fs="$fs $(ab_rps "http://$ip/small.html")"
          done
          row ab "$name" req/s "$fs" "$ks"
        fi
        if want wrk && command -v wrk > /dev/null && [ -n "$NGINX" ]; then
          fs=; ks=
          for _ in $(seq "$RUNS"); do
            ks="$ks $(wrk_rps http://10.79.0.1:8000/small.html)"; fs="$fs $(wrk_rps "http://$ip/small.html")"
          done
          row wrk "$name" req/s "$fs" "$ks"
        fi
      fi
      stop_serve
    else
      echo "bench-links: flowstack serve on $name did not come up:" >&2; tail -3 "$WORK/serve.log" >&2
      stop_serve
    fi
  fi
  if want recv; then
    fs=; ks=
    for _ in $(seq "$RUNS"); do
      # A fresh address per run: flowstack's first ephemeral port is the same in every
      # process, and reusing the 4-tuple of the previous run (in TIME_WAIT on the server)
      # costs a challenge ACK, a RST and a 1 s SYN retransmission.
      GET_N=$((GET_N + 1))
      ks="$ks $(kernel_get)"; fs="$fs $(fs_get "${ip%.*}.$((10 + GET_N % 200))" "$@")"
    done
    row recv "$name" MB/s "$fs" "$ks"
  fi
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
bench_link tap 10.77.0.2 --tap fst0
bench_link tap-novnet 10.77.0.2 --tap fst0 --no-vnet
bench_link packet 10.78.0.2 --packet fsf0
if "$BIN" serve --help 2> /dev/null | grep -q -- '--xdp'; then
  bench_link xdp 10.78.0.2 --xdp fsf0
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

kserver=$([ -n "$NGINX" ] && echo "nginx, 1 worker" || echo "python3 http.server")
echo "file ${SIZE_MB} MiB, ${RUNS} runs each, medians; kernel server: $kserver; load ${LOAD_BEFORE} -> ${LOAD_AFTER}"
printf '%-5s %-11s %7s %12s %12s %7s\n' test link unit flowstack kernel ratio
for r in "${ROWS[@]}"; do
  IFS='|' read -r t l u f k fr kr <<< "$r"
  printf '%-5s %-11s %7s %12s %12s %7s   fs:[%s] k:[%s]\n' "$t" "$l" "$u" "$f" "$k" \
    "$(awk -v f="$f" -v k="$k" 'BEGIN {if (k > 0) printf "%.2f", f / k; else print "-"}')" \
    "$(echo $fr)" "$(echo $kr)"
done
echo "send: kernel curl <- flowstack serve; recv: flowstack get <- kernel; kernel column: kernel curl <- kernel over veth"
echo "ab: ab -c32 -n $AB_N (short connections); wrk: wrk -t1 -c32 -d${WRK_SECS}s (keep-alive); kernel column: nginx over veth"
if [ -n "$JSON" ]; then
  {
    printf '{"size_mb":%s,"runs":%s,"kernel_server":"%s","load_before":"%s","load_after":"%s","rows":[' \
      "$SIZE_MB" "$RUNS" "$kserver" "$LOAD_BEFORE" "$LOAD_AFTER"
    sep=
    for r in "${ROWS[@]}"; do
      IFS='|' read -r t l u f k fr kr <<< "$r"
      printf '%s{"test":"%s","link":"%s","unit":"%s","flowstack":%s,"kernel":%s,"ratio":%s,"flowstack_runs":[%s],"kernel_runs":[%s]}' \
        "$sep" "$t" "$l" "$u" "$f" "$k" \
        "$(awk -v f="$f" -v k="$k" 'BEGIN {if (k > 0) printf "%.3f", f / k; else print "null"}')" \
        "$(echo $fr | tr ' ' ',')" "$(echo $kr | tr ' ' ',')"
      sep=,
    done
    echo ']}'
  } > "$JSON"
  echo "wrote $JSON"
fi
