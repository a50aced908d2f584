//! flowstack's ground floor: what every other crate — the engine, the applications, the
//! per-core runtime, the offload daemon, its client library and the preload shim — agrees on.
//!
//! - [`SocketError`] and its errno table ([`error`]);
//! - the counter namespace of every layer ([`counters`]);
//! - socket handles, readiness and the [`Sockets`] trait: the socket calls an application
//!   makes, implemented by the engine today and by the offload client later ([`socket`]);
//! - the [`App`] trait: a step-driven application that any drive loop can run ([`app`]);
//! - the fixed-layout records of the rings between the daemon and its clients ([`record`]) and
//!   the header of the region that holds them ([`region`]);
//! - maps keyed by locally chosen integer ids with a cheap hasher ([`ids`]).
//!
//! Safe, I/O-free, clock-free: nothing here reads time or touches the OS.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod app;
pub mod counters;
pub mod error;
pub mod ids;
pub mod record;
pub mod region;
pub mod socket;
pub mod tcpinfo;

pub use app::App;
pub use counters::{Counter, Counters};
pub use error::SocketError;
pub use socket::{FileError, Readiness, Sockets, TcpHandle, UdpHandle};
