//! `bench --cores N`: both peers split by flow over N cores, core k running shard k of the
//! client side *and* shard k of the server side, so that `--cores 1` uses one CPU for both
//! sides and `--cores 2` two, the same for each peer (a fair scaling comparison on a
//! two-CPU machine).
//!
//! - **flowstack**: per core k, one thread pinned to CPU k owns a client engine and a server
//!   engine joined by their own in-process pipe, turned alternately at one clock read per
//!   turn (as `--link pipe` does with one core). Each engine is engine k of N
//!   ([`Steering`]`{ queue: k, queues: N }`), so the client picks RSS-aware local ports: every
//!   4-tuple it opens hashes (symmetric Toeplitz, the runtime's steering rule) to queue k.
//!   The per-core pipe therefore carries exactly the frames a multi-queue NIC steering by
//!   that hash would put on queue k — the pipe stands in for a NIC with perfect RSS, no frame
//!   crosses cores, and the server engine checks it: every SYN it receives is hashed and
//!   one naming another queue is counted (`misdirected_syns`, 0 in every run). Nothing is
//!   shared between cores but the start barrier.
//! - **kernel**: per core k, a server thread with its own `SO_REUSEPORT` listener on the
//!   one loopback port, and the core's client threads, all pinned to CPU k. The kernel
//!   spreads connections over the listeners by its own hash of the 4-tuple, so a
//!   connection's server side may run on the other core (that is how reuseport works;
//!   each listener's accepts are reported).
//!
//! After a flowstack run each core drains: its engines keep turning while virtual time
//! runs past TIME_WAIT (the engines are sans-IO, so the drain takes no wall time), and the
//! connections, timers and counters left are reported ([`EngineCounts`]): the proof that
//! nothing leaked.

use crate::flowstack::{client_of, engine_config, pipe_caps, CLIENT_IP, SERVER_IP};
use crate::spec::BenchSpec;
use flowstack_api::App;
use flowstack_apps::workload::{percentiles, ClientResult, Server, Workload};
use flowstack_link::pipe::pipe;
use flowstack_link::sys::{cpu_count, pin_to_cpu};
use flowstack_link::{Device, DeviceCaps, Instant, TxBatch};
use flowstack_prof::report::{CoreResult, EngineCounts, EnginePair, RunResult};
use flowstack_stack::{Counter, Engine, Steering};
use flowstack_wire::Duration;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

/// How long a run may overrun its duration before it is given up.
const GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Virtual seconds a core's engines are turned after the run, one second per step, until
/// nothing is left (TIME_WAIT is 60 s).
const DRAIN_STEPS: u32 = 600;

/// How the peers share the cores, for the header and the report.
pub fn placement(n: usize) -> String {
    format!(
        "{n} core(s), each running both sides: flowstack core k = one thread pinned to CPU k \
         turning client engine k and server engine k (RSS-aware ports, per-core pipe as a \
         perfectly steered NIC queue); kernel core k = one SO_REUSEPORT server thread and the \
         core's client thread(s) pinned to CPU k, over loopback"
    )
}

/// An N-core run: the cores' client results merged, and each core's share.
#[derive(Debug)]
pub struct CoresRun {
    /// Sums of the cores' counts, their latency histograms added.
    pub merged: ClientResult,
    /// Each core, in order.
    pub per_core: Vec<CoreResult>,
    /// flowstack: the engines summed over the cores.
    pub summed: Option<EnginePair>,
}

impl CoresRun {
    /// The run in the report schema.
    pub fn run_result(&self, w: Workload) -> RunResult {
        let mut r = self.merged.run_result(w);
        r.per_core = self.per_core.clone();
        r.summed = self.summed.clone();
        r
    }
}

/// Connections of core `k` of `n` when `total` are split as evenly as they go.
fn share(total: usize, n: usize, k: usize) -> usize {
    total / n + usize::from(k < total % n)
}

/// Pins this thread to core `k`'s CPU where the machine has more than one; returns it.
fn pin_core(k: usize) -> Option<usize> {
    let cpus = cpu_count();
    (cpus > 1 && pin_to_cpu(k % cpus).is_ok()).then_some(k % cpus)
}

/// One core's outcome.
struct CoreOut {
    result: ClientResult,
    cpu: Option<usize>,
    conns: usize,
    accepted: Option<u64>,
    engines: Option<EnginePair>,
}

/// Runs `f(k)` on one thread per core and merges.
fn on_cores(
    spec: &BenchSpec,
    n: usize,
    f: impl Fn(usize, &Barrier) -> Result<CoreOut, String> + Send + Sync + 'static,
) -> Result<CoresRun, String> {
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(n));
    let threads = (0..n)
        .map(|k| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::Builder::new()
                .name(format!("bench-core-{k}"))
                .spawn(move || f(k, &barrier))
                .map_err(|e| format!("core thread: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut outs = Vec::with_capacity(n);
    for t in threads {
        outs.push(
            t.join()
                .map_err(|_| "a core's thread panicked".to_string())??,
        );
    }
    merge(spec.workload, outs)
}

fn merge(w: Workload, outs: Vec<CoreOut>) -> Result<CoresRun, String> {
    let mut merged = ClientResult::default();
    let mut per_core = Vec::with_capacity(outs.len());
    let mut summed: Option<EnginePair> = None;
    for (core, o) in outs.into_iter().enumerate() {
        let r = &o.result;
        if let Some(e) = &r.error {
            return Err(format!("core {core}: {e}"));
        }
        merged.bytes += r.bytes;
        merged.transactions += r.transactions;
        merged.secs = merged.secs.max(r.secs);
        merged
            .latency
            .add(&r.latency)
            .map_err(|e| format!("latency histogram: {e}"))?;
        for (i, b) in r.intervals.iter().enumerate() {
            if merged.intervals.len() <= i {
                merged.intervals.push(0);
            }
            merged.intervals[i] += b;
        }
        if let Some(e) = &o.engines {
            summed.get_or_insert_with(EnginePair::default).merge(e);
        }
        let rr = r.run_result(w);
        per_core.push(CoreResult {
            core,
            cpu: o.cpu,
            metric: rr.metric,
            bytes: r.bytes,
            secs: r.secs,
            transactions: r.transactions,
            conns: o.conns,
            latency: if w == Workload::Rr {
                percentiles(&r.latency)
            } else {
                None
            },
            accepted: o.accepted,
            engines: o.engines,
        });
    }
    // The merged rate is the sum of the cores' rates: each core measured its own seconds.
    if w != Workload::Stream && merged.secs > 0.0 {
        let rate: f64 = per_core.iter().map(|c| c.metric).sum();
        merged.secs = merged.transactions as f64 / rate.max(1e-9);
    }
    Ok(CoresRun {
        merged,
        per_core,
        summed,
    })
}

// ---- flowstack ------------------------------------------------------------------------

/// The server engine's end of a core's pipe, hashing every SYN it receives to check that it
/// belongs to this core's queue.
struct RssCheck<D> {
    dev: D,
    steering: flowstack_runtime::Steering,
    queue: usize,
    misdirected: u64,
}

/// True for a TCP segment with SYN and without ACK in an IPv4 Ethernet frame.
fn is_syn(f: &[u8]) -> bool {
    if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[23] != 6 {
        return false;
    }
    let flags = 14 + usize::from(f[14] & 0x0f) * 4 + 13;
    f.get(flags).is_some_and(|fl| fl & 0x12 == 0x02)
}

impl<D: Device> Device for RssCheck<D> {
    fn caps(&self) -> DeviceCaps {
        self.dev.caps()
    }

    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let Self {
            dev,
            steering,
            queue,
            misdirected,
        } = self;
        dev.recv_batch(now, budget, &mut |f| {
            if is_syn(f) && steering.queue_for(f) != *queue {
                *misdirected += 1;
            }
            sink(f)
        })
    }

    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        self.dev.send_batch(now, batch)
    }

    fn poll_at(&self) -> Option<Instant> {
        self.dev.poll_at()
    }

    fn rx_pending(&self, now: Instant) -> bool {
        self.dev.rx_pending(now)
    }
}

fn counts(e: &Engine) -> EngineCounts {
    let c = e.counters();
    let opened = c.get(Counter::TcpActiveOpens) + c.get(Counter::TcpPassiveOpens);
    let left = e.tcp_connections() as u64;
    EngineCounts {
        opened,
        closed: opened.saturating_sub(left),
        connections_left: left,
        timers_left: u64::from(e.poll_at().is_some()),
        counters: c.nonzero().map(|(k, v)| (k.to_string(), v)).collect(),
    }
}

/// flowstack on `n` cores (see the [module docs](self)).
pub fn run_flowstack(spec: &BenchSpec, n: usize) -> Result<CoresRun, String> {
    let s = spec.clone();
    on_cores(spec, n, move |k, barrier| flowstack_core(&s, k, n, barrier))
}

fn flowstack_core(
    spec: &BenchSpec,
    k: usize,
    n: usize,
    barrier: &Barrier,
) -> Result<CoreOut, String> {
    let cpu = pin_core(k);
    let o = &spec.opts;
    let caps = pipe_caps(o);
    let (mut da, db) = pipe(caps, 1 << 16);
    let mut db = RssCheck {
        dev: db,
        steering: flowstack_runtime::Steering::new(n),
        queue: k,
        misdirected: 0,
    };
    let steering = Some(Steering {
        queue: k,
        queues: n,
    });
    let mut ca = engine_config(CLIENT_IP, o);
    ca.steering = steering;
    let mut cb = engine_config(SERVER_IP, o);
    cb.steering = steering;
    let (mut ea, mut eb) = (Engine::new(ca, caps), Engine::new(cb, caps));
    let server = Server::new(&mut eb, spec.workload, spec.msg_size(), !o.no_zero_copy);
    let conns = share(spec.conns, n, k);
    let mut client = client_of(spec, conns);
    barrier.wait();
    let mut server = server.map_err(|e| e.to_string())?;
    let clock = flowstack_runtime::Clock::start();
    crate::flowstack::turn_pair(
        &clock,
        (&mut ea, &mut da),
        (&mut eb, &mut db),
        &mut client,
        &mut server,
        std::time::Duration::from_secs_f64(spec.duration) + GRACE,
    )?;
    // Drain in virtual time: past every FIN exchange, retransmission and TIME_WAIT.
    let start = clock.now();
    for step in 0..DRAIN_STEPS {
        let now = start + Duration::from_secs(u64::from(step));
        for _ in 0..8 {
            ea.poll(now, &mut da);
            client.poll(now, &mut ea);
            eb.poll(now, &mut db);
            server.poll(now, &mut eb);
        }
        let idle = |e: &Engine| e.tcp_connections() == 0 && e.poll_at().is_none();
        if idle(&ea) && idle(&eb) {
            break;
        }
    }
    drop(server); // its listener stays in the table while it lives
    let engines = EnginePair {
        client: counts(&ea),
        server: counts(&eb),
        misdirected_syns: db.misdirected,
    };
    Ok(CoreOut {
        result: client.result,
        cpu,
        conns,
        accepted: None,
        engines: Some(engines),
    })
}

// ---- kernel ---------------------------------------------------------------------------

/// The kernel on `n` cores (see the [module docs](self)).
pub fn run_kernel(spec: &BenchSpec, n: usize) -> Result<CoresRun, String> {
    let local = spec.opts.kernel_placement == crate::spec::Placement::Same;
    // Core 0's listener picks the port; the others join it with SO_REUSEPORT.
    let first = reuseport_listener(0, local.then_some(0))?;
    let port = first
        .local_addr()
        .map_err(|e| format!("kernel listener: {e}"))?
        .port();
    let mut listeners = vec![Some(first)];
    for k in 1..n {
        listeners.push(Some(reuseport_listener(port, local.then_some(k))?));
    }
    let listeners = Arc::new(std::sync::Mutex::new(listeners));
    let s = spec.clone();
    on_cores(spec, n, move |k, barrier| {
        let l = listeners.lock().expect("not poisoned")[k]
            .take()
            .expect("one listener per core");
        kernel_core(&s, k, n, l, barrier)
    })
}

/// A listener of the `SO_REUSEPORT` group on `port` (0: a new port). With `incoming_cpu`
/// (`--kernel-placement same`), `SO_INCOMING_CPU`: since Linux 6.1 the group hands a
/// connection to the listener whose CPU processed its SYN when there is one
/// (`reuseport_select_sock_by_hash`), and over loopback that is the connecting client's
/// CPU — so each connection's server runs on its client's core, in every run.
fn reuseport_listener(port: u16, incoming_cpu: Option<usize>) -> Result<TcpListener, String> {
    use socket2::{Domain, Socket, Type};
    let e = |e: std::io::Error| format!("kernel SO_REUSEPORT listener: {e}");
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).map_err(e)?;
    s.set_reuse_address(true).map_err(e)?;
    s.set_reuse_port(true).map_err(e)?;
    if let Some(cpu) = incoming_cpu {
        s.set_cpu_affinity(cpu % cpu_count().max(1)).map_err(e)?;
    }
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    s.bind(&addr.into()).map_err(e)?;
    s.listen(1024).map_err(e)?;
    // accept(2) blocks at most this long (SO_RCVTIMEO), so the server sees its stop flag.
    s.set_read_timeout(Some(std::time::Duration::from_millis(20)))
        .map_err(e)?;
    Ok(s.into())
}

fn kernel_core(
    spec: &BenchSpec,
    k: usize,
    n: usize,
    l: TcpListener,
    barrier: &Barrier,
) -> Result<CoreOut, String> {
    let cpu = pin_core(k);
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    let (w, msg) = (spec.workload, spec.msg_size());
    let accepted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let (accepted, stop) = (accepted.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("bench-kernel-server-{k}"))
            .spawn(move || {
                pin_core(k);
                kernel_server(l, w, msg, k, &accepted, &stop)
            })
            .map_err(|e| e.to_string())?
    };
    let conns = share(spec.conns, n, k);
    let duration = std::time::Duration::from_secs_f64(spec.duration);
    barrier.wait();
    let start = std::time::Instant::now();
    let clients = (0..conns)
        .map(|_| {
            std::thread::Builder::new()
                .name(format!("bench-kernel-client-{k}"))
                .spawn(move || {
                    pin_core(k);
                    crate::kernel::one_conn(
                        w,
                        msg,
                        ("127.0.0.1", port),
                        start,
                        duration,
                        &std::sync::atomic::AtomicU64::new(0),
                    )
                })
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut result = ClientResult::default();
    let mut err = None;
    for c in clients {
        match c.join().map_err(|_| "client thread panicked".to_string())? {
            Ok(r) => {
                result.bytes += r.bytes;
                result.transactions += r.transactions;
                let _ = result.latency.add(&r.latency);
            }
            Err(e) => err = err.or(Some(e)),
        }
    }
    result.secs = if w == Workload::Stream {
        start.elapsed().as_secs_f64()
    } else {
        spec.duration
    };
    result.error = err;
    // Every core's clients are done before any server stops: another core's client may
    // still be served by this core's listener.
    barrier.wait();
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    Ok(CoreOut {
        result,
        cpu,
        conns,
        accepted: Some(accepted.load(Ordering::Relaxed)),
        engines: None,
    })
}

/// A core's server: accepts on its own listener; crr connections are served on this thread
/// one after the other (each is short and its client sends at once), rr and stream ones on
/// a thread of their own pinned to the same core.
fn kernel_server(
    l: TcpListener,
    w: Workload,
    msg: usize,
    k: usize,
    accepted: &AtomicU64,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 256 * 1024];
    let resp = vec![0x42u8; msg];
    while !stop.load(Ordering::Relaxed) {
        let s = match l.accept() {
            Ok((s, _)) => s,
            Err(_) => continue, // the accept timeout (or a connection that went away)
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        let _ = s.set_read_timeout(None);
        if w == Workload::Crr {
            let _ = serve_conn(s, w, &mut buf, &resp);
        } else {
            let resp = resp.clone();
            std::thread::spawn(move || {
                pin_core(k);
                let mut buf = vec![0u8; 256 * 1024];
                let _ = serve_conn(s, w, &mut buf, &resp);
            });
        }
    }
}

fn serve_conn(mut s: TcpStream, w: Workload, buf: &mut [u8], resp: &[u8]) -> std::io::Result<()> {
    if w == Workload::Stream {
        let mut n = 0u64;
        loop {
            let k = s.read(buf)?;
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        return s.write_all(&n.to_be_bytes());
    }
    s.set_nodelay(true)?;
    loop {
        match s.read_exact(&mut buf[..resp.len()]) {
            Ok(()) => s.write_all(resp)?,
            Err(_) => return Ok(()),
        }
    }
}

/// Per-core counters as `name → [core 0, core 1, …, sum]` rows, for the stop summary.
pub fn counter_rows(per_core: &[CoreResult], server: bool) -> BTreeMap<String, Vec<u64>> {
    let mut rows: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let n = per_core.len();
    for (i, c) in per_core.iter().enumerate() {
        let Some(e) = &c.engines else { continue };
        let side = if server { &e.server } else { &e.client };
        for (k, v) in &side.counters {
            let row = rows.entry(k.clone()).or_insert_with(|| vec![0; n + 1]);
            row[i] += v;
            row[n] += v;
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_split_evenly() {
        assert_eq!(
            (0..3).map(|k| share(7, 3, k)).collect::<Vec<_>>(),
            [3, 2, 2]
        );
        assert_eq!((0..2).map(|k| share(2, 2, k)).sum::<usize>(), 2);
    }

    #[test]
    fn syns_are_told_from_other_segments() {
        let mut f = vec![0u8; 54];
        f[12] = 0x08;
        f[14] = 0x45;
        f[23] = 6;
        f[47] = 0x02;
        assert!(is_syn(&f));
        f[47] = 0x12; // SYN-ACK
        assert!(!is_syn(&f));
        f[47] = 0x02;
        f[23] = 17;
        assert!(!is_syn(&f));
        assert!(!is_syn(&f[..20]));
    }
}
