//! The POSIX layer's plain types: errno values, socket ids, flags, options, readiness.

use flowstack_api::SocketError;

/// A kernel errno value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// Interrupted.
    pub const EINTR: Errno = Errno(4);
    /// Bad descriptor / handle.
    pub const EBADF: Errno = Errno(9);
    /// Would block.
    pub const EAGAIN: Errno = Errno(11);
    /// Invalid argument.
    pub const EINVAL: Errno = Errno(22);
    /// Broken pipe.
    pub const EPIPE: Errno = Errno(32);
    /// Not a socket.
    pub const ENOTSOCK: Errno = Errno(88);
    /// Operation not supported.
    pub const EOPNOTSUPP: Errno = Errno(95);
    /// Address in use.
    pub const EADDRINUSE: Errno = Errno(98);
    /// Connection reset.
    pub const ECONNRESET: Errno = Errno(104);
    /// Already connected.
    pub const EISCONN: Errno = Errno(106);
    /// Not connected.
    pub const ENOTCONN: Errno = Errno(107);
    /// Timed out.
    pub const ETIMEDOUT: Errno = Errno(110);
    /// Connection refused.
    pub const ECONNREFUSED: Errno = Errno(111);
    /// A connect is already in progress.
    pub const EALREADY: Errno = Errno(114);
    /// Connect started, not finished.
    pub const EINPROGRESS: Errno = Errno(115);
}

impl From<SocketError> for Errno {
    fn from(e: SocketError) -> Self {
        Errno(e.errno())
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "errno {}", self.0)
    }
}

impl std::error::Error for Errno {}

/// This process's name for a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockId(pub u32);

/// Socket type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// TCP.
    Stream,
    /// UDP (see the `udp` module of `posix`).
    Dgram,
}

/// Descriptor flags a new placeholder is created with (`SOCK_CLOEXEC`, `SOCK_NONBLOCK` of
/// `socket(2)`/`accept4(2)`): set by the `socketpair` itself, no `fcntl` after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdFlags {
    /// Close-on-exec.
    pub cloexec: bool,
    /// `O_NONBLOCK` (on the open file description: shared with every dup).
    pub nonblock: bool,
}

impl Default for FdFlags {
    /// Close-on-exec and blocking: what [`Posix::socket`](super::Posix::socket) and
    /// [`Posix::accept`](super::Posix::accept) give.
    fn default() -> Self {
        Self {
            cloexec: true,
            nonblock: false,
        }
    }
}

/// Which path an accepted connection took.
#[derive(Debug)]
pub enum Path {
    /// Through flowstack.
    Flowstack,
}

/// `recv` flags.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvFlags {
    /// `MSG_PEEK`.
    pub peek: bool,
    /// `MSG_WAITALL`.
    pub waitall: bool,
    /// `MSG_DONTWAIT` or `O_NONBLOCK`.
    pub nonblock: bool,
}

impl RecvFlags {
    /// A blocking read, no flags.
    pub const BLOCK: Self = Self {
        peek: false,
        waitall: false,
        nonblock: false,
    };
    /// `MSG_DONTWAIT`.
    pub const NONBLOCK: Self = Self {
        nonblock: true,
        ..Self::BLOCK
    };
    /// `MSG_PEEK`, blocking.
    pub const PEEK: Self = Self {
        peek: true,
        ..Self::BLOCK
    };
}

/// `shutdown(2)`'s `how`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// `SHUT_RD`.
    Read,
    /// `SHUT_WR`.
    Write,
    /// `SHUT_RDWR`.
    Both,
}

/// Socket options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opt {
    /// `TCP_NODELAY` (applied).
    NoDelay,
    /// `SO_KEEPALIVE`.
    KeepAlive,
    /// `TCP_KEEPIDLE` (seconds).
    KeepIdle,
    /// `TCP_KEEPINTVL` (seconds).
    KeepIntvl,
    /// `TCP_KEEPCNT`.
    KeepCnt,
    /// `SO_LINGER` (seconds; negative: off).
    Linger,
    /// `SO_RCVBUF`.
    RcvBuf,
    /// `SO_SNDBUF`.
    SndBuf,
    /// `TCP_USER_TIMEOUT` (ms).
    UserTimeout,
    /// `TCP_CORK`.
    Cork,
    /// `SO_REUSEADDR`.
    ReuseAddr,
    /// `SO_REUSEPORT`.
    ReusePort,
}

/// What `poll` would say, from this process's own view (no system call but the token check
/// of a listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Readiness {
    /// Data, end of stream, an error, or a connection to accept.
    pub readable: bool,
    /// Send space (connected).
    pub writable: bool,
    /// The peer closed (or the connection failed).
    pub hup: bool,
    /// A pending error (`SO_ERROR`).
    pub error: Option<Errno>,
}

/// `TCP_INFO`'s common fields.
pub use flowstack_api::tcpinfo::TcpInfo;
