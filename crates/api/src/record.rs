//! Fixed-layout records of the rings between the offload daemon and its applications.
//!
//! Each application thread has a command ring (application → daemon) and an event ring
//! (daemon → application) in memory both processes map. Every record is [`RECORD_LEN`] bytes,
//! little-endian, at fixed offsets, so either side reads it in place. The layout is versioned
//! ([`VERSION`]); a region carries the version in its header and the sides refuse to talk
//! across versions.
//!
//! **Shared memory is untrusted input.** [`CommandRecord::decode`] and [`EventRecord::decode`]
//! accept any 64 bytes and either return a well-formed record or a [`RecordError`]: unknown
//! operations, non-zero reserved bytes, out-of-range handles and lengths are rejected, never
//! trusted. Data spans (offset + length into a shared buffer area) are checked against that
//! area with [`check_span`] by whoever knows its size.
//!
//! Command layout (application → daemon):
//! ```text
//!  0..2   op        u16   (Op)
//!  2..4   mode      u16   0 = async (post and return), 1 = sync (wait for the completion)
//!  4..8   id        u32   request id, echoed by the completion
//!  8..12  handle    u32   socket handle (index), or 0 when the op takes none
//! 12..16  addr      u32   IPv4 address, network order as read (connect, sendto)
//! 16..18  port      u16
//! 18..20  reserved  (zero)
//! 20..24  arg       u32   backlog, flag, or a small count
//! 24..32  offset    u64   offset of a data span in the shared buffer area (or a file)
//! 32..40  len       u64   length of that span
//! 40..64  reserved  (zero)
//! ```
//! Event layout (daemon → application):
//! ```text
//!  0..2   kind      u16   (EventKind)
//!  2..4   reserved  (zero)
//!  4..8   id        u32   request id for a completion, 0 for unsolicited events
//!  8..12  handle    u32
//! 12..16  reserved  (zero)
//! 16..24  result    i64   >= 0: the call's value (handle, bytes); < 0: -errno
//! 24..32  offset    u64   data span (urgent delivery: where the bytes were put)
//! 32..40  len       u64
//! 40..64  reserved  (zero)
//! ```

use std::net::{Ipv4Addr, SocketAddrV4};

/// Version of the record layout.
/// 5: `Command::TcpInfo` (an older daemon drops an unknown op without answering, so a
/// sync call would hang: the version keeps the two apart instead).
/// 6: `AttachOp::{Pool, NewPooled, PlacePooled}` (placeholder pairs handed over in batches).
/// 7: `Command::Forget { recycle }` and `AttachOp::Repool` (placeholder pairs reused).
/// 8: `Command::Hold` and `EventKind::Unheld` (who receives a socket shared by processes);
/// `AttachOp::Adopt` no longer makes the adopter the holder.
/// 9: fused loopback connections: `Command::Pipe`, `EventKind::{Fused, PipeOpen, PipeNews}`
/// and the pipe's descriptor on the registration stream; `HoldHow::IfFree` is gone.
/// 10: the header's `woken` word (`region::at::APP_WOKEN`): one wake-up channel write per
/// sleep, the application clearing it after each read of its channel (an older client never
/// would, and would be woken once only).
pub const VERSION: u16 = 10;
/// Size of every record.
pub const RECORD_LEN: usize = 64;
/// Largest handle index a record may carry.
pub const MAX_HANDLE: u32 = (1 << 24) - 1;
/// Largest data span one record may describe (1 GiB).
pub const MAX_SPAN: u64 = 1 << 30;

mod field {
    use core::ops::Range;
    pub const OP: Range<usize> = 0..2;
    pub const MODE: Range<usize> = 2..4;
    pub const ID: Range<usize> = 4..8;
    pub const HANDLE: Range<usize> = 8..12;
    pub const ADDR: Range<usize> = 12..16;
    pub const PORT: Range<usize> = 16..18;
    pub const RESERVED_A: Range<usize> = 18..20;
    pub const ARG: Range<usize> = 20..24;
    pub const OFFSET: Range<usize> = 24..32;
    pub const LEN: Range<usize> = 32..40;
    pub const RESERVED_TAIL: Range<usize> = 40..64;
    // Event-only names for the shared positions.
    pub const KIND: Range<usize> = 0..2;
    pub const EV_RESERVED_A: Range<usize> = 2..4;
    pub const EV_RESERVED_B: Range<usize> = 12..16;
    pub const RESULT: Range<usize> = 16..24;
}

/// Why a record was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// The operation or event code is not one of this version's.
    UnknownOp(u16),
    /// The mode is neither async nor sync.
    BadMode(u16),
    /// Reserved bytes are not zero (a newer peer, or garbage).
    ReservedNotZero,
    /// The handle is beyond [`MAX_HANDLE`].
    BadHandle(u32),
    /// A length or offset is out of range.
    BadSpan,
    /// A field holds a value the operation forbids (e.g. port 0 to connect to).
    BadArgument,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::UnknownOp(op) => write!(f, "unknown record code {op}"),
            RecordError::BadMode(m) => write!(f, "unknown call mode {m}"),
            RecordError::ReservedNotZero => f.write_str("reserved bytes are not zero"),
            RecordError::BadHandle(h) => write!(f, "handle {h} out of range"),
            RecordError::BadSpan => f.write_str("data span out of range"),
            RecordError::BadArgument => f.write_str("invalid argument in record"),
        }
    }
}

impl std::error::Error for RecordError {}

/// How the application waits for a command (seed 001's host interface).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Posted; the call returns at once and its completion is only checked for errors.
    Async,
    /// The caller waits for the completion.
    Sync,
}

/// A socket operation posted by an application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Listen on a port.
    TcpListen {
        /// Port.
        port: u16,
        /// Accept-queue length.
        backlog: u32,
    },
    /// Take a connection from a listener.
    TcpAccept {
        /// The listener.
        listener: u32,
    },
    /// Open a connection.
    TcpConnect {
        /// Where to.
        remote: SocketAddrV4,
    },
    /// Send the bytes at `offset..offset+len` of the application's transmit area.
    TcpSend {
        /// Connection.
        handle: u32,
        /// Span start in the transmit area.
        offset: u64,
        /// Span length.
        len: u64,
    },
    /// The application consumed `len` bytes delivered into its receive area.
    TcpConsume {
        /// Connection.
        handle: u32,
        /// Bytes consumed.
        len: u64,
    },
    /// Close the sending side.
    TcpShutdown {
        /// Connection.
        handle: u32,
    },
    /// Release the handle (graceful close).
    TcpClose {
        /// Connection or listener.
        handle: u32,
    },
    /// Reset the connection.
    TcpAbort {
        /// Connection.
        handle: u32,
    },
    /// TCP_NODELAY.
    TcpSetNodelay {
        /// Connection.
        handle: u32,
        /// On (Nagle off).
        on: bool,
    },
    /// Queue up to `len` bytes (at most [`MAX_SPAN`]) of the file attached to connection
    /// `handle` (`Attach{File}`) from `offset`, as much as its send buffer takes now (a
    /// non-blocking `sendfile(2)` with an explicit offset). Completion: the bytes queued (0:
    /// the file ends at `offset`), `EAGAIN` if none fit, `EBADF` if no file is attached.
    TcpSendFile {
        /// Connection.
        handle: u32,
        /// Offset in the file.
        offset: u64,
        /// Bytes to send.
        len: u64,
    },
    /// Drop the file attached to connection `handle` (the daemon closes its copy).
    FileRelease {
        /// Connection.
        handle: u32,
    },
    /// Bind a UDP socket.
    UdpBind {
        /// Port (0: ephemeral).
        port: u16,
    },
    /// Send a datagram from the transmit area.
    UdpSendTo {
        /// Socket.
        handle: u32,
        /// Destination.
        dst: SocketAddrV4,
        /// Span start.
        offset: u64,
        /// Span length (at most 65507).
        len: u64,
    },
    /// Close a UDP socket.
    UdpClose {
        /// Socket.
        handle: u32,
    },
    /// Descriptors for `handle` were sent on the registration stream just before this record
    /// (one data byte, [`AttachOp::code`], carrying them): see [`AttachOp`].
    Attach {
        /// The application's handle for the socket (chosen by the application for `New` and
        /// `Adopt`, an existing one for `Place` and `KernelListener`).
        handle: u32,
        /// What the descriptors are for.
        op: AttachOp,
        /// Stream or datagram (`New`).
        ty: SockType,
    },
    /// Bind a socket created with `Attach{New}` to a local address (port 0: ephemeral).
    Bind {
        /// Socket.
        handle: u32,
        /// Local address (any 127/8 address or 0.0.0.0 on the loopback).
        local: SocketAddrV4,
        /// The socket's `SO_REUSEADDR` ([`BIND_REUSEADDR`]) and `SO_REUSEPORT`
        /// ([`BIND_REUSEPORT`]) at bind time (0 from an older client).
        flags: u8,
    },
    /// Listen on a socket created with `Attach{New}` (bound, or given an ephemeral port).
    Listen {
        /// Socket.
        handle: u32,
        /// Accept-queue length.
        backlog: u32,
    },
    /// Connect a socket created with `Attach{New}`; async: the outcome is a `Writable`
    /// (success) or `Closed` (failure) event; sync: the completion. A datagram socket's
    /// default peer (sync, at once); 0.0.0.0:0 dissolves it (`AF_UNSPEC`).
    Connect {
        /// Socket.
        handle: u32,
        /// Where to (port 0 only as 0.0.0.0:0).
        remote: SocketAddrV4,
    },
    /// The application's view of the socket is unreadable and it has read every token from
    /// its placeholder; `seen` is the newest event sequence it has seen (informative: the
    /// daemon decides from its own state, see `offload` docs).
    TokenCleared {
        /// Socket.
        handle: u32,
        /// Newest sequence seen.
        seen: u32,
    },
    /// The application filled its placeholder (send buffer full, or connect in progress):
    /// the daemon empties it when send space returns or the connect ends.
    WantWritable {
        /// Socket.
        handle: u32,
    },
    /// (Version 4.) How the daemon tells this application that the socket became readable:
    /// `quiet` — only through the event ring (the application computes readiness from its own
    /// view and sleeps on its wake-up descriptor, [`AttachOp::Wake`]); otherwise by tokens in
    /// the placeholder (the default). Turning tokens back on writes one at once if the socket
    /// is readable. Any other application attaching the socket turns them back on.
    SetNotify {
        /// Socket.
        handle: u32,
        /// No tokens.
        quiet: bool,
    },
    /// This process dropped its last descriptor for the socket: the handle is released in
    /// this application only; the socket lives until its last placeholder copy anywhere is
    /// closed.
    ///
    /// With `recycle` (version 7) the application also says no other process holds the
    /// placeholder and it keeps its own copy of A for a later socket: if no other
    /// application names the socket either, the daemon closes it now (as at its last close)
    /// and keeps D for the application, after its earlier recycled ones, until an
    /// [`AttachOp::Repool`] moves it to the pool. Completion (the application posts it
    /// sync and takes the answer when it comes): 0 = not kept (D closed; the application
    /// closes A), 1 = kept and no token was ever written into D, 3 = kept, and tokens were
    /// written into D (A may hold some: the application empties it before reuse).
    Forget {
        /// Socket.
        handle: u32,
        /// Keep the placeholder pair for reuse.
        recycle: bool,
    },
    /// Would flowstack carry a connect or sendto to `remote`? Completion: 1 or 0.
    Carries {
        /// Destination.
        remote: SocketAddrV4,
    },
    /// Would flowstack carry a datagram to `remote`? (On the loopback: a flowstack UDP
    /// socket bound to that port.) Completion: 1 or 0.
    UdpCarries {
        /// Destination.
        remote: SocketAddrV4,
    },
    /// A local or peer address; completion: `ip << 16 | port` (ip as a big-endian u32).
    GetAddr {
        /// Socket.
        handle: u32,
        /// The peer's (true) or ours.
        peer: bool,
    },
    /// Part `part` of a connection's TCP_INFO (`crate::tcpinfo`); completion: that part.
    TcpInfo {
        /// Socket.
        handle: u32,
        /// Below `tcpinfo::PARTS`.
        part: u32,
    },
    /// (Version 8.) Which application receives a socket several processes share (its
    /// *holder*: received bytes, end of stream and errors, send credit go there):
    /// [`HoldHow`]. Completion: 1 if this application holds the socket afterwards, else 0.
    /// The application that loses the socket gets [`EventKind::Unheld`].
    Hold {
        /// Socket.
        handle: u32,
        /// Take, or give up.
        how: HoldHow,
    },
    /// (Version 9.) A fused connection's pipe (`flowstack_sys::pipe`, told by
    /// [`EventKind::Fused`]): [`PipeOp`]. No completion.
    Pipe {
        /// Socket.
        handle: u32,
        /// Switch to the pipe, or wake the other end.
        op: PipeOp,
    },
    /// A shim reports a socket it sent to the kernel instead (for `flowstack stats`).
    Report {
        /// Why ([`ReportKind`] code).
        kind: u32,
        /// The destination concerned, if any (else 0.0.0.0:0).
        dst: SocketAddrV4,
    },
}

/// What [`Command::Hold`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldHow {
    /// Become the holder (a process that reads the socket, or waits to).
    Take,
    /// Stop being the holder (before `fork`: the first process to read takes it).
    Release,
}

impl HoldHow {
    fn code(self) -> u32 {
        match self {
            HoldHow::Take => 0,
            HoldHow::Release => 2,
        }
    }
}

/// What [`Command::Pipe`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeOp {
    /// This application sends on the pipe from now on; every byte it sent before is in the
    /// rings ahead of this record. The daemon tells the other end [`EventKind::PipeOpen`]
    /// once those bytes are all delivered.
    Switch,
    /// The other end asked for a wake-up (bytes written, or room freed): the daemon tells
    /// it [`EventKind::PipeNews`].
    Kick,
}

/// Socket type of `Attach{New}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SockType {
    /// TCP.
    Stream,
    /// UDP.
    Dgram,
}

/// What the descriptors of an [`Command::Attach`] are for. The registration stream carries
/// one byte, [`AttachOp::code`], with them:
/// - `New`: D then A of a new placeholder pair; creates a socket of `ty` named `handle`;
/// - `Adopt`: a copy of A; the daemon finds the socket whose placeholder has A's inode and
///   names it `handle` in this application (completion: `kind << 32 | handle`, kind 1 =
///   fresh, 2 = listener, 3 = connection, 4 = datagram, 5 = failed), `ENOTSOCK` if A is no
///   placeholder of ours; the socket's holder stays (version 8: [`Command::Hold`]);
/// - `Place`: D then A for an existing handle without one (an accepted connection);
/// - `KernelListener`: the kernel's listening socket of the same address, watched with the
///   flowstack listener (its readability makes the placeholder readable);
/// - `File` (version 3): a regular file open for reading, attached to connection `handle`
///   of this application for [`Command::TcpSendFile`] (replacing any file attached before)
///   until [`Command::FileRelease`] or the handle's close;
/// - `Wake` (version 4; `handle` 0): an eventfd the daemon signals after publishing events
///   while the application announces sleepers in its header (`flowstack_api::region::at::
///   APP_SLEEPERS`), replacing any given before;
/// - `Pool` (version 6; `handle` = n, 1..=[`POOL_BATCH`]): n placeholder pairs for later
///   sockets, D then A of each, in one message; the daemon keeps them in order, at most
///   [`POOL_MAX`] per application (completion 0, or an error and none kept);
/// - `NewPooled`, `PlacePooled` (version 6): as `New` and `Place`, with no descriptors: the
///   oldest pair of the application's pool is taken (always, even when the call is then
///   refused, so both sides stay in step);
/// - `Repool` (version 7; `handle` = n, 1..=[`POOL_MAX`]; no descriptors): the n oldest pairs
///   kept by `Forget { recycle }` go to the end of the pool, in order (the application
///   sends it once their A's are empty; refused, with nothing moved, if fewer are kept or
///   the pool would pass twice [`POOL_MAX`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachOp {
    /// A new socket.
    New,
    /// An inherited placeholder.
    Adopt,
    /// A placeholder for an existing handle.
    Place,
    /// A kernel listener next to a flowstack listener.
    KernelListener,
    /// A file to send on a connection.
    File,
    /// The application's wake-up eventfd.
    Wake,
    /// Placeholder pairs for later sockets.
    Pool,
    /// `New` with the oldest pooled pair.
    NewPooled,
    /// `Place` with the oldest pooled pair.
    PlacePooled,
    /// Recycled pairs back into the pool.
    Repool,
}

/// Most pairs in one `Attach{Pool}` (two descriptors each, one message).
pub const POOL_BATCH: u32 = 8;

/// Most pooled pairs the daemon keeps per application.
pub const POOL_MAX: usize = 64;

impl AttachOp {
    /// The byte sent with the descriptors.
    pub fn code(self) -> u8 {
        match self {
            AttachOp::New => 1,
            AttachOp::Adopt => 2,
            AttachOp::Place => 3,
            AttachOp::KernelListener => 4,
            AttachOp::File => 5,
            AttachOp::Wake => 6,
            AttachOp::Pool => 7,
            AttachOp::NewPooled => 8,
            AttachOp::PlacePooled => 9,
            AttachOp::Repool => 10,
        }
    }
    /// From [`AttachOp::code`].
    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => AttachOp::New,
            2 => AttachOp::Adopt,
            3 => AttachOp::Place,
            4 => AttachOp::KernelListener,
            5 => AttachOp::File,
            6 => AttachOp::Wake,
            7 => AttachOp::Pool,
            8 => AttachOp::NewPooled,
            9 => AttachOp::PlacePooled,
            10 => AttachOp::Repool,
            _ => return None,
        })
    }
    /// How many descriptors ride with it (`Pool`: two per pair, `handle` pairs; the pooled
    /// ops send no message at all).
    pub fn fds(self) -> usize {
        match self {
            AttachOp::New | AttachOp::Place => 2,
            AttachOp::Adopt | AttachOp::KernelListener | AttachOp::File | AttachOp::Wake => 1,
            AttachOp::Pool => 2 * POOL_BATCH as usize,
            AttachOp::NewPooled | AttachOp::PlacePooled | AttachOp::Repool => 0,
        }
    }
}

/// Why a shim sent a socket to the kernel ([`Command::Report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    /// A destination flowstack does not carry.
    NotCarried = 1,
    /// An option or call the shim does not support on flowstack.
    Unsupported = 2,
    /// The daemon could not be reached.
    NoDaemon = 3,
    /// IPv6 traffic.
    Ipv6 = 4,
    /// Anything else.
    Other = 5,
}

/// The largest [`ReportKind`] code.
pub const REPORT_KINDS: u32 = 5;

/// A command with its request id and mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandRecord {
    /// Request id, echoed by the completion.
    pub id: u32,
    /// Async or sync.
    pub mode: Mode,
    /// The operation.
    pub cmd: Command,
}

// Operation codes (stable within a VERSION).
const OP_TCP_LISTEN: u16 = 1;
const OP_TCP_ACCEPT: u16 = 2;
const OP_TCP_CONNECT: u16 = 3;
const OP_TCP_SEND: u16 = 4;
const OP_TCP_CONSUME: u16 = 5;
const OP_TCP_SHUTDOWN: u16 = 6;
const OP_TCP_CLOSE: u16 = 7;
const OP_TCP_ABORT: u16 = 8;
const OP_TCP_SET_NODELAY: u16 = 9;
const OP_TCP_SEND_FILE: u16 = 10;
const OP_UDP_BIND: u16 = 20;
const OP_UDP_SEND_TO: u16 = 21;
const OP_UDP_CLOSE: u16 = 22;
const OP_ATTACH: u16 = 30;
const OP_BIND: u16 = 31;
/// `Command::Bind` flag: the socket has `SO_REUSEADDR`.
pub const BIND_REUSEADDR: u8 = 1;
/// `Command::Bind` flag: the socket has `SO_REUSEPORT` (socket(7): a group of sockets of
/// one effective uid may bind the same address and port; connections are spread over them).
pub const BIND_REUSEPORT: u8 = 2;

/// `Command::Bind`'s flags for a socket's `SO_REUSEADDR` and `SO_REUSEPORT`.
pub fn bind_flags(reuse_addr: bool, reuse_port: bool) -> u8 {
    (reuse_addr as u8 * BIND_REUSEADDR) | (reuse_port as u8 * BIND_REUSEPORT)
}
const OP_LISTEN: u16 = 32;
const OP_CONNECT: u16 = 33;
const OP_TOKEN_CLEARED: u16 = 34;
const OP_WANT_WRITABLE: u16 = 35;
const OP_FORGET: u16 = 36;
const OP_CARRIES: u16 = 37;
const OP_GET_ADDR: u16 = 38;
const OP_REPORT: u16 = 39;
const OP_FILE_RELEASE: u16 = 40;
const OP_SET_NOTIFY: u16 = 41;
const OP_HOLD: u16 = 42;
const OP_PIPE: u16 = 43;
// 50–59: UDP of the POSIX layer.
const OP_UDP_CARRIES: u16 = 50;
// 60–69: queries of the POSIX layer (version 5).
const OP_TCP_INFO: u16 = 60;

fn put(out: &mut [u8; RECORD_LEN], r: core::ops::Range<usize>, v: &[u8]) {
    out[r].copy_from_slice(v);
}
fn get16(b: &[u8; RECORD_LEN], r: core::ops::Range<usize>) -> u16 {
    u16::from_le_bytes([b[r.start], b[r.start + 1]])
}
fn get32(b: &[u8; RECORD_LEN], r: core::ops::Range<usize>) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[r]);
    u32::from_le_bytes(a)
}
fn get64(b: &[u8; RECORD_LEN], r: core::ops::Range<usize>) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[r]);
    u64::from_le_bytes(a)
}
fn zero(b: &[u8; RECORD_LEN], r: core::ops::Range<usize>) -> bool {
    b[r].iter().all(|&x| x == 0)
}

/// Checks that `offset..offset + len` lies inside an area of `area_len` bytes.
pub fn check_span(offset: u64, len: u64, area_len: usize) -> Result<(usize, usize), RecordError> {
    let end = offset.checked_add(len).ok_or(RecordError::BadSpan)?;
    if end > area_len as u64 {
        return Err(RecordError::BadSpan);
    }
    Ok((offset as usize, len as usize))
}

impl CommandRecord {
    /// Writes the record into `out` (every byte, reserved ones zeroed).
    pub fn encode(&self, out: &mut [u8; RECORD_LEN]) {
        out.fill(0);
        let (op, handle, addr, arg, offset, len) = match self.cmd {
            Command::TcpListen { port, backlog } => (
                OP_TCP_LISTEN,
                0,
                Some((Ipv4Addr::UNSPECIFIED, port)),
                backlog,
                0,
                0,
            ),
            Command::TcpAccept { listener } => (OP_TCP_ACCEPT, listener, None, 0, 0, 0),
            Command::TcpConnect { remote } => (
                OP_TCP_CONNECT,
                0,
                Some((*remote.ip(), remote.port())),
                0,
                0,
                0,
            ),
            Command::TcpSend {
                handle,
                offset,
                len,
            } => (OP_TCP_SEND, handle, None, 0, offset, len),
            Command::TcpConsume { handle, len } => (OP_TCP_CONSUME, handle, None, 0, 0, len),
            Command::TcpShutdown { handle } => (OP_TCP_SHUTDOWN, handle, None, 0, 0, 0),
            Command::TcpClose { handle } => (OP_TCP_CLOSE, handle, None, 0, 0, 0),
            Command::TcpAbort { handle } => (OP_TCP_ABORT, handle, None, 0, 0, 0),
            Command::TcpSetNodelay { handle, on } => {
                (OP_TCP_SET_NODELAY, handle, None, on as u32, 0, 0)
            }
            Command::TcpSendFile {
                handle,
                offset,
                len,
            } => (OP_TCP_SEND_FILE, handle, None, 0, offset, len),
            Command::FileRelease { handle } => (OP_FILE_RELEASE, handle, None, 0, 0, 0),
            Command::UdpBind { port } => {
                (OP_UDP_BIND, 0, Some((Ipv4Addr::UNSPECIFIED, port)), 0, 0, 0)
            }
            Command::UdpSendTo {
                handle,
                dst,
                offset,
                len,
            } => (
                OP_UDP_SEND_TO,
                handle,
                Some((*dst.ip(), dst.port())),
                0,
                offset,
                len,
            ),
            Command::UdpClose { handle } => (OP_UDP_CLOSE, handle, None, 0, 0, 0),
            Command::Attach { handle, op, ty } => {
                let t = match ty {
                    SockType::Stream => 1,
                    SockType::Dgram => 2,
                };
                (OP_ATTACH, handle, None, (op.code() as u32) << 8 | t, 0, 0)
            }
            Command::Bind {
                handle,
                local,
                flags,
            } => (
                OP_BIND,
                handle,
                Some((*local.ip(), local.port())),
                flags as u32,
                0,
                0,
            ),
            Command::Listen { handle, backlog } => (OP_LISTEN, handle, None, backlog, 0, 0),
            Command::Connect { handle, remote } => (
                OP_CONNECT,
                handle,
                Some((*remote.ip(), remote.port())),
                0,
                0,
                0,
            ),
            Command::TokenCleared { handle, seen } => (OP_TOKEN_CLEARED, handle, None, seen, 0, 0),
            Command::WantWritable { handle } => (OP_WANT_WRITABLE, handle, None, 0, 0, 0),
            Command::SetNotify { handle, quiet } => {
                (OP_SET_NOTIFY, handle, None, quiet as u32, 0, 0)
            }
            Command::Forget { handle, recycle } => (OP_FORGET, handle, None, recycle as u32, 0, 0),
            Command::Carries { remote } => {
                (OP_CARRIES, 0, Some((*remote.ip(), remote.port())), 0, 0, 0)
            }
            Command::UdpCarries { remote } => (
                OP_UDP_CARRIES,
                0,
                Some((*remote.ip(), remote.port())),
                0,
                0,
                0,
            ),
            Command::GetAddr { handle, peer } => (OP_GET_ADDR, handle, None, peer as u32, 0, 0),
            Command::TcpInfo { handle, part } => (OP_TCP_INFO, handle, None, part, 0, 0),
            Command::Hold { handle, how } => (OP_HOLD, handle, None, how.code(), 0, 0),
            Command::Pipe { handle, op } => (OP_PIPE, handle, None, op as u32, 0, 0),
            Command::Report { kind, dst } => {
                (OP_REPORT, 0, Some((*dst.ip(), dst.port())), kind, 0, 0)
            }
        };
        put(out, field::OP, &op.to_le_bytes());
        let mode: u16 = match self.mode {
            Mode::Async => 0,
            Mode::Sync => 1,
        };
        put(out, field::MODE, &mode.to_le_bytes());
        put(out, field::ID, &self.id.to_le_bytes());
        put(out, field::HANDLE, &handle.to_le_bytes());
        if let Some((ip, port)) = addr {
            put(out, field::ADDR, &ip.octets());
            put(out, field::PORT, &port.to_le_bytes());
        }
        put(out, field::ARG, &arg.to_le_bytes());
        put(out, field::OFFSET, &offset.to_le_bytes());
        put(out, field::LEN, &len.to_le_bytes());
    }

    /// Reads and validates a record from untrusted memory.
    pub fn decode(b: &[u8; RECORD_LEN]) -> Result<Self, RecordError> {
        if !zero(b, field::RESERVED_A) || !zero(b, field::RESERVED_TAIL) {
            return Err(RecordError::ReservedNotZero);
        }
        let mode = match get16(b, field::MODE) {
            0 => Mode::Async,
            1 => Mode::Sync,
            m => return Err(RecordError::BadMode(m)),
        };
        let handle = get32(b, field::HANDLE);
        if handle > MAX_HANDLE {
            return Err(RecordError::BadHandle(handle));
        }
        let a = &b[field::ADDR];
        let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
        let port = get16(b, field::PORT);
        let arg = get32(b, field::ARG);
        let offset = get64(b, field::OFFSET);
        let len = get64(b, field::LEN);
        if len > MAX_SPAN || offset.checked_add(len).is_none() {
            return Err(RecordError::BadSpan);
        }
        // Fields an operation does not use must be zero, so garbage is never half-accepted.
        let unused = |addr: bool, arg_: bool, off: bool, len_: bool| {
            let bad = (addr && (get32(b, field::ADDR) != 0 || port != 0))
                || (arg_ && arg != 0)
                || (off && offset != 0)
                || (len_ && len != 0);
            if bad {
                Err(RecordError::ReservedNotZero)
            } else {
                Ok(())
            }
        };
        let no_handle = || {
            if handle != 0 {
                Err(RecordError::ReservedNotZero)
            } else {
                Ok(())
            }
        };
        let cmd = match get16(b, field::OP) {
            OP_TCP_LISTEN => {
                no_handle()?;
                unused(false, false, true, true)?;
                if port == 0 || !ip.is_unspecified() {
                    return Err(RecordError::BadArgument);
                }
                Command::TcpListen { port, backlog: arg }
            }
            OP_TCP_ACCEPT => {
                unused(true, true, true, true)?;
                Command::TcpAccept { listener: handle }
            }
            OP_TCP_CONNECT => {
                no_handle()?;
                unused(false, true, true, true)?;
                if port == 0 {
                    return Err(RecordError::BadArgument);
                }
                Command::TcpConnect {
                    remote: SocketAddrV4::new(ip, port),
                }
            }
            OP_TCP_SEND => {
                unused(true, true, false, false)?;
                Command::TcpSend {
                    handle,
                    offset,
                    len,
                }
            }
            OP_TCP_CONSUME => {
                unused(true, true, true, false)?;
                Command::TcpConsume { handle, len }
            }
            OP_TCP_SHUTDOWN => {
                unused(true, true, true, true)?;
                Command::TcpShutdown { handle }
            }
            OP_TCP_CLOSE => {
                unused(true, true, true, true)?;
                Command::TcpClose { handle }
            }
            OP_TCP_ABORT => {
                unused(true, true, true, true)?;
                Command::TcpAbort { handle }
            }
            OP_TCP_SET_NODELAY => {
                unused(true, false, true, true)?;
                if arg > 1 {
                    return Err(RecordError::BadArgument);
                }
                Command::TcpSetNodelay {
                    handle,
                    on: arg == 1,
                }
            }
            OP_TCP_SEND_FILE => {
                unused(true, true, false, false)?;
                // A file offset: its end must be an `off_t` (as `sendfile(2)` checks).
                if offset + len > i64::MAX as u64 {
                    return Err(RecordError::BadSpan);
                }
                Command::TcpSendFile {
                    handle,
                    offset,
                    len,
                }
            }
            OP_FILE_RELEASE => {
                unused(true, true, true, true)?;
                Command::FileRelease { handle }
            }
            OP_UDP_BIND => {
                no_handle()?;
                unused(false, true, true, true)?;
                if !ip.is_unspecified() {
                    return Err(RecordError::BadArgument);
                }
                Command::UdpBind { port }
            }
            OP_UDP_SEND_TO => {
                unused(false, true, false, false)?;
                if port == 0 || len > 65507 {
                    return Err(RecordError::BadArgument);
                }
                Command::UdpSendTo {
                    handle,
                    dst: SocketAddrV4::new(ip, port),
                    offset,
                    len,
                }
            }
            OP_UDP_CLOSE => {
                unused(true, true, true, true)?;
                Command::UdpClose { handle }
            }
            OP_ATTACH => {
                unused(true, false, true, true)?;
                let op = AttachOp::from_code((arg >> 8) as u8).ok_or(RecordError::BadArgument)?;
                let ty = match arg & 0xff {
                    1 => SockType::Stream,
                    2 => SockType::Dgram,
                    _ => return Err(RecordError::BadArgument),
                };
                if arg >> 16 != 0 {
                    return Err(RecordError::BadArgument);
                }
                Command::Attach { handle, op, ty }
            }
            OP_BIND => {
                unused(false, false, true, true)?;
                if arg & !u32::from(BIND_REUSEADDR | BIND_REUSEPORT) != 0 {
                    return Err(RecordError::BadArgument);
                }
                Command::Bind {
                    handle,
                    local: SocketAddrV4::new(ip, port),
                    flags: arg as u8,
                }
            }
            OP_LISTEN => {
                unused(true, false, true, true)?;
                Command::Listen {
                    handle,
                    backlog: arg,
                }
            }
            OP_CONNECT => {
                unused(false, true, true, true)?;
                if port == 0 && !ip.is_unspecified() {
                    return Err(RecordError::BadArgument);
                }
                Command::Connect {
                    handle,
                    remote: SocketAddrV4::new(ip, port),
                }
            }
            OP_TOKEN_CLEARED => {
                unused(true, false, true, true)?;
                Command::TokenCleared { handle, seen: arg }
            }
            OP_WANT_WRITABLE => {
                unused(true, true, true, true)?;
                Command::WantWritable { handle }
            }
            OP_SET_NOTIFY => {
                unused(true, false, true, true)?;
                if arg > 1 {
                    return Err(RecordError::BadArgument);
                }
                Command::SetNotify {
                    handle,
                    quiet: arg == 1,
                }
            }
            OP_FORGET => {
                unused(true, false, true, true)?;
                if arg > 1 {
                    return Err(RecordError::BadArgument);
                }
                Command::Forget {
                    handle,
                    recycle: arg == 1,
                }
            }
            OP_CARRIES => {
                no_handle()?;
                unused(false, true, true, true)?;
                Command::Carries {
                    remote: SocketAddrV4::new(ip, port),
                }
            }
            OP_UDP_CARRIES => {
                no_handle()?;
                unused(false, true, true, true)?;
                Command::UdpCarries {
                    remote: SocketAddrV4::new(ip, port),
                }
            }
            OP_GET_ADDR => {
                unused(true, false, true, true)?;
                if arg > 1 {
                    return Err(RecordError::BadArgument);
                }
                Command::GetAddr {
                    handle,
                    peer: arg == 1,
                }
            }
            OP_TCP_INFO if arg < crate::tcpinfo::PARTS => {
                unused(true, false, true, true)?;
                Command::TcpInfo { handle, part: arg }
            }
            OP_HOLD => {
                unused(true, false, true, true)?;
                let how = match arg {
                    0 => HoldHow::Take,
                    2 => HoldHow::Release,
                    _ => return Err(RecordError::BadArgument),
                };
                Command::Hold { handle, how }
            }
            OP_PIPE => {
                unused(true, false, true, true)?;
                let op = match arg {
                    0 => PipeOp::Switch,
                    1 => PipeOp::Kick,
                    _ => return Err(RecordError::BadArgument),
                };
                Command::Pipe { handle, op }
            }
            OP_REPORT => {
                no_handle()?;
                unused(false, false, true, true)?;
                if arg == 0 || arg > REPORT_KINDS {
                    return Err(RecordError::BadArgument);
                }
                Command::Report {
                    kind: arg,
                    dst: SocketAddrV4::new(ip, port),
                }
            }
            op => return Err(RecordError::UnknownOp(op)),
        };
        Ok(CommandRecord {
            id: get32(b, field::ID),
            mode,
            cmd,
        })
    }
}

mod event;
pub use event::{EventKind, EventRecord, FUSED_OPEN, FUSED_SWITCHED, FUSED_WRITES_1, PIPE_TAG};

#[cfg(test)]
mod tests;
