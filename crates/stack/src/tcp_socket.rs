//! TCP sockets in the engine: the connection table with hashed 4-tuple demux, per-port
//! listeners with a bounded half-open queue and accept backlog, SYN cookies when the half-open
//! queue is full, and RSTs for segments that match nothing (RFC 9293 §3.10.7.1).

use crate::counters::{Counter, Counters};
use crate::demux::Demux;
use crate::iface::Iface;
use crate::SocketError;
use flowstack_link::TxPayload;
use flowstack_tcp::sendq::PayloadSrc;
use flowstack_tcp::{Connection, FourTuple, IcmpError, IsnGenerator, State, TcpConfig, TcpError};
use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
use flowstack_wire::tcp::{Flags, TcpOptions, TcpRepr};
use flowstack_wire::{Instant, PollAt, SeqNum};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

/// `ConnSock::scheduled` of a connection with no entry in the timer heap.
const UNSCHEDULED: u64 = u64::MAX;

/// `ConnSock::listener` of a connection no listener waits on.
const NO_LISTENER: u32 = u32::MAX;

/// A slot index as the table's lists and maps store it (half a `usize`: issue 19 counts
/// every byte a connection costs; the table holds fewer than 2³² slots).
type Slot = u32;

/// An entry of the timer heap: a deadline (nanoseconds) and a slot, in 12 bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(C, packed(4))]
struct Due {
    at: u64,
    slot: Slot,
}

/// Distinct socket configurations kept for sharing (most engines use one or two).
const SHARED_CONFIGS: usize = 8;

/// Engine-wide TCP limits.
#[derive(Debug, Clone, Copy)]
pub struct TcpLimits {
    /// Most connections (any state) at once.
    pub max_connections: usize,
    /// Most half-open (SYN-RECEIVED) connections per listener before SYN cookies are used.
    pub syn_backlog: usize,
    /// Default configuration for new sockets.
    pub defaults: TcpConfig,
}

impl Default for TcpLimits {
    fn default() -> Self {
        Self {
            max_connections: 16_384,
            syn_backlog: 256,
            defaults: TcpConfig::default(),
        }
    }
}

pub use flowstack_api::TcpHandle;

struct Listener {
    port: u16,
    /// Shared with every connection it accepts.
    cfg: Arc<TcpConfig>,
    backlog: usize,
    accept_q: VecDeque<usize>,
    half_open: usize,
}

struct ConnSock {
    conn: Connection,
    /// Queued in `ready`.
    ready: bool,
    /// The earliest deadline this connection has in the timer heap (nanoseconds;
    /// [`UNSCHEDULED`] for none: half the size of an `Option<Instant>`).
    scheduled: u64,
    /// Listener that created it, until it is queued for accept (a slot index;
    /// [`NO_LISTENER`] for none).
    listener: u32,
    /// The application holds a handle.
    owned: bool,
    /// Listed in `TcpSockets::time_wait` (set once it was seen in TIME-WAIT unowned).
    tw_listed: bool,
    /// Queued in `changed`.
    changed: bool,
}

/// A table entry, boxed whole: the slot is one pointer (`Option<Box<Sock>>`, 8 bytes), and
/// the variant tag sits in a niche of `ConnSock`, so a connection's box is no larger than
/// its `ConnSock`. (Listeners are few; a listener's box being a connection's size is the
/// price of a one-pointer slot for every connection.)
#[allow(clippy::large_enum_variant)]
enum Sock {
    Listener(Listener),
    Conn(ConnSock),
}

/// The TCP socket table of one engine.
pub(crate) struct TcpSockets {
    limits: TcpLimits,
    socks: Vec<Option<Box<Sock>>>,
    free: Vec<Slot>,
    conns: Demux,
    listeners: HashMap<u16, usize>,
    isn: IsnGenerator,
    count: usize,
    /// Connections with work to do at the next dispatch (input, an application call).
    ready: Vec<Slot>,
    /// Owned connections dispatched since their owner last asked ([`TcpSockets::take_changed`]):
    /// every segment, timer and application call that can change what the application sees
    /// (bytes received or acknowledged, the state, an error) passes through a dispatch, so
    /// this is a superset of the connections whose application-visible state changed.
    changed: Vec<Slot>,
    /// Timer deadlines (nanoseconds, slot); entries may be stale and are re-checked.
    timers: BinaryHeap<Reverse<Due>>,
    /// Slots seen entering TIME-WAIT without an owner, oldest first: what a full table gives
    /// up first. Entries can be stale (the slot expired or was reused) and are re-checked.
    time_wait: VecDeque<Slot>,
    /// Socket configurations in use, shared by the connections created with them (a
    /// connection holds a pointer, not a copy): the defaults first, then the most recent
    /// distinct ones.
    configs: Vec<Arc<TcpConfig>>,
    /// TCP's counters (kept apart from the interface's so a connection can count while the
    /// interface is busy sending its segments; the engine merges them when read).
    counters: Counters,
}

/// The entry in slot `i`, if any (a function of the slot vector alone, so the rest of the
/// table stays borrowable).
#[inline]
fn at_mut(socks: &mut [Option<Box<Sock>>], i: usize) -> Option<&mut Sock> {
    socks.get_mut(i).and_then(|s| s.as_deref_mut())
}

/// The 4-tuple of the connection in slot `s` (the demux map's key, kept only there).
#[inline]
fn key_of(socks: &[Option<Box<Sock>>], s: Slot) -> FourTuple {
    match socks.get(s as usize).and_then(|s| s.as_deref()) {
        Some(Sock::Conn(c)) => c.conn.tuple(),
        // Never: the map holds connection slots only, removed before the slot is freed. A
        // key with port 0 matches no segment's tuple.
        _ => {
            debug_assert!(false, "demux map names slot {s}, which holds no connection");
            FourTuple {
                local_ip: flowstack_wire::ipv4::Ipv4Address([0; 4]),
                local_port: 0,
                remote_ip: flowstack_wire::ipv4::Ipv4Address([0; 4]),
                remote_port: 0,
            }
        }
    }
}

/// A holder's share of a shared configuration: its size (with the `Arc` counts) divided
/// among its holders. (Connections count their own share the same way.)
fn shared_share(c: &Arc<TcpConfig>) -> usize {
    (std::mem::size_of::<TcpConfig>() + 2 * std::mem::size_of::<usize>()) / Arc::strong_count(c)
}

pub(crate) fn map_err(e: TcpError) -> SocketError {
    match e {
        TcpError::Refused => SocketError::ConnectionRefused,
        TcpError::Reset => SocketError::ConnectionReset,
        TcpError::TimedOut => SocketError::TimedOut,
        TcpError::Aborted => SocketError::ConnectionAborted,
        TcpError::Unreachable => SocketError::NoRoute,
    }
}

/// Sends one segment through the interface.
fn send_seg(now: Instant, iface: &mut Iface, t: &FourTuple, r: &TcpRepr, at: Option<PayloadSrc>) {
    let caps = iface.checksum();
    let (src, dst) = (t.local_ip, t.remote_ip);
    // A payload lying in a zero-copy send's shared memory leaves as a reference (header +
    // payload gathered by the device, as a NIC's scatter-gather DMA) when the device gathers
    // and no checksum has to read it; the segment is otherwise copied into the frame.
    let tail = at
        .filter(|_| iface.gathers() && !r.payload.is_empty())
        .and_then(|a| TxPayload::new(a.owner.clone(), a.start, r.payload.len()));
    let _ = match tail {
        Some(tail) => {
            let head = TcpRepr { payload: &[], ..*r };
            iface.send_ip_gather(
                now,
                src,
                dst,
                IpProtocol::Tcp,
                head.buffer_len(),
                tail,
                true,
                &mut |b| {
                    let _p = flowstack_prof::enter(flowstack_prof::Layer::TcpEmit);
                    // No checksum (`gathers`): the header alone is the segment's to write.
                    head.emit(b, src, dst, caps)
                },
            )
        }
        None => iface.send_ip_from(
            now,
            src,
            dst,
            IpProtocol::Tcp,
            r.buffer_len(),
            true,
            &mut |b| {
                // Header, options, payload copy and checksum: TCP output's work, done in the frame.
                let _p = flowstack_prof::enter(flowstack_prof::Layer::TcpEmit);
                r.emit(b, src, dst, caps)
            },
        ),
    };
}

impl TcpSockets {
    pub fn new(limits: TcpLimits, secret: [u8; 16]) -> Self {
        Self {
            limits,
            socks: Vec::new(),
            free: Vec::new(),
            conns: Demux::new(),
            listeners: HashMap::new(),
            isn: IsnGenerator::new(secret),
            count: 0,
            ready: Vec::new(),
            changed: Vec::new(),
            timers: BinaryHeap::new(),
            time_wait: VecDeque::new(),
            configs: vec![Arc::new(limits.defaults)],
            counters: Counters::default(),
        }
    }

    /// The shared copy of `cfg`: one already held if equal (connect time only, never per
    /// packet), else a new one remembered in place of the oldest non-default.
    fn shared_config(&mut self, cfg: TcpConfig) -> Arc<TcpConfig> {
        if let Some(c) = self.configs.iter().find(|c| ***c == cfg) {
            return c.clone();
        }
        let c = Arc::new(cfg);
        if self.configs.len() >= SHARED_CONFIGS {
            self.configs.remove(1);
        }
        self.configs.push(c.clone());
        c
    }

    pub fn defaults(&self) -> TcpConfig {
        self.limits.defaults
    }

    /// TCP's counters.
    #[inline]
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The slot of the connection with 4-tuple `t`.
    #[inline]
    fn conn_slot(&self, t: &FourTuple) -> Option<usize> {
        self.conns
            .get(t, |s| key_of(&self.socks, s))
            .map(|s| s as usize)
    }

    #[inline]
    fn slot(&self, i: usize) -> Option<&Sock> {
        self.socks.get(i).and_then(|s| s.as_deref())
    }

    fn insert(&mut self, s: Sock) -> usize {
        match self.free.pop().map(|i| i as usize) {
            Some(i) => {
                self.socks[i] = Some(Box::new(s));
                i
            }
            None => {
                self.socks.push(Some(Box::new(s)));
                self.socks.len() - 1
            }
        }
    }

    /// The application's handle of the connection with 4-tuple `t` (as this engine sees it:
    /// local, then remote), if one is open and owned.
    pub fn find(&self, t: &FourTuple) -> Option<TcpHandle> {
        let i = self.conn_slot(t)?;
        match self.slot(i) {
            Some(Sock::Conn(c)) if c.owned => Some(TcpHandle::from_raw(i)),
            _ => None,
        }
    }

    pub fn conn(&self, h: TcpHandle) -> Result<&Connection, SocketError> {
        match self.slot(h.index()) {
            Some(Sock::Conn(c)) if c.owned => Ok(&c.conn),
            _ => Err(SocketError::InvalidHandle),
        }
    }

    /// Mutable access for an application call. A call that changed what the connection has
    /// to send must [`TcpSockets::touch`] it.
    pub fn conn_mut(&mut self, h: TcpHandle) -> Result<&mut Connection, SocketError> {
        match at_mut(&mut self.socks, h.index()) {
            Some(Sock::Conn(c)) if c.owned => Ok(&mut c.conn),
            _ => Err(SocketError::InvalidHandle),
        }
    }

    /// Queues the connection for the next dispatch (it has something new to send or a timer
    /// changed).
    #[inline]
    pub fn touch(&mut self, h: TcpHandle) {
        self.mark_ready(h.index());
    }

    fn mark_ready(&mut self, i: usize) {
        if let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) {
            if !c.ready {
                c.ready = true;
                self.ready.push(i as Slot);
            }
        }
    }

    /// Records the connection's next deadline in the timer heap, unless an entry at or
    /// before it is already there (so the heap holds about one entry per connection).
    fn schedule(&mut self, i: usize) {
        if let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) {
            // `PollAt::Now` is keyed at the clock's origin: due at every `now`.
            if let Some(t) = c.conn.poll_at().instant_or(Instant::ZERO) {
                if t.as_nanos() < c.scheduled {
                    c.scheduled = t.as_nanos();
                    self.timers.push(Reverse(Due {
                        at: t.as_nanos(),
                        slot: i as Slot,
                    }));
                }
            }
        }
    }

    // ---- application calls -------------------------------------------------------------

    pub fn listen(
        &mut self,
        port: u16,
        backlog: usize,
        cfg: TcpConfig,
    ) -> Result<TcpHandle, SocketError> {
        if port == 0 || backlog == 0 {
            return Err(SocketError::InvalidArgument);
        }
        if self.listeners.contains_key(&port) {
            return Err(SocketError::AddrInUse);
        }
        let cfg = self.shared_config(cfg);
        let i = self.insert(Sock::Listener(Listener {
            port,
            cfg,
            backlog,
            accept_q: VecDeque::new(),
            half_open: 0,
        }));
        self.listeners.insert(port, i);
        Ok(TcpHandle::from_raw(i))
    }

    /// Connections waiting in a listener's accept queue.
    pub fn accept_queue_len(&self, h: TcpHandle) -> Result<usize, SocketError> {
        match self.slot(h.index()) {
            Some(Sock::Listener(l)) => Ok(l.accept_q.len()),
            _ => Err(SocketError::InvalidHandle),
        }
    }

    pub fn accept(&mut self, h: TcpHandle) -> Result<TcpHandle, SocketError> {
        let Some(Sock::Listener(l)) = at_mut(&mut self.socks, h.index()) else {
            return Err(SocketError::InvalidHandle);
        };
        let i = l.accept_q.pop_front().ok_or(SocketError::WouldBlock)?;
        if let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) {
            c.owned = true;
        }
        Ok(TcpHandle::from_raw(i))
    }

    pub fn connect(
        &mut self,
        now: Instant,
        tuple: FourTuple,
        cfg: TcpConfig,
    ) -> Result<TcpHandle, SocketError> {
        if self.count >= self.limits.max_connections && !self.evict_time_wait() {
            self.counters.inc(Counter::TcpExtTCPConnLimit);
            return Err(SocketError::LimitReached);
        }
        if let Some(old) = self.conn_slot(&tuple) {
            // Reuse a TIME-WAIT tuple for a new outgoing connection (as Linux's tcp_tw_reuse):
            // the new ISN comes from a clock that has moved on and timestamps (PAWS) reject old
            // duplicates, so only an orphaned TIME-WAIT entry may be replaced.
            if !self.is_reusable(old) {
                return Err(SocketError::AddrInUse);
            }
            self.remove(old);
        }
        let iss = self.isn.isn(&tuple, now);
        let conn = Connection::connect(self.shared_config(cfg), tuple, iss, now);
        let i = self.insert(Sock::Conn(ConnSock {
            conn,
            ready: false,
            scheduled: UNSCHEDULED,
            listener: NO_LISTENER,
            owned: true,
            tw_listed: false,
            changed: false,
        }));
        self.conns.insert(&tuple, i as Slot);
        self.count += 1;
        self.mark_ready(i);
        Ok(TcpHandle::from_raw(i))
    }

    /// True if `t` is taken by a connection that may not be replaced.
    pub fn tuple_in_use(&self, t: &FourTuple) -> bool {
        self.conn_slot(t).is_some_and(|i| !self.is_reusable(i))
    }

    /// An unowned connection in TIME-WAIT may give its tuple to a new outgoing connection.
    fn is_reusable(&self, i: usize) -> bool {
        matches!(self.slot(i), Some(Sock::Conn(c)) if !c.owned && c.conn.state() == State::TimeWait)
    }

    /// The application lets go of a connection's handle without closing it (the caller has
    /// already closed or aborted the connection); it lives on until CLOSED.
    pub fn release(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        match at_mut(&mut self.socks, h.index()) {
            Some(Sock::Conn(c)) if c.owned => {
                c.owned = false;
                self.mark_ready(h.index());
                Ok(())
            }
            _ => Err(SocketError::InvalidHandle),
        }
    }

    /// The application lets go of a handle. Listeners close at once (their queued
    /// connections are reset); connections close gracefully and live on until CLOSED.
    pub fn close(&mut self, now: Instant, h: TcpHandle) -> Result<(), SocketError> {
        match at_mut(&mut self.socks, h.index()) {
            Some(Sock::Listener(_)) => {
                let Some(Sock::Listener(l)) = self.socks[h.index()].take().map(|b| *b) else {
                    unreachable!()
                };
                self.free.push(h.index() as Slot);
                self.listeners.remove(&l.port);
                for i in l.accept_q {
                    if let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) {
                        c.conn.abort(now);
                    }
                    self.mark_ready(i);
                }
                // Half-open connections of this listener are aborted too.
                for s in self.socks.iter_mut().flatten() {
                    if let Sock::Conn(c) = &mut **s {
                        if c.listener == h.index() as u32 {
                            c.listener = NO_LISTENER;
                            c.conn.abort(now);
                        }
                    }
                }
                Ok(())
            }
            Some(Sock::Conn(c)) if c.owned => {
                c.owned = false;
                c.conn.close(now);
                self.mark_ready(h.index());
                Ok(())
            }
            _ => Err(SocketError::InvalidHandle),
        }
    }

    // ---- segment input -----------------------------------------------------------------

    pub fn input(&mut self, now: Instant, iface: &mut Iface, ip: &Ipv4Repr, seg: &TcpRepr) {
        self.input_to(now, iface, ip, seg, &mut |_, _| 0)
    }

    /// [`TcpSockets::input`], offering in-order data of a connection to `deliver`
    /// ([`crate::Engine::poll_to`]).
    pub fn input_to(
        &mut self,
        now: Instant,
        iface: &mut Iface,
        ip: &Ipv4Repr,
        seg: &TcpRepr,
        deliver: &mut crate::engine::Deliver,
    ) {
        if ip.src == ip.dst && seg.src_port == seg.dst_port {
            // A "land" segment (RFC 4987 §3.5 lists it among old attacks): it would match a
            // connection with itself. Linux drops it in the same way.
            return self.counters.inc(Counter::TcpExtTCPLandDrop);
        }
        let tuple = FourTuple {
            local_ip: ip.dst,
            local_port: seg.dst_port,
            remote_ip: ip.src,
            remote_port: seg.src_port,
        };
        if let Some(i) = self.conn_slot(&tuple) {
            if let Some(iss) = self.reopen(i, ip, iface, seg) {
                // The TIME-WAIT incarnation is forgotten; the SYN opens the next one.
                self.counters.inc(Counter::TcpExtTWReused);
                self.remove(i);
                if let Some(&l) = self.listeners.get(&seg.dst_port) {
                    self.listener_input(now, iface, l, tuple, seg, Some(iss));
                }
                return;
            }
            if let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) {
                if c.conn.state() == State::Closed {
                    // RFC 9293 §3.10.7.1: "If the state is CLOSED (i.e., TCB does not exist)
                    // [...] An incoming segment not containing a RST causes a RST to be sent
                    // in response." The connection is over (reset, aborted, timed out) and
                    // only its handle remains until the application releases it; the peer
                    // must learn that, as from a port with no socket.
                    self.counters.inc(Counter::TcpExtTCPNoSocket);
                    return self.reset_for(now, iface, &tuple, seg);
                }
                let h = TcpHandle::from_raw(i);
                c.conn
                    .on_segment_to(now, seg, &mut self.counters, &mut |d| deliver(h, d));
            }
            self.after_input(i);
            return;
        }
        if !iface.owns(ip.dst) {
            // RFC 1122 §4.2.3.10: TCP is unicast only; never answer a broadcast.
            return self.counters.inc(Counter::TcpExtTCPBroadcastDrop);
        }
        match self.listeners.get(&seg.dst_port).copied() {
            Some(l) => self.listener_input(now, iface, l, tuple, seg, None),
            None => {
                self.counters.inc(Counter::TcpExtTCPNoSocket);
                self.reset_for(now, iface, &tuple, seg);
            }
        }
    }

    /// The ISS for a new incarnation when `seg` is a SYN that may reopen connection `i` from
    /// TIME-WAIT (RFC 1122 §4.2.2.13, RFC 6191; see `Connection::time_wait_reopen`). Only a
    /// connection the application has released, for which a listener waits, is reopened, so
    /// no handle ever comes to name a different connection.
    fn reopen(&self, i: usize, ip: &Ipv4Repr, iface: &Iface, seg: &TcpRepr) -> Option<SeqNum> {
        let Some(Sock::Conn(c)) = self.slot(i) else {
            return None;
        };
        if c.owned || !iface.owns(ip.dst) || !self.listeners.contains_key(&seg.dst_port) {
            return None;
        }
        c.conn.time_wait_reopen(seg)
    }

    /// An ICMP error quoting a TCP header we sent: `t` is the connection as the quoted
    /// header names it, `seq` its sequence number (checked by the connection, RFC 5927).
    pub fn icmp_error(&mut self, now: Instant, t: &FourTuple, seq: SeqNum, err: IcmpError) {
        let Some(i) = self.conn_slot(t) else {
            return self.counters.inc(Counter::TcpExtTCPIcmpNoSocket);
        };
        if let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) {
            c.conn.on_icmp_error(now, err, seq, &mut self.counters);
        }
        self.mark_ready(i);
    }

    /// RFC 9293 §3.10.7.1: the RST answering a segment that matches no connection.
    fn reset_for(&mut self, now: Instant, iface: &mut Iface, t: &FourTuple, seg: &TcpRepr) {
        if seg.flags.rst() {
            return;
        }
        let (seq, ack, flags) = if seg.flags.ack() {
            (seg.ack, SeqNum(0), Flags::RST)
        } else {
            (
                SeqNum(0),
                seg.seq + seg.segment_len(),
                Flags::RST | Flags::ACK,
            )
        };
        let r = TcpRepr {
            src_port: t.local_port,
            dst_port: t.remote_port,
            seq,
            ack,
            flags,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
            payload: &[],
        };
        self.counters.inc(Counter::TcpOutRsts);
        self.counters.inc(Counter::TcpOutSegs);
        send_seg(now, iface, t, &r, None);
    }

    /// A segment for a listener. `iss` is set when the SYN reopens a TIME-WAIT 4-tuple: the
    /// new connection must start above the old one's sequence space.
    fn listener_input(
        &mut self,
        now: Instant,
        iface: &mut Iface,
        li: usize,
        t: FourTuple,
        seg: &TcpRepr,
        iss: Option<SeqNum>,
    ) {
        let f = seg.flags;
        if f.rst() {
            return;
        }
        let Some(Sock::Listener(l)) = self.slot(li) else {
            return;
        };
        let (cfg, backlog, queued, half_open) =
            (l.cfg.clone(), l.backlog, l.accept_q.len(), l.half_open);
        if f.syn() && f.fin() {
            // RFC 9293 §3.10.7.2 would process the SYN and ignore the FIN; like Linux, a
            // listener drops SYN+FIN (it only ever comes from scanners).
            return self.counters.inc(Counter::TcpExtTCPSynFinDrop);
        }
        if f.ack() && !f.syn() {
            // Possibly the ACK completing a SYN-cookie handshake.
            let cookie = seg.ack - 1;
            match self.isn.check_cookie(&t, seg.seq - 1, cookie, now) {
                Some(mss) if queued < backlog && self.count < self.limits.max_connections => {
                    self.counters.inc(Counter::TcpExtSyncookiesRecv);
                    self.counters.inc(Counter::TcpPassiveOpens);
                    let conn = Connection::accept(cfg, t, seg, cookie, now, Some(mss));
                    let i = self.add_conn(t, conn, None);
                    if let Some(Sock::Conn(cs)) = at_mut(&mut self.socks, i) {
                        cs.conn.on_segment(now, seg, &mut self.counters);
                    }
                    if let Some(Sock::Listener(l)) = at_mut(&mut self.socks, li) {
                        l.accept_q.push_back(i);
                    }
                    self.after_input(i);
                }
                Some(_) => {
                    self.counters.inc(Counter::TcpExtListenOverflows);
                    self.counters.inc(Counter::TcpExtListenDrops);
                }
                None => {
                    self.counters.inc(Counter::TcpExtSyncookiesFailed);
                    self.reset_for(now, iface, &t, seg);
                }
            }
            return;
        }
        if !f.syn() {
            // RFC 9293 §3.10.7.2: anything else to a LISTEN socket is dropped.
            return self.counters.inc(Counter::TcpExtTCPListenBadFlags);
        }
        flowstack_tcp::syn_option_clamps(&seg.options, &mut self.counters);
        if queued >= backlog {
            self.counters.inc(Counter::TcpExtListenOverflows);
            self.counters.inc(Counter::TcpExtListenDrops);
            return;
        }
        if self.count >= self.limits.max_connections && !self.evict_time_wait() {
            self.counters.inc(Counter::TcpExtTCPConnLimit);
            self.counters.inc(Counter::TcpExtListenDrops);
            return;
        }
        if half_open >= self.limits.syn_backlog {
            // Half-open queue full: answer statelessly with a SYN cookie.
            let mss = flowstack_tcp::DEFAULT_MSS
                .max(seg.options.mss.map(|m| m as usize).unwrap_or(0))
                .min(cfg.mss as usize) as u16;
            let cookie = self.isn.cookie(&t, seg.seq, mss, now);
            let r = TcpRepr {
                src_port: t.local_port,
                dst_port: t.remote_port,
                seq: cookie,
                ack: seg.seq + 1,
                flags: Flags::SYN | Flags::ACK,
                window: cfg.recv_buffer.min(65535) as u16,
                urgent: 0,
                options: TcpOptions {
                    mss: Some(mss),
                    ..Default::default()
                },
                payload: &[],
            };
            self.counters.inc(Counter::TcpExtSyncookiesSent);
            self.counters.inc(Counter::TcpOutSegs);
            send_seg(now, iface, &t, &r, None);
            return;
        }
        self.counters.inc(Counter::TcpPassiveOpens);
        let iss = iss.unwrap_or_else(|| self.isn.isn(&t, now));
        let conn = Connection::accept(cfg, t, seg, iss, now, None);
        let i = self.add_conn(t, conn, Some(li));
        if let Some(Sock::Listener(l)) = at_mut(&mut self.socks, li) {
            l.half_open += 1;
        }
        self.after_input(i);
    }

    fn add_conn(&mut self, t: FourTuple, conn: Connection, listener: Option<usize>) -> usize {
        let i = self.insert(Sock::Conn(ConnSock {
            conn,
            ready: false,
            scheduled: UNSCHEDULED,
            listener: listener.map_or(NO_LISTENER, |l| l as u32),
            owned: false,
            tw_listed: false,
            changed: false,
        }));
        self.conns.insert(&t, i as Slot);
        self.count += 1;
        i
    }

    /// After a segment was processed for connection `i`: moves it to its listener's accept
    /// queue once established and marks it ready, so that what it now has to send (the
    /// ACK, data the ACK let out) leaves in this turn's dispatch — after the whole receive
    /// batch, so one ACK can cover several segments — and it is reaped there if gone.
    fn after_input(&mut self, i: usize) {
        self.settle_listener(i);
        self.mark_ready(i);
    }

    /// Moves a newly established connection to its listener's accept queue (or forgets a
    /// failed half-open one).
    fn settle_listener(&mut self, i: usize) {
        let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) else {
            return;
        };
        let state = c.conn.state();
        if c.listener != NO_LISTENER {
            let li = c.listener as usize;
            if state != State::SynReceived {
                c.listener = NO_LISTENER;
                let established = state != State::Closed;
                if let Some(Sock::Listener(l)) = at_mut(&mut self.socks, li) {
                    l.half_open -= 1;
                    if established {
                        l.accept_q.push_back(i);
                    }
                }
            }
        }
    }

    /// Sends what connection `i` has to send, and frees it once closed and unowned.
    fn flush(&mut self, now: Instant, i: usize, iface: &mut Iface) {
        let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) else {
            return;
        };
        let t = c.conn.tuple();
        let gathers = iface.gathers();
        c.conn
            .poll_transmit_gather(now, &mut self.counters, gathers, &mut |r, at| {
                send_seg(now, iface, &t, r, at)
            });
        let closed = c.conn.state() == State::Closed;
        if !c.owned && !c.tw_listed && c.conn.state() == State::TimeWait {
            c.tw_listed = true;
            self.list_time_wait(i);
        }
        let Some(Sock::Conn(c)) = self.slot(i) else {
            return;
        };
        let in_accept_q_or_half_open = c.listener != NO_LISTENER;
        if closed && !c.owned && !in_accept_q_or_half_open && !self.queued(i) {
            self.remove(i);
        } else {
            self.schedule(i);
        }
    }

    fn queued(&self, i: usize) -> bool {
        self.listeners.values().any(|&li| match self.slot(li) {
            Some(Sock::Listener(l)) => l.accept_q.contains(&i),
            _ => false,
        })
    }

    /// Remembers that slot `i` holds an orphaned TIME-WAIT connection, dropping stale
    /// entries from the front so the list stays about as long as the TIME-WAIT population.
    fn list_time_wait(&mut self, i: usize) {
        while let Some(&f) = self.time_wait.front() {
            if self.is_reusable(f as usize)
                && self.time_wait.len() <= 2 * self.limits.max_connections
            {
                break;
            }
            self.time_wait.pop_front();
        }
        self.time_wait.push_back(i as Slot);
    }

    /// A full table makes room by ending the oldest orphaned TIME-WAIT connection early, as
    /// Linux does when its TIME-WAIT buckets overflow: the 2·MSL wait (RFC 9293 §3.6.1)
    /// guards against old duplicates, and PAWS and the clock-driven ISN (RFC 6191) cover a
    /// reopened 4-tuple; refusing every new connection instead would let a burst of short
    /// connections lock the table for a whole minute. False if there is none.
    fn evict_time_wait(&mut self) -> bool {
        while let Some(i) = self.time_wait.pop_front().map(|i| i as usize) {
            if self.is_reusable(i) {
                self.remove(i);
                self.counters.inc(Counter::TcpExtTCPTimeWaitOverflow);
                return true;
            }
        }
        false
    }

    fn remove(&mut self, i: usize) {
        if let Some(Sock::Conn(c)) = self.slot(i) {
            // Out of the map first: its key is read from the slot.
            let t = c.conn.tuple();
            self.conns.remove(&t, |s| key_of(&self.socks, s));
        }
        if let Some(Sock::Conn(_)) = self.socks[i].take().map(|b| *b) {
            self.free.push(i as Slot);
            self.count -= 1;
        }
    }

    /// Fires due timers and sends the pending output of connections that have work: those
    /// touched since the last dispatch and those whose deadline has come (a timer heap, so the
    /// cost does not grow with idle connections, e.g. thousands in TIME-WAIT).
    pub fn dispatch(&mut self, now: Instant, iface: &mut Iface) {
        while let Some(&Reverse(Due { at: t, slot })) = self.timers.peek() {
            let i = slot as usize;
            if t > now.as_nanos() {
                break;
            }
            self.timers.pop();
            // Entries can be stale (the deadline moved later, or the slot was reused): re-check,
            // and re-arm a deadline that moved later.
            if let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) {
                if c.scheduled == t {
                    c.scheduled = UNSCHEDULED;
                }
                if c.conn.poll_at().is_due(now) {
                    c.conn.on_timeout(now, &mut self.counters);
                    self.mark_ready(i);
                } else {
                    self.schedule(i);
                }
            }
        }
        // Entries of connections that went before their deadline stay until it comes: an
        // orphaned TIME-WAIT connection ended early by a full table (`evict_time_wait`)
        // leaves its 2·MSL entry for a minute. Under a stream of short connections (ab
        // against nginx, 40 k/s) that was millions of entries, every push and pop walking
        // ~21 levels of cold memory — the daemon's top function (6% of its time, `perf`).
        // So once they outnumber the connections, the stale entries go (amortised O(1) per
        // push: at least `count + 64` pushes between two passes).
        if self.timers.len() > 2 * self.count + 64 {
            self.drop_stale_timers();
        }
        // A burst (a wave of handshakes) can leave the heap's allocation far larger than its
        // entries, about one per connection with a deadline: give most of it back
        // (amortised: only after the heap shrank to a quarter).
        let (len, cap) = (self.timers.len(), self.timers.capacity());
        if cap > 64 && len < cap / 4 {
            self.timers.shrink_to(2 * len);
        }
        let ready = std::mem::take(&mut self.ready);
        for i in ready.iter().map(|&i| i as usize) {
            let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) else {
                continue;
            };
            c.ready = false;
            if c.owned && !c.changed {
                c.changed = true;
                self.changed.push(i as Slot);
            }
            if c.listener != NO_LISTENER {
                self.settle_listener(i);
            }
            self.flush(now, i, iface);
        }
        let mut ready = ready;
        ready.clear();
        if self.ready.is_empty() {
            self.ready = ready; // keep the allocation
        }
    }

    /// Keeps only the timer entries that are some connection's current earliest deadline
    /// (`scheduled`): one per connection at most. The others are stale — their connection
    /// is gone, or its deadline moved — and `dispatch` would only skip them.
    fn drop_stale_timers(&mut self) {
        let socks = &self.socks;
        self.timers.retain(|&Reverse(Due { at, slot })| {
            matches!(
                socks.get(slot as usize).and_then(|s| s.as_deref()),
                Some(Sock::Conn(c)) if c.scheduled == at
            )
        });
    }

    /// Hands over the connections dispatched since the last call ([`TcpSockets::changed`]),
    /// each once, for an owner that looks only at connections that may have news (the
    /// offload daemon's turn). Unasked, the list holds each owned connection at most once.
    pub fn take_changed(&mut self, out: &mut Vec<TcpHandle>) {
        for i in self.changed.drain(..).map(|i| i as usize) {
            if let Some(Sock::Conn(c)) = at_mut(&mut self.socks, i) {
                c.changed = false;
                if c.owned {
                    out.push(TcpHandle::from_raw(i));
                }
            }
        }
    }

    /// When the socket table next needs [`TcpSockets::dispatch`]: now if a connection has
    /// output pending, else the earliest timer (possibly stale: it may have moved later).
    pub fn poll_at(&self) -> PollAt {
        if !self.ready.is_empty() {
            return PollAt::Now;
        }
        self.timers
            .peek()
            .map(|r| Instant::from_nanos(r.0.at))
            .into()
    }

    /// Number of connections (any state).
    pub fn connections(&self) -> usize {
        self.count
    }

    /// Entries in the timer heap, stale ones included.
    pub fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    /// Bytes the TCP socket table holds: every slot (`size_of` times the slot vector's
    /// capacity), each boxed connection or listener with the heap it holds, and the
    /// capacities of the demux maps (entries plus one control byte per bucket), the free
    /// list, the ready list, the timer heap and the TIME-WAIT list. Allocator headers and
    /// fragmentation are not included (RSS shows them).
    pub fn accounted_bytes(&self) -> usize {
        use std::mem::size_of;
        let map = |cap: usize, entry: usize| cap * (entry + 1);
        let mut n = size_of::<Self>()
            + self.socks.capacity() * size_of::<Option<Box<Sock>>>()
            + self.free.capacity() * size_of::<Slot>()
            + self.conns.heap_bytes()
            + map(self.listeners.capacity(), size_of::<(u16, usize)>())
            + self.ready.capacity() * size_of::<Slot>()
            + self.changed.capacity() * size_of::<Slot>()
            + self.timers.capacity() * size_of::<Reverse<Due>>()
            + self.time_wait.capacity() * size_of::<Slot>()
            + self.configs.capacity() * size_of::<Arc<TcpConfig>>();
        for s in self.socks.iter().flatten() {
            n += match &**s {
                Sock::Conn(c) => size_of::<Sock>() - size_of::<Connection>() + c.conn.footprint(),
                Sock::Listener(l) => {
                    size_of::<Sock>()
                        + l.accept_q.capacity() * size_of::<usize>()
                        + shared_share(&l.cfg)
                }
            };
        }
        n
    }

    /// Every connection, for `ss`-like listings.
    pub fn iter(&self) -> impl Iterator<Item = &Connection> {
        self.socks.iter().filter_map(|s| match s.as_deref() {
            Some(Sock::Conn(c)) => Some(&c.conn),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 19: a slot is one pointer, and the entry's tag costs a connection nothing.
    #[test]
    fn a_slot_is_a_pointer_and_the_tag_is_free() {
        use std::mem::size_of;
        assert_eq!(size_of::<Option<Box<Sock>>>(), size_of::<usize>());
        assert_eq!(size_of::<Sock>(), size_of::<ConnSock>());
        assert_eq!(size_of::<Due>(), 12);
    }
}
