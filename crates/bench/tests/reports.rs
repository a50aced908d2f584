//! The reports a run produces survive JSON: written with serde, read back with the schema
//! types of `flowstack_prof::report`, as the architecture simulator reads them.

use flowstack_bench::profile::{Place, Profiler};
use flowstack_bench::{BenchSpec, Event, PeerSel, RunOpts};
use flowstack_prof::report::{
    from_json, to_json, BenchLink, BenchReport, Peer, ProfileReport, Step, Workload,
};

fn pipe_spec(w: Workload) -> BenchSpec {
    BenchSpec {
        workload: w,
        peer: PeerSel::Flowstack,
        link: BenchLink::Pipe,
        duration: 0.2,
        conns: 2,
        runs: 3,
        opts: RunOpts::default(),
        cores: None,
    }
    .validated()
    .unwrap()
}

#[test]
fn bench_reports_of_every_workload_read_back() {
    for w in [Workload::Stream, Workload::Rr, Workload::Crr] {
        let mut finished = 0;
        let r = flowstack_bench::run(&pipe_spec(w), &mut |e| {
            if let Event::Finished { peer, result, .. } = e {
                assert_eq!(peer, Peer::Flowstack);
                assert!(result.metric > 0.0, "{w:?}: {result:?}");
                finished += 1;
            }
        })
        .unwrap();
        assert_eq!(finished, 3);
        let f = &r.peers[&Peer::Flowstack];
        assert_eq!(f.each_run.len(), 3);
        assert!(f.min <= f.median && f.median <= f.max);
        assert_eq!(f.latency.is_some(), w == Workload::Rr);
        assert_eq!(r.speedup, None);
        let j = to_json(&r);
        let back: BenchReport = from_json(&j).unwrap();
        assert_eq!(back, r, "{j}");
    }
}

#[test]
fn a_profile_report_reads_back() {
    let prof = match Profiler::new() {
        Ok(p) => p,
        // A CPU without RDTSCP cannot record; nothing to check there.
        Err(e) => return eprintln!("{e}"),
    };
    let place = Place::InProcess;
    let mut rig = place.rig(300).unwrap();
    let mut ticks = 0;
    let size = prof.measure(rig.as_mut(), 300, 100, 5.0, &mut || ticks += 1);
    assert_eq!(ticks, 100 + flowstack_bench::profile::WARMUP);
    assert!(size.paths.send.layers.iter().any(|l| l.phase == Step::Ack));
    assert!(size.paths.receive.total.cycles > 0.0);
    let r = prof.report(&place, vec![size]);
    let j = to_json(&r);
    assert!(j.contains("\"link\": \"in-process link between two flowstack engines\""));
    let back: ProfileReport = from_json(&j).unwrap();
    assert_eq!(back, r);
}
