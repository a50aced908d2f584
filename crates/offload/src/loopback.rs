//! The daemon's own interface on 127.0.0.0/8: no privileges, no kernel.
//!
//! [`LoopbackDevice`] is the device a loopback interface wants: every frame transmitted comes
//! back as a received frame. Each engine is configured as a loopback interface
//! (`IfaceConfig::loopback`): it owns the whole prefix, as on Linux's `lo`.
//!
//! [`Loopback`] is one engine thread's interface: its engine and its device. With one engine
//! the device is a plain [`LoopbackDevice`]. With several ([`Loopback::routed`]) every engine
//! thread has its own, and a TCP frame an engine transmits goes to the engine that owns its
//! destination port in the daemon's [`PortTable`] — through the cross-engine rings of a
//! [`Mesh`](flowstack_runtime::xring::Mesh), whose doorbells wake a sleeping engine — or stays
//! local when the port is its own or nobody's (so a SYN to a closed port gets its RST from
//! the sender's own engine). The per-frame path reads one atomic byte and copies the frame
//! once into the ring; no lock, no allocation.
use crate::ports::PortTable;
use flowstack_link::{Device, DeviceCaps, FrameQueue, PartsSink, RxMeta, TxBatch};
use flowstack_runtime::xring::{Doorbell, MeshPort};
use flowstack_runtime::{AddrSpec, SteerCounters, Steered};
use flowstack_stack::{Engine, EngineConfig, IfaceConfig, SocketError, TcpHandle};
use flowstack_wire::{ChecksumCaps, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// A device whose transmitted frames are received back (a loopback interface).
///
/// It gathers ([`Device::can_gather`]) as the in-process pipe does: the engine's own frames
/// are taken, not copied ([`Device::send_batch_take`]), and a frame whose payload is a
/// zero-copy send's memory (`send_file`'s chunks) comes back as headers plus that memory,
/// which the receiving connection copies once into its receive buffer
/// ([`Device::recv_batch_parts`]); the memory stays referenced until then.
#[derive(Debug)]
pub struct LoopbackDevice {
    frames: FrameQueue,
    /// Where a gathered frame is flattened for a whole-frame receiver.
    flat: Vec<u8>,
}

/// Frames a loopback device holds at most (more are dropped, as a full ring would).
pub const LOOPBACK_CAPACITY: usize = 4096;

impl Default for LoopbackDevice {
    fn default() -> Self {
        Self {
            frames: FrameQueue::new(LOOPBACK_CAPACITY),
            flat: Vec::new(),
        }
    }
}

impl LoopbackDevice {
    /// Queues a copy of one whole frame to come back; false if the device is full (dropped).
    #[inline]
    fn send_one(&mut self, f: &[u8]) -> bool {
        self.frames.push_copy(f, None)
    }
}

impl Device for LoopbackDevice {
    fn caps(&self) -> DeviceCaps {
        LINK_CAPS
    }
    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let (q, flat) = (&mut self.frames, &mut self.flat);
        (0..budget).take_while(|_| q.pop_whole(flat, sink)).count()
    }
    fn recv_batch_parts(&mut self, _now: Instant, budget: usize, sink: &mut PartsSink) -> usize {
        let q = &mut self.frames;
        (0..budget).take_while(|_| q.pop_parts(sink)).count()
    }
    fn can_gather(&self) -> bool {
        true
    }
    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let q = &mut self.frames;
        batch
            .iter_parts()
            .filter(|(f, tail)| q.push_copy(f, *tail))
            .count()
    }
    fn send_batch_take(&mut self, _now: Instant, batch: &mut TxBatch) -> usize {
        let q = &mut self.frames;
        (0..batch.len()).filter(|&i| q.push_taken(batch, i)).count()
    }
    fn rx_pending(&self, _now: Instant) -> bool {
        !self.frames.is_empty()
    }
}

/// One engine thread's end of a multi-engine loopback: frames for ports of other engines
/// leave through the mesh, the rest come back here.
pub struct RoutedDevice {
    me: usize,
    local: LoopbackDevice,
    mesh: MeshPort,
    ports: Arc<PortTable>,
    /// Frames dropped because the ring to their engine was full (`FlowstackdMeshDrops`).
    pub drops: u64,
    /// Frames sent to other engines (`FlowstackdMeshFrames`).
    pub forwarded: u64,
    /// The last first fragment routed and where (identification, engine): its datagram's
    /// later fragments follow it there (an engine emits a datagram's fragments in order, one
    /// after the other), so reassembly happens on the engine that owns the port.
    frag: Option<(u16, usize)>,
}

impl RoutedDevice {
    /// Node `mesh.node()` of a mesh routed by `ports`.
    fn new(mesh: MeshPort, ports: Arc<PortTable>) -> Self {
        Self {
            me: mesh.node(),
            local: LoopbackDevice::default(),
            mesh,
            ports,
            drops: 0,
            forwarded: 0,
            frag: None,
        }
    }
}

/// The TCP destination port of an Ethernet/IPv4 frame, if it is one.
#[inline]
pub(crate) fn tcp_dst_port(f: &[u8]) -> Option<u16> {
    if f.len() < 14 + 20 || f[12] != 0x08 || f[13] != 0x00 || f[14 + 9] != 6 {
        return None;
    }
    let ihl = ((f[14] & 0x0f) as usize) * 4;
    let at = 14 + ihl + 2;
    let b = f.get(at..at + 2)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// An IPv4 fragment's (identification, offset) — a frame with MF set or a non-zero offset.
#[inline]
fn frag_of(f: &[u8]) -> Option<(u16, u16)> {
    let flags = u16::from_be_bytes([*f.get(14 + 6)?, *f.get(14 + 7)?]);
    let (more, off) = (flags & 0x2000 != 0, flags & 0x1fff);
    (more || off != 0).then(|| (u16::from_be_bytes([f[14 + 4], f[14 + 5]]), off))
}

/// The engine that owns an Ethernet/IPv4 frame's destination: its TCP port's, or its UDP
/// port's in the UDP namespace (`udp_ports`); None: stays here.
#[inline]
fn frame_route(ports: &PortTable, f: &[u8]) -> Option<usize> {
    if let Some(p) = tcp_dst_port(f) {
        return ports.route(p);
    }
    if f.len() < 14 + 20 || f[12] != 0x08 || f[13] != 0x00 || f[14 + 9] != 17 {
        return None;
    }
    // A later fragment has no UDP header: routed with its first (`RoutedDevice::frag`).
    if frag_of(f).is_some_and(|(_, off)| off != 0) {
        return None;
    }
    let at = 14 + ((f[14] & 0x0f) as usize) * 4 + 2;
    let b = f.get(at..at + 2)?;
    ports.udp.route(u16::from_be_bytes([b[0], b[1]]))
}

impl Device for RoutedDevice {
    fn caps(&self) -> DeviceCaps {
        LINK_CAPS
    }
    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let n = self.local.recv_batch(now, budget, sink);
        if n >= budget {
            return n;
        }
        // Frames are read in place from the shared ring. A corrupt ring (never written by
        // anything but our own engines) stays stuck and is reported by `pending` forever;
        // nothing to recover here.
        let (m, _) = self.mesh.recv(budget - n, &mut |_, f| sink(f));
        n + m
    }
    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        let mut sent = 0;
        let mut remote = false;
        for f in batch.iter() {
            let to = match frag_of(f) {
                Some((id, off)) if off != 0 => self.frag.filter(|x| x.0 == id).map(|x| x.1),
                Some((id, _)) => {
                    let to = frame_route(&self.ports, f);
                    self.frag = to.map(|e| (id, e));
                    to
                }
                None => frame_route(&self.ports, f),
            };
            match to {
                Some(to) if to != self.me => {
                    remote = true;
                    if self.mesh.push(to, f).is_ok() {
                        self.forwarded += 1;
                        sent += 1;
                    } else {
                        self.drops += 1;
                    }
                }
                _ => sent += self.local.send_one(f) as usize,
            }
        }
        if remote {
            self.mesh.flush();
        }
        let _ = now;
        sent
    }
    fn rx_pending(&self, _now: Instant) -> bool {
        !self.local.frames.is_empty() || self.mesh.pending()
    }
}

/// The device of a [`Loopback`]: one engine alone, or one of several.
pub enum LoDev {
    /// The only engine: every frame comes back.
    Local(LoopbackDevice),
    /// One of several engines.
    Routed(Box<RoutedDevice>),
    /// The real link the daemon was given (`--tap`, `--packet`, `--xdp`, `--shm-fd`): not a
    /// loopback at all, the device of the link engine ([`Loopback::attach_link`]).
    Link(LinkDev),
}

/// The device of a link engine: the link itself (one engine), or this engine's queue of it
/// with steering (several; its counters are the daemon's `FlowstackdLinkSteered…`).
pub enum LinkDev {
    /// The whole link.
    One(Box<dyn Device + Send>),
    /// One queue of several, steered.
    Steered(Box<Steered>),
}

impl LinkDev {
    fn dev(&self) -> &dyn Device {
        match self {
            LinkDev::One(d) => d,
            LinkDev::Steered(d) => &**d,
        }
    }
    fn dev_mut(&mut self) -> &mut dyn Device {
        match self {
            LinkDev::One(d) => d,
            LinkDev::Steered(d) => &mut **d,
        }
    }
}

impl Device for LoDev {
    fn caps(&self) -> DeviceCaps {
        match self {
            LoDev::Link(d) => d.dev().caps(),
            _ => LINK_CAPS,
        }
    }
    #[inline]
    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        match self {
            LoDev::Local(d) => d.recv_batch(now, budget, sink),
            LoDev::Routed(d) => d.recv_batch(now, budget, sink),
            LoDev::Link(d) => d.dev_mut().recv_batch(now, budget, sink),
        }
    }
    #[inline]
    fn recv_batch_meta(
        &mut self,
        now: Instant,
        budget: usize,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        match self {
            // The link's offload metadata (vnet header: checksum verified, GRO) goes through.
            LoDev::Link(d) => d.dev_mut().recv_batch_meta(now, budget, sink),
            _ => self.recv_batch(now, budget, &mut |f| sink(f, RxMeta::default())),
        }
    }
    #[inline]
    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        match self {
            LoDev::Local(d) => d.send_batch(now, batch),
            LoDev::Routed(d) => d.send_batch(now, batch),
            LoDev::Link(d) => d.dev_mut().send_batch(now, batch),
        }
    }
    #[inline]
    fn send_batch_take(&mut self, now: Instant, batch: &mut TxBatch) -> usize {
        match self {
            LoDev::Local(d) => d.send_batch_take(now, batch),
            LoDev::Routed(d) => d.send_batch(now, batch),
            LoDev::Link(d) => d.dev_mut().send_batch_take(now, batch),
        }
    }
    #[inline]
    fn recv_batch_parts(&mut self, now: Instant, budget: usize, sink: &mut PartsSink) -> usize {
        match self {
            LoDev::Local(d) => d.recv_batch_parts(now, budget, sink),
            LoDev::Routed(d) => d.recv_batch_parts(now, budget, sink),
            LoDev::Link(d) => d.dev_mut().recv_batch_parts(now, budget, sink),
        }
    }
    fn can_gather(&self) -> bool {
        match self {
            // Frames between engines cross the mesh rings whole.
            LoDev::Local(d) => d.can_gather(),
            LoDev::Routed(_) => false,
            LoDev::Link(d) => d.dev().can_gather(),
        }
    }
    fn poll_at(&self) -> Option<Instant> {
        match self {
            LoDev::Link(d) => d.dev().poll_at(),
            _ => None,
        }
    }
    #[inline]
    fn rx_pending(&self, now: Instant) -> bool {
        match self {
            LoDev::Local(d) => d.rx_pending(now),
            LoDev::Routed(d) => d.rx_pending(now),
            LoDev::Link(d) => d.dev().rx_pending(now),
        }
    }
    fn link_down(&self) -> bool {
        match self {
            LoDev::Link(d) => d.dev().link_down(),
            _ => false,
        }
    }
}

/// The loopback link: a trusted in-memory path, so checksums are skipped as Linux loopback
/// does, with a 64 KiB MTU.
pub const LINK_CAPS: DeviceCaps = DeviceCaps {
    mtu: 65535 - 14,
    checksum: ChecksumCaps {
        verify_rx: false,
        fill_tx: false,
    },
    max_tx_datagram: 65535 - 14,
    queues: 1,
};

/// The loopback interface's own address (the prefix is 127.0.0.0/8).
pub const LOOPBACK_IP: Ipv4Addr = Ipv4Addr::LOCALHOST;

fn engine(i: usize, ephemeral: Option<(u16, u16)>) -> Engine {
    // One interface seen from several engines: one address (frames cross engines unchanged).
    let _ = i;
    loopback_engine(Ipv4Cidr::new(Ipv4Address::from(LOOPBACK_IP), 8), ephemeral)
}

/// An engine configured as a loopback interface owning `prefix`.
fn loopback_engine(prefix: Ipv4Cidr, ephemeral: Option<(u16, u16)>) -> Engine {
    let mac = EthernetAddress([0x02, 0x66, 0x73, 0x7f, 0, 1]);
    let mut cfg = EngineConfig::new(IfaceConfig::loopback(mac, prefix));
    if let Some(r) = ephemeral {
        cfg.ephemeral = r;
    }
    // The link's full MSS (65,483 bytes after the clamp to the device), as Linux's `lo`
    // announces: with TCP's default of 1460 a 64 KiB message took 45 segments through the
    // engine (headers, ACK processing and a frame each) instead of one.
    cfg.tcp.defaults.mss = u16::MAX;
    Engine::new(cfg, LINK_CAPS)
}

/// True if `ip` is on the daemon's loopback (127.0.0.0/8).
pub fn is_loopback(ip: &Ipv4Addr) -> bool {
    ip.octets()[0] == 127
}

/// One engine thread's interfaces: its 127.0.0.0/8 engine (`engines[0]`; the vector keeps
/// the single-thread layout of several engines per loop possible), perhaps the engine of the
/// daemon's real link ([`Loopback::attach_link`], last), and their devices.
pub struct Loopback {
    /// The engines; a connection lives on one of them.
    pub engines: Vec<Engine>,
    devs: Vec<LoDev>,
    /// The real link: its engine's index and addresses.
    link: Option<(usize, AddrSpec)>,
    /// The engine that carries connections to the link's own address (last): a loopback
    /// interface owning that one address ([`Loopback::attach_link`]).
    local: Option<usize>,
    /// What an idle engine sleeps on for its link.
    link_wait: LinkWait,
}

/// How an idle engine sleeps on its real link instead of looking at it every
/// [`LINK_SLICE`](crate::engine::LINK_SLICE): the link's descriptor, readable when frames
/// wait (`flowstack_runtime::Waitable`), and with several engines the steering mesh's
/// doorbells (`Steered::doorbells`) and this engine's index in them — announcing sleep there
/// makes an engine that steers a frame here ring this engine's doorbell eventfd.
#[derive(Default)]
pub struct LinkWait {
    /// Readable when frames wait on this engine's queue of the link.
    pub fd: Option<OwnedFd>,
    /// The steering doorbells and this engine's index (several engines).
    pub steer: Option<(Arc<[Doorbell]>, usize)>,
}

impl Default for Loopback {
    fn default() -> Self {
        Self::new(1)
    }
}

impl Loopback {
    /// Builds `n` (at least one) loopback engines.
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        Self {
            engines: (0..n).map(|i| engine(i, None)).collect(),
            devs: (0..n)
                .map(|_| LoDev::Local(LoopbackDevice::default()))
                .collect(),
            link: None,
            local: None,
            link_wait: LinkWait::default(),
        }
    }

    /// Engine `me` of several: frames for other engines' ports go through `mesh`.
    pub fn routed(me: usize, mesh: MeshPort, ports: Arc<PortTable>) -> Self {
        debug_assert_eq!(mesh.node(), me);
        Self {
            engines: vec![engine(me, Some(ports.connect_slice(me)))],
            devs: vec![LoDev::Routed(Box::new(RoutedDevice::new(mesh, ports)))],
            link: None,
            local: None,
            link_wait: LinkWait::default(),
        }
    }

    /// Frames (dropped at a full ring, sent) between this engine and the others.
    pub fn mesh_counters(&self) -> (u64, u64) {
        self.devs.iter().fold((0, 0), |(d, f), x| match x {
            LoDev::Routed(r) => (d + r.drops, f + r.forwarded),
            LoDev::Local(_) | LoDev::Link(_) => (d, f),
        })
    }

    /// Frames from other engines wait in this engine's rings (checked before sleeping).
    pub fn mesh_pending(&self) -> bool {
        self.devs.iter().any(|x| match x {
            LoDev::Routed(r) => r.mesh.pending(),
            LoDev::Local(_) | LoDev::Link(_) => false,
        })
    }

    /// One turn of every engine; true if frames moved.
    pub fn poll(&mut self, now: Instant) -> bool {
        self.poll_to(now, &mut |_, _, _| 0)
    }

    /// [`Loopback::poll`], offering received in-order data to `deliver(engine, connection,
    /// bytes)` first (`Engine::poll_to`).
    pub fn poll_to(
        &mut self,
        now: Instant,
        deliver: &mut dyn FnMut(usize, TcpHandle, &[u8]) -> usize,
    ) -> bool {
        let mut moved = false;
        // Twice, so frames an engine sent to itself are taken in the same turn.
        for _ in 0..2 {
            let engines = self.engines.iter_mut().zip(self.devs.iter_mut());
            for (i, (e, d)) in engines.enumerate() {
                moved |= e.poll_to(now, d, &mut |h, data| deliver(i, h, data));
            }
        }
        moved
    }

    /// Stamps socket calls made before the next poll.
    pub fn set_now(&mut self, now: Instant) {
        for e in &mut self.engines {
            e.set_now(now);
        }
    }

    /// The earliest deadline of any engine.
    pub fn poll_at(&self) -> Option<Instant> {
        // The devices' too: frames an impairment holds back come out at their time.
        let devs = self.devs.iter().filter_map(|d| d.poll_at());
        self.engines
            .iter()
            .filter_map(|e| e.poll_at())
            .chain(devs)
            .min()
    }

    /// Adds the engine of a real link: `dev` with the addresses `addr` (ARP, routes and the
    /// gateway are that engine's, shared by every application of the engine thread);
    /// `ephemeral`: the ports it connects from (with several engines, this engine's slice,
    /// so the port table routes the answers here).
    ///
    /// A connection to the link's own address is carried locally, as the kernel carries any
    /// local address over `lo` (it never leaves through the link): one more engine, a
    /// loopback interface owning exactly that address (/32), connects to it and listens
    /// beside the link's engine on it and on 0.0.0.0. With one engine thread its frames come
    /// back to it (`own` None); with several, `own` is this thread's port of a mesh between
    /// the threads' own-address engines (and the port table): a frame goes to the engine
    /// thread that owns its destination port, as on 127/8 — the listener's, or the connect
    /// slice it was sent from, which is this thread's link engine's slice too.
    pub fn attach_link(
        &mut self,
        dev: LinkDev,
        addr: AddrSpec,
        ephemeral: Option<(u16, u16)>,
        own: Option<(MeshPort, Arc<PortTable>)>,
    ) {
        let mut cfg = addr.engine_config();
        if let Some(r) = ephemeral {
            cfg.ephemeral = r;
        }
        let e = Engine::new(cfg, dev.dev().caps());
        self.link = Some((self.engines.len(), addr));
        self.engines.push(e);
        self.devs.push(LoDev::Link(dev));
        let own_ip = Ipv4Cidr::new(addr.ip.addr, 32);
        self.local = Some(self.engines.len());
        self.engines.push(loopback_engine(own_ip, ephemeral));
        self.devs.push(match own {
            None => LoDev::Local(LoopbackDevice::default()),
            Some((mesh, ports)) => LoDev::Routed(Box::new(RoutedDevice::new(mesh, ports))),
        });
    }

    /// What steering did on this engine's queue of the link (several engines).
    pub fn steer_counters(&self) -> SteerCounters {
        let mut c = SteerCounters::default();
        for d in &self.devs {
            if let LoDev::Link(LinkDev::Steered(s)) = d {
                c.merge(&s.counters());
            }
        }
        c
    }

    /// Sets what an idle engine sleeps on for its link ([`LinkWait`]).
    pub fn set_link_wait(&mut self, wait: LinkWait) {
        self.link_wait = wait;
    }

    /// The link's descriptor to sleep on, if the link has one.
    pub fn link_fd(&self) -> Option<BorrowedFd<'_>> {
        self.link_wait.fd.as_ref().map(|f| f.as_fd())
    }

    /// The steering doorbell to announce sleep on (a steered link).
    pub fn link_doorbell(&self) -> Option<&Doorbell> {
        self.link_wait.steer.as_ref().and_then(|(b, i)| b.get(*i))
    }

    /// True if an idle engine must look at its link every slice: it has one, and either no
    /// descriptor to sleep on or (steered) no doorbell the other engines ring.
    pub fn link_needs_slices(&self) -> bool {
        let Some((i, _)) = self.link else {
            return false;
        };
        let steered = matches!(self.devs[i], LoDev::Link(LinkDev::Steered(_)));
        self.link_wait.fd.is_none() || (steered && self.link_doorbell().is_none())
    }

    /// The real link's engine and addresses, if the daemon has one.
    pub fn link(&self) -> Option<(usize, AddrSpec)> {
        self.link
    }

    /// Frames wait on the real link (checked before sleeping). With a descriptor to sleep on,
    /// only frames other engines steered here are checked: the descriptor is level-triggered,
    /// so the sleep's `poll(2)` returns at once for frames already waiting on the device (a
    /// TAP cannot tell without a system call and always says "maybe").
    pub fn link_pending(&self, now: Instant) -> bool {
        let Some((i, _)) = self.link else {
            return false;
        };
        match (&self.devs[i], self.link_wait.fd.is_some()) {
            (LoDev::Link(LinkDev::Steered(s)), true) => s.forwarded_pending(),
            (_, true) => false,
            (d, false) => d.rx_pending(now),
        }
    }

    /// True if `ip` is one of the daemon's own addresses: 127/8 or the link's.
    pub fn is_local(&self, ip: &Ipv4Addr) -> bool {
        is_loopback(ip) || self.is_link_addr(ip)
    }

    /// True if a connection to `ip` leaves through the real link: on its subnet, or anywhere
    /// but 127/8 when it has a gateway (RFC 1122 §3.3.1.1: a destination off the subnet
    /// goes to a gateway).
    pub fn via_link(&self, ip: &Ipv4Addr) -> bool {
        let Some((_, a)) = self.link else {
            return false;
        };
        let dst = Ipv4Address::from(*ip);
        !is_loopback(ip)
            && !ip.is_unspecified()
            && !ip.is_broadcast()
            && dst != a.ip.broadcast()
            && (a.ip.contains(dst) || a.gateway.is_some())
    }

    /// The engine a connection to `remote` is opened from: `home` (the connecting
    /// application's engine) if the destination is on the loopback, the link's engine if it
    /// leaves through the link, and the link's own address to the engine that carries it
    /// locally (as Linux carries any local address over `lo`).
    pub fn engine_for(&self, remote: &SocketAddrV4, home: usize) -> Result<usize, SocketError> {
        if self.is_link_addr(remote.ip()) {
            // Never out the link to ourselves (its SYN would only count `IpOutNoRoutes`).
            return self.local.ok_or(SocketError::NoRoute);
        }
        if is_loopback(remote.ip()) && !remote.ip().is_broadcast() {
            Ok(home % self.loopbacks())
        } else if self.via_link(remote.ip()) {
            Ok(self.link.map(|(i, _)| i).expect("via_link"))
        } else {
            Err(SocketError::NoRoute)
        }
    }

    /// The loopback engines (all but the link's and the one of its own address, last).
    fn loopbacks(&self) -> usize {
        self.engines.len() - usize::from(self.link.is_some()) - usize::from(self.local.is_some())
    }

    /// `ip` is the link's own address.
    fn is_link_addr(&self, ip: &Ipv4Addr) -> bool {
        self.link
            .is_some_and(|(_, a)| Ipv4Address::from(*ip) == a.ip.addr)
    }

    /// Listens on `port` (all or nothing) on the engines that own `ip`: every engine for
    /// 0.0.0.0, the loopback's for a 127/8 address, the link's for the link's address.
    /// Returns (engine, listener) pairs.
    pub fn listen(
        &mut self,
        ip: Ipv4Addr,
        port: u16,
        backlog: usize,
    ) -> Result<Vec<(usize, TcpHandle)>, SocketError> {
        let which: Vec<usize> = if ip.is_unspecified() {
            (0..self.engines.len()).collect()
        } else if is_loopback(&ip) {
            (0..self.loopbacks()).collect()
        } else if let Some((i, _)) = self.link.filter(|_| self.is_link_addr(&ip)) {
            // The link, and the connections to its address from here (`local`).
            std::iter::once(i).chain(self.local).collect()
        } else {
            return Err(SocketError::AddrNotAvailable);
        };
        let mut hs = Vec::with_capacity(which.len());
        for i in which {
            match self.engines[i].tcp_listen(port, backlog) {
                Ok(h) => hs.push((i, h)),
                Err(e) => {
                    for (j, h) in hs {
                        let _ = self.engines[j].tcp_close(h);
                    }
                    return Err(e);
                }
            }
        }
        Ok(hs)
    }
}

#[cfg(test)]
mod tests;
