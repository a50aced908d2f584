//! The probe recorder (compiled with the `probes` feature).
//!
//! One thread-local record of plain `Cell`s (no borrow flag, no lazy initialisation): a probe
//! that finds the recorder inactive costs one thread-local load and a branch. An active probe
//! reads the clock once per boundary and, when per-layer hardware counters are switched on,
//! the counters with RDPMC right after it.
//!
//! Only the "is this layer recorded?" test is inlined at the probe sites; the recording itself
//! ([`Rec::enter`], [`Rec::leave`]) is one out-of-line copy shared by every site and by the
//! calibration loop, so that code placement changes the cost of all probes alike and the
//! calibration sees what the sites pay. With a copy inlined at every site, an unrelated change
//! elsewhere (renaming a thread-local in the harness) moved the receive path's layer sum from
//! 103 % to 117 % of end-to-end; out of line the same two builds gave 102.7 % and 100.7 %.
//! It narrows the layout effect but does not remove it: a later build that only added a
//! report line put the receive path at 107–122 % again (the probes-off receive step of that
//! binary ran in 600–980 cycles from process to process, the probes' excess stayed ~70–115).
#![allow(unsafe_code)]

use crate::counters::{Pmc, N};
use crate::{Layer, Snapshot, LAYERS};
use std::cell::Cell;

/// Deepest nesting of probes recorded; deeper probes are ignored (not charged).
const DEPTH: usize = 32;

/// Reads the time-stamp counter.
#[inline(always)]
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // LFENCE on both sides: earlier instructions finish before the counter is read and
        // later ones wait for it. For measuring windows around whole steps; the probes use
        // the lighter `probe_tsc`.
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

/// Reads hardware counter `idx` (an RDPMC index the kernel published for this thread).
#[inline(always)]
#[cfg_attr(test, allow(dead_code))]
fn rdpmc(idx: u32) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let (lo, hi): (u32, u32);
        // SAFETY: called only while a `Pmc` is installed, i.e. with indices read from perf
        // mmap pages whose `cap_user_rdpmc` bit was set: user-space RDPMC is then allowed for
        // them. The instruction reads registers only.
        unsafe {
            core::arch::asm!("rdpmc", in("ecx") idx, out("eax") lo, out("edx") hi,
                options(nomem, nostack, preserves_flags));
        }
        (hi as u64) << 32 | lo as u64
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = idx;
        0
    }
}

/// Reads the TSC at a probe boundary with RDTSCP.
///
/// RDTSCP waits for earlier instructions to execute but lets later ones start, so the work
/// around a probe still overlaps a little. A full LFENCE on both sides (as [`rdtsc`] does)
/// drains the pipeline: measured on this project's 2-core VM, each top-level probe then cost
/// 25–40 cycles more in real code than the empty calibration pair did, and the receive
/// path's layer sum came out at 110–115 % of its end-to-end cost; with RDTSCP 99–111 % (10
/// runs of `flowstack profile`, 4 sizes). It is used unconditionally — even a predictable branch
/// choosing the instruction at each boundary measurably moved the sums — and recording
/// refuses to start on a CPU without it ([`supported`]).
#[inline(always)]
#[cfg_attr(test, allow(dead_code))]
fn probe_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let mut aux = 0u32;
        // SAFETY: only reached while recording, which `activate_only` starts only after
        // `supported` found RDTSCP; the instruction writes only `aux`, a local.
        unsafe { core::arch::x86_64::__rdtscp(&mut aux) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        rdtsc()
    }
}

/// Whether this CPU can record: it needs RDTSCP (CPUID leaf 0x8000_0001, EDX bit 27).
/// Asked once (CPUID leaves a VM).
pub fn supported() -> Result<(), &'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let has = *HAS.get_or_init(|| {
            // SAFETY: CPUID exists on every x86_64 CPU (the intrinsic is safe on newer Rust,
            // hence the allow); leaf 0x8000_0000 gives the highest extended leaf, checked
            // before 0x8000_0001 is asked for.
            #[allow(unused_unsafe)]
            unsafe {
                let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
                max >= 0x8000_0001 && core::arch::x86_64::__cpuid(0x8000_0001).edx & (1 << 27) != 0
            }
        });
        if !has {
            return Err("the CPU has no RDTSCP instruction, which the probes read the clock with");
        }
    }
    Ok(())
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
        probe_tsc()
    }
}

/// The hardware counters' current values (fake ones in unit tests).
#[inline(always)]
fn events(pmc: &Pmc) -> [u64; N] {
    #[cfg(test)]
    {
        let _ = pmc;
        tests::FAKE_EVENTS.with(|f| f.get())
    }
    #[cfg(not(test))]
    {
        [
            rdpmc(pmc.index[0]),
            rdpmc(pmc.index[1]),
            rdpmc(pmc.index[2]),
        ]
    }
}

struct Rec {
    /// Bit `1 << layer` set while that layer is recorded; 0 when inactive.
    enabled: Cell<u32>,
    cur: Cell<usize>,
    last: Cell<u64>,
    depth: Cell<usize>,
    stack: [Cell<u8>; DEPTH],
    cycles: [Cell<u64>; LAYERS],
    entries: [Cell<u32>; LAYERS],
    children: [Cell<u32>; LAYERS],
    nest: [Cell<u32>; LAYERS * LAYERS],
    pmc: Cell<Option<Pmc>>,
    events_last: Cell<[u64; N]>,
    events: [Cell<[u64; N]>; LAYERS],
}

thread_local! {
    static REC: Rec = const {
        Rec {
            enabled: Cell::new(0),
            cur: Cell::new(0),
            last: Cell::new(0),
            depth: Cell::new(0),
            stack: [const { Cell::new(0) }; DEPTH],
            cycles: [const { Cell::new(0) }; LAYERS],
            entries: [const { Cell::new(0) }; LAYERS],
            children: [const { Cell::new(0) }; LAYERS],
            nest: [const { Cell::new(0) }; LAYERS * LAYERS],
            pmc: Cell::new(None),
            events_last: Cell::new([0; N]),
            events: [const { Cell::new([0; N]) }; LAYERS],
        }
    };
}

impl Rec {
    /// Charges everything since the previous boundary to the current layer.
    #[inline(always)]
    fn boundary(&self) {
        let t = clock();
        let cur = self.cur.get();
        let c = &self.cycles[cur];
        c.set(c.get().wrapping_add(t.wrapping_sub(self.last.get())));
        self.last.set(t);
        if let Some(pmc) = self.pmc.get() {
            let now = events(&pmc);
            let last = self.events_last.replace(now);
            let mut acc = self.events[cur].get();
            for j in 0..N {
                acc[j] = acc[j].wrapping_add(now[j].wrapping_sub(last[j]) & pmc.mask);
            }
            self.events[cur].set(acc);
        }
    }
}

/// Leaves the layer when dropped.
pub struct Guard {
    armed: bool,
}

/// Enters `l`; the returned guard leaves it. Nothing is recorded while inactive.
#[inline(always)]
pub fn enter(l: Layer) -> Guard {
    REC.with(|r| {
        if r.enabled.get() & (1 << l as u32) == 0 {
            return Guard { armed: false };
        }
        Guard { armed: r.enter(l) }
    })
}

impl Rec {
    /// Records entering `l`; false if nesting is too deep to record it.
    #[inline(never)]
    fn enter(&self, l: Layer) -> bool {
        let d = self.depth.get();
        if d == DEPTH {
            return false;
        }
        self.boundary();
        let cur = self.cur.get();
        self.stack[d].set(cur as u8);
        self.depth.set(d + 1);
        self.children[cur].set(self.children[cur].get() + 1);
        let li = l as usize;
        self.entries[li].set(self.entries[li].get() + 1);
        let n = &self.nest[cur * LAYERS + li];
        n.set(n.get() + 1);
        self.cur.set(li);
        true
    }

    /// Records leaving the current layer.
    #[inline(never)]
    fn leave(&self) {
        let d = self.depth.get();
        if self.enabled.get() == 0 || d == 0 {
            return;
        }
        self.boundary();
        self.depth.set(d - 1);
        self.cur.set(self.stack[d - 1].get() as usize);
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        if self.armed {
            REC.with(|r| r.leave());
        }
    }
}

/// Starts recording every layer on this thread (time until the first probe counts as
/// `Outside`).
pub fn activate() {
    activate_only(u32::MAX);
}

/// Starts recording on this thread, only the layers whose bit (`1 << layer`) is set in
/// `mask`: the probes of the others do nothing, so their time counts to whichever recorded
/// layer encloses them (inclusive measurement of a layer with only its own probes' cost).
/// Does nothing where [`supported`] fails.
pub fn activate_only(mask: u32) {
    if supported().is_err() {
        return;
    }
    REC.with(|r| {
        r.cur.set(Layer::Outside as usize);
        r.depth.set(0);
        r.enabled.set(mask & !1);
        if let Some(pmc) = r.pmc.get() {
            r.events_last.set(events(&pmc));
        }
        r.last.set(clock());
    });
}

/// Stops recording on this thread.
pub fn deactivate() {
    REC.with(|r| {
        if r.enabled.get() != 0 {
            r.boundary();
            r.enabled.set(0);
        }
    });
}

/// Counts hardware events per layer from now on (`Some`), or stops doing so (`None`).
/// Takes effect at the next [`activate`].
pub fn use_counters(pmc: Option<Pmc>) {
    REC.with(|r| r.pmc.set(pmc));
}

/// Returns and clears what was recorded.
pub fn take() -> Snapshot {
    REC.with(|r| {
        let mut s = Snapshot::default();
        for l in 0..LAYERS {
            s.cycles[l] = r.cycles[l].replace(0);
            s.entries[l] = r.entries[l].replace(0);
            s.children[l] = r.children[l].replace(0);
            s.events[l] = r.events[l].replace([0; N]);
            for c in 0..LAYERS {
                s.nest[l][c] = r.nest[l * LAYERS + c].replace(0);
            }
        }
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        pub(super) static FAKE: Cell<u64> = const { Cell::new(0) };
        pub(super) static FAKE_EVENTS: Cell<[u64; N]> = const { Cell::new([0; N]) };
    }

    fn at(t: u64) {
        FAKE.with(|f| f.set(t));
    }

    fn events_at(e: [u64; N]) {
        FAKE_EVENTS.with(|f| f.set(e));
    }

    /// Records, with the layers in `mask`, TCP output (10..200) calling IP output (110..185).
    fn tcp_output_calling_ip_output(mask: u32) -> Snapshot {
        use_counters(None);
        take();
        at(0);
        activate_only(mask);
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
        take()
    }

    #[test]
    fn nested_layers_are_charged_exclusively() {
        let s = tcp_output_calling_ip_output(u32::MAX);
        assert_eq!(s.entries[Layer::TcpOutput as usize], 1);
        assert_eq!(s.entries[Layer::IpOutput as usize], 1);
        assert_eq!(s.cycles[Layer::TcpOutput as usize], 100 + 25);
        assert_eq!(s.cycles[Layer::IpOutput as usize], 50);
        assert_eq!(s.cycles[Layer::Outside as usize], 10 + 15);
        assert_eq!(s.children[Layer::Outside as usize], 1);
        assert_eq!(s.children[Layer::TcpOutput as usize], 1);
        assert_eq!(s.children[Layer::IpOutput as usize], 0);
        assert_eq!(
            s.nest[Layer::Outside as usize][Layer::TcpOutput as usize],
            1
        );
        assert_eq!(
            s.nest[Layer::TcpOutput as usize][Layer::IpOutput as usize],
            1
        );
        assert_eq!(s.nest.iter().flatten().sum::<u32>(), 2);
        assert_eq!(s.events, Snapshot::default().events);
        // Inactive: nothing is recorded.
        let c = enter(Layer::TcpOutput);
        at(1000);
        drop(c);
        assert_eq!(take(), Snapshot::default());
    }

    #[test]
    fn a_masked_recording_charges_unrecorded_layers_to_their_recorded_parent() {
        // IP output is not recorded: its time stays in TCP output.
        let s = tcp_output_calling_ip_output(1 << Layer::TcpOutput as u32);
        assert_eq!(s.cycles[Layer::TcpOutput as usize], 175);
        assert_eq!(s.cycles[Layer::IpOutput as usize], 0);
        assert_eq!(s.entries[Layer::IpOutput as usize], 0);
        assert_eq!(s.children[Layer::TcpOutput as usize], 0);
        assert_eq!(s.cycles[Layer::Outside as usize], 25);
    }

    #[test]
    fn hardware_events_are_charged_per_layer_and_wrap_at_the_counter_width() {
        // 48-bit counters, as x86 PMUs publish in pmc_width.
        let mask = (1u64 << 48) - 1;
        use_counters(Some(Pmc {
            index: [0, 1, 2],
            mask,
        }));
        take();
        at(0);
        events_at([mask - 5, 100, 7]);
        activate();
        events_at([mask - 5 + 20, 130, 7]); // 20 instructions outside
        let a = enter(Layer::TcpInput);
        // The first counter wraps past 2^48 inside TCP input.
        events_at([(mask - 5 + 20 + 300) & mask, 131, 9]);
        let b = enter(Layer::SockAppend);
        events_at([(mask - 5 + 20 + 300 + 40) & mask, 131, 9]);
        drop(b);
        events_at([(mask - 5 + 20 + 300 + 40 + 1) & mask, 131, 9]);
        drop(a);
        deactivate();
        let s = take();
        assert_eq!(s.events[Layer::Outside as usize], [20, 30, 0]);
        assert_eq!(s.events[Layer::TcpInput as usize], [301, 1, 2]);
        assert_eq!(s.events[Layer::SockAppend as usize], [40, 0, 0]);
        use_counters(None);
    }

    #[test]
    fn too_deep_nesting_is_ignored_and_unbalanced_drops_are_harmless() {
        use_counters(None);
        take();
        at(0);
        activate();
        let mut guards = Vec::new();
        for _ in 0..DEPTH + 3 {
            guards.push(enter(Layer::Engine));
        }
        at(64);
        // A guard outliving the recording period does nothing when dropped.
        deactivate();
        drop(guards);
        let s = take();
        assert_eq!(s.entries[Layer::Engine as usize] as usize, DEPTH);
        assert_eq!(s.cycles[Layer::Engine as usize], 64);
        activate();
        deactivate();
        assert_eq!(take().entries, [0; LAYERS]);
    }
}
