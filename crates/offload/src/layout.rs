//! The region the daemon shares with one application: header, rings, data areas.
//!
//! The header's byte offsets and the shared limits are `flowstack_api::region`'s, the one
//! definition the application side reads too.

use flowstack_sys::ring::{ring_bytes, RingLayout};
use flowstack_sys::SharedRegion;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use flowstack_api::region::{
    at, ACCEPTED_BASE, HEADER_BYTES, HELLO, MAGIC, SOCK_RCVBUF, SOCK_SNDBUF,
};
/// Command ring data capacity (about 900 records).
pub const CMD_CAP: usize = 64 * 1024;
/// Event ring data capacity (about 3600 records).
pub const EVT_CAP: usize = 256 * 1024;
/// Transmit area (application → daemon bytes): two connections' full send credit
/// (`SOCK_SNDBUF`), so one bulk sender never waits for the area itself.
pub const TX_SIZE: usize = 2 << 20;
/// Receive area (daemon → application bytes, urgent delivery): four connections' receive
/// credit (`SOCK_RCVBUF`); the client keeps bytes read with `tcp_recv` in it until read and
/// copies them out only when more than half of it is held.
pub const RX_SIZE: usize = 2 << 20;

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
