//! A reusable batch of frames to transmit: buffers are kept between batches, so steady-state
//! transmission allocates nothing.

/// Frames built by the engine, handed to a device in one call.
///
/// Each buffer keeps the largest length it ever had (its bytes past the current frame are
/// stale but initialised), and the frame's own length is kept beside it: a buffer that once
/// carried a 64 KiB segment is not zero-filled again when an ACK used it in between, and
/// buffers may travel between batches and devices ([`TxBatch::take_frame`]) without it.
#[derive(Debug, Default)]
pub struct TxBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
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
            self.lens.push(0);
        }
        let b = &mut self.bufs[self.len];
        if b.len() < len {
            b.resize(len, 0);
        }
        self.lens[self.len] = len;
        self.len += 1;
        &mut b[..len]
    }

    /// Shortens the most recently pushed frame to `len` bytes.
    pub fn truncate_last(&mut self, len: usize) {
        if self.len > 0 {
            let l = &mut self.lens[self.len - 1];
            *l = (*l).min(len);
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
        self.bufs[..self.len]
            .iter()
            .zip(&self.lens)
            .map(|(b, &l)| &b[..l])
    }

    /// Moves frame `i` out without copying it: its buffer and `buf` are exchanged, so `buf`
    /// holds the frame in its first bytes, whose number is returned, and the batch keeps
    /// `buf`'s old allocation for later frames. Frame `i` is empty afterwards. For devices
    /// that pass buffers on instead of copying them ([`Device::send_batch_take`]).
    ///
    /// [`Device::send_batch_take`]: crate::Device::send_batch_take
    pub fn take_frame(&mut self, i: usize, buf: &mut Vec<u8>) -> usize {
        assert!(i < self.len, "frame {i} of a batch of {}", self.len);
        std::mem::swap(&mut self.bufs[i], buf);
        std::mem::take(&mut self.lens[i])
    }

    /// Forgets all frames, keeping their buffers for reuse.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_frame_leaves_its_bytes_and_the_batch_reuses_the_other_buffer() {
        let mut b = TxBatch::new();
        b.push(4).copy_from_slice(&[1, 2, 3, 4]);
        b.push(2).copy_from_slice(&[5, 6]);
        b.truncate_last(1);
        let mut other = vec![9u8; 100];
        assert_eq!(b.take_frame(0, &mut other), 4);
        assert_eq!(&other[..4], &[1, 2, 3, 4]);
        let frames: Vec<&[u8]> = b.iter().collect();
        assert_eq!(frames, vec![&[][..], &[5][..]]);
        b.clear();
        // The exchanged buffer (100 bytes long) now serves a larger frame with no growth.
        let f = b.push(50);
        assert_eq!(f.len(), 50);
        f.fill(7);
        assert_eq!(b.iter().next().unwrap(), &[7u8; 50][..]);
    }
}
