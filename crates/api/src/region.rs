//! The header of an application's shared region with the offload daemon: one definition for
//! both sides.
//!
//! The daemon (`flowstack-offload`) lays the region out and describes it in the header; the
//! application (`flowstack-client`) reads the description and validates it against the
//! region's size before using any of it.
//!
//! ```text
//!   0  magic            u64  MAGIC
//!   8  version          u32  crate::record::VERSION
//!  12  daemon_sleeping  u32  1 while the daemon announces it sleeps (doorbell: its eventfd)
//!  16  tx_freed         u64  bytes of the transmit area the daemon has taken (daemon writes)
//!  24  rx_freed         u64  bytes of the receive area the application has released (app writes)
//!  32  cmd ring offset, 40 capacity     (flowstack_sys::ring, application -> daemon)
//!  48  event ring offset, 56 capacity   (daemon -> application)
//!  64  tx area offset, 72 size          (bytes the application sends)
//!  80  rx area offset, 88 size          (bytes the daemon delivers: urgent delivery)
//!  96  application id   u64
//! 104  wants_writable   u32  1 while the application waits for send space (app writes)
//! 108  sleepers         u32  threads asleep on the wake-up eventfd (app writes): low 16
//!                            bits all of them, high 16 bits those also waiting for send space
//! 112  woken            u32  1 once the daemon wrote the wake-up channel (daemon sets), 0
//!                            once the application read it dry (app clears)
//! ```

/// "FSDREGN2" little-endian (2: `wants_writable`, credit events published without a wake-up).
pub const MAGIC: u64 = u64::from_le_bytes(*b"FSDREGN2");
/// Byte offsets in the header.
pub mod at {
    /// u64 magic.
    pub const MAGIC: usize = 0;
    /// u32 record layout version.
    pub const VERSION: usize = 8;
    /// u32: the daemon sleeps.
    pub const DAEMON_SLEEPING: usize = 12;
    /// u64: transmit bytes taken by the daemon.
    pub const TX_FREED: usize = 16;
    /// u64: receive bytes released by the application.
    pub const RX_FREED: usize = 24;
    /// u64 command ring offset.
    pub const CMD_OFF: usize = 32;
    /// u64 command ring capacity.
    pub const CMD_CAP: usize = 40;
    /// u64 event ring offset.
    pub const EVT_OFF: usize = 48;
    /// u64 event ring capacity.
    pub const EVT_CAP: usize = 56;
    /// u64 transmit area offset.
    pub const TX_OFF: usize = 64;
    /// u64 transmit area size.
    pub const TX_SIZE: usize = 72;
    /// u64 receive area offset.
    pub const RX_OFF: usize = 80;
    /// u64 receive area size.
    pub const RX_SIZE: usize = 88;
    /// u64 application id.
    pub const APP_ID: usize = 96;
    /// u32: the application waits for send space, so events that only return send credit
    /// must wake it (otherwise the daemon publishes them without a wake-up).
    pub const APP_WANTS_WRITABLE: usize = 104;
    /// u32 (version 4): threads of the application asleep on its wake-up eventfd
    /// (`AttachOp::Wake`); bits 16.. count those that also wait for send space. The daemon
    /// signals the eventfd after publishing events while it is not zero (for events that only
    /// return send credit: while the high half is not zero).
    pub const APP_SLEEPERS: usize = 108;
    /// u32 (record version 10): the daemon wrote the wake-up channel and the application has
    /// not read it dry since; the daemon writes only when it turns this from 0 to 1 (one
    /// write per sleep, `flowstack_sys::wake::should_signal`), the application clears it
    /// after each read of its channel (`flowstack_sys::wake::drained`).
    pub const APP_WOKEN: usize = 112;
}
/// Bytes of the header.
pub const HEADER_BYTES: usize = 4096;
/// The first bytes the daemon sends with the descriptors (memfd, eventfd) at registration.
pub const HELLO: &[u8; 8] = b"FSDHELO1";
/// What an application writes first on a new connection to the daemon's unix socket.
pub const REGISTER: &[u8; 8] = b"FSDREG02";
/// What `flowstack stats` writes first instead: the daemon answers with its stats (JSON) and
/// closes.
pub const STATS_REQUEST: &[u8; 8] = b"FSDSTAT1";
/// Per-connection limit of bytes posted by the application and not yet taken by the engine.
/// A sender with a full buffer sleeps until half of it is taken (`credit_wakes` in the
/// daemon), so this is about twice the bytes a bulk sender moves per sleep: 1 MiB (as the
/// engine's own send buffer) makes that one sleep per 512 KiB instead of per 128 KiB.
pub const SOCK_SNDBUF: u64 = 1024 * 1024;
/// Per-connection limit of bytes delivered to the application and not yet consumed by it.
pub const SOCK_RCVBUF: u64 = 512 * 1024;
/// A UDP socket's receive queue (`SO_RCVBUF`, Linux's `rmem_default`): datagrams delivered
/// to the application and not yet read, each charged [`dgram_charge`]; one that would go
/// over it waits in the daemon's engine queue (itself bounded: dropped there when full and
/// counted, `UdpRcvbufErrors`).
pub const UDP_RCVBUF: u64 = 212_992;
/// What a queued datagram of `len` bytes counts against [`UDP_RCVBUF`]: its bytes plus a
/// fixed overhead, so a flood of empty datagrams is bounded too (as the kernel charges
/// `skb->truesize`). The application reports each datagram it reads with this charge
/// (`TcpConsume`).
pub fn dgram_charge(len: u64) -> u64 {
    len + 256
}
/// The largest UDP payload (65535 − 20 − 8).
pub const MAX_DGRAM: usize = 65_507;
/// First handle of accepted connections (listen/connect handles count up from 1).
pub const ACCEPTED_BASE: u32 = 1 << 23;
/// First handle the POSIX layer (`flowstack_client::posix`) chooses itself (socket, adopt);
/// accepted connections stay below it.
pub const POSIX_BASE: u32 = 3 << 22;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields_are_aligned_distinct_and_inside_the_header() {
        // (offset, width) of every field, in layout order.
        let fields = [
            (at::MAGIC, 8),
            (at::VERSION, 4),
            (at::DAEMON_SLEEPING, 4),
            (at::TX_FREED, 8),
            (at::RX_FREED, 8),
            (at::CMD_OFF, 8),
            (at::CMD_CAP, 8),
            (at::EVT_OFF, 8),
            (at::EVT_CAP, 8),
            (at::TX_OFF, 8),
            (at::TX_SIZE, 8),
            (at::RX_OFF, 8),
            (at::RX_SIZE, 8),
            (at::APP_ID, 8),
            (at::APP_WANTS_WRITABLE, 4),
            (at::APP_SLEEPERS, 4),
            (at::APP_WOKEN, 4),
        ];
        for w in fields.windows(2) {
            let ((a, wa), (b, _)) = (w[0], w[1]);
            assert!(a + wa <= b, "field at {a} overlaps the one at {b}");
        }
        for (off, width) in fields {
            assert_eq!(off % width, 0, "field at {off} is not aligned for atomics");
            assert!(off + width <= HEADER_BYTES);
        }
        assert_ne!(MAGIC.to_le_bytes(), *HELLO, "the two tags must differ");
    }
}
