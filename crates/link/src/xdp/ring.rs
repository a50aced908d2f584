//! One AF_XDP ring as user space sees it: a power-of-two array of descriptors with a
//! producer and a consumer index (free-running `u32`s, wrapping) and a flags word, all in
//! memory shared with the kernel.
//!
//! Fill and TX rings are produced here and consumed by the kernel; RX and completion rings
//! the other way round. Each side keeps a cached copy of the other side's index and reads the
//! shared one (acquire) only when the cache says the ring looks full or empty; it publishes
//! its own index (release) once per batch.

use std::sync::atomic::{AtomicU32, Ordering};

/// `XDP_RING_NEED_WAKEUP`.
const NEED_WAKEUP: u32 = 1;

/// A ring of `T` (u64 frame addresses for fill/completion, `xdp_desc` for RX/TX).
pub(crate) struct Ring<T: Copy> {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut T,
    mask: u32,
    /// Our own index (producer rings: the next slot to fill; consumer rings: the next to read).
    local: u32,
    /// The cached index of the other side.
    cached: u32,
}

impl<T: Copy> Ring<T> {
    /// A ring over memory laid out as the kernel's `xdp_ring_offset` describes.
    ///
    /// # Safety
    /// `base + producer`, `+ consumer` and `+ flags` must be 4-byte aligned `u32`s and
    /// `base + desc` an array of `size` `T`s, all inside one mapping that outlives the ring
    /// and is only touched by this ring and the other side; `size` a power of two.
    pub(crate) unsafe fn new(
        base: *mut u8,
        producer: usize,
        consumer: usize,
        flags: usize,
        desc: usize,
        size: u32,
    ) -> Self {
        debug_assert!(size.is_power_of_two());
        // SAFETY: the caller guarantees the offsets lie inside the mapping.
        let (p, c, f, d) = unsafe {
            (
                base.add(producer) as *const AtomicU32,
                base.add(consumer) as *const AtomicU32,
                base.add(flags) as *const AtomicU32,
                base.add(desc) as *mut T,
            )
        };
        // SAFETY: p and c are valid, aligned u32s (caller), read atomically.
        let (prod, cons) = unsafe { ((*p).load(Ordering::Acquire), (*c).load(Ordering::Acquire)) };
        Ring {
            producer: p,
            consumer: c,
            flags: f,
            desc: d,
            mask: size - 1,
            local: 0,
            cached: 0,
        }
        .with_indices(prod, cons)
    }

    /// Starts as a producer ring (ours: the producer index; cached: the consumer's);
    /// [`Ring::into_consumer`] swaps the roles.
    fn with_indices(mut self, prod: u32, cons: u32) -> Self {
        self.local = prod;
        self.cached = cons;
        self
    }

    fn shared(&self, which: *const AtomicU32) -> &AtomicU32 {
        // SAFETY: `which` is one of this ring's index words (see `new`).
        unsafe { &*which }
    }

    /// The number of slots.
    pub(crate) fn size(&self) -> u32 {
        self.mask + 1
    }

    /// True if the kernel asks to be woken (`XDP_RING_NEED_WAKEUP`).
    pub(crate) fn needs_wakeup(&self) -> bool {
        self.shared(self.flags).load(Ordering::Relaxed) & NEED_WAKEUP != 0
    }

    // ---- producer side (fill, TX) ----

    /// Free slots (producer rings), refreshing the consumer index when the cache says full.
    pub(crate) fn free(&mut self) -> u32 {
        let used = self.local.wrapping_sub(self.cached);
        if used < self.size() {
            return self.size() - used;
        }
        self.cached = self.shared(self.consumer).load(Ordering::Acquire);
        self.size() - self.local.wrapping_sub(self.cached)
    }

    /// Writes `v` in the next slot; the caller checked [`Ring::free`]. Not visible to the
    /// kernel before [`Ring::submit`].
    pub(crate) fn push(&mut self, v: T) {
        let i = (self.local & self.mask) as usize;
        // SAFETY: i <= mask < size, inside the descriptor array; the slot is free (the
        // consumer has passed it), so the kernel does not read it now.
        unsafe { self.desc.add(i).write_volatile(v) };
        self.local = self.local.wrapping_add(1);
    }

    /// Publishes every pushed slot.
    pub(crate) fn submit(&mut self) {
        self.shared(self.producer)
            .store(self.local, Ordering::Release);
    }

    /// Slots pushed and not yet taken by the kernel (producer rings).
    pub(crate) fn in_flight(&self) -> u32 {
        self.local
            .wrapping_sub(self.shared(self.consumer).load(Ordering::Acquire))
    }

    // ---- consumer side (RX, completion) ----

    /// Filled slots waiting to be read (consumer rings).
    pub(crate) fn available(&mut self) -> u32 {
        // For a consumer ring, `local` is our consumer index and `cached` the producer's.
        let n = self.cached.wrapping_sub(self.local);
        if n > 0 {
            return n;
        }
        self.cached = self.shared(self.producer).load(Ordering::Acquire);
        self.cached.wrapping_sub(self.local)
    }

    /// True if the producer has published slots not yet read (consumer rings), without
    /// touching the cache.
    pub(crate) fn peek_pending(&self) -> bool {
        self.shared(self.producer).load(Ordering::Acquire) != self.local
    }

    /// The `i`-th available slot; `i < available()`.
    pub(crate) fn peek(&self, i: u32) -> T {
        let at = (self.local.wrapping_add(i) & self.mask) as usize;
        // SAFETY: at <= mask, inside the array; the producer published it (acquire above)
        // and does not rewrite it before we release it.
        unsafe { self.desc.add(at).read_volatile() }
    }

    /// Hands `n` read slots back to the producer.
    pub(crate) fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.shared(self.consumer)
            .store(self.local, Ordering::Release);
    }

    /// Makes this a consumer ring: our index is the consumer's, the cache the producer's.
    pub(crate) fn into_consumer(mut self) -> Self {
        std::mem::swap(&mut self.local, &mut self.cached);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory laid out like a kernel ring: producer at 0, consumer at 64, flags at 128,
    /// descriptors at 192.
    struct Mem(Vec<u64>);
    impl Mem {
        fn new(size: usize) -> Self {
            Mem(vec![0; 24 + size])
        }
        fn base(&mut self) -> *mut u8 {
            self.0.as_mut_ptr() as *mut u8
        }
        fn word(&mut self, at: usize) -> &AtomicU32 {
            // SAFETY: at is 0, 64 or 128, inside the vector, aligned.
            unsafe { &*(self.base().add(at) as *const AtomicU32) }
        }
        fn set_start(&mut self, v: u32) {
            self.word(0).store(v, Ordering::Relaxed);
            self.word(64).store(v, Ordering::Relaxed);
        }
    }

    fn ring(m: &mut Mem, size: u32) -> Ring<u64> {
        // SAFETY: the layout above, sized for `size` descriptors; `m` outlives the ring.
        unsafe { Ring::new(m.base(), 0, 64, 128, 192, size) }
    }

    #[test]
    fn a_full_producer_ring_refuses_until_the_kernel_consumes() {
        let mut m = Mem::new(8);
        let mut r = ring(&mut m, 8);
        assert_eq!(r.free(), 8);
        for v in 0..8 {
            r.push(v);
        }
        r.submit();
        assert_eq!(r.free(), 0, "every slot is in flight");
        assert_eq!(r.in_flight(), 8);
        // The kernel consumes three.
        m.word(64).store(3, Ordering::Release);
        assert_eq!(r.free(), 3);
        assert_eq!(r.in_flight(), 5);
    }

    #[test]
    fn indices_wrap_around_u32_and_the_slot_array() {
        let mut m = Mem::new(4);
        // Start just below the u32 wrap, as a long-running socket reaches it.
        m.set_start(u32::MAX - 2);
        let mut p = ring(&mut m, 4);
        let mut m2 = Mem::new(4);
        m2.set_start(u32::MAX - 2);
        let mut c = ring(&mut m2, 4).into_consumer();
        let mut next = 0u64;
        let mut got = Vec::new();
        for _round in 0..5 {
            let n = p.free();
            for _ in 0..n {
                p.push(next);
                next += 1;
            }
            p.submit();
            // The "kernel" moves what the producer published to the consumer ring.
            let prod = m.word(0).load(Ordering::Acquire);
            let mut cons = m.word(64).load(Ordering::Acquire);
            while cons != prod {
                // SAFETY: slot index masked into the 4-entry array.
                let v = unsafe { *(m.base().add(192) as *const u64).add((cons & 3) as usize) };
                let at = m2.word(0).load(Ordering::Relaxed);
                // SAFETY: as above, in the consumer ring's array.
                unsafe { *(m2.base().add(192) as *mut u64).add((at & 3) as usize) = v };
                m2.word(0).store(at.wrapping_add(1), Ordering::Release);
                cons = cons.wrapping_add(1);
            }
            m.word(64).store(cons, Ordering::Release);
            let k = c.available();
            for i in 0..k {
                got.push(c.peek(i));
            }
            c.release(k);
        }
        assert_eq!(got, (0..next).collect::<Vec<_>>());
        assert!(
            next >= 16,
            "several trips round the ring and across the u32 wrap"
        );
        assert!(
            m2.word(64).load(Ordering::Relaxed) < 100,
            "the consumer index wrapped"
        );
    }
}
