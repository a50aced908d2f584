//! Architectures as configurations and workloads as scripts: a [`Scenario`] becomes
//! resources and flows of the discrete-event core ([`crate::des`]), and its tally an
//! [`Outcome`].
//!
//! One message of `s` bytes from side A to side B is, in every architecture, the same
//! sequence — A's application calls the stack, the payload is copied or lent, the stack
//! sends it in segments, the medium carries them, B's side is notified, B's stack receives
//! them, B's application is handed the data — and the architecture decides *where* each step
//! runs and *what* it costs ([`Arch`]):
//!
//! | arch | API | copy | stack runs on | receive notification | hand-off to the app |
//! |---|---|---|---|---|---|
//! | kernel | system call | yes | host core (rx: the packet's core) | interrupt per packet | wake-up (cross-core if the rx core differs) |
//! | library | library call | yes | host core (rx: the packet's core) | interrupt per packet | wake-up |
//! | percore | library call | no (zero-copy) | the flow's core (RSS) | polling | polling loop turn |
//! | offload[:E] | ring post | over the bus | E stack cores at `ratio`x | interrupt per *message* | wake-up |
//! | daemon[:E] | ring post | over the bus (shared memory) | E stack cores at `ratio`x | event ring | polling loop turn |

pub use crate::arch::{Api, Arch, Handoff, Notify};
use crate::calib::Calibration;
use crate::des::{Des, Flow, Kind, Rng, Tally};
use serde::{Deserialize, Serialize};

/// What the clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// One-way bulk transfer of `size`-byte writes.
    Stream,
    /// Request and response of `size` bytes each on an open connection.
    Rr,
    /// Connect, request, response (`size` bytes each), close.
    Crr,
    /// A small request, then a file of `size` bytes back (read from the page cache).
    File,
}

impl Workload {
    /// Parses `stream`, `rr`, `crr`, `file`.
    pub fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "stream" => Workload::Stream,
            "rr" => Workload::Rr,
            "crr" => Workload::Crr,
            "file" => Workload::File,
            _ => return Err(format!("unknown workload {s:?} (stream, rr, crr, file)")),
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Stream => "stream",
            Workload::Rr => "rr",
            Workload::Crr => "crr",
            Workload::File => "file",
        }
    }
}

/// Where the load generator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clients {
    /// On other machines across the link; their own costs are not simulated.
    Remote,
    /// On the same cores as the server, as `flowstack bench --cores N` runs them: flow k's
    /// client on core k mod N, both sides using the architecture, over loopback.
    Colocated,
    /// Two cores, client on core 0 and server on core 1 (`bench --kernel-placement split`).
    Split,
}

/// One simulation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scenario {
    /// The architecture.
    pub arch: Arch,
    /// The workload.
    pub workload: Workload,
    /// Message (or write, or file) size, bytes.
    pub size: usize,
    /// Host cores.
    pub cores: usize,
    /// Connections (closed loop) or clients (open loop).
    pub conns: usize,
    /// Open loop: offered transactions per second in all; `None`: closed loop.
    pub load: Option<f64>,
    /// Application work per request on the server, ns.
    pub app_ns: f64,
    /// Where the clients run.
    pub clients: Clients,
    /// Transactions to complete (the run also stops after `max_secs` simulated).
    pub txns: u64,
    /// Longest simulated time, seconds.
    pub max_secs: f64,
    /// The seed of every random choice (flow placement, arrivals, errors).
    pub seed: u64,
    /// The share of each host core this run gets (1: all of it; less when other processes
    /// compete for the cores, as on a shared machine): host cores run at this speed.
    #[serde(default = "one")]
    pub host_share: f64,
    /// The host cores' speed relative to the calibration's (1: as fast as when the
    /// calibration runs were made). A shared VM's vCPUs run faster or slower from one
    /// minute to the next; the validation measures it with a probe run beside each bench
    /// run ([`crate::fit::loop_speed`]).
    #[serde(default = "one")]
    pub host_speed: f64,
    /// The share of its core each stack core gets where it runs on a host core (a daemon's
    /// engine thread on a CPU of its own): `None`, the host cores' `host_share`. The
    /// validation measures it per CPU (`bench --peer offload` puts the daemon on cpu 0 and
    /// the applications on cpu 1, and other processes load the two differently).
    #[serde(default)]
    pub engine_share: Option<f64>,
    /// Colocated clients, flows not steered to their core (the kernel's `SO_REUSEPORT`):
    /// the server core of each connection, instead of the seeded hash (to predict each
    /// placement a run can get).
    #[serde(default)]
    pub server_cores: Option<Vec<usize>>,
}

fn one() -> f64 {
    1.0
}

impl Scenario {
    /// A closed-loop scenario with remote clients and the defaults (four connections per
    /// core, one per core for stream).
    pub fn new(arch: Arch, workload: Workload, size: usize, cores: usize) -> Self {
        Scenario {
            arch,
            workload,
            size,
            cores,
            conns: cores.max(1) * if workload == Workload::Stream { 1 } else { 4 },
            load: None,
            app_ns: 0.0,
            clients: Clients::Remote,
            txns: 20_000,
            max_secs: 10.0,
            seed: 1,
            host_share: 1.0,
            host_speed: 1.0,
            engine_share: None,
            server_cores: None,
        }
    }
}

/// What a simulation predicts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    /// Architecture name.
    pub arch: String,
    /// Workload name.
    pub workload: String,
    /// Size, bytes.
    pub size: usize,
    /// Host cores.
    pub cores: usize,
    /// Offered load (open loop), per s.
    pub load: Option<f64>,
    /// Completed transactions per second (connections/s for crr).
    pub per_s: f64,
    /// Payload throughput, Mbit/s.
    pub mbps: f64,
    /// Mean response time, µs.
    pub mean_us: f64,
    /// Median response time, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Host CPU busy, share of all host cores (0..1).
    pub host_util: f64,
    /// Host CPU time spent on protocol work per transaction, µs (everything but the
    /// application's own work).
    pub host_protocol_us_per_txn: f64,
    /// Host CPU per transaction by category, µs.
    pub host_us_by_cat: Vec<(String, f64)>,
    /// Stack cores busy, share (offload; 0 otherwise).
    pub engine_util: f64,
    /// Stack cores' CPU per transaction, µs: their work and, for a daemon's cores that
    /// sleep ([`HostCosts::engine_spin_ns`](crate::calib::HostCosts::engine_spin_ns)), the
    /// spin before they found work or slept — the daemon thread's CPU time, as `bench
    /// --peer offload` measures it (`stack_cpu_us_per_req`).
    #[serde(default)]
    pub stack_cpu_us_per_txn: f64,
    /// Link busy, share.
    pub link_util: f64,
    /// Simulated seconds.
    pub sim_secs: f64,
    /// Transactions completed.
    pub completed: u64,
}

mod builder;
mod script;

use builder::{Builder, Places, Side};
use script::script;

fn hash(seed: u64, k: usize) -> u64 {
    let mut r = Rng::new(seed.wrapping_mul(0x100_0000_01b3) ^ k as u64);
    r.next_u64()
}

/// Builds the simulator for `sc` under `cal`.
fn build(sc: &Scenario, cal: &Calibration) -> Result<(Des, Vec<usize>, Vec<usize>), String> {
    if sc.cores == 0 || sc.conns == 0 || sc.size == 0 {
        return Err("a scenario needs cores, connections and a size of at least 1".into());
    }
    if !(sc.host_share > 0.0 && sc.host_share <= 1.0) {
        return Err("the host share must be in (0, 1]".into());
    }
    if !(sc.host_speed > 0.0 && sc.host_speed <= 100.0) {
        return Err("the host speed must be in (0, 100]".into());
    }
    if sc.engine_share.is_some_and(|e| !(e > 0.0 && e <= 1.0)) {
        return Err("the stack cores' share must be in (0, 1]".into());
    }
    let host_speed = sc.host_share * sc.host_speed;
    let a = &sc.arch;
    let mut d = Des::new(sc.seed);
    let host_cores = match sc.clients {
        Clients::Split => 2,
        _ => sc.cores,
    };
    let hosts: Vec<usize> = (0..host_cores)
        .map(|i| d.resource(format!("host{i}"), Kind::HostCore, host_speed))
        .collect();
    if a.handoff != Handoff::Poll {
        // Threads that block and are woken share the host cores under the OS scheduler; a
        // polling architecture runs one loop per core.
        for &h in &hosts {
            d.threads(h, cal.host.sched_slice_ns);
        }
    }
    let engine_speed = a.engine_ratio
        * if a.engines_on_host {
            sc.engine_share.unwrap_or(sc.host_share) * sc.host_speed
        } else {
            1.0
        };
    let engines: Vec<usize> = (0..a.engines)
        .map(|i| d.resource(format!("engine{i}"), Kind::StackCore, engine_speed))
        .collect();
    if a.engines_on_host && cal.host.engine_spin_ns > 0.0 {
        // A daemon's engine thread spins, then sleeps until a doorbell wakes it.
        for &e in &engines {
            d.sleeps(e, cal.host.engine_spin_ns, cal.host.cross_core_ns);
        }
    }
    let remote = sc.clients == Clients::Remote;
    let link = remote.then(|| d.resource("link", Kind::Link, 1.0));
    let bus = (!engines.is_empty()).then(|| d.resource("bus", Kind::Bus, 1.0));
    let lock = (a.shared_conn_lock && sc.workload == Workload::Crr).then(|| d.lock());
    // The kernel's clients on this host connect to one address: its ephemeral ports limit
    // the connection rate. Simulated as a pool held at most a millisecond (the same tokens
    // per second), so that a run of a few thousand connections reaches the steady state.
    let h = &cal.host;
    let ports = (a.kernel_stack
        && sc.clients != Clients::Remote
        && sc.workload == Workload::Crr
        && h.connect_ports >= 1.0
        && h.port_reuse_ns > 0.0)
        .then(|| {
            let tokens = (h.connect_ports * (1e6 / h.port_reuse_ns).min(1.0)).ceil();
            let hold = tokens / h.connect_ports * h.port_reuse_ns;
            d.pool("ports", tokens as usize, hold)
        });
    let stack = if a.kernel_stack {
        &cal.kernel
    } else {
        cal.flowstack()
    };
    // In a single-core run the lock's line never moves.
    let mut cal2 = cal.clone();
    if host_cores <= 1 {
        cal2.host.bounce_ns = 0.0;
    } else {
        cal2.host.bounce_ns *= (host_cores - 1) as f64 / host_cores as f64;
    }
    let n = hosts.len();
    for k in 0..sc.conns {
        let h = hash(sc.seed, k);
        let (c_app, s_app) = match sc.clients {
            Clients::Remote => (None, hosts[k % n]),
            Clients::Colocated => {
                // Per-core listeners: flowstack's RSS-aware ports keep the server on the
                // client's core; the kernel's SO_REUSEPORT hash picks any listener.
                let s = match &sc.server_cores {
                    Some(v) if !a.flow_affinity => v.get(k).copied().unwrap_or(k) % n,
                    _ if a.flow_affinity => k % n,
                    _ => (h % n as u64) as usize,
                };
                (Some(hosts[k % n]), hosts[s])
            }
            Clients::Split => (Some(hosts[0]), hosts[1]),
        };
        let s_rx = if a.flow_affinity || !remote {
            s_app
        } else {
            hosts[((h >> 17) % n as u64) as usize]
        };
        let engine = (!engines.is_empty()).then(|| engines[(h % engines.len() as u64) as usize]);
        let places = Places {
            c_app,
            c_rx: c_app,
            s_app,
            s_rx,
            engine,
            link,
            bus,
            lock,
            ports,
        };
        let mut b = Builder {
            cal: &cal2,
            arch: a,
            stack,
            p: places,
            steps: vec![],
            remote,
            error_rate: if remote { cal.link.error_rate } else { 0.0 },
            observe_at: None,
            flow: k as u32,
            who: Side::Client,
        };
        let (arrivals, bytes) = script(&mut b, sc);
        d.flow(Flow {
            script: b.steps,
            arrivals,
            bytes,
            observe_at: b.observe_at,
        });
    }
    Ok((d, hosts, engines))
}

fn pct(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i] as f64 / 1e6
}

/// Runs one scenario.
pub fn simulate(sc: &Scenario, cal: &Calibration) -> Result<Outcome, String> {
    let (d, hosts, engines) = build(sc, cal)?;
    let until = (sc.max_secs * 1e12) as u64;
    let t = d.run(until, sc.txns);
    Ok(outcome(sc, &t, &hosts, &engines))
}

/// Runs one scenario and returns the raw tally too (for tests of the accounting).
pub fn simulate_tally(sc: &Scenario, cal: &Calibration) -> Result<Tally, String> {
    let (d, _, _) = build(sc, cal)?;
    Ok(d.run((sc.max_secs * 1e12) as u64, sc.txns))
}

fn outcome(sc: &Scenario, t: &Tally, hosts: &[usize], engines: &[usize]) -> Outcome {
    let secs = (t.end_ps as f64 / 1e12).max(1e-12);
    let mut lat = t.latencies_ps.clone();
    lat.sort_unstable();
    let n = t.completed.max(1) as f64;
    let mut by_cat = vec![];
    let mut protocol = 0u64;
    let mut busy = 0u64;
    for c in crate::des::CATS {
        let ps: u64 = hosts
            .iter()
            .map(|&h| t.resources[h].busy_ps[c as usize])
            .sum();
        busy += ps;
        if c.is_protocol_cpu() {
            protocol += ps;
        }
        if ps > 0 {
            by_cat.push((c.name().to_string(), ps as f64 / 1e6 / n));
        }
    }
    // Spinning on a lock another core holds is host CPU too.
    let spin: u64 = hosts.iter().map(|&h| t.resources[h].spin_ps).sum();
    if spin > 0 {
        busy += spin;
        protocol += spin;
        by_cat.push(("lock spin".to_string(), spin as f64 / 1e6 / n));
    }
    let engine_busy: u64 = engines.iter().map(|&e| t.resources[e].busy()).sum();
    let engine_spin: u64 = engines.iter().map(|&e| t.resources[e].idle_spin_ps).sum();
    let link_busy: u64 = t
        .resources
        .iter()
        .filter(|r| r.kind == Kind::Link)
        .map(|r| r.busy())
        .sum();
    Outcome {
        arch: sc.arch.name.clone(),
        workload: sc.workload.name().into(),
        size: sc.size,
        cores: sc.cores,
        load: sc.load,
        per_s: t.completed as f64 / secs,
        mbps: t.bytes as f64 * 8.0 / secs / 1e6,
        mean_us: lat.iter().map(|&l| l as f64).sum::<f64>() / lat.len().max(1) as f64 / 1e6,
        p50_us: pct(&lat, 0.5),
        p99_us: pct(&lat, 0.99),
        host_util: busy as f64 / (t.end_ps.max(1) as f64 * hosts.len() as f64),
        host_protocol_us_per_txn: protocol as f64 / 1e6 / n,
        host_us_by_cat: by_cat,
        engine_util: if engines.is_empty() {
            0.0
        } else {
            engine_busy as f64 / (t.end_ps.max(1) as f64 * engines.len() as f64)
        },
        stack_cpu_us_per_txn: (engine_busy + engine_spin) as f64 / 1e6 / n,
        link_util: link_busy as f64 / t.end_ps.max(1) as f64,
        sim_secs: secs,
        completed: t.completed,
    }
}
