//! Hardware performance counters of the calling thread: the system-call side lives in
//! `flowstack-sys` (all OS `unsafe` in one place); the probes read the counters with RDPMC.
pub use flowstack_sys::perf::{HwCounters, Pmc, N, NAMES};
