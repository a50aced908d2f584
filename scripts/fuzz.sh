#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time each (default 60 s), niced, and
# appends the executions each run reached to fuzz/runs.tsv (date, target, seconds, execs,
# crashes). New inputs the fuzzer finds go to a scratch corpus; the small seed corpora in
# fuzz/corpus/ are replayed by `cargo test` (crates/stack/tests/fuzz_corpus.rs; ring_peer
# and records: crates/sys/tests/ring_fuzz_corpus.rs).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on stable through RUSTC_BOOTSTRAP=1.
set -euo pipefail
secs=${1:-60}
shift || true
cd "$(dirname "$0")/../fuzz"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(wire_roundtrip engine_rx tcp_conn ring_peer records)
fi
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -eq 0 ]; then
    echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]  (SECONDS a positive integer)" >&2
    exit 2
fi
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: cargo install cargo-fuzz" >&2; exit 2; }
export RUSTC_BOOTSTRAP=1
nice -n 19 cargo fuzz build -O
status=0
for t in "${targets[@]}"; do
    scratch="target/corpus-$t"
    mkdir -p "$scratch" artifacts/"$t"
    log=$(mktemp)
    set +e
    nice -n 19 cargo fuzz run -O "$t" "$scratch" "corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=1024 -max_len=4096 -print_final_stats=1 \
        >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
    crashes=$(find artifacts/"$t" -type f | wc -l)
    printf '%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "$secs" "${execs:-0}" "$crashes" | tee -a runs.tsv
    if [ $rc -ne 0 ]; then
        echo "$t: fuzzer exited $rc; see artifacts/$t and the tail of its log:" >&2
        tail -30 "$log" >&2
        status=1
    fi
    rm -f "$log"
done
total=$(awk -F'\t' '{s+=$4} END {print s+0}' runs.tsv)
echo "executions recorded in fuzz/runs.tsv across all runs: $total"
exit $status
