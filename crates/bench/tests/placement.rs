//! `bench --cores N --peer kernel --kernel-placement same`: every connection's server runs on
//! its client's core, in every run (the listeners' `SO_INCOMING_CPU`), so a run measures one
//! placement — the one `flowstack sim --validate` models. Loopback only.

use flowstack_bench::{BenchSpec, PeerSel, Placement, RunOpts};
use flowstack_prof::report::{BenchLink, Peer, Workload};

#[test]
fn same_placement_gives_each_core_listener_its_own_clients_connections() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: one CPU");
        return;
    }
    // 4 connections per core: under the kernel's plain 4-tuple hash a run's listeners
    // accept [4, 4] with probability 70/256, so five such runs in a row are 1 in 650.
    let spec = BenchSpec {
        workload: Workload::Rr,
        peer: PeerSel::Kernel,
        link: BenchLink::Pipe,
        duration: 0.2,
        conns: 8,
        runs: 5,
        opts: RunOpts {
            kernel_placement: Placement::Same,
            ..RunOpts::default()
        },
        cores: Some(2),
    }
    .validated()
    .unwrap();
    let r = flowstack_bench::run(&spec, &mut |_| {}).unwrap();
    let runs = &r.peers[&Peer::Kernel].run_results;
    assert_eq!(runs.len(), 5);
    for run in runs {
        let accepted: Vec<Option<u64>> = run.per_core.iter().map(|c| c.accepted).collect();
        assert_eq!(accepted, [Some(4), Some(4)], "{:?}", run.per_core);
    }
}
