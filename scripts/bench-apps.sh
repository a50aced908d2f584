#!/usr/bin/env bash
# Unmodified applications on flowstack vs the kernel, same machine, same run (issue 16's goals).
#
# Both ends under `flowstack run` (through the offload daemon's loopback) vs both ends on the
# kernel's loopback: redis-benchmark requests/s, wrk keep-alive requests/s against nginx, ab
# short-connection requests/s against nginx, iperf3 Gbit/s, and the application processes'
# CPU time per request (iperf3: per GB received) (utime+stime from /proc of the server and the load generator; for
# flowstack the daemon's CPU is reported separately). Medians of RUNS (default 3) runs,
# alternating kernel and flowstack. Prints a table of ratios (flowstack / kernel; for CPU per
# request lower is better).
#
# usage: scripts/bench-apps.sh [RUNS] [WHICH]   (WHICH: comma-separated subset of
#        redis,nginx,iperf3; default all. Needs a release build: cargo build --release -p
#        flowstack-cli -p flowstack-preload; and redis-server, redis-benchmark, nginx, wrk,
#        ab, iperf3 — missing programs are skipped). BENCH_DAEMON_ARGS: extra arguments
#        for the daemon (e.g. "--spin-us 0").
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
WHICH=${2:-redis,nginx,iperf3}
for w in ${WHICH//,/ }; do
  case $w in redis | nginx | iperf3) ;; *)
    echo "bench-apps: unknown benchmark '$w' (redis, nginx, iperf3)" >&2
    exit 2
    ;;
  esac
done
wants() { [[ ",$WHICH," == *",$1,"* ]]; }
FS=${FLOWSTACK:-target/release/flowstack}
export FLOWSTACK_PRELOAD=${FLOWSTACK_PRELOAD:-$PWD/target/release/libflowstack_preload.so}
[ -x "$FS" ] && [ -f "$FLOWSTACK_PRELOAD" ] || {
  echo "bench-apps: build first: cargo build --release -p flowstack-cli -p flowstack-preload" >&2
  exit 2
}
TMP=$(mktemp -d)
SOCK=$TMP/fs.sock
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
# shellcheck disable=SC2086 # word splitting intended
"$FS" daemon --socket "$SOCK" ${BENCH_DAEMON_ARGS:-} >"$TMP/daemon.log" 2>&1 &
DAEMON=$!
PIDS+=("$DAEMON")
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done

# cpu_ticks PID...: utime+stime (clock ticks) of the processes and their reaped children.
cpu_ticks() {
  local t=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    t=$((t + $(awk '{print $14+$15+$16+$17}' "/proc/$p/stat")))
  done
  echo "$t"
}
pids_of() { pgrep -d ' ' -f "$1" || true; }
HZ=$(getconf CLK_TCK)

# wrap MODE: the command prefix for a mode.
wrap() { if [ "$1" = flowstack ]; then echo "$FS run --socket $SOCK --"; fi; }

port=$((20000 + RANDOM % 20000))
next_port() { port=$((port + 1)); }
wait_port() { for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }

declare -A RES
record() { RES["$1|$2"]+="$3 "; }

median() { tr ' ' '\n' | { grep -v '^$' || true; } | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else printf "%.2f\n", a[int((NR+1)/2)]}'; }

bench_redis() {
  local mode=$1 p out srv t0 t1 d0 d1 rps
  command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null || return 0
  next_port; p=$port
  $(wrap "$mode") redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$TMP" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_port "$p"
  srv=$(pids_of "redis-server.*:$p")
  t0=$(cpu_ticks $srv); d0=$(cpu_ticks $DAEMON)
  local c0; c0=$(awk '{print $16+$17}' /proc/$$/stat)
  out=$( ($(wrap "$mode") redis-benchmark -q -p "$p" -n 100000 -c 50 -t get 2>/dev/null || true) | tr '\r' '\n' | grep 'GET:' | tail -1 || true)
  local c1; c1=$(awk '{print $16+$17}' /proc/$$/stat)
  t1=$(cpu_ticks $srv); d1=$(cpu_ticks $DAEMON)
  rps=$(echo "$out" | awk '{print $2}')
  record redis "$mode" "$rps"
  # Application CPU (server + load generator, a reaped child of this shell) per request, us.
  record redis_cpu "$mode" "$(echo "($t1-$t0+$c1-$c0)*1000000/$HZ/100000" | bc -l)"
  [ "$mode" = flowstack ] && record redis_daemon_cpu "$mode" "$(echo "($d1-$d0)*1000000/$HZ/100000" | bc -l)"
  kill $srv 2>/dev/null || true
  sleep 0.2
}

nginx_start() {
  local mode=$1 p=$2 d=$TMP/nginx-$p
  mkdir -p "$d/www"
  echo '<h1>flowstack</h1>' >"$d/www/index.html"
  cat >"$d/nginx.conf" <<EOF
daemon off; user root; master_process on; worker_processes 1; pid $d/nginx.pid;
error_log $d/error.log; events { worker_connections 4096; }
http { access_log off; client_body_temp_path $d/b; proxy_temp_path $d/p;
  fastcgi_temp_path $d/f; uwsgi_temp_path $d/u; scgi_temp_path $d/s; sendfile on;
  keepalive_requests 10000000;
  server { listen 127.0.0.1:$p; root $d/www; } }
EOF
  $(wrap "$mode") nginx -c "$d/nginx.conf" -e "$d/stderr.log" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_port "$p"
}

bench_nginx() {
  local mode=$1 p srv t0 t1 c0 c1 d0 d1 out n rps
  command -v nginx >/dev/null || return 0
  next_port; p=$port
  nginx_start "$mode" "$p"
  local master; master=$(pids_of "nginx.*nginx-$p")
  srv="$master $(for m in $master; do pgrep -P "$m" || true; done)"
  if command -v wrk >/dev/null; then
    t0=$(cpu_ticks $srv); c0=$(awk '{print $16+$17}' /proc/$$/stat); d0=$(cpu_ticks $DAEMON)
    out=$($(wrap "$mode") wrk -t1 -c20 -d5s "http://127.0.0.1:$p/index.html" 2>&1 || true)
    c1=$(awk '{print $16+$17}' /proc/$$/stat); t1=$(cpu_ticks $srv); d1=$(cpu_ticks $DAEMON)
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    n=$(echo "$out" | awk '/requests in/ {print $1}')
    record wrk "$mode" "$rps"
    [ -n "$n" ] && [ "$n" -gt 0 ] && record wrk_cpu "$mode" "$(echo "($t1-$t0+$c1-$c0)*1000000/$HZ/$n" | bc -l)"
    [ -n "$n" ] && [ "$n" -gt 0 ] && [ "$mode" = flowstack ] &&
      record wrk_daemon_cpu "$mode" "$(echo "($d1-$d0)*1000000/$HZ/$n" | bc -l)"
    echo "$out" | grep -q 'Socket errors\|unable' && echo "bench-apps: wrk ($mode): $(echo "$out" | grep 'Socket errors\|unable')" >&2
  fi
  if command -v ab >/dev/null; then
    t0=$(cpu_ticks $srv); c0=$(awk '{print $16+$17}' /proc/$$/stat); d0=$(cpu_ticks $DAEMON)
    out=$($(wrap "$mode") ab -q -n 20000 -c 20 "http://127.0.0.1:$p/index.html" 2>&1 || true)
    c1=$(awk '{print $16+$17}' /proc/$$/stat); t1=$(cpu_ticks $srv); d1=$(cpu_ticks $DAEMON)
    record ab "$mode" "$(echo "$out" | awk '/Requests per second/ {print $4}')"
    record ab_cpu "$mode" "$(echo "($t1-$t0+$c1-$c0)*1000000/$HZ/20000" | bc -l)"
    [ "$mode" = flowstack ] && record ab_daemon_cpu "$mode" "$(echo "($d1-$d0)*1000000/$HZ/20000" | bc -l)"
    echo "$out" | grep -q 'Failed requests:        0' || echo "bench-apps: ab ($mode): $(echo "$out" | tail -3)" >&2
  fi
  kill $srv 2>/dev/null || true
  sleep 0.2
}

bench_iperf3() {
  local mode=$1 p out srv c0 c1 d0 d1 gb
  command -v iperf3 >/dev/null || return 0
  next_port; p=$port
  # Both iperf3 processes are reaped children of this shell: their CPU ends up in its
  # cutime+cstime once both are waited for.
  c0=$(awk '{print $16+$17}' /proc/$$/stat); d0=$(cpu_ticks $DAEMON)
  $(wrap "$mode") iperf3 -s -p "$p" -1 >/dev/null 2>&1 &
  srv=$!
  PIDS+=("$srv")
  sleep 0.5
  out=$(timeout 20 $(wrap "$mode") iperf3 -c 127.0.0.1 -p "$p" -t 3 -f g 2>&1 || true)
  wait "$srv" 2>/dev/null || true
  c1=$(awk '{print $16+$17}' /proc/$$/stat); d1=$(cpu_ticks $DAEMON)
  record iperf3 "$mode" "$(echo "$out" | awk '/receiver/ {print $7}' | tail -1)"
  # Application CPU (iperf3 server + client) per GB received, ms; the daemon's apart.
  gb=$(echo "$out" | awk '/receiver/ && $6 == "GBytes" {print $5}' | tail -1)
  if [[ "$gb" =~ ^[0-9.]+$ ]] && [ "$(echo "$gb > 0" | bc)" = 1 ]; then
    record iperf3_cpu "$mode" "$(echo "($c1-$c0)*1000/$HZ/$gb" | bc -l)"
    [ "$mode" = flowstack ] && record iperf3_daemon_cpu "$mode" "$(echo "($d1-$d0)*1000/$HZ/$gb" | bc -l)"
  fi
  return 0
}

for r in $(seq "$RUNS"); do
  for mode in kernel flowstack; do
    echo "bench-apps: run $r/$RUNS $mode" >&2
    if wants redis; then bench_redis "$mode"; fi
    if wants nginx; then bench_nginx "$mode"; fi
    if wants iperf3; then bench_iperf3 "$mode"; fi
  done
done

printf '%-28s %14s %14s %8s\n' metric kernel flowstack ratio
row() {
  local k f ratio
  k=$(echo "${RES[$1|kernel]:-}" | median)
  f=$(echo "${RES[$1|flowstack]:-}" | median)
  ratio=-
  if [[ "$k" =~ ^[0-9.]+$ ]] && [[ "$f" =~ ^[0-9.]+$ ]] && [ "$(echo "$k > 0" | bc)" = 1 ]; then
    ratio=$(printf '%.2f' "$(echo "$f / $k" | bc -l)")
  fi
  printf '%-28s %14s %14s %8s\n' "$2" "$k" "$f" "$ratio"
}
row redis "redis GET req/s (-c 50)"
row redis_cpu "redis app CPU us/req"
row redis_daemon_cpu "redis daemon CPU us/req"
row wrk "wrk keep-alive req/s"
row wrk_cpu "wrk+nginx app CPU us/req"
row wrk_daemon_cpu "wrk daemon CPU us/req"
row ab "ab short conns req/s"
row ab_cpu "ab+nginx app CPU us/conn"
row ab_daemon_cpu "ab daemon CPU us/conn"
row iperf3 "iperf3 Gbit/s"
row iperf3_cpu "iperf3 app CPU ms/GB"
row iperf3_daemon_cpu "iperf3 daemon CPU ms/GB"
echo "(medians of $RUNS runs; each value: $(for k in "${!RES[@]}"; do echo -n "$k=[${RES[$k]% }] "; done))" >&2
