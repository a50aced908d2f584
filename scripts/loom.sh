#!/usr/bin/env bash
# Model-checks the shared-memory ring's and the bell's wake-up protocol with loom: the real
# code of crates/sys/src/ring.rs and ring/bell.rs, with loom's atomics, fences and a loom model
# of the futex (crates/sys/src/sync.rs); the models are in crates/sys/src/ring/loom_models.rs.
# A lost wake-up shows up as a loom deadlock and fails the run. Stable toolchain; its own
# target directory (target/loom), so the normal build is not invalidated.
#
#   scripts/loom.sh [TEST-NAME-FILTER]    (default: every model, i.e. "loom")
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom"
export CARGO_TARGET_DIR=target/loom
# Turn on loom's own diagnostics with e.g. LOOM_LOG=info LOOM_LOCATION=1 scripts/loom.sh
cargo test -p flowstack-sys --release --lib "${1:-loom}" -- --test-threads=1 --nocapture
