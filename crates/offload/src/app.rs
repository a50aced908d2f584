//! One registered application: its region, rings, sockets, and the commands it posts.
//!
//! Everything read from the region is untrusted: each command record is decoded and
//! validated ([`CommandRecord::decode`]), each data span checked against its area
//! ([`check_span`]), each index the application writes (`rx_freed`) checked against what the
//! daemon itself knows. A handle is looked up in this application's own table only, so an
//! application can name nothing but its own sockets.

use crate::layout::{self, at, LAYOUT, RX_SIZE, SOCK_RCVBUF, SOCK_SNDBUF, TX_SIZE};
use crate::loopback::Loopback;
use flowstack_api::record::{
    check_span, Command, CommandRecord, EventKind, EventRecord, Mode, RECORD_LEN,
};
use flowstack_api::SocketError;
use flowstack_stack::TcpHandle;
use flowstack_sys::ring::{Consumer, Producer};
use flowstack_sys::SharedRegion;
use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Commands taken from one application per loop turn (fairness between applications).
const CMD_BUDGET: usize = 256;
/// Bytes moved from the engine per read.
const RX_CHUNK: usize = 64 * 1024;

/// A connection owned by an application.
#[derive(Debug)]
pub(crate) struct Conn {
    pub eng: usize,
    pub h: TcpHandle,
    /// Bytes the application posted that the engine has not taken yet.
    pending_tx: VecDeque<u8>,
    /// Delivered into the receive area and not yet consumed by the application.
    outstanding: u64,
    /// Sync connect waiting for the handshake.
    connect_id: Option<u32>,
    open_told: bool,
    /// End of stream reported (the application may still send).
    eof_told: bool,
    /// The connection ended with an error (reported); nothing more moves.
    closed_told: bool,
    shutdown_pending: bool,
}

impl Conn {
    fn new(eng: usize, h: TcpHandle, connect_id: Option<u32>, open_told: bool) -> Self {
        Self {
            eng,
            h,
            pending_tx: VecDeque::new(),
            outstanding: 0,
            connect_id,
            open_told,
            eof_told: false,
            closed_told: false,
            shutdown_pending: false,
        }
    }
}

#[derive(Debug)]
pub(crate) enum Sock {
    Listener {
        port: u16,
        hs: Vec<TcpHandle>,
        /// Sync accepts waiting for a connection (request ids).
        waiting: VecDeque<u32>,
    },
    Conn(Conn),
    /// An async listen or connect that failed; its error was reported.
    Failed(SocketError),
}

/// Daemon-wide state the applications share: the engines and the port namespace.
pub(crate) struct Shared {
    pub lo: Loopback,
    /// Listening ports → owning application.
    pub ports: HashMap<u16, u64>,
    scratch: Vec<u8>,
}

impl Shared {
    pub fn new() -> Self {
        Self {
            lo: Loopback::new(1),
            ports: HashMap::new(),
            scratch: vec![0; RX_CHUNK],
        }
    }
}

/// Counters of one application.
#[derive(Debug, Default, Clone, Copy)]
pub struct AppStats {
    /// Command records accepted.
    pub commands: u64,
    /// Command records rejected (garbage), or naming a span outside the transmit area.
    pub bad_records: u64,
}

pub(crate) struct App {
    pub id: u64,
    pub pid: u32,
    /// Recorded at registration (SO_PEERCRED) for `flowstack stats`, not built yet.
    #[allow(dead_code)]
    pub uid: u32,
    pub stream: UnixStream,
    pub region: Arc<SharedRegion>,
    cmd: Consumer,
    evt: Producer,
    /// Events the ring had no room for yet.
    backlog: VecDeque<EventRecord>,
    socks: HashMap<u32, Sock>,
    next_local: u32,
    next_accepted: u32,
    tx_freed: u64,
    rx_head: u64,
    rx_freed: u64,
    pub stats: AppStats,
    /// The rings hold a value no honest client writes: the application is dropped.
    pub broken: bool,
}

impl App {
    pub fn new(id: u64, pid: u32, uid: u32, stream: UnixStream) -> std::io::Result<Self> {
        let region = layout::create_region(id)?;
        let bad = |e: flowstack_sys::ring::RingError| std::io::Error::other(e.to_string());
        let cmd = Consumer::new(region.clone(), LAYOUT.cmd).map_err(bad)?;
        let evt = Producer::new(region.clone(), LAYOUT.evt).map_err(bad)?;
        Ok(Self {
            id,
            pid,
            uid,
            stream,
            region,
            cmd,
            evt,
            backlog: VecDeque::new(),
            socks: HashMap::new(),
            next_local: 1,
            next_accepted: layout::ACCEPTED_BASE,
            tx_freed: 0,
            rx_head: 0,
            rx_freed: 0,
            stats: AppStats::default(),
            broken: false,
        })
    }

    /// Commands are waiting in the ring.
    pub fn pending(&self) -> bool {
        self.cmd.pending()
    }

    /// Announces (or withdraws) that the daemon sleeps.
    pub fn set_sleeping(&self, on: bool) {
        if let Some(a) = self.region.atomic_u32(at::DAEMON_SLEEPING) {
            a.store(on as u32, Ordering::SeqCst);
        }
    }

    fn post(&mut self, e: EventRecord) {
        self.backlog.push_back(e);
    }

    fn complete(&mut self, id: u32, mode: Mode, handle: u32, r: Result<u64, SocketError>) {
        // Async calls are answered only when they fail (reported by a later call).
        if mode == Mode::Sync || r.is_err() {
            self.post(EventRecord::completion(id, handle, r));
        }
    }

    /// Moves queued events into the ring and publishes them; true if any moved.
    pub fn flush_events(&mut self) -> bool {
        let mut moved = false;
        while let Some(e) = self.backlog.front() {
            let e = *e;
            let r = self.evt.push_with(RECORD_LEN, |b| {
                let b: &mut [u8; RECORD_LEN] = b.try_into().expect("record length");
                e.encode(b);
            });
            match r {
                Ok(()) => {
                    self.backlog.pop_front();
                    moved = true;
                }
                Err(flowstack_sys::ring::RingError::Full) => break,
                Err(_) => {
                    self.broken = true;
                    break;
                }
            }
        }
        self.evt.publish();
        moved
    }

    /// Takes and executes up to a budget of commands; returns how many records were read.
    pub fn drain_commands(&mut self, sh: &mut Shared) -> usize {
        let mut recs: Vec<Result<CommandRecord, ()>> = Vec::new();
        let r = self.cmd.recv(CMD_BUDGET, |b| {
            let rec = <&[u8; RECORD_LEN]>::try_from(b)
                .map_err(|_| ())
                .and_then(|b| CommandRecord::decode(b).map_err(|_| ()));
            recs.push(rec);
        });
        if r.is_err() {
            self.broken = true;
        }
        let n = recs.len();
        for rec in recs {
            match rec {
                Ok(rec) => {
                    self.stats.commands += 1;
                    self.execute(sh, rec);
                }
                Err(()) => self.stats.bad_records += 1,
            }
        }
        n
    }

    fn execute(&mut self, sh: &mut Shared, rec: CommandRecord) {
        let CommandRecord { id, mode, cmd } = rec;
        match cmd {
            Command::TcpListen { port, backlog } => {
                let h = self.next_local;
                self.next_local += 1;
                let r = if sh.ports.contains_key(&port) {
                    Err(SocketError::AddrInUse)
                } else {
                    sh.lo.listen(port, (backlog as usize).clamp(1, 4096))
                };
                match r {
                    Ok(hs) => {
                        sh.ports.insert(port, self.id);
                        self.socks.insert(
                            h,
                            Sock::Listener {
                                port,
                                hs,
                                waiting: VecDeque::new(),
                            },
                        );
                        self.complete(id, mode, h, Ok(h as u64));
                    }
                    Err(e) => {
                        self.socks.insert(h, Sock::Failed(e));
                        self.complete(id, mode, h, Err(e));
                    }
                }
            }
            Command::TcpConnect { remote } => {
                let h = self.next_local;
                self.next_local += 1;
                let r = sh
                    .lo
                    .engine_for(&remote, 0)
                    .and_then(|i| sh.lo.engines[i].tcp_connect(remote).map(|c| (i, c)));
                match r {
                    Ok((i, c)) => {
                        let wait = (mode == Mode::Sync).then_some(id);
                        self.socks
                            .insert(h, Sock::Conn(Conn::new(i, c, wait, false)));
                        if mode == Mode::Async {
                            // Handle known to the client already; the handshake is reported
                            // by a Writable event.
                        }
                    }
                    Err(e) => {
                        self.socks.insert(h, Sock::Failed(e));
                        self.complete(id, mode, h, Err(e));
                    }
                }
            }
            Command::TcpAccept { listener } => {
                let r = match self.socks.get_mut(&listener) {
                    Some(Sock::Listener { hs, .. }) => try_accept(sh, hs),
                    Some(Sock::Failed(e)) => Some(Err(*e)),
                    _ => Some(Err(SocketError::InvalidHandle)),
                };
                match r {
                    Some(Ok((i, c))) => {
                        let h = self.adopt(i, c);
                        self.post(EventRecord::completion(id, listener, Ok(h as u64)));
                    }
                    Some(Err(e)) => self.post(EventRecord::completion(id, listener, Err(e))),
                    None if mode == Mode::Sync => {
                        if let Some(Sock::Listener { waiting, .. }) = self.socks.get_mut(&listener)
                        {
                            waiting.push_back(id);
                        }
                    }
                    None => self.post(EventRecord::completion(
                        id,
                        listener,
                        Err(SocketError::WouldBlock),
                    )),
                }
            }
            Command::TcpSend {
                handle,
                offset,
                len,
            } => {
                // The client writes spans in order; whatever it names, the area it frees is
                // counted by what we took, so a lying client only garbles its own bytes.
                let Ok((off, len)) = check_span(offset, len, TX_SIZE) else {
                    self.stats.bad_records += 1;
                    return;
                };
                self.tx_freed += len as u64;
                let mut buf = vec![0u8; len];
                let _ = self.region.read_at(LAYOUT.tx_off + off, &mut buf);
                if let Some(a) = self.region.atomic_u64(at::TX_FREED) {
                    a.store(self.tx_freed, Ordering::Release);
                }
                let r = match self.socks.get_mut(&handle) {
                    Some(Sock::Conn(c)) if c.closed_told => Err(SocketError::BrokenPipe),
                    Some(Sock::Conn(c)) => {
                        c.pending_tx.extend(&buf);
                        if c.pending_tx.len() as u64 > 4 * SOCK_SNDBUF {
                            // Overran its send buffer fourfold: not our client library.
                            let _ = sh.lo.engines[c.eng].tcp_abort(c.h);
                            Err(SocketError::LimitReached)
                        } else {
                            Ok(0)
                        }
                    }
                    Some(Sock::Failed(e)) => Err(*e),
                    _ => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::TcpConsume { handle, len } => {
                if let Some(Sock::Conn(c)) = self.socks.get_mut(&handle) {
                    c.outstanding = c.outstanding.saturating_sub(len);
                }
                self.complete(id, mode, handle, Ok(0));
            }
            Command::TcpShutdown { handle } => {
                let r = match self.socks.get_mut(&handle) {
                    Some(Sock::Conn(c)) => {
                        c.shutdown_pending = true;
                        Ok(0)
                    }
                    _ => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::TcpClose { handle } => {
                let r = match self.socks.remove(&handle) {
                    Some(s) => {
                        release(sh, self.id, s, false);
                        Ok(0)
                    }
                    None => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::TcpAbort { handle } => {
                let r = match self.socks.get_mut(&handle) {
                    Some(Sock::Conn(c)) => {
                        c.pending_tx.clear();
                        sh.lo.engines[c.eng].tcp_abort(c.h).map(|_| 0)
                    }
                    _ => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::TcpSetNodelay { handle, on } => {
                let r = match self.socks.get_mut(&handle) {
                    Some(Sock::Conn(c)) => sh.lo.engines[c.eng].tcp_set_nodelay(c.h, on).map(|_| 0),
                    Some(Sock::Failed(e)) => Err(*e),
                    _ => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::TcpSendFile { handle, .. } | Command::UdpSendTo { handle, .. } => {
                self.complete(id, mode, handle, Err(SocketError::InvalidState))
            }
            Command::UdpBind { .. } => self.complete(id, mode, 0, Err(SocketError::InvalidState)),
            Command::UdpClose { handle } => {
                self.complete(id, mode, handle, Err(SocketError::InvalidHandle))
            }
        }
    }

    fn adopt(&mut self, eng: usize, h: TcpHandle) -> u32 {
        let id = self.next_accepted;
        self.next_accepted = (self.next_accepted + 1).min(flowstack_api::record::MAX_HANDLE);
        self.socks
            .insert(id, Sock::Conn(Conn::new(eng, h, None, true)));
        id
    }

    /// Moves data and state between the engines and this application's sockets; true if
    /// anything happened.
    pub fn service(&mut self, sh: &mut Shared) -> bool {
        // What the application released of its receive area; it can only move forward, up
        // to what we delivered.
        let freed = self
            .region
            .atomic_u64(at::RX_FREED)
            .map(|a| a.load(Ordering::Acquire))
            .unwrap_or(0);
        if freed >= self.rx_freed && freed <= self.rx_head {
            self.rx_freed = freed;
        }
        let mut busy = false;
        let mut evs = Vec::new();
        let mut accepts = Vec::new();
        for (&handle, s) in self.socks.iter_mut() {
            match s {
                Sock::Listener { hs, waiting, .. } => {
                    while !waiting.is_empty() {
                        match try_accept(sh, hs) {
                            Some(r) => {
                                accepts.push((waiting.pop_front().expect("waiting"), handle, r))
                            }
                            None => break,
                        }
                    }
                }
                Sock::Conn(c) => {
                    busy |= service_conn(
                        sh,
                        handle,
                        c,
                        &mut evs,
                        &mut self.rx_head,
                        self.rx_freed,
                        &self.region,
                    );
                }
                Sock::Failed(_) => {}
            }
        }
        for (id, listener, r) in accepts {
            busy = true;
            match r {
                Ok((i, c)) => {
                    let h = self.adopt(i, c);
                    self.post(EventRecord::completion(id, listener, Ok(h as u64)));
                }
                Err(e) => self.post(EventRecord::completion(id, listener, Err(e))),
            }
        }
        for e in evs {
            self.post(e);
        }
        busy
    }

    /// Closes every socket of a departed application: FIN, or RST where it left received
    /// bytes unread (as the kernel does on close).
    pub fn release_all(&mut self, sh: &mut Shared) {
        for (_, s) in self.socks.drain() {
            release(sh, self.id, s, true);
        }
    }
}

fn try_accept(
    sh: &mut Shared,
    hs: &[TcpHandle],
) -> Option<Result<(usize, TcpHandle), SocketError>> {
    for (i, &l) in hs.iter().enumerate() {
        match sh.lo.engines[i].tcp_accept(l) {
            Ok(c) => return Some(Ok((i, c))),
            Err(SocketError::WouldBlock) => {}
            Err(e) => return Some(Err(e)),
        }
    }
    None
}

fn release(sh: &mut Shared, app: u64, s: Sock, died: bool) {
    match s {
        Sock::Listener { port, hs, .. } => {
            for (i, h) in hs.into_iter().enumerate() {
                let _ = sh.lo.engines[i].tcp_close(h);
            }
            if sh.ports.get(&port) == Some(&app) {
                sh.ports.remove(&port);
            }
        }
        Sock::Conn(c) => {
            let e = &mut sh.lo.engines[c.eng];
            let unread =
                c.outstanding > 0 || e.tcp_conn(c.h).map(|k| k.recv_queue() > 0).unwrap_or(false);
            if unread || (died && !c.pending_tx.is_empty()) {
                // RFC 2525 §2.17 / Linux: closing with unread data resets the connection.
                let _ = e.tcp_abort(c.h);
            } else if !c.pending_tx.is_empty() {
                // First slice: bytes still queued in the daemon are sent as the engine takes
                // them; whatever it cannot take at once is lost with a reset.
                let (a, b) = c.pending_tx.as_slices();
                let mut ok = true;
                for part in [a, b] {
                    if !part.is_empty()
                        && e.tcp_send(c.h, part)
                            .map(|n| n < part.len())
                            .unwrap_or(true)
                    {
                        ok = false;
                    }
                }
                if !ok {
                    let _ = e.tcp_abort(c.h);
                }
            }
            let _ = e.tcp_close(c.h);
        }
        Sock::Failed(_) => {}
    }
}

fn service_conn(
    sh: &mut Shared,
    handle: u32,
    c: &mut Conn,
    evs: &mut Vec<EventRecord>,
    rx_head: &mut u64,
    rx_freed: u64,
    region: &SharedRegion,
) -> bool {
    let mut busy = false;
    let e = &mut sh.lo.engines[c.eng];
    if c.closed_told {
        return false;
    }
    let open = e.tcp_conn(c.h).map(|k| k.is_open()).unwrap_or(false);
    if let Some(err) = e.tcp_error(c.h) {
        if let Some(id) = c.connect_id.take() {
            evs.push(EventRecord::completion(id, handle, Err(err)));
        }
        // Deliver what was received before the error? The engine drops it on a reset.
        evs.push(EventRecord {
            kind: EventKind::Closed,
            id: 0,
            handle,
            result: -(err.errno() as i64),
            offset: 0,
            len: 0,
        });
        c.closed_told = true;
        return true;
    }
    if open && !c.open_told {
        c.open_told = true;
        busy = true;
        if let Some(id) = c.connect_id.take() {
            evs.push(EventRecord::completion(id, handle, Ok(handle as u64)));
        } else {
            evs.push(writable(handle, 0));
        }
    }
    // Application bytes into the engine.
    if c.open_told && !c.pending_tx.is_empty() {
        let mut taken = 0u64;
        while !c.pending_tx.is_empty() {
            let (a, _) = c.pending_tx.as_slices();
            match e.tcp_send(c.h, a) {
                Ok(0) | Err(SocketError::WouldBlock) => break,
                Ok(n) => {
                    c.pending_tx.drain(..n);
                    taken += n as u64;
                }
                Err(_) => break, // reported by the error check next turn
            }
        }
        if taken > 0 {
            busy = true;
            evs.push(writable(handle, taken));
        }
    }
    if c.shutdown_pending && c.pending_tx.is_empty() && c.open_told {
        c.shutdown_pending = false;
        let _ = e.tcp_shutdown(c.h);
        busy = true;
    }
    // Urgent delivery: received bytes straight into the application's receive area.
    while !c.eof_told {
        let area_free = RX_SIZE as u64 - (*rx_head - rx_freed);
        let pos = *rx_head % RX_SIZE as u64;
        let to_end = RX_SIZE as u64 - pos;
        let room = SOCK_RCVBUF
            .saturating_sub(c.outstanding)
            .min(area_free)
            .min(to_end);
        let chunk = (room as usize).min(sh.scratch.len());
        if chunk == 0 {
            break;
        }
        match e.tcp_recv(c.h, &mut sh.scratch[..chunk]) {
            Ok(0) => {
                evs.push(EventRecord {
                    kind: EventKind::Closed,
                    id: 0,
                    handle,
                    result: 0,
                    offset: 0,
                    len: 0,
                });
                c.eof_told = true;
                return true;
            }
            Ok(n) => {
                let _ = region.write_at(LAYOUT.rx_off + pos as usize, &sh.scratch[..n]);
                *rx_head += n as u64;
                c.outstanding += n as u64;
                evs.push(EventRecord {
                    kind: EventKind::Data,
                    id: 0,
                    handle,
                    result: n as i64,
                    offset: pos,
                    len: n as u64,
                });
                busy = true;
            }
            Err(_) => break,
        }
    }
    busy
}

fn writable(handle: u32, len: u64) -> EventRecord {
    EventRecord {
        kind: EventKind::Writable,
        id: 0,
        handle,
        result: 0,
        offset: 0,
        len,
    }
}
