//! The benchmark workloads as non-blocking state machines over an [`Engine`]: the same code
//! drives a server process, a client process, or both ends in one process.

use flowstack_stack::{Engine, SocketError, TcpHandle};
use flowstack_wire::Instant;
use std::net::SocketAddrV4;
use std::time::Duration;

/// What the client measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// One-way bulk throughput.
    Stream,
    /// Request/response ping-pong on open connections.
    Rr,
    /// Connect, request, response, close.
    Crr,
}

/// Port the servers listen on.
pub const PORT: u16 = 5001;

/// Server side: accepts, then sinks (stream) or answers `msg` bytes per request (rr, crr).
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
    /// Starts listening on [`PORT`].
    pub fn new(
        e: &mut Engine,
        workload: Workload,
        msg: usize,
        zero_copy: bool,
    ) -> Result<Self, SocketError> {
        Ok(Self {
            listener: e.tcp_listen(PORT, 4096)?,
            conns: Vec::new(),
            workload,
            msg,
            zero_copy,
            buf: vec![0; 256 * 1024],
            zeros: vec![0x42; 64 * 1024],
        })
    }

    /// Reads what is available on `c`; returns bytes read (0: nothing now or end of stream).
    fn read(&mut self, e: &mut Engine, c: &mut SConn) -> usize {
        if self.zero_copy {
            // Zero-copy receive: look at the bytes in the receive buffer, then release them.
            match e.tcp_peek(c.h, usize::MAX) {
                Ok((a, b)) if !a.is_empty() => {
                    let n = a.len() + b.len();
                    let _ = e.tcp_consume(c.h, n);
                    n
                }
                Ok(_) => {
                    c.eof |= e.tcp_at_eof(c.h);
                    0
                }
                Err(_) => {
                    c.eof = true;
                    0
                }
            }
        } else {
            match e.tcp_recv(c.h, &mut self.buf) {
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
    pub fn step(&mut self, e: &mut Engine, _now: Instant) -> bool {
        let mut moved = false;
        while let Ok(h) = e.tcp_accept(self.listener) {
            if self.workload != Workload::Stream {
                let _ = e.tcp_set_nodelay(h, true);
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
                let n = self.read(e, c);
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
                match e.tcp_send(c.h, &self.zeros[..k]) {
                    Ok(n) => {
                        c.owed -= n;
                        moved = true;
                    }
                    Err(_) => break,
                }
            }
            if c.eof && self.workload == Workload::Stream && !c.report_sent {
                c.report_sent = e.tcp_send(c.h, &c.received.to_be_bytes()).is_ok();
                moved = true;
            }
        }
        conns.retain(|c| {
            let done = c.eof && c.owed == 0 && (self.workload != Workload::Stream || c.report_sent);
            if done {
                let _ = e.tcp_close(c.h);
            }
            !done
        });
        self.conns = conns;
        moved
    }
}

/// Client-side results.
#[derive(Debug, Default, Clone)]
pub struct ClientResult {
    /// Bytes the server reported receiving (stream).
    pub bytes: u64,
    /// Seconds measured.
    pub secs: f64,
    /// Completed transactions (rr, crr).
    pub transactions: u64,
    /// Transaction latencies in nanoseconds (rr).
    pub latencies: Vec<u32>,
    /// Bytes accepted per one-second interval (stream).
    pub intervals: Vec<u64>,
    /// Error that ended the run early.
    pub error: Option<String>,
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

/// Client side of a workload over `conns` connections for `duration`.
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
    shared: std::sync::Arc<[u8]>,
    zero_copy: bool,
    buf: Vec<u8>,
    interval_start: Instant,
    interval_bytes: u64,
}

impl Client {
    /// A client that will open `conns` connections to `server`.
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

    fn connect(&mut self, e: &mut Engine, i: usize) {
        match e.tcp_connect(self.server) {
            Ok(h) => {
                if self.workload != Workload::Stream {
                    let _ = e.tcp_set_nodelay(h, true);
                }
                self.conns[i].h = Some(h);
                self.conns[i].state = CState::Connecting;
            }
            Err(err) => self.result.error = Some(format!("connect: {err}")),
        }
    }

    /// Makes progress; returns true if anything moved.
    pub fn step(&mut self, e: &mut Engine, now: Instant) -> bool {
        if self.done {
            return false;
        }
        let start = match self.start {
            Some(s) => s,
            None => {
                self.start = Some(now);
                self.interval_start = now;
                for i in 0..self.conns.len() {
                    self.connect(e, i);
                }
                now
            }
        };
        let over = now.saturating_since(start) >= self.duration;
        let mut moved = false;
        for i in 0..self.conns.len() {
            moved |= self.step_conn(e, now, i, over);
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

    fn step_conn(&mut self, e: &mut Engine, now: Instant, i: usize, over: bool) -> bool {
        let Some(h) = self.conns[i].h else {
            return false;
        };
        if matches!(self.conns[i].state, CState::Done) {
            return false;
        }
        if let Some(err) = e.tcp_error(h) {
            self.result.error = Some(format!("connection: {err}"));
            self.conns[i].state = CState::Done;
            return true;
        }
        let mut moved = false;
        match self.conns[i].state {
            CState::Connecting => {
                if e.tcp_conn(h).map(|c| c.is_open()).unwrap_or(false) {
                    self.conns[i].state = CState::Idle;
                    moved = true;
                }
            }
            CState::Idle => match self.workload {
                Workload::Stream => {
                    if over {
                        let _ = e.tcp_shutdown(h);
                        self.conns[i].state = CState::Draining;
                        return true;
                    }
                    if self.zero_copy {
                        // The stack borrows the application's buffer until it is acknowledged.
                        while e.tcp_zc_completion(h).is_some() {}
                        while e.tcp_send_zc(h, self.shared.clone()).is_ok() {
                            self.interval_bytes += self.shared.len() as u64;
                            moved = true;
                        }
                    } else {
                        while let Ok(n) = e.tcp_send(h, &self.data) {
                            self.interval_bytes += n as u64;
                            moved = true;
                        }
                    }
                }
                Workload::Rr | Workload::Crr => {
                    if over {
                        let _ = e.tcp_close(h);
                        self.conns[i].state = CState::Done;
                        return true;
                    }
                    if e.tcp_send(h, &self.data[..self.msg]).is_ok() {
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
                    match e.tcp_recv(h, &mut self.buf) {
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
                        let ns = now
                            .saturating_since(sent_at)
                            .as_nanos()
                            .min(u32::MAX as u128);
                        self.result.latencies.push(ns as u32);
                        self.conns[i].state = CState::Idle;
                    } else {
                        let _ = e.tcp_close(h);
                        self.conns[i].state = CState::Done;
                        if !over {
                            self.connect(e, i);
                        }
                    }
                }
            }
            CState::Draining => {
                // Stream: after our FIN the server answers with the byte count it received.
                while let Ok(n) = e.tcp_recv(h, &mut self.buf) {
                    if n == 0 {
                        break;
                    }
                    self.conns[i].report.extend_from_slice(&self.buf[..n]);
                    moved = true;
                }
                if self.conns[i].report.len() >= 8 {
                    let b: [u8; 8] = self.conns[i].report[..8].try_into().unwrap();
                    self.result.bytes += u64::from_be_bytes(b);
                    let _ = e.tcp_close(h);
                    self.conns[i].state = CState::Done;
                    moved = true;
                }
            }
            CState::Done => {}
        }
        moved
    }
}
