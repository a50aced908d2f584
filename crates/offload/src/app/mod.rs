//! Registered applications and the daemon-wide socket table.
//!
//! # Sockets are the daemon's, handles are the application's
//! Every socket is a daemon-wide object ([`GSock`], keyed by a socket id). An application
//! names a socket in its ring records by its own *handle*; the daemon maps (application,
//! handle) to the socket id, so an application can name nothing but what it created, accepted
//! or *attached* (proved possession of the placeholder). Handles of the native client
//! ([`flowstack_api::Sockets`]) are counted on both sides from 1 (listen, connect) and from
//! [`layout::ACCEPTED_BASE`] (accepted); the POSIX layer chooses its own from
//! `flowstack_api::region::POSIX_BASE`.
//!
//! A socket's received bytes and events go to its *holder*: the application that created or
//! accepted it, or the last one that asked with `Hold` (`attach::hold`). An application that
//! adopts a socket (a forked child, a new program after exec, a receiver of a passed
//! descriptor) is not its holder until it asks: the POSIX layer asks when the program first
//! reads or waits to read, so a child that only sends on an inherited socket, or never
//! touches it, takes nothing from its parent. Before a fork the parent gives up the
//! connections nobody waits on (`HoldHow::Release`) and the child carries the bytes the
//! parent had unread; whichever process reads first then takes the socket, as both would
//! read one queue in the kernel. Bytes already delivered into a previous holder's receive
//! area stay there, readable by it (two processes reading one connection at once is a race
//! in the kernel too).
//!
//! # Placeholders (the process-shared model of `flowstack_client::posix`)
//! A socket created through `Attach{New}` has a placeholder pair (A, D); the daemon keeps D.
//! - **Readable**: when the daemon makes the socket readable (data, end of stream, error, a
//!   connection to accept, the kernel listener) and no token is outstanding, it writes one
//!   token byte into D. On `TokenCleared` it writes a new one at once if the socket is still
//!   readable *from the daemon's view*: bytes delivered and not consumed (the application's
//!   `TcpConsume` precedes its `TokenCleared` in the ring), end of stream or error told, a
//!   connection waiting — so no readiness is lost, at worst a spurious wake-up. (The
//!   sequence number the record carries is informative only.)
//! - **Writable**: on `WantWritable` the daemon empties D (filler the application wrote to
//!   make A unwritable) as soon as send space returns or the connect ends.
//! - **Last close**: D hanging up means every copy of A anywhere is closed: the socket is
//!   closed as the kernel would (FIN after the queued bytes, RST with unread data). An
//!   application exiting only detaches from such sockets; a socket without a placeholder
//!   (native client) is closed with its application.
//!
//! Everything read from the region is untrusted: each command record is decoded and
//! validated ([`CommandRecord::decode`]), each data span checked against its area
//! ([`check_span`]), each index the application writes (`rx_freed`) checked against what the
//! daemon itself knows.

use crate::layout::{self, at, LAYOUT, RX_SIZE, SOCK_RCVBUF, SOCK_SNDBUF, TX_SIZE};
use crate::loopback::{is_loopback, Loopback};
use crate::ports::{BindOpts, PortTable};
use flowstack_api::ids::{keyed_map, IdMap, KeyedMap, Keys};
use flowstack_api::record::{
    check_span, AttachOp, Command, CommandRecord, EventKind, EventRecord, HoldHow, Mode, SockType,
    POOL_BATCH, POOL_MAX, RECORD_LEN,
};
use flowstack_api::SocketError;
use flowstack_stack::{TcpConfig, TcpHandle};
use flowstack_sys::placeholder;
use flowstack_sys::ring::{Consumer, Producer};
use flowstack_sys::SharedRegion;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod attach;
mod commands;
mod control;
mod counters;
mod file;
mod fuse;
mod handles;
mod marks;

/// Every this many turns an engine thread looks at all its sockets, not only the marked
/// ones (`marks`).
pub(crate) const SWEEP_EVERY: u64 = 64;

/// Least time between two sweeps, whatever asks for one (the [`SWEEP_EVERY`]th turn, the
/// turn before a sleep): a sweep costs O(sockets), and with thousands of idle connections
/// a sweep before every sleep made each request of a lone client cost milliseconds. A
/// sleep that skipped its sweep lasts at most this long, and the sweep follows.
pub(crate) const SWEEP_GAP: std::time::Duration = std::time::Duration::from_millis(2);

/// Least time between two full recounts of the applications' memory (`memory::account`;
/// an application already over its limit is recounted every turn).
pub(crate) const ACCOUNT_GAP: std::time::Duration = std::time::Duration::from_millis(1);

/// Both gaps above grow by this much per socket of the engine: a sweep or a full count
/// costs about 100 ns per socket, so each stays near 5% of the engine's time however many
/// idle connections it holds (8 000 idle connections with fixed gaps: the daemon spent
/// most of its time counting and sweeping, 10 ms per request of a lone client).
pub(crate) const GAP_PER_SOCKET: std::time::Duration = std::time::Duration::from_micros(2);

/// [`SWEEP_GAP`] or [`ACCOUNT_GAP`] (`base`) for an engine with `sockets` sockets.
pub(crate) fn gap(base: std::time::Duration, sockets: usize) -> std::time::Duration {
    base.max(GAP_PER_SOCKET.saturating_mul(sockets.min(u32::MAX as usize) as u32))
}
mod memory;
mod notify;
mod open;
mod reuse;
mod rxdirect;
mod service;
mod snapshot;
mod txzc;
mod udp;
use control::{
    addr_of, bind, detach, listen, readable_now, set_failed, token_cleared, want_writable,
};
pub use counters::DaemonCounters;
pub use fuse::{FUSE_AFTER, FUSE_CAP, FUSE_MEMORY};
use handles::accepted_handle;
pub(crate) use memory::account;
pub(crate) use service::service;
use service::{release_kind, try_accept};
pub(crate) use snapshot::snapshot;
pub use txzc::TX_HOLD_LIMIT;

/// Commands taken from one application per loop turn (fairness between applications).
const CMD_BUDGET: usize = 256;
/// Ephemeral ports the daemon gives to `bind(0)` and `listen` without `bind` (as Linux's
/// `ip_local_port_range` default).
pub const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;

/// A connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub eng: usize,
    pub h: TcpHandle,
    /// Bytes the application posted that the engine has not taken yet.
    pending_tx: VecDeque<u8>,
    /// Delivered into the holder's receive area and not yet consumed.
    outstanding: u64,
    /// Sync connect waiting for the handshake: (application, request id).
    connect_id: Option<(u64, u32)>,
    open_told: bool,
    /// End of stream reported (the application may still send).
    eof_told: bool,
    /// The connection ended with an error (reported); nothing more moves.
    closed_told: bool,
    shutdown_pending: bool,
    /// A `TcpSendFile` found no room: the bytes it still wanted. The holder is told
    /// writable once the engine's send buffer takes a chunk of them (see `file`).
    file_want: Option<u64>,
    /// Bytes the engine took while the connect was in flight; their credit is told with
    /// the open (see `service`).
    early_credit: u64,
    /// Bytes a `TcpSend` gave the engine directly (nothing was queued here before them):
    /// their credit is told by the connection's next turn, as for queued bytes.
    direct_taken: u64,
    /// Credit of bytes the engine took while nobody held the connection (`attach::hold`):
    /// told to the next holder.
    unheld_credit: u64,
    /// The application (and its handle) that sent last: send credit and errors go to it
    /// when it is not the holder (a forked child that writes while its parent reads).
    sender: Option<(u64, u32)>,
    /// Bytes were written into the holder's area during the engine's poll (`rxdirect`):
    /// the next turn reports the connection readable.
    direct_rx: bool,
    /// Bytes the application posted whose credit was not told yet: what its client counts
    /// as unflushed (see `service::credit_wakes`).
    uncredited: u64,
    /// Bulk spans of the transmit area waiting for the engine, sent without a copy (`txzc`);
    /// while any wait, `pending_tx` is empty.
    zc: txzc::ConnSpans,
    /// Fused with its loopback peer (`fuse`).
    fuse: Option<Box<fuse::ConnFuse>>,
    /// Bytes delivered into its holders' areas, ever.
    rx_total: u64,
    /// `rx_total` at which fusing is (next) tried; 0: at `Shared::fuse_after`.
    fuse_next: u64,
}

impl Conn {
    fn new(eng: usize, h: TcpHandle, connect_id: Option<(u64, u32)>, open_told: bool) -> Self {
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
            file_want: None,
            early_credit: 0,
            direct_taken: 0,
            unheld_credit: 0,
            sender: None,
            direct_rx: false,
            uncredited: 0,
            zc: txzc::ConnSpans::default(),
            fuse: None,
            rx_total: 0,
            fuse_next: 0,
        }
    }

    /// Bytes the application posted that wait in the daemon (copied or as spans).
    fn queued_here(&self) -> usize {
        self.pending_tx.len() + self.zc.len()
    }
}

/// After a `TcpSend`: a connection whose bytes waiting here (copied, or as spans that a
/// spill would copy) overran its send buffer fourfold is aborted — not our client library.
fn overrun(lo: &mut Loopback, counters: &mut DaemonCounters, c: &Conn) -> Result<u64, SocketError> {
    if c.queued_here() as u64 > 4 * SOCK_SNDBUF {
        let _ = lo.engines[c.eng].tcp_abort(c.h);
        counters.limits_hit += 1;
        Err(SocketError::LimitReached)
    } else {
        Ok(0)
    }
}

/// What a socket is.
#[derive(Debug)]
pub(crate) enum Kind {
    /// Created (`Attach{New}`), perhaps bound, neither listening nor connected.
    Fresh {
        ty: SockType,
        bound: Option<SocketAddrV4>,
    },
    Listener {
        /// The address it was bound to (0.0.0.0 when bound to any or not bound): what
        /// getsockname reports. The engines listen on the port for all of 127/8 (and the
        /// link's engine for the link's address), see [`Loopback::listen`].
        ip: Ipv4Addr,
        port: u16,
        /// (engine, listener) on each engine that listens.
        hs: Vec<(usize, TcpHandle)>,
        /// Sync accepts waiting for a connection: (application, request id, its handle).
        waiting: VecDeque<(u64, u32, u32)>,
        /// The kernel's listener on the same port (shim), watched for readiness.
        kernel: Option<OwnedFd>,
        /// A member of a reuseport group (`hs` empty): the connections handed to it
        /// (`reuse`), at most `backlog`.
        queue: VecDeque<(usize, TcpHandle)>,
        backlog: usize,
    },
    Conn(Conn),
    /// A listen or connect that failed; its error was reported.
    Failed(SocketError),
    /// A bound UDP socket (`udp`).
    Udp(udp::Dgram),
}

/// The daemon's end of a placeholder pair.
#[derive(Debug)]
pub(crate) struct Placeholder {
    pub d: OwnedFd,
    /// D is registered in [`Shared::hups`] (it stays so until D is closed).
    watched: bool,
    ident: (u64, u64),
    token_out: bool,
    /// Readable events posted (informative, see the module docs).
    seq: u32,
    want_writable: bool,
    /// No tokens while this application holds the socket (`SetNotify`, see `notify`).
    quiet_for: Option<u64>,
    /// A listener handed a connection to an accept asked ahead since its last token was
    /// written (`notify::handed`): `TokenCleared` writes another.
    handed: bool,
    /// A token was written into D at some point (A may still hold it): a recycled pair's
    /// application empties A before reuse (`Forget { recycle }`).
    tokens: bool,
}

/// A placeholder pair the application may name next (pooled, or kept from a closed socket):
/// A's identity, D, and whether D is watched in [`Shared::hups`] (a kept pair stays watched:
/// no `epoll_ctl` per socket for the pairs an application cycles through).
pub(crate) type Pair = ((u64, u64), OwnedFd, bool);

impl Placeholder {
    /// Token and filler actions wait until the events that explain them are in the ring
    /// (see [`Shared::placeholder_actions`]), so an application woken by A finds them.
    fn readable(&mut self, quiet: bool) {
        self.seq = self.seq.wrapping_add(1);
        if !self.token_out && !quiet {
            self.tokens = true;
            self.token_out = placeholder::put_token(self.d.as_fd()).unwrap_or(false);
            self.handed &= !self.token_out;
        }
    }
    fn writable(&mut self) {
        if self.want_writable {
            self.want_writable = false;
            let _ = placeholder::drain(self.d.as_fd());
        }
    }
}

/// What a socket holds in the daemon-wide port table ([`PortTable`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Hold {
    /// Bound to the port (bound, listening, or connected from a bound port).
    Bound(u16),
    /// Accepted on the port.
    Accepted(u16),
    /// A UDP socket's port (the UDP namespace, `udp_ports`).
    Udp(u16),
}

/// One socket of an engine.
#[derive(Debug)]
pub(crate) struct GSock {
    pub kind: Kind,
    /// Its port in the daemon-wide table, released with the socket.
    pub hold: Option<Hold>,
    /// The application (and its handle) whose rings carry the socket's bytes and events.
    pub holder: Option<(u64, u32)>,
    /// Applications that may name it, with their handles.
    pub owners: Vec<(u64, u32)>,
    pub ph: Option<Placeholder>,
    /// Closed by its applications; kept only to flush the bytes queued in the daemon.
    pub closing: bool,
    /// Listed in `Shared::dirty` (its next turn looks at it).
    dirty: bool,
}

impl GSock {
    fn new(kind: Kind, app: u64, handle: u32) -> Self {
        Self {
            kind,
            hold: None,
            holder: Some((app, handle)),
            owners: vec![(app, handle)],
            ph: None,
            closing: false,
            dirty: false,
        }
    }
}

/// A secret key for a table keyed by values an application picks (its handles) or can
/// steer (placeholder inodes), from `std`'s per-process random keys (no system call per
/// table): see `flowstack_api::ids`.
fn secret() -> Keys {
    use std::hash::BuildHasher;
    let r = std::hash::RandomState::new();
    Keys(r.hash_one(0x5eed_u64), r.hash_one(0xfeed_u64))
}

/// One engine thread's state, shared by its applications: its engine, its sockets, and the
/// daemon-wide port namespace.
pub(crate) struct Shared {
    /// This engine's index.
    pub me: usize,
    pub lo: Loopback,
    /// Keyed by the daemon's own socket ids (`next_gid`), never by a value an application
    /// chooses: a cheap hash is safe here (`flowstack_api::ids`).
    pub socks: IdMap<u32, GSock>,
    next_gid: u32,
    /// Placeholder identity (device, inode of A) → socket.
    by_ident: KeyedMap<(u64, u64), u32>,
    /// TCP ports bound, listening or accepted on, daemon-wide.
    pub ports: Arc<PortTable>,
    /// This engine's `SO_REUSEPORT` groups (`reuse`).
    groups: reuse::Groups,
    /// Events of one connection's turn (reused: no allocation per turn once warm).
    evs: Vec<EventRecord>,
    pub counters: DaemonCounters,
    /// Placeholder actions (socket, readable, writable) deferred until the events posted
    /// in this turn are published.
    ph_actions: Vec<(u32, bool, bool)>,
    /// Most sockets one application may name (`--max-sockets-per-app`).
    pub max_sockets_per_app: usize,
    /// Most bytes one application's sockets may hold queued here (`--max-app-memory`).
    pub max_app_memory: u64,
    /// Sockets the next turn looks at ([`Shared::mark`]); `service` explains the marks.
    dirty: Vec<u32>,
    /// The list a turn works through (kept for its allocation).
    dirty_spare: Vec<u32>,
    /// Engine connections with news, as `Engine::tcp_take_changed` hands them over.
    changed: Vec<TcpHandle>,
    /// Socket id by (engine, connection slot), learned as connections are served; read only
    /// after checking that the socket still is that connection.
    by_slot: Vec<Vec<u32>>,
    /// Transmit-area bytes pinned spans may hold before they are copied out (`txzc`).
    pub tx_hold_limit: u64,
    /// Applications that lost a socket to another one's `Hold` (application, its handle):
    /// told `Unheld` by the next turn.
    unheld: Vec<(u64, u32)>,
    /// Bytes one way before a loopback connection is fused (`--fuse-after`; `u64::MAX`:
    /// never), and its pipe's bytes per direction (`--fuse-pipe`); see `fuse`.
    pub fuse_after: u64,
    pub fuse_cap: u64,
    /// Bytes this engine's live pipes may take in all (its share of `--fuse-memory`), and
    /// the pipes made (dead ones pruned when the next is made).
    pub fuse_memory: u64,
    pipes: Vec<(std::sync::Weak<flowstack_sys::pipe::Pipe>, u64)>,
    next_pipe_token: u64,
    /// Fused sockets whose application asked for a wake-up of the other end (`fuse`).
    kicks: Vec<u32>,
    /// Fused sockets switched to the pipe whose peer was not told `PipeOpen` yet.
    fusing: Vec<u32>,
    /// Placeholders' D descriptors, watched for last close
    /// (`flowstack_sys::placeholder::HupSet`), keyed by D's descriptor number; a D is
    /// registered when a socket first takes it and stays so while it is kept for reuse.
    pub hups: flowstack_sys::placeholder::HupSet,
    /// The socket whose placeholder D is, by D's descriptor number (0: none — pooled, kept,
    /// or a stale entry: checked against the socket before use).
    ph_gid: Vec<u32>,
    /// Listeners that also listen in the kernel (their descriptor wakes the sleep); checked
    /// against the table when used.
    kernel_lgids: Vec<u32>,
}

impl Shared {
    pub fn new(me: usize, lo: Loopback, ports: Arc<PortTable>) -> std::io::Result<Self> {
        Ok(Self {
            me,
            lo,
            socks: IdMap::default(),
            next_gid: 1,
            by_ident: keyed_map(secret()),
            ports,
            groups: HashMap::new(),
            evs: Vec::new(),
            counters: DaemonCounters::default(),
            ph_actions: Vec::new(),
            max_sockets_per_app: usize::MAX,
            max_app_memory: u64::MAX,
            dirty: Vec::new(),
            dirty_spare: Vec::new(),
            changed: Vec::new(),
            by_slot: Vec::new(),
            tx_hold_limit: TX_HOLD_LIMIT,
            unheld: Vec::new(),
            fuse_after: fuse::FUSE_AFTER,
            fuse_cap: fuse::FUSE_CAP,
            fuse_memory: fuse::FUSE_MEMORY,
            pipes: Vec::new(),
            next_pipe_token: 1,
            kicks: Vec::new(),
            fusing: Vec::new(),
            hups: flowstack_sys::placeholder::HupSet::new()?,
            ph_gid: Vec::new(),
            kernel_lgids: Vec::new(),
        })
    }

    /// Watches `ph`'s D for its last close (once per D) and names `gid` its socket.
    fn ph_owner_set(&mut self, ph: &mut Placeholder, gid: u32) -> std::io::Result<()> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&ph.d);
        if !ph.watched {
            self.hups.add(ph.d.as_fd(), fd as u32)?;
            ph.watched = true;
        }
        let i = fd as usize;
        if self.ph_gid.len() <= i {
            self.ph_gid.resize(i + 1, 0);
        }
        self.ph_gid[i] = gid;
        Ok(())
    }

    /// `ph` no longer belongs to a socket.
    fn ph_owner_clear(&mut self, ph: &Placeholder) {
        if let Some(x) = self
            .ph_gid
            .get_mut(std::os::fd::AsRawFd::as_raw_fd(&ph.d) as usize)
        {
            *x = 0;
        }
    }

    /// The sockets whose placeholder's last copy may be gone (the watch set's word, checked
    /// against the socket table), and the watched D's that belong to no socket (pooled or
    /// kept pairs whose A every process closed).
    pub(crate) fn hung_up(&self) -> std::io::Result<(Vec<u32>, Vec<i32>)> {
        let mut keys = Vec::new();
        self.hups.ready(&mut keys)?;
        let (mut gids, mut loose) = (Vec::new(), Vec::new());
        for k in keys {
            let fd = k as i32;
            let gid = self.ph_gid.get(fd as usize).copied().unwrap_or(0);
            let owned = self
                .socks
                .get(&gid)
                .and_then(|g| g.ph.as_ref())
                .is_some_and(|ph| std::os::fd::AsRawFd::as_raw_fd(&ph.d) == fd);
            if owned {
                gids.push(gid);
            } else {
                loose.push(fd);
            }
        }
        Ok((gids, loose))
    }

    /// A new socket: looked at by the next turn.
    fn insert(&mut self, g: GSock) -> u32 {
        let gid = self.next_gid;
        self.next_gid = self.next_gid.wrapping_add(1).max(1);
        self.socks.insert(gid, g);
        self.mark(gid);
        gid
    }

    /// Asks the next turn to look at socket `gid` (see `service`).
    pub(crate) fn mark(&mut self, gid: u32) {
        if let Some(g) = self.socks.get_mut(&gid) {
            if !g.dirty {
                g.dirty = true;
                self.dirty.push(gid);
            }
        }
    }

    /// Releases what `g` holds in the port table (before the caller reports the close).
    fn unhold(&mut self, gid: u32, g: &mut GSock) {
        match g.hold.take() {
            Some(Hold::Bound(p)) => self.ports.release(self.me, gid, p),
            Some(Hold::Accepted(p)) => self.ports.release_accepted(self.me, p),
            Some(Hold::Udp(p)) => self.ports.udp.release(gid, p),
            None => {}
        }
    }

    /// Writes tokens and empties placeholders as decided this turn; call after the
    /// applications' events are published.
    pub fn placeholder_actions(&mut self) -> bool {
        let any = !self.ph_actions.is_empty();
        for (gid, r, w) in self.ph_actions.drain(..) {
            if let Some(g) = self.socks.get_mut(&gid) {
                notify::ph_action(g, r, w);
            }
        }
        any
    }

    /// Closes a socket for good (last close, or its native application left).
    ///
    /// A connection with bytes still queued in the daemon (and nothing unread) stays in the
    /// table, nameless, until the engine took them all; then it is closed (FIN).
    pub fn release(&mut self, gid: u32, died: bool) {
        let Some(mut g) = self.socks.remove(&gid) else {
            return;
        };
        if let Some(ph) = g.ph.take() {
            // Closing D (dropping `ph`) also ends its watch.
            self.ph_owner_clear(&ph);
            self.by_ident.remove(&ph.ident);
            self.ports.forget_ident(ph.ident);
        }
        self.unhold(gid, &mut g);
        if let Kind::Listener {
            ip, port, kernel, ..
        } = &g.kind
        {
            if kernel.is_some() {
                self.kernel_lgids.retain(|&x| x != gid);
            }
            reuse::leave(self, gid, (crate::ports::table_addr(*ip), *port));
        }
        if let Kind::Conn(c) = &mut g.kind {
            let piped = fuse::closing(self, c);
            let e = &self.lo.engines[c.eng];
            let unread = piped
                || c.outstanding > 0
                || e.tcp_conn(c.h).map(|k| k.recv_queue() > 0).unwrap_or(false);
            if piped {
                // RFC 2525 §2.17: closing with unread data resets the connection.
                let _ = self.lo.engines[c.eng].tcp_abort(c.h);
            }
            let e = &self.lo.engines[c.eng];
            if !died && !unread && c.queued_here() > 0 && e.tcp_error(c.h).is_none() {
                g.holder = None;
                g.owners.clear();
                g.closing = true;
                c.shutdown_pending = false;
                self.socks.insert(gid, g);
                self.mark(gid); // served every turn until its bytes are out
                return;
            }
        }
        release_kind(&mut self.lo, g.kind, died);
    }

    /// Kernel listeners to wake the daemon (readable means a connection waits there); one
    /// whose placeholder already holds a token is left out, so a connection the program has
    /// not accepted yet does not keep the daemon awake.
    pub fn kernel_listeners(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> {
        // From the short list, not a walk of every socket (once per sleep).
        let socks = &self.socks;
        self.kernel_lgids.iter().filter_map(move |gid| {
            let g = socks.get(gid)?;
            match (&g.kind, &g.ph) {
                (
                    Kind::Listener {
                        kernel: Some(k), ..
                    },
                    Some(ph),
                ) if !ph.token_out => Some(k.as_fd()),
                _ => None,
            }
        })
    }

    /// Listener `gid` now also listens in the kernel.
    pub(crate) fn note_kernel_listener(&mut self, gid: u32) {
        if !self.kernel_lgids.contains(&gid) {
            self.kernel_lgids.push(gid);
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
    /// Recorded at registration (SO_PEERCRED), shown by `flowstack stats`.
    pub uid: u32,
    pub stream: UnixStream,
    /// The process, as a pidfd: readable when it exited, even if its registration socket
    /// leaked into a child that keeps it open.
    pub pidfd: Option<OwnedFd>,
    pub region: Arc<SharedRegion>,
    cmd: Consumer,
    evt: Producer,
    /// Events the ring had no room for yet.
    backlog: VecDeque<EventRecord>,
    /// This application's handles → socket ids.
    pub handles: KeyedMap<u32, u32>,
    next_local: u32,
    next_accepted: u32,
    tx_freed: u64,
    rx_head: u64,
    rx_freed: u64,
    pub stats: AppStats,
    /// The rings hold a value no honest client writes: the application is dropped.
    pub broken: bool,
    /// Reused per turn: the decoded command records (no allocation per message).
    recs: Vec<Result<CommandRecord, ()>>,
    /// Reused per `TcpSend`: the bytes read out of the transmit area that are queued here
    /// (behind others, or beyond the engine's send buffer; the rest go straight in).
    tx_scratch: Vec<u8>,
    /// Files attached to this application's connections (`Attach{File}`), by handle.
    files: HashMap<u32, std::fs::File>,
    /// The wake-up channel of the shim's fast path (`Attach{Wake}`, see `notify`).
    wake: notify::Wake,
    /// Placeholder pairs handed over ahead (`Attach{Pool}`), oldest first: A's identity and
    /// D. Taken by `Attach{NewPooled, PlacePooled}`; closed with the application.
    pool: VecDeque<Pair>,
    /// Pairs kept by `Forget { recycle }`, oldest first, until `Attach{Repool}` moves them
    /// to the pool; closed with the application.
    recycled: VecDeque<Pair>,
    /// Bytes its sockets hold in the daemon, as of the last count (`memory`).
    pub memory: u64,
    /// Over `--max-app-memory`: new sockets refused, sends stalled (`memory`).
    pub mem_limited: bool,
    /// Credit posted this turn crossed a connection's wake threshold (`service::credit_wakes`):
    /// quiet credit events wake the application if it waits for send space.
    pub(crate) credit_wake: bool,
    /// Connections whose delivery stopped for want of room in the receive area: marked
    /// when the application frees some (`service`).
    area_wait: Vec<u32>,
    /// The application freed room in its receive area since `service` last marked the
    /// connections of `area_wait`: set by every [`App::read_rx_freed`] that saw news, so a
    /// read elsewhere (`rxdirect`) does not swallow the news those connections wait for.
    room_news: bool,
    /// Spans of the transmit area sent without a copy and not yet released (`txzc`).
    txzc: txzc::TxZc,
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
            pidfd: flowstack_sys::process::pidfd(pid).ok(),
            region,
            cmd,
            evt,
            backlog: VecDeque::new(),
            handles: keyed_map(secret()),
            next_local: 1,
            next_accepted: layout::ACCEPTED_BASE,
            tx_freed: 0,
            rx_head: 0,
            rx_freed: 0,
            stats: AppStats::default(),
            broken: false,
            recs: Vec::new(),
            tx_scratch: Vec::new(),
            files: HashMap::new(),
            wake: notify::Wake::default(),
            pool: VecDeque::new(),
            recycled: VecDeque::new(),
            memory: 0,
            mem_limited: false,
            credit_wake: false,
            area_wait: Vec::new(),
            room_news: false,
            txzc: txzc::TxZc::default(),
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
        // Events that only return send credit (Writable with a length) wake the application
        // only while it waits for send space: one blocked in recv would wake, find no data
        // and sleep again — two futex calls and a context switch per message for nothing.
        let mut loud = false;
        while let Some(e) = self.backlog.front() {
            let e = *e;
            loud |= !(e.kind == EventKind::Writable && e.len > 0);
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
        if loud {
            self.evt.publish();
        } else if self.evt.publish_quiet() && self.credit_wake && self.wants_writable() {
            // publish_quiet fenced our store of `head` before this load; the application
            // stores the flag before it announces sleep, fences and re-reads `head`, so either
            // it sees the credit or we see the flag (the ring's argument, ring.rs module docs).
            self.evt.wake();
        }
        if moved {
            self.credit_wake = false;
            notify::after_publish(self, loud);
        }
        moved
    }

    /// The application said it waits for send space (`wants_writable` in its header).
    fn wants_writable(&self) -> bool {
        self.region
            .atomic_u32(at::APP_WANTS_WRITABLE)
            .map(|a| a.load(Ordering::SeqCst) != 0)
            .unwrap_or(true)
    }

    /// Takes and executes up to a budget of commands; returns how many records were read.
    pub fn drain_commands(&mut self, sh: &mut Shared) -> usize {
        let mut recs = std::mem::take(&mut self.recs);
        recs.clear();
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
        for rec in recs.drain(..) {
            match rec {
                Ok(rec) => {
                    self.stats.commands += 1;
                    self.execute(sh, rec);
                }
                Err(()) => {
                    self.stats.bad_records += 1;
                    sh.counters.bad_records += 1;
                }
            }
        }
        self.recs = recs;
        n
    }

    fn gid(&self, handle: u32) -> Result<u32, SocketError> {
        self.handles
            .get(&handle)
            .copied()
            .ok_or(SocketError::InvalidHandle)
    }

    /// This application names as many sockets as it may, or its sockets hold as much
    /// memory as they may (`memory`): a new one is refused with `ENOBUFS`
    /// (`LimitReached`) and counted.
    fn at_limit(&self, sh: &mut Shared) -> bool {
        let full = self.handles.len() >= sh.max_sockets_per_app || self.mem_limited;
        if full {
            sh.counters.limits_hit += 1;
            sh.counters.app_mem_limited += u64::from(self.mem_limited);
        }
        full
    }

    /// A new socket named `handle` here (counted handles of the native client).
    fn new_sock(&mut self, sh: &mut Shared, handle: u32, kind: Kind) -> u32 {
        let gid = sh.insert(GSock::new(kind, self.id, handle));
        self.handles.insert(handle, gid);
        gid
    }

    fn sock_kind<'a>(&self, socks: &'a mut IdMap<u32, GSock>, handle: u32) -> Option<&'a mut Kind> {
        let gid = self.gid(handle).ok()?;
        socks.get_mut(&gid).map(|g| &mut g.kind)
    }

    /// Leaves every socket: native ones are closed (FIN, or RST where received bytes were
    /// left unread, as the kernel does on exit); placeholder ones only lose this holder.
    pub fn release_all(&mut self, sh: &mut Shared) {
        // Its wake-ups still count once it is gone (`FlowstackdAppWakes`).
        sh.counters.app_wakes += std::mem::take(&mut self.wake.signals);
        let keys = *self.handles.hasher();
        for (h, gid) in std::mem::replace(&mut self.handles, keyed_map(keys)) {
            detach(sh, gid, self.id, h, true);
        }
        for g in sh.socks.values_mut() {
            if let Kind::Listener { waiting, .. } = &mut g.kind {
                waiting.retain(|w| w.0 != self.id);
            }
            if let Kind::Conn(c) = &mut g.kind {
                if c.connect_id.is_some_and(|(a, _)| a == self.id) {
                    c.connect_id = None;
                }
            }
        }
    }

    /// Reads how much of the receive area the application freed; true if more than before
    /// (and `room_news` is set). It only moves forward, up to what was delivered.
    fn read_rx_freed(&mut self) -> bool {
        let freed = self
            .region
            .atomic_u64(at::RX_FREED)
            .map(|a| a.load(Ordering::Acquire))
            .unwrap_or(0);
        if freed > self.rx_freed && freed <= self.rx_head {
            self.rx_freed = freed;
            self.room_news = true;
            return true;
        }
        false
    }
}
