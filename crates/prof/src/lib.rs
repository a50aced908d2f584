//! Per-layer probes (seed 000's method on flowstack's own layers).
//!
//! Code marks a layer with `let _p = flowstack_prof::enter(Layer::TcpOutput);`. While a
//! thread's recorder is active, the time-stamp counter is read at every layer boundary and the
//! cycles between two boundaries are charged to the layer that was running, so nested layers
//! are counted *exclusively* (TCP output's figure excludes the IPv4 output it calls) and the
//! layers of one path add up to the path's cost.
//!
//! Hardware counters (instructions, cache misses, dTLB misses) are charged per layer the same
//! way when the machine lets user space read them with RDPMC ([`counters::HwCounters`]).
//!
//! The measurement's pure side lives here too: the statistics of the method ([`stats`]), the
//! per-layer analysis of raw samples ([`analysis`]) and the typed report schemas of
//! `flowstack profile --json` and `flowstack bench --json` ([`report`]), which other programs
//! (the architecture simulator) read without linking the stack or the CLI.
//!
//! Free when off: without the `probes` cargo feature `enter` is an empty inline function; with
//! it, an inactive recorder costs one thread-local load and one predictable branch.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod analysis;
pub mod counters;
pub mod report;
pub mod stats;

/// A layer boundary the stack marks (in report JSON, by its variant name: `"TcpOutput"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum Layer {
    /// Time outside every probe (the harness's own loop).
    Outside = 0,
    /// Application → socket send buffer copy.
    AppCopyIn,
    /// TCP output: what to send now (window, congestion, Nagle, timers) and the segment's
    /// description; the bytes are written by [`Layer::TcpEmit`].
    TcpOutput,
    /// IPv4 output: routing, header, fragmentation decision.
    IpOutput,
    /// Neighbour (ARP) lookup and Ethernet header.
    EthOutput,
    /// Handing frames to the device.
    DevTx,
    /// Taking frames from the device.
    DevRx,
    /// Ethernet and IPv4 input: parsing, validation, demux to the transport.
    EthIpInput,
    /// TCP input: parse and checksum, connection lookup, header prediction or the full
    /// segment processing.
    TcpInput,
    /// Freeing acknowledged bytes from the send buffer.
    BufRelease,
    /// Appending received bytes to the socket's receive buffer.
    SockAppend,
    /// Socket receive buffer → application copy.
    AppCopyOut,
    /// Engine work between layers (timers, dispatch loop).
    Engine,
    /// TCP output's writing of one segment into the frame the Ethernet layer provides:
    /// header, options, payload copy and checksum (runs inside Ethernet output).
    TcpEmit,
    /// Used to measure the probe's own cost.
    Calibrate,
}

/// Number of layers.
pub const LAYERS: usize = 15;

impl Layer {
    /// Every layer, indexed by its value.
    pub const ALL: [Layer; LAYERS] = [
        Layer::Outside,
        Layer::AppCopyIn,
        Layer::TcpOutput,
        Layer::IpOutput,
        Layer::EthOutput,
        Layer::DevTx,
        Layer::DevRx,
        Layer::EthIpInput,
        Layer::TcpInput,
        Layer::BufRelease,
        Layer::SockAppend,
        Layer::AppCopyOut,
        Layer::Engine,
        Layer::TcpEmit,
        Layer::Calibrate,
    ];
}

/// What a recorder accumulated: cycles and activations per layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// TSC cycles charged to each layer (exclusive).
    pub cycles: [u64; LAYERS],
    /// How many times each layer was entered.
    pub entries: [u32; LAYERS],
    /// How many probes were entered while each layer was the current one (its children):
    /// part of each child probe's cost lands in the parent and is removed per child.
    pub children: [u32; LAYERS],
    /// Hardware events charged to each layer (order of [`counters::NAMES`]); all zero unless
    /// per-layer counters were switched on with [`use_counters`].
    pub events: [[u64; counters::N]; LAYERS],
    /// `nest[p][c]`: how many times layer `c` was entered while `p` was the current layer.
    pub nest: [[u32; LAYERS]; LAYERS],
}

#[cfg(feature = "probes")]
mod imp;
#[cfg(feature = "probes")]
pub use imp::{
    activate, activate_only, deactivate, enter, rdtsc, supported, take, use_counters, Guard,
};

#[cfg(not(feature = "probes"))]
mod off {
    use super::{Layer, Snapshot};
    /// Probes are compiled out.
    pub struct Guard;
    /// Compiled out: does nothing.
    #[inline(always)]
    pub fn enter(_l: Layer) -> Guard {
        Guard
    }
    /// Compiled out.
    pub fn activate() {}
    /// Compiled out.
    pub fn activate_only(_mask: u32) {}
    /// Compiled out.
    pub fn deactivate() {}
    /// Compiled out: always empty.
    pub fn take() -> Snapshot {
        Snapshot::default()
    }
    /// Compiled out: returns 0.
    pub fn rdtsc() -> u64 {
        0
    }
    /// Compiled out.
    pub fn use_counters(_pmc: Option<crate::counters::Pmc>) {}
    /// Compiled out: nothing can be recorded.
    pub fn supported() -> Result<(), &'static str> {
        Err("this binary was built without probes (feature flowstack-prof/probes)")
    }
}
#[cfg(not(feature = "probes"))]
pub use off::{
    activate, activate_only, deactivate, enter, rdtsc, supported, take, use_counters, Guard,
};

/// What can disturb a sample: (context switches of this thread so far, current CPU).
/// A sample whose switch count or CPU changed is discarded, as seed 000 discarded samples
/// taken while an interrupt fired.
pub fn disturbance() -> (u64, i32) {
    sys::disturbance()
}

use flowstack_sys::perf as sys;
