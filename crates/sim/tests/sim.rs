//! The simulator's own checks: the same seed gives the same output; every resource's work
//! is conserved to the picosecond; a single queue matches M/D/1's closed form; the fit
//! reproduces the runs it was fitted to; seed 001's reduction is reproduced.

mod common;

use common::{input, vm};
use flowstack_prof::report::{from_json, BenchReport, ProfileReport};
use flowstack_sim::calib::preset;
use flowstack_sim::des::{Arrivals, Cat, Des, Flow, Kind, Step};
use flowstack_sim::fit::{
    calibrate, effective_share, merge_cal_runs, merge_offload_runs, offload_scenario,
    predict_metric, predict_p50, workload_of, CalRun, OffloadCalRun, OffloadReport, CAL_CONFIGS,
    OFFLOAD_CAL, OFFLOAD_STREAM_CAL,
};
use flowstack_sim::model::simulate_tally;
use flowstack_sim::{seed001, simulate, Arch, Calibration, Clients, Scenario, Workload};

fn seed001_cal() -> Calibration {
    Calibration::from_json(preset("seed001").unwrap()).unwrap()
}

fn open_rr(arch: &str, seed: u64) -> Scenario {
    let mut sc = Scenario::new(Arch::parse(arch).unwrap(), Workload::Rr, 512, 4);
    sc.conns = 16;
    sc.load = Some(200_000.0);
    sc.txns = 5_000;
    sc.seed = seed;
    sc
}

#[test]
fn the_same_seed_gives_the_same_output_and_another_seed_another() {
    for arch in ["kernel", "library", "percore", "offload:2@0.5"] {
        let a = serde_json::to_string(&simulate(&open_rr(arch, 7), &vm()).unwrap()).unwrap();
        let b = serde_json::to_string(&simulate(&open_rr(arch, 7), &vm()).unwrap()).unwrap();
        assert_eq!(a, b, "{arch}");
        let c = serde_json::to_string(&simulate(&open_rr(arch, 8), &vm()).unwrap()).unwrap();
        assert_ne!(a, c, "{arch}: Poisson arrivals depend on the seed");
    }
}

#[test]
fn work_in_equals_work_done_plus_work_queued_on_every_resource() {
    let mut queued_somewhere = false;
    for (arch, w) in [
        ("kernel", Workload::Crr),
        ("offload:2", Workload::Stream),
        ("percore", Workload::Rr),
        ("library", Workload::File),
    ] {
        let mut sc = Scenario::new(Arch::parse(arch).unwrap(), w, 4096, 4);
        sc.conns = 32;
        // Overloaded and cut short: work is left in the queues and in service.
        sc.load = Some(3e5);
        sc.max_secs = 0.01;
        sc.txns = u64::MAX;
        let t = simulate_tally(&sc, &vm()).unwrap();
        assert!(t.completed > 0 && t.started >= t.completed, "{arch}");
        for r in &t.resources {
            assert_eq!(
                r.submitted_ps,
                r.busy() + r.queued_ps,
                "{arch} {}: submitted = done + queued",
                r.name
            );
            queued_somewhere |= r.queued_ps > 0;
        }
    }
    assert!(queued_somewhere, "the check saw work still queued");
}

/// M/D/1: Poisson arrivals at λ, one server with deterministic service D (μ = 1/D):
/// W_q = ρ / (2 μ (1 − ρ)).
#[test]
fn a_single_queue_matches_the_m_d_1_mean_waiting_time() {
    for (rho, tol) in [(0.3, 0.04), (0.5, 0.04), (0.8, 0.06)] {
        let d_ns = 1000.0;
        let mu = 1e9 / d_ns;
        let lambda = rho * mu;
        let mut des = Des::new(42);
        let q = des.resource("q", Kind::HostCore, 1.0);
        des.flow(Flow {
            script: vec![Step {
                res: Some(q),
                ns: d_ns,
                cat: Cat::Stack,
                lock: None,
                detached: false,
                thread: None,
            }],
            arrivals: Arrivals::Open { per_s: lambda },
            bytes: 0,
            observe_at: None,
        });
        let t = des.run(u64::MAX, 400_000);
        let wq_ns = t.resources[q].mean_wait_ns();
        let closed = rho / (2.0 * mu * (1.0 - rho)) * 1e9;
        assert!(
            (wq_ns - closed).abs() / closed < tol,
            "rho {rho}: simulated W_q {wq_ns:.1} ns vs closed form {closed:.1} ns"
        );
        // And the server was busy ρ of the time.
        let util = t.resources[q].busy() as f64 / t.end_ps as f64;
        assert!((util - rho).abs() < 0.01, "utilisation {util} vs {rho}");
    }
}

#[test]
fn the_fit_reproduces_the_runs_it_was_fitted_to() {
    let profile: ProfileReport = from_json(&input("profile.json")).unwrap();
    let shares: std::collections::BTreeMap<String, f64> =
        serde_json::from_str(&input("shares.json")).unwrap();
    let runs: Vec<CalRun> = CAL_CONFIGS
        .iter()
        .map(|c| CalRun {
            report: from_json::<BenchReport>(&input(c.file)).unwrap(),
            clients: c.clients,
            share: shares[c.file],
        })
        .collect();
    let offload = OffloadCalRun {
        report: serde_json::from_str::<OffloadReport>(&input(OFFLOAD_CAL.0)).unwrap(),
        share: shares[OFFLOAD_CAL.0],
        daemon_share: shares.get(&format!("{}@cpu0", OFFLOAD_CAL.0)).copied(),
    };
    let stream = OffloadCalRun {
        report: serde_json::from_str::<OffloadReport>(&input(OFFLOAD_STREAM_CAL.0)).unwrap(),
        share: shares[OFFLOAD_STREAM_CAL.0],
        daemon_share: shares
            .get(&format!("{}@cpu0", OFFLOAD_STREAM_CAL.0))
            .copied(),
    };
    let cal = calibrate(&profile, &runs, &[offload.clone(), stream.clone()]).unwrap();
    // The shipped preset is this fit.
    assert_eq!(
        cal.host,
        vm().host,
        "presets/vm.json is the fit of presets/vm-inputs"
    );
    // The offload run: the applications' CPU per request and the rate.
    let m = offload.report.offload().unwrap();
    let whole = simulate(&offload_scenario(Workload::Rr, OFFLOAD_CAL.1, 1.0), &cal).unwrap();
    assert!(
        (whole.host_protocol_us_per_txn - m.app_cpu_us_per_req).abs() / m.app_cpu_us_per_req < 0.03,
        "offload app CPU {} vs {}",
        whole.host_protocol_us_per_txn,
        m.app_cpu_us_per_req
    );
    // ... its median (the wake-up's latency): bracketed by the fitted value ±1 % (the
    // median steps where the daemon's engine starts to sleep between requests — its 50 µs
    // spin runs out — and the fit may sit on that step).
    let p50_at = |f: f64| {
        let mut c = cal.clone();
        c.host.app_wake_ns *= f;
        simulate(&offload_scenario(Workload::Rr, OFFLOAD_CAL.1, 1.0), &c)
            .unwrap()
            .p50_us
    };
    let (lo, hi) = (p50_at(0.99), p50_at(1.01));
    assert!(
        lo <= m.p50_us * 1.03 && m.p50_us <= hi * 1.03,
        "offload p50 {lo}..{hi} vs {}",
        m.p50_us
    );
    // The rate: one over the mean, the model's (tail-less) median times the measured tail;
    // the daemon's work per wake-up is fitted to it unless the applications' CPU already
    // explains it (then it is 0 and the rate is not above the measurement).
    let at =
        flowstack_sim::validate::offload_metric(&cal, Workload::Rr, OFFLOAD_CAL.1, offload.share)
            .unwrap();
    let tail = 1e6 / m.per_sec / m.p50_us;
    assert!(
        (cal.host.tail() - tail.max(1.0)).abs() < 1e-9,
        "tail {tail}"
    );
    if cal.host.stack_op_ns > 0.0 {
        assert!(
            (at - m.per_sec).abs() / m.per_sec < 0.03,
            "offload rate {at} vs {}",
            m.per_sec
        );
    } else {
        assert!(at <= m.per_sec * 1.03, "{at} vs {}", m.per_sec);
    }
    // The stream run: the applications' and the daemon's CPU per write (whole cores).
    assert_eq!(
        cal.bus,
        vm().bus,
        "presets/vm.json is the fit of presets/vm-inputs"
    );
    let ms = stream.report.offload().unwrap();
    let ws = simulate(
        &offload_scenario(Workload::Stream, OFFLOAD_STREAM_CAL.1, 1.0),
        &cal,
    )
    .unwrap();
    assert!(
        (ws.host_protocol_us_per_txn - ms.app_cpu_us_per_req).abs() / ms.app_cpu_us_per_req < 0.03,
        "offload stream app CPU per write {} vs {}",
        ws.host_protocol_us_per_txn,
        ms.app_cpu_us_per_req
    );
    // ... and its rate at its share, unless the applications' core already explains it.
    let st = stream
        .metric(&cal, Workload::Stream, OFFLOAD_STREAM_CAL.1)
        .unwrap();
    let want = ms.gbit_s * 1000.0;
    if cal.host.daemon_per_byte_ns > 0.0 {
        assert!(
            (st - want).abs() / want < 0.03,
            "offload stream {st} vs {want}"
        );
    } else {
        assert!(st <= want * 1.03, "offload stream {st} vs {want}");
    }
    for r in &runs {
        if r.clients == Clients::Split {
            // Fitted to its median response time (see fit's module docs).
            let s = &r.report.peers[&flowstack_prof::report::Peer::Kernel];
            let m = s.latency.unwrap().p50_us;
            let p = predict_p50(
                &cal,
                flowstack_prof::report::Peer::Kernel,
                Workload::Rr,
                r.report.msg_size,
                2,
                1,
                Clients::Split,
            )
            .unwrap();
            assert!(
                (p - m).abs() / m < 0.03,
                "split p50: predicted {p} vs measured {m}"
            );
            continue;
        }
        for (&peer, s) in &r.report.peers {
            if peer == flowstack_prof::report::Peer::Flowstack
                && r.report.workload == flowstack_prof::report::Workload::Rr
            {
                // The loop's turn is fitted to the median response time.
                let m = s.latency.unwrap().p50_us;
                let p = predict_p50(
                    &cal,
                    peer,
                    Workload::Rr,
                    r.report.msg_size,
                    1,
                    r.report.conns,
                    Clients::Colocated,
                )
                .unwrap();
                assert!((p - m).abs() / m < 0.03, "flowstack rr p50: {p} vs {m}");
                continue;
            }
            let cores = if r.clients == Clients::Split { 2 } else { 1 };
            // A kernel crr run that took fewer ports than were free is simulated without
            // the port limit (`ports_left_free`).
            let mut c = cal.clone();
            if r.report.workload == flowstack_prof::report::Workload::Crr
                && flowstack_sim::fit::ports_left_free(r, &cal)
            {
                flowstack_sim::fit::port_free(&mut c);
            }
            let p = predict_metric(
                &c,
                effective_share(r),
                peer,
                workload_of(r.report.workload),
                r.report.msg_size,
                cores,
                r.report.conns,
                r.clients,
            )
            .unwrap();
            let m = s.metric();
            assert!(
                (p - m).abs() / m < 0.03,
                "{} {}: predicted {p} vs measured {m}",
                peer.name(),
                r.report.workload.name()
            );
        }
    }
}

#[test]
fn seed_001_host_cpu_reduction_is_reproduced_within_ten_points() {
    let r = seed001::reproduce(&seed001_cal()).unwrap();
    assert!(r.within_band, "{r:?}");
    let p = &r.points[0];
    assert!(
        p.host_us[2] < p.host_us[1] && p.host_us[1] <= p.host_us[0],
        "{p:?}"
    );
    // Packet errors only add work where the host runs the stack.
    let last = r.points.last().unwrap();
    assert!(last.host_us[0] > p.host_us[0] * 1.05);
    assert_eq!(last.host_us[2], p.host_us[2]);
    assert!(last.reduction > p.reduction);
}

#[test]
fn the_kernel_stops_scaling_on_crr_where_per_core_engines_do_not() {
    let rate = |arch: &str, cores: usize| {
        let mut sc = Scenario::new(Arch::parse(arch).unwrap(), Workload::Crr, 64, cores);
        sc.txns = 20_000;
        simulate(&sc, &vm()).unwrap().per_s
    };
    let (k8, k16) = (rate("kernel", 8), rate("kernel", 16));
    let (p1, p8) = (rate("percore", 1), rate("percore", 8));
    assert!(k16 < k8 * 1.1, "kernel: {k8} at 8 cores, {k16} at 16");
    assert!(p8 > p1 * 7.0, "percore: {p1} at 1 core, {p8} at 8");
}

#[test]
fn a_slower_nic_processor_lowers_offload_throughput() {
    let mbps = |ratio: f64| {
        let mut a = Arch::parse("offload:1").unwrap();
        a.engine_ratio = ratio;
        let mut sc = Scenario::new(a, Workload::Stream, 65536, 1);
        sc.txns = 20_000;
        // A NIC that moves the payload by DMA (the preset's host cost per byte is the
        // daemon's applications' copy into shared memory).
        let mut cal = vm();
        cal.bus.host_per_byte_ns = 0.0;
        simulate(&sc, &cal).unwrap().mbps
    };
    let (slow, fast) = (mbps(0.1), mbps(1.0));
    assert!(slow < fast * 0.7, "{slow} vs {fast}");
}

#[test]
fn architectures_and_workloads_parse_and_misuse_is_refused() {
    assert_eq!(Arch::parse("offload:4@0.25").unwrap().engines, 4);
    assert_eq!(Arch::parse_for("offload:c/4", 16).unwrap().engines, 4);
    assert_eq!(Arch::parse_for("offload:c/4", 2).unwrap().engines, 1);
    for bad in ["nic", "kernel:2", "offload:0", "offload:1@0", "offload:x"] {
        assert!(Arch::parse(bad).is_err(), "{bad}");
    }
    assert!(Workload::parse("udp").is_err());
    let mut sc = Scenario::new(Arch::parse("kernel").unwrap(), Workload::Rr, 64, 0);
    assert!(simulate(&sc, &vm()).is_err());
    sc.cores = 1;
    sc.host_share = 0.0;
    assert!(simulate(&sc, &vm()).is_err());
}

#[test]
fn the_drive_loop_sees_the_response_one_turn_before_the_cycle_ends() {
    // bench --cores 1 (flowstack): four loop turns per rr transaction; the client's time
    // stamp is taken before the fourth turn's receive work.
    let cal = vm();
    let mut sc = Scenario::new(Arch::parse("percore").unwrap(), Workload::Rr, 64, 1);
    sc.conns = 1;
    sc.clients = Clients::Colocated;
    sc.txns = 2_000;
    let o = simulate(&sc, &cal).unwrap();
    let f = cal.flowstack();
    let send = f.send_fixed_ns + 64.0 * f.send_per_byte_ns;
    let recv = f.recv_fixed_ns + 64.0 * f.recv_per_byte_ns;
    let turn = cal.host.poll_turn_ns;
    let cycle_us = (4.0 * turn + 2.0 * send + 2.0 * recv) / 1e3;
    assert!(
        (1e6 / o.per_s - cycle_us).abs() < 1e-3,
        "{} vs {cycle_us}",
        1e6 / o.per_s
    );
    let p50 = cycle_us - (turn + recv) / 1e3;
    assert!((o.p50_us - p50).abs() < 1e-3, "p50 {} vs {p50}", o.p50_us);
}

#[test]
fn the_median_of_runs_over_random_placements_is_the_most_likely_median() {
    use flowstack_sim::validate::{median_of_runs, placements};
    assert_eq!(placements(2, 2).len(), 4);
    assert_eq!(placements(2, 2)[1], vec![0, 1]);
    // Three runs over {10: 1/4, 20: 1/2, 30: 1/4}: the median is 20 with probability 11/16.
    let d = [(0.25, 30.0), (0.5, 20.0), (0.25, 10.0)];
    assert_eq!(median_of_runs(&d, 3), 20.0);
    // One run: the distribution's own median.
    assert_eq!(median_of_runs(&[(0.6, 1.0), (0.4, 2.0)], 1), 1.0);
    assert_eq!(median_of_runs(&[(0.4, 1.0), (0.6, 2.0)], 1), 2.0);
}

/// Kernel rr, `--cores 2`, both servers on core 0 (one connection local, one from core 1):
/// with the scheduler the local pair's thread keeps core 0 from its wake-up until it
/// blocks, so the cross-core server runs between the local pair's transactions and not
/// between each of their steps: a local transaction either takes its whole time alone (as
/// in the all-local placement) or waits for a whole turn of the other server. Served job by
/// job (a slice of 1 ps) the cross-core server's steps come between the local pair's steps,
/// and response times between those two appear.
///
/// The costs are the test's own (what the property needs: a wake-up, a cross-core latency,
/// a copy and the kernel's segment costs), not the preset's. The placement's *median* is not
/// asserted: its response times are three modes — the local pair alone, the local pair
/// behind one turn of the cross-core server, the cross-core connection — and about half of
/// the transactions are in the first, so the median sits on the edge between the first two
/// modes and jumps from one to the other when a cost moves the first mode's share across
/// one half (with the vm preset of 2026-11-23 it was the first, 13.9 µs; with that of
/// 2026-11-27 07:27 UTC, a 32 % dearer wake-up, the second: 25.1 µs where the all-local
/// placement has 16.7). That placement is printed by `--validate`, not validated.
#[test]
fn with_the_scheduler_a_cross_core_server_does_not_slow_the_local_pair_step_by_step() {
    let mut cal = vm();
    cal.host.syscall_ns = 200.0;
    cal.host.wakeup_ns = 4_000.0;
    cal.host.cross_core_ns = 15_000.0;
    cal.host.copy_per_byte_ns = 0.1;
    cal.host.interrupt_ns = 1_000.0;
    let k = &mut cal.kernel;
    (k.send_fixed_ns, k.recv_fixed_ns) = (1_000.0, 1_000.0);
    (k.send_per_byte_ns, k.recv_per_byte_ns) = (0.0, 0.0);
    (k.ctrl_send_ns, k.ctrl_recv_ns) = (700.0, 700.0);
    k.write_ns = 0.0;
    // Each transaction's response time, sorted.
    let run = |slice_ns: f64, servers: Vec<usize>| {
        let mut c = cal.clone();
        c.host.sched_slice_ns = slice_ns;
        let mut sc = Scenario::new(Arch::parse("kernel").unwrap(), Workload::Rr, 64, 2);
        sc.conns = 2;
        sc.clients = Clients::Colocated;
        sc.txns = 6000;
        sc.server_cores = Some(servers);
        let mut l: Vec<f64> = simulate_tally(&sc, &c)
            .unwrap()
            .latencies_ps
            .iter()
            .map(|&x| x as f64 / 1e6)
            .collect();
        l.sort_by(f64::total_cmp);
        l
    };
    let local = run(1.5e6, vec![0, 1]);
    let alone = local[local.len() / 2];
    assert!(
        (local[0] - alone).abs() < 0.01 * alone,
        "all local: every transaction alike ({} .. {alone})",
        local[0]
    );
    let at_alone = |l: &[f64]| {
        l.iter()
            .filter(|&&x| (x - alone).abs() < 0.01 * alone)
            .count() as f64
            / l.len() as f64
    };
    let mixed = run(1.5e6, vec![0, 0]);
    assert!(
        at_alone(&mixed) > 0.3,
        "mixed: {:.2} of the transactions as fast as the local pair alone ({alone} us)",
        at_alone(&mixed)
    );
    // The rest of the local pair's transactions wait for one whole turn of the other
    // server: no response time lies between the two.
    let turn = mixed.iter().copied().find(|&x| x > 1.01 * alone).unwrap();
    assert!(turn > 1.3 * alone, "{turn} vs {alone}");
    let between = |l: &[f64]| {
        l.iter()
            .filter(|&&x| x > 1.01 * alone && x < 0.99 * turn)
            .count() as f64
            / l.len() as f64
    };
    assert_eq!(between(&mixed), 0.0);
    // Job by job, the other server's steps come between the local pair's steps: response
    // times between the two modes.
    let fifo = run(1e-3, vec![0, 0]);
    assert!(
        between(&fifo) > 0.05,
        "job by job: {:.2} between {alone} and {turn} us",
        between(&fifo)
    );
}

/// `--validate --fresh` fits to two calibration passes, before and after the validation
/// runs: each peer's median over both passes' runs, at their mean share.
#[test]
fn two_calibration_passes_are_fitted_as_one_run_of_both_passes_runs() {
    let c = CAL_CONFIGS[0];
    let a = CalRun {
        report: from_json::<BenchReport>(&input(c.file)).unwrap(),
        clients: c.clients,
        share: 0.4,
    };
    let mut b = a.clone();
    b.share = 0.2;
    for s in b.report.peers.values_mut() {
        for r in &mut s.run_results {
            r.metric *= 3.0;
        }
    }
    let m = merge_cal_runs(&a, &b);
    assert!((m.share - 0.3).abs() < 1e-12);
    for (peer, s) in &m.report.peers {
        let n = a.report.peers[peer].run_results.len();
        assert_eq!(s.run_results.len(), 2 * n);
        let mut all: Vec<f64> = s.run_results.iter().map(|r| r.metric).collect();
        all.sort_by(f64::total_cmp);
        let median = if all.len() % 2 == 1 {
            all[all.len() / 2]
        } else {
            0.5 * (all[all.len() / 2 - 1] + all[all.len() / 2])
        };
        assert!((s.metric() - median).abs() < 1e-9 * median.max(1.0));
        assert!(s.metric() > a.report.peers[peer].metric());
    }
    let o = OffloadCalRun {
        report: serde_json::from_str::<OffloadReport>(&input(OFFLOAD_CAL.0)).unwrap(),
        share: 0.5,
        daemon_share: None,
    };
    let mut o2 = o.clone();
    o2.share = 0.3;
    for p in &mut o2.report.peers {
        p.app_cpu_us_per_req += 10.0;
    }
    let m = merge_offload_runs(&o, &o2);
    assert!((m.share - 0.4).abs() < 1e-12);
    let (x, y) = (o.report.offload().unwrap(), m.report.offload().unwrap());
    assert!((y.app_cpu_us_per_req - x.app_cpu_us_per_req - 5.0).abs() < 1e-9);
}

/// The kernel's loopback clients connect to one address, and a port in TIME-WAIT is reused
/// only a second later: crr at `--cores 2` runs at the even ports per second (measured
/// 14.2–14.3 k/s with 2, 4 or 8 connections), not at what its two cores could do (the model
/// without the limit: twice that and more). Remote clients (other hosts) have no such limit.
#[test]
fn the_kernels_loopback_connects_are_limited_by_its_ports_in_time_wait() {
    let mut cal = vm();
    cal.host.connect_ports = 14116.0;
    cal.host.port_reuse_ns = 1e9;
    // Connections cheap enough that two cores could make far more than the ports allow.
    cal.kernel.conn_ns = 2000.0;
    cal.host.shared_conn_ns = 1000.0;
    let sc = |clients| {
        let mut sc = Scenario::new(Arch::parse("kernel").unwrap(), Workload::Crr, 64, 2);
        // (Enough connections that the cores, not one connection's wake-ups, bound it.)
        sc.conns = 8;
        sc.clients = clients;
        sc.txns = 20_000;
        sc
    };
    let limited = simulate(&sc(Clients::Colocated), &cal).unwrap();
    assert!(
        (limited.per_s - 14116.0).abs() < 14116.0 * 0.01,
        "{}",
        limited.per_s
    );
    let mut free = cal.clone();
    free.host.port_reuse_ns = 0.0;
    let unlimited = simulate(&sc(Clients::Colocated), &free).unwrap();
    assert!(unlimited.per_s > 1.5 * 14116.0, "{}", unlimited.per_s);
    let remote = simulate(&sc(Clients::Remote), &cal).unwrap();
    let remote_free = simulate(&sc(Clients::Remote), &free).unwrap();
    assert_eq!(remote.per_s, remote_free.per_s);
}

/// Stream writes coalesce into full segments (Nagle holds a write smaller than a segment
/// while data is unacknowledged): the per-segment costs are per 64 KiB of bytes whatever
/// the write size, so flowstack's loop moves 16 KiB and 64 KiB writes at the same rate, as
/// the bench measures (0.95–1.05x) — charged per write, 64 KiB ran 1.24x faster, and the
/// 64 KiB rows fitted at 16 KiB missed by +22..+42 %.
#[test]
fn stream_writes_leave_in_full_segments_whatever_their_size() {
    let rate = |arch: &str, size| {
        let mut sc = Scenario::new(Arch::parse(arch).unwrap(), Workload::Stream, size, 1);
        sc.clients = Clients::Colocated;
        sc.txns = 4000;
        simulate(&sc, &vm()).unwrap().mbps
    };
    let f = rate("percore", 65536) / rate("percore", 16384);
    assert!((f - 1.0).abs() < 0.01, "flowstack 64 KiB / 16 KiB = {f}");
    // The kernel keeps its per-write system calls and wake-ups: a little faster at 64 KiB.
    let k = rate("kernel", 65536) / rate("kernel", 16384);
    // (With the fitted work per write, `kernel.write_ns`: the bench measures ~1.1x.)
    assert!(k > 1.0 && k < 1.25, "kernel 64 KiB / 16 KiB = {k}");
}

/// A stream's receiver reads what has arrived, per 64 KiB whatever the write size: with no
/// work per write (`kernel.write_ns` 0) 128 KiB writes run at the 64 KiB rate. (Its reads
/// and wake-ups were once per write above 64 KiB: 128 KiB writes paid half of them per
/// byte, and the copy per byte fitted to the 128 KiB calibration run predicted 64 KiB writes
/// 14 % slower, where the bench measures them alike.) The calibration's kernel stream runs
/// bracket the validated 64 KiB (`fit::KERNEL_STREAM_SIZES`), so with the fitted work per
/// write the 64 KiB rate lies between theirs.
#[test]
fn a_stream_is_read_per_64_kib_and_its_64_kib_rate_lies_between_the_calibration_sizes() {
    use flowstack_sim::fit::KERNEL_STREAM_SIZES;
    let rate = |cal: &Calibration, size: usize| {
        let mut sc = Scenario::new(Arch::parse("kernel").unwrap(), Workload::Stream, size, 1);
        sc.clients = Clients::Colocated;
        sc.txns = 4000;
        simulate(&sc, cal).unwrap().mbps
    };
    let mut flat = vm();
    flat.kernel.write_ns = 0.0;
    let f = rate(&flat, 131072) / rate(&flat, 65536);
    assert!((f - 1.0).abs() < 0.01, "128 KiB / 64 KiB = {f}");
    let (big, small) = KERNEL_STREAM_SIZES;
    assert!(small < 65536 && 65536 < big);
    let cal = vm();
    assert!(cal.kernel.write_ns > 0.0);
    let (lo, mid, hi) = (rate(&cal, small), rate(&cal, 65536), rate(&cal, big));
    assert!(lo < mid && mid < hi, "{lo} {mid} {hi}");
}

/// The kernel's stack does work per send call that does not grow with the call's bytes
/// (`kernel.write_ns`: the socket lock, appending to the send queue, the push decision), so
/// 64 KiB writes move more bytes per CPU second than 16 KiB ones — the bench measures 1.1x,
/// and 4 KiB writes at 0.7x (2026-11-27 06:43 UTC). With the per-call work taken as the
/// 200 ns system call only, the model gave 1.03x, and the 64 KiB rows fitted at 16 KiB were
/// under-predicted. Charged once per write: the time per 64 KiB grows by 16, 4 and 1 times
/// it at 4, 16 and 64 KiB writes.
#[test]
fn a_kernel_write_costs_its_per_call_work_once_whatever_its_size() {
    let per_64k_us = |cal: &Calibration, size: usize| {
        let mut sc = Scenario::new(Arch::parse("kernel").unwrap(), Workload::Stream, size, 1);
        sc.clients = Clients::Colocated;
        sc.txns = 4000;
        65536.0 * 8.0 / simulate(&sc, cal).unwrap().mbps
    };
    let mut cal = vm();
    cal.kernel.write_ns = 0.0;
    let mut heavy = cal.clone();
    heavy.kernel.write_ns = 2000.0;
    for (size, writes) in [(4096, 16.0), (16384, 4.0), (65536, 1.0)] {
        let more = per_64k_us(&heavy, size) - per_64k_us(&cal, size);
        assert!(
            (more - 2.0 * writes).abs() < 0.05 * writes,
            "{size} B writes: {more} us more per 64 KiB, want {}",
            2.0 * writes
        );
    }
    let f = |c: &Calibration| per_64k_us(c, 16384) / per_64k_us(c, 65536);
    assert!(f(&heavy) > f(&cal) + 0.05, "{} vs {}", f(&heavy), f(&cal));
    // flowstack's costs hold no such term.
    assert_eq!(vm().flowstack().write_ns, 0.0);
}

/// This VM's vCPUs run flowstack's loop at different speeds from one minute to the next (its
/// rr median at 64 B: ~1.0 µs for seconds, then ~1.6 µs, in the same process; a plain
/// arithmetic loop timed meanwhile moved by 4 %). The validation measures the speed with a
/// probe run at the calibration size beside each run: the probe's median over the
/// calibration's predicts the speed exactly, and a prediction at that speed scales every
/// step of the loop — the median by one over it, the rate at a share by it.
#[test]
fn a_probe_at_the_calibration_size_gives_the_loop_speed() {
    use flowstack_prof::report::Peer;
    use flowstack_sim::fit::{loop_speed, SPEED_PROBE_SIZE};
    use flowstack_sim::validate::{cases, predict};
    let cal = vm();
    for cores in [1, 2] {
        let mut sc = Scenario::new(
            Arch::parse("percore").unwrap(),
            Workload::Rr,
            SPEED_PROBE_SIZE,
            cores,
        );
        sc.clients = Clients::Colocated;
        sc.conns = cores;
        sc.txns = 6_000;
        sc.host_speed = 0.625;
        let slow = simulate(&sc, &cal).unwrap().p50_us;
        let s = loop_speed(&cal, cores, slow).unwrap();
        assert!((s - 0.625).abs() < 1e-3, "speed {s} at {cores} cores");
    }
    assert!(loop_speed(&cal, 1, 0.0).is_err());
    let c = cases()
        .into_iter()
        .find(|c| c.peer == Peer::Flowstack && c.workload == Workload::Rr && c.cores == 1)
        .unwrap();
    assert!(c.probed());
    let at1 = predict(&cal, &c, 0.5, 1.0, 3).unwrap();
    let at2 = predict(&cal, &c, 0.5, 2.0, 3).unwrap();
    assert!((at1.p50_us / at2.p50_us - 2.0).abs() < 1e-3);
    assert!((at2.metric / at1.metric - 2.0).abs() < 0.01);
}

/// The kernel's crr calibration run is made of short runs after a pause
/// (`CalConfig::port_budget`), so that none of them waits for a local port in TIME-WAIT,
/// and it is simulated without the port limit: its rate is then what its CPU did and
/// identifies `kernel.conn_ns`. A 1 s run takes the ports' ~14.1 k/s whatever the CPU could
/// do: simulated with the limit, any connection work below the knee fits it, and on a quiet
/// machine the fit went to 0 (and with it the shared listener's lock, and the kernel's
/// crr stall beyond 8 cores).
#[test]
fn the_kernels_connection_work_is_fitted_to_runs_that_took_fewer_ports_than_were_free() {
    use flowstack_prof::report::{Peer, PeerSummary, RunResult, Workload as W};
    use flowstack_sim::fit::{port_free, ports_left_free, PORT_BUDGET_SECS};
    let cal = vm();
    let c = CAL_CONFIGS
        .iter()
        .find(|c| c.peer == Peer::Kernel && c.workload == W::Crr)
        .unwrap();
    assert!(c.port_budget);
    // At 40 k/s a budgeted run takes fewer than the budget's ports.
    assert!(PORT_BUDGET_SECS * 40_000.0 < 0.8 * cal.host.connect_ports);
    let run = |conns_per_run: u64, secs: f64| {
        let mut report = from_json::<BenchReport>(&input(c.file)).unwrap();
        let one = RunResult {
            metric: conns_per_run as f64 / secs,
            bytes: 0,
            secs,
            transactions: conns_per_run,
            latency: None,
            intervals: vec![],
            per_core: vec![],
            summed: None,
        };
        report.peers.insert(
            Peer::Kernel,
            PeerSummary::new(W::Crr, vec![one.clone(), one.clone(), one]),
        );
        CalRun {
            report,
            clients: Clients::Colocated,
            share: 1.0,
        }
    };
    // 0.3 s at 16 k/s: 4800 ports per run; 1 s at 14.1 k/s: the ports' limit.
    let short = run(4800, 0.3);
    let long = run(14125, 1.0);
    assert!(ports_left_free(&short, &cal));
    assert!(!ports_left_free(&long, &cal));
    // Simulated without the limit, a dearer connection is slower at once; with it, the
    // ports hide it.
    let crr = |conn_ns: f64, free: bool| {
        let mut c = cal.clone();
        c.kernel.conn_ns = conn_ns;
        if free {
            port_free(&mut c);
        }
        predict_metric(
            &c,
            1.0,
            Peer::Kernel,
            Workload::Crr,
            1024,
            1,
            1,
            Clients::Colocated,
        )
        .unwrap()
    };
    assert!(
        crr(0.0, true) > 1.08 * crr(4000.0, true),
        "{} vs {}",
        crr(0.0, true),
        crr(4000.0, true)
    );
    assert!(
        crr(0.0, false) < 1.02 * crr(4000.0, false),
        "{} vs {}",
        crr(0.0, false),
        crr(4000.0, false)
    );
}
