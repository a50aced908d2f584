//! A reusable batch of frames to transmit: buffers are kept between batches, so steady-state
//! transmission allocates nothing.

/// Frames built by the engine, handed to a device in one call.
#[derive(Debug, Default)]
pub struct TxBatch {
    bufs: Vec<Vec<u8>>,
    len: usize,
}

impl TxBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// A buffer of `len` bytes for the next frame; it belongs to the batch. It is *not*
    /// cleared (zeroing every frame showed up in profiles): the caller writes every byte, as
    /// all of flowstack's emitters do.
    pub fn push(&mut self, len: usize) -> &mut [u8] {
        if self.len == self.bufs.len() {
            self.bufs.push(Vec::with_capacity(2048));
        }
        let b = &mut self.bufs[self.len];
        self.len += 1;
        if b.len() < len {
            b.resize(len, 0);
        } else {
            b.truncate(len);
        }
        b
    }

    /// Shortens the most recently pushed frame to `len` bytes.
    pub fn truncate_last(&mut self, len: usize) {
        if self.len > 0 {
            self.bufs[self.len - 1].truncate(len);
        }
    }

    /// Drops the most recently pushed frame.
    pub fn pop(&mut self) {
        self.len = self.len.saturating_sub(1);
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no frame is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frames in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.bufs[..self.len].iter().map(|b| b.as_slice())
    }

    /// Forgets all frames, keeping their buffers for reuse.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}
