#!/usr/bin/env bash
# CI's fuzzing step: every cargo-fuzz target of fuzz/ for a short, bounded, reproducible run.
#
# Each target runs a fixed number of inputs from a fixed seed (libFuzzer `-seed=1 -runs=N`),
# starting from its committed corpus, so a CI failure replays the same way on any machine. New
# inputs go to a scratch directory; the committed corpora are never written. Sanitizers as in
# scripts/fuzz.sh: none (but debug assertions and overflow checks) for the safe-Rust targets,
# AddressSanitizer for the shared-memory ones. Installs cargo-fuzz when missing. A crash fails
# the run and names the artifact; executions are appended to fuzz/runs.tsv like any campaign.
#
#   scripts/fuzz-ci.sh [SCALE]     (SCALE multiplies every target's run count; default 1)
#
# FUZZ_TARGET_DIR=DIR builds elsewhere than fuzz/target (e.g. beside a running campaign).
set -euo pipefail
scale=${1:-1}
if ! [[ "$scale" =~ ^[0-9]+$ ]] || [ "$scale" -eq 0 ]; then
    echo "usage: scripts/fuzz-ci.sh [SCALE]  (SCALE a positive integer)" >&2
    exit 2
fi
cd "$(dirname "$0")/../fuzz"
if ! command -v cargo-fuzz >/dev/null; then
    cargo install --locked -q cargo-fuzz
fi
export RUSTC_BOOTSTRAP=1
tdir=()
[ -n "${FUZZ_TARGET_DIR:-}" ] && tdir=(--target-dir "$FUZZ_TARGET_DIR")
# target, sanitizer, inputs (a few seconds each on one core of this 2-core VM)
plan=(
    "wire_roundtrip none 2000000"
    "records address 300000"
    "engine_rx none 300000"
    "tcp_conn none 150000"
    "ring_peer address 10000"
)
status=0
for row in "${plan[@]}"; do
    read -r t san runs <<<"$row"
    runs=$((runs * scale))
    scratch=$(mktemp -d)
    mkdir -p artifacts/"$t"
    before=$(find artifacts/"$t" -type f | wc -l)
    log=$(mktemp)
    cargo fuzz build "${tdir[@]}" -O -a -s "$san" "$t" 2>&1 | tail -1
    set +e
    timeout 300 cargo fuzz run "${tdir[@]}" -O -a -s "$san" "$t" "$scratch" "corpus/$t" -- \
        -seed=1 -runs="$runs" -rss_limit_mb=1024 -max_len=4096 -print_final_stats=1 \
        -artifact_prefix=artifacts/"$t"/ >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
    crashes=$(($(find artifacts/"$t" -type f | wc -l) - before))
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "ci:$runs" "${execs:-0}" \
        "$crashes" "$san" | tee -a runs.tsv
    if [ $rc -ne 0 ] || [ "$crashes" -ne 0 ]; then
        echo "fuzz-ci: $t failed (exit $rc, $crashes new artifacts in fuzz/artifacts/$t); log tail:" >&2
        tail -30 "$log" >&2
        status=1
    fi
    rm -rf "$scratch" "$log"
done
exit $status
