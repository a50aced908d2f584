//! The application side of `flowstackd`: socket calls over the daemon's shared-memory rings.
//!
//! An application registers with [`Client::connect`] (a unix socket; the daemon checks who we
//! are with `SO_PEERCRED`) and receives a sealed memfd holding its rings and data areas and
//! the daemon's doorbell eventfd. From then on no system call is made per message while both
//! sides are busy.
//!
//! # The three modes (seed 001's host interface)
//! - **Async** — `tcp_listen`, `tcp_connect` (the [`Sockets`] one), `tcp_send`,
//!   `tcp_set_nodelay`, `tcp_shutdown`, `tcp_abort`, `tcp_close`: the command is posted and
//!   the call returns. A failure comes back later as an event and is reported by the next call
//!   on that socket (as the kernel does for non-blocking sockets), e.g. `EADDRINUSE` from the
//!   `tcp_accept` after a `tcp_listen` on a taken port.
//! - **Sync** — [`Client::connect_to`], [`Client::accept`], [`Client::close`],
//!   [`Client::recv`] when nothing is buffered: the caller waits for the daemon's completion
//!   (or event), sleeping on the event ring's futex after a short spin.
//! - **Urgent** — the daemon writes received bytes into this application's receive area and
//!   posts one `Data` event per message; a `tcp_recv` that finds bytes is a memory read.
//!
//! Handles are the daemon's per-application numbers: listen and connect handles are assigned
//! in command order from 1 (both sides count, so an async call knows its handle), accepted
//! connections from [`layout::ACCEPTED_BASE`]. First slice: handles are not reused.
//!
//! # Faults
//! If the daemon dies, every waiting call returns [`SocketError::ConnectionReset`] within
//! [`LIVENESS_CHECK`] (the registration socket reads end-of-file), never hangs.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod changes;
mod dgram;
mod fused;
mod held;
pub mod layout;
pub mod posix;
mod sockets;

use flowstack_api::ids::{IdMap, IdSet};
use flowstack_api::record::{
    check_span, Command, CommandRecord, EventKind, EventRecord, Mode, RECORD_LEN,
};
use flowstack_api::{Readiness, SocketError, Sockets, TcpHandle, UdpHandle};
use flowstack_sys::eventfd::EventFd;
use flowstack_sys::ownfd::Own;
use flowstack_sys::ring::{Consumer, Producer, RingLayout};
use flowstack_sys::SharedRegion;
use layout::SOCK_RCVBUF;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest single sleep of a waiting call: the daemon's liveness is checked at least this often.
pub const LIVENESS_CHECK: Duration = Duration::from_millis(100);
/// Default spin before sleeping on the event ring ([`Client::set_spin`], `FLOWSTACK_SPIN_US`).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// The spin from `FLOWSTACK_SPIN_US` (microseconds), else [`DEFAULT_SPIN`].
fn spin_from_env() -> Duration {
    std::env::var("FLOWSTACK_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_micros)
        .unwrap_or(DEFAULT_SPIN)
}
/// Events drained per pass.
const EVENT_BUDGET: usize = 1024;

/// Why registration failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The unix socket could not be reached.
    Io(io::Error),
    /// The daemon's answer or region is not what this version expects.
    Protocol(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Io(e) => write!(f, "cannot reach flowstackd: {e}"),
            ConnectError::Protocol(m) => write!(f, "flowstackd protocol: {m}"),
        }
    }
}

impl std::error::Error for ConnectError {}

impl From<io::Error> for ConnectError {
    fn from(e: io::Error) -> Self {
        ConnectError::Io(e)
    }
}

/// Moves the first bytes of `rx` into `buf` (as many as fit) with at most two block copies;
/// returns how many. (A byte-by-byte drain of the deque cost the receiving application more
/// CPU than everything else it did in `bench stream --peer offload`.)
pub(crate) fn take_front(rx: &mut VecDeque<u8>, buf: &mut [u8]) -> usize {
    let n = copy_front(rx, buf);
    rx.drain(..n);
    n
}

/// Copies the front of `rx` into `buf` (block copies, across the deque's wrap), leaving it
/// in `rx`; how many bytes.
pub(crate) fn copy_front(rx: &VecDeque<u8>, buf: &mut [u8]) -> usize {
    let n = buf.len().min(rx.len());
    let (a, b) = rx.as_slices();
    let k = n.min(a.len());
    buf[..k].copy_from_slice(&a[..k]);
    buf[k..n].copy_from_slice(&b[..n - k]);
    n
}

impl Sock {
    /// Delivered bytes not yet read: copied out (`rx`) or still in the area (`held`).
    fn unread(&self) -> usize {
        self.rx.len() + self.held + self.piped()
    }
}

fn proto(m: impl Into<String>) -> ConnectError {
    ConnectError::Protocol(m.into())
}

/// What the client knows about one of its sockets.
#[derive(Debug, Default)]
struct Sock {
    listener: bool,
    /// Delivered bytes not yet read by the application, copied out of the receive area.
    rx: VecDeque<u8>,
    /// Delivered bytes not yet read, still in the receive area (after those in `rx`; see
    /// `held`).
    held: usize,
    /// Read with `tcp_recv`: its bytes are held in the area until read (`held`).
    direct: bool,
    /// Bytes read but not yet reported to the daemon (receive window credit).
    unreported: u64,
    /// Bytes posted and not yet taken by the engine.
    unflushed: u64,
    open: bool,
    eof: bool,
    error: Option<SocketError>,
    /// Accepted connections not yet handed to the application (listeners).
    accepted: VecDeque<u32>,
    /// Events that may have made it readable / writable, counted (edge-triggered waits).
    rgen: u32,
    wgen: u32,
    /// A send found no room and filled the placeholder (`posix`): unwritable until a
    /// `Writable` event or the placeholder is writable again (`Posix::unblock`).
    blocked: bool,
    /// Listeners: the accept posted by [`Client::accept`] still in flight (its id, and
    /// whether it was asked ahead of a call).
    ahead: Option<(u32, bool)>,
    /// Listeners: an accept posted by [`Client::accept`] failed; the next one returns it.
    accept_err: Option<SocketError>,
    /// An accepted connection's peer as its accept's completion said (`GetAddr`'s encoding:
    /// address in bits 16..48, port below; 0: not said, an older daemon).
    peer: u64,
    /// Datagram sockets (`posix::udp`): the datagrams in `rx`, oldest first (source,
    /// length).
    dgrams: VecDeque<(std::net::SocketAddrV4, usize)>,
    /// Another process may hold it (adopted, given up before a fork, or `Unheld`): the
    /// daemon delivers its bytes elsewhere until this process asks (`posix::hold`).
    unheld: bool,
    /// A fused connection's pipe (`fused`).
    pipe: Option<Box<fused::SockPipe>>,
    /// Read in place (`tcp_consume` called): a fused pipe's bytes are moved into `rx`.
    peeking: bool,
    /// The wake-up id an empty pipe asks for (`fused`): this process's own while the shim's
    /// epoll computes the socket's readiness here (quiet), 0 (the daemon) otherwise.
    pipe_who: u32,
}

/// A registered application: its rings, its data areas and its sockets.
pub struct Client {
    region: Arc<SharedRegion>,
    cmd: Producer,
    evt: Consumer,
    /// The library's own descriptors (`flowstack_sys::ownfd`): moved out of the program's
    /// way, noted until dropped.
    bell: Own<EventFd>,
    stream: Own<UnixStream>,
    app_id: u64,
    tx_off: usize,
    tx_size: u64,
    tx_head: u64,
    rx_off: usize,
    rx_size: u64,
    rx_freed: u64,
    next_id: u32,
    next_handle: u32,
    socks: IdMap<u32, Sock>,
    /// Ids of sync calls waiting for their completion.
    waiting: IdSet<u32>,
    /// Completions of sync calls, by id.
    done: IdMap<u32, (u32, Result<u64, SocketError>)>,
    /// Sync accepts given up by their caller: the listener that gets the connection.
    orphan_accepts: IdMap<u32, u32>,
    /// Accept calls in flight: their connection's socket must exist before the events that
    /// follow the completion in the same batch (data already received) are handled.
    accept_ids: IdSet<u32>,
    dead: bool,
    /// Bounded spin on the event ring before a waiting call sleeps on its futex.
    spin: Duration,
    /// When the daemon's liveness was last checked (a read on the registration socket).
    last_liveness: Instant,
    /// Times a waiting call slept on the event ring's futex ([`Client::sleeps`]).
    sleeps: u64,
    /// The last send found no room in the transmit area (not its credit): a wait re-reads
    /// `TX_FREED` after announcing it (`wait_wanting_writable`), as the daemon reads the
    /// announcement after publishing it.
    area_blocked: bool,
    /// Per connection, zero-copy send tokens as the engine numbers them (from 0, completing
    /// in order): the next to report and the next to issue. Two counters, so completions
    /// nobody takes cost nothing.
    zc_tokens: IdMap<u32, (u64, u64)>,
    /// Posts leave the doorbell to the caller (several records, one doorbell).
    hold_bell: bool,
    /// Passes of [`Client::pump`] that took at least one event (a waiter that saw the same
    /// value before announcing sleep missed nothing, see `posix::fast`).
    gen: u64,
    /// Scratch for [`Client::pump`].
    evs: Vec<EventRecord>,
    /// The receive area's spans not yet released, in delivery order (`held`).
    spans: VecDeque<held::Span>,
    /// Bytes of `spans` (the receive area not yet released).
    span_bytes: u64,
    /// Bytes copied out of the receive area into sockets' queues ([`Client::rx_copied`]).
    rx_copied: u64,
    /// Sockets that may have changed, for the shim's epoll (`changes`).
    changes: changes::Changes,
    /// The POSIX layer's placeholders handed to the daemon ahead, oldest first (A's; see
    /// `posix::pool`). Dropped — closed in this process only — with the client, so a
    /// forked child's copies go when it forgets its parent's client. The flag: A's open
    /// file description may be non-blocking (a recycled A).
    pooled: VecDeque<(Own<OwnedFd>, bool)>,
    /// Recycled A's (`Forget { recycle }` posted, oldest first, with its call id) until the
    /// daemon's answer lets them back into the pool (`posix::pool`).
    recycling: VecDeque<(u32, Own<OwnedFd>)>,
    /// Pipe descriptors the daemon sent, by token, until their `Fused` event (`fused`).
    pipe_fds: VecDeque<fused::Waiting>,
    /// This process's wake-up id (0: none; its channel is not a pipe, or not made yet).
    wake_id: u32,
    /// Peers' wake-up channels, by their id, while a fused socket names them (`fused`).
    peer_wakes: Vec<(u32, std::sync::Weak<Own<OwnedFd>>)>,
    /// A fused socket was set up here: peers may hold a write end of the wake-up channel,
    /// so its hang-up no longer tells the daemon's death (sleeps are bounded).
    peers_wake: bool,
    /// Sockets told `Fused` (some may be gone), and those of them read in place.
    fused: Vec<u32>,
    pulls: Vec<u32>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("app_id", &self.app_id)
            .field("sockets", &self.socks.len())
            .field("dead", &self.dead)
            .finish()
    }
}

fn header_u64(r: &SharedRegion, at: usize) -> Result<u64, ConnectError> {
    r.atomic_u64(at)
        .map(|a| a.load(Ordering::Acquire))
        .ok_or_else(|| proto("region smaller than its header"))
}

/// Checks that `off..off+size` lies in the region after the header.
fn area(r: &SharedRegion, off: u64, size: u64) -> Result<(usize, u64), ConnectError> {
    let end = off
        .checked_add(size)
        .ok_or_else(|| proto("area overflows"))?;
    if off < layout::HEADER_BYTES as u64 || end > r.len() as u64 || size == 0 {
        return Err(proto("area outside the region"));
    }
    Ok((off as usize, size))
}

impl Client {
    /// Registers with the daemon listening on the unix socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, ConnectError> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        std::io::Write::write_all(&mut &stream, layout::REGISTER)?;
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        let n = flowstack_sys::fdpass::recv_fds(&stream, &mut buf, &mut fds)?;
        if n != 8 || &buf != layout::HELLO || fds.len() != 2 {
            return Err(proto("unexpected registration answer"));
        }
        let bell_fd = fds.pop().expect("two descriptors");
        let mem_fd = fds.pop().expect("two descriptors");
        // The mapping keeps the memfd: no descriptor of it stays in the process.
        let region = Arc::new(SharedRegion::map_fd(mem_fd)?);
        let bell: Own<EventFd> = Own::lift(bell_fd);
        if header_u64(&region, layout::at::MAGIC)? != layout::MAGIC {
            return Err(proto("bad region magic"));
        }
        let version = region
            .atomic_u32(layout::at::VERSION)
            .map(|v| v.load(Ordering::Acquire))
            .unwrap_or(0);
        if version != flowstack_api::record::VERSION as u32 {
            return Err(proto(format!("record version {version} (we speak {})", {
                flowstack_api::record::VERSION
            })));
        }
        let ring = |off_at, cap_at| -> Result<RingLayout, ConnectError> {
            let off = header_u64(&region, off_at)?;
            let cap = header_u64(&region, cap_at)?;
            area(&region, off, cap)?;
            Ok(RingLayout {
                offset: off as usize,
                capacity: cap as usize,
                max_record: RECORD_LEN,
            })
        };
        let cmd_l = ring(layout::at::CMD_OFF, layout::at::CMD_CAP)?;
        let evt_l = ring(layout::at::EVT_OFF, layout::at::EVT_CAP)?;
        let cmd = Producer::new(region.clone(), cmd_l).map_err(|e| proto(e.to_string()))?;
        let evt = Consumer::new(region.clone(), evt_l).map_err(|e| proto(e.to_string()))?;
        let (tx_off, tx_size) = area(
            &region,
            header_u64(&region, layout::at::TX_OFF)?,
            header_u64(&region, layout::at::TX_SIZE)?,
        )?;
        let (rx_off, rx_size) = area(
            &region,
            header_u64(&region, layout::at::RX_OFF)?,
            header_u64(&region, layout::at::RX_SIZE)?,
        )?;
        let app_id = header_u64(&region, layout::at::APP_ID)?;
        stream.set_nonblocking(true)?;
        let stream: Own<UnixStream> = Own::lift(OwnedFd::from(stream));
        Ok(Self {
            region,
            cmd,
            evt,
            bell,
            stream,
            spin: spin_from_env(),
            last_liveness: Instant::now(),
            pooled: VecDeque::new(),
            recycling: VecDeque::new(),
            pipe_fds: VecDeque::new(),
            wake_id: 0,
            peer_wakes: Vec::new(),
            peers_wake: false,
            fused: Vec::new(),
            pulls: Vec::new(),
            sleeps: 0,
            area_blocked: false,
            app_id,
            tx_off,
            tx_size,
            tx_head: 0,
            rx_off,
            rx_size,
            rx_freed: 0,
            next_id: 1,
            next_handle: 1,
            socks: IdMap::default(),
            waiting: IdSet::default(),
            done: IdMap::default(),
            orphan_accepts: IdMap::default(),
            accept_ids: IdSet::default(),
            dead: false,
            zc_tokens: IdMap::default(),
            hold_bell: false,
            gen: 0,
            evs: Vec::new(),
            spans: VecDeque::new(),
            span_bytes: 0,
            rx_copied: 0,
            changes: changes::Changes::new(),
        })
    }

    /// The daemon's number for this application.
    pub fn app_id(&self) -> u64 {
        self.app_id
    }

    /// False once the daemon is known to be gone.
    pub fn daemon_alive(&mut self) -> bool {
        self.check_daemon();
        !self.dead
    }

    fn check_daemon(&mut self) {
        if self.dead {
            return;
        }
        self.read_stream();
    }

    // ---- posting commands ---------------------------------------------------------------

    fn post(&mut self, mode: Mode, cmd: Command) -> Result<u32, SocketError> {
        if self.dead {
            return Err(SocketError::ConnectionReset);
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let rec = CommandRecord { id, mode, cmd };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = self.cmd.push_with(RECORD_LEN, |b| {
                let b: &mut [u8; RECORD_LEN] = b.try_into().expect("record length");
                rec.encode(b);
            });
            match r {
                Ok(()) => break,
                Err(flowstack_sys::ring::RingError::Full) => {
                    // The daemon is behind: let it run, keep draining our events.
                    self.ring_doorbell();
                    self.pump();
                    self.check_daemon();
                    if self.dead || Instant::now() > deadline {
                        return Err(SocketError::ConnectionReset);
                    }
                    std::thread::yield_now();
                }
                Err(_) => {
                    self.dead = true;
                    return Err(SocketError::ConnectionReset);
                }
            }
        }
        if !self.hold_bell {
            self.ring_doorbell();
        }
        if mode == Mode::Sync {
            self.waiting.insert(id);
        }
        if matches!(cmd, Command::TcpAccept { .. }) {
            self.accept_ids.insert(id);
        }
        Ok(id)
    }

    /// Publishes posted commands and wakes the daemon if it announced that it sleeps.
    fn ring_doorbell(&mut self) {
        self.cmd.publish();
        // Pairs with the daemon's store of `daemon_sleeping` and its fence before it checks
        // the rings once more: either it sees our records or we see it sleeping. Taken
        // (swapped to 0), so one ring per announced sleep: the bell stays rung until the
        // daemon reads it, and whatever this process posts meanwhile is drained by the turn
        // that wake-up starts (nginx rang 3.4 times per ab connection for 2.6 daemon sleeps).
        fence(Ordering::SeqCst);
        let sleeping = self
            .region
            .atomic_u32(layout::at::DAEMON_SLEEPING)
            .map(|a| a.swap(0, Ordering::SeqCst))
            .unwrap_or(1);
        if sleeping != 0 {
            let _ = self.bell.signal();
        }
    }

    fn alloc_handle(&mut self) -> u32 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    // ---- events -------------------------------------------------------------------------

    /// Drains the event ring: completions, urgent data, readiness. Returns how many events.
    pub fn pump(&mut self) -> usize {
        // Reused between passes: no allocation per call once warm.
        let mut evs = std::mem::take(&mut self.evs);
        evs.clear();
        let r = self.evt.recv(EVENT_BUDGET, |b| {
            if let Ok(b) = <&[u8; RECORD_LEN]>::try_from(b) {
                if let Ok(e) = EventRecord::decode(b) {
                    evs.push(e);
                }
            }
        });
        if r.is_err() {
            self.dead = true;
        }
        let n = evs.len();
        if n > 0 {
            self.gen += 1;
        }
        for e in evs.drain(..) {
            self.changes.note(e.handle);
            self.on_event(e);
        }
        self.evs = evs;
        if n > 0 {
            self.relieve_rx();
        }
        if !self.pulls.is_empty() {
            self.pull_pipes();
        }
        n
    }

    fn on_event(&mut self, e: EventRecord) {
        match e.kind {
            EventKind::Completion => {
                if self.accept_ids.remove(&e.id) {
                    if let Ok(h) = e.outcome() {
                        self.socks.entry(h as u32).or_insert_with(|| Sock {
                            open: true,
                            peer: e.offset,
                            ..Sock::default()
                        });
                    }
                }
                if let Some(listener) = self.orphan_accepts.remove(&e.id) {
                    self.accept_answered(listener, e.id, e.outcome());
                } else if self.waiting.remove(&e.id) {
                    self.done.insert(e.id, (e.handle, e.outcome()));
                } else if let Err(err) = e.outcome() {
                    // An async call failed: reported by the next call on that socket.
                    if let Some(s) = self.socks.get_mut(&e.handle) {
                        s.error = Some(err);
                        s.rgen = s.rgen.wrapping_add(1);
                        s.wgen = s.wgen.wrapping_add(1);
                    }
                }
            }
            EventKind::Data => {
                let Ok((off, len)) = check_span(e.offset, e.len, self.rx_size as usize) else {
                    self.dead = true;
                    return;
                };
                self.on_data(e.handle, off, len);
            }
            EventKind::Datagram => self.on_datagram(&e),
            EventKind::Writable => {
                if let Some(s) = self.socks.get_mut(&e.handle) {
                    // An edge only when it becomes writable (as the kernel's write-space
                    // wake-up after a full buffer), not for every returned credit.
                    if !s.open || s.blocked || s.unflushed >= flowstack_api::region::SOCK_SNDBUF {
                        s.blocked = false;
                        s.wgen = s.wgen.wrapping_add(1);
                    }
                    s.open = true;
                    s.unflushed = s.unflushed.saturating_sub(e.len);
                }
            }
            EventKind::Readable => {
                if let Some(s) = self.socks.get_mut(&e.handle) {
                    s.rgen = s.rgen.wrapping_add(1);
                }
            }
            EventKind::Fused | EventKind::PipeOpen | EventKind::PipeNews => self.on_pipe_event(&e),
            EventKind::Unheld => {
                if let Some(s) = self.socks.get_mut(&e.handle) {
                    s.unheld = true;
                }
            }
            EventKind::Closed => {
                if let Some(s) = self.socks.get_mut(&e.handle) {
                    s.eof = true;
                    s.rgen = s.rgen.wrapping_add(1);
                    s.wgen = s.wgen.wrapping_add(1);
                    if e.result < 0 {
                        s.error = Some(e.outcome().err().unwrap_or(SocketError::ConnectionReset));
                    }
                }
            }
        }
    }

    /// An answer to an accept of `listener` posted by [`Client::accept`]: into the
    /// listener's queue (its error is returned by the next accept). If the listener was
    /// closed meanwhile, the connection is closed.
    fn accept_answered(&mut self, listener: u32, id: u32, r: Result<u64, SocketError>) {
        let Some(s) = self.socks.get_mut(&listener) else {
            if let Ok(h) = r {
                let _ = self.tcp_close(TcpHandle::from_raw(h as u32 as usize));
            }
            return;
        };
        let mut early = false;
        if let Some((i, a)) = s.ahead {
            if i == id {
                s.ahead = None;
                early = a;
            }
        }
        match r {
            Ok(h) => self.new_accepted(listener, h as u32),
            // Asked ahead while the application held as many sockets as it may: the
            // limit may be gone when it does call (it closes one first), so it asks again.
            Err(SocketError::LimitReached) if early => {}
            Err(e) => {
                s.accept_err = Some(e);
                s.rgen = s.rgen.wrapping_add(1);
                self.changes.note(listener);
            }
        }
    }

    fn new_accepted(&mut self, listener: u32, h: u32) {
        self.socks.entry(h).or_insert_with(|| Sock {
            open: true,
            ..Sock::default()
        });
        if let Some(l) = self.socks.get_mut(&listener) {
            l.accepted.push_back(h);
            l.rgen = l.rgen.wrapping_add(1);
            self.changes.note(listener);
        }
    }

    /// Waits until an event arrived, the deadline passed, or the daemon is gone.
    fn wait_event(&mut self, deadline: Instant) -> Result<(), SocketError> {
        if self.pump() > 0 {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(SocketError::TimedOut);
        }
        let slice = (deadline - now).min(LIVENESS_CHECK);
        if self.evt.wait(self.spin, slice) == flowstack_sys::ring::Waited::Slept {
            self.sleeps += 1;
        }
        // An event that arrived (while spinning or by a wake-up) shows the daemon at work;
        // a dead one posts no more, so the next wait ends empty and checks. No read(2) per
        // message, and still at least one check per LIVENESS_CHECK.
        if !self.evt.pending() || self.last_liveness.elapsed() >= LIVENESS_CHECK {
            self.last_liveness = Instant::now();
            self.check_daemon();
        }
        if self.dead {
            return Err(SocketError::ConnectionReset);
        }
        self.pump();
        Ok(())
    }

    /// Received bytes copied out of the receive area into a socket's queue (not read straight
    /// from the area: see `held`): a second copy of each of them.
    pub fn rx_copied(&self) -> u64 {
        self.rx_copied
    }

    /// How many times a waiting call slept on the futex (each one a system call, usually a
    /// context switch, and a wake-up system call in the daemon).
    pub fn sleeps(&self) -> u64 {
        self.sleeps
    }

    /// Sets how long a waiting call spins on the event ring before it sleeps on the futex
    /// (default `FLOWSTACK_SPIN_US` or [`DEFAULT_SPIN`]; zero sleeps at once). A spin catches
    /// an answer without a system call, at the price of the CPU it burns meanwhile.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Waits up to `timeout` for the daemon to post anything (data, readiness, completions);
    /// errors only if the daemon is gone.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), SocketError> {
        // A caller waiting for anything may wait for send space too.
        match self.wait_wanting_writable(Instant::now() + timeout) {
            Err(SocketError::TimedOut) => Ok(()),
            r => r,
        }
    }

    /// [`Client::wait_event`] with `wants_writable` set in the header meanwhile, so events
    /// that only return send credit wake us (the daemon publishes them quietly otherwise).
    /// The flag is stored (SeqCst) before the event ring's own sleep announcement and re-check.
    fn wait_wanting_writable(&mut self, deadline: Instant) -> Result<(), SocketError> {
        self.set_wants_writable(true);
        // Room the daemon freed before it could see the flag: no sleep (its publish is
        // sequentially consistent, and so is our flag store before this load).
        std::sync::atomic::fence(Ordering::SeqCst);
        let r = if std::mem::take(&mut self.area_blocked) && self.tx_room() > 0 {
            Ok(())
        } else {
            self.wait_event(deadline)
        };
        self.set_wants_writable(false);
        r
    }

    fn set_wants_writable(&self, on: bool) {
        if let Some(f) = self.region.atomic_u32(layout::at::APP_WANTS_WRITABLE) {
            f.store(on as u32, Ordering::SeqCst);
        }
    }

    /// Waits for the completion of sync call `id`.
    fn complete(&mut self, id: u32, timeout: Duration) -> Result<(u32, u64), SocketError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((h, r)) = self.done.remove(&id) {
                return r.map(|v| (h, v));
            }
            if let Err(e) = self.wait_event(deadline) {
                self.waiting.remove(&id);
                return Err(e);
            }
        }
    }

    fn sock(&self, h: TcpHandle) -> Result<&Sock, SocketError> {
        self.socks
            .get(&(h.index() as u32))
            .ok_or(SocketError::InvalidHandle)
    }

    fn sock_mut(&mut self, h: TcpHandle) -> Result<&mut Sock, SocketError> {
        self.socks
            .get_mut(&(h.index() as u32))
            .ok_or(SocketError::InvalidHandle)
    }

    fn raw(h: TcpHandle) -> Result<u32, SocketError> {
        u32::try_from(h.index())
            .ok()
            .filter(|&h| h <= flowstack_api::record::MAX_HANDLE)
            .ok_or(SocketError::InvalidHandle)
    }

    // ---- sync calls ---------------------------------------------------------------------

    /// Sync connect: opens a connection and waits for the handshake (or its failure).
    pub fn connect_to(
        &mut self,
        remote: SocketAddrV4,
        timeout: Duration,
    ) -> Result<TcpHandle, SocketError> {
        self.connect_send(remote, &[], timeout).map(|(h, _)| h)
    }

    /// Sync connect with the first bytes posted right behind it, in the same ring batch:
    /// the daemon hands them to the engine during the handshake, so they leave with its
    /// last ACK and reach the server with (usually in the same batch as) its accept's
    /// completion — one wake-up there instead of two. Returns the connection and how many
    /// of `first` were taken (as [`Sockets::tcp_send`]: what fits the send buffer; the
    /// caller sends the rest). If the connect fails, the bytes are dropped with it.
    pub fn connect_send(
        &mut self,
        remote: SocketAddrV4,
        first: &[u8],
        timeout: Duration,
    ) -> Result<(TcpHandle, usize), SocketError> {
        let h = self.alloc_handle();
        let handle = TcpHandle::from_raw(h as usize);
        self.socks.insert(h, Sock::default());
        // One doorbell for both records: a sleeping daemon wakes to find them together.
        self.hold_bell = true;
        let posted = self.post(Mode::Sync, Command::TcpConnect { remote });
        let sent = match posted {
            Ok(_) if !first.is_empty() => self.tcp_send(handle, first),
            _ => Ok(0),
        };
        self.hold_bell = false;
        self.ring_doorbell();
        let id = posted?;
        let r = sent.or_else(|e| match e {
            SocketError::WouldBlock => Ok(0),
            e => Err(e),
        });
        match r.and_then(|n| self.complete(id, timeout).map(|_| n)) {
            Ok(n) => {
                if let Some(s) = self.socks.get_mut(&h) {
                    s.open = true;
                }
                Ok((handle, n))
            }
            Err(e) => {
                self.waiting.remove(&id);
                let _ = self.tcp_close(handle);
                Err(e)
            }
        }
    }

    /// Sync accept: waits up to `timeout` for a connection on `listener`.
    ///
    /// Once an accept has returned a connection, the next one is asked for at once
    /// (*accept-ahead*): the daemon holds it like any waiting accept, and its answer lands
    /// in the listener's queue — often in the same batch of events as the previous
    /// connection's end, so a server looping accept → recv → close wakes once per
    /// connection less. Like the kernel's backlog, the daemon completes and holds one such
    /// connection before it is asked for; it is closed with the listener if never taken.
    /// An accept that times out leaves its request in flight for the next call.
    pub fn accept(
        &mut self,
        listener: TcpHandle,
        timeout: Duration,
    ) -> Result<TcpHandle, SocketError> {
        let l = Self::raw(listener)?;
        let deadline = Instant::now() + timeout;
        loop {
            self.pump();
            let s = self.sock_mut(listener)?;
            if let Some(h) = s.accepted.pop_front() {
                if s.ahead.is_none() {
                    self.ask_accept(l, true)?;
                }
                return Ok(TcpHandle::from_raw(h as usize));
            }
            if let Some(e) = s.accept_err.take().or(s.error) {
                return Err(e);
            }
            if s.ahead.is_none() {
                self.ask_accept(l, false)?;
            }
            self.wait_event(deadline)?;
        }
    }

    /// Posts a sync accept on listener `l` whose answer goes to the listener's queue;
    /// `ahead`: asked before the application called (see [`Client::accept`]).
    fn ask_accept(&mut self, l: u32, ahead: bool) -> Result<(), SocketError> {
        let id = self.post(Mode::Sync, Command::TcpAccept { listener: l })?;
        self.waiting.remove(&id);
        self.orphan_accepts.insert(id, l);
        if let Some(s) = self.socks.get_mut(&l) {
            s.ahead = Some((id, ahead));
        }
        Ok(())
    }

    /// Receives at least one byte, waiting up to `timeout` when nothing is buffered;
    /// `Ok(0)` is end of stream.
    pub fn recv(
        &mut self,
        h: TcpHandle,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, SocketError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.tcp_recv(h, buf) {
                Err(SocketError::WouldBlock) => self.wait_event(deadline)?,
                r => return r,
            }
        }
    }

    /// Sends all of `data`, waiting for send space up to `timeout`.
    pub fn send_all(
        &mut self,
        h: TcpHandle,
        mut data: &[u8],
        timeout: Duration,
    ) -> Result<(), SocketError> {
        let deadline = Instant::now() + timeout;
        while !data.is_empty() {
            match self.tcp_send(h, data) {
                Ok(n) => data = &data[n..],
                Err(SocketError::WouldBlock) => self.wait_wanting_writable(deadline)?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Close: releases the handle. A listener's close waits for the daemon to take it, so
    /// its port is free for any process once this returns. A connection's does not wait
    /// (one futex sleep and wake-up less per short connection): the daemon takes the close
    /// before anything this application posts later (the command ring is in order), so a
    /// later connect, listen or socket count already sees it released; another process
    /// could not rely on the port anyway (the kernel keeps it in TIME-WAIT).
    pub fn close(&mut self, h: TcpHandle, timeout: Duration) -> Result<(), SocketError> {
        self.close_mode(h, false, timeout)
    }

    /// Close in sync mode, a connection's too: returns once the daemon has taken the close
    /// (the socket released, its FIN or RST queued, its memory accounted free), or fails
    /// with the daemon's error or `TimedOut`. For an application that must know the close
    /// happened before it goes on — e.g. that `flowstack stats` or another process no longer
    /// sees the socket — at the cost of one wait for the daemon.
    pub fn close_sync(&mut self, h: TcpHandle, timeout: Duration) -> Result<(), SocketError> {
        self.close_mode(h, true, timeout)
    }

    fn close_mode(
        &mut self,
        h: TcpHandle,
        sync: bool,
        timeout: Duration,
    ) -> Result<(), SocketError> {
        let raw = Self::raw(h)?;
        let s = self.socks.remove(&raw).ok_or(SocketError::InvalidHandle)?;
        // Its bytes still in the receive area are released with it.
        self.evict_sock(raw, false);
        self.zc_tokens.remove(&raw);
        self.drop_unclaimed(&s);
        let mode = if s.listener || sync {
            Mode::Sync
        } else {
            Mode::Async
        };
        let id = self.post(mode, Command::TcpClose { handle: raw })?;
        if mode == Mode::Async {
            return Ok(());
        }
        let r = self.complete(id, timeout).map(|_| ());
        if r.is_ok() {
            // The daemon dropped an accept still waiting with the listener, unanswered;
            // an answer posted before the close was taken before its completion.
            if let Some((ahead, _)) = s.ahead {
                self.orphan_accepts.remove(&ahead);
                self.accept_ids.remove(&ahead);
            }
        }
        r
    }

    /// Entries kept for accepts in flight (`orphan_accepts`, `accept_ids`): what a
    /// listener's close leaves nothing of.
    pub fn accepts_in_flight(&self) -> (usize, usize) {
        (self.orphan_accepts.len(), self.accept_ids.len())
    }

    /// A listener being closed: the connections accepted for it and never taken are
    /// closed too (the kernel resets those left in a closed listener's backlog).
    fn drop_unclaimed(&mut self, s: &Sock) {
        for &h in &s.accepted {
            if self.socks.remove(&h).is_some() {
                let _ = self.post(Mode::Async, Command::TcpClose { handle: h });
            }
        }
    }

    /// Free bytes in the transmit area: what the daemon has not yet freed (`TX_FREED`, read
    /// from shared memory and never trusted beyond what was written) is still in use.
    fn tx_room(&self) -> u64 {
        let freed = self
            .region
            .atomic_u64(layout::at::TX_FREED)
            .map(|a| a.load(Ordering::Acquire))
            .unwrap_or(0)
            .min(self.tx_head);
        self.tx_size - (self.tx_head - freed).min(self.tx_size)
    }

    fn report_consumed(&mut self, raw: u32, force: bool) {
        let Some(s) = self.socks.get_mut(&raw) else {
            return;
        };
        // Bytes read from a pipe were never the daemon's.
        if let Some(p) = &mut s.pipe {
            s.unreported = s.unreported.saturating_sub(std::mem::take(&mut p.taken));
        }
        let drained = s.unread() == 0;
        if s.unreported == 0 || !(force || drained || s.unreported >= SOCK_RCVBUF / 4) {
            return;
        }
        let len = std::mem::take(&mut s.unreported);
        let _ = self.post(Mode::Async, Command::TcpConsume { handle: raw, len });
    }
}

#[cfg(test)]
mod tests {
    use super::take_front;
    use std::collections::VecDeque;

    /// Bytes come out in order across the deque's wrap, and only as many as fit.
    #[test]
    fn take_front_copies_across_the_wrap() {
        let mut rx: VecDeque<u8> = VecDeque::with_capacity(8);
        rx.extend(0..6u8);
        rx.drain(..4);
        rx.extend(6..12u8); // wraps inside the deque's buffer
        let mut buf = [0u8; 5];
        assert_eq!(take_front(&mut rx, &mut buf), 5);
        assert_eq!(buf, [4, 5, 6, 7, 8]);
        let mut big = [0u8; 16];
        assert_eq!(take_front(&mut rx, &mut big), 3);
        assert_eq!(&big[..3], &[9, 10, 11]);
        assert!(rx.is_empty());
        assert_eq!(take_front(&mut rx, &mut big), 0);
    }
}
