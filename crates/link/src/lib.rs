//! Links for flowstack: the [`Device`] trait, in-process devices and middleware.
//!
//! A device moves *batches* of Ethernet frames and declares its capabilities. Devices here:
//! [`pipe`] (two engines, one process), [`switch`] (several engines, one process), [`shm`]
//! (engines in two processes, one or n queue pairs per side, flows steered by RSS), [`tap`],
//! [`packet`] and [`xdp`] (the Linux kernel as the peer; several queues each). Middleware
//! wraps any device: [`impair`] (seeded loss/reorder/duplicate/corrupt/delay) and [`pcap`]
//! (capture files that tcpdump and Wireshark read).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod batch;
pub mod frameq;
pub mod impair;
pub mod packet;
pub mod pcap;
pub mod pipe;
pub mod rng;
pub mod shm;
pub mod switch;
pub mod sys;
pub mod tap;
pub mod vnet;
pub mod xdp;

pub use batch::{SharedBytes, TxBatch, TxPayload};
pub use flowstack_wire::{ChecksumCaps, Instant};
pub use frameq::FrameQueue;

/// What a device can do; the engine adapts its output to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Largest IP datagram the link carries (excluding the Ethernet header).
    pub mtu: usize,
    /// Checksum work the device does (or that a trusted link lets the stack skip).
    pub checksum: ChecksumCaps,
    /// Largest IP datagram the device accepts for transmission when it segments TCP itself
    /// (segmentation offload); equal to `mtu` when it does not.
    pub max_tx_datagram: usize,
    /// Number of receive/transmit queue pairs.
    pub queues: usize,
}

impl DeviceCaps {
    /// A plain Ethernet link: MTU 1500, software checksums, no segmentation offload, one queue.
    pub const ETHERNET: DeviceCaps = DeviceCaps {
        mtu: 1500,
        checksum: ChecksumCaps::SOFTWARE,
        max_tx_datagram: 1500,
        queues: 1,
    };
}

impl Default for DeviceCaps {
    fn default() -> Self {
        Self::ETHERNET
    }
}

/// What a device knows about one received frame beyond its bytes
/// ([`Device::recv_batch_meta`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxMeta {
    /// The frame's TCP or UDP checksum needs no verification in software: the device checked
    /// it (virtio `DATA_VALID`, AF_PACKET `TP_STATUS_CSUM_VALID`), or the packet was built by
    /// the local kernel with checksum offload and never crossed a wire (virtio `NEEDS_CSUM`,
    /// AF_PACKET `TP_STATUS_CSUMNOTREADY`: its checksum field then holds only the
    /// pseudo-header sum, as Linux's own `CHECKSUM_PARTIAL` packets do). Linux accepts both
    /// without computing a sum; a stack that verifies them anyway reads every payload byte
    /// once more (twice, when the partial sum is first completed).
    pub l4_csum_ok: bool,
}

/// Where [`Device::recv_batch_parts`] hands each frame: its first bytes, the tail that
/// follows them (empty for a whole frame), and what the device knows of it.
pub type PartsSink<'a> = dyn FnMut(&[u8], &[u8], RxMeta) + 'a;

/// A network device moving batches of Ethernet frames.
///
/// Contract: the owner calls [`Device::send_batch`] with frames it built and
/// [`Device::recv_batch`] to take arrived frames, passing the current time to both; when the
/// device holds frames for later (delay middleware), [`Device::poll_at`] says when to call again.
pub trait Device {
    /// The device's capabilities.
    fn caps(&self) -> DeviceCaps;

    /// Hands up to `budget` received frames, in arrival order, to `sink`; returns how many.
    /// Every frame handed over carries complete, checkable checksums.
    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize;

    /// As [`Device::recv_batch`], with what the device knows of each frame ([`RxMeta`]). A
    /// frame marked `l4_csum_ok` may hold a partial TCP/UDP checksum: the receiver must not
    /// verify it (nor forward it to a receiver that would, without completing it first). The
    /// default knows nothing and delivers what [`Device::recv_batch`] does.
    fn recv_batch_meta(
        &mut self,
        now: Instant,
        budget: usize,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        self.recv_batch(now, budget, &mut |f| sink(f, RxMeta::default()))
    }

    /// Transmits every frame of `batch`; returns how many the device accepted (the rest were
    /// dropped, e.g. a full queue, and counted by the device).
    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize;

    /// As [`Device::recv_batch_meta`], each frame in two parts: its first bytes and a tail
    /// that follows them (empty for a whole frame). A device that passes gathered frames on
    /// in memory ([`Device::can_gather`]) delivers the tail where it lies, so the receiver
    /// can copy a payload once, straight to where it goes. The default delivers whole frames
    /// with an empty tail.
    fn recv_batch_parts(&mut self, now: Instant, budget: usize, sink: &mut PartsSink) -> usize {
        self.recv_batch_meta(now, budget, &mut |f, m| sink(f, &[], m))
    }

    /// True if the device takes gathered frames ([`TxPayload`] tails) in
    /// [`Device::send_batch_take`] and [`Device::send_batch`], as a NIC with scatter-gather
    /// DMA does. The default is false: the caller then [flattens](TxBatch::flatten) the
    /// batch first, and the device reads whole frames.
    fn can_gather(&self) -> bool {
        false
    }

    /// [`send_batch`](Device::send_batch) for a caller that clears `batch` afterwards: a
    /// device that passes frames on in memory (an in-process cable) may take their buffers
    /// ([`TxBatch::take_frame`]) instead of copying them, as a NIC's DMA would take the
    /// bytes without the CPU. The default copies, through `send_batch`.
    fn send_batch_take(&mut self, now: Instant, batch: &mut TxBatch) -> usize {
        self.send_batch(now, batch)
    }

    /// When the device next has something to do on its own (a delayed frame becoming due).
    fn poll_at(&self) -> Option<Instant> {
        None
    }

    /// True if frames are waiting to be received now.
    fn rx_pending(&self, now: Instant) -> bool;

    /// Blocks for at most `timeout` until a frame may be waiting (devices backed by a file
    /// descriptor sleep in `poll(2)`); in-process devices return at once.
    fn wait(&mut self, _timeout: flowstack_wire::Duration) {}

    /// True once the link is gone for good (e.g. the peer process of a shm wire died).
    fn link_down(&self) -> bool {
        false
    }
}

impl<D: Device + ?Sized> Device for Box<D> {
    fn caps(&self) -> DeviceCaps {
        (**self).caps()
    }
    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        (**self).recv_batch(now, budget, sink)
    }
    fn recv_batch_meta(
        &mut self,
        now: Instant,
        budget: usize,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        (**self).recv_batch_meta(now, budget, sink)
    }
    fn recv_batch_parts(&mut self, now: Instant, budget: usize, sink: &mut PartsSink) -> usize {
        (**self).recv_batch_parts(now, budget, sink)
    }
    fn can_gather(&self) -> bool {
        (**self).can_gather()
    }
    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        (**self).send_batch(now, batch)
    }
    fn send_batch_take(&mut self, now: Instant, batch: &mut TxBatch) -> usize {
        (**self).send_batch_take(now, batch)
    }
    fn poll_at(&self) -> Option<Instant> {
        (**self).poll_at()
    }
    fn rx_pending(&self, now: Instant) -> bool {
        (**self).rx_pending(now)
    }
    fn wait(&mut self, timeout: flowstack_wire::Duration) {
        (**self).wait(timeout)
    }
    fn link_down(&self) -> bool {
        (**self).link_down()
    }
}
