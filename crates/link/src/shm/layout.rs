//! Where everything lies in a wire's region, and how big the rings are.
//!
//! ```text
//! header page(s)
//!   0  magic        u64   "flowshm2"
//!   8  queues n     u64
//!  16  ring bytes   u64   data capacity of every ring
//!  24  max frame    u64
//!  32  pid side 0   u32
//!  36  pid side 1   u32
//!  64  bells        2·n × 64 B: the bell of side s's receive queue q at 64 + (s·n + q)·64
//! rings (the header rounded up to a page): 2·n² rings, ring_bytes(capacity) apart;
//!   direction d (0: side 0 → side 1), sender engine i, receive queue q at index (d·n + i)·n + q
//! ```

use super::{MAX_FRAME, MAX_QUEUES, MAX_RING_BYTES, MIN_RING_BYTES};
use flowstack_sys::ring::{self, RingLayout, BELL_BYTES};
use flowstack_sys::SharedRegion;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

/// "flowshm2": the multi-queue layout (the single-ring "flowshm1" is gone).
const MAGIC: u64 = 0x666c_6f77_7368_6d32;
const PAGE: usize = 4096;
const BELLS: usize = 64;
const PIDS: usize = 32;

/// The shape of a wire: queue pairs per side and bytes per ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Geometry {
    /// Queue pairs per side (engines per side).
    pub n: usize,
    /// Data capacity of each ring (a power of two).
    pub cap: usize,
}

fn invalid(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

impl Geometry {
    /// The geometry for `n` queue pairs sharing `ring_memory` bytes of ring data per
    /// direction: each of the n² rings of a direction gets the largest power of two not above
    /// its share, kept within [`MIN_RING_BYTES`, `MAX_RING_BYTES`].
    pub fn new(n: usize, ring_memory: usize) -> io::Result<Self> {
        if n == 0 || n > MAX_QUEUES {
            return Err(invalid(
                io::ErrorKind::InvalidInput,
                format!("a shm wire has 1 to {MAX_QUEUES} queue pairs, not {n}"),
            ));
        }
        let share = (ring_memory / (n * n)).clamp(MIN_RING_BYTES, MAX_RING_BYTES);
        // Largest power of two <= share (share >= MIN_RING_BYTES > 0).
        let cap = 1usize << (usize::BITS - 1 - share.leading_zeros());
        Ok(Self { n, cap })
    }

    /// Bytes of the header: fields, then the 2·n bells, rounded up to a page.
    pub fn header_bytes(&self) -> usize {
        (BELLS + 2 * self.n * BELL_BYTES).next_multiple_of(PAGE)
    }

    /// Bytes of the whole region.
    pub fn len(&self) -> usize {
        self.header_bytes() + 2 * self.n * self.n * ring::ring_bytes(self.cap)
    }

    /// The ring from engine `sender` of side `from` to receive queue `queue` of the other side.
    pub fn ring(&self, from: usize, sender: usize, queue: usize) -> RingLayout {
        debug_assert!(from < 2 && sender < self.n && queue < self.n);
        let index = (from * self.n + sender) * self.n + queue;
        RingLayout {
            offset: self.header_bytes() + index * ring::ring_bytes(self.cap),
            capacity: self.cap,
            max_record: MAX_FRAME,
        }
    }

    /// Offset of the bell of receive queue `queue` of side `side`.
    pub fn bell(&self, side: usize, queue: usize) -> usize {
        debug_assert!(side < 2 && queue < self.n);
        BELLS + (side * self.n + queue) * BELL_BYTES
    }

    /// Writes the header of a new (zero-filled) region of [`Geometry::len`] bytes.
    pub fn write_header(&self, region: &SharedRegion) {
        let word = |o| region.atomic_u64(o).expect("header inside the region");
        word(8).store(self.n as u64, Ordering::Relaxed);
        word(16).store(self.cap as u64, Ordering::Relaxed);
        word(24).store(MAX_FRAME as u64, Ordering::Relaxed);
        word(0).store(MAGIC, Ordering::Release);
    }

    /// Reads and checks the header of a region made by another process: the magic, a queue
    /// count and ring size this code could have chosen, the largest frame, and a region
    /// exactly as long as they make it. Anything else is `InvalidData`.
    pub fn read_header(region: &SharedRegion) -> io::Result<Self> {
        let bad = |why: String| invalid(io::ErrorKind::InvalidData, why);
        let word = |o| region.atomic_u64(o).map(|w| w.load(Ordering::Acquire));
        if word(0) != Some(MAGIC) {
            return Err(bad("not a flowstack shm wire (no magic)".into()));
        }
        let (n, cap, max) = match (word(8), word(16), word(24)) {
            (Some(n), Some(c), Some(m)) => (n, c, m),
            _ => return Err(bad("shm wire header truncated".into())),
        };
        let n_ok = (1..=MAX_QUEUES as u64).contains(&n);
        let cap_ok =
            cap.is_power_of_two() && (MIN_RING_BYTES as u64..=MAX_RING_BYTES as u64).contains(&cap);
        if !n_ok || !cap_ok || max != MAX_FRAME as u64 {
            return Err(bad(format!(
                "shm wire header: {n} queues, {cap}-byte rings, {max}-byte frames"
            )));
        }
        let g = Self {
            n: n as usize,
            cap: cap as usize,
        };
        if region.len() != g.len() {
            return Err(bad(format!(
                "shm wire of {} bytes where {n} queues of {cap}-byte rings take {}",
                region.len(),
                g.len()
            )));
        }
        Ok(g)
    }

    /// Where side `side` records its process id.
    pub fn pid(region: &SharedRegion, side: usize) -> &AtomicU32 {
        region
            .atomic_u32(PIDS + 4 * side)
            .expect("header inside the region")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_shrink_with_n_down_to_the_floor() {
        let mib = 1 << 20;
        let cap = |n| Geometry::new(n, 16 * mib).unwrap().cap;
        assert_eq!(cap(1), 16 * mib);
        assert_eq!(cap(2), 4 * mib);
        assert_eq!(cap(3), mib, "16 MiB / 9 rounds down to a power of two");
        assert_eq!(cap(4), mib);
        assert_eq!(cap(8), MIN_RING_BYTES);
        assert_eq!(cap(64), MIN_RING_BYTES);
        assert_eq!(Geometry::new(1, 0).unwrap().cap, MIN_RING_BYTES);
        assert_eq!(Geometry::new(1, usize::MAX).unwrap().cap, MAX_RING_BYTES);
        assert!(Geometry::new(0, mib).is_err());
        assert!(Geometry::new(MAX_QUEUES + 1, mib).is_err());
    }

    #[test]
    fn rings_and_bells_tile_the_region_without_overlap() {
        for n in [1, 2, 3, 5] {
            let g = Geometry::new(n, 4 << 20).unwrap();
            let mut spans = vec![(0, BELLS)];
            for s in 0..2 {
                for q in 0..n {
                    spans.push((g.bell(s, q), g.bell(s, q) + BELL_BYTES));
                }
            }
            assert!(spans.last().unwrap().1 <= g.header_bytes());
            for d in 0..2 {
                for i in 0..n {
                    for q in 0..n {
                        let r = g.ring(d, i, q);
                        assert_eq!(r.offset % 64, 0);
                        spans.push((r.offset, r.offset + ring::ring_bytes(r.capacity)));
                    }
                }
            }
            spans.sort();
            for w in spans.windows(2) {
                assert!(w[0].1 <= w[1].0, "n {n}: {w:?} overlap");
            }
            assert_eq!(
                spans.last().unwrap().1,
                g.len(),
                "n {n}: no slack at the end"
            );
        }
    }
}
