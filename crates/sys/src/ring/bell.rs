//! [`Bell`]: the doorbell of one consumer draining several rings.

use super::{Consumer, RingError, Waited, RING_ALIGN};
use crate::sync::{fence, futex, AtomicU32, Ordering};
use crate::SharedRegion;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

#[repr(C, align(64))]
struct BellCtl {
    waiting: AtomicU32,
    doorbell: AtomicU32,
    _pad: [u8; 56],
}

/// Bytes a [`Bell`] takes in its region (a cache line of its own).
pub const BELL_BYTES: usize = std::mem::size_of::<BellCtl>();
#[cfg(not(loom))]
const _: () = assert!(BELL_BYTES == 64);

/// Under loom (see `ring::loom_init`): puts a fresh, idle bell at `offset` of `region`.
#[cfg(all(loom, test))]
pub(crate) fn loom_init(region: &SharedRegion, offset: usize) {
    assert!(offset.is_multiple_of(RING_ALIGN) && offset + BELL_BYTES <= region.len());
    let b = BellCtl {
        waiting: AtomicU32::new(0),
        doorbell: AtomicU32::new(0),
        _pad: [0; 56],
    };
    // SAFETY: BELL_BYTES at `offset` lie inside the mapping (asserted), 64-byte aligned (the
    // base is page-aligned, the offset a multiple of 64); nothing references them yet, and
    // the plain bytes there need no drop.
    unsafe { (region.as_ptr().add(offset) as *mut BellCtl).write(b) }
}

/// A doorbell shared by several rings that one consumer drains (a receive queue fed by several
/// producers, each on its own single-producer ring).
///
/// The bell is a 64-byte block of its own in the region: `waiting` (written by the consumer)
/// and `doorbell` (bumped by producers). The protocol is the ring's ([module docs](super)),
/// with the consumer's check widened to every ring it drains:
///
/// - producer: store `head`, a SeqCst fence, then load the bell's `waiting`; if set, bump
///   `doorbell` and wake it ([`Producer::publish_with`](super::Producer::publish_with));
/// - consumer: load `doorbell`, store `waiting = 1`, a SeqCst fence, load the `head` of
///   *every* ring; sleep on `doorbell` only if all are empty ([`Bell::wait`]).
///
/// For each producer separately, the single total order of SeqCst fences puts either its
/// fence before the consumer's (the consumer's load of that `head` sees the records and it
/// does not sleep) or the consumer's before the producer's (the producer's load of `waiting`
/// sees it raised and rings). A ring then bumps `doorbell` after the consumer read it, so a wake
/// racing the consumer's way into `futex_wait` makes that call return at once. Several
/// producers ringing together cost at most a spurious wake-up, never a lost one.
///
/// A peer process can write the bell at will: that can only cause spurious wake-ups or sleeps
/// that last until their timeout, never an access outside the region.
///
/// At most one consumer waits on a bell; any number of producers ring it.
pub struct Bell {
    _region: Arc<SharedRegion>,
    ctl: NonNull<BellCtl>,
}

// SAFETY: the pointer leads into a mapping kept alive by the Arc'd SharedRegion (Send + Sync);
// the bell holds nothing but that pointer, and everything behind it is atomics.
unsafe impl Send for Bell {}
// SAFETY: as for Send: all access goes through atomics.
unsafe impl Sync for Bell {}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell").finish_non_exhaustive()
    }
}

impl Bell {
    /// The bell at byte `offset` of `region` (a multiple of [`RING_ALIGN`], [`BELL_BYTES`]
    /// inside the region; zero-filled is a valid idle bell).
    pub fn new(region: Arc<SharedRegion>, offset: usize) -> Result<Self, RingError> {
        let end = offset
            .checked_add(BELL_BYTES)
            .ok_or(RingError::Layout("bell ends beyond the address space"))?;
        if end > region.len() {
            return Err(RingError::Layout("bell ends beyond the region"));
        }
        let p = region.as_ptr().wrapping_add(offset);
        if !(p as usize).is_multiple_of(RING_ALIGN) {
            return Err(RingError::Layout("bell offset not 64-byte aligned"));
        }
        let ctl = NonNull::new(p as *mut BellCtl).ok_or(RingError::Layout("null region"))?;
        Ok(Self {
            _region: region,
            ctl,
        })
    }

    #[inline]
    fn ctl(&self) -> &BellCtl {
        // SAFETY: `ctl` points at BELL_BYTES inside the mapping (checked in `new`), 64-byte
        // aligned, and the mapping lives as long as `_region`, i.e. as long as `self`. BellCtl
        // is atomics and padding only, valid for every bit pattern, and atomics on shared
        // pages stay atomic across processes.
        unsafe { self.ctl.as_ref() }
    }

    /// Wakes the consumer if it said it sleeps; returns whether it did. Producers call it
    /// after publishing (as [`Producer::publish_with`](super::Producer::publish_with) does):
    /// its fence orders that store before the look at `waiting`.
    #[inline]
    pub fn ring(&self) -> bool {
        // Pairs with the fence in `Bell::wait`: see above.
        fence(Ordering::SeqCst);
        let b = self.ctl();
        if b.waiting.load(Ordering::Acquire) != 0 {
            b.doorbell.fetch_add(1, Ordering::Release);
            futex::wake(&b.doorbell, 1);
            return true;
        }
        false
    }

    /// Waits for records on any of `rings`, all of whose producers ring this bell: spins for
    /// up to `spin` (bounded by `timeout`), then announces that it sleeps and sleeps on the
    /// doorbell for the rest of `timeout`, unless records arrived.
    pub fn wait(&self, rings: &[Consumer], spin: Duration, timeout: Duration) -> Waited {
        let start = std::time::Instant::now();
        let spin = spin.min(timeout);
        while start.elapsed() < spin {
            if rings.iter().any(Consumer::pending) {
                return Waited::Ready;
            }
            std::hint::spin_loop();
        }
        let rest = timeout.saturating_sub(start.elapsed());
        if rest.is_zero() {
            return Waited::SpunOut;
        }
        let b = self.ctl();
        let bell = b.doorbell.load(Ordering::Relaxed);
        b.waiting.store(1, Ordering::Release);
        // Pairs with the fence in `Bell::ring`: see above.
        fence(Ordering::SeqCst);
        let ready = rings
            .iter()
            .any(|c| c.raw.ctl().head.load(Ordering::Acquire) != c.tail);
        let r = if ready {
            Waited::Ready
        } else {
            futex::wait(&b.doorbell, bell, Some(rest));
            Waited::Slept
        };
        b.waiting.store(0, Ordering::Relaxed);
        r
    }
}
