//! The probe recorder (compiled with the `probes` feature).
#![allow(unsafe_code)]

use crate::{Layer, Snapshot, LAYERS};
use std::cell::RefCell;

/// Reads the time-stamp counter.
#[inline(always)]
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // LFENCE first, so earlier instructions finish before the counter is read and a
        // probe's cost does not blur into its neighbours (the calibrated overhead then holds).
        // SAFETY: LFENCE and RDTSC have no preconditions and touch no memory.
        unsafe {
            core::arch::x86_64::_mm_lfence();
            let t = core::arch::x86_64::_rdtsc();
            core::arch::x86_64::_mm_lfence();
            t
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::time::UNIX_EPOCH
            .elapsed()
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}

/// The recorder's clock: the TSC, or a settable counter in unit tests.
#[inline(always)]
fn clock() -> u64 {
    #[cfg(test)]
    {
        tests::FAKE.with(|f| f.get())
    }
    #[cfg(not(test))]
    {
        rdtsc()
    }
}

struct Rec {
    active: bool,
    cur: Layer,
    last: u64,
    stack: [Layer; 32],
    depth: usize,
    snap: Snapshot,
}

thread_local! {
    /// Checked first by every probe: the one predictable branch paid when off.
    static ACTIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static REC: RefCell<Rec> = const {
        RefCell::new(Rec {
            active: false,
            cur: Layer::Outside,
            last: 0,
            stack: [Layer::Outside; 32],
            depth: 0,
            snap: Snapshot { cycles: [0; LAYERS], entries: [0; LAYERS], children: [0; LAYERS] },
        })
    };
}

/// Leaves the layer when dropped.
pub struct Guard {
    armed: bool,
}

/// Enters `l`; the returned guard leaves it. Nothing is recorded while inactive.
#[inline(always)]
pub fn enter(l: Layer) -> Guard {
    if !ACTIVE.with(|a| a.get()) {
        return Guard { armed: false };
    }
    let armed = REC.with(|r| {
        let mut r = r.borrow_mut();
        if !r.active || r.depth == r.stack.len() {
            return false;
        }
        let t = clock();
        let cur = r.cur as usize;
        r.snap.cycles[cur] += t.wrapping_sub(r.last);
        r.snap.entries[l as usize] += 1;
        r.snap.children[cur] += 1;
        let d = r.depth;
        r.stack[d] = r.cur;
        r.depth += 1;
        r.cur = l;
        r.last = clock();
        true
    });
    Guard { armed }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        REC.with(|r| {
            let mut r = r.borrow_mut();
            let t = clock();
            let cur = r.cur as usize;
            r.snap.cycles[cur] += t.wrapping_sub(r.last);
            r.depth -= 1;
            let d = r.depth;
            r.cur = r.stack[d];
            r.last = clock();
        });
    }
}

/// Starts recording on this thread (time until the first probe counts as `Outside`).
pub fn activate() {
    ACTIVE.with(|a| a.set(true));
    REC.with(|r| {
        let mut r = r.borrow_mut();
        r.active = true;
        r.cur = Layer::Outside;
        r.depth = 0;
        r.last = clock();
    });
}

/// Stops recording on this thread.
pub fn deactivate() {
    ACTIVE.with(|a| a.set(false));
    REC.with(|r| {
        let mut r = r.borrow_mut();
        let t = clock();
        let cur = r.cur as usize;
        r.snap.cycles[cur] += t.wrapping_sub(r.last);
        r.active = false;
    });
}

/// Returns and clears what was recorded.
pub fn take() -> Snapshot {
    REC.with(|r| std::mem::take(&mut r.borrow_mut().snap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        pub(super) static FAKE: Cell<u64> = const { Cell::new(0) };
    }

    fn at(t: u64) {
        FAKE.with(|f| f.set(t));
    }

    #[test]
    fn nested_layers_are_charged_exclusively() {
        take();
        at(0);
        activate();
        at(10);
        let a = enter(Layer::TcpOutput);
        at(110);
        let b = enter(Layer::IpOutput);
        at(160);
        drop(b);
        at(185);
        drop(a);
        at(200);
        deactivate();
        let s = take();
        assert_eq!(s.entries[Layer::TcpOutput as usize], 1);
        assert_eq!(s.entries[Layer::IpOutput as usize], 1);
        assert_eq!(s.cycles[Layer::TcpOutput as usize], 100 + 25);
        assert_eq!(s.cycles[Layer::IpOutput as usize], 50);
        assert_eq!(s.cycles[Layer::Outside as usize], 10 + 15);
        assert_eq!(s.children[Layer::Outside as usize], 1);
        assert_eq!(s.children[Layer::TcpOutput as usize], 1);
        assert_eq!(s.children[Layer::IpOutput as usize], 0);
        // Inactive: nothing is recorded.
        let c = enter(Layer::TcpOutput);
        at(1000);
        drop(c);
        assert_eq!(take(), Snapshot::default());
    }
}
