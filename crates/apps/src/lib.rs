//! Applications over the [`Sockets`](flowstack_api::Sockets) trait, written once and run
//! anywhere a drive loop hands them a stack: in-process engines, a device-attached host, the
//! per-core runtime, and (later) the offload client.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod workload;
