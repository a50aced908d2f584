//! TAP driver: an Ethernet device whose other end is the Linux kernel's network stack.
//!
//! Opens `/dev/net/tun` and attaches to (or creates) a TAP interface by name. Works with a
//! single-queue TAP made by `ip tuntap add dev NAME mode tap` and with one made with
//! `multi_queue`, in which case several queues can be opened, one per engine. Reads and
//! writes are non-blocking and batched per call.
//!
//! With the vnet header (the default for `flowstack` commands; `--no-vnet` turns it off) the
//! TAP carries a `virtio_net_hdr` before each frame: flowstack hands the kernel TCP segments
//! of up to 64 KiB (the kernel segments them: segmentation offload) and accepts the kernel's
//! coalesced segments and partial checksums, so far fewer frames cross the user/kernel
//! boundary. A partial checksum (`NEEDS_CSUM`: a packet the local kernel built) is completed
//! here for [`Device::recv_batch`]; [`Device::recv_batch_meta`] — what the engine calls —
//! leaves it and marks the frame `l4_csum_ok` instead, as it does `DATA_VALID` frames, so the
//! engine reads such a payload once (the copy into the receive buffer), not three times.
#![allow(unsafe_code)]

use crate::sys::{complete_checksum, cvt, interface_mtu, wait_readable, IfReq};
use crate::vnet::{TxLayout, F_DATA_VALID, F_NEEDS_CSUM, VNET_HDR};
use crate::{Device, DeviceCaps, Instant, RxMeta, TxBatch};
use flowstack_wire::Duration;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_MULTI_QUEUE: i16 = 0x0100;
const IFF_VNET_HDR: i16 = 0x4000;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;

/// Counters of a TAP queue.
#[derive(Debug, Clone, Copy, Default)]
pub struct TapStats {
    /// Frames read.
    pub rx_frames: u64,
    /// Frames written.
    pub tx_frames: u64,
    /// Frames the kernel refused (queue full or error).
    pub tx_drops: u64,
    /// Large TCP segments handed to the kernel to segment.
    pub tx_gso: u64,
    /// Received frames whose checksum was completed here.
    pub rx_csum_fixups: u64,
    /// Received frames with a partial checksum handed over unverified, marked `l4_csum_ok`.
    pub rx_csum_trusted: u64,
}

/// One queue of a TAP interface.
pub struct Tap {
    file: File,
    name: String,
    mtu: usize,
    buf: Vec<u8>,
    vnet: bool,
    /// The TAP went away under us (deleted: reads and writes fail with EBADFD).
    down: bool,
    stats: TapStats,
}

fn open_queue(name: &str, multi_queue: bool, vnet: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| io::Error::new(e.kind(), format!("open /dev/net/tun: {e}")))?;
    let mut req = IfReq::new(name)?;
    let mut flags = IFF_TAP | IFF_NO_PI;
    if multi_queue {
        flags |= IFF_MULTI_QUEUE;
    }
    if vnet {
        flags |= IFF_VNET_HDR;
    }
    req.set_short(flags);
    // SAFETY: TUNSETIFF reads and writes the `struct ifreq` we pass, which lives for the call.
    cvt(unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) })?;
    // With the vnet header, let the kernel send us coalesced TCP segments with partial
    // checksums; without it, switch those offloads off: a previous user of the TAP may have
    // left them on, and frames without a header cannot say their checksum is partial.
    let offloads = if vnet { TUN_F_CSUM | TUN_F_TSO4 } else { 0 };
    // SAFETY: TUNSETOFFLOAD takes its flags by value.
    let r = cvt(unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD as _, offloads) });
    if vnet {
        r?;
    }
    Ok(file)
}

impl Tap {
    /// Attaches to TAP `name` (creating it if it does not exist), single queue. A TAP made
    /// with `multi_queue` is attached as one of its queues.
    /// With `vnet`, the vnet header is used for segmentation and checksum offload.
    pub fn open(name: &str, vnet: bool) -> io::Result<Self> {
        let file = match open_queue(name, false, vnet) {
            Ok(f) => f,
            // A multi-queue TAP refuses single-queue attachment with EINVAL.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                open_queue(name, true, vnet).map_err(|e| annotate(name, e))?
            }
            Err(e) => return Err(annotate(name, e)),
        };
        Ok(Self::from_file(name, file, vnet))
    }

    /// Opens `n` queues of a multi-queue TAP, one per engine.
    pub fn open_queues(name: &str, n: usize, vnet: bool) -> io::Result<Vec<Self>> {
        (0..n)
            .map(|_| {
                open_queue(name, true, vnet)
                    .map(|f| Self::from_file(name, f, vnet))
                    .map_err(|e| annotate(name, e))
            })
            .collect()
    }

    fn from_file(name: &str, file: File, vnet: bool) -> Self {
        let mtu = interface_mtu(name).unwrap_or(1500);
        Self {
            file,
            name: name.to_string(),
            mtu,
            buf: vec![0; VNET_HDR + 65536 + 64],
            vnet,
            down: false,
            stats: TapStats::default(),
        }
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counters.
    pub fn stats(&self) -> TapStats {
        self.stats
    }
}

fn annotate(name: &str, e: io::Error) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) => " (needs root or CAP_NET_ADMIN, or a TAP owned by this user)",
        Some(libc::EBUSY) => " (another process holds its only queue)",
        _ => "",
    };
    io::Error::new(e.kind(), format!("TAP {name}: {e}{hint}"))
}

impl Tap {
    /// Writes `f` behind a vnet header; a TCP segment larger than the MTU goes as one GSO
    /// frame for the kernel to segment, its checksum sent in the partial form the kernel
    /// completes per segment (see [`crate::vnet`]; no copy of the frame).
    fn write_vnet(&mut self, f: &[u8]) -> bool {
        let layout = TxLayout::for_frame(f, self.mtu);
        if layout.is_gso() {
            self.stats.tx_gso += 1;
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        let mut n = 0;
        layout.pieces(f, |p| {
            iov[n] = libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            };
            n += 1;
        });
        // SAFETY: the first `n` iovecs point into `layout` and `f`, live for the call.
        let r = unsafe { libc::writev(self.file.as_raw_fd(), iov.as_ptr(), n as libc::c_int) };
        r == (VNET_HDR + f.len()) as isize
    }
}

impl Tap {
    /// Reads up to `budget` frames. A frame with a partial checksum is completed in place when
    /// `complete` is set, else handed over as it is, marked `l4_csum_ok`.
    fn recv_frames(
        &mut self,
        budget: usize,
        complete: bool,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let mut n = 0;
        let skip = if self.vnet { VNET_HDR } else { 0 };
        while n < budget {
            match self.file.read(&mut self.buf) {
                Ok(len) if len > skip => {
                    let flags = if self.vnet { self.buf[0] } else { 0 };
                    let mut meta = RxMeta {
                        l4_csum_ok: flags & F_DATA_VALID != 0,
                    };
                    if flags & F_NEEDS_CSUM != 0 {
                        if !complete {
                            // Built by the local kernel: trusted as Linux trusts its own
                            // CHECKSUM_PARTIAL packets (see `RxMeta`).
                            meta.l4_csum_ok = true;
                            self.stats.rx_csum_trusted += 1;
                        } else if complete_checksum(&mut self.buf[skip..len]) {
                            self.stats.rx_csum_fixups += 1;
                        }
                    }
                    sink(&self.buf[skip..len], meta);
                    n += 1;
                }
                Ok(_) => break,
                Err(e) => {
                    // EAGAIN: nothing more now. EBADFD/EIO: the interface was deleted.
                    if matches!(e.raw_os_error(), Some(libc::EBADFD) | Some(libc::EIO)) {
                        self.down = true;
                    }
                    break;
                }
            }
        }
        self.stats.rx_frames += n as u64;
        n
    }
}

impl Device for Tap {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            max_tx_datagram: if self.vnet { 65535 } else { self.mtu },
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
        let mut sent = 0;
        for f in batch.iter() {
            let ok = if self.vnet {
                self.write_vnet(f)
            } else {
                // A TAP write takes a whole frame or nothing.
                matches!(self.file.write(f), Ok(n) if n == f.len())
            };
            if ok {
                sent += 1;
            } else {
                self.stats.tx_drops += 1;
            }
        }
        self.stats.tx_frames += sent as u64;
        sent
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        true // unknown without a system call; callers just try to read
    }

    fn wait(&mut self, timeout: Duration) {
        let _ = wait_readable(&self.file, timeout);
    }

    fn link_down(&self) -> bool {
        self.down
    }
}

/// The TAP's descriptor: readable (`poll(2)` `POLLIN`) when a frame waits, so an idle engine
/// can sleep until one comes.
impl std::os::fd::AsFd for Tap {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.file)
    }
}
