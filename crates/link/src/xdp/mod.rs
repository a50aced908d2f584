//! AF_XDP driver (`--xdp IFACE [--queues N]`): one XDP socket per queue of an existing
//! interface, each with its own UMEM and its fill, completion, RX and TX rings.
//!
//! A built-in XDP program (see `flowstack_sys::bpf`) redirects every frame arriving on queue
//! *q* to the socket registered for *q* in an `XSKMAP` — flowstack owns the interface, as
//! with AF_PACKET — and passes frames of queues without a socket to the kernel. It is
//! attached in driver mode where the driver supports XDP (veth does), generic mode
//! otherwise, through a BPF link: closing the sockets detaches it.
//!
//! The sockets bind without forcing a mode, so the kernel uses zero-copy where the driver
//! supports it and copy mode otherwise (veth: copy); [`XdpSocket::zero_copy`] says which.
//! Need-wakeup is on: while the kernel keeps up, receiving makes no system call at all and
//! transmitting one `sendto` per batch only when the TX ring asks for it.
//!
//! Each UMEM holds [`FRAMES`] chunks of [`FRAME`] bytes: the first half is lent to the kernel
//! through the fill ring for reception (a frame goes back to the fill ring as soon as it was
//! handed to the engine), the second half is the transmit pool (a frame returns to it from
//! the completion ring). Frames are at most one chunk.
//!
//! Transmission in copy mode goes through a transmit-only AF_PACKET socket on the same
//! interface ([`XdpTx::Auto`]): the XDP socket's copy-mode transmit path builds one skb per
//! MTU-sized frame, one `sendto` moving at most 32 of them, and offers no segmentation
//! offload, so the peer's TCP receives 45 times more packets than from a kernel sender (on a
//! veth, every one processed inside our `sendto`). The packet socket takes 64 KiB segments
//! behind a vnet header and the kernel cuts them (or, on a veth, passes them whole to the
//! peer): measured on a veth, kernel curl <- flowstack went from 0.33x to about the AF_PACKET
//! link's ratio (README, "Real links"). In zero-copy mode the XDP TX ring is used
//! ([`XdpTx::Ring`] forces it everywhere): MTU-sized segments, [`DeviceCaps::max_tx_datagram`]
//! = MTU.
#![allow(unsafe_code)]

mod ring;
/// The XDP socket's descriptor: readable (`POLLIN`) when its RX ring holds a descriptor, so an
/// idle engine can sleep until a frame comes.
impl std::os::fd::AsFd for XdpSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}

#[cfg(test)]
mod tests;

use crate::packet::PacketSender;
use crate::sys::{
    complete_checksum, cvt, interface_driver, interface_exists, interface_index, interface_mtu,
    looks_partial,
};
use crate::{Device, DeviceCaps, Instant, RxMeta, TxBatch};
use flowstack_sys::bpf;
pub use flowstack_sys::bpf::XdpMode;
use flowstack_wire::Duration;
use ring::Ring;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

/// Bytes per UMEM chunk.
pub const FRAME: u32 = 4096;
/// Chunks per socket: half for reception, half for transmission.
pub const FRAMES: u32 = 4096;
/// Slots of each ring.
const RING: u32 = FRAMES / 2;
/// `sendto` kicks per batch before giving up on frames the kernel has not taken.
const MAX_KICKS: u32 = 256;
/// Largest frame gathered from several chunks (multi-buffer reception): a 64 KiB datagram
/// with its Ethernet header, rounded up.
const MAX_GATHER: usize = 65_536 + 256;

/// How an XDP socket transmits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XdpTx {
    /// The XDP TX ring in zero-copy mode; in copy mode a transmit-only AF_PACKET socket with
    /// a vnet header (64 KiB segments, the kernel segments them), the XDP TX ring if that
    /// socket cannot be opened.
    #[default]
    Auto,
    /// Always the XDP TX ring (MTU-sized frames).
    Ring,
}

/// How an interface's XDP sockets are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XdpOptions {
    /// How frames are transmitted.
    pub tx: XdpTx,
    /// Where the program runs; `None` chooses: generic mode on a veth (see below), else
    /// driver mode where the driver has XDP, generic otherwise.
    ///
    /// On a veth, a program in driver mode makes the peer drop its segmentation offload
    /// (the kernel on the other side then cuts every 64 KiB segment into MTU-sized frames
    /// before the veth, and each crosses it, runs the program and is copied on its own); in
    /// generic mode the peer keeps it, its 64 KiB segments arrive whole and reach the socket
    /// as one multi-buffer frame (`XDP_USE_SG`).
    pub mode: Option<XdpMode>,
}

/// Counters of an XDP socket.
#[derive(Debug, Clone, Copy, Default)]
pub struct XdpStats {
    /// Frames received.
    pub rx_frames: u64,
    /// RX descriptors pointing outside the UMEM (dropped).
    pub rx_invalid: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Frames dropped because the TX ring or the transmit pool was full.
    pub tx_ring_full: u64,
    /// Frames dropped because they were larger than a chunk.
    pub tx_too_big: u64,
    /// `sendto` calls that woke the kernel for transmission.
    pub tx_kicks: u64,
    /// Wake-ups of the kernel for the fill ring.
    pub fill_wakeups: u64,
    /// Received frames whose partial checksum (from a local peer) was completed here.
    pub rx_csum_fixups: u64,
    /// Frames with a partial checksum handed over unverified, marked `l4_csum_ok`.
    pub rx_csum_trusted: u64,
    /// Frames sent through the transmit-only packet socket (copy mode, [`XdpTx::Auto`]);
    /// included in `tx_frames`.
    pub tx_packet_frames: u64,
    /// Of those, large TCP segments the kernel segmented.
    pub tx_gso: u64,
    /// Frames the packet socket refused (dropped).
    pub tx_packet_drops: u64,
    /// Frames that arrived in several chunks (multi-buffer) and were gathered into one.
    pub rx_multi: u64,
    /// Multi-buffer frames larger than [`MAX_GATHER`] bytes (dropped).
    pub rx_too_big: u64,
    /// Checks that the interface still exists, made by `wait` only after a wait that brought
    /// no frame.
    pub idle_checks: u64,
}

/// The XDP program, its map and its attachment, shared by the sockets of one interface.
struct Program {
    map: OwnedFd,
    prog: OwnedFd,
    /// The BPF link holding the attachment, and the mode it got; set once every socket is
    /// in the map.
    link: OnceLock<(OwnedFd, XdpMode)>,
}

/// An anonymous or ring mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize, fd: Option<(&OwnedFd, u64)>) -> io::Result<Self> {
        let (flags, raw, off) = match fd {
            Some((fd, off)) => (
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                off as libc::off_t,
            ),
            // The UMEM: populated below, after asking for huge pages.
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0),
        };
        // SAFETY: a fresh mapping of `len` bytes; unmapped in Drop, accessed within `len`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw,
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if fd.is_none() {
            // Transparent huge pages where the system allows them (`madvise` mode is the
            // usual default): faulting in and unmapping a 16 MiB UMEM page by page took
            // about 55 ms of every `flowstack get`'s start and exit. Both calls are advice;
            // if refused, registering the UMEM faults the pages in anyway.
            // SAFETY: advice on the mapping just created, `len` bytes.
            unsafe {
                libc::madvise(p, len, libc::MADV_HUGEPAGE);
                libc::madvise(p, len, libc::MADV_POPULATE_WRITE);
            }
        }
        Ok(Mapping {
            ptr: p as *mut u8,
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; the rings pointing into it are dropped
        // with the socket that owns both.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// One AF_XDP socket bound to one queue of an interface.
pub struct XdpSocket {
    // Field order is drop order: rings before their mappings, the socket before the UMEM.
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    _ring_maps: Vec<Mapping>,
    fd: OwnedFd,
    umem: Mapping,
    /// Free transmit chunks (addresses in the UMEM).
    free_tx: Vec<u64>,
    /// Copy mode: the transmit-only packet socket frames leave through (see [`XdpTx`]).
    packet_tx: Option<PacketSender>,
    /// Bound with `XDP_USE_SG`: a frame may span several RX descriptors.
    sg: bool,
    /// Where a multi-buffer frame is gathered (capacity [`MAX_GATHER`], allocated once).
    gather: Vec<u8>,
    /// Taken (and released on a helper thread) in `Drop`.
    program: ManuallyDrop<Arc<Program>>,
    ifindex: u32,
    mtu: usize,
    zero_copy: bool,
    down: bool,
    stats: XdpStats,
    /// Last: joined after every other field is released (see `Drop`).
    teardown: Teardown,
}

/// Releases running on helper threads, joined when this is dropped.
#[derive(Default)]
struct Teardown(Vec<std::thread::JoinHandle<()>>);

impl Teardown {
    /// Drops `v` on a helper thread (or here, if no thread can be started).
    fn release<T: Send + 'static>(&mut self, v: T) {
        if let Ok(h) = std::thread::Builder::new()
            .name("xdp-teardown".into())
            .spawn(move || drop(v))
        {
            self.0.push(h);
        }
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        for h in self.0.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for XdpSocket {
    /// Closing the AF_XDP socket, the copy-mode packet socket and (for the last socket of an
    /// interface) the BPF link each waits in the kernel for an RCU grace period (12-16 ms
    /// each here, `strace -T`); one after another they made `flowstack get --xdp` take 44 ms
    /// to exit. The packet socket and the program are released on helper threads while the
    /// fields drop (the XDP socket's close among them), and joined last, so the socket is
    /// fully released when `drop` returns — now about one grace period.
    fn drop(&mut self) {
        if let Some(tx) = self.packet_tx.take() {
            self.teardown.release(tx);
        }
        // SAFETY: `program` is taken exactly once, here; the socket is being dropped and no
        // method runs after this.
        let program = unsafe { ManuallyDrop::take(&mut self.program) };
        self.teardown.release(program);
    }
}

// SAFETY: the raw pointers (UMEM, ring mappings) point into mappings this socket owns alone;
// nothing else holds them, and every access goes through `&mut self` (or `&self` atomic reads
// of ring indices). Moving the socket moves sole ownership of the mappings with it, as moving
// the fd does; the type stays `!Sync`. The per-core runtime builds queues on one thread and
// runs each on its shard's thread.
unsafe impl Send for XdpSocket {}

fn sockopt<T>(fd: &OwnedFd, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` points to a live value of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            v as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn explain(iface: &str, what: &str, e: io::Error) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (needs root, or CAP_NET_ADMIN with CAP_BPF and CAP_NET_RAW)"
        }
        Some(libc::EAFNOSUPPORT) => " (this kernel has no AF_XDP: CONFIG_XDP_SOCKETS)",
        Some(libc::EINVAL) if what.starts_with("bind") => {
            " (is the interface up, and does it have that many queues?)"
        }
        Some(libc::EBUSY) if what.starts_with("attach") || what.starts_with("bind") => {
            " (another XDP program or socket holds it)"
        }
        Some(libc::EOPNOTSUPP) => " (the driver does not support it)",
        _ => "",
    };
    io::Error::new(e.kind(), format!("AF_XDP on {iface}: {what}: {e}{hint}"))
}

impl XdpSocket {
    /// Opens `n` sockets on queues `0..n` of `iface` and attaches the redirect program.
    pub fn open_queues(iface: &str, n: usize) -> io::Result<Vec<Self>> {
        Self::open_queues_with(iface, n, XdpOptions::default())
    }

    /// [`XdpSocket::open_queues`] with `opts`.
    pub fn open_queues_with(iface: &str, n: usize, opts: XdpOptions) -> io::Result<Vec<Self>> {
        let ifindex = interface_index(iface).map_err(|e| explain(iface, "interface", e))? as u32;
        let mtu = interface_mtu(iface).unwrap_or(1500);
        if mtu + 14 > (FRAME - 256) as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("AF_XDP on {iface}: MTU {mtu} does not fit a {FRAME}-byte frame"),
            ));
        }
        let map = bpf::xskmap_create(n as u32).map_err(|e| explain(iface, "XSKMAP", e))?;
        let modes: &[XdpMode] = match opts.mode {
            Some(m) => match m {
                XdpMode::Driver => &[XdpMode::Driver],
                XdpMode::Generic => &[XdpMode::Generic],
            },
            None if interface_driver(iface).as_deref() == Some("veth") => {
                &[XdpMode::Generic, XdpMode::Driver]
            }
            None => &[XdpMode::Driver, XdpMode::Generic],
        };
        // Multi-buffer capable: frames larger than a chunk (a veth peer's 64 KiB segments in
        // generic mode) reach the sockets bound with XDP_USE_SG instead of being dropped.
        let prog = bpf::load_redirect(&map, true)
            .or_else(|_| bpf::load_redirect(&map, false))
            .map_err(|e| explain(iface, "load program", e))?;
        let program = Arc::new(Program {
            map,
            prog,
            link: OnceLock::new(),
        });
        let mut socks = Vec::with_capacity(n);
        for q in 0..n as u32 {
            let mut s = Self::open_one(iface, ifindex, q, mtu, program.clone())?;
            if opts.tx == XdpTx::Auto && !s.zero_copy {
                // Best effort: without it the XDP TX ring still works, MTU frame by frame.
                s.packet_tx = PacketSender::open(iface).ok();
            }
            bpf::xskmap_set(&program.map, q, &s.fd)
                .map_err(|e| explain(iface, "register socket", e))?;
            socks.push(s);
        }
        // Attach last, so frames are redirected only once every socket is in the map.
        let mut attached = Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        for &m in modes {
            attached = bpf::attach_xdp(&program.prog, ifindex, m).map(|l| (l, m));
            if attached.is_ok() {
                break;
            }
        }
        let attached = attached.map_err(|e| explain(iface, "attach program", e))?;
        let _ = program.link.set(attached);
        Ok(socks)
    }

    fn open_one(
        iface: &str,
        ifindex: u32,
        queue: u32,
        mtu: usize,
        program: Arc<Program>,
    ) -> io::Result<Self> {
        let ctx = |what: &str| format!("{what} (queue {queue})");
        // SAFETY: socket(2); the descriptor is immediately owned by OwnedFd.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
                .map_err(|e| explain(iface, &ctx("socket"), e))?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = Mapping::new((FRAME * FRAMES) as usize, None)
            .map_err(|e| explain(iface, &ctx("UMEM"), e))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.ptr as u64,
            len: umem.len as u64,
            chunk_size: FRAME,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        sockopt(&fd, libc::XDP_UMEM_REG, &reg).map_err(|e| explain(iface, &ctx("UMEM"), e))?;
        for name in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            sockopt(&fd, name, &RING).map_err(|e| explain(iface, &ctx("rings"), e))?;
        }
        // SAFETY: an all-zero xdp_mmap_offsets is a valid value; getsockopt fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` is a writable buffer of `len` bytes.
        cvt(unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                &mut off as *mut _ as *mut libc::c_void,
                &mut len,
            )
        })
        .map_err(|e| explain(iface, &ctx("ring offsets"), e))?;
        let map_ring = |o: &libc::xdp_ring_offset, elem: usize, pgoff: u64| {
            Mapping::new(o.desc as usize + RING as usize * elem, Some((&fd, pgoff)))
                .map_err(|e| explain(iface, &ctx("map rings"), e))
        };
        let m_fill = map_ring(&off.fr, 8, libc::XDP_UMEM_PGOFF_FILL_RING)?;
        let m_comp = map_ring(&off.cr, 8, libc::XDP_UMEM_PGOFF_COMPLETION_RING)?;
        let m_rx = map_ring(&off.rx, 16, libc::XDP_PGOFF_RX_RING as u64)?;
        let m_tx = map_ring(&off.tx, 16, libc::XDP_PGOFF_TX_RING as u64)?;
        // SAFETY: the kernel's offsets describe each mapping, sized for RING descriptors
        // above; the mappings live in `_ring_maps` as long as the rings.
        let (mut fill, comp, rx, tx) = unsafe {
            let mk = |m: &Mapping, o: &libc::xdp_ring_offset| {
                (
                    m.ptr,
                    o.producer as usize,
                    o.consumer as usize,
                    o.flags as usize,
                    o.desc as usize,
                )
            };
            let (b, p, c, f, d) = mk(&m_fill, &off.fr);
            let fill = Ring::<u64>::new(b, p, c, f, d, RING);
            let (b, p, c, f, d) = mk(&m_comp, &off.cr);
            let comp = Ring::<u64>::new(b, p, c, f, d, RING).into_consumer();
            let (b, p, c, f, d) = mk(&m_rx, &off.rx);
            let rx = Ring::<libc::xdp_desc>::new(b, p, c, f, d, RING).into_consumer();
            let (b, p, c, f, d) = mk(&m_tx, &off.tx);
            let tx = Ring::<libc::xdp_desc>::new(b, p, c, f, d, RING);
            (fill, comp, rx, tx)
        };
        // Lend the first half of the UMEM to the kernel for reception.
        for i in 0..RING {
            fill.push(i as u64 * FRAME as u64);
        }
        fill.submit();
        let bind = |flags: u16| {
            let sxdp = libc::sockaddr_xdp {
                sxdp_family: libc::AF_XDP as u16,
                sxdp_flags: flags,
                sxdp_ifindex: ifindex,
                sxdp_queue_id: queue,
                sxdp_shared_umem_fd: 0,
            };
            // SAFETY: `sxdp` is a valid sockaddr_xdp of the size passed.
            cvt(unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &sxdp as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            })
        };
        // Multi-buffer where the kernel and driver allow it, else one chunk per frame.
        let sg = bind(libc::XDP_USE_NEED_WAKEUP | libc::XDP_USE_SG).is_ok();
        if !sg {
            bind(libc::XDP_USE_NEED_WAKEUP).map_err(|e| explain(iface, &ctx("bind"), e))?;
        }
        let mut opts = libc::xdp_options { flags: 0 };
        let mut len = std::mem::size_of::<libc::xdp_options>() as libc::socklen_t;
        // SAFETY: `opts` is a writable buffer of `len` bytes.
        let zero_copy = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_OPTIONS,
                &mut opts as *mut _ as *mut libc::c_void,
                &mut len,
            )
        } == 0
            && opts.flags & libc::XDP_OPTIONS_ZEROCOPY != 0;
        let free_tx = (RING..FRAMES).map(|i| i as u64 * FRAME as u64).collect();
        Ok(Self {
            fill,
            comp,
            rx,
            tx,
            _ring_maps: vec![m_fill, m_comp, m_rx, m_tx],
            fd,
            umem,
            free_tx,
            packet_tx: None,
            sg,
            gather: if sg {
                Vec::with_capacity(MAX_GATHER)
            } else {
                Vec::new()
            },
            program: ManuallyDrop::new(program),
            ifindex,
            mtu,
            zero_copy,
            down: false,
            stats: XdpStats::default(),
            teardown: Teardown::default(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> XdpStats {
        self.stats
    }

    /// True if the kernel moves frames in the UMEM itself (zero-copy), false in copy mode.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// True if frames leave through the transmit-only packet socket (copy mode, see
    /// [`XdpTx`]), false if through the XDP TX ring.
    pub fn packet_tx(&self) -> bool {
        self.packet_tx.is_some()
    }

    /// True if the program runs in the driver, false in generic (skb) mode.
    pub fn driver_mode(&self) -> bool {
        matches!(self.program.link.get(), Some((_, XdpMode::Driver)))
    }

    /// Takes back the transmit chunks the kernel has finished with.
    fn reclaim(&mut self) {
        let n = self.comp.available();
        for i in 0..n {
            self.free_tx.push(self.comp.peek(i) & !(FRAME as u64 - 1));
        }
        if n > 0 {
            self.comp.release(n);
        }
    }

    /// Wakes the kernel to transmit; on a hard error (the interface went away) marks the
    /// link down.
    fn kick(&mut self) {
        let mut tries = 0;
        while self.tx.in_flight() > 0 && tries < MAX_KICKS {
            tries += 1;
            self.stats.tx_kicks += 1;
            // SAFETY: sendto with no data and no address only wakes the socket's TX path.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r >= 0 {
                if !self.tx.needs_wakeup() {
                    break;
                }
                continue;
            }
            match io::Error::last_os_error().raw_os_error() {
                // The kernel sends a bounded batch per call, or its queue is busy: go on.
                Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) => {
                    self.reclaim();
                    continue;
                }
                Some(libc::ENXIO) | Some(libc::ENETDOWN) | Some(libc::ENODEV) => {
                    self.down = true;
                    break;
                }
                _ => break,
            }
        }
    }

    fn frame(&mut self, d: &libc::xdp_desc) -> Option<&mut [u8]> {
        let (addr, len) = (d.addr as usize, d.len as usize);
        if addr.checked_add(len)? > self.umem.len {
            return None;
        }
        // SAFETY: addr..addr+len lies inside the UMEM (checked); the kernel handed this
        // chunk to us through the RX ring and neither reads nor writes it before we return
        // it through the fill ring; `&mut self` makes the borrow exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(addr), len) })
    }

    /// Takes up to `budget` frames from the RX ring; a partial checksum is completed when
    /// `complete` is set, else the frame is marked (see [`partial_meta`]).
    fn recv_frames(
        &mut self,
        budget: usize,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let n = self.rx.available();
        let mut delivered = 0;
        // `i` is the next descriptor; a frame is descriptors i..=last, all but the last
        // flagged XDP_PKT_CONTD (multi-buffer, only when bound with XDP_USE_SG).
        let mut i = 0;
        while i < n && delivered < budget {
            let mut last = i;
            while self.sg && self.rx.peek(last).options & libc::XDP_PKT_CONTD != 0 {
                last += 1;
                if last == n {
                    break;
                }
            }
            if last == n {
                // The kernel publishes a frame's descriptors together; a partial one is
                // left for the next call.
                break;
            }
            if last == i {
                let d = self.rx.peek(i);
                self.deliver_one(&d, complete, sink, &mut delivered);
            } else {
                self.deliver_gathered(i, last, complete, sink, &mut delivered);
            }
            // Return the chunks for reception (the fill ring has a slot per RX chunk).
            for k in i..=last {
                let addr = self.rx.peek(k).addr;
                self.fill.push(addr & !(FRAME as u64 - 1));
            }
            i = last + 1;
        }
        if i > 0 {
            self.rx.release(i);
            self.fill.submit();
        }
        if self.fill.needs_wakeup() {
            self.stats.fill_wakeups += 1;
            // SAFETY: recvfrom with no buffer only wakes the socket's RX path.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        self.stats.rx_frames += delivered as u64;
        delivered
    }

    /// Delivers the one-chunk frame `d` in place.
    fn deliver_one(
        &mut self,
        d: &libc::xdp_desc,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
        delivered: &mut usize,
    ) {
        let (mut fixed, mut trusted) = (false, false);
        match self.frame(d) {
            Some(f) => {
                // AF_XDP carries no checksum status: a frame from a local sender with
                // checksum offload (a veth peer) still holds the partial sum. Complete
                // it in place (the chunk is ours until it goes back to the fill ring), or
                // hand it over marked (see `partial_meta`).
                let meta = partial_meta(f, complete, &mut fixed, &mut trusted);
                sink(f, meta);
                *delivered += 1;
            }
            None => self.stats.rx_invalid += 1,
        }
        self.stats.rx_csum_fixups += fixed as u64;
        self.stats.rx_csum_trusted += trusted as u64;
    }

    /// Gathers the frame spread over RX descriptors `first..=last` into one buffer (kept
    /// between calls, no allocation) and delivers it.
    fn deliver_gathered(
        &mut self,
        first: u32,
        last: u32,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
        delivered: &mut usize,
    ) {
        let mut buf = std::mem::take(&mut self.gather);
        buf.clear();
        let mut ok = true;
        for k in first..=last {
            let d = self.rx.peek(k);
            match self.frame(&d) {
                Some(f) if buf.len() + f.len() <= MAX_GATHER => buf.extend_from_slice(f),
                Some(_) => {
                    self.stats.rx_too_big += 1;
                    ok = false;
                    break;
                }
                None => {
                    self.stats.rx_invalid += 1;
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            let (mut fixed, mut trusted) = (false, false);
            let meta = partial_meta(&mut buf, complete, &mut fixed, &mut trusted);
            self.stats.rx_csum_fixups += fixed as u64;
            self.stats.rx_csum_trusted += trusted as u64;
            self.stats.rx_multi += 1;
            sink(&buf, meta);
            *delivered += 1;
        }
        self.gather = buf;
    }
}

/// The checksum state of a received frame. AF_XDP says nothing of checksums; a TCP/UDP
/// checksum field holding exactly the pseudo-header sum is taken for a partial one (a packet
/// the local kernel built with checksum offload: a veth peer). With `complete` it is completed
/// in place (`fixed`); else the frame is marked `l4_csum_ok` (`trusted`) — the same trust
/// (completing makes any payload pass), two passes over the payload fewer.
fn partial_meta(f: &mut [u8], complete: bool, fixed: &mut bool, trusted: &mut bool) -> RxMeta {
    if !looks_partial(f) {
        return RxMeta::default();
    }
    if complete {
        *fixed = complete_checksum(f);
        RxMeta::default()
    } else {
        *trusted = true;
        RxMeta { l4_csum_ok: true }
    }
}

impl Device for XdpSocket {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            max_tx_datagram: self
                .packet_tx
                .as_ref()
                .map_or(self.mtu, |t| t.max_tx_datagram()),
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
        if let Some(tx) = &mut self.packet_tx {
            let before = tx.stats();
            let sent = tx.send(batch);
            let after = tx.stats();
            self.stats.tx_frames += sent as u64;
            self.stats.tx_packet_frames += sent as u64;
            self.stats.tx_gso += after.tx_gso - before.tx_gso;
            self.stats.tx_packet_drops += after.tx_drops - before.tx_drops;
            self.down |= tx.link_down();
            return sent;
        }
        self.reclaim();
        let mut sent = 0;
        let mut free = self.tx.free();
        for f in batch.iter() {
            if f.len() > FRAME as usize {
                self.stats.tx_too_big += 1;
                continue;
            }
            if free == 0 || self.free_tx.is_empty() {
                self.reclaim();
                free = self.tx.free();
                if free == 0 || self.free_tx.is_empty() {
                    self.stats.tx_ring_full += 1;
                    continue;
                }
            }
            let addr = self.free_tx.pop().expect("checked non-empty");
            // SAFETY: addr is a transmit chunk of FRAME bytes inside the UMEM that the kernel
            // does not own (it came back through the completion ring or was never lent), and
            // f.len() <= FRAME.
            unsafe {
                std::ptr::copy_nonoverlapping(f.as_ptr(), self.umem.ptr.add(addr as usize), f.len())
            };
            self.tx.push(libc::xdp_desc {
                addr,
                len: f.len() as u32,
                options: 0,
            });
            free -= 1;
            sent += 1;
        }
        if sent > 0 {
            self.tx.submit();
            self.kick();
        }
        self.stats.tx_frames += sent as u64;
        sent
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        // `available` refreshes a cache; the read-only check compares the shared indices.
        self.rx.peek_pending()
    }

    fn wait(&mut self, timeout: Duration) {
        if self.rx.peek_pending() {
            return;
        }
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Whole milliseconds, at least 1 unless zero (a sub-millisecond wait must not spin).
        let floor = if timeout.is_zero() { 0 } else { 1 };
        let ms = timeout.as_millis().clamp(floor, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 && p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            self.down = true;
        }
        // Is the interface still there? Only when the wait brought no frame: checking costs
        // three system calls (socket, ioctl, close), which showed up as many as the polls.
        if !self.rx.peek_pending() {
            self.stats.idle_checks += 1;
            if !interface_exists(self.ifindex) {
                self.down = true;
            }
        }
    }

    fn link_down(&self) -> bool {
        self.down
    }
}

/// Several XDP sockets (queues of one interface) driven as one device by a single engine:
/// receives from every queue in turn, transmits on the first. For one engine per queue, use
/// the sockets separately (the per-core runtime does).
pub struct XdpQueues {
    socks: Vec<XdpSocket>,
    next: usize,
}

impl XdpQueues {
    /// Drives `socks` (at least one) as one device.
    pub fn new(socks: Vec<XdpSocket>) -> Self {
        assert!(!socks.is_empty(), "XdpQueues needs a socket");
        Self { socks, next: 0 }
    }

    /// Takes up to `budget` frames from the queues in turn (see [`XdpSocket::recv_frames`]).
    fn recv_queues(
        &mut self,
        budget: usize,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let k = self.socks.len();
        let mut n = 0;
        for i in 0..k {
            let q = (self.next + i) % k;
            n += self.socks[q].recv_frames(budget - n, complete, sink);
            if n >= budget {
                break;
            }
        }
        self.next = (self.next + 1) % k;
        n
    }

    /// Counters of each queue.
    pub fn stats(&self) -> Vec<XdpStats> {
        self.socks.iter().map(|s| s.stats()).collect()
    }
}

impl Device for XdpQueues {
    fn caps(&self) -> DeviceCaps {
        self.socks[0].caps()
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        self.recv_queues(budget, true, &mut |f, _| sink(f))
    }

    fn recv_batch_meta(
        &mut self,
        _now: Instant,
        budget: usize,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        self.recv_queues(budget, false, sink)
    }

    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        self.socks[0].send_batch(now, batch)
    }

    fn rx_pending(&self, now: Instant) -> bool {
        self.socks.iter().any(|s| s.rx_pending(now))
    }

    fn wait(&mut self, timeout: Duration) {
        if self.rx_pending(Instant::ZERO) {
            return;
        }
        let mut fds = [libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 0,
        }; 16];
        let k = self.socks.len().min(fds.len());
        for (p, s) in fds.iter_mut().zip(&self.socks) {
            p.fd = s.fd.as_raw_fd();
        }
        let floor = if timeout.is_zero() { 0 } else { 1 };
        let ms = timeout.as_millis().clamp(floor, i32::MAX as u128) as i32;
        // SAFETY: `k` valid pollfds for the call.
        unsafe { libc::poll(fds.as_mut_ptr(), k as libc::nfds_t, ms) };
        // As for one socket: the interface check only when no frame came.
        if !self.rx_pending(Instant::ZERO) && !interface_exists(self.socks[0].ifindex) {
            for s in &mut self.socks {
                s.down = true;
            }
        }
    }

    fn link_down(&self) -> bool {
        self.socks.iter().any(|s| s.link_down())
    }
}
