//! The benchmark workloads (`flowstack bench stream|rr|crr`) as [`App`]s over any
//! [`Sockets`]: the same server and client run on an in-process engine, on an engine in
//! another process across the shm wire, and (later) over the offload client's rings.
//!
//! The data path allocates nothing per request: the client sends from one shared buffer
//! (zero-copy: the stack borrows an `Arc` of it until it is acknowledged), the server
//! receives by peeking at its receive buffer and consuming in place, and latencies go into
//! an [`hdrhistogram::Histogram`] allocated once.

use flowstack_api::app::{App, Progress};
use flowstack_api::{SocketError, Sockets, TcpHandle};
pub use flowstack_prof::report::Workload;
use flowstack_prof::report::{Percentiles, RunResult};
use flowstack_wire::{Duration, Instant};
use hdrhistogram::Histogram;
use std::net::SocketAddrV4;
use std::sync::Arc;

/// Port the servers listen on.
pub const PORT: u16 = 5001;

/// Largest latency recorded (longer ones count as this): 60 s.
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// A latency histogram in nanoseconds, three significant digits, allocated once.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}

/// p50/p90/p99/p99.9 of a nanosecond histogram, in microseconds (`None` if empty).
pub fn percentiles(h: &Histogram<u64>) -> Option<Percentiles> {
    if h.is_empty() {
        return None;
    }
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Some(Percentiles {
        p50_us: us(0.50),
        p90_us: us(0.90),
        p99_us: us(0.99),
        p99_9_us: us(0.999),
    })
}

/// Server side: accepts, then sinks (stream; at the client's FIN it answers with the byte
/// count it received) or answers `msg` bytes per `msg`-byte request (rr, crr).
pub struct Server {
    listener: TcpHandle,
    conns: Vec<SConn>,
    workload: Workload,
    msg: usize,
    zero_copy: bool,
    buf: Vec<u8>,
    zeros: Vec<u8>,
}

struct SConn {
    h: TcpHandle,
    received: u64,
    /// Request bytes received but not yet answered.
    partial: usize,
    /// Response bytes still to queue.
    owed: usize,
    eof: bool,
    report_sent: bool,
}

impl Server {
    /// Starts listening on [`PORT`]. With `zero_copy` received bytes are looked at in the
    /// receive buffer and released ([`Sockets::tcp_peek`], [`Sockets::tcp_consume`]);
    /// without, they are copied out.
    pub fn new<S: Sockets + ?Sized>(
        sockets: &mut S,
        workload: Workload,
        msg: usize,
        zero_copy: bool,
    ) -> Result<Self, SocketError> {
        Ok(Self {
            listener: sockets.tcp_listen(PORT, 4096)?,
            conns: Vec::new(),
            workload,
            msg: msg.max(1),
            zero_copy,
            buf: vec![0; 256 * 1024],
            zeros: vec![0x42; 64 * 1024],
        })
    }

    /// Reads what is available on `c`; returns bytes read (0: nothing now or end of stream).
    fn read<S: Sockets + ?Sized>(&mut self, s: &mut S, c: &mut SConn) -> usize {
        if self.zero_copy {
            // Zero-copy receive: look at the bytes in the receive buffer, then release them.
            match s.tcp_peek(c.h, usize::MAX) {
                Ok((a, b)) if !a.is_empty() => {
                    let n = a.len() + b.len();
                    let _ = s.tcp_consume(c.h, n);
                    n
                }
                Ok(_) => {
                    c.eof |= s.tcp_at_eof(c.h);
                    0
                }
                Err(_) => {
                    c.eof = true;
                    0
                }
            }
        } else {
            match s.tcp_recv(c.h, &mut self.buf) {
                Ok(0) => {
                    c.eof = true;
                    0
                }
                Ok(n) => n,
                Err(SocketError::WouldBlock) => 0,
                Err(_) => {
                    c.eof = true;
                    0
                }
            }
        }
    }

    /// Makes progress; returns true if anything moved.
    fn step<S: Sockets + ?Sized>(&mut self, s: &mut S) -> bool {
        let mut moved = false;
        while let Ok(h) = s.tcp_accept(self.listener) {
            if self.workload != Workload::Stream {
                let _ = s.tcp_set_nodelay(h, true);
            }
            self.conns.push(SConn {
                h,
                received: 0,
                partial: 0,
                owed: 0,
                eof: false,
                report_sent: false,
            });
            moved = true;
        }
        let mut conns = std::mem::take(&mut self.conns);
        for c in &mut conns {
            loop {
                let n = self.read(s, c);
                if n == 0 {
                    break;
                }
                moved = true;
                c.received += n as u64;
                if self.workload != Workload::Stream {
                    c.partial += n;
                    c.owed += (c.partial / self.msg) * self.msg;
                    c.partial %= self.msg;
                }
            }
            while c.owed > 0 {
                let k = c.owed.min(self.zeros.len());
                match s.tcp_send(c.h, &self.zeros[..k]) {
                    Ok(n) => {
                        c.owed -= n;
                        moved = true;
                    }
                    Err(_) => break,
                }
            }
            if c.eof && self.workload == Workload::Stream && !c.report_sent {
                c.report_sent = s.tcp_send(c.h, &c.received.to_be_bytes()).is_ok();
                moved = true;
            }
        }
        conns.retain(|c| {
            let done = c.eof && c.owed == 0 && (self.workload != Workload::Stream || c.report_sent);
            if done {
                let _ = s.tcp_close(c.h);
            }
            !done
        });
        self.conns = conns;
        moved
    }
}

/// The server never finishes: it serves until its drive loop stops.
impl<S: Sockets + ?Sized> App<S> for Server {
    fn poll(&mut self, _now: Instant, sockets: &mut S) -> Progress {
        if self.step(sockets) {
            Progress::Busy
        } else {
            Progress::Idle
        }
    }
}

/// What a client measured.
#[derive(Debug, Clone)]
pub struct ClientResult {
    /// Bytes the server reported receiving (stream).
    pub bytes: u64,
    /// Seconds measured.
    pub secs: f64,
    /// Completed transactions (rr, crr).
    pub transactions: u64,
    /// Transaction latencies in nanoseconds (rr).
    pub latency: Histogram<u64>,
    /// Bytes queued per one-second interval (stream).
    pub intervals: Vec<u64>,
    /// Error that ended the run early.
    pub error: Option<String>,
}

impl Default for ClientResult {
    fn default() -> Self {
        Self {
            bytes: 0,
            secs: 0.0,
            transactions: 0,
            latency: latency_histogram(),
            intervals: Vec::new(),
            error: None,
        }
    }
}

impl ClientResult {
    /// The run in the report schema.
    pub fn run_result(&self, workload: Workload) -> RunResult {
        RunResult::new(
            workload,
            self.bytes,
            self.secs,
            self.transactions,
            percentiles(&self.latency),
            self.intervals.clone(),
        )
    }
}

enum CState {
    Connecting,
    Idle,
    Waiting { sent_at: Instant, got: usize },
    Draining,
    Done,
}

struct CConn {
    h: Option<TcpHandle>,
    state: CState,
    report: Vec<u8>,
}

/// Client side of a workload over `conns` connections for `duration`; [`Progress::Done`]
/// once every connection is finished (or one failed: see [`ClientResult::error`]).
pub struct Client {
    workload: Workload,
    msg: usize,
    server: SocketAddrV4,
    conns: Vec<CConn>,
    /// What was measured.
    pub result: ClientResult,
    start: Option<Instant>,
    done: bool,
    duration: Duration,
    data: Vec<u8>,
    /// The same bytes, shared with the stack for zero-copy sends.
    shared: Arc<[u8]>,
    zero_copy: bool,
    buf: Vec<u8>,
    interval_start: Instant,
    interval_bytes: u64,
}

impl Client {
    /// A client that will open `conns` connections to `server` at its first poll. With
    /// `zero_copy` (stream) the stack borrows the client's buffer instead of copying it.
    pub fn new(
        workload: Workload,
        msg: usize,
        server: SocketAddrV4,
        conns: usize,
        duration: Duration,
        zero_copy: bool,
    ) -> Self {
        Self {
            workload,
            msg,
            server,
            conns: (0..conns)
                .map(|_| CConn {
                    h: None,
                    state: CState::Done,
                    report: Vec::new(),
                })
                .collect(),
            result: ClientResult::default(),
            start: None,
            done: false,
            duration,
            data: vec![0x17; msg.max(8)],
            shared: vec![0x17; msg.max(8)].into(),
            zero_copy,
            buf: vec![0; 256 * 1024],
            interval_start: Instant::ZERO,
            interval_bytes: 0,
        }
    }

    /// True when the run is over.
    pub fn finished(&self) -> bool {
        self.done
    }

    fn connect<S: Sockets + ?Sized>(&mut self, s: &mut S, i: usize) {
        match s.tcp_connect(self.server) {
            Ok(h) => {
                if self.workload != Workload::Stream {
                    let _ = s.tcp_set_nodelay(h, true);
                }
                self.conns[i].h = Some(h);
                self.conns[i].state = CState::Connecting;
            }
            Err(err) => self.result.error = Some(format!("connect: {err}")),
        }
    }

    /// Makes progress; returns true if anything moved.
    fn step<S: Sockets + ?Sized>(&mut self, s: &mut S, now: Instant) -> bool {
        if self.done {
            return false;
        }
        let start = match self.start {
            Some(t) => t,
            None => {
                self.start = Some(now);
                self.interval_start = now;
                for i in 0..self.conns.len() {
                    self.connect(s, i);
                }
                now
            }
        };
        let over = now.saturating_since(start) >= self.duration;
        let mut moved = false;
        for i in 0..self.conns.len() {
            moved |= self.step_conn(s, now, i, over);
        }
        if self.workload == Workload::Stream
            && !over
            && now.saturating_since(self.interval_start) >= Duration::from_secs(1)
        {
            self.result.intervals.push(self.interval_bytes);
            self.interval_bytes = 0;
            self.interval_start = now;
        }
        if self.result.error.is_some() || self.conns.iter().all(|c| matches!(c.state, CState::Done))
        {
            self.done = true;
            let secs = now.saturating_since(start).as_secs_f64();
            self.result.secs = if self.workload == Workload::Stream {
                secs
            } else {
                secs.min(self.duration.as_secs_f64())
            }
            .max(1e-9);
        }
        moved
    }

    fn step_conn<S: Sockets + ?Sized>(
        &mut self,
        s: &mut S,
        now: Instant,
        i: usize,
        over: bool,
    ) -> bool {
        let Some(h) = self.conns[i].h else {
            return false;
        };
        if matches!(self.conns[i].state, CState::Done) {
            return false;
        }
        if let Some(err) = s.tcp_error(h) {
            self.result.error = Some(format!("connection: {err}"));
            self.conns[i].state = CState::Done;
            return true;
        }
        let mut moved = false;
        match self.conns[i].state {
            CState::Connecting => {
                if s.tcp_is_open(h) {
                    self.conns[i].state = CState::Idle;
                    moved = true;
                }
            }
            CState::Idle => match self.workload {
                Workload::Stream => {
                    if over {
                        let _ = s.tcp_shutdown(h);
                        self.conns[i].state = CState::Draining;
                        return true;
                    }
                    if self.zero_copy {
                        // The stack borrows the application's buffer until it is acknowledged.
                        while s.tcp_zc_completion(h).is_some() {}
                        while s.tcp_send_zc(h, self.shared.clone()).is_ok() {
                            self.interval_bytes += self.shared.len() as u64;
                            moved = true;
                        }
                    } else {
                        while let Ok(n) = s.tcp_send(h, &self.data) {
                            self.interval_bytes += n as u64;
                            moved = true;
                        }
                    }
                }
                Workload::Rr | Workload::Crr => {
                    if over {
                        let _ = s.tcp_close(h);
                        self.conns[i].state = CState::Done;
                        return true;
                    }
                    if s.tcp_send(h, &self.data[..self.msg]).is_ok() {
                        self.conns[i].state = CState::Waiting {
                            sent_at: now,
                            got: 0,
                        };
                        moved = true;
                    }
                }
            },
            CState::Waiting { sent_at, mut got } => {
                loop {
                    match s.tcp_recv(h, &mut self.buf) {
                        Ok(0) => {
                            self.result.error = Some("server closed early".into());
                            self.conns[i].state = CState::Done;
                            return true;
                        }
                        Ok(n) => {
                            got += n;
                            moved = true;
                        }
                        Err(_) => break,
                    }
                }
                if got < self.msg {
                    self.conns[i].state = CState::Waiting { sent_at, got };
                } else {
                    self.result.transactions += 1;
                    if self.workload == Workload::Rr {
                        let ns = now.saturating_since(sent_at).as_nanos() as u64;
                        self.result.latency.saturating_record(ns.max(1));
                        self.conns[i].state = CState::Idle;
                    } else {
                        let _ = s.tcp_close(h);
                        self.conns[i].state = CState::Done;
                        if !over {
                            self.connect(s, i);
                        }
                    }
                }
            }
            CState::Draining => {
                // Stream: after our FIN the server answers with the byte count it received.
                while let Ok(n) = s.tcp_recv(h, &mut self.buf) {
                    if n == 0 {
                        break;
                    }
                    self.conns[i].report.extend_from_slice(&self.buf[..n]);
                    moved = true;
                }
                if self.conns[i].report.len() >= 8 {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&self.conns[i].report[..8]);
                    self.result.bytes += u64::from_be_bytes(b);
                    let _ = s.tcp_close(h);
                    self.conns[i].state = CState::Done;
                    moved = true;
                }
            }
            CState::Done => {}
        }
        moved
    }
}

impl<S: Sockets + ?Sized> App<S> for Client {
    fn poll(&mut self, now: Instant, sockets: &mut S) -> Progress {
        let moved = self.step(sockets, now);
        if self.done {
            Progress::Done
        } else if moved {
            Progress::Busy
        } else {
            Progress::Idle
        }
    }

    /// The end of the run, and (stream) the next interval line.
    fn poll_at(&self) -> Option<Instant> {
        let start = self.start?;
        if self.done {
            return None;
        }
        let end = start + self.duration;
        Some(if self.workload == Workload::Stream {
            end.min(self.interval_start + Duration::from_secs(1))
        } else {
            end
        })
    }
}
