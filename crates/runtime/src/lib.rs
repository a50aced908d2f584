//! flowstack's drive loops: the code that owns an engine, its device, its applications and the
//! wall clock on one thread.
//!
//! The stack below is sans-IO (it reads no clock and touches no device); this crate is where
//! time and devices meet it. [`Clock`] is the one clock origin; [`Host`] is the one drive loop
//! for an engine on a device, used by every tool (serve, get, ping, bench, profile) and by the
//! per-core runtime that runs one `Host` per pinned core.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod host;

pub use clock::Clock;
pub use host::Host;
