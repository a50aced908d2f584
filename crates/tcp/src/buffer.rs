//! A bounded byte ring used for send and receive buffers.
//!
//! Besides FIFO reads and writes it can write at an offset past the end without making those
//! bytes readable (out-of-order data waiting for a gap to fill) and peek at an offset (data
//! already sent but not yet acknowledged).
//!
//! The capacity is a limit, not an allocation: memory grows (doubling, never per packet once
//! a connection is warm) up to the capacity as data actually queues, and can be released when
//! the connection no longer needs it, so thousands of short or idle connections (TIME-WAIT)
//! cost little.

/// Smallest allocation once the ring holds data.
const MIN_ALLOC: usize = 4096;

/// A ring of bytes holding at most `capacity` bytes.
#[derive(Debug)]
pub struct RingBuffer {
    buf: Vec<u8>,
    cap: usize,
    head: usize,
    len: usize,
}

impl RingBuffer {
    /// A ring holding at most `capacity` bytes (nothing is allocated yet).
    pub fn new(capacity: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap: capacity,
            head: 0,
            len: 0,
        }
    }
    /// Capacity in bytes (the limit).
    pub fn capacity(&self) -> usize {
        self.cap
    }
    /// Bytes currently allocated.
    pub fn allocated(&self) -> usize {
        self.buf.capacity()
    }

    /// Makes the allocation hold at least `needed` bytes from the head (≤ capacity),
    /// re-linearising the contents (out-of-order bytes past the end included).
    fn ensure(&mut self, needed: usize) {
        if needed <= self.buf.len() {
            return;
        }
        let size = needed.max(self.buf.len() * 2).max(MIN_ALLOC).min(self.cap);
        let mut nb = vec![0u8; size];
        let old = self.buf.len();
        if old > 0 {
            let first = old - self.head;
            nb[..first].copy_from_slice(&self.buf[self.head..]);
            nb[first..old].copy_from_slice(&self.buf[..self.head]);
        }
        self.buf = nb;
        self.head = 0;
    }

    /// Frees the allocation when the ring is empty (e.g. a connection in TIME-WAIT).
    pub fn release_if_empty(&mut self) {
        if self.len == 0 {
            self.buf = Vec::new();
            self.head = 0;
        }
    }
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Free bytes (up to the capacity).
    pub fn window(&self) -> usize {
        self.cap - self.len
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
        if offset >= self.window() {
            return 0;
        }
        let n = data.len().min(self.window() - offset);
        if n == 0 {
            return 0;
        }
        self.ensure(self.len + offset + n);
        let cap = self.buf.len();
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
        if n == 0 {
            return (&[], &[]);
        }
        let start = self.idx(offset);
        let first = n.min(self.buf.len() - start);
        (&self.buf[start..start + first], &self.buf[..n - first])
    }

    /// Removes `n` bytes from the front.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        if n == 0 {
            return;
        }
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
    fn grows_on_demand_keeping_wrapped_and_out_of_order_bytes() {
        let mut r = RingBuffer::new(1 << 20);
        assert_eq!(r.allocated(), 0);
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        r.enqueue(&data);
        let mut o = vec![0u8; 2500];
        r.dequeue(&mut o);
        r.enqueue(&data); // wraps inside the 4 KiB allocation
        r.write_at(100, b"ooo"); // out of order, past the end
        r.enqueue(&vec![9u8; 10_000]); // forces growth while wrapped
        assert!(r.allocated() >= 3500 + 10_000);
        let mut all = vec![0u8; r.len()];
        r.peek(0, &mut all);
        assert_eq!(&all[..500], &data[2500..]);
        assert_eq!(&all[500..3500], &data[..]);
        assert!(all[3500..].iter().all(|&b| b == 9));
        assert_eq!(r.window(), (1 << 20) - r.len());
    }

    #[test]
    fn release_frees_only_an_empty_ring() {
        let mut r = RingBuffer::new(8192);
        r.enqueue(b"x");
        r.release_if_empty();
        assert!(r.allocated() > 0);
        r.consume(1);
        r.release_if_empty();
        assert_eq!(r.allocated(), 0);
        assert_eq!(r.enqueue(b"again"), 5);
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
