//! Socket-level errors, one table for every API: the engine, the offload client and the
//! preload shim (which hands [`SocketError::errno`] to C callers) all use it.

use core::fmt;

/// What went wrong with a socket operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SocketError {
    /// Nothing to do now; try again after the engine has been polled (EAGAIN).
    WouldBlock,
    /// The port is already bound (EADDRINUSE).
    AddrInUse,
    /// No free ephemeral port (EADDRNOTAVAIL).
    AddrNotAvailable,
    /// The handle names no open socket (EBADF).
    InvalidHandle,
    /// The datagram is larger than the protocol allows (EMSGSIZE).
    MessageTooLong,
    /// No route to the destination (ENETUNREACH).
    NoRoute,
    /// The peer refused: RST to our SYN or ICMP port unreachable (ECONNREFUSED).
    ConnectionRefused,
    /// The peer reset the connection (ECONNRESET).
    ConnectionReset,
    /// The connection was aborted locally (ECONNABORTED).
    ConnectionAborted,
    /// The peer stopped answering (ETIMEDOUT).
    TimedOut,
    /// The receive buffer is smaller than the next datagram, which stays queued (EMSGSIZE).
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
    },
    /// The socket is not connected (ENOTCONN).
    NotConnected,
    /// The operation is not valid in the socket's state (EINVAL).
    InvalidState,
    /// The send side was shut down (EPIPE).
    BrokenPipe,
    /// A configured limit was reached (ENOBUFS / EMFILE).
    LimitReached,
    /// Invalid argument (EINVAL).
    InvalidArgument,
    /// The link is gone (e.g. the peer process of a shm wire died) (ENETDOWN).
    LinkDown,
}

impl SocketError {
    /// The Linux errno value for this error.
    pub fn errno(self) -> i32 {
        match self {
            SocketError::WouldBlock => 11,
            SocketError::AddrInUse => 98,
            SocketError::AddrNotAvailable => 99,
            SocketError::InvalidHandle => 9,
            SocketError::MessageTooLong | SocketError::BufferTooSmall { .. } => 90,
            SocketError::NoRoute => 101,
            SocketError::ConnectionRefused => 111,
            SocketError::ConnectionReset => 104,
            SocketError::ConnectionAborted => 103,
            SocketError::TimedOut => 110,
            SocketError::NotConnected => 107,
            SocketError::InvalidState | SocketError::InvalidArgument => 22,
            SocketError::BrokenPipe => 32,
            SocketError::LimitReached => 105,
            SocketError::LinkDown => 100,
        }
    }

    /// The error an errno value stands for, for the side of a ring that receives `-errno`.
    /// Values that two errors share decode to the more general one (`EINVAL` →
    /// `InvalidArgument`, `EMSGSIZE` → `MessageTooLong`); unknown values → `InvalidArgument`.
    pub fn from_errno(errno: i32) -> SocketError {
        match errno {
            11 => SocketError::WouldBlock,
            98 => SocketError::AddrInUse,
            99 => SocketError::AddrNotAvailable,
            9 => SocketError::InvalidHandle,
            90 => SocketError::MessageTooLong,
            101 => SocketError::NoRoute,
            111 => SocketError::ConnectionRefused,
            104 => SocketError::ConnectionReset,
            103 => SocketError::ConnectionAborted,
            110 => SocketError::TimedOut,
            107 => SocketError::NotConnected,
            32 => SocketError::BrokenPipe,
            105 => SocketError::LimitReached,
            100 => SocketError::LinkDown,
            _ => SocketError::InvalidArgument,
        }
    }
}

impl fmt::Display for SocketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocketError::WouldBlock => f.write_str("operation would block"),
            SocketError::AddrInUse => f.write_str("address in use"),
            SocketError::AddrNotAvailable => f.write_str("no free local port"),
            SocketError::InvalidHandle => f.write_str("invalid socket handle"),
            SocketError::MessageTooLong => f.write_str("message too long"),
            SocketError::NoRoute => f.write_str("no route to host"),
            SocketError::ConnectionRefused => f.write_str("connection refused"),
            SocketError::ConnectionReset => f.write_str("connection reset by peer"),
            SocketError::ConnectionAborted => f.write_str("connection aborted"),
            SocketError::TimedOut => f.write_str("connection timed out"),
            SocketError::BufferTooSmall { needed } => {
                write!(f, "buffer too small: next datagram needs {needed} bytes")
            }
            SocketError::NotConnected => f.write_str("socket not connected"),
            SocketError::InvalidState => f.write_str("invalid in the socket's state"),
            SocketError::BrokenPipe => f.write_str("broken pipe: sending side shut down"),
            SocketError::LimitReached => f.write_str("configured limit reached"),
            SocketError::InvalidArgument => f.write_str("invalid argument"),
            SocketError::LinkDown => f.write_str("link down: the peer is gone"),
        }
    }
}

impl std::error::Error for SocketError {}

#[cfg(test)]
mod tests {
    use super::SocketError as E;

    #[test]
    fn errno_round_trips_for_every_error_with_its_own_value() {
        let own = [
            E::WouldBlock,
            E::AddrInUse,
            E::AddrNotAvailable,
            E::InvalidHandle,
            E::MessageTooLong,
            E::NoRoute,
            E::ConnectionRefused,
            E::ConnectionReset,
            E::ConnectionAborted,
            E::TimedOut,
            E::NotConnected,
            E::BrokenPipe,
            E::LimitReached,
            E::LinkDown,
            E::InvalidArgument,
        ];
        for e in own {
            assert_eq!(E::from_errno(e.errno()), e, "{e:?}");
        }
        assert_eq!(E::from_errno(E::InvalidState.errno()), E::InvalidArgument);
        assert_eq!(
            E::from_errno(E::BufferTooSmall { needed: 9 }.errno()),
            E::MessageTooLong
        );
        assert_eq!(E::from_errno(-5), E::InvalidArgument);
    }
}
