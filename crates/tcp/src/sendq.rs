//! The send queue: bytes copied into a ring, and application-owned buffers sent without a copy
//! (seed 002's user buffers handed to the stack), in one ordered stream.
//!
//! A zero-copy buffer stays referenced until every byte of it is acknowledged; then the queue
//! drops it and counts it done. Buffers complete in the order they were queued, so the queue
//! keeps no list of completions: [`SendQueue::zc_pending`] (how many are still queued) is
//! all the connection needs to tell which of its tokens are done (`Connection::send_zc`).
//! A completion nobody asks about therefore holds no memory.

use crate::buffer::RingBuffer;
use std::collections::VecDeque;
use std::sync::Arc;

/// Memory a zero-copy send borrows: a heap buffer, or a range of any shared owner of bytes
/// (a mapped file window: segments and retransmissions are cut straight from it). The queue
/// holds its reference until every byte is acknowledged, then drops it.
#[derive(Clone)]
pub enum ExtBuf {
    /// A heap buffer, whole.
    Heap(Arc<[u8]>),
    /// `len` bytes of `owner`'s bytes from `start`.
    Shared {
        /// Whatever owns the memory (dropped with the last reference).
        owner: SharedOwner,
        /// First byte within `owner`.
        start: usize,
        /// Bytes.
        len: usize,
    },
}

impl ExtBuf {
    /// A range of `owner`'s bytes; `None` if it lies outside them.
    pub fn shared(owner: SharedOwner, start: usize, len: usize) -> Option<Self> {
        let total = (*owner).as_ref().len();
        (start <= total && len <= total - start).then_some(ExtBuf::Shared { owner, start, len })
    }

    /// The borrowed bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            ExtBuf::Heap(b) => b,
            ExtBuf::Shared { owner, start, len } => &(**owner).as_ref()[*start..*start + *len],
        }
    }

    fn len(&self) -> usize {
        match self {
            ExtBuf::Heap(b) => b.len(),
            ExtBuf::Shared { len, .. } => *len,
        }
    }
}

impl From<Arc<[u8]>> for ExtBuf {
    fn from(b: Arc<[u8]>) -> Self {
        ExtBuf::Heap(b)
    }
}

impl std::fmt::Debug for ExtBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtBuf::Heap(b) => write!(f, "Heap({} bytes)", b.len()),
            ExtBuf::Shared { start, len, .. } => write!(f, "Shared({start}..+{len})"),
        }
    }
}

/// The owner of a shared range.
pub type SharedOwner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Where a segment's payload lies when it is one contiguous range of a shared owner's
/// bytes ([`SendQueue::gather_src`]): `owner`'s bytes from `start`, as many as the payload.
#[derive(Clone, Copy)]
pub struct PayloadSrc<'a> {
    /// The owner (clone it to keep the bytes alive: a reference count, no allocation).
    pub owner: &'a SharedOwner,
    /// First byte within the owner.
    pub start: usize,
}

/// Whether two owners are the same object (data pointers only: vtables may differ).
fn same_owner(a: &SharedOwner, b: &SharedOwner) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const u8, Arc::as_ptr(b) as *const u8)
}

#[derive(Debug)]
enum Chunk {
    /// The next `n` bytes of the ring.
    Ring(usize),
    /// An application buffer, `off` bytes of it already acknowledged; it completes
    /// `sends` zero-copy sends (itself and empty ones queued after it, which carry no bytes).
    Ext {
        buf: ExtBuf,
        off: usize,
        sends: usize,
    },
}

/// Ordered bytes waiting to be sent or acknowledged.
#[derive(Debug)]
pub struct SendQueue {
    ring: RingBuffer,
    chunks: VecDeque<Chunk>,
    len: usize,
    cap: usize,
    /// Zero-copy sends queued and not yet completed (the `sends` of the `Ext` chunks).
    zc_pending: usize,
}

impl SendQueue {
    /// A queue holding at most `cap` bytes (copied and borrowed together).
    pub fn new(cap: usize) -> Self {
        Self {
            ring: RingBuffer::new(cap),
            chunks: VecDeque::new(),
            len: 0,
            cap,
            zc_pending: 0,
        }
    }
    /// Bytes queued (unsent and unacknowledged).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Room left under the limit.
    pub fn window(&self) -> usize {
        self.cap - self.len
    }

    /// Copies as much of `data` as fits; returns how much.
    pub fn enqueue(&mut self, data: &[u8]) -> usize {
        self.enqueue_with(data.len(), |dst, at| {
            dst.copy_from_slice(&data[at..at + dst.len()])
        })
    }

    /// Queues as much of `n` bytes as fits, written in place by `fill(dst, at)` (bytes
    /// `at..at + dst.len()`, see `RingBuffer::fill_at`); returns how much.
    pub fn enqueue_with(&mut self, n: usize, fill: impl FnMut(&mut [u8], usize)) -> usize {
        let n = self.ring.enqueue_with(n.min(self.window()), fill);
        if n > 0 {
            match self.chunks.back_mut() {
                Some(Chunk::Ring(k)) => *k += n,
                _ => self.chunks.push_back(Chunk::Ring(n)),
            }
            self.len += n;
        }
        n
    }

    /// Queues an application buffer without copying it, if it fits whole. It completes
    /// once every byte of it is acknowledged, after every buffer queued before it; an empty
    /// one completes with the last buffer queued before it (at once if none is pending).
    pub fn enqueue_ext(&mut self, buf: impl Into<ExtBuf>) -> bool {
        let buf = buf.into();
        if buf.len() > self.window() {
            return false;
        }
        if buf.len() == 0 {
            // No bytes to wait for: done when the buffers before it are. Rare: a scan.
            let last = self.chunks.iter_mut().rev().find_map(|c| match c {
                Chunk::Ext { sends, .. } => Some(sends),
                Chunk::Ring(_) => None,
            });
            if let Some(sends) = last {
                *sends += 1;
                self.zc_pending += 1;
            }
            return true;
        }
        self.len += buf.len();
        self.zc_pending += 1;
        self.chunks.push_back(Chunk::Ext {
            buf,
            off: 0,
            sends: 1,
        });
        true
    }

    /// Drops `n` acknowledged bytes from the front, completing finished buffers.
    pub fn consume(&mut self, mut n: usize) {
        n = n.min(self.len);
        self.len -= n;
        while n > 0 {
            match self.chunks.front_mut() {
                Some(Chunk::Ring(k)) => {
                    let m = (*k).min(n);
                    self.ring.consume(m);
                    *k -= m;
                    n -= m;
                    if *k == 0 {
                        self.chunks.pop_front();
                    }
                }
                Some(Chunk::Ext { buf, off, sends }) => {
                    let m = (buf.len() - *off).min(n);
                    *off += m;
                    n -= m;
                    if *off == buf.len() {
                        self.zc_pending -= *sends;
                        self.chunks.pop_front();
                    }
                }
                None => break,
            }
        }
    }

    /// The `n` bytes at `off`: one slice when they are contiguous in one chunk, otherwise
    /// gathered into `scratch`.
    pub fn gather<'a>(&'a self, off: usize, n: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
        self.gather_src(off, n, scratch).0
    }

    /// [`SendQueue::gather`], also telling where the bytes lie when they are one contiguous
    /// range of a shared owner (a zero-copy send's [`ExtBuf::Shared`] memory): a device that
    /// gathers can then reference them instead of copying them.
    pub fn gather_src<'a>(
        &'a self,
        off: usize,
        n: usize,
        scratch: &'a mut Vec<u8>,
    ) -> (&'a [u8], Option<PayloadSrc<'a>>) {
        let mut single: Option<&'a [u8]> = None;
        let mut src = None;
        let mut pieces = 0;
        scratch.clear();
        self.pieces(off, n, |p, s| {
            pieces += 1;
            if pieces == 1 {
                single = Some(p);
                src = s;
            } else {
                if pieces == 2 {
                    scratch.extend_from_slice(single.expect("first piece"));
                }
                scratch.extend_from_slice(p);
            }
        });
        match pieces {
            0 => (&[], None),
            1 => (single.expect("one piece"), src),
            _ => (scratch, None),
        }
    }

    /// How many of the `n` bytes at `off` lie in the shared range the first of them is in
    /// (consecutive ranges of one owner count as one, as in a segment's payload); 0 when
    /// the byte at `off` is not in shared memory.
    pub fn shared_run(&self, off: usize, n: usize) -> usize {
        let mut first = None;
        self.pieces(off, n, |p, s| {
            first.get_or_insert(if s.is_some() { p.len() } else { 0 });
        });
        first.unwrap_or(0)
    }

    /// Calls `f` with the contiguous pieces making up `n` bytes at `off`, and for a piece of
    /// shared memory where it lies.
    /// Consecutive shared ranges that continue each other in one owner (a mapped window
    /// handed over in several sends) make one piece: a segment across them needs no gather.
    fn pieces<'a>(
        &'a self,
        mut off: usize,
        mut n: usize,
        mut f: impl FnMut(&'a [u8], Option<PayloadSrc<'a>>),
    ) {
        let shared = |o: &'a SharedOwner, s0: usize, e0: usize| {
            (
                &(**o).as_ref()[s0..e0],
                Some(PayloadSrc {
                    owner: o,
                    start: s0,
                }),
            )
        };
        let mut ring_pos = 0;
        // A pending run of contiguous shared ranges: (owner, start, end) within the owner.
        let mut run: Option<(&'a SharedOwner, usize, usize)> = None;
        for c in &self.chunks {
            if n == 0 {
                break;
            }
            let clen = match c {
                Chunk::Ring(k) => *k,
                Chunk::Ext { buf, off: done, .. } => buf.len() - done,
            };
            if off >= clen {
                off -= clen;
                if let Chunk::Ring(k) = c {
                    ring_pos += k;
                }
                continue;
            }
            let m = (clen - off).min(n);
            match c {
                Chunk::Ring(k) => {
                    if let Some((o, s0, e0)) = run.take() {
                        let (p, s) = shared(o, s0, e0);
                        f(p, s);
                    }
                    let (a, b) = self.ring.slices(ring_pos + off, m);
                    if !a.is_empty() {
                        f(a, None);
                    }
                    if !b.is_empty() {
                        f(b, None);
                    }
                    ring_pos += k;
                }
                Chunk::Ext {
                    buf: ExtBuf::Shared { owner, start, .. },
                    off: done,
                    ..
                } => {
                    let s = start + done + off;
                    match &mut run {
                        Some((o, _, e)) if same_owner(o, owner) && *e == s => *e = s + m,
                        _ => {
                            if let Some((o, s0, e0)) = run.take() {
                                let (p, s) = shared(o, s0, e0);
                                f(p, s);
                            }
                            run = Some((owner, s, s + m));
                        }
                    }
                    n -= m;
                    off = 0;
                    continue;
                }
                Chunk::Ext { buf, off: done, .. } => {
                    if let Some((o, s0, e0)) = run.take() {
                        let (p, s) = shared(o, s0, e0);
                        f(p, s);
                    }
                    f(&buf.bytes()[done + off..done + off + m], None)
                }
            }
            n -= m;
            off = 0;
        }
        if let Some((o, s0, e0)) = run {
            let (p, s) = shared(o, s0, e0);
            f(p, s);
        }
    }

    /// Replaces the borrowed memory of every queued zero-copy buffer lent by `owner` by a
    /// heap copy of its bytes not yet acknowledged, and drops the queue's references to it
    /// (the owner is released once nothing else holds it, e.g. frames still in a device's
    /// queue). For a lender that needs its memory back before the peer acknowledges it (the
    /// offload daemon's transmit area under pressure). The stream and the order in which
    /// buffers complete are unchanged. Returns the bytes copied (0: nothing of `owner` is queued). Allocates:
    /// meant for the rare case, never per packet.
    pub fn rehome(&mut self, owner: &SharedOwner) -> usize {
        let mut n = 0;
        for c in self.chunks.iter_mut() {
            let Chunk::Ext { buf, off, .. } = c else {
                continue;
            };
            if !matches!(buf, ExtBuf::Shared { owner: o, .. } if same_owner(o, owner)) {
                continue;
            }
            let copy: Arc<[u8]> = Arc::from(&buf.bytes()[*off..]);
            n += copy.len();
            *buf = ExtBuf::Heap(copy);
            *off = 0;
        }
        n
    }

    /// Zero-copy sends queued and not yet completed: the most recent this many (they
    /// complete in order).
    pub fn zc_pending(&self) -> usize {
        self.zc_pending
    }

    /// Heap bytes held now: the ring's allocation and the chunk list.
    pub fn heap_bytes(&self) -> usize {
        self.ring.allocated() + self.chunks.capacity() * std::mem::size_of::<Chunk>()
    }

    /// Frees the ring's memory when nothing is queued.
    pub fn release_if_empty(&mut self) {
        if self.len == 0 {
            self.ring.release_if_empty();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copied_and_borrowed_bytes_form_one_stream() {
        let mut q = SendQueue::new(100);
        assert_eq!(q.enqueue(b"abc"), 3);
        let ext: Arc<[u8]> = Arc::from(&b"DEFG"[..]);
        assert!(q.enqueue_ext(ext.clone()));
        assert_eq!(q.enqueue(b"hi"), 2);
        assert_eq!(q.len(), 9);
        let mut s = Vec::new();
        assert_eq!(q.gather(0, 9, &mut s), b"abcDEFGhi");
        assert_eq!(q.gather(3, 4, &mut s), b"DEFG");
        assert_eq!(q.gather(2, 3, &mut s), b"cDE");
        // Acknowledge into the middle of the borrowed buffer: not complete yet.
        q.consume(5);
        assert_eq!(q.zc_pending(), 1);
        assert_eq!(q.gather(0, 4, &mut s), b"FGhi");
        q.consume(2);
        assert_eq!(q.zc_pending(), 0);
        assert_eq!(q.gather(0, 2, &mut s), b"hi");
        q.consume(2);
        assert!(q.is_empty());
    }

    #[test]
    fn buffers_complete_in_order_and_an_empty_one_with_the_one_before() {
        let mut q = SendQueue::new(100);
        let ext = |b: &[u8]| -> Arc<[u8]> { Arc::from(b) };
        assert!(q.enqueue_ext(ext(b"")));
        assert_eq!(q.zc_pending(), 0, "nothing before it: done at once");
        assert!(q.enqueue_ext(ext(b"ab")));
        assert_eq!(q.enqueue(b"cd"), 2);
        assert!(q.enqueue_ext(ext(b"")));
        assert!(q.enqueue_ext(ext(b"ef")));
        assert_eq!((q.zc_pending(), q.len()), (3, 6));
        // The empty one rides on "ab", not on the copied bytes after it.
        q.consume(2);
        assert_eq!(q.zc_pending(), 1);
        q.consume(3);
        assert_eq!(q.zc_pending(), 1);
        q.consume(1);
        assert_eq!(q.zc_pending(), 0);
        assert!(q.is_empty());
    }

    #[test]
    fn borrowed_buffer_must_fit_whole() {
        let mut q = SendQueue::new(10);
        q.enqueue(b"12345678");
        assert!(!q.enqueue_ext(Arc::from(&b"abc"[..])));
        assert_eq!(q.zc_pending(), 0, "a refused buffer is not pending");
        assert!(q.enqueue_ext(Arc::from(&b"ab"[..])));
        assert_eq!(q.window(), 0);
        assert_eq!(q.enqueue(b"x"), 0);
    }

    #[test]
    fn rehome_copies_the_unacknowledged_rest_and_lets_go_of_the_owner() {
        let owner: Arc<Vec<u8>> = Arc::new(b"0123456789".to_vec());
        let o: SharedOwner = owner.clone();
        let other: SharedOwner = Arc::new(b"XY".to_vec());
        let mut q = SendQueue::new(100);
        assert_eq!(q.enqueue(b"ab"), 2);
        assert!(q.enqueue_ext(ExtBuf::shared(o.clone(), 2, 4).unwrap()));
        assert!(q.enqueue_ext(ExtBuf::shared(other.clone(), 0, 2).unwrap()));
        assert!(q.enqueue_ext(ExtBuf::shared(o.clone(), 6, 2).unwrap()));
        assert_eq!(q.enqueue(b"z"), 1);
        // Acknowledge the ring bytes and two of the first buffer's.
        q.consume(4);
        assert_eq!(Arc::strong_count(&owner), 4);
        assert_eq!(
            q.rehome(&o),
            4,
            "the unacknowledged rest of both of its ranges"
        );
        assert_eq!(
            Arc::strong_count(&owner),
            2,
            "the queue let go of the owner"
        );
        assert_eq!(q.rehome(&o), 0, "already on the heap");
        let mut s = Vec::new();
        // The stream is unchanged; the rehomed bytes are no longer the owner's, the other
        // owner's still are.
        assert_eq!(q.gather(0, 7, &mut s), b"45XY67z");
        let (p, src) = q.gather_src(0, 2, &mut s);
        assert_eq!(p, b"45");
        assert!(src.is_none(), "a heap copy is not a shared range");
        assert!(q.gather_src(2, 2, &mut s).1.is_some());
        q.consume(1);
        assert_eq!(q.zc_pending(), 3);
        q.consume(1);
        assert_eq!(q.zc_pending(), 2, "the first buffer completed as before");
        q.consume(5);
        assert_eq!(q.zc_pending(), 0);
        assert!(q.is_empty());
        drop(o);
        assert_eq!(Arc::strong_count(&owner), 1);
    }

    #[test]
    fn a_shared_range_is_sent_from_its_owner_and_released_when_acknowledged() {
        let owner: Arc<Vec<u8>> = Arc::new(b"0123456789".to_vec());
        let dyn_owner: Arc<dyn AsRef<[u8]> + Send + Sync> = owner.clone();
        assert!(ExtBuf::shared(dyn_owner.clone(), 8, 3).is_none());
        let mut q = SendQueue::new(100);
        assert!(q.enqueue_ext(ExtBuf::shared(dyn_owner.clone(), 2, 5).unwrap()));
        assert!(q.enqueue_ext(ExtBuf::shared(dyn_owner, 9, 1).unwrap()));
        assert_eq!(q.enqueue(b"x"), 1);
        let mut s = Vec::new();
        assert_eq!(q.gather(0, 7, &mut s), b"234569x");
        assert_eq!(q.gather(1, 3, &mut s), b"345");
        // 2..7 and 9..10 are not contiguous: gathered. Contiguous ranges are one slice.
        let mut c = SendQueue::new(100);
        let o: Arc<dyn AsRef<[u8]> + Send + Sync> = owner.clone();
        assert!(c.enqueue_ext(ExtBuf::shared(o.clone(), 1, 3).unwrap()));
        assert!(c.enqueue_ext(ExtBuf::shared(o.clone(), 4, 4).unwrap()));
        let mut s2 = Vec::new();
        let g = c.gather(1, 5, &mut s2);
        assert_eq!(g, b"23456");
        assert_eq!(
            g.as_ptr(),
            owner[2..].as_ptr(),
            "contiguous ranges were copied"
        );
        drop((c, o));
        assert_eq!(Arc::strong_count(&owner), 3);
        q.consume(6);
        assert_eq!(q.zc_pending(), 0);
        assert_eq!(
            Arc::strong_count(&owner),
            1,
            "the queue let go of the owner"
        );
    }
}
