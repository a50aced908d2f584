#!/usr/bin/env bash
# python's socket.sendfile() of one file over loopback, same machine, same run (issue 17):
#
#   kernel     both python processes on the kernel (sendfile(2) + recv_into)
#   flowstack  both under `flowstack run`: the shim hands the file to the daemon, which
#              reads it itself (FlowstackdSendFileBytes) — the zero-copy path
#   copy       as flowstack, but the sender with FLOWSTACK_SENDFILE=copy: the shim reads the
#              file into a buffer and sends it through the rings (the old path)
#
# Each run: the receiver times connect → end of stream; the sender and receiver report their
# own CPU (getrusage), the daemon's CPU comes from /proc/PID/stat. Page cache warm. Medians of
# RUNS (default 3) runs, the modes alternating within each round; then the ratios.
#
# usage: scripts/bench-sendfile.sh [RUNS] [SIZE_MIB]   (default 3 runs of 1024 MiB; needs
#        python3 and a release build: cargo build --release -p flowstack-cli -p flowstack-preload)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
MIB=${2:-1024}
case "$RUNS$MIB" in *[!0-9]*) echo "bench-sendfile: RUNS and SIZE_MIB are numbers" >&2; exit 2 ;; esac
FS=${FLOWSTACK:-target/release/flowstack}
export FLOWSTACK_PRELOAD=${FLOWSTACK_PRELOAD:-$PWD/target/release/libflowstack_preload.so}
[ -x "$FS" ] && [ -f "$FLOWSTACK_PRELOAD" ] || {
  echo "bench-sendfile: build first: cargo build --release -p flowstack-cli -p flowstack-preload" >&2
  exit 2
}
command -v python3 >/dev/null || { echo "bench-sendfile: needs python3" >&2; exit 2; }
TMP=$(mktemp -d)
SOCK=$TMP/fs.sock
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
"$FS" daemon --socket "$SOCK" >"$TMP/daemon.log" 2>&1 &
DAEMON=$!
PIDS+=("$DAEMON")
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
HZ=$(getconf CLK_TCK)
daemon_ticks() { awk '{print $14+$15}' "/proc/$DAEMON/stat"; }

cat >"$TMP/send.py" <<'EOF'
import resource, socket, sys
path, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(1)
open(ready, "w").close()
c, _ = l.accept()
with open(path, "rb") as f:
    n = c.sendfile(f)
c.close()
r = resource.getrusage(resource.RUSAGE_SELF)
print(n, r.ru_utime + r.ru_stime, flush=True)
EOF
cat >"$TMP/recv.py" <<'EOF'
import resource, socket, sys, time
port = int(sys.argv[1])
buf = bytearray(1 << 20)
t0 = time.perf_counter()
s = socket.create_connection(("127.0.0.1", port), timeout=120)
total = 0
while True:
    k = s.recv_into(buf)
    if k == 0:
        break
    total += k
dt = time.perf_counter() - t0
r = resource.getrusage(resource.RUSAGE_SELF)
print(total, dt, r.ru_utime + r.ru_stime, flush=True)
EOF
FILE=$TMP/file.bin
head -c $((MIB << 20)) /dev/urandom >"$FILE"
cat "$FILE" >/dev/null
SIZE=$((MIB << 20))

declare -A RES
record() { RES["$1|$2"]+="$3 "; }
median() { tr ' ' '\n' | { grep -v '^$' || true; } | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else printf "%.3f\n", a[int((NR+1)/2)]}'; }
range() { tr ' ' '\n' | { grep -v '^$' || true; } | sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.3f-%.3f", lo, hi}'; }

port=$((20000 + RANDOM % 20000))
one() {
  local mode=$1 pre=() env=() ready=$TMP/ready out sent rcv d0 d1
  port=$((port + 1)); rm -f "$ready"
  [ "$mode" != kernel ] && pre=("$FS" run --socket "$SOCK" --)
  [ "$mode" = copy ] && env=(FLOWSTACK_SENDFILE=copy)
  env "${env[@]}" "${pre[@]}" python3 "$TMP/send.py" "$FILE" "$port" "$ready" >"$TMP/sent" &
  local spid=$!
  for _ in $(seq 400); do [ -e "$ready" ] && break; sleep 0.025; done
  d0=$(daemon_ticks)
  rcv=$("${pre[@]}" python3 "$TMP/recv.py" "$port")
  wait "$spid"
  d1=$(daemon_ticks)
  sent=$(cat "$TMP/sent")
  set -- $rcv
  [ "$1" = "$SIZE" ] && [ "${sent%% *}" = "$SIZE" ] || { echo "bench-sendfile: $mode moved $1 of $SIZE bytes" >&2; exit 1; }
  record "$mode" secs "$2"
  record "$mode" recv_cpu "$3"
  record "$mode" send_cpu "${sent#* }"
  record "$mode" daemon_cpu "$(echo "($d1 - $d0) / $HZ" | bc -l)"
}

echo "bench-sendfile: $RUNS runs of $MIB MiB, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq "$RUNS"); do
  for m in kernel flowstack copy; do one "$m"; done
  echo "  round $r done" >&2
done

printf '%-10s %-22s %8s %10s %10s %11s\n' mode "seconds median [min-max]" "GiB/s" "send CPU s" "recv CPU s" "daemon CPU s"
for m in kernel flowstack copy; do
  s=$(echo "${RES[$m|secs]}" | median)
  printf '%-10s %-22s %8.2f %10s %10s %11s\n' "$m" "$s [$(echo "${RES[$m|secs]}" | range)]" \
    "$(echo "$SIZE / 1073741824 / $s" | bc -l)" "$(echo "${RES[$m|send_cpu]}" | median)" \
    "$(echo "${RES[$m|recv_cpu]}" | median)" "$(echo "${RES[$m|daemon_cpu]}" | median)"
done
k=$(echo "${RES[kernel|secs]}" | median)
f=$(echo "${RES[flowstack|secs]}" | median)
c=$(echo "${RES[copy|secs]}" | median)
printf 'time ratio flowstack/kernel %.2f, flowstack/copy %.2f (below 1: flowstack faster)\n' \
  "$(echo "$f / $k" | bc -l)" "$(echo "$f / $c" | bc -l)"
printf 'sender CPU flowstack/copy %.2f\n' \
  "$(echo "$(echo "${RES[flowstack|send_cpu]}" | median) / $(echo "${RES[copy|send_cpu]}" | median)" | bc -l)"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
