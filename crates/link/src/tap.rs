//! TAP driver: an Ethernet device whose other end is the Linux kernel's network stack.
//!
//! Opens `/dev/net/tun` and attaches to (or creates) a TAP interface by name. Works with a
//! single-queue TAP made by `ip tuntap add dev NAME mode tap` and with one made with
//! `multi_queue`, in which case several queues can be opened, one per engine. Reads and
//! writes are non-blocking and batched per call.
#![allow(unsafe_code)]

use crate::sys::{cvt, interface_mtu, wait_readable, IfReq};
use crate::{Device, DeviceCaps, Instant, TxBatch};
use flowstack_wire::Duration;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_MULTI_QUEUE: i16 = 0x0100;

/// Counters of a TAP queue.
#[derive(Debug, Clone, Copy, Default)]
pub struct TapStats {
    /// Frames read.
    pub rx_frames: u64,
    /// Frames written.
    pub tx_frames: u64,
    /// Frames the kernel refused (queue full or error).
    pub tx_drops: u64,
}

/// One queue of a TAP interface.
pub struct Tap {
    file: File,
    name: String,
    mtu: usize,
    buf: Vec<u8>,
    stats: TapStats,
}

fn open_queue(name: &str, multi_queue: bool) -> io::Result<File> {
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
    req.set_short(flags);
    // SAFETY: TUNSETIFF reads and writes the `struct ifreq` we pass, which lives for the call.
    cvt(unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) })?;
    Ok(file)
}

impl Tap {
    /// Attaches to TAP `name` (creating it if it does not exist), single queue. A TAP made
    /// with `multi_queue` is attached as one of its queues.
    pub fn open(name: &str) -> io::Result<Self> {
        let file = match open_queue(name, false) {
            Ok(f) => f,
            // A multi-queue TAP refuses single-queue attachment with EINVAL.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open_queue(name, true)?,
            Err(e) => return Err(annotate(name, e)),
        };
        Ok(Self::from_file(name, file))
    }

    /// Opens `n` queues of a multi-queue TAP, one per engine.
    pub fn open_queues(name: &str, n: usize) -> io::Result<Vec<Self>> {
        (0..n)
            .map(|_| {
                open_queue(name, true)
                    .map(|f| Self::from_file(name, f))
                    .map_err(|e| annotate(name, e))
            })
            .collect()
    }

    fn from_file(name: &str, file: File) -> Self {
        let mtu = interface_mtu(name).unwrap_or(1500);
        Self {
            file,
            name: name.to_string(),
            mtu,
            buf: vec![0; 65536 + 64],
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

impl Device for Tap {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            max_tx_datagram: self.mtu,
            ..DeviceCaps::ETHERNET
        }
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < budget {
            match self.file.read(&mut self.buf) {
                Ok(0) => break,
                Ok(len) => {
                    sink(&self.buf[..len]);
                    n += 1;
                }
                Err(_) => break, // EAGAIN: nothing more now
            }
        }
        self.stats.rx_frames += n as u64;
        n
    }

    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let mut sent = 0;
        for f in batch.iter() {
            // A TAP write takes a whole frame or nothing.
            match self.file.write(f) {
                Ok(n) if n == f.len() => sent += 1,
                _ => self.stats.tx_drops += 1,
            }
        }
        self.stats.tx_frames += sent as u64;
        sent
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        true // unknown without a system call; callers just try to read
    }

    fn wait(&mut self, timeout: Duration) {
        wait_readable(&self.file, timeout);
    }
}
