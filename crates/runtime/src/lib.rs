//! flowstack's drive loops: the code that owns an engine, its device, its applications and the
//! wall clock on one thread.
//!
//! The stack below is sans-IO (it reads no clock and touches no device); this crate is where
//! time and devices meet it. [`Clock`] is the one clock origin; [`Host`] is the one drive loop
//! for an engine on a device, used by every tool (serve, get, ping, bench, profile) and by the
//! per-core runtime that runs one `Host` per pinned core.
//!
//! - [`link`]: the clap-free [`LinkSpec`] (device, capture, impairment, addresses) and its
//!   `open`, which builds a [`Host`];
//! - [`host`]: [`Host`], the drive loop (engine turn, application turn, sleep in the device);
//! - [`ping`]: ICMP echo from a host, ping(8)-style;
//! - [`sim`]: applications on the two engines of the deterministic simulation;
//! - [`demo`]: the jobs of `flowstack demo`;
//! - [`shard`]: per-core shards — [`Runtime`] runs one engine, its device queue and its
//!   applications per pinned thread; [`parse_cores`] reads `--cores` lists;
//! - [`steer`]: every frame to the shard owning its flow ([`Steering`], [`Steered`]);
//! - [`xring`]: the cross-shard rings and doorbells ([`Mesh`]);
//! - [`nic`]: an in-process multi-queue link for shards in tests and benchmarks.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod demo;
pub mod host;
pub mod link;
pub mod nic;
pub mod ping;
pub mod serve;
pub mod shard;
pub mod sim;
pub mod steer;
pub mod xring;

pub use clock::Clock;
pub use host::Host;
pub use link::{default_mac, AddrSpec, Link, LinkError, LinkSpec, Waitable};
pub use shard::{
    parse_cores, Placement, Runtime, RuntimeSpec, ShardInfo, ShardPanic, ShardReport, StartError,
    StopHandle,
};
pub use steer::{FlowRule, Owner, Queue, SteerCounters, Steered, Steering};
pub use xring::{Mesh, MeshPort, RingSpec};
