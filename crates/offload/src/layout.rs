//! The region the daemon shares with one application: header, rings, data areas.
//!
//! Byte offsets of the header are those of `flowstack_client::layout` (the application reads
//! what the daemon writes here); the crates share no code but `api` and `sys`, so
//! `tests/daemon.rs` checks that both copies agree.

use flowstack_sys::ring::{ring_bytes, RingLayout};
use flowstack_sys::SharedRegion;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// "FSDREGN1" little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"FSDREGN1");
/// The first bytes sent with the descriptors (memfd, eventfd) at registration.
pub const HELLO: &[u8; 8] = b"FSDHELO1";
/// Header byte offsets (see `flowstack_client::layout` for the picture).
pub mod at {
    #![allow(missing_docs)]
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const DAEMON_SLEEPING: usize = 12;
    pub const TX_FREED: usize = 16;
    pub const RX_FREED: usize = 24;
    pub const CMD_OFF: usize = 32;
    pub const CMD_CAP: usize = 40;
    pub const EVT_OFF: usize = 48;
    pub const EVT_CAP: usize = 56;
    pub const TX_OFF: usize = 64;
    pub const TX_SIZE: usize = 72;
    pub const RX_OFF: usize = 80;
    pub const RX_SIZE: usize = 88;
    pub const APP_ID: usize = 96;
}
/// Bytes of the header.
pub const HEADER_BYTES: usize = 4096;
/// Command ring data capacity (about 900 records).
pub const CMD_CAP: usize = 64 * 1024;
/// Event ring data capacity (about 3600 records).
pub const EVT_CAP: usize = 256 * 1024;
/// Transmit area (application → daemon bytes).
pub const TX_SIZE: usize = 1 << 20;
/// Receive area (daemon → application bytes, urgent delivery).
pub const RX_SIZE: usize = 1 << 20;
/// Per-connection limit of bytes posted and not yet taken by the engine (the client keeps
/// to it; the daemon resets a connection whose application overruns it fourfold).
pub const SOCK_SNDBUF: u64 = 256 * 1024;
/// Per-connection limit of bytes delivered to the application and not yet consumed.
pub const SOCK_RCVBUF: u64 = 256 * 1024;
/// First handle of accepted connections (listen/connect handles count up from 1).
pub const ACCEPTED_BASE: u32 = 1 << 23;

const fn page_up(n: usize) -> usize {
    (n + 4095) & !4095
}

/// Where everything lies in a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Command ring (application → daemon).
    pub cmd: RingLayout,
    /// Event ring (daemon → application).
    pub evt: RingLayout,
    /// Transmit area offset.
    pub tx_off: usize,
    /// Receive area offset.
    pub rx_off: usize,
    /// Total bytes.
    pub len: usize,
}

/// The layout every application gets.
pub const LAYOUT: Layout = {
    let cmd_off = HEADER_BYTES;
    let evt_off = page_up(cmd_off + ring_bytes(CMD_CAP));
    let tx_off = page_up(evt_off + ring_bytes(EVT_CAP));
    let rx_off = tx_off + TX_SIZE;
    Layout {
        cmd: RingLayout {
            offset: cmd_off,
            capacity: CMD_CAP,
            max_record: flowstack_api::record::RECORD_LEN,
        },
        evt: RingLayout {
            offset: evt_off,
            capacity: EVT_CAP,
            max_record: flowstack_api::record::RECORD_LEN,
        },
        tx_off,
        rx_off,
        len: rx_off + RX_SIZE,
    }
};

/// Creates an application's region and writes its header.
pub fn create_region(app_id: u64) -> io::Result<Arc<SharedRegion>> {
    let r = SharedRegion::create(&format!("flowstack-app-{app_id}"), LAYOUT.len)?;
    let put = |at: usize, v: u64| {
        r.atomic_u64(at)
            .expect("header field inside the region")
            .store(v, Ordering::Relaxed)
    };
    put(at::CMD_OFF, LAYOUT.cmd.offset as u64);
    put(at::CMD_CAP, LAYOUT.cmd.capacity as u64);
    put(at::EVT_OFF, LAYOUT.evt.offset as u64);
    put(at::EVT_CAP, LAYOUT.evt.capacity as u64);
    put(at::TX_OFF, LAYOUT.tx_off as u64);
    put(at::TX_SIZE, TX_SIZE as u64);
    put(at::RX_OFF, LAYOUT.rx_off as u64);
    put(at::RX_SIZE, RX_SIZE as u64);
    put(at::APP_ID, app_id);
    r.atomic_u32(at::VERSION)
        .expect("header")
        .store(flowstack_api::record::VERSION as u32, Ordering::Relaxed);
    r.atomic_u64(at::MAGIC)
        .expect("header")
        .store(MAGIC, Ordering::Release);
    Ok(Arc::new(r))
}
