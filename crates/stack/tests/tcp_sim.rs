//! Deterministic simulation of TCP between two engines: byte-exact transfers under loss,
//! reordering, duplication and corruption, across many seeds. A failing seed reproduces
//! exactly (`FLOWSTACK_SEEDS=N` runs more seeds).

use flowstack_link::impair::ImpairSpec;
use flowstack_stack::sim::{bulk_transfer, Net, NetConfig};
use flowstack_wire::Duration;

fn run(spec: &str, seed: u64, bytes: u64) -> flowstack_stack::sim::TransferReport {
    let cfg = NetConfig {
        impair: spec.parse::<ImpairSpec>().unwrap(),
        seed,
        ..Default::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    bulk_transfer(&mut net, bytes, Duration::from_secs(600), |_| {})
        .unwrap_or_else(|e| panic!("seed {seed} spec {spec}: {e}"))
}

#[test]
fn clean_transfer_is_byte_exact() {
    let r = run("", 1, 4 << 20);
    assert_eq!(r.mismatch_at, None);
    assert!(r.complete, "{r:?}");
    assert_eq!(r.client.retransmits, 0);
}

fn seeds() -> u64 {
    std::env::var("FLOWSTACK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

fn sweep(spec: &str, bytes: u64) {
    let mut retrans = 0;
    for seed in 0..seeds() {
        let r = run(spec, seed, bytes);
        assert_eq!(r.mismatch_at, None, "seed {seed} spec {spec}");
        assert!(r.complete, "seed {seed} spec {spec}: {r:?}");
        retrans += r.client.retransmits;
    }
    if spec.contains("loss") {
        assert!(retrans > 0, "loss must cause retransmissions");
    }
}

#[test]
fn one_percent_loss_with_reorder_dup_corrupt() {
    sweep("loss=0.01,reorder=0.01,dup=0.01,corrupt=0.005", 256 * 1024);
}

#[test]
fn five_percent_loss_with_reorder_dup_corrupt() {
    sweep("loss=0.05,reorder=0.02,dup=0.02,corrupt=0.01", 256 * 1024);
}

#[test]
fn zero_loss_with_reorder_and_delay() {
    sweep("reorder=0.05,dup=0.02,delay=200us", 64 * 1024);
}
