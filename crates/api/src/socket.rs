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
use std::fmt;
use std::fs::File;
use std::net::SocketAddrV4;
use std::os::unix::fs::FileExt;
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
    /// The token of a zero-copy send that has completed, if any (oldest first). Taking
    /// them is optional: the buffer is let go of when acknowledged either way.
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

    // ---- files (seed 002's `direct_rw`) -------------------------------------------------

    /// Queues up to `len` bytes of `file` from `offset` for sending, as much as the send
    /// buffer takes now, and returns how many (like a non-blocking `sendfile(2)`: call again
    /// with the offset advanced). `WouldBlock` if none fit. A file that ends before
    /// `offset + len` (shorter, or truncated while sent) ends the transfer short: the bytes
    /// before its end are queued, then [`FileError::ShortFile`]. Completion: every queued byte
    /// is acknowledged once [`Sockets::tcp_send_queue`] reaches 0.
    ///
    /// This default reads into a buffer and copies it into the socket (a read/write loop);
    /// the engine overrides it with pooled zero-copy chunks.
    fn send_file(
        &mut self,
        h: TcpHandle,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<usize, FileError> {
        check_range(offset, len)?;
        let mut buf = [0u8; 16 * 1024];
        let mut done = 0usize;
        while (done as u64) < len {
            let want = (len - done as u64).min(buf.len() as u64) as usize;
            let at = offset + done as u64;
            let n = read_at(file, &mut buf[..want], at)?;
            if n == 0 {
                return short(done, at);
            }
            match self.tcp_send(h, &buf[..n]) {
                Ok(k) => {
                    done += k;
                    if k < n {
                        break;
                    }
                }
                Err(SocketError::WouldBlock) if done > 0 => break,
                Err(e) => return Err(FileError::Socket(e)),
            }
        }
        if done == 0 && len > 0 {
            // An implementor whose send took nothing without saying WouldBlock.
            return Err(FileError::Socket(SocketError::WouldBlock));
        }
        Ok(done)
    }

    /// Writes up to `max` received bytes to `file` at `offset`, straight from the receive
    /// buffer (borrowed with [`Sockets::tcp_peek`], written with positioned writes, then
    /// consumed), and returns how many. `Ok(0)` with `max > 0` is end of stream;
    /// `WouldBlock` means nothing has arrived yet. Bytes are consumed only once written, so a
    /// failed write loses nothing from the socket.
    fn recv_to_file(
        &mut self,
        h: TcpHandle,
        file: &File,
        offset: u64,
        max: usize,
    ) -> Result<usize, FileError> {
        check_range(offset, max as u64)?;
        let (a, b) = self.tcp_peek(h, max).map_err(FileError::Socket)?;
        let n = a.len() + b.len();
        if n == 0 {
            if max == 0 || self.tcp_at_eof(h) {
                return Ok(0);
            }
            return Err(FileError::Socket(
                self.tcp_error(h).unwrap_or(SocketError::WouldBlock),
            ));
        }
        write_all_at(file, a, offset)?;
        write_all_at(file, b, offset + a.len() as u64)?;
        self.tcp_consume(h, n).map_err(FileError::Socket)?;
        Ok(n)
    }

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

/// Why a file transfer ([`Sockets::send_file`], [`Sockets::recv_to_file`]) stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileError {
    /// The socket call failed (`WouldBlock`: nothing could move now).
    Socket(SocketError),
    /// The file ends at `at`, before the range asked for: it is shorter than the range, or was
    /// truncated while being sent (as `sendfile(2)`, the transfer ends short).
    ShortFile {
        /// File offset where the data ran out.
        at: u64,
    },
    /// `offset + len` overflows a file offset (`off_t`).
    BadRange,
    /// The file system call failed with this errno.
    Io(i32),
}

impl FileError {
    /// The errno a `sendfile(2)`-like call would report.
    pub fn errno(self) -> i32 {
        match self {
            FileError::Socket(e) => e.errno(),
            FileError::ShortFile { .. } => 5, // EIO: the data promised is not there
            FileError::BadRange => 22,
            FileError::Io(e) => e,
        }
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileError::Socket(e) => write!(f, "{e}"),
            FileError::ShortFile { at } => {
                write!(
                    f,
                    "file ends at byte {at}, before the range sent (truncated?)"
                )
            }
            FileError::BadRange => f.write_str("file offset and length overflow"),
            FileError::Io(e) => write!(f, "{}", std::io::Error::from_raw_os_error(*e)),
        }
    }
}

impl std::error::Error for FileError {}

impl From<SocketError> for FileError {
    fn from(e: SocketError) -> Self {
        FileError::Socket(e)
    }
}

impl From<std::io::Error> for FileError {
    fn from(e: std::io::Error) -> Self {
        FileError::Io(e.raw_os_error().unwrap_or(5))
    }
}

/// Rejects ranges whose end is not a valid file offset (`off_t` is signed 64-bit).
pub fn check_range(offset: u64, len: u64) -> Result<(), FileError> {
    match offset.checked_add(len) {
        Some(end) if end <= i64::MAX as u64 => Ok(()),
        _ => Err(FileError::BadRange),
    }
}

/// `pread(2)` once, retried on EINTR: the bytes read (0 at end of file).
pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> Result<usize, FileError> {
    loop {
        match file.read_at(buf, offset) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r.map_err(FileError::from),
        }
    }
}

fn write_all_at(file: &File, data: &[u8], offset: u64) -> Result<(), FileError> {
    if data.is_empty() {
        return Ok(());
    }
    file.write_all_at(data, offset).map_err(FileError::from)
}

/// What a short file means after `done` bytes were queued: those bytes, or the error when
/// none were.
fn short(done: usize, at: u64) -> Result<usize, FileError> {
    if done > 0 {
        Ok(done)
    } else {
        Err(FileError::ShortFile { at })
    }
}
