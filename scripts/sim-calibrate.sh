#!/bin/sh
# Remakes presets/vm.json, this machine's calibration for `flowstack sim` (README "What would
# it give on N cores: `flowstack sim`"): every calibration bench run in presets/vm-inputs
# (cal-*.json, and the CPU share each got in shares.json) made again now, the parameters no
# profile measures fitted to them, and the binary rebuilt (the presets are compiled in).
# Each run is 3 x 1 s, except the kernel's crr: 3 x 0.25 s, each 2 s after anything before
# it, so that it takes fewer local ports than TIME-WAIT leaves free (its rate is then its
# CPU's; `fitted` in vm.json says whether it was port-free). About 2.5 minutes.
#
#   scripts/sim-calibrate.sh             # keep presets/vm-inputs/profile.json
#   scripts/sim-calibrate.sh --profile   # remake the profile too (flowstack profile)
#
# If the offload daemon's calls changed, first re-measure its applications' sleeps and set
# the defaults of host.offload_crr_waits and host.offload_stream_waits (crates/sim/src/calib.rs):
#   cargo run --release -p flowstack-bench --example offload_trace -- 2
#   cargo run --release -p flowstack-bench --example offload_trace -- 2 stream
set -eu
cd "$(dirname "$0")/.."
case "${1:-}" in
"") profile=keep ;;
--profile) profile=new ;;
*)
    echo "usage: scripts/sim-calibrate.sh [--profile]" >&2
    exit 2
    ;;
esac
stamp() { echo "$1 $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"; }
cargo build --release -q -p flowstack-cli
fs=./target/release/flowstack
stamp start
if [ "$profile" = new ]; then
    "$fs" profile --sizes 64,256,1024,1448 --samples 5000 --json presets/vm-inputs/profile.json
fi
rm -f presets/vm-inputs/cal-*.json presets/vm-inputs/shares.json
"$fs" sim --calibrate presets/vm.json --profile presets/vm-inputs/profile.json --inputs presets/vm-inputs
stamp end
cargo build --release -q -p flowstack-cli
