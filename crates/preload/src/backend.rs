//! What the shim needs from the daemon: the socket calls of `flowstack_client::posix`.
//!
//! Each flowstack socket's descriptor is a placeholder, one end of a unix socketpair whose
//! other end the daemon holds, so the kernel's own poll/select/epoll see it become readable
//! (a token byte) and writable; the posix layer keeps those tokens right. The shim only calls
//! the operations below, always non-blocking: blocking is the shim's `poll(2)` on the
//! placeholder followed by the call again, so signals interrupt a blocked call as they do in
//! the kernel.
//!
//! All errors are the kernel's errno values.

use crate::table::SockId;
use std::net::SocketAddrV4;
use std::os::fd::OwnedFd;

/// An errno value.
pub type Errno = i32;

/// A connection taken from a listening socket.
#[derive(Debug)]
pub enum Accepted {
    /// Through flowstack: its placeholder and socket.
    Flowstack(OwnedFd, SockId, SocketAddrV4),
    /// Through the kernel listener (an ordinary client): a kernel socket.
    Kernel(OwnedFd),
}

/// The daemon's socket calls, as the shim uses them.
pub trait Backend: Sync {
    /// A new socket (`dgram`: UDP) and its placeholder descriptor.
    fn socket(&self, dgram: bool) -> Result<(OwnedFd, SockId), Errno>;
    /// Whether an inherited descriptor (after exec, or received over a unix socket) is a
    /// placeholder, and of which socket.
    fn adopt(&self, fd: i32) -> Option<SockId>;
    /// Whether flowstack serves this destination (else the socket moves to the kernel).
    fn carries(&self, dst: SocketAddrV4) -> bool;
    /// bind(2).
    fn bind(&self, id: SockId, a: SocketAddrV4) -> Result<(), Errno>;
    /// listen(2); `kernel` also listens in the kernel for ordinary clients.
    fn listen(&self, id: SockId, backlog: i32, kernel: Option<OwnedFd>) -> Result<(), Errno>;
    /// accept(2), non-blocking: `EAGAIN` when none is waiting.
    fn accept(&self, id: SockId) -> Result<Accepted, Errno>;
    /// connect(2), non-blocking: `EINPROGRESS`, then `EALREADY`, then `EISCONN`.
    fn connect(&self, id: SockId, a: SocketAddrV4) -> Result<(), Errno>;
    /// send(2)/sendto(2), non-blocking, `MSG_*` flags as given.
    fn sendto(
        &self,
        id: SockId,
        buf: &[u8],
        flags: i32,
        dst: Option<SocketAddrV4>,
    ) -> Result<usize, Errno>;
    /// recv(2)/recvfrom(2), non-blocking (`MSG_PEEK` honoured); the source for datagrams.
    fn recvfrom(
        &self,
        id: SockId,
        buf: &mut [u8],
        flags: i32,
    ) -> Result<(usize, Option<SocketAddrV4>), Errno>;
    /// shutdown(2).
    fn shutdown(&self, id: SockId, how: i32) -> Result<(), Errno>;
    /// getsockname(2).
    fn local_addr(&self, id: SockId) -> Result<SocketAddrV4, Errno>;
    /// getpeername(2).
    fn peer_addr(&self, id: SockId) -> Result<SocketAddrV4, Errno>;
    /// SO_ERROR, read and cleared (0: none).
    fn take_error(&self, id: SockId) -> Errno;
    /// setsockopt(2) for options the shim does not answer itself.
    fn set_option(&self, id: SockId, level: i32, name: i32, val: &[u8]) -> Result<(), Errno>;
    /// getsockopt(2) for options the shim does not answer itself; bytes written.
    fn get_option(&self, id: SockId, level: i32, name: i32, out: &mut [u8])
        -> Result<usize, Errno>;
    /// FIONREAD.
    fn readable_bytes(&self, id: SockId) -> usize;
    /// SIOCOUTQ.
    fn unsent_bytes(&self, id: SockId) -> usize;
    /// The last descriptor of this socket in this process is closed.
    fn forget(&self, id: SockId);
    /// In the child of a fork, before anything else.
    fn after_fork(&self);
    /// One line of the per-process summary for `flowstack stats`.
    fn report(&self, line: &str);
}

/// The daemon API this build links, or why there is none.
pub fn connect() -> Result<&'static dyn Backend, String> {
    Err("this build has no daemon API for unmodified programs \
         (flowstack_client::posix is not there yet)"
        .into())
}
