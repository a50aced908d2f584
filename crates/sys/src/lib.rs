//! flowstack's ground floor for the operating system: the `unsafe` that more than one crate
//! needs, each block with a `// SAFETY:` comment, behind a safe API.
//!
//! | module | what |
//! |---|---|
//! | [`affinity`] | pin the calling thread to a CPU, unpin, online CPUs, the allowed set |
//! | [`futex`] | wait on / wake an `AtomicU32` that may live in memory shared between processes |
//! | [`eventfd`] | a counter descriptor to signal and wait on, with a raw fd for `poll` |
//! | [`poll`] | wait for one descriptor to become readable |
//! | [`region`] | [`SharedRegion`]: a sealed memfd mapped shared, by name and size or from a received fd |
//! | [`ring`] | the lock-free single-producer/single-consumer ring of variable-length records over a region, with a futex doorbell — its own, or a [`ring::Bell`] shared by the rings one consumer drains |
//! | [`file`](mod@file) | `pwritev` from a list of borrowed slices |
//! | [`filemap`] | read-only shared windows of a file, and the process-wide `SIGBUS` guard that turns a truncated file's missing pages into zeros and a flag instead of a crash |
//! | [`fdpass`] | send and receive file descriptors over a unix socket (`SCM_RIGHTS`) |
//! | [`socket`] | socket options the tools set on kernel sockets (`TCP_QUICKACK`) |
//! | [`pipe`] | a fused loopback connection's two byte rings in one memfd both applications map: copies in and out, wake-up flags, untrusted header |
//! | [`placeholder`] | the socket pair that stands for an offloaded socket: tokens, filler, last close, inode |
//! | [`wake`] | an application's wake-up channel: a pipe whose write end the daemon opens again as its own |
//! | [`process`] | is a process (the peer of a shared region) still alive? |
//! | [`bpf`] | the `bpf(2)` commands of the AF_XDP driver: an `XSKMAP`, the built-in redirect program, its attachment through a BPF link |
//! | [`perf`] | hardware counters of the calling thread (`perf_event_open(2)`, their RDPMC metadata page) and its context switches and CPU, for the profiler |
//!
//! Where a well-kept crate wraps a system call safely we use it and write no `unsafe` at all:
//! `rustix` for the calls whose arguments are values, descriptors and slices, `memmap2`'s
//! `MmapRaw` for mapping (it hands out raw pointers only, so mapping needs no `unsafe`). What
//! is left is ours: turning pointers into shared memory into atomics and slices ([`ring`],
//! [`region`]), `sysconf`, which `rustix` does not offer ([`affinity::cpu_count`]), and
//! `fork`/`_exit` for tests of process-shared sockets ([`process::fork`]).
//!
//! Not here: the TSC and RDPMC instructions of the profiler's probes (`flowstack-prof`), and the
//! link drivers' driver-specific `ioctl`/socket calls.
//!
//! Memory shared with another process is untrusted input: whatever this crate reads from it
//! (indices, lengths, process ids) is validated before use and a bad value is an error, never a
//! panic or an access outside the mapping.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod affinity;
pub mod bpf;
pub mod eventfd;
pub mod fdpass;
pub mod file;
pub mod filemap;
pub mod futex;
#[doc(hidden)]
pub mod fuzzing;
pub mod ownfd;
pub mod perf;
pub mod pipe;
pub mod placeholder;
pub mod poll;
pub mod process;
pub mod region;
pub mod ring;
pub mod socket;
mod sync;
pub mod wake;

pub use region::SharedRegion;
