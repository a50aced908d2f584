//! A fixed-capacity byte ring used for send and receive buffers.
//!
//! Besides FIFO reads and writes it can write at an offset past the end without making those
//! bytes readable (out-of-order data waiting for a gap to fill) and peek at an offset (data
//! already sent but not yet acknowledged).

/// A ring of bytes with a fixed capacity.
#[derive(Debug)]
pub struct RingBuffer {
    buf: Vec<u8>,
    head: usize,
    len: usize,
}

impl RingBuffer {
    /// A ring holding at most `capacity` bytes (allocated once, here).
    pub fn new(capacity: usize) -> Self {
        Self {
            buf: vec![0; capacity],
            head: 0,
            len: 0,
        }
    }
    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Free bytes.
    pub fn window(&self) -> usize {
        self.buf.len() - self.len
    }

    fn idx(&self, off: usize) -> usize {
        let i = self.head + off;
        if i >= self.buf.len() {
            i - self.buf.len()
        } else {
            i
        }
    }

    /// Appends as much of `data` as fits; returns how much.
    pub fn enqueue(&mut self, data: &[u8]) -> usize {
        let n = self.write_at(0, data);
        self.len += n;
        n
    }

    /// Writes `data` starting `offset` bytes past the end without making it readable; returns
    /// how many bytes fit.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> usize {
        let cap = self.buf.len();
        if offset >= self.window() {
            return 0;
        }
        let n = data.len().min(self.window() - offset);
        let start = self.idx(self.len + offset);
        let first = n.min(cap - start);
        self.buf[start..start + first].copy_from_slice(&data[..first]);
        self.buf[..n - first].copy_from_slice(&data[first..n]);
        n
    }

    /// Makes `n` bytes previously written with `write_at(0, …)` readable.
    pub fn commit(&mut self, n: usize) {
        debug_assert!(n <= self.window());
        self.len += n.min(self.window());
    }

    /// Copies up to `out.len()` bytes from the front and removes them.
    pub fn dequeue(&mut self, out: &mut [u8]) -> usize {
        let n = self.peek(0, out);
        self.consume(n);
        n
    }

    /// Copies bytes starting `offset` from the front into `out`, leaving them in place.
    pub fn peek(&self, offset: usize, out: &mut [u8]) -> usize {
        if offset >= self.len {
            return 0;
        }
        let n = out.len().min(self.len - offset);
        let (a, b) = self.slices(offset, n);
        out[..a.len()].copy_from_slice(a);
        out[a.len()..n].copy_from_slice(b);
        n
    }

    /// The `n` bytes at `offset` as at most two contiguous slices (zero-copy view).
    pub fn slices(&self, offset: usize, n: usize) -> (&[u8], &[u8]) {
        let n = n.min(self.len.saturating_sub(offset));
        let start = self.idx(offset);
        let first = n.min(self.buf.len() - start);
        (&self.buf[start..start + first], &self.buf[..n - first])
    }

    /// The longest contiguous run at `offset`, at most `max` bytes.
    pub fn contiguous(&self, offset: usize, max: usize) -> &[u8] {
        self.slices(offset, max).0
    }

    /// Removes `n` bytes from the front.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.head = self.idx(n);
        // The head never jumps back to 0 when the ring empties: bytes written past the end
        // (out-of-order data) stay where they are.
        self.len -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_peeks() {
        let mut r = RingBuffer::new(8);
        assert_eq!(r.enqueue(b"abcdef"), 6);
        let mut o = [0u8; 4];
        assert_eq!(r.dequeue(&mut o), 4);
        assert_eq!(&o, b"abcd");
        assert_eq!(r.enqueue(b"ghijklmn"), 6);
        assert_eq!(r.len(), 8);
        let (a, b) = r.slices(0, 8);
        assert_eq!([a, b].concat(), b"efghijkl");
        let mut o = [0u8; 3];
        assert_eq!(r.peek(5, &mut o), 3);
        assert_eq!(&o, b"jkl");
    }

    #[test]
    fn write_at_then_commit() {
        let mut r = RingBuffer::new(8);
        r.enqueue(b"ab");
        assert_eq!(r.write_at(2, b"ef"), 2);
        assert_eq!(r.len(), 2);
        assert_eq!(r.write_at(0, b"cd"), 2);
        r.commit(4);
        let mut o = [0u8; 8];
        assert_eq!(r.dequeue(&mut o), 6);
        assert_eq!(&o[..6], b"abcdef");
        assert_eq!(r.write_at(8, b"x"), 0);
    }

    #[test]
    fn data_past_the_end_survives_an_empty_ring() {
        let mut r = RingBuffer::new(8);
        r.enqueue(b"abc");
        r.write_at(2, b"zz");
        let mut o = [0u8; 3];
        r.dequeue(&mut o);
        assert!(r.is_empty());
        r.enqueue(b"xy");
        r.commit(2);
        let mut o = [0u8; 4];
        assert_eq!(r.dequeue(&mut o), 4);
        assert_eq!(&o, b"xyzz");
    }
}
