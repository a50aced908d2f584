//! Steering: every frame to the shard that owns its flow, whatever queue it arrived on.
//!
//! The owner of a frame is decided by one rule ([`Steering::owner`]), the same everywhere:
//!
//! | frame | owner |
//! |---|---|
//! | IPv4 TCP/UDP (not a fragment) | `queue_of(hash(4-tuple), n)` with the symmetric Toeplitz key, so both directions of a flow have one owner |
//! | other IPv4, and fragments | `queue_of(hash(address pair), n)` |
//! | ARP request | shard [`ARP_REQUEST_SHARD`] only (one answer per request) |
//! | ARP reply | every shard (each may have asked) |
//! | anything else (runts, other EtherTypes, malformed ARP) | the shard that received it (its engine counts the drop) |
//!
//! [`Steered`] wraps one shard's device queue. On receive it hands the engine the frames the
//! shard owns, copies the others into the cross-shard ring to their owner ([`crate::xring`]),
//! and hands the engine what other shards forwarded to it. Transmit goes straight out of the
//! shard's own queue (seed 003: transmit on the current core's queue). Where the link already
//! steers by this rule (the multi-queue shm wire, [`crate::nic`] built with
//! [`Steering::queue_for`]) nothing but ARP is forwarded; where it steers by its own hash (TAP,
//! AF_PACKET fanout) misdirected frames are forwarded: correctness never depends on the link's
//! hash, only speed does. Every frame forwarded, received or dropped is counted
//! ([`SteerCounters`]).

use crate::xring::{Doorbell, Mesh, MeshPort, RingSpec, Wake};
use flowstack_link::sys::complete_checksum;
use flowstack_link::{Device, DeviceCaps, RxMeta, TxBatch};
use flowstack_sys::eventfd::EventFd;
use flowstack_sys::ring::RingError;
use flowstack_wire::arp::{self, ArpOperation, ArpRepr};
use flowstack_wire::ethernet::Frame;
use flowstack_wire::rss::{queue_of, Toeplitz};
use flowstack_wire::{Duration, EtherType, Instant, Ipv4Address};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// The shard that answers ARP requests.
pub const ARP_REQUEST_SHARD: usize = 0;

/// Longest sleep of a shard whose device cannot be woken by its peers: it looks at its
/// cross-shard rings at least this often.
pub const WAIT_SLICE: Duration = Duration::from_millis(1);

/// Who owns a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// One shard (a flow's owner, or shard 0 for an ARP request).
    Shard(usize),
    /// Every shard (an ARP reply).
    Every,
    /// Whichever shard received it (nothing to steer by).
    Receiver,
}

/// A frame's kind as steering sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Flow(usize),
    ArpRequest,
    ArpReply,
    Unsteered,
}

/// The steering rule of `n` shards (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct Steering {
    hasher: Toeplitz,
    shards: usize,
}

impl Steering {
    /// The rule for `shards` shards, with the symmetric Toeplitz key.
    pub fn new(shards: usize) -> Self {
        Self {
            hasher: Toeplitz::symmetric(),
            shards: shards.max(1),
        }
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The owner of a received (or about to be sent) Ethernet frame.
    #[inline]
    pub fn owner(&self, frame: &[u8]) -> Owner {
        match self.route(frame) {
            Route::Flow(k) => Owner::Shard(k),
            Route::ArpRequest => Owner::Shard(ARP_REQUEST_SHARD),
            Route::ArpReply => Owner::Every,
            Route::Unsteered => Owner::Receiver,
        }
    }

    /// What kind of frame this is, for steering and counting.
    #[inline]
    fn route(&self, frame: &[u8]) -> Route {
        if let Some(h) = self.hasher.hash_frame(frame) {
            return Route::Flow(queue_of(h, self.shards));
        }
        let Ok(f) = Frame::new_checked(frame) else {
            return Route::Unsteered;
        };
        if f.ethertype() != EtherType::Arp {
            return Route::Unsteered;
        }
        match arp::Packet::new_checked(f.payload()).and_then(|p| ArpRepr::parse(&p)) {
            Ok(a) if a.operation == ArpOperation::Request => Route::ArpRequest,
            Ok(_) => Route::ArpReply,
            Err(_) => Route::Unsteered,
        }
    }

    /// The shard owning the TCP or UDP flow `src:sport` ↔ `dst:dport` (either direction).
    /// A shard choosing an ephemeral port can use it to pick one whose flow comes back to
    /// itself.
    #[inline]
    pub fn owner_of_flow(
        &self,
        src: Ipv4Address,
        dst: Ipv4Address,
        sport: u16,
        dport: u16,
    ) -> usize {
        queue_of(self.hasher.hash_v4(src, dst, sport, dport), self.shards)
    }

    /// The queue a link that steers by this rule puts `frame` on: its owner, and queue 0
    /// for frames every shard or any shard may take (as a NIC puts frames it cannot hash on
    /// queue 0).
    #[inline]
    pub fn queue_for(&self, frame: &[u8]) -> usize {
        match self.owner(frame) {
            Owner::Shard(k) => k,
            Owner::Every | Owner::Receiver => 0,
        }
    }
}

/// What a shard's steering did, counted on the shard's own thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SteerCounters {
    /// Frames from the shard's own queue handed to its engine (owned here, ARP kept here,
    /// unsteerable frames).
    pub local: u64,
    /// Copies of frames pushed into a peer's ring (an ARP reply counts once per peer).
    pub forwarded: u64,
    /// Frames from peers' rings handed to the engine.
    pub received: u64,
    /// Copies dropped because the peer's ring was full (the peer is behind or stopped).
    pub ring_full: u64,
    /// Frames dropped because they exceed the rings' largest frame.
    pub too_large: u64,
    /// Reads of a peer's ring that found it corrupt (never expected in one process).
    pub ring_errors: u64,
    /// ARP requests taken from the shard's own queue.
    pub arp_requests: u64,
    /// ARP replies taken from the shard's own queue (each also copied to every peer).
    pub arp_replies: u64,
    /// Frames with nothing to steer by (not IPv4, not ARP, or malformed), kept here.
    pub unsteered: u64,
}

impl SteerCounters {
    /// The counters with nstat-style names, in display order.
    pub fn named(&self) -> [(&'static str, u64); 9] {
        [
            ("ShardRxLocal", self.local),
            ("ShardFwdOut", self.forwarded),
            ("ShardFwdIn", self.received),
            ("ShardFwdRingFull", self.ring_full),
            ("ShardFwdTooLarge", self.too_large),
            ("ShardFwdRingErrors", self.ring_errors),
            ("ShardArpRequests", self.arp_requests),
            ("ShardArpReplies", self.arp_replies),
            ("ShardUnsteered", self.unsteered),
        ]
    }

    /// Adds `other` into `self` (totals over shards).
    pub fn merge(&mut self, other: &SteerCounters) {
        self.local += other.local;
        self.forwarded += other.forwarded;
        self.received += other.received;
        self.ring_full += other.ring_full;
        self.too_large += other.too_large;
        self.ring_errors += other.ring_errors;
        self.arp_requests += other.arp_requests;
        self.arp_replies += other.arp_replies;
        self.unsteered += other.unsteered;
    }
}

/// How a shard sleeps on its queue so that both its device and its peers can wake it.
enum WaitMode {
    /// The device's own `wait`, in slices of [`WAIT_SLICE`]: nobody can interrupt it.
    Slices,
    /// `poll(2)` on the device's descriptor and on an eventfd that peers signal.
    Poll { dev: OwnedFd, bell: Arc<EventFd> },
    /// The device's own `wait`, which peers interrupt through the device's waker.
    Device,
}

/// One shard's device queue, and how its shard may sleep on it.
pub struct Queue {
    dev: Box<dyn Device + Send>,
    mode: WaitMode,
    waker: Option<Arc<dyn Wake>>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.mode {
            WaitMode::Slices => "slices",
            WaitMode::Poll { .. } => "poll",
            WaitMode::Device => "device",
        };
        f.debug_struct("Queue").field("wait", &mode).finish()
    }
}

impl Queue {
    /// A queue whose device others cannot wake: an idle shard sleeps in the device's `wait`
    /// for at most [`WAIT_SLICE`] at a time and looks at its peers' rings between slices
    /// (the shm wire, several AF_XDP sockets in one device: links without one descriptor
    /// to poll — the others come with one, `LinkSpec::open_queues_waitable`). A forwarded frame waits at most one slice for an idle shard.
    pub fn new(dev: impl Device + Send + 'static) -> Self {
        Self::boxed(Box::new(dev))
    }

    /// [`Queue::new`] for a device already boxed.
    pub fn boxed(dev: Box<dyn Device + Send>) -> Self {
        Self {
            dev,
            mode: WaitMode::Slices,
            waker: None,
        }
    }

    /// A queue whose device becomes readable on `fd` when frames wait (level-triggered, as
    /// a TAP or packet socket descriptor, e.g. a duplicate taken before wrapping the device
    /// in middleware): an idle shard sleeps in `poll(2)` on it and on an eventfd its peers
    /// signal. The device's own `wait` is not used.
    pub fn with_fd(dev: Box<dyn Device + Send>, fd: OwnedFd) -> std::io::Result<Self> {
        let bell = Arc::new(EventFd::new()?);
        Ok(Self {
            dev,
            waker: Some(bell.clone()),
            mode: WaitMode::Poll { dev: fd, bell },
        })
    }

    /// A queue whose device's own `wait` ends when `waker` is called (even if called just
    /// before the wait began), e.g. [`NicQueue::waker`](crate::nic::NicQueue::waker): an idle
    /// shard sleeps in the device, and peers forwarding to it call `waker`.
    pub fn with_waker(dev: Box<dyn Device + Send>, waker: Arc<dyn Wake>) -> Self {
        Self {
            dev,
            mode: WaitMode::Device,
            waker: Some(waker),
        }
    }

    /// What wakes the shard sleeping on this queue, if anything can (for the mesh's
    /// doorbell).
    pub fn waker(&self) -> Option<Arc<dyn Wake>> {
        self.waker.clone()
    }
}

/// A shard's device queue with steering: a [`Device`] for the shard's engine.
///
/// Receive: up to half the budget from peers' rings, then the rest from the queue, each
/// frame of the queue handed to the engine or copied to its owner; the copies are published
/// (and sleeping owners woken) once per batch. Transmit: the queue's own. Wait: until a frame
/// arrives on the queue or from a peer, or the timeout.
pub struct Steered {
    dev: Box<dyn Device + Send>,
    mode: WaitMode,
    port: MeshPort,
    steering: Steering,
    counters: SteerCounters,
    /// The last receive took frames: more may wait, so the next wait returns at once.
    busy: bool,
    /// A frame with a partial checksum, completed before it is forwarded (reused).
    scratch: Vec<u8>,
    /// Who owns a flow's frame instead of the hash ([`Steered::with_rule`]).
    rule: Option<FlowRule>,
}

/// An owner rule for flow frames (IPv4 TCP/UDP) that replaces the Toeplitz hash: the shard
/// that owns the frame, or `None` for the shard that received it. ARP and everything else
/// keep the table of the [module docs](self). The offload daemon's rule is its port table
/// (the engine that owns the destination port), so a listener and a connection live where
/// their application is, whatever queue their frames arrive on.
pub type FlowRule = Box<dyn Fn(&[u8]) -> Option<usize> + Send>;

impl std::fmt::Debug for Steered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steered")
            .field("shard", &self.port.node())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Steered {
    /// One steered queue per shard: the cross-shard rings of `rings` between every pair of
    /// them, shard `i` owning `queues[i]`.
    pub fn group(queues: Vec<Queue>, rings: RingSpec) -> std::io::Result<Vec<Steered>> {
        let wakers = queues.iter().map(Queue::waker).collect();
        let ports = Mesh::new("flowstack-shards", rings, wakers)?.into_ports();
        Ok(queues
            .into_iter()
            .zip(ports)
            .map(|(q, p)| Steered::new(q, p))
            .collect())
    }

    /// Wraps shard `port.node()`'s `queue`; `port` is its end of the shards' mesh, whose
    /// doorbell for this shard must have been made with [`Queue::waker`] (as
    /// [`Steered::group`] does).
    pub fn new(queue: Queue, port: MeshPort) -> Self {
        Self {
            steering: Steering::new(port.nodes()),
            dev: queue.dev,
            mode: queue.mode,
            port,
            counters: SteerCounters::default(),
            busy: false,
            scratch: Vec::new(),
            rule: None,
        }
    }

    /// Steers flow frames by `rule` instead of the hash ([`FlowRule`]).
    pub fn with_rule(mut self, rule: FlowRule) -> Self {
        self.rule = Some(rule);
        self
    }

    /// The shard this queue belongs to.
    pub fn shard(&self) -> usize {
        self.port.node()
    }

    /// What steering did so far.
    pub fn counters(&self) -> SteerCounters {
        self.counters
    }

    /// Every shard's doorbell (to wake them all, e.g. to stop).
    pub fn doorbells(&self) -> Arc<[Doorbell]> {
        self.port.doorbells()
    }

    /// True if peers forwarded frames that wait in this shard's rings (the queue's own
    /// frames are the device's `rx_pending`, or its descriptor's readiness).
    pub fn forwarded_pending(&self) -> bool {
        self.port.pending()
    }

    /// The wrapped device.
    pub fn device(&self) -> &(dyn Device + Send) {
        &*self.dev
    }

    /// Takes frames forwarded by peers.
    fn recv_forwarded(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let (n, err) = self.port.recv(budget, &mut |_, f| sink(f));
        self.counters.received += n as u64;
        if err.is_some() {
            self.counters.ring_errors += 1;
        }
        n
    }

    /// Receives from the shard's queue, with checksum metadata (`meta`) or without; frames
    /// forwarded to other shards always travel with complete checksums (the cross-shard
    /// ring carries bytes only), so a partial one is completed on a copy first.
    fn recv_steered(
        &mut self,
        now: Instant,
        budget: usize,
        meta: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let mut delivered =
            self.recv_forwarded(budget.div_ceil(2), &mut |f| sink(f, RxMeta::default()));
        let me = self.port.node();
        let shards = self.port.nodes();
        let Self {
            dev,
            port,
            steering,
            counters: c,
            scratch,
            rule,
            ..
        } = self;
        let room = budget - delivered;
        let mut each = |f: &[u8], m: RxMeta| {
            let route = match (steering.route(f), rule.as_ref()) {
                (Route::Flow(_), Some(r)) => Route::Flow(r(f).unwrap_or(me)),
                (route, _) => route,
            };
            let keep = match route {
                Route::Flow(k) if k != me => {
                    if m.l4_csum_ok {
                        scratch.clear();
                        scratch.extend_from_slice(f);
                        complete_checksum(scratch);
                        forward(port, c, k, scratch);
                    } else {
                        forward(port, c, k, f);
                    }
                    false
                }
                Route::Flow(_) => true,
                Route::ArpRequest => {
                    c.arp_requests += 1;
                    if me != ARP_REQUEST_SHARD {
                        forward(port, c, ARP_REQUEST_SHARD, f);
                    }
                    me == ARP_REQUEST_SHARD
                }
                Route::ArpReply => {
                    c.arp_replies += 1;
                    for k in (0..shards).filter(|&k| k != me) {
                        forward(port, c, k, f);
                    }
                    true
                }
                Route::Unsteered => {
                    c.unsteered += 1;
                    true
                }
            };
            if keep {
                c.local += 1;
                delivered += 1;
                sink(f, m);
            }
        };
        let taken = if meta {
            dev.recv_batch_meta(now, room, &mut each)
        } else {
            dev.recv_batch(now, room, &mut |f| each(f, RxMeta::default()))
        };
        self.port.flush();
        self.busy = taken > 0 || delivered > 0;
        delivered
    }
}

/// Copies `frame` to `to`, counting the outcome.
#[inline]
fn forward(port: &mut MeshPort, c: &mut SteerCounters, to: usize, frame: &[u8]) {
    match port.push(to, frame) {
        Ok(()) => c.forwarded += 1,
        Err(RingError::TooLarge { .. }) => c.too_large += 1,
        // Full, or (never in one process) a corrupt consumer index: the copy is lost.
        Err(_) => c.ring_full += 1,
    }
}

impl Device for Steered {
    fn caps(&self) -> DeviceCaps {
        self.dev.caps()
    }

    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        self.recv_steered(now, budget, false, &mut |f, _| sink(f))
    }

    fn recv_batch_meta(
        &mut self,
        now: Instant,
        budget: usize,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        self.recv_steered(now, budget, true, sink)
    }

    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        self.dev.send_batch(now, batch)
    }

    fn poll_at(&self) -> Option<Instant> {
        self.dev.poll_at()
    }

    fn rx_pending(&self, now: Instant) -> bool {
        self.port.pending() || self.dev.rx_pending(now)
    }

    fn wait(&mut self, timeout: Duration) {
        if std::mem::take(&mut self.busy) || self.port.pending() {
            return;
        }
        let Self {
            dev, mode, port, ..
        } = self;
        let bell = port.doorbell();
        match mode {
            WaitMode::Slices => dev.wait(timeout.min(WAIT_SLICE)),
            WaitMode::Device => {
                bell.sleep(|| port.pending(), || dev.wait(timeout));
            }
            WaitMode::Poll { dev: fd, bell: efd } => {
                bell.sleep(
                    || port.pending(),
                    || {
                        let fds = [fd.as_fd(), efd.as_fd()];
                        let _ = flowstack_sys::poll::wait_any_readable(&fds, timeout);
                    },
                );
                let _ = efd.take();
            }
        }
    }

    fn link_down(&self) -> bool {
        self.dev.link_down()
    }
}
