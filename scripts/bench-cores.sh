#!/usr/bin/env bash
# Flow-level scaling, flowstack against the kernel, in one invocation: `bench crr --peer both`
# with --cores 1 and --cores 2, alternated RUNS times, then the medians (min..max), each
# stack's scaling efficiency rate(2) / (2 * rate(1)) and flowstack/kernel at 2 cores.
# Core k runs both sides of each peer (flowstack: client and server engine k on one thread
# over their own pipe; kernel: a SO_REUSEPORT server thread and a client thread pinned to
# CPU k), so each peer's load generator and server share the same CPUs.
# Also measured, alternated with the runs: the machine's own ceiling, a pure CPU loop pinned to
# CPU 0 alone vs on CPU 0 and CPU 1 at once (a shared or oversubscribed VM gives well under 1).
# Usage: scripts/bench-cores.sh [RUNS=5] [DURATION_S=3] [CONNS_PER_CORE=1]
set -euo pipefail
RUNS=${1:-5}
DUR=${2:-3}
CPC=${3:-1}
BIN=${FLOWSTACK:-$(dirname "$0")/../target/release/flowstack}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
spin() { # CPU SECONDS -> loop iterations per second on that CPU
  taskset -c "$1" python3 -c '
import sys, time
d = float(sys.argv[1]); n = 0; t = time.time()
while time.time() - t < d:
    for _ in range(10000): n += 1
print(n / d)' "$2"
}
for i in $(seq "$RUNS"); do
  spin 0 1 > "$WORK/s1-$i"
  { spin 0 1 > "$WORK/s2a-$i" & spin 1 1 > "$WORK/s2b-$i"; wait; }
  for n in 1 2; do
    "$BIN" bench crr --peer both --cores "$n" --conns $((n * CPC)) --duration "$DUR" \
      --json "$WORK/c$n-$i.json" > "$WORK/c$n-$i.txt"
    echo "run $i, --cores $n:" $(sed -nE 's/^\[ *([a-z]+)\] [0-9]+ .* = ([0-9]+) per second$/\1 \2\/s/p' "$WORK/c$n-$i.txt") >&2
  done
done
python3 - "$WORK" "$RUNS" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
rate = {}
for n in (1, 2):
    for i in range(1, runs + 1):
        r = json.load(open(f"{work}/c{n}-{i}.json"))
        for peer, s in r["peers"].items():
            rate.setdefault((peer, n), []).append(s["run_results"][0]["metric"])
med = {k: statistics.median(v) for k, v in rate.items()}
num = lambda f: float(open(f).read())
spin = [(num(f"{work}/s2a-{i}") + num(f"{work}/s2b-{i}")) / (2 * num(f"{work}/s1-{i}")) for i in range(1, runs + 1)]
print(f"crr connections/s, median of {runs} alternated runs (min..max)")
print(f"{'peer':<10} {'1 core':>26} {'2 cores':>26} {'efficiency':>11}")
for peer in ("flowstack", "kernel"):
    cells = [f"{med[(peer, n)]:>9.0f} ({min(rate[(peer, n)]):.0f}..{max(rate[(peer, n)]):.0f})" for n in (1, 2)]
    eff = med[(peer, 2)] / (2 * med[(peer, 1)])
    print(f"{peer:<10} {cells[0]:>26} {cells[1]:>26} {eff:>11.2f}")
print(f"machine ceiling (pure CPU loop, 2 CPUs vs 1): {statistics.median(spin):.2f} (min {min(spin):.2f}, max {max(spin):.2f})")
print(f"flowstack / kernel at 2 cores: {med[('flowstack', 2)] / med[('kernel', 2)]:.2f}x")
PY
