//! Sans-IO TCP for flowstack (RFC 9293 with RFC 7323 window scaling and timestamps, RFC 2018
//! SACK with RFC 6675 loss recovery, RFC 6582 NewReno, RFC 9438 CUBIC, RFC 5961 hardening,
//! RFC 6528 ISNs and SYN cookies).
//!
//! A [`Connection`] is one TCB. It never reads a clock or touches the network: the owner feeds
//! it segments with [`Connection::on_segment`], drains segments to send with
//! [`Connection::poll_transmit`], fires timers with [`Connection::on_timeout`] at
//! [`Connection::poll_at`], and moves application data with `send`/`recv`. LISTEN lives in the
//! engine (a listener table), which creates connections with [`Connection::accept`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assembler;
pub mod buffer;
pub mod cc;
pub mod config;
mod conn;
pub mod counters;
pub mod isn;
pub mod rtt;
pub mod sack;
pub mod sendq;

pub use cc::CcAlgorithm;
pub use config::{Keepalive, LossDetection, Plpmtud, TcpConfig};
pub use conn::{
    syn_option_clamps, ConnStats, Connection, Emit, IcmpError, State, TcpError, TcpInfo, MIN_PMTU,
    REST_AFTER,
};
pub use counters::{Counter, Counters};
pub use isn::{FourTuple, IsnGenerator};

/// RFC 9293 §3.7.1: the default send MSS when the peer announces none (or zero).
pub const DEFAULT_MSS: usize = 536;
/// Smallest MSS accepted from a peer; tinier values are raised to it (as Linux does with 48).
pub const MIN_MSS: usize = 48;
/// RFC 7323 §2.3: the largest window-scale shift.
pub const MAX_WSCALE: u8 = 14;
