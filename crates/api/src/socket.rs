//! Socket handles, readiness, and the [`Sockets`] trait: the socket calls an application makes.
//!
//! # Time
//! Socket calls take no clock. Whoever implements [`Sockets`] owns the time: the engine stamps
//! a call with its clock as of its latest poll (the last `now` it was given), and whatever the
//! call produces — a SYN, a FIN, a datagram, a window update — leaves at the engine's next
//! poll, stamped with that poll's time. An application therefore never needs a clock to make
//! a socket call; it needs one only to measure itself (latency, intervals), which is why
//! [`App::poll`](crate::App::poll) is handed `now`.
//!
//! # Non-blocking
//! Every call returns at once. "Not now" is [`SocketError::WouldBlock`]; the caller lets the
//! stack run (an engine poll, or a wait on the offload client's event ring) and tries again.
//! Blocking helpers live in the drive loops, not here.

use crate::SocketError;
use std::net::SocketAddrV4;
use std::sync::Arc;

/// A TCP socket handle (listener or connection). Its number is an index into the owner's
/// socket table; the owner validates it on every call (a stale or forged handle is
/// [`SocketError::InvalidHandle`], never a panic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TcpHandle(usize);

impl TcpHandle {
    /// The handle with index `i` (for socket tables and ring records).
    pub const fn from_raw(i: usize) -> Self {
        Self(i)
    }
    /// Its index.
    pub const fn index(self) -> usize {
        self.0
    }
}

/// A UDP socket handle, validated like [`TcpHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UdpHandle(usize);

impl UdpHandle {
    /// The handle with index `i`.
    pub const fn from_raw(i: usize) -> Self {
        Self(i)
    }
    /// Its index.
    pub const fn index(self) -> usize {
        self.0
    }
}

/// What a socket is ready for (as `poll(2)` reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// Data, end of stream, an error, or (listener) a connection to accept is waiting.
    pub readable: bool,
    /// `send` would take bytes.
    pub writable: bool,
    /// The error that ended the connection.
    pub error: Option<SocketError>,
}

/// The socket calls an application makes — the engine implements them in-process, the
/// offload client over the daemon's rings — so an application written against this trait
/// runs unchanged on either. See the module docs for the time and non-blocking contracts.
pub trait Sockets {
    // ---- TCP -------------------------------------------------------------------------

    /// Listens on `port` with up to `backlog` established connections waiting for accept.
    fn tcp_listen(&mut self, port: u16, backlog: usize) -> Result<TcpHandle, SocketError>;
    /// Takes an established connection from a listener (`WouldBlock` if none is waiting).
    fn tcp_accept(&mut self, listener: TcpHandle) -> Result<TcpHandle, SocketError>;
    /// Starts opening a connection to `remote` from an ephemeral port; the handle becomes
    /// writable when the handshake completes, or reports an error.
    fn tcp_connect(&mut self, remote: SocketAddrV4) -> Result<TcpHandle, SocketError>;
    /// Queues bytes to send; returns how many were taken (`WouldBlock` if none fit).
    fn tcp_send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, SocketError>;
    /// Zero-copy send: queues an application-owned buffer whole, without copying it
    /// (`WouldBlock` if it does not fit). Returns a token that [`Sockets::tcp_zc_completion`]
    /// reports once the peer acknowledged every byte.
    fn tcp_send_zc(&mut self, h: TcpHandle, buf: Arc<[u8]>) -> Result<u64, SocketError>;
    /// The token of a zero-copy send that has completed, if any (oldest first).
    fn tcp_zc_completion(&mut self, h: TcpHandle) -> Option<u64>;
    /// Reads received bytes; `Ok(0)` is end of stream, `WouldBlock` means none yet.
    fn tcp_recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, SocketError>;
    /// Zero-copy receive: borrows up to `max` readable bytes in place (two slices when the
    /// buffer wraps). Follow with [`Sockets::tcp_consume`].
    fn tcp_peek(&self, h: TcpHandle, max: usize) -> Result<(&[u8], &[u8]), SocketError>;
    /// Marks `n` peeked bytes as read, freeing receive window.
    fn tcp_consume(&mut self, h: TcpHandle, n: usize) -> Result<(), SocketError>;
    /// True once the peer's FIN arrived and every byte before it has been read.
    fn tcp_at_eof(&self, h: TcpHandle) -> bool;
    /// Closes the sending side (FIN after the queued bytes); reading continues.
    fn tcp_shutdown(&mut self, h: TcpHandle) -> Result<(), SocketError>;
    /// Releases the handle; a connection closes gracefully in the background.
    fn tcp_close(&mut self, h: TcpHandle) -> Result<(), SocketError>;
    /// Resets the connection (RST); the handle must still be closed.
    fn tcp_abort(&mut self, h: TcpHandle) -> Result<(), SocketError>;
    /// What the socket is ready for.
    fn tcp_poll(&self, h: TcpHandle) -> Result<Readiness, SocketError>;
    /// True while the connection is synchronized and both sides may still send
    /// (ESTABLISHED): the handshake has completed and nobody has closed.
    fn tcp_is_open(&self, h: TcpHandle) -> bool;
    /// Bytes queued for sending and not yet acknowledged.
    fn tcp_send_queue(&self, h: TcpHandle) -> Result<usize, SocketError>;
    /// TCP_NODELAY: turn Nagle's algorithm off (`true`) or on.
    fn tcp_set_nodelay(&mut self, h: TcpHandle, on: bool) -> Result<(), SocketError>;
    /// The error that ended a connection, if one did.
    fn tcp_error(&self, h: TcpHandle) -> Option<SocketError>;
    /// Connections in any state (including those closing in the background).
    fn tcp_connections(&self) -> usize;

    // ---- UDP -------------------------------------------------------------------------

    /// Binds a UDP socket to `port` (0 picks an ephemeral port).
    fn udp_bind(&mut self, port: u16) -> Result<UdpHandle, SocketError>;
    /// The local port of a UDP socket.
    fn udp_local_port(&mut self, h: UdpHandle) -> Result<u16, SocketError>;
    /// Sends one datagram.
    fn udp_send_to(
        &mut self,
        h: UdpHandle,
        dst: SocketAddrV4,
        data: &[u8],
    ) -> Result<(), SocketError>;
    /// Receives one datagram whole (`BufferTooSmall` leaves it queued).
    fn udp_recv_from(
        &mut self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<(usize, SocketAddrV4), SocketError>;
    /// Closes a UDP socket, freeing its port.
    fn udp_close(&mut self, h: UdpHandle) -> Result<(), SocketError>;
}
