//! A reusable batch of frames to transmit: buffers are kept between batches, so steady-state
//! transmission allocates nothing.
//!
//! A frame is either whole (its bytes in the batch's buffer) or *gathered*: headers in the
//! buffer followed by a [`TxPayload`], a reference to bytes owned elsewhere (a zero-copy
//! send's memory), as a NIC's DMA gathers a descriptor's pieces. Only devices that say so
//! ([`Device::can_gather`](crate::Device::can_gather)) are handed gathered frames; for every
//! other device the batch is [flattened](TxBatch::flatten) first, so they see whole frames.

use std::sync::Arc;

/// Shared owner of the bytes a gathered frame references (the same type as TCP's zero-copy
/// `ExtBuf::Shared` owner): cloning it is a reference count, never an allocation.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// The tail of a gathered frame: `len` bytes of `owner`'s from `start`. Holding it keeps the
/// owner alive (a pool that reuses memory only when it holds the last reference, as
/// `send_file`'s chunk pool does, cannot reuse it while a frame is in flight).
#[derive(Clone)]
pub struct TxPayload {
    owner: SharedBytes,
    start: usize,
    len: usize,
}

impl TxPayload {
    /// `len` bytes of `owner`'s from `start`; `None` if they lie outside them.
    pub fn new(owner: SharedBytes, start: usize, len: usize) -> Option<Self> {
        let total = (*owner).as_ref().len();
        (start <= total && len <= total - start).then_some(Self { owner, start, len })
    }

    /// The referenced bytes.
    pub fn bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    /// Their number.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if it references no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for TxPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TxPayload({}..+{})", self.start, self.len)
    }
}

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
    /// The tail of each gathered frame (`None` for whole frames).
    tails: Vec<Option<TxPayload>>,
    len: usize,
    /// Gathered frames among the first `len`.
    gathered: usize,
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
            self.tails.push(None);
        }
        let b = &mut self.bufs[self.len];
        if b.len() < len {
            b.resize(len, 0);
        }
        self.lens[self.len] = len;
        self.len += 1;
        &mut b[..len]
    }

    /// A gathered frame: a buffer of `head_len` bytes for its headers (not cleared, as in
    /// [`TxBatch::push`]), followed on the wire by `tail`'s bytes, which are not copied.
    pub fn push_gather(&mut self, head_len: usize, tail: TxPayload) -> &mut [u8] {
        self.push(head_len);
        let i = self.len - 1;
        self.tails[i] = Some(tail);
        self.gathered += 1;
        &mut self.bufs[i][..head_len]
    }

    /// Shortens the most recently pushed frame's buffer to `len` bytes (a gathered frame's
    /// tail is kept).
    pub fn truncate_last(&mut self, len: usize) {
        if self.len > 0 {
            let l = &mut self.lens[self.len - 1];
            *l = (*l).min(len);
        }
    }

    /// Drops the most recently pushed frame.
    pub fn pop(&mut self) {
        if self.len > 0 {
            self.len -= 1;
            if self.tails[self.len].take().is_some() {
                self.gathered -= 1;
            }
        }
    }

    /// True if some frame is gathered (needs [`TxBatch::flatten`] before a device that
    /// reads whole frames).
    pub fn has_gathered(&self) -> bool {
        self.gathered > 0
    }

    /// Copies the tail of every gathered frame into its buffer, making every frame whole and
    /// byte-identical to what a gathering device puts on the wire (the fallback for devices
    /// that cannot gather). Buffers keep their largest length: no allocation once warm.
    pub fn flatten(&mut self) {
        if self.gathered == 0 {
            return;
        }
        for i in 0..self.len {
            if let Some(t) = self.tails[i].take() {
                let head = self.lens[i];
                let total = head + t.len();
                let b = &mut self.bufs[i];
                if b.len() < total {
                    b.resize(total, 0);
                }
                b[head..total].copy_from_slice(t.bytes());
                self.lens[i] = total;
            }
        }
        self.gathered = 0;
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no frame is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frames in order, whole. A batch with gathered frames must be
    /// [flattened](TxBatch::flatten) first (checked in debug builds); devices that gather
    /// read [`TxBatch::iter_parts`].
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        debug_assert_eq!(self.gathered, 0, "a gathered batch read as whole frames");
        self.bufs[..self.len]
            .iter()
            .zip(&self.lens)
            .map(|(b, &l)| &b[..l])
    }

    /// The frames in order as (buffer bytes, tail): the tail is `None` for a whole frame.
    pub fn iter_parts(&self) -> impl Iterator<Item = (&[u8], Option<&TxPayload>)> {
        self.bufs[..self.len]
            .iter()
            .zip(&self.lens)
            .zip(&self.tails)
            .map(|((b, &l), t)| (&b[..l], t.as_ref()))
    }

    /// Moves frame `i` out without copying it: its buffer and `buf` are exchanged, so `buf`
    /// holds the frame in its first bytes, whose number is returned, and the batch keeps
    /// `buf`'s old allocation for later frames. Frame `i` is empty afterwards. For devices
    /// that pass buffers on instead of copying them ([`Device::send_batch_take`]).
    ///
    /// [`Device::send_batch_take`]: crate::Device::send_batch_take
    pub fn take_frame(&mut self, i: usize, buf: &mut Vec<u8>) -> usize {
        assert!(i < self.len, "frame {i} of a batch of {}", self.len);
        assert!(
            self.tails[i].is_none(),
            "frame {i} is gathered: take_frame_parts"
        );
        std::mem::swap(&mut self.bufs[i], buf);
        std::mem::take(&mut self.lens[i])
    }

    /// [`TxBatch::take_frame`] for a device that gathers: also moves out frame `i`'s tail
    /// (`None` for a whole frame).
    pub fn take_frame_parts(&mut self, i: usize, buf: &mut Vec<u8>) -> (usize, Option<TxPayload>) {
        assert!(i < self.len, "frame {i} of a batch of {}", self.len);
        let tail = self.tails[i].take();
        if tail.is_some() {
            self.gathered -= 1;
        }
        std::mem::swap(&mut self.bufs[i], buf);
        (std::mem::take(&mut self.lens[i]), tail)
    }

    /// Forgets all frames, keeping their buffers for reuse and releasing the tails'
    /// references.
    pub fn clear(&mut self) {
        if self.gathered > 0 {
            self.tails[..self.len].iter_mut().for_each(|t| *t = None);
            self.gathered = 0;
        }
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

    fn owner(bytes: &[u8]) -> (Arc<Vec<u8>>, SharedBytes) {
        let o = Arc::new(bytes.to_vec());
        let d: SharedBytes = o.clone();
        (o, d)
    }

    #[test]
    fn a_flattened_gathered_frame_is_the_frame_built_whole() {
        let (o, d) = owner(b"0123456789");
        assert!(
            TxPayload::new(d.clone(), 8, 3).is_none(),
            "outside the owner"
        );
        let mut g = TxBatch::new();
        // A long frame first, so the buffer reused below has stale bytes past the head.
        g.push(40).fill(0xee);
        g.clear();
        g.push(2).copy_from_slice(b"w1");
        g.push_gather(3, TxPayload::new(d, 2, 5).unwrap())
            .copy_from_slice(b"hdr");
        assert!(g.has_gathered());
        let parts: Vec<(Vec<u8>, Vec<u8>)> = g
            .iter_parts()
            .map(|(h, t)| (h.to_vec(), t.map_or(vec![], |t| t.bytes().to_vec())))
            .collect();
        assert_eq!(
            parts,
            vec![
                (b"w1".to_vec(), vec![]),
                (b"hdr".to_vec(), b"23456".to_vec())
            ]
        );
        assert_eq!(Arc::strong_count(&o), 2, "the frame references the owner");
        g.flatten();
        assert!(!g.has_gathered());
        assert_eq!(
            Arc::strong_count(&o),
            1,
            "flattening released the reference"
        );
        let whole: Vec<&[u8]> = g.iter().collect();
        assert_eq!(whole, vec![&b"w1"[..], &b"hdr23456"[..]]);
    }

    #[test]
    fn clearing_popping_and_taking_release_or_move_the_tails() {
        let (o, d) = owner(b"abcdef");
        let mut g = TxBatch::new();
        g.push_gather(1, TxPayload::new(d.clone(), 0, 6).unwrap())[0] = 1;
        g.push_gather(1, TxPayload::new(d.clone(), 1, 2).unwrap())[0] = 2;
        assert_eq!(Arc::strong_count(&o), 4);
        g.pop();
        assert_eq!(Arc::strong_count(&o), 3);
        let mut buf = Vec::new();
        let (len, tail) = g.take_frame_parts(0, &mut buf);
        assert_eq!((len, &buf[..1]), (1, &[1u8][..]));
        assert_eq!(tail.as_ref().map(|t| t.bytes()), Some(&b"abcdef"[..]));
        assert!(!g.has_gathered());
        drop(tail);
        g.clear();
        g.push_gather(1, TxPayload::new(d, 0, 1).unwrap());
        g.clear();
        assert_eq!(Arc::strong_count(&o), 1, "clear released every tail");
        // A reused slot is a whole frame again.
        g.push(1)[0] = 9;
        assert!(!g.has_gathered());
        assert_eq!(g.iter().next().unwrap(), &[9]);
    }
}
