//! `--overhead`: what recording costs bulk throughput (a measurement, not a test).

use flowstack_prof::stats::median;
use flowstack_prof::{activate, deactivate, take};
use flowstack_stack::netsim::{bulk_transfer, Net, NetConfig};
use flowstack_wire::Duration;

/// Bytes moved per transfer.
pub const TRANSFER: u64 = 64 << 20;

/// Median bulk throughput (Mbit/s) of three in-process transfers of [`TRANSFER`] bytes with
/// the recorder inactive, and of three with it recording every layer: `(off, on)`.
pub fn recording_overhead() -> (f64, f64) {
    let mut off = vec![];
    let mut on = vec![];
    for i in 0..6 {
        let Ok(mut net) = Net::new(NetConfig::default(), None) else {
            continue;
        };
        let active = i % 2 == 1;
        if active {
            activate();
        }
        let t = std::time::Instant::now();
        let r = bulk_transfer(&mut net, TRANSFER, Duration::from_secs(600), |_| {}, |_| {});
        let secs = t.elapsed().as_secs_f64();
        deactivate();
        take();
        if let Ok(r) = r {
            let mbps = r.received as f64 * 8.0 / secs / 1e6;
            if active {
                on.push(mbps)
            } else {
                off.push(mbps)
            }
        }
    }
    (median(&off), median(&on))
}
