//! Wire formats for flowstack: zero-copy packet views and validated representations.
//!
//! Every protocol has two levels:
//!
//! * a **view** `Packet<T: AsRef<[u8]>>` whose constructor `new_checked` validates lengths once,
//!   after which every field accessor is infallible and never panics;
//! * a **representation** (`…Repr`) holding the parsed, validated header fields, with `parse`,
//!   `buffer_len` and `emit`.
//!
//! Header fields are read and written through each module's private table of named field
//! offsets, never through literal offsets. Checksum work is a parameter ([`ChecksumCaps`]), not
//! a decision made here.
//!
//! Nothing in this crate performs I/O, reads a clock or allocates per packet. Parsers return a
//! typed [`Error`] naming what was wrong with the input; the engine turns each error into a
//! named drop counter.
//!
//! The conventions (the two levels, the field tables, checksum capabilities, errors and their
//! counters, and a checklist for adding a protocol) are written down in `docs/wire/README.md` at
//! the root of the repository.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arp;
pub mod checksum;
mod error;
pub mod ethernet;
pub mod icmpv4;
pub mod ipv4;
pub mod rss;
pub mod seq;
pub mod tcp;
pub mod time;
pub mod udp;

pub use error::{Error, Result};
pub use ethernet::{EtherType, EthernetAddress};
pub use ipv4::{Ipv4Address, Ipv4Cidr};
pub use seq::SeqNum;
pub use time::{Duration, Instant, PollAt};

/// Where checksums are computed and verified, per protocol.
///
/// A device that offloads checksums (or a trusted in-memory link, as Linux loopback is) lets the
/// stack skip them; the parameter is passed to every `parse`/`emit` that touches a checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChecksumCaps {
    /// Verify checksums of received packets in software.
    pub verify_rx: bool,
    /// Fill checksums of transmitted packets in software.
    pub fill_tx: bool,
}

impl ChecksumCaps {
    /// Checksums computed and verified in software (the safe default).
    pub const SOFTWARE: Self = Self {
        verify_rx: true,
        fill_tx: true,
    };
    /// Checksums handled by the device (or skipped on a trusted link).
    pub const OFFLOADED: Self = Self {
        verify_rx: false,
        fill_tx: false,
    };
}

impl Default for ChecksumCaps {
    fn default() -> Self {
        Self::SOFTWARE
    }
}

/// Reads a big-endian u16 at `at`; callers guarantee the bounds (checked in `new_checked`).
#[inline]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads a big-endian u32 at `at`; callers guarantee the bounds.
#[inline]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Writes a big-endian u16 at `at`.
#[inline]
pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes a big-endian u32 at `at`.
#[inline]
pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
