//! The per-process file descriptor table: which descriptors are flowstack placeholders.
//!
//! One `AtomicU64` per descriptor number, so a `read` or `write` on an ordinary file costs one
//! load of zero. Lock-free: the entry of a descriptor is written by the call that created or
//! closed that descriptor, and the kernel hands a number to one call at a time.
//!
//! What the table caches and why:
//! - `O_NONBLOCK` belongs to the open file description, which dup and fork share. The shim
//!   also sets it on the placeholder in the kernel (which is the truth); the cached bit saves
//!   a system call on the data path. A change made through another descriptor of the same
//!   description after a `dup` is seen by the blocking path, which asks the kernel before it
//!   sleeps (`F_GETFL`), but not by the non-blocking one.
//! - `FD_CLOEXEC` is not cached: it is the placeholder's own flag in the kernel, so exec closes
//!   the placeholder by itself.
//! - Family, type and `IPV6_V6ONLY`, and the options to replay on a kernel socket if the
//!   socket has to move to the kernel (see `shim::to_kernel`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Descriptor numbers the table covers; a flowstack socket whose placeholder gets a larger
/// number moves to the kernel (counted as `fd_too_high`).
pub const MAX_FDS: usize = 1 << 16;

/// The daemon's number for a socket of this process.
pub type SockId = u32;

const VALID: u64 = 1 << 32;
const INET6: u64 = 1 << 33;
const DGRAM: u64 = 1 << 34;
const NONBLOCK: u64 = 1 << 35;
const V6ONLY: u64 = 1 << 36;
const LISTENING: u64 = 1 << 37;
const BOUND: u64 = 1 << 38;
const OPT_SHIFT: u32 = 40;

/// Options recorded so that they can be set again on a kernel socket.
pub mod opt {
    /// SO_REUSEADDR.
    pub const REUSEADDR: u8 = 1;
    /// SO_REUSEPORT.
    pub const REUSEPORT: u8 = 2;
    /// TCP_NODELAY.
    pub const NODELAY: u8 = 4;
    /// SO_KEEPALIVE.
    pub const KEEPALIVE: u8 = 8;
}

/// What the table knows about one placeholder descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The socket it stands for.
    pub id: SockId,
    /// Created as AF_INET6 (addresses are returned v4-mapped).
    pub inet6: bool,
    /// SOCK_DGRAM (else SOCK_STREAM).
    pub dgram: bool,
    /// O_NONBLOCK (cached; see the module docs).
    pub nonblock: bool,
    /// IPV6_V6ONLY was set.
    pub v6only: bool,
    /// listen() succeeded.
    pub listening: bool,
    /// bind() was called by the application.
    pub bound: bool,
    /// Replayable options (`opt::*` bits).
    pub opts: u8,
}

impl Entry {
    /// A new entry for socket `id`.
    pub fn new(id: SockId, inet6: bool, dgram: bool, nonblock: bool) -> Self {
        Entry {
            id,
            inet6,
            dgram,
            nonblock,
            v6only: false,
            listening: false,
            bound: false,
            opts: 0,
        }
    }

    /// The entry as one word (for `FLOWSTACK_FDS` across exec).
    pub fn to_bits(self) -> u64 {
        self.pack()
    }

    /// The entry from [`Entry::to_bits`]; None for a word that is no entry.
    pub fn from_bits(v: u64) -> Option<Self> {
        Self::unpack(v)
    }

    fn pack(self) -> u64 {
        let mut v = VALID | self.id as u64 | (self.opts as u64) << OPT_SHIFT;
        for (on, bit) in [
            (self.inet6, INET6),
            (self.dgram, DGRAM),
            (self.nonblock, NONBLOCK),
            (self.v6only, V6ONLY),
            (self.listening, LISTENING),
            (self.bound, BOUND),
        ] {
            if on {
                v |= bit;
            }
        }
        v
    }

    fn unpack(v: u64) -> Option<Self> {
        if v & VALID == 0 {
            return None;
        }
        Some(Entry {
            id: v as u32,
            inet6: v & INET6 != 0,
            dgram: v & DGRAM != 0,
            nonblock: v & NONBLOCK != 0,
            v6only: v & V6ONLY != 0,
            listening: v & LISTENING != 0,
            bound: v & BOUND != 0,
            opts: (v >> OPT_SHIFT) as u8,
        })
    }
}

/// Descriptor → placeholder entry, plus the per-descriptor socket timeouts.
pub struct Table {
    slots: Box<[AtomicU64]>,
    /// SO_RCVTIMEO in milliseconds (0: none), per descriptor.
    rcv_timeo: Box<[AtomicU32]>,
    /// SO_SNDTIMEO in milliseconds (0: none), per descriptor.
    snd_timeo: Box<[AtomicU32]>,
    /// The shim's copy of a listener's kernel side, plus one (0: none), per descriptor.
    aux: Box<[AtomicU32]>,
}

impl Default for Table {
    fn default() -> Self {
        Self::new()
    }
}

/// `n` zeroed atomics from the allocator's zeroed pages (calloc): a process that never
/// touches a high descriptor never pays for its slot.
fn zeroed64(n: usize) -> Box<[AtomicU64]> {
    let v: Box<[u64]> = vec![0u64; n].into_boxed_slice();
    // SAFETY: AtomicU64 has the size, alignment and bit validity of u64.
    unsafe { Box::from_raw(Box::into_raw(v) as *mut [AtomicU64]) }
}

fn zeroed32(n: usize) -> Box<[AtomicU32]> {
    let v: Box<[u32]> = vec![0u32; n].into_boxed_slice();
    // SAFETY: AtomicU32 has the size, alignment and bit validity of u32.
    unsafe { Box::from_raw(Box::into_raw(v) as *mut [AtomicU32]) }
}

impl Table {
    /// An empty table covering [`MAX_FDS`] descriptors.
    pub fn new() -> Self {
        Table {
            slots: zeroed64(MAX_FDS),
            rcv_timeo: zeroed32(MAX_FDS),
            snd_timeo: zeroed32(MAX_FDS),
            aux: zeroed32(MAX_FDS),
        }
    }

    fn slot(&self, fd: i32) -> Option<&AtomicU64> {
        usize::try_from(fd).ok().and_then(|i| self.slots.get(i))
    }

    /// The entry of `fd`, if it is a flowstack placeholder. One load.
    #[inline]
    pub fn get(&self, fd: i32) -> Option<Entry> {
        Entry::unpack(self.slot(fd)?.load(Ordering::Acquire))
    }

    /// Records `fd` as a placeholder. False if the number is beyond the table.
    pub fn set(&self, fd: i32, e: Entry) -> bool {
        match self.slot(fd) {
            Some(s) => {
                s.store(e.pack(), Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Changes the entry of `fd` in place (no-op if `fd` is not a placeholder).
    pub fn update(&self, fd: i32, f: impl FnOnce(&mut Entry)) {
        if let Some(mut e) = self.get(fd) {
            f(&mut e);
            self.set(fd, e);
        }
    }

    /// Forgets `fd` (closed, or replaced by a kernel socket); returns what it was.
    pub fn clear(&self, fd: i32) -> Option<Entry> {
        let old = Entry::unpack(self.slot(fd)?.swap(0, Ordering::AcqRel));
        if old.is_some() {
            self.set_timeouts(fd, 0, 0);
            self.set_aux(fd, None);
        }
        old
    }

    /// Copies `from`'s entry and timeouts to `to` (dup); clears `to` if `from` is not ours.
    pub fn copy(&self, from: i32, to: i32) {
        match self.get(from) {
            Some(e) => {
                let (r, s) = self.timeouts(from);
                if self.set(to, e) {
                    self.set_timeouts(to, r, s);
                    self.set_aux(to, self.aux(from));
                }
            }
            None => {
                self.clear(to);
            }
        }
    }

    /// The placeholders in `lo..=hi`.
    pub fn in_range(&self, lo: u32, hi: u32) -> impl Iterator<Item = (i32, Entry)> + '_ {
        let hi = (hi as usize).min(MAX_FDS - 1);
        let lo = lo as usize;
        let span = if lo > hi {
            &[][..]
        } else {
            &self.slots[lo..=hi]
        };
        span.iter().enumerate().filter_map(move |(i, s)| {
            Entry::unpack(s.load(Ordering::Acquire)).map(|e| ((lo + i) as i32, e))
        })
    }

    /// The kernel listener the shim keeps for listening placeholder `fd`.
    pub fn aux(&self, fd: i32) -> Option<i32> {
        let v = self
            .aux
            .get(usize::try_from(fd).ok()?)?
            .load(Ordering::Acquire);
        (v != 0).then(|| v as i32 - 1)
    }

    /// Sets (or clears) [`Table::aux`] of `fd`.
    pub fn set_aux(&self, fd: i32, k: Option<i32>) {
        if let Some(a) = usize::try_from(fd).ok().and_then(|i| self.aux.get(i)) {
            a.store(k.map(|k| k as u32 + 1).unwrap_or(0), Ordering::Release);
        }
    }

    /// (SO_RCVTIMEO, SO_SNDTIMEO) of `fd` in milliseconds, 0 meaning none.
    pub fn timeouts(&self, fd: i32) -> (u32, u32) {
        let i = fd as usize;
        match (self.rcv_timeo.get(i), self.snd_timeo.get(i)) {
            (Some(r), Some(s)) => (r.load(Ordering::Relaxed), s.load(Ordering::Relaxed)),
            _ => (0, 0),
        }
    }

    /// Sets both timeouts of `fd`.
    pub fn set_timeouts(&self, fd: i32, rcv_ms: u32, snd_ms: u32) {
        let i = fd as usize;
        if let (Some(r), Some(s)) = (self.rcv_timeo.get(i), self.snd_timeo.get(i)) {
            r.store(rcv_ms, Ordering::Relaxed);
            s.store(snd_ms, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trips_every_field() {
        let mut e = Entry::new(0xdead_beef, true, false, true);
        e.v6only = true;
        e.bound = true;
        e.opts = opt::REUSEADDR | opt::NODELAY;
        let t = Table::new();
        assert!(t.set(7, e));
        assert_eq!(t.get(7), Some(e));
        let mut f = Entry::new(0, false, true, false);
        f.listening = true;
        assert!(t.set(8, f));
        assert_eq!(
            t.get(8),
            Some(f),
            "id 0 and all-false flags are still an entry"
        );
    }

    #[test]
    fn ordinary_descriptors_are_not_ours() {
        let t = Table::new();
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(-1), None);
        assert_eq!(t.get(MAX_FDS as i32), None);
        assert!(!t.set(MAX_FDS as i32, Entry::new(1, false, false, false)));
    }

    #[test]
    fn clear_forgets_and_a_reused_number_is_not_taken_for_the_old_socket() {
        let t = Table::new();
        t.set(5, Entry::new(3, false, false, false));
        t.set_timeouts(5, 100, 200);
        assert_eq!(t.clear(5).map(|e| e.id), Some(3));
        assert_eq!(t.get(5), None);
        assert_eq!(t.timeouts(5), (0, 0), "timeouts go with the socket");
        assert_eq!(t.aux(5), None);
        assert_eq!(t.clear(5), None);
    }

    #[test]
    fn dup_copies_entry_and_timeouts_and_dup_of_a_file_clears_the_target() {
        let t = Table::new();
        t.set(4, Entry::new(9, false, false, true));
        t.set_timeouts(4, 5, 6);
        t.set_aux(4, Some(0));
        t.copy(4, 10);
        assert_eq!(t.get(10), t.get(4));
        assert_eq!(t.timeouts(10), (5, 6));
        assert_eq!(
            t.aux(10),
            Some(0),
            "descriptor 0 is a valid kernel listener"
        );
        // dup2(file, 10): 10 is no longer a socket.
        t.copy(3, 10);
        assert_eq!(t.get(10), None);
        assert_eq!(t.get(4).map(|e| e.id), Some(9));
    }

    #[test]
    fn update_changes_only_placeholders() {
        let t = Table::new();
        t.update(6, |e| e.nonblock = true);
        assert_eq!(t.get(6), None);
        t.set(6, Entry::new(1, false, false, false));
        t.update(6, |e| e.nonblock = true);
        assert!(t.get(6).unwrap().nonblock);
    }

    #[test]
    fn range_lists_placeholders_within_bounds() {
        let t = Table::new();
        for fd in [3, 9, 100, MAX_FDS as i32 - 1] {
            t.set(fd, Entry::new(fd as u32, false, false, false));
        }
        let got: Vec<i32> = t.in_range(4, 200).map(|(fd, _)| fd).collect();
        assert_eq!(got, vec![9, 100]);
        let all: Vec<i32> = t.in_range(0, u32::MAX).map(|(fd, _)| fd).collect();
        assert_eq!(all, vec![3, 9, 100, MAX_FDS as i32 - 1]);
        assert_eq!(t.in_range(300, 200).count(), 0);
    }
}
