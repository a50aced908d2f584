//! The per-core engine: one interface, its protocol layers and sockets, driven sans-IO.
//!
//! # Driving contract
//!
//! An `Engine` never reads a clock or touches a device on its own. Its owner, on one thread:
//!
//! 1. feeds every received frame to [`Engine::receive`] (or lets [`Engine::poll`] pull a batch
//!    from a [`Device`]);
//! 2. calls [`Engine::on_timers`] and then [`Engine::dispatch`] so timers fire and sockets with
//!    pending output emit segments;
//! 3. hands the built frames ([`Engine::tx`]) to the device and clears them;
//! 4. sleeps until [`Engine::poll_at`] or until a frame arrives or the application acts.
//!
//! [`Engine::poll`] does 1–3 in order for a [`Device`]. Socket calls (`udp_*`, `ping_*`,
//! `tcp_*`, and the [`Sockets`] trait) may be made at any time between polls and take no
//! clock: the engine stamps them with the time of its latest entry point that took `now`
//! ([`Engine::poll`], [`Engine::receive`], [`Engine::on_timers`], [`Engine::dispatch`], or
//! [`Engine::set_now`]), and their output goes out on the next poll. An engine that was never
//! given a time runs at [`Instant::ZERO`].
//!
//! An engine belongs to one thread: it is `Send` (it may be built on one thread and moved to
//! the core that runs it) but not `Sync`, so two threads can never share one (checked at
//! compile time, see [`Engine`]).
//!
//! # Layout
//!
//! This file holds the configuration, the [`Engine`] and its driving entry points; the rest
//! are `impl Engine` blocks by concern:
//!
//! - `input`: the receive path, Ethernet → ARP / IPv4 (+ reassembly) → ICMP / UDP / TCP,
//!   with a named counter for every drop;
//! - `tcp_api`, `udp_api`: the `tcp_*` and `udp_*` socket calls;
//! - `ping`: ICMP echo requests and the queue of replies;
//! - `file`, `file_map`: `send_file` (read into pooled chunks, or from mapped windows) and
//!   `recv_to_file`.

mod file;
mod file_map;
mod input;
mod ping;
mod rx_parts;
mod tcp_api;
mod udp_api;

pub use file::FILE_CHUNK;
pub use file_map::{FileSendMode, MAP_WINDOW, MAX_WINDOWS};
pub use ping::PingReply;

/// Where [`Engine::poll_to`] offers received in-order data: `(connection, bytes)` answers
/// how many leading bytes it took.
pub type Deliver<'d> = dyn FnMut(crate::tcp_socket::TcpHandle, &[u8]) -> usize + 'd;

use crate::counters::{Counter, Counters};
use crate::iface::{Iface, IfaceConfig};
use crate::reasm::{ReasmConfig, Reassembler};
use crate::tcp_socket::{TcpLimits, TcpSockets};
use crate::udp::{UdpConfig, UdpTable};
use crate::SocketError;
use flowstack_link::{Device, DeviceCaps, TxBatch};
use flowstack_wire::rss::Toeplitz;
use flowstack_wire::{Instant, Ipv4Address};
use std::cell::Cell;
use std::collections::VecDeque;
use std::marker::PhantomData;

/// Everything an engine needs to start.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Addressing and ARP/ICMP limits.
    pub iface: IfaceConfig,
    /// Fragment reassembly limits.
    pub reasm: ReasmConfig,
    /// UDP limits.
    pub udp: UdpConfig,
    /// Echo replies kept for [`Engine::ping_recv`].
    pub ping_queue: usize,
    /// Frames taken from the device per poll.
    pub rx_budget: usize,
    /// TCP limits and socket defaults.
    pub tcp: TcpLimits,
    /// 128-bit secret for ISNs and SYN cookies; `None` draws one from the OS RNG.
    pub secret: Option<[u8; 16]>,
    /// Local ports handed out when an application asks for none (TCP connect, UDP bind 0),
    /// first..=last. Default: the IANA dynamic range, 49152..=65535.
    pub ephemeral: (u16, u16),
    /// The queue this engine serves when it is one of several engines behind a multi-queue
    /// link (per-core runtime); `None` for a lone engine.
    pub steering: Option<Steering>,
}

/// Where an engine sits among the engines of a multi-queue link whose frames are steered by
/// the symmetric Toeplitz hash ([`flowstack_wire::rss`]).
///
/// An outgoing connection then gets a local port whose 4-tuple hashes back to this engine's
/// queue, so the peer's replies arrive on the core that owns the connection (as mTCP and
/// F-Stack choose ports). About one port in `queues` qualifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steering {
    /// This engine's queue.
    pub queue: usize,
    /// How many queues (engines) share the link.
    pub queues: usize,
}

impl EngineConfig {
    /// Defaults for an interface.
    pub fn new(iface: IfaceConfig) -> Self {
        Self {
            iface,
            reasm: ReasmConfig::default(),
            udp: UdpConfig::default(),
            ping_queue: 256,
            rx_budget: 256,
            tcp: TcpLimits::default(),
            secret: None,
            ephemeral: (EPHEMERAL_FIRST, u16::MAX),
            steering: None,
        }
    }
}

/// One engine: owned by one thread, driven sans-IO (the driving contract is in the docs of
/// the private `engine` module, `src/engine/mod.rs`).
///
/// # Ownership
///
/// An engine is `Send`, so it can be built on one thread and moved to the core that runs it:
///
/// ```
/// fn movable<T: Send>() {}
/// movable::<flowstack_stack::Engine>();
/// ```
///
/// and `!Sync` (a `PhantomData<Cell<()>>` marker makes it so whatever its parts are), so no
/// two threads ever share one. This must not compile:
///
/// ```compile_fail
/// fn shareable<T: Sync>() {}
/// shareable::<flowstack_stack::Engine>();
/// ```
pub struct Engine {
    iface: Iface,
    reasm: Reassembler,
    udp: UdpTable,
    tcp: TcpSockets,
    pings: VecDeque<PingReply>,
    cfg: EngineConfig,
    next_port: u16,
    /// The flow hash of the steering in `cfg.steering` (tables built once).
    rss: Option<Box<Toeplitz>>,
    /// The latest time an entry point was given; socket calls are stamped with it.
    now: Instant,
    /// Buffers of `send_file` (file.rs).
    files: file::FilePool,
    /// The frame being received needs no TCP/UDP checksum verification (its device said so:
    /// [`flowstack_link::RxMeta`]); set for the length of one [`Engine::receive_meta`].
    rx_l4_csum_ok: bool,
    /// Where a two-part frame of an unexpected shape is made whole (`rx_parts.rs`); kept.
    rx_flat: Vec<u8>,
    /// `send_file`'s mode and mapped windows (file_map.rs).
    maps: file_map::MapSends,
    /// Makes the engine `!Sync` (one thread owns it) while leaving it `Send`.
    _not_sync: PhantomData<Cell<()>>,
}

// The `Send` half of the ownership claim, checked on every build (the `!Sync` half is the
// `compile_fail` doc test on `Engine`).
const _: fn() = assert_send::<Engine>;
fn assert_send<T: Send>() {}

/// First ephemeral port (IANA dynamic range).
pub(crate) const EPHEMERAL_FIRST: u16 = 49152;

/// Picks the next free port of `range` (first..=last) from `*next` on, wrapping within it.
/// Every port is tried at most once, so a full range fails with `AddrNotAvailable`.
fn ephemeral_port(
    next: &mut u16,
    (first, last): (u16, u16),
    taken: impl Fn(u16) -> bool,
) -> Result<u16, SocketError> {
    if first > last {
        return Err(SocketError::AddrNotAvailable);
    }
    if *next < first || *next > last {
        *next = first;
    }
    for _ in 0..=(last - first) as u32 {
        let p = *next;
        *next = if p == last { first } else { p + 1 };
        if !taken(p) {
            return Ok(p);
        }
    }
    Err(SocketError::AddrNotAvailable)
}

impl Engine {
    /// Builds an engine for a device with capabilities `caps`.
    pub fn new(cfg: EngineConfig, caps: DeviceCaps) -> Self {
        let secret = cfg.secret.unwrap_or_else(|| {
            let mut k = [0u8; 16];
            // RFC 6528 §3: the secret should be random. Without an OS RNG (never on Linux)
            // fall back to a MAC-derived key, which is predictable.
            if getrandom::fill(&mut k).is_err() {
                k[..6].copy_from_slice(&cfg.iface.mac.0);
            }
            k
        });
        // RFC 6056 §3.1: ephemeral ports should not be predictable, and two processes
        // started alike must not walk the same sequence (they would collide with each
        // other's TIME-WAIT at a common peer). The walk starts at a point drawn from the
        // secret — random, or fixed by the configuration for reproducible simulations.
        let seed = u16::from_le_bytes([secret[14], secret[15]])
            ^ u16::from_be_bytes([cfg.iface.mac.0[4], cfg.iface.mac.0[5]]);
        Self {
            tcp: TcpSockets::new(cfg.tcp, secret),
            iface: Iface::new(cfg.iface, caps),
            reasm: Reassembler::new(cfg.reasm),
            udp: UdpTable::new(cfg.udp),
            pings: VecDeque::new(),
            next_port: cfg.ephemeral.0
                + seed % (cfg.ephemeral.1.saturating_sub(cfg.ephemeral.0).max(1)),
            rss: cfg
                .steering
                .filter(|s| s.queues > 1)
                .map(|_| Box::new(Toeplitz::symmetric())),
            cfg,
            now: Instant::ZERO,
            files: file::FilePool::default(),
            rx_l4_csum_ok: false,
            rx_flat: Vec::new(),
            maps: file_map::MapSends::default(),
            _not_sync: PhantomData,
        }
    }

    /// Our IPv4 address.
    pub fn ip(&self) -> Ipv4Address {
        self.iface.ip()
    }

    /// The capabilities of the device the engine was built for.
    pub fn caps(&self) -> DeviceCaps {
        self.iface.caps()
    }

    /// Counters of every layer.
    pub fn counters(&self) -> Counters {
        let mut c = self.iface.counters().clone();
        c.merge(self.tcp.counters());
        c
    }

    /// The ARP cache (for display).
    pub fn arp_entries(
        &self,
    ) -> impl Iterator<Item = (Ipv4Address, flowstack_wire::EthernetAddress, Instant)> + '_ {
        self.iface.arp_entries()
    }

    /// Bytes held by fragment reassembly.
    pub fn reassembly_memory(&self) -> usize {
        self.reasm.memory_used()
    }

    /// Frames waiting for the device. Frames that could carry bytes of a file truncated under
    /// a mapped `send_file` window are discarded first (`file_map.rs`).
    ///
    /// The frames are whole: gathered ones (zero-copy payloads referenced, for a device that
    /// gathers) are flattened here, for a caller that hands them to any device.
    pub fn tx(&mut self) -> &mut TxBatch {
        self.check_mapped_windows();
        let tx = self.iface.tx_mut();
        tx.flatten();
        tx
    }

    /// One full turn: receive a batch from `dev`, run timers and socket output, transmit.
    /// Returns true if any frame moved.
    pub fn poll<D: Device + ?Sized>(&mut self, now: Instant, dev: &mut D) -> bool {
        self.poll_to(now, dev, &mut |_, _| 0)
    }

    /// [`Engine::poll`], handing received in-order data to a reader before it enters a
    /// connection's receive buffer: `deliver(h, bytes)` answers how many leading bytes it
    /// took for connection `h` (they count as received and read: the offload daemon writes
    /// them straight into the application's area, one copy instead of two). Offered for a
    /// segment whose payload arrived apart from its headers (a device that gathers, e.g. a
    /// zero-copy send over the in-process loopback), in order, on the header-prediction
    /// path — first what the connection's buffer holds, then the payload
    /// (`Connection::on_segment_to`); whatever is left is queued as usual.
    pub fn poll_to<D: Device + ?Sized>(
        &mut self,
        now: Instant,
        dev: &mut D,
        deliver: &mut Deliver,
    ) -> bool {
        use flowstack_prof::{enter, Layer};
        self.set_now(now);
        let _p = enter(Layer::Engine);
        let budget = self.cfg.rx_budget;
        let gather = dev.can_gather();
        self.iface.set_gather(gather);
        let got = {
            let _p = enter(Layer::DevRx);
            dev.recv_batch_parts(now, budget, &mut |f, t, m| {
                self.receive_parts_to(now, f, t, m, deliver)
            })
        };
        self.on_timers(now);
        self.dispatch(now);
        self.check_mapped_windows();
        let sent = self.iface.tx().len();
        if sent > 0 {
            if !gather {
                // Frames built for a device that gathered (before a change of device).
                self.iface.tx_mut().flatten();
            }
            let accepted = {
                let _p = enter(Layer::DevTx);
                dev.send_batch_take(now, self.iface.tx_mut())
            };
            self.iface
                .counters_mut()
                .add(Counter::EthOutDrops, (sent - accepted) as u64);
            self.iface.tx_mut().clear();
        }
        got > 0 || sent > 0
    }

    /// Advances the engine's clock for socket calls made before the next poll (tests and
    /// drive loops that act between polls at a known time). Time never goes backwards: an
    /// earlier `now` is ignored.
    pub fn set_now(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    /// The engine's clock: the latest time it was given.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// When the engine next needs a poll, if ever: a deadline, possibly one already reached
    /// (the engine's own latest time when output is pending now), never a sentinel.
    pub fn poll_at(&self) -> Option<Instant> {
        [
            self.iface.poll_at(),
            self.reasm.poll_at(),
            // Work pending now is due at the engine's own latest time (already reached).
            self.tcp.poll_at().instant_or(self.now),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Fires due timers (ARP retries, reassembly expiry).
    pub fn on_timers(&mut self, now: Instant) {
        self.set_now(now);
        // Only when something is due: this runs on every poll.
        if self.iface.poll_at().is_some_and(|t| t <= now) {
            self.iface.on_timer(now);
        }
        if self.reasm.poll_at().is_none_or(|t| t > now) {
            return;
        }
        let expired = self.reasm.on_timer(now) as u64;
        let c = self.iface.counters_mut();
        c.add(Counter::IpReasmTimeout, expired);
        c.add(Counter::IpReasmFails, expired);
    }

    /// Lets sockets emit pending output.
    pub fn dispatch(&mut self, now: Instant) {
        self.set_now(now);
        self.tcp.dispatch(now, &mut self.iface);
    }
}
