//! `flowstack sim`: what would flowstack's architectures give on 8, 16, 64 cores, or with a
//! NIC processor at a fraction of the host's clock? A deterministic discrete-event model of
//! host cores, stack cores (an offload daemon's, or a NIC processor at a clock ratio), their
//! FIFO queues, interrupts and wake-ups, payload copies, the bus between host and stack cores
//! and the link — driven by costs measured on this machine (`flowstack profile --json`,
//! `flowstack bench --json`) or taken from a paper (seed 001's Table 1), and checked against
//! fresh bench runs before it is trusted ([`validate`]).
//!
//! - [`des`]: the event core (resources, delays, scripts, exact picosecond accounting);
//! - [`arch`]: architectures as configurations ([`Arch`]: kernel, library, percore,
//!   offload with E stack cores at a clock ratio, daemon, daemon-wake);
//! - [`model`]: workloads (stream, rr closed and open loop, crr, file) as scripts over an
//!   architecture's resources, [`model::simulate`];
//! - [`calib`]: the cost file (presets), and flowstack's costs from a profile report;
//! - [`fit`]: this machine's calibration: profile costs plus the residual parameters fitted
//!   to named bench runs;
//! - [`probe`]: flowstack's loop speed and CPU share, measured beside each validation run;
//! - [`validate`]: predictions next to measurements, ±25 % band;
//! - [`seed001`]: seed 001's host-CPU reduction reproduced from its Table 1;
//! - [`plot`]: the figures as SVG.
//!
//! Sans-IO like the engine: nothing here reads a clock, touches a file or spawns anything;
//! the `flowstack sim` command reads files, runs the bench and prints.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arch;
pub mod calib;
pub mod des;
pub mod fit;
pub mod model;
pub mod plot;
pub mod probe;
pub mod seed001;
pub mod validate;

pub use calib::Calibration;
pub use model::{simulate, Arch, Clients, Outcome, Scenario, Workload};
