//! `flowstack bench conns`: the memory one idle established connection costs.
//!
//! Two engines in this process over the in-process pipe (as `bench --link pipe`); the client
//! engine opens `count` connections to listeners of the server engine (one listening port
//! per 60,000 connections, so the client's ports never run out), in batches, and the server
//! accepts them. Once all are established and idle the run reads the process's resident
//! memory (`VmRSS`) and the engines' own accounting ([`Engine::tcp_accounted_bytes`]), then
//! closes every connection on both sides and waits until both tables are empty.
//!
//! Bytes per connection are per connection *endpoint*: each of the `count` connections has
//! one endpoint (a TCB and its table slot) in each engine, so growths are divided by
//! `2 · count`. A warm-up batch is opened and closed before the baseline is taken, so the
//! pipe's frame pool and the engines' first allocations are not counted; the application's
//! handle vectors are subtracted from the RSS growth.

use crate::flowstack::{engine_config, pipe_caps, CLIENT_IP, SERVER_IP};
use crate::spec::RunOpts;
use flowstack_link::pipe::{pipe, PipeEnd};
use flowstack_runtime::Clock;
use flowstack_stack::{Engine, TcpHandle};
use flowstack_wire::Duration as WireDuration;
use serde::{Deserialize, Serialize};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

/// First listening port of the server engine.
const BASE_PORT: u16 = 20_000;
/// Connections per listening port (the client's ephemeral range is 1024..=65535).
const PER_PORT: usize = 60_000;
/// Connections opened (and accepted) per round.
const BATCH: usize = 512;
/// A round that makes no progress for this long fails the run.
const STALL: Duration = Duration::from_secs(20);

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnsSpec {
    /// Connections to open.
    pub count: usize,
    /// Each engine's connection limit; `None` = exactly `count` (what the run needs).
    pub max_connections: Option<usize>,
}

impl Default for ConnsSpec {
    fn default() -> Self {
        Self {
            count: 100_000,
            max_connections: None,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnsReport {
    /// Connections opened (each has an endpoint in both engines).
    pub count: usize,
    /// Resident memory growth per connection endpoint, in bytes.
    pub rss_bytes_per_conn: f64,
    /// The engines' accounted bytes per connection endpoint (table slot, TCB, heap it
    /// holds, its share of the demux maps and timer structures).
    pub accounted_bytes_per_conn: f64,
    /// Seconds to open all connections (connect, handshake, accept).
    pub open_s: f64,
    /// Seconds to close all connections until both tables are empty.
    pub close_s: f64,
    /// Connections opened per second.
    pub conns_per_s_open: f64,
    /// Resident memory growth while the connections were open, in bytes (handle vectors
    /// subtracted).
    pub rss_growth_bytes: u64,
    /// The engines' accounted bytes with all connections open (both engines).
    pub accounted_bytes: u64,
    /// `size_of::<Connection>()` in this build.
    pub tcb_size: usize,
    /// The machine's load average when the run started.
    pub load: String,
}

impl ConnsReport {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }
}

/// Resident set size of this process in bytes (`VmRSS` of `/proc/self/status`).
pub fn rss_bytes() -> Result<u64, String> {
    let s = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

/// The load average, as `/proc/loadavg`'s first three fields.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The two engines, their pipe and the clock.
struct Pair {
    a: Engine,
    b: Engine,
    da: PipeEnd,
    db: PipeEnd,
    clock: Clock,
    listeners: Vec<TcpHandle>,
}

impl Pair {
    /// One turn of both engines; true if a frame moved.
    fn poll(&mut self) -> bool {
        let now = self.clock.now();
        let a = self.a.poll(now, &mut self.da);
        let b = self.b.poll(now, &mut self.db);
        a || b
    }

    /// Polls until no frame moves (the pipe is drained), so the next batch does not
    /// overflow the pipe while the receiver works through its budget.
    fn settle(&mut self) {
        while self.poll() {}
    }

    /// Opens connections `first..first + n`; pushes both ends' handles.
    fn open(
        &mut self,
        first: usize,
        n: usize,
        client: &mut Vec<TcpHandle>,
        server: &mut Vec<TcpHandle>,
    ) -> Result<(), String> {
        self.a.set_now(self.clock.now());
        let start = client.len();
        for i in first..first + n {
            let port = BASE_PORT + (i / PER_PORT) as u16;
            let h = self
                .a
                .tcp_connect(SocketAddrV4::new(SERVER_IP.into(), port))
                .map_err(|e| format!("connect #{i}: {e}"))?;
            client.push(h);
        }
        let want = server.len() + n;
        let mut last = Instant::now();
        let mut open = 0;
        while server.len() < want || open < n {
            self.poll();
            let before = (server.len(), open);
            for &l in &self.listeners {
                while let Ok(s) = self.b.tcp_accept(l) {
                    server.push(s);
                }
            }
            while open < n
                && self
                    .a
                    .tcp_conn(client[start + open])
                    .is_ok_and(|c| c.is_open())
            {
                open += 1;
            }
            if (server.len(), open) != before {
                last = Instant::now();
            } else if last.elapsed() > STALL {
                return Err(format!(
                    "opening stalled: {} of {n} open, {} accepted",
                    open,
                    server.len() + n - want
                ));
            }
        }
        if let Some(h) = client[start..]
            .iter()
            .find(|&&h| self.a.tcp_error(h).is_some())
        {
            return Err(format!("a connection failed: {:?}", self.a.tcp_error(*h)));
        }
        Ok(())
    }

    /// Closes every handle on both sides and waits until both tables are empty.
    fn close_all(&mut self, client: &[TcpHandle], server: &[TcpHandle]) -> Result<(), String> {
        let now = self.clock.now();
        self.a.set_now(now);
        self.b.set_now(now);
        for (k, &h) in client.iter().enumerate() {
            self.a.tcp_close(h).map_err(|e| format!("close: {e}"))?;
            if k % BATCH == BATCH - 1 {
                self.settle();
            }
        }
        for (k, &h) in server.iter().enumerate() {
            self.b.tcp_close(h).map_err(|e| format!("close: {e}"))?;
            if k % BATCH == BATCH - 1 {
                self.settle();
            }
        }
        let mut last = Instant::now();
        let mut left = (usize::MAX, usize::MAX);
        loop {
            self.poll();
            let now_left = (self.a.tcp_connections(), self.b.tcp_connections());
            if now_left == (0, 0) {
                return Ok(());
            }
            if now_left != left {
                left = now_left;
                last = Instant::now();
            } else if last.elapsed() > STALL {
                return Err(format!(
                    "closing stalled: {} client and {} server connections left",
                    now_left.0, now_left.1
                ));
            }
        }
    }
}

/// Opens `spec.count` connections between two engines, measures, closes them all.
pub fn run(spec: &ConnsSpec) -> Result<ConnsReport, String> {
    let count = spec.count;
    if count == 0 {
        return Err("--count must be at least 1".into());
    }
    let limit = spec.max_connections.unwrap_or(count.max(BATCH));
    if limit < count {
        return Err(format!(
            "the engines' connection limit ({limit}) is below --count {count}; raise it with --max-connections"
        ));
    }
    let ports = count.div_ceil(PER_PORT);
    if ports > usize::from(u16::MAX - BASE_PORT) {
        return Err(format!(
            "--count {count} needs more listening ports than exist"
        ));
    }
    let load = load_average();
    let o = RunOpts::default();
    let caps = pipe_caps(&o);
    let (da, db) = pipe(caps, 1 << 16);
    let mk = |ip| {
        let mut cfg = engine_config(ip, &o);
        cfg.tcp.max_connections = limit;
        cfg.tcp.syn_backlog = BATCH;
        cfg.ephemeral = (1024, u16::MAX);
        // Closed connections leave at once, so "all gone" can be checked without waiting
        // out TIME-WAIT's two minutes' worth of 2·MSL.
        cfg.tcp.defaults.time_wait = WireDuration::from_millis(1);
        Engine::new(cfg, caps)
    };
    let mut p = Pair {
        a: mk(CLIENT_IP),
        b: mk(SERVER_IP),
        da,
        db,
        clock: Clock::start(),
        listeners: Vec::new(),
    };
    for k in 0..ports {
        let l =
            p.b.tcp_listen(BASE_PORT + k as u16, BATCH)
                .map_err(|e| format!("listen: {e}"))?;
        p.listeners.push(l);
    }
    // Warm-up: one batch opened and closed, so first allocations are not counted.
    let (mut client, mut server) = (Vec::new(), Vec::new());
    p.open(0, count.min(BATCH), &mut client, &mut server)?;
    p.close_all(&client, &server)?;
    let mut client: Vec<TcpHandle> = Vec::with_capacity(count);
    let mut server: Vec<TcpHandle> = Vec::with_capacity(count);
    let handle_bytes = 2 * count * std::mem::size_of::<TcpHandle>();
    let rss0 = rss_bytes()?;
    let acc0 = p.a.tcp_accounted_bytes() + p.b.tcp_accounted_bytes();

    let t0 = Instant::now();
    let mut opened = 0;
    while opened < count {
        let n = BATCH.min(count - opened);
        p.open(opened, n, &mut client, &mut server)?;
        opened += n;
    }
    let open_s = t0.elapsed().as_secs_f64();
    // Let the last ACKs land: every connection idle and established on both sides.
    p.settle();
    let (ca, cb) = (p.a.tcp_connections(), p.b.tcp_connections());
    if ca != count || cb != count {
        return Err(format!(
            "{ca} client and {cb} server connections, not {count}"
        ));
    }
    let rss1 = rss_bytes()?;
    let acc1 = p.a.tcp_accounted_bytes() + p.b.tcp_accounted_bytes();

    let t1 = Instant::now();
    p.close_all(&client, &server)?;
    let close_s = t1.elapsed().as_secs_f64();

    let endpoints = 2.0 * count as f64;
    let rss_growth = rss1
        .saturating_sub(rss0)
        .saturating_sub(handle_bytes as u64);
    Ok(ConnsReport {
        count,
        rss_bytes_per_conn: rss_growth as f64 / endpoints,
        accounted_bytes_per_conn: acc1.saturating_sub(acc0) as f64 / endpoints,
        open_s,
        close_s,
        conns_per_s_open: count as f64 / open_s,
        rss_growth_bytes: rss_growth,
        accounted_bytes: acc1 as u64,
        tcb_size: std::mem::size_of::<flowstack_stack::Connection>(),
        load,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thousand_connections_open_and_close() {
        let r = run(&ConnsSpec {
            count: 1000,
            max_connections: None,
        })
        .expect("bench conns runs");
        assert_eq!(r.count, 1000);
        assert!(r.accounted_bytes_per_conn > 0.0);
        assert!(r.accounted_bytes > 0);
    }

    #[test]
    fn a_limit_below_the_count_is_refused() {
        let e = run(&ConnsSpec {
            count: 1000,
            max_connections: Some(999),
        })
        .unwrap_err();
        assert!(e.contains("--max-connections"), "{e}");
    }
}
