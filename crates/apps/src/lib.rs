//! Applications over the [`Sockets`](flowstack_api::Sockets) trait, written once and run
//! anywhere a drive loop hands them a stack: in-process engines, a device-attached host, the
//! per-core runtime, and (later) the offload client.
//!
//! Each is an [`App`](flowstack_api::App): a non-blocking state machine that does what its
//! sockets allow on every turn and says whether the loop may sleep.
//!
//! - [`serve`]: a listener with HTTP/1.1 static files, echo or sink connections;
//! - [`get`]: an HTTP/1.1 GET whose body streams to any writer;
//! - [`demo`]: the UDP echo and one-page HTTP server of `flowstack demo`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod demo;
pub mod get;
pub mod serve;
pub mod workload;
