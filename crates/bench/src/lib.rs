//! flowstack's measurements as a library, so that the `flowstack` command only parses
//! arguments and prints, and other drivers (scripts, the simulator's validation) can run them.
//!
//! - **bench** ([`spec`], [`run`](mod@run)): the same workload (the `apps` crate's stream/rr/crr
//!   [`App`](flowstack_api::App)s) on flowstack — two processes over the shm wire, or one
//!   process over the in-process pipe — on the kernel over loopback, and on smoltcp; results
//!   in the [`flowstack_prof::report`] schema. The server side of a two-process run is this
//!   same executable started as [`SERVER_SUBCOMMAND`] `--spec JSON`: a binary that uses
//!   [`run::run`] must route that subcommand to [`serve`].
//! - **bench --cores N** ([`cores`]): both peers split by flow over N cores, each core
//!   running one client and one server shard, results per core and merged.
//! - **bench conns** ([`conns`]): the memory an idle established connection costs (RSS and
//!   the engines' accounting) and the time to open and close many.
//! - **profile** ([`profile`]): seed 000's per-layer experiment — the rigs (two engines
//!   in-process, or one engine on a real link against the kernel), the calibration and the
//!   measuring passes; the pure analysis is [`flowstack_prof::analysis`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conns;
pub mod cores;
pub mod file;
pub mod flowstack;
pub mod kernel;
pub mod offload;
pub mod profile;
pub mod run;
pub mod smol;
pub mod spec;

pub use run::{run, Event};
pub use spec::{BenchSpec, PeerSel, Placement, RunOpts, ServerSpec};

use flowstack_link::sys::{cpu_count, pin_to_cpu};
use std::sync::atomic::AtomicBool;

/// The hidden subcommand that runs a bench server process.
pub const SERVER_SUBCOMMAND: &str = "__bench-server";

/// Pins this thread to `cpu` (modulo the CPU count) where the machine has more than one.
fn pin(cpu: usize) {
    if cpu_count() > 1 {
        let _ = pin_to_cpu(cpu % cpu_count());
    }
}

/// Entry of the server process: serves `spec` (a flowstack engine on the inherited shm wire,
/// or a kernel socket) until `stop` is set, the client's process goes away, or (kernel) the
/// process is killed.
pub fn serve(spec: &ServerSpec, stop: &AtomicBool) -> Result<(), String> {
    match spec.shm_fd {
        Some(fd) => flowstack::serve_shm(spec, fd, stop),
        None => kernel::serve(spec),
    }
}
