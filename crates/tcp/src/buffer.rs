//! A bounded byte ring used for send and receive buffers.
//!
//! Besides FIFO reads and writes it can write at an offset past the end without making those
//! bytes readable (out-of-order data waiting for a gap to fill) and peek at an offset (data
//! already sent but not yet acknowledged).
//!
//! The capacity is a limit, not an allocation: memory grows (doubling, never per packet once
//! a connection is warm) up to the capacity as data actually queues, and can be released when
//! the connection no longer needs it, so thousands of short or idle connections (TIME-WAIT)
//! cost little. An empty, released ring is 16 bytes.

/// Smallest allocation once the ring holds data.
const MIN_ALLOC: usize = 4096;

/// Smallest allocations kept per thread for the next ring ([`Storage`]'s `Drop`).
const SPARE_MAX: usize = 256;

thread_local! {
    /// Freed `MIN_ALLOC` allocations of this thread's rings (an engine's, since an engine
    /// lives on one thread), reused by the next ring that starts holding data. A connection
    /// per request allocated, zeroed and freed two of them each time: `malloc`, `free` and
    /// `memset` were about 10% of the offload daemon's samples under `ab`. A reused one is
    /// not zeroed: a ring only ever reads bytes that were written into it (the length, and
    /// out-of-order bytes only once the reassembler has them), as the kernel reuses buffer
    /// memory. At most `SPARE_MAX` (1 MiB) are kept.
    static SPARE: std::cell::RefCell<Vec<Box<[u8]>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A `MIN_ALLOC` allocation: a spare one of this thread's, or a new (zeroed) one.
fn min_alloc() -> Box<[u8]> {
    SPARE
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| vec![0u8; MIN_ALLOC].into_boxed_slice())
}

/// The memory of a ring that holds (or held) data: its bytes and where the readable part
/// starts.
#[derive(Debug)]
struct Storage {
    buf: Box<[u8]>,
    head: usize,
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.buf.len() == MIN_ALLOC {
            let buf = std::mem::take(&mut self.buf);
            // After the thread's locals are gone (thread exit) the buffer is just freed.
            let _ = SPARE.try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < SPARE_MAX {
                    s.push(buf);
                }
            });
        }
    }
}

impl Storage {
    /// The index of the byte `off` past the head.
    #[inline]
    fn idx(&self, off: usize) -> usize {
        let i = self.head + off;
        if i >= self.buf.len() {
            i - self.buf.len()
        } else {
            i
        }
    }
}

/// A ring of bytes holding at most `capacity` bytes.
///
/// 16 bytes while it holds no memory (issue 19: an idle connection has two): the length and
/// the limit inline, everything else behind one pointer. The limit is below 4 GiB.
#[derive(Debug)]
pub struct RingBuffer {
    mem: Option<Box<Storage>>,
    len: u32,
    cap: u32,
}

impl RingBuffer {
    /// A ring holding at most `capacity` bytes (nothing is allocated yet); capacities of
    /// 4 GiB or more hold 4 GiB − 1.
    pub const fn new(capacity: usize) -> Self {
        Self {
            mem: None,
            len: 0,
            cap: if capacity > u32::MAX as usize {
                u32::MAX
            } else {
                capacity as u32
            },
        }
    }
    /// Capacity in bytes (the limit).
    pub fn capacity(&self) -> usize {
        self.cap as usize
    }
    /// Bytes currently allocated (the ring's bytes and its small header).
    pub fn allocated(&self) -> usize {
        self.mem
            .as_ref()
            .map_or(0, |m| m.buf.len() + std::mem::size_of::<Storage>())
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        self.mem.as_ref().map_or(&[], |m| &m.buf)
    }

    /// Makes the allocation hold at least `needed` bytes from the head (≤ capacity),
    /// re-linearising the contents (out-of-order bytes past the end included).
    fn ensure(&mut self, needed: usize) {
        let old = self.bytes().len();
        if needed <= old {
            return;
        }
        let size = needed.max(old * 2).max(MIN_ALLOC).min(self.capacity());
        let mut nb = if size == MIN_ALLOC {
            min_alloc()
        } else {
            vec![0u8; size].into_boxed_slice()
        };
        if let Some(m) = &self.mem {
            let first = old - m.head;
            nb[..first].copy_from_slice(&m.buf[m.head..]);
            nb[first..old].copy_from_slice(&m.buf[..m.head]);
        }
        match &mut self.mem {
            Some(m) => {
                m.buf = nb;
                m.head = 0;
            }
            None => self.mem = Some(Box::new(Storage { buf: nb, head: 0 })),
        }
    }

    /// Frees the allocation when the ring is empty (e.g. a connection at rest). Bytes
    /// written past the end (out of order) are lost: the caller checks there are none.
    pub fn release_if_empty(&mut self) {
        if self.len == 0 {
            self.mem = None;
        }
    }
    /// Bytes held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// True if empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Free bytes (up to the capacity).
    #[inline]
    pub fn window(&self) -> usize {
        (self.cap - self.len) as usize
    }

    /// Appends as much of `data` as fits; returns how much.
    pub fn enqueue(&mut self, data: &[u8]) -> usize {
        let n = self.write_at(0, data);
        self.len += n as u32;
        n
    }

    /// Appends up to `n` bytes that `fill` writes in place (see [`RingBuffer::fill_at`]);
    /// returns how many fit. The bytes never pass through a buffer of the caller's.
    pub fn enqueue_with(&mut self, n: usize, fill: impl FnMut(&mut [u8], usize)) -> usize {
        let n = self.fill_at(0, n, fill);
        self.len += n as u32;
        n
    }

    /// Writes `data` starting `offset` bytes past the end without making it readable; returns
    /// how many bytes fit.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> usize {
        self.fill_at(offset, data.len(), |dst, at| {
            dst.copy_from_slice(&data[at..at + dst.len()])
        })
    }

    /// Has `fill(dst, at)` write bytes `at..at + dst.len()` of up to `n` bytes starting
    /// `offset` bytes past the end (at most two parts, in order, across the wrap), without
    /// making them readable; returns how many fit.
    pub fn fill_at(
        &mut self,
        offset: usize,
        n: usize,
        mut fill: impl FnMut(&mut [u8], usize),
    ) -> usize {
        if offset >= self.window() {
            return 0;
        }
        let n = n.min(self.window() - offset);
        if n == 0 {
            return 0;
        }
        let len = self.len();
        self.ensure(len + offset + n);
        let Some(m) = &mut self.mem else {
            return 0; // never: `ensure` allocated (the capacity is above len + offset)
        };
        let start = m.idx(len + offset);
        let first = n.min(m.buf.len() - start);
        fill(&mut m.buf[start..start + first], 0);
        if n > first {
            fill(&mut m.buf[..n - first], first);
        }
        n
    }

    /// Makes `n` bytes previously written with `write_at(0, …)` readable.
    pub fn commit(&mut self, n: usize) {
        debug_assert!(n <= self.window());
        self.len += n.min(self.window()) as u32;
    }

    /// Copies up to `out.len()` bytes from the front and removes them.
    pub fn dequeue(&mut self, out: &mut [u8]) -> usize {
        let n = self.peek(0, out);
        self.consume(n);
        n
    }

    /// Copies bytes starting `offset` from the front into `out`, leaving them in place.
    pub fn peek(&self, offset: usize, out: &mut [u8]) -> usize {
        if offset >= self.len() {
            return 0;
        }
        let n = out.len().min(self.len() - offset);
        let (a, b) = self.slices(offset, n);
        out[..a.len()].copy_from_slice(a);
        out[a.len()..n].copy_from_slice(b);
        n
    }

    /// The `n` bytes at `offset` as at most two contiguous slices (zero-copy view).
    pub fn slices(&self, offset: usize, n: usize) -> (&[u8], &[u8]) {
        let n = n.min(self.len().saturating_sub(offset));
        let (true, Some(m)) = (n > 0, &self.mem) else {
            return (&[], &[]);
        };
        let start = m.idx(offset);
        let first = n.min(m.buf.len() - start);
        (&m.buf[start..start + first], &m.buf[..n - first])
    }

    /// Removes `n` bytes from the front.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len());
        if n == 0 {
            return;
        }
        if let Some(m) = &mut self.mem {
            // The head never jumps back to 0 when the ring empties: bytes written past the
            // end (out-of-order data) stay where they are.
            m.head = m.idx(n);
        }
        self.len -= n as u32;
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

    /// `enqueue_with` has the bytes written in place, in two parts across the wrap, each
    /// told its position in the whole, and takes no more than fits.
    #[test]
    fn enqueue_with_fills_in_place_across_the_wrap() {
        let mut r = RingBuffer::new(8);
        assert_eq!(r.enqueue(b"abcdef"), 6);
        let mut o = [0u8; 5];
        assert_eq!(r.dequeue(&mut o), 5);
        let src = b"ghijklmnop";
        let mut calls = Vec::new();
        let n = r.enqueue_with(src.len(), |dst, at| {
            calls.push((at, dst.len()));
            dst.copy_from_slice(&src[at..at + dst.len()]);
        });
        assert_eq!(n, 7, "the window");
        assert_eq!(calls.len(), 2, "two parts across the wrap: {calls:?}");
        assert_eq!(calls[0].0, 0);
        assert_eq!(calls[1].0, calls[0].1);
        let mut o = [0u8; 8];
        assert_eq!(r.dequeue(&mut o), 8);
        assert_eq!(&o, b"fghijklm");
        assert_eq!(r.enqueue_with(0, |_, _| panic!("nothing to fill")), 0);
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

    #[test]
    fn a_released_smallest_allocation_is_reused_by_the_next_ring_of_the_thread() {
        let mut a = RingBuffer::new(1 << 20);
        assert_eq!(a.enqueue(b"secret"), 6);
        let p = a.bytes().as_ptr();
        assert_eq!(a.dequeue(&mut [0u8; 6]), 6);
        a.release_if_empty();
        assert_eq!(a.allocated(), 0);
        let mut b = RingBuffer::new(1 << 20);
        assert_eq!(b.enqueue(b"x"), 1);
        assert_eq!(b.bytes().as_ptr(), p, "the spare allocation was taken");
        // Only what was written is readable.
        let mut out = [0u8; 16];
        assert_eq!(b.peek(0, &mut out), 1);
        assert_eq!(&out[..1], b"x");
        // A larger allocation is not kept; the smallest ones are, up to the limit.
        let spares = || SPARE.with(|s| s.borrow().len());
        assert_eq!(spares(), 0);
        let mut c = RingBuffer::new(1 << 20);
        assert_eq!(c.enqueue(&[1u8; 10_000]), 10_000);
        drop(c);
        assert_eq!(spares(), 0);
        let rings: Vec<RingBuffer> = (0..SPARE_MAX + 5)
            .map(|_| {
                let mut r = RingBuffer::new(1 << 20);
                r.enqueue(b"z");
                r
            })
            .collect();
        drop(rings);
        assert_eq!(spares(), SPARE_MAX);
    }
}
