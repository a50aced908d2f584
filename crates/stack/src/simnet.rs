//! Deterministic simulation at scale: one seed picks a link (MTU, segmentation offload,
//! checksum offload), a path (a narrower hop that reports with ICMP or silently drops), an
//! impairment (loss, reordering, duplication, corruption, delay) and a workload (one bulk
//! transfer, several flows in both directions at once, a request/response exchange, or the
//! peer restarting mid-transfer), runs it on [`crate::netsim`], and checks:
//!
//! - every byte arrives exactly once, in order, and every flow completes (liveness) within a
//!   virtual-time bound;
//! - a restarted peer ends the old connection with an error (reset or timed out), never a
//!   hang, and a new connection then works;
//! - afterwards nothing leaks: once TIME-WAIT has passed both engines hold no connection and
//!   no reassembly memory.
//!
//! A failing seed is a reproducible bug: `flowstack simnet --seed S` replays it.

use crate::netsim::{pattern, Net, NetConfig, PathMtu, B_IP};
use crate::{SocketError, TcpHandle};
use flowstack_link::impair::ImpairSpec;
use flowstack_link::rng::Rng;
use flowstack_link::DeviceCaps;
use flowstack_wire::{ChecksumCaps, Duration};
use std::fmt;
use std::net::SocketAddrV4;

/// What one seed runs.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The seed everything was drawn from.
    pub seed: u64,
    /// Link capabilities.
    pub caps: DeviceCaps,
    /// A narrower hop on A's path, if any.
    pub path_mtu: Option<PathMtu>,
    /// Impairment in each direction.
    pub impair: ImpairSpec,
    /// The traffic.
    pub workload: Workload,
}

/// The traffic of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Flows at once; each moves `up` bytes A→B and `down` bytes B→A.
    Flows {
        /// Concurrent connections.
        conns: usize,
        /// Bytes from A to B per connection.
        up: u64,
        /// Bytes from B to A per connection.
        down: u64,
    },
    /// B restarts (loses every connection) after `after` bytes of a bulk transfer A→B.
    Restart {
        /// Bytes B reads before it restarts.
        after: u64,
    },
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: mtu {} tso {} csum {} path {:?} impair [{}] {:?}",
            self.seed,
            self.caps.mtu,
            self.caps.max_tx_datagram > self.caps.mtu,
            if self.caps.checksum.verify_rx {
                "sw"
            } else {
                "off"
            },
            self.path_mtu,
            self.impair,
            self.workload
        )
    }
}

/// Draws the scenario of `seed`.
pub fn scenario(seed: u64) -> Scenario {
    let mut r = Rng::new(seed ^ 0x5eed_5eed_5eed_5eed);
    let mtu = [576, 1500, 1500, 1500, 4000, 9000][r.below(6)];
    let tso = r.chance(0.4);
    let caps = DeviceCaps {
        mtu,
        checksum: if r.chance(0.2) {
            ChecksumCaps::OFFLOADED
        } else {
            ChecksumCaps::SOFTWARE
        },
        max_tx_datagram: if tso { 65535 } else { mtu },
        queues: 1,
    };
    let path_mtu = if mtu > 1000 && r.chance(0.25) {
        Some(PathMtu {
            mtu: [600, 1000, 1280, 1400][r.below(4)].min(mtu - 100),
            icmp: r.chance(0.7),
        })
    } else {
        None
    };
    let mut impair = ImpairSpec::default();
    if r.chance(0.8) {
        impair.loss = r.unit() * 0.03;
        impair.reorder = if r.chance(0.5) { r.unit() * 0.05 } else { 0.0 };
        impair.dup = if r.chance(0.3) { r.unit() * 0.03 } else { 0.0 };
        // Corruption only where checksums are verified (an offloaded link trusts its frames).
        impair.corrupt = if caps.checksum.verify_rx && r.chance(0.3) {
            r.unit() * 0.005
        } else {
            0.0
        };
        impair.delay = Duration::from_micros(r.below(5000) as u64);
        impair.reorder_gap = Duration::from_micros(100 + r.below(2000) as u64);
    }
    let workload = if r.chance(0.1) {
        Workload::Restart {
            after: 10_000 + r.below(50_000) as u64,
        }
    } else {
        let conns = 1 + r.below(4);
        Workload::Flows {
            conns,
            up: r.below(200_000 / conns) as u64,
            down: if r.chance(0.5) {
                r.below(100_000 / conns) as u64
            } else {
                0
            },
        }
    };
    Scenario {
        seed,
        caps,
        path_mtu,
        impair,
        workload,
    }
}

/// What went wrong with a seed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The scenario.
    pub scenario: String,
    /// The broken check.
    pub what: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} — {}", self.scenario, self.what)
    }
}

/// What a passing seed did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    /// Payload bytes verified.
    pub bytes: u64,
    /// Virtual time simulated.
    pub virtual_time: Duration,
}

/// Virtual time a workload may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(900);

/// Runs the scenario of `seed` and checks it.
pub fn run_seed(seed: u64) -> Result<Outcome, Failure> {
    run_seed_with(seed, None)
}

/// Runs the scenario of `seed`, capturing host A's side of the link to `pcap` if given.
pub fn run_seed_with(seed: u64, pcap: Option<Box<dyn std::io::Write>>) -> Result<Outcome, Failure> {
    let sc = scenario(seed);
    let fail = |what: String| Failure {
        scenario: sc.to_string(),
        what,
    };
    let cfg = NetConfig {
        impair: sc.impair,
        seed,
        caps: sc.caps,
        path_mtu: sc.path_mtu,
        ..Default::default()
    };
    let mut net = Net::new(cfg, pcap).map_err(|e| fail(e.to_string()))?;
    let start = net.now;
    let r = match sc.workload {
        Workload::Flows { conns, up, down } => flows(&mut net, conns, up, down),
        Workload::Restart { after } => restart(&mut net, after, seed),
    };
    let _ = net.finish_pcap();
    let bytes = r.map_err(fail)?;
    // Nothing leaks: after TIME-WAIT (60 s) and the closing states' bounds, both are empty.
    net.run_until(Duration::from_secs(700), |n| {
        n.a.tcp_connections() == 0 && n.b.tcp_connections() == 0
    });
    let (ca, cb) = (net.a.tcp_connections(), net.b.tcp_connections());
    if ca != 0 || cb != 0 {
        let states: Vec<_> = net
            .a
            .tcp_iter()
            .chain(net.b.tcp_iter())
            .map(|c| c.state().to_string())
            .collect();
        return Err(fail(format!(
            "connections left: A {ca}, B {cb}: {states:?}"
        )));
    }
    if net.a.reassembly_memory() + net.b.reassembly_memory() != 0 {
        return Err(fail("reassembly memory left".into()));
    }
    Ok(Outcome {
        bytes,
        virtual_time: net.now.saturating_since(start),
    })
}

/// One flow's progress.
struct Flow {
    client: TcpHandle,
    server: Option<TcpHandle>,
    up: Dir,
    down: Dir,
}

/// One direction of a flow: what was written and read, and whether it was closed.
#[derive(Default)]
struct Dir {
    total: u64,
    sent: u64,
    got: u64,
    shut: bool,
    eof: bool,
}

/// A flow's stream byte at offset `i` (each flow and direction distinct).
fn byte(flow: usize, dir: u64, i: u64) -> u8 {
    pattern(i.wrapping_add((flow as u64) << 40).wrapping_add(dir << 56))
}

fn flows(net: &mut Net, conns: usize, up: u64, down: u64) -> Result<u64, String> {
    let listener = net.b.tcp_listen(5001, 64).map_err(|e| e.to_string())?;
    net.stamp();
    let mut fl = Vec::new();
    for _ in 0..conns {
        let client = net
            .a
            .tcp_connect(SocketAddrV4::new(B_IP.into(), 5001))
            .map_err(|e| e.to_string())?;
        fl.push(Flow {
            client,
            server: None,
            up: Dir {
                total: up,
                ..Dir::default()
            },
            down: Dir {
                total: down,
                ..Dir::default()
            },
        });
    }
    let mut err = None;
    let mut buf = vec![0u8; 32 * 1024];
    let done = net.run_until(LIMIT, |n| {
        // Accepted connections are matched to flows by the client's port.
        while let Ok(s) = n.b.tcp_accept(listener) {
            let port = n.b.tcp_conn(s).map(|c| c.tuple().remote_port).unwrap_or(0);
            for f in fl.iter_mut() {
                if n.a.tcp_conn(f.client).map(|c| c.tuple().local_port).ok() == Some(port) {
                    f.server = Some(s);
                }
            }
        }
        let mut all = true;
        for (i, f) in fl.iter_mut().enumerate() {
            let Some(s) = f.server else {
                all = false;
                continue;
            };
            let r = pump(&mut n.a, f.client, &mut f.up, i, 0, &mut buf)
                .and_then(|_| pump_read(&mut n.b, s, &mut f.up, i, 0, &mut buf))
                .and_then(|_| pump(&mut n.b, s, &mut f.down, i, 1, &mut buf))
                .and_then(|_| pump_read(&mut n.a, f.client, &mut f.down, i, 1, &mut buf));
            if let Err(e) = r {
                let c = n.a.tcp_conn(f.client).ok().map(|c| {
                    format!(
                        "A: {} mss {} rto {:?} srtt {:?} {:?}",
                        c.state(),
                        c.mss(),
                        c.rto(),
                        c.srtt(),
                        c.stats()
                    )
                });
                err = Some(format!("flow {i}: {e} ({})", c.unwrap_or_default()));
                return true;
            }
            all &= f.up.eof && f.down.eof;
        }
        all
    });
    if let Some(e) = err {
        return Err(e);
    }
    if !done {
        let p: Vec<_> = fl
            .iter()
            .map(|f| (f.up.got, f.up.total, f.down.got, f.down.total))
            .collect();
        return Err(format!(
            "not complete after {LIMIT:?} (got/total up, down: {p:?})"
        ));
    }
    net.stamp();
    for f in &fl {
        let _ = net.a.tcp_close(f.client);
        if let Some(s) = f.server {
            let _ = net.b.tcp_close(s);
        }
    }
    let _ = net.b.tcp_close(listener);
    Ok(fl.iter().map(|f| f.up.total + f.down.total).sum())
}

/// Writes what fits of a direction, then half-closes once all is written.
fn pump(
    e: &mut crate::Engine,
    h: TcpHandle,
    d: &mut Dir,
    flow: usize,
    dir: u64,
    buf: &mut [u8],
) -> Result<(), String> {
    while d.sent < d.total {
        let len = (d.total - d.sent).min(buf.len() as u64) as usize;
        for (k, b) in buf[..len].iter_mut().enumerate() {
            *b = byte(flow, dir, d.sent + k as u64);
        }
        match e.tcp_send(h, &buf[..len]) {
            Ok(k) => d.sent += k as u64,
            Err(SocketError::WouldBlock) => break,
            Err(er) => return Err(format!("send: {er}")),
        }
    }
    if d.sent == d.total && !d.shut {
        d.shut = e.tcp_shutdown(h).is_ok();
    }
    Ok(())
}

/// Reads what arrived of a direction and checks every byte.
fn pump_read(
    e: &mut crate::Engine,
    h: TcpHandle,
    d: &mut Dir,
    flow: usize,
    dir: u64,
    buf: &mut [u8],
) -> Result<(), String> {
    while !d.eof {
        match e.tcp_recv(h, buf) {
            Ok(0) => {
                if d.got != d.total {
                    return Err(format!(
                        "end of stream after {} of {} bytes",
                        d.got, d.total
                    ));
                }
                d.eof = true;
            }
            Ok(k) => {
                for (j, &b) in buf[..k].iter().enumerate() {
                    if b != byte(flow, dir, d.got + j as u64) {
                        return Err(format!("byte {} differs", d.got + j as u64));
                    }
                }
                d.got += k as u64;
                if d.got > d.total {
                    return Err(format!("{} bytes arrived of {}", d.got, d.total));
                }
            }
            Err(SocketError::WouldBlock) => break,
            Err(er) => return Err(format!("recv: {er}")),
        }
    }
    Ok(())
}

/// B restarts mid-transfer: A's connection must fail (reset by the new B, or time out),
/// then a new connection must carry data byte-exact.
fn restart(net: &mut Net, after: u64, seed: u64) -> Result<u64, String> {
    let listener = net.b.tcp_listen(5001, 8).map_err(|e| e.to_string())?;
    net.stamp();
    let client = net
        .a
        .tcp_connect(SocketAddrV4::new(B_IP.into(), 5001))
        .map_err(|e| e.to_string())?;
    // Without keepalive a connection with nothing outstanding (all sent and acknowledged,
    // half-closed) cannot notice that its peer restarted: TCP then waits, as it should.
    let ka = flowstack_tcp::Keepalive {
        idle: Duration::from_secs(20),
        interval: Duration::from_secs(5),
        probes: 3,
    };
    net.a
        .tcp_set_keepalive(client, Some(ka))
        .map_err(|e| e.to_string())?;
    let mut up = Dir {
        total: after * 4,
        ..Dir::default()
    };
    let mut server = None;
    let mut buf = vec![0u8; 32 * 1024];
    let mut err = None;
    let reached = net.run_until(LIMIT, |n| {
        server = server.or_else(|| n.b.tcp_accept(listener).ok());
        let r = pump(&mut n.a, client, &mut up, 0, 0, &mut buf).and_then(|_| match server {
            Some(s) => pump_read(&mut n.b, s, &mut up, 0, 0, &mut buf),
            None => Ok(()),
        });
        if let Err(e) = r {
            err = Some(e);
            return true;
        }
        up.got >= after
    });
    if let Some(e) = err {
        return Err(format!("before the restart: {e}"));
    }
    if !reached {
        return Err(format!(
            "only {} of {after} bytes before the restart",
            up.got
        ));
    }
    let verified = up.got;
    // The restart: B comes back with no memory of the connection (same addresses, new
    // secret, so new ISNs).
    net.restart_b(seed.wrapping_add(1));
    let listener = net.b.tcp_listen(5001, 8).map_err(|e| e.to_string())?;
    let failed = net.run_until(LIMIT, |n| {
        let _ = pump(&mut n.a, client, &mut up, 0, 0, &mut buf);
        n.a.tcp_error(client).is_some()
    });
    match net.a.tcp_error(client) {
        Some(SocketError::ConnectionReset | SocketError::TimedOut) => {}
        other if failed => return Err(format!("old connection ended with {other:?}")),
        _ => return Err("old connection never noticed the restart".into()),
    }
    net.stamp();
    let _ = net.a.tcp_close(client);
    // A new connection to the restarted peer works.
    let after_bytes = one_flow(net, listener, 20_000)?;
    let _ = net.b.tcp_close(listener);
    Ok(verified + after_bytes)
}

/// One more flow A→B to B's `listener` on port 5001.
fn one_flow(net: &mut Net, listener: TcpHandle, bytes: u64) -> Result<u64, String> {
    net.stamp();
    let client = net
        .a
        .tcp_connect(SocketAddrV4::new(B_IP.into(), 5001))
        .map_err(|e| e.to_string())?;
    let mut up = Dir {
        total: bytes,
        ..Dir::default()
    };
    let mut buf = vec![0u8; 32 * 1024];
    let mut server = None;
    let mut err = None;
    let done = net.run_until(LIMIT, |n| {
        server = server.or_else(|| n.b.tcp_accept(listener).ok());
        let r = pump(&mut n.a, client, &mut up, 7, 0, &mut buf).and_then(|_| match server {
            Some(s) => pump_read(&mut n.b, s, &mut up, 7, 0, &mut buf),
            None => Ok(()),
        });
        if let Err(e) = r {
            err = Some(e);
            return true;
        }
        up.eof
    });
    if let Some(e) = err {
        return Err(format!("after the restart: {e}"));
    }
    if !done {
        return Err(format!("after the restart: {} of {bytes} bytes", up.got));
    }
    net.stamp();
    let _ = net.a.tcp_close(client);
    if let Some(s) = server {
        let _ = net.b.tcp_close(s);
    }
    Ok(bytes)
}

/// Runs `count` seeds from `first`, calling `each` with every result; returns the failures.
pub fn run_range(
    first: u64,
    count: u64,
    mut each: impl FnMut(u64, &Result<Outcome, Failure>),
) -> Vec<(u64, Failure)> {
    let mut failures = Vec::new();
    for seed in first..first.saturating_add(count) {
        let r = run_seed(seed);
        each(seed, &r);
        if let Err(f) = r {
            failures.push((seed, f));
        }
    }
    failures
}

/// The one-line command that replays `seed`.
pub fn replay_command(seed: u64) -> String {
    format!("flowstack simnet --seed {seed}")
}
