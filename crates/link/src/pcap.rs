//! Pcap capture: a writer for the classic libpcap format (microsecond timestamps, Ethernet link
//! type) and middleware that records every frame a device sends or receives.

use crate::{Device, DeviceCaps, Instant, TxBatch};
use std::io::{self, Write};

/// Largest number of bytes recorded per frame.
pub const SNAPLEN: u32 = 262_144;

/// Writes frames to a pcap stream.
pub struct PcapWriter<W: Write> {
    w: W,
    /// Added to the stack's instants to make wall-clock timestamps.
    epoch_offset_ns: u64,
    error: Option<io::Error>,
    frames: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header. `epoch_offset_ns` maps the stack's clock to Unix time.
    pub fn new(mut w: W, epoch_offset_ns: u64) -> io::Result<Self> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        w.write_all(&h)?;
        Ok(Self {
            w,
            epoch_offset_ns,
            error: None,
            frames: 0,
        })
    }

    /// Records one frame. After the first I/O error, writing stops and the error is kept.
    pub fn write_frame(&mut self, now: Instant, frame: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let t = now.as_nanos() + self.epoch_offset_ns;
        let cap = frame.len().min(SNAPLEN as usize);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((t / 1_000_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&(((t % 1_000_000_000) / 1000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(cap as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        let r = self
            .w
            .write_all(&h)
            .and_then(|_| self.w.write_all(&frame[..cap]));
        match r {
            Ok(()) => self.frames += 1,
            Err(e) => self.error = Some(e),
        }
    }

    /// Flushes and reports the first error met, if any.
    pub fn finish(&mut self) -> io::Result<u64> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.w.flush()?;
        Ok(self.frames)
    }
}

/// A device whose traffic in both directions is recorded to a pcap stream.
pub struct Pcap<D, W: Write> {
    inner: D,
    writer: PcapWriter<W>,
}

impl<D: Device, W: Write> Pcap<D, W> {
    /// Wraps `inner`, recording into `writer`.
    pub fn new(inner: D, writer: PcapWriter<W>) -> Self {
        Self { inner, writer }
    }
    /// Flushes the capture and returns the number of frames written.
    pub fn finish(&mut self) -> io::Result<u64> {
        self.writer.finish()
    }
    /// The wrapped device.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }
}

impl<D: Device, W: Write> Device for Pcap<D, W> {
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }

    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let w = &mut self.writer;
        self.inner.recv_batch(now, budget, &mut |f| {
            w.write_frame(now, f);
            sink(f)
        })
    }

    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        for f in batch.iter() {
            self.writer.write_frame(now, f);
        }
        self.inner.send_batch(now, batch)
    }

    fn poll_at(&self) -> Option<Instant> {
        self.inner.poll_at()
    }

    fn rx_pending(&self, now: Instant) -> bool {
        self.inner.rx_pending(now)
    }

    fn wait(&mut self, timeout: flowstack_wire::Duration) {
        self.inner.wait(timeout)
    }

    fn link_down(&self) -> bool {
        self.inner.link_down()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_record_layout() {
        let mut w = PcapWriter::new(Vec::new(), 1_000_000_000).unwrap();
        w.write_frame(Instant::from_nanos(1_500_000), &[1, 2, 3]);
        w.finish().unwrap();
        let b = w.w;
        assert_eq!(&b[0..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(b.len(), 24 + 16 + 3);
        assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(b[28..32].try_into().unwrap()), 1500);
        assert_eq!(&b[40..], &[1, 2, 3]);
    }
}
