//! Hardware performance counters through `perf_event_open(2)`: instructions, cache misses and
//! data-TLB read misses of the calling thread, read as one group. Many VMs expose none; then
//! [`HwCounters::open`] says why and the profiler reports "n/a".
//!
//! Where the kernel allows user-space RDPMC (the event's mmap page has `cap_user_rdpmc`),
//! [`HwCounters::pmc`] gives the counter indices so the probes can read the counters at every
//! layer boundary for a few cycles; otherwise only [`HwCounters::read`] (a system call) works,
//! which is good for whole phases, not for single layers. The RDPMC instruction itself, like
//! the TSC reads, stays in `flowstack-prof`'s probes.
#![allow(unsafe_code)]

use std::io;

/// Number of counters in the group.
pub const N: usize = 3;
/// Their names, in read order.
pub const NAMES: [&str; N] = ["instructions", "cache_misses", "dtlb_misses"];

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_HW_CACHE: u32 = 3;
const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
const PERF_COUNT_HW_CACHE_MISSES: u64 = 3;
// dTLB (3) | read (0 << 8) | miss (1 << 16)
const DTLB_READ_MISS: u64 = 3 | (1 << 16);
const PERF_FORMAT_GROUP: u64 = 1 << 3;

/// The subset of `struct perf_event_attr` we set (the rest stays zero).
#[repr(C)]
#[derive(Default)]
struct Attr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}

/// RDPMC access to an open counter group: what a probe needs to read the counters itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pmc {
    /// RDPMC index of each counter, in the order of [`NAMES`].
    pub index: [u32; N],
    /// Counters are `pmc_width` bits wide: deltas are taken modulo `mask + 1`.
    pub mask: u64,
}

/// An open counter group for the calling thread.
pub struct HwCounters {
    fds: [i32; N],
    /// Each event's mmap'd `perf_event_mmap_page` (null where mmap failed).
    pages: [*const u8; N],
}

/// Offsets in `struct perf_event_mmap_page` (include/uapi/linux/perf_event.h).
const PAGE_INDEX: usize = 12;
const PAGE_CAPABILITIES: usize = 40;
const PAGE_PMC_WIDTH: usize = 48;
/// `cap_user_rdpmc` bit of `capabilities`.
const CAP_USER_RDPMC: u64 = 1 << 2;
const PAGE_SIZE: usize = 4096;

fn open_one(type_: u32, config: u64, group: i32) -> io::Result<i32> {
    let attr = Attr {
        type_,
        size: std::mem::size_of::<Attr>() as u32,
        config,
        read_format: PERF_FORMAT_GROUP,
        // exclude_kernel (bit 5) | exclude_hv (bit 6)
        flags: (1 << 5) | (1 << 6),
        ..Default::default()
    };
    // SAFETY: perf_event_open reads `attr` (valid for its declared size); pid 0 = this
    // thread, cpu -1 = any.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
            0,
            -1,
            group,
            0,
        )
    };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fd as i32)
    }
}

impl HwCounters {
    /// Opens the group, or explains why the machine has no counters.
    pub fn open() -> Result<Self, String> {
        let lead = open_one(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, -1)
            .map_err(|e| format!("hardware counters not available ({e})"))?;
        let miss = open_one(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES, lead);
        let tlb = open_one(PERF_TYPE_HW_CACHE, DTLB_READ_MISS, lead);
        match (miss, tlb) {
            (Ok(m), Ok(t)) => {
                let fds = [lead, m, t];
                let pages = fds.map(|fd| {
                    // SAFETY: maps the first (metadata) page of a perf event we opened,
                    // read-only; unmapped in Drop.
                    let p = unsafe {
                        libc::mmap(
                            std::ptr::null_mut(),
                            PAGE_SIZE,
                            libc::PROT_READ,
                            libc::MAP_SHARED,
                            fd,
                            0,
                        )
                    };
                    if p == libc::MAP_FAILED {
                        std::ptr::null()
                    } else {
                        p as *const u8
                    }
                });
                Ok(Self { fds, pages })
            }
            (m, t) => {
                for fd in [Some(lead), m.ok(), t.ok()].into_iter().flatten() {
                    // SAFETY: closing descriptors we opened.
                    unsafe { libc::close(fd) };
                }
                Err("hardware counters not available (cache/TLB events refused)".into())
            }
        }
    }

    /// Reads the three counters.
    pub fn read(&self) -> [u64; N] {
        let mut buf = [0u64; 1 + N];
        // SAFETY: the group leader returns nr followed by N values into a buffer that large.
        let r = unsafe {
            libc::read(
                self.fds[0],
                buf.as_mut_ptr() as *mut libc::c_void,
                std::mem::size_of_val(&buf),
            )
        };
        if r <= 0 {
            return [0; N];
        }
        [buf[1], buf[2], buf[3]]
    }
}

impl HwCounters {
    /// The counters' RDPMC indices, if user space may read them directly (the probes then
    /// count per layer); `None` if not (counts per phase only, through [`HwCounters::read`]).
    /// Read it right before a measurement: an index changes when the kernel reschedules
    /// the event.
    pub fn pmc(&self) -> Option<Pmc> {
        let mut index = [0u32; N];
        let mut width = 64u16;
        for (i, &page) in self.pages.iter().enumerate() {
            if page.is_null() {
                return None;
            }
            // SAFETY: `page` is a live read-only mapping of one page; the fields read lie
            // inside it and are naturally aligned. The kernel updates them concurrently,
            // hence volatile reads.
            let (idx, caps, w) = unsafe {
                (
                    std::ptr::read_volatile(page.add(PAGE_INDEX) as *const u32),
                    std::ptr::read_volatile(page.add(PAGE_CAPABILITIES) as *const u64),
                    std::ptr::read_volatile(page.add(PAGE_PMC_WIDTH) as *const u16),
                )
            };
            if caps & CAP_USER_RDPMC == 0 || idx == 0 {
                return None;
            }
            index[i] = idx - 1;
            width = width.min(w.max(1));
        }
        let mask = if width >= 64 {
            u64::MAX
        } else {
            (1u64 << width) - 1
        };
        Some(Pmc { index, mask })
    }
}

impl Drop for HwCounters {
    fn drop(&mut self) {
        for p in self.pages.into_iter().filter(|p| !p.is_null()) {
            // SAFETY: unmapping the page mapped in `open`.
            unsafe { libc::munmap(p as *mut libc::c_void, PAGE_SIZE) };
        }
        for fd in self.fds {
            // SAFETY: closing descriptors we own.
            unsafe { libc::close(fd) };
        }
    }
}

/// How disturbed the calling thread has been: its context switches so far (voluntary and
/// involuntary) and the CPU it runs on now. The profiler discards a sample whose switch count
/// or CPU changed during it.
pub fn disturbance() -> (u64, i32) {
    // SAFETY: getrusage writes into the zeroed struct we pass; sched_getcpu has no arguments.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ((ru.ru_nvcsw + ru.ru_nivcsw) as u64, libc::sched_getcpu())
    }
}
