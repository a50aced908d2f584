//! AF_PACKET driver on an existing interface (e.g. one end of a veth pair): a TPACKET_V3
//! memory-mapped receive ring, batched `sendmmsg(2)` for transmit, and PACKET_FANOUT in hash
//! mode so that several sockets (one per engine) split the flows of one interface.
//!
//! Transmit: with `PACKET_VNET_HDR` (on when the kernel accepts it) every frame carries a
//! `virtio_net_hdr`, so TCP segments of up to 64 KiB leave as one frame and the kernel
//! segments them (GSO) and fills each segment's checksum (see [`crate::vnet`]);
//! `PACKET_QDISC_BYPASS` skips the queueing discipline. A whole batch goes in one
//! `sendmmsg`. (Measured against a `PACKET_TX_RING`: see `scripts/bench-links.sh` and the
//! README; the ring needs a copy of each frame into the ring and a `send` to kick it, the
//! iovec batch needs no copy.)
//!
//! Receive: a `TPACKET_V2` ring by default (each frame visible as soon as the kernel wrote
//! it), or `TPACKET_V3` ([`RxRing`]); V3 hands a block over only when it is full or after
//! its 1 ms timeout, which delays lone ACKs and so slows the sender (see the README's
//! "Real links" for the measurement). Frames the kernel hands over with a partial checksum
//! (`TP_STATUS_CSUMNOTREADY`, e.g. from a veth peer with checksum offload) get their TCP/UDP
//! checksum completed before delivery by [`Device::recv_batch`]; [`Device::recv_batch_meta`]
//! (what the engine calls) leaves them and marks them `l4_csum_ok`, as it does frames with
//! `TP_STATUS_CSUM_VALID` ([`RxMeta`]). Coalesced large frames (up to 64 KiB) are accepted as
//! they are.
#![allow(unsafe_code)]

use crate::sys::{
    complete_checksum, cvt, interface_exists, interface_index, interface_mtu, wait_readable,
};
use crate::vnet::TxLayout;
use crate::{Device, DeviceCaps, Instant, RxMeta, TxBatch};
use flowstack_wire::Duration;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};

const TPACKET_V2: libc::c_int = 1;
const TPACKET_V3: libc::c_int = 2;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_FANOUT: libc::c_int = 18;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
/// Frames per `sendmmsg` call.
const TX_CHUNK: usize = 64;
/// Retries of a frame the kernel refused with ENOBUFS/EAGAIN before it is dropped.
const TX_RETRIES: u32 = 4;
/// Largest IP datagram sent as one GSO frame: the device takes a GSO packet of at most
/// 64 KiB *including* the Ethernet header (a 65535-byte datagram is refused with ENOBUFS on
/// a veth), so stay a little below.
pub const MAX_GSO_DATAGRAM: usize = 65_536 - 14 - 18;
const PACKET_FANOUT_HASH: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_CSUMNOTREADY: u32 = 8;
/// The checksum was verified (by the device, or the packet is local): `TP_STATUS_CSUM_VALID`.
const TP_STATUS_CSUM_VALID: u32 = 1 << 7;
const PACKET_OUTGOING: u8 = 4;

const TP_STATUS_COPY: u32 = 2;

// TPACKET_V3: 8 blocks of 4 MiB, variable-size frames packed in each.
const BLOCK_SIZE: u32 = 1 << 22;
const BLOCK_NR: u32 = 8;
const FRAME_SIZE: u32 = 1 << 17;
// TPACKET_V2: fixed slots of 68 KiB (a 64 KiB coalesced frame, its headers and the vnet
// header fit), one slot per block; 256 slots (17 MiB). The price of per-frame hand-over: a
// burst of small frames fills slots as fast as large ones (V3 packs them), so a burst of
// more than 256 frames while the engine is not reading is dropped (and counted by the kernel).
const V2_FRAME_SIZE: u32 = 17 * 4096;
const V2_FRAME_NR: u32 = 256;
/// Size of `struct tpacket2_hdr`, already a multiple of TPACKET_ALIGNMENT (16).
const V2_HDR: usize = 32;

/// Which receive ring a packet socket uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RxRing {
    /// `TPACKET_V2`: one fixed-size slot per frame, each handed to user space as soon as it
    /// is written. Lowest latency: an ACK is visible at once.
    #[default]
    V2,
    /// `TPACKET_V3`: frames packed into large blocks; a block is handed over when it is full
    /// or after its 1 ms timeout, so a lone ACK can wait up to 1 ms.
    V3,
}

#[repr(C)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

#[repr(C)]
struct TpacketReq3 {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
    retire_blk_tov: u32,
    sizeof_priv: u32,
    feature_req_word: u32,
}

/// Counters of a packet socket.
#[derive(Debug, Clone, Copy, Default)]
pub struct PacketStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Frames dropped because they did not fit a ring slot.
    pub rx_truncated: u64,
    /// Frames whose checksum was completed in software.
    pub rx_csum_fixups: u64,
    /// Frames with a partial checksum handed over unverified, marked `l4_csum_ok`.
    pub rx_csum_trusted: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Frames the kernel refused.
    pub tx_drops: u64,
    /// Large TCP segments handed to the kernel to segment.
    pub tx_gso: u64,
    /// `sendmmsg` calls.
    pub tx_calls: u64,
    /// Sends retried after the kernel refused a frame for want of buffer space.
    pub tx_retries: u64,
}

/// The transmit side of a packet socket: `sendmmsg` of whole batches, each frame behind a
/// vnet header when the socket has one (GSO and checksum offload, see [`crate::vnet`]).
///
/// [`PacketSocket`] transmits through one; [`PacketSender::open`] makes a transmit-only
/// socket (bound to no protocol, so the kernel hands it no received frames), which the AF_XDP
/// driver uses in copy mode: there the XDP socket's own transmit path builds one MTU-sized
/// skb per frame, while this one hands the kernel 64 KiB segments to cut.
pub struct PacketSender {
    fd: OwnedFd,
    mtu: usize,
    /// Frames carry a vnet header.
    vnet: bool,
    ifindex: i32,
    /// The interface went away (deleted, or its namespace with it).
    down: bool,
    stats: PacketStats,
    /// Transmit scratch, reused by every batch: per frame its layout, its iovecs and its
    /// message header (they point into each other and into the batch only during a call).
    tx_layout: Vec<TxLayout>,
    tx_iov: Vec<libc::iovec>,
    tx_msg: Vec<libc::mmsghdr>,
}

/// One AF_PACKET socket with its receive ring.
pub struct PacketSocket {
    /// The socket (its descriptor) and its transmit side.
    tx: PacketSender,
    ring: NonNull<u8>,
    ring_len: usize,
    kind: RxRing,
    /// The next block (V3) or slot (V2) to read.
    block: u32,
    /// Receive counters (the transmit ones live in `tx`).
    stats: PacketStats,
}

// SAFETY: `ring` points to this socket's own RX ring mapping, created in `open` and unmapped
// only in `drop`; nothing else holds the pointer, and every access goes through `&mut self`
// (or `&self` reads of blocks the kernel has handed to user space). Moving the socket to
// another thread moves sole ownership of the mapping with it, as moving the fd does; the
// type stays `!Sync`, so two threads never touch the ring at once. The per-core runtime
// builds queues on one thread and runs each on its shard's thread.
unsafe impl Send for PacketSocket {}

// SAFETY: the raw pointers a sender holds are the iovec and message scratch, written and
// read only during one `send` call through `&mut self` (they point into the batch and into
// `tx_layout`/`tx_iov` only while that call runs, and are never read between calls). The
// type stays `!Sync`.
unsafe impl Send for PacketSender {}

fn setopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` points to a live value of the size we pass.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            v as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

impl PacketSocket {
    /// Opens one socket on `iface` (no fanout).
    pub fn open(iface: &str) -> io::Result<Self> {
        Self::open_one(iface, None, RxRing::default())
            .map_err(|e| io::Error::new(e.kind(), format!("AF_PACKET on {iface}: {e}")))
    }

    /// Opens `n` sockets on `iface` joined in one hash fanout group: each flow (by its
    /// addresses and ports) always lands on the same socket.
    pub fn open_queues(iface: &str, n: usize) -> io::Result<Vec<Self>> {
        Self::open_queues_with(iface, n, RxRing::default())
    }

    /// [`PacketSocket::open_queues`] with the receive ring `ring`.
    pub fn open_queues_with(iface: &str, n: usize, ring: RxRing) -> io::Result<Vec<Self>> {
        let group = (std::process::id() & 0xffff) as u32;
        (0..n)
            .map(|_| Self::open_one(iface, (n > 1).then_some(group), ring))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| io::Error::new(e.kind(), format!("AF_PACKET on {iface}: {e}")))
    }

    fn open_one(iface: &str, fanout: Option<u32>, kind: RxRing) -> io::Result<Self> {
        let ifindex = interface_index(iface)?;
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // Protocol 0: the socket receives nothing until `bind` names the protocol and the
        // interface below. Opened with ETH_P_ALL it would take every interface's frames into
        // its ring until then, and the ring setup and the bind would each first detach it
        // from the network and wait for an RCU grace period (`synchronize_net`, ~7 ms here).
        // SAFETY: socket(2); the descriptor is immediately owned by OwnedFd.
        let raw = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let version = match kind {
            RxRing::V2 => TPACKET_V2,
            RxRing::V3 => TPACKET_V3,
        };
        setopt(&fd, libc::SOL_PACKET, PACKET_VERSION, &version)?;
        // Both must be set before the ring exists. Without the vnet header, frames go one
        // MTU at a time; without the bypass, through the qdisc: slower, still correct.
        let vnet = setopt(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, &1i32).is_ok();
        let _ = setopt(&fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, &1i32);
        let ring_len = match kind {
            RxRing::V3 => {
                let req = TpacketReq3 {
                    block_size: BLOCK_SIZE,
                    block_nr: BLOCK_NR,
                    frame_size: FRAME_SIZE,
                    frame_nr: BLOCK_SIZE / FRAME_SIZE * BLOCK_NR,
                    retire_blk_tov: 1,
                    sizeof_priv: 0,
                    feature_req_word: 0,
                };
                setopt(&fd, libc::SOL_PACKET, PACKET_RX_RING, &req)?;
                (BLOCK_SIZE * BLOCK_NR) as usize
            }
            RxRing::V2 => {
                let req = TpacketReq {
                    block_size: V2_FRAME_SIZE,
                    block_nr: V2_FRAME_NR,
                    frame_size: V2_FRAME_SIZE,
                    frame_nr: V2_FRAME_NR,
                };
                setopt(&fd, libc::SOL_PACKET, PACKET_RX_RING, &req)?;
                (V2_FRAME_SIZE * V2_FRAME_NR) as usize
            }
        };
        // SAFETY: maps the ring the kernel just allocated for this socket; the mapping is
        // unmapped in Drop and only accessed within `ring_len`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ring = NonNull::new(p as *mut u8).expect("mmap returned non-null");
        // SAFETY: zeroed sockaddr_ll is a valid value; we fill the fields bind needs.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        let _ = setopt(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &1i32);
        if let Some(group) = fanout {
            let arg: u32 = group | (PACKET_FANOUT_HASH << 16);
            setopt(&fd, libc::SOL_PACKET, PACKET_FANOUT, &arg)?;
        }
        let mtu = interface_mtu(iface).unwrap_or(1500);
        Ok(Self {
            tx: PacketSender::with_fd(fd, vnet, mtu, ifindex),
            ring,
            ring_len,
            kind,
            block: 0,
            stats: PacketStats::default(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> PacketStats {
        let t = self.tx.stats;
        PacketStats {
            tx_frames: t.tx_frames,
            tx_drops: t.tx_drops,
            tx_gso: t.tx_gso,
            tx_calls: t.tx_calls,
            tx_retries: t.tx_retries,
            ..self.stats
        }
    }

    /// True if frames carry a vnet header (segmentation and checksum offload).
    pub fn vnet(&self) -> bool {
        self.tx.vnet
    }

    fn block_ptr(&self, i: u32) -> *mut u8 {
        // SAFETY: i < BLOCK_NR, so the offset stays inside the mapping.
        unsafe { self.ring.as_ptr().add((i * BLOCK_SIZE) as usize) }
    }
}

impl PacketSender {
    /// Opens a transmit-only packet socket on `iface`: vnet header (when the kernel takes
    /// it), `PACKET_QDISC_BYPASS`, bound to the interface with protocol 0 so that no
    /// received frame is ever queued to it.
    pub fn open(iface: &str) -> io::Result<Self> {
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("AF_PACKET on {iface}: {e}"));
        let ifindex = interface_index(iface).map_err(ctx)?;
        // SAFETY: socket(2) with protocol 0 (no receive hook); owned by OwnedFd at once.
        let raw = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })
        .map_err(ctx)?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let vnet = setopt(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, &1i32).is_ok();
        let _ = setopt(&fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, &1i32);
        // SAFETY: zeroed sockaddr_ll is a valid value; we fill the fields bind needs.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = 0;
        sll.sll_ifindex = ifindex;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })
        .map_err(ctx)?;
        let mtu = interface_mtu(iface).unwrap_or(1500);
        Ok(Self::with_fd(fd, vnet, mtu, ifindex))
    }

    fn with_fd(fd: OwnedFd, vnet: bool, mtu: usize, ifindex: i32) -> Self {
        Self {
            fd,
            mtu,
            vnet,
            ifindex,
            down: false,
            stats: PacketStats::default(),
            tx_layout: vec![TxLayout::PLAIN; TX_CHUNK],
            tx_iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                4 * TX_CHUNK
            ],
            // SAFETY: an all-zero mmsghdr (null pointers, zero lengths) is a valid value.
            tx_msg: vec![unsafe { std::mem::zeroed() }; TX_CHUNK],
        }
    }

    /// Transmit counters (the `tx_*` fields).
    pub fn stats(&self) -> PacketStats {
        self.stats
    }

    /// True if frames carry a vnet header (segmentation and checksum offload).
    pub fn vnet(&self) -> bool {
        self.vnet
    }

    /// Largest IP datagram this sender takes: 64 KiB segments with a vnet header, else the
    /// MTU.
    pub fn max_tx_datagram(&self) -> usize {
        if self.vnet {
            MAX_GSO_DATAGRAM
        } else {
            self.mtu
        }
    }

    /// True once a send found the interface gone.
    pub fn link_down(&self) -> bool {
        self.down
    }

    /// Sends up to [`TX_CHUNK`] frames in one `sendmmsg` (more calls only after a refusal);
    /// returns how many the kernel took.
    fn send_chunk(&mut self, frames: &[&[u8]]) -> usize {
        let k = frames.len();
        for (l, f) in self.tx_layout.iter_mut().zip(frames) {
            *l = if self.vnet {
                TxLayout::for_frame(f, self.mtu)
            } else {
                TxLayout::PLAIN
            };
            self.stats.tx_gso += l.is_gso() as u64;
        }
        let mut at = 0;
        for (i, f) in frames.iter().enumerate() {
            let first = at;
            let iov = &mut self.tx_iov;
            let mut put = |p: &[u8]| {
                iov[at] = libc::iovec {
                    iov_base: p.as_ptr() as *mut libc::c_void,
                    iov_len: p.len(),
                };
                at += 1;
            };
            if self.vnet {
                self.tx_layout[i].pieces(f, put);
            } else {
                put(f);
            }
            let m = &mut self.tx_msg[i].msg_hdr;
            // SAFETY: `first` < tx_iov.len(); the pointer stays valid until the call below
            // returns (tx_iov is not resized while these pointers are used).
            m.msg_iov = unsafe { self.tx_iov.as_mut_ptr().add(first) };
            m.msg_iovlen = (at - first) as _;
        }
        let mut sent = 0;
        let mut pos = 0;
        let mut retries = 0;
        while pos < k {
            self.stats.tx_calls += 1;
            // SAFETY: tx_msg[pos..k] are initialised message headers whose iovecs point into
            // tx_layout and into `frames`, all alive for the call; the socket is bound, so no
            // address is needed.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    self.tx_msg.as_mut_ptr().add(pos),
                    (k - pos) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r <= 0 {
                let err = io::Error::last_os_error().raw_os_error();
                if matches!(
                    err,
                    Some(libc::ENXIO) | Some(libc::ENODEV) | Some(libc::ENETDOWN)
                ) && !interface_exists(self.ifindex as u32)
                {
                    self.down = true;
                    self.stats.tx_drops += (k - pos) as u64;
                    break;
                }
                // ENOBUFS: the device refused the frame because the receiving side's backlog
                // is full (a veth peer's softirq has not run yet). Dropping a 64 KiB GSO frame
                // costs the connection a recovery, so give the backlog's softirq a chance
                // and retry a few times before dropping.
                if matches!(err, Some(libc::ENOBUFS) | Some(libc::EAGAIN)) && retries < TX_RETRIES {
                    retries += 1;
                    self.stats.tx_retries += 1;
                    std::thread::yield_now();
                    continue;
                }
                // The frame at `pos` was refused (full queue, bad frame): count it, go on.
                retries = 0;
                self.stats.tx_drops += 1;
                pos += 1;
            } else {
                retries = 0;
                sent += r as usize;
                pos += r as usize;
            }
        }
        sent
    }

    /// Transmits every frame of `batch` (whole chunks per `sendmmsg`); returns how many the
    /// kernel took.
    pub fn send(&mut self, batch: &TxBatch) -> usize {
        let mut frames: [&[u8]; TX_CHUNK] = [&[]; TX_CHUNK];
        let mut k = 0;
        let mut sent = 0;
        for f in batch.iter() {
            frames[k] = f;
            k += 1;
            if k == TX_CHUNK {
                sent += self.send_chunk(&frames[..k]);
                k = 0;
            }
        }
        if k > 0 {
            sent += self.send_chunk(&frames[..k]);
        }
        self.stats.tx_frames += sent as u64;
        sent
    }
}

impl Device for PacketSocket {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.tx.mtu,
            max_tx_datagram: self.tx.max_tx_datagram(),
            ..DeviceCaps::ETHERNET
        }
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        self.recv_frames(budget, true, &mut |f, _| sink(f))
    }

    fn recv_batch_meta(
        &mut self,
        _now: Instant,
        budget: usize,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        self.recv_frames(budget, false, sink)
    }

    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        self.tx.send(batch)
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        let status = match self.kind {
            RxRing::V3 => self.block_ptr(self.block).wrapping_add(8),
            RxRing::V2 => self.slot_ptr(self.block),
        };
        // SAFETY: reads the status word of the current block (V3: after two u32s of the
        // block descriptor) or slot (V2: first word of tpacket2_hdr), inside the mapping.
        unsafe { std::ptr::read_volatile(status as *const u32) & TP_STATUS_USER != 0 }
    }

    fn wait(&mut self, timeout: Duration) {
        if !self.rx_pending(Instant::ZERO) {
            let _ = wait_readable(&self.tx.fd, timeout);
            // Only when the wait brought no frame (a timeout, or the error a vanished
            // interface raises): is the interface still there? Three system calls.
            if !self.rx_pending(Instant::ZERO) && !interface_exists(self.tx.ifindex as u32) {
                self.tx.down = true;
            }
        }
    }

    fn link_down(&self) -> bool {
        self.tx.down
    }
}

impl PacketSocket {
    fn slot_ptr(&self, i: u32) -> *mut u8 {
        // SAFETY: i < V2_FRAME_NR, so the offset stays inside the mapping.
        unsafe { self.ring.as_ptr().add((i * V2_FRAME_SIZE) as usize) }
    }

    /// Reads up to `budget` frames; a partial checksum is completed when `complete` is set,
    /// else the frame is marked `l4_csum_ok` (see the module docs).
    fn recv_frames(
        &mut self,
        budget: usize,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let n = match self.kind {
            RxRing::V2 => self.recv_v2(budget, complete, sink),
            RxRing::V3 => self.recv_v3(budget, complete, sink),
        };
        self.stats.rx_frames += n as u64;
        n
    }

    /// Delivers `frame` whose packet status is `status`, completing a partial checksum first
    /// (in place: the slot or block is ours until it is handed back) when `complete` is set.
    fn deliver(
        &mut self,
        frame: &mut [u8],
        status: u32,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) {
        let mut meta = RxMeta {
            l4_csum_ok: status & TP_STATUS_CSUM_VALID != 0,
        };
        if status & TP_STATUS_CSUMNOTREADY != 0 {
            if !complete {
                meta.l4_csum_ok = true;
                self.stats.rx_csum_trusted += 1;
            } else if complete_checksum(frame) {
                self.stats.rx_csum_fixups += 1;
            }
        }
        sink(frame, meta);
    }

    /// TPACKET_V2: reads ready slots in order, each returned to the kernel after delivery.
    fn recv_v2(
        &mut self,
        budget: usize,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let mut n = 0;
        while n < budget {
            let h = self.slot_ptr(self.block);
            // SAFETY: the slot's tpacket2_hdr starts the slot; its status word is written by
            // the kernel, so it is read volatile and followed by an acquire fence.
            let status = unsafe { std::ptr::read_volatile(h as *const u32) };
            if status & TP_STATUS_USER == 0 {
                break;
            }
            fence(Ordering::Acquire);
            // SAFETY: tpacket2_hdr fields (len at 4, snaplen at 8, mac at 12) and the
            // sockaddr_ll after the header (pkttype at +10) lie inside the slot.
            let (len, snaplen, mac, pkttype) = unsafe {
                (
                    std::ptr::read_unaligned(h.add(4) as *const u32),
                    std::ptr::read_unaligned(h.add(8) as *const u32),
                    std::ptr::read_unaligned(h.add(12) as *const u16),
                    *h.add(V2_HDR + 10),
                )
            };
            let (start, end) = (mac as usize, mac as usize + snaplen as usize);
            if status & TP_STATUS_COPY != 0 || snaplen < len || end > V2_FRAME_SIZE as usize {
                // Truncated: larger than a slot. Never delivered half.
                self.stats.rx_truncated += 1;
            } else if pkttype != PACKET_OUTGOING {
                // SAFETY: start..end lies inside this slot of the mapping, which the kernel
                // neither reads nor writes until the status is handed back below.
                let frame = unsafe { std::slice::from_raw_parts_mut(h.add(start), end - start) };
                self.deliver(frame, status, complete, sink);
                n += 1;
            }
            fence(Ordering::Release);
            // SAFETY: hand the slot back to the kernel (TP_STATUS_KERNEL = 0).
            unsafe { std::ptr::write_volatile(h as *mut u32, 0) };
            self.block = (self.block + 1) % V2_FRAME_NR;
        }
        n
    }

    /// TPACKET_V3: reads whole retired blocks, each returned to the kernel after delivery.
    fn recv_v3(
        &mut self,
        budget: usize,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let mut n = 0;
        while n < budget {
            let b = self.block_ptr(self.block);
            // SAFETY: the block descriptor header lies at the start of the block; the status
            // word is written by the kernel, so it is read volatile and followed by an acquire
            // fence before the packets are read.
            let status = unsafe { std::ptr::read_volatile(b.add(8) as *const u32) };
            if status & TP_STATUS_USER == 0 {
                break;
            }
            fence(Ordering::Acquire);
            // SAFETY: within the block header (tpacket_hdr_v1 after two u32s).
            let (num, first) = unsafe {
                (
                    std::ptr::read_unaligned(b.add(12) as *const u32),
                    std::ptr::read_unaligned(b.add(16) as *const u32),
                )
            };
            let mut off = first as usize;
            for _ in 0..num {
                if off + 48 + 12 > BLOCK_SIZE as usize {
                    break;
                }
                // SAFETY: `off` was checked to leave room for a tpacket3_hdr and the
                // sockaddr_ll after it inside this block.
                let (next, snaplen, pstatus, mac, pkttype) = unsafe {
                    let h = b.add(off);
                    (
                        std::ptr::read_unaligned(h as *const u32),
                        std::ptr::read_unaligned(h.add(12) as *const u32),
                        std::ptr::read_unaligned(h.add(20) as *const u32),
                        std::ptr::read_unaligned(h.add(24) as *const u16),
                        *h.add(48 + 10),
                    )
                };
                let start = off + mac as usize;
                let end = start + snaplen as usize;
                if end <= BLOCK_SIZE as usize && pkttype != PACKET_OUTGOING {
                    // SAFETY: start..end lies inside this block of the mapping, which the
                    // kernel does not touch until the block is handed back below.
                    let frame =
                        unsafe { std::slice::from_raw_parts_mut(b.add(start), snaplen as usize) };
                    self.deliver(frame, pstatus, complete, sink);
                    n += 1;
                }
                if next == 0 {
                    break;
                }
                off += next as usize;
            }
            fence(Ordering::Release);
            // SAFETY: hand the block back to the kernel (TP_STATUS_KERNEL = 0).
            unsafe { std::ptr::write_volatile(b.add(8) as *mut u32, 0) };
            self.block = (self.block + 1) % BLOCK_NR;
        }
        n
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region mapped in open_one; no references outlive self.
        unsafe { libc::munmap(self.ring.as_ptr() as *mut libc::c_void, self.ring_len) };
    }
}

/// The socket's descriptor: readable (`POLLIN`) when the RX ring has a frame for user space
/// (TPACKET_V3: when a block is retired, at the latest `retire_blk_tov` after its first
/// frame), so an idle engine can sleep until one comes.
impl std::os::fd::AsFd for PacketSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.tx.fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstack_wire::checksum;
    use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
    use flowstack_wire::{ChecksumCaps, Ipv4Address};

    #[test]
    fn partial_checksum_is_completed() {
        let (a, b) = (Ipv4Address::new(1, 2, 3, 4), Ipv4Address::new(5, 6, 7, 8));
        let mut f = vec![0u8; 14 + 20 + 8 + 5];
        f[12] = 8;
        Ipv4Repr::new(a, b, IpProtocol::Udp, 13).emit(&mut f[14..34], ChecksumCaps::SOFTWARE);
        f[42..].copy_from_slice(b"hello");
        flowstack_wire::udp::UdpRepr {
            src_port: 1,
            dst_port: 2,
        }
        .emit_header(&mut f[34..], a, b, 5, ChecksumCaps::SOFTWARE);
        let good = f.clone();
        // What a CHECKSUM_PARTIAL frame carries: the folded pseudo-header sum.
        let partial = checksum::pseudo_header(a, b, 17, 13);
        f[40..42].copy_from_slice(&partial.to_be_bytes());
        assert!(complete_checksum(&mut f));
        assert_eq!(f, good);
    }
}
