//! A whole `flowstack bench`: every peer, every run, summarised into a [`BenchReport`].

use crate::spec::BenchSpec;
use flowstack_prof::report::{BenchLink, BenchReport, Peer, PeerSummary, RunResult};
use std::collections::BTreeMap;
use std::time::Duration;

/// What [`run`] reports as it goes (for progress display and per-run lines).
#[derive(Debug)]
pub enum Event<'a> {
    /// Run `run` (from 0) of `peer` starts.
    Started {
        /// The peer.
        peer: Peer,
        /// Its run number, from 0.
        run: usize,
    },
    /// Run `run` of `peer` finished with `result`.
    Finished {
        /// The peer.
        peer: Peer,
        /// Its run number, from 0.
        run: usize,
        /// What it measured.
        result: &'a RunResult,
    },
}

/// One run of one peer.
pub fn run_once(spec: &BenchSpec, peer: Peer) -> Result<RunResult, String> {
    if let Some(n) = spec.cores {
        let r = match peer {
            Peer::Flowstack => crate::cores::run_flowstack(spec, n),
            Peer::Kernel => crate::cores::run_kernel(spec, n),
            Peer::Smoltcp => Err("smoltcp runs on one core only".into()),
        };
        return r
            .map(|r| r.run_result(spec.workload))
            .map_err(|e| format!("{} run failed: {e}", peer.name()));
    }
    let r = match peer {
        Peer::Flowstack => match spec.link {
            BenchLink::Shm => crate::flowstack::run_shm(spec),
            BenchLink::Pipe => crate::flowstack::run_pipe(spec),
        },
        Peer::Smoltcp => crate::smol::run(
            Duration::from_secs_f64(spec.duration),
            spec.msg_size(),
            spec.opts.window.unwrap_or(1 << 20),
        ),
        Peer::Kernel => crate::kernel::run(spec),
    };
    match r {
        Ok(r) => match &r.error {
            None => Ok(r.run_result(spec.workload)),
            Some(e) => Err(format!("{} run failed: {e}", peer.name())),
        },
        Err(e) => Err(format!("{} run failed: {e}", peer.name())),
    }
}

/// Runs every peer `spec.runs` times (one peer after the other) and summarises: medians,
/// ranges, and flowstack's speedup over the other peer. `spec` should be
/// [`BenchSpec::validated`]. `Err` is the first failed run's reason.
pub fn run(spec: &BenchSpec, on: &mut dyn FnMut(Event<'_>)) -> Result<BenchReport, String> {
    let mut peers = BTreeMap::new();
    for &peer in spec.peer.peers() {
        let mut runs = Vec::with_capacity(spec.runs);
        for i in 0..spec.runs {
            on(Event::Started { peer, run: i });
            let r = run_once(spec, peer)?;
            on(Event::Finished {
                peer,
                run: i,
                result: &r,
            });
            runs.push(r);
        }
        peers.insert(peer, PeerSummary::new(spec.workload, runs));
    }
    let mut report = BenchReport {
        tool: "flowstack bench".into(),
        workload: spec.workload,
        msg_size: spec.msg_size(),
        conns: spec.conns,
        duration_s: spec.duration,
        runs: spec.runs,
        link: spec.link,
        options: spec.opts.report(),
        peers,
        speedup: None,
        speedup_vs: None,
        speedup_basis: None,
        cores: spec.cores,
        placement: spec.cores.map(crate::cores::placement),
    };
    report.compute_speedup();
    Ok(report)
}
