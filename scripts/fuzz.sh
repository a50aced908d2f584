#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time each (default 60 s), niced, and
# appends the executions each run reached to fuzz/runs.tsv (date, target, seconds, execs,
# crashes, sanitizer; rows without a sanitizer column ran with AddressSanitizer). New inputs the fuzzer finds go to a scratch corpus; the small seed corpora in
# fuzz/corpus/ are replayed by `cargo test` (crates/stack/tests/fuzz_corpus.rs; ring_peer
# and records: crates/sys/tests/ring_fuzz_corpus.rs).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on stable through RUSTC_BOOTSTRAP=1.
#
# Sanitizers: the targets over safe Rust only (wire_roundtrip, engine_rx, tcp_conn) run without
# AddressSanitizer — safe code cannot make the out-of-bounds or use-after-free errors it finds,
# and it costs 10-100x in executions — but with debug assertions and overflow checks on (`-a`),
# so an arithmetic overflow in a parser or in sequence-space code is a crash, not a silent wrap.
# The targets over shared memory (ring_peer, records: `unsafe` code) keep AddressSanitizer.
# FUZZ_SANITIZER=address|none overrides the choice for every target.
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
sanitizer_of() {
    if [ -n "${FUZZ_SANITIZER:-}" ]; then
        echo "$FUZZ_SANITIZER"
        return
    fi
    case "$1" in
        ring_peer | records) echo address ;;
        *) echo none ;;
    esac
}
status=0
for t in "${targets[@]}"; do
    scratch="target/corpus-$t"
    mkdir -p "$scratch" artifacts/"$t"
    log=$(mktemp)
    san=$(sanitizer_of "$t")
    nice -n 19 cargo fuzz build -O -a -s "$san" "$t"
    set +e
    nice -n 19 cargo fuzz run -O -a -s "$san" "$t" "$scratch" "corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=1024 -max_len=4096 -print_final_stats=1 \
        >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
    crashes=$(find artifacts/"$t" -type f | wc -l)
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "$secs" "${execs:-0}" "$crashes" "$san" | tee -a runs.tsv
    if [ $rc -ne 0 ]; then
        echo "$t: fuzzer exited $rc; see artifacts/$t and the tail of its log:" >&2
        tail -30 "$log" >&2
        status=1
    fi
    rm -f "$log"
done
echo "executions recorded in fuzz/runs.tsv across all runs, per target:"
awk -F'\t' '{s[$2]+=$4} END {for (t in s) printf "  %-16s %d\n", t, s[t]}' runs.tsv | sort
exit $status
