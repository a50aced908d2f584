//! The flowstack engine: one shared-nothing instance of the stack per core.
//!
//! An [`Engine`] owns an interface (MAC, IPv4 address, ARP cache, routes), IPv4 input and
//! output with fragment reassembly, ICMP, UDP and TCP sockets, and a named counter for every
//! drop. It is sans-IO: see the driving contract on [`Engine`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod arp_cache;
mod demux;
pub use flowstack_api::counters;
mod engine;
pub mod fuzzing;
mod iface;
pub mod netsim;
mod reasm;
pub mod simnet;
mod sockets;
mod tcp_socket;
mod udp;

pub use arp_cache::ArpConfig;
pub use counters::{Counter, Counters};
pub use engine::{
    Deliver, Engine, EngineConfig, FileSendMode, PingReply, Steering, FILE_CHUNK, MAP_WINDOW,
    MAX_WINDOWS,
};
pub use flowstack_api::FileError;
pub use flowstack_api::{Readiness, SocketError, Sockets};
pub use flowstack_sys::filemap::Populate;
pub use flowstack_tcp::sendq::{ExtBuf, SharedOwner};
pub use flowstack_tcp::{CcAlgorithm, ConnStats, Connection, Keepalive, State, TcpConfig, TcpInfo};
pub use iface::IfaceConfig;
pub use reasm::ReasmConfig;
pub use tcp_socket::{TcpHandle, TcpLimits};
pub use udp::{UdpConfig, UdpHandle};
