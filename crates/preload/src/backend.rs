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
pub use flowstack_client::posix::FdFlags;
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
    /// A new socket (`dgram`: UDP) and its placeholder descriptor, created with the
    /// descriptor flags `fl`.
    fn socket(&self, dgram: bool, fl: FdFlags) -> Result<(OwnedFd, SockId), Errno>;
    /// Whether an inherited descriptor (after exec, or received over a unix socket) is a
    /// placeholder, and of which socket.
    fn adopt(&self, fd: i32) -> Option<SockId>;
    /// Whether flowstack serves this destination (else the socket moves to the kernel).
    fn carries(&self, dst: SocketAddrV4) -> bool;
    /// Whether flowstack serves this datagram destination (a flowstack UDP socket holds
    /// that loopback port); else the socket moves to the kernel.
    fn carries_dgram(&self, _id: SockId, _dst: SocketAddrV4) -> bool {
        false
    }
    /// bind(2).
    fn bind(&self, id: SockId, a: SocketAddrV4) -> Result<(), Errno>;
    /// listen(2); `kernel` also listens in the kernel for ordinary clients.
    fn listen(&self, id: SockId, backlog: i32, kernel: Option<OwnedFd>) -> Result<(), Errno>;
    /// accept(2), non-blocking: `EAGAIN` when none is waiting. A flowstack connection's
    /// placeholder is created with the descriptor flags `fl`.
    fn accept(&self, id: SockId, fl: FdFlags) -> Result<Accepted, Errno>;
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
    /// sendfile(2) from regular file `in_fd` at `offset`, non-blocking: the daemon reads
    /// the file (zero-copy path); the caller moves the offset or file position.
    fn send_file(&self, id: SockId, in_fd: i32, offset: u64, len: usize) -> Result<usize, Errno>;
    /// FIONREAD.
    fn readable_bytes(&self, id: SockId) -> usize;
    /// SIOCOUTQ.
    fn unsent_bytes(&self, id: SockId) -> usize;
    /// The last descriptor of this socket in this process is closed.
    fn forget(&self, id: SockId);
    /// The socket's placeholder may now be held or watched outside this library (sent with
    /// `SCM_RIGHTS`, added to a kernel epoll set): it is never reused.
    fn pin(&self, _id: SockId) {}
    /// In the child of a fork, before anything else.
    fn after_fork(&self);
    /// Before fork or exec: waits for the daemon's answers to placeholders posted and not
    /// yet answered (`socket()`, `accept()`), so another process can adopt them.
    fn settle(&self) {}
    /// [`Backend::settle`], then the library's lock held until the result is dropped (the
    /// shim's `fork`, `flowstack_client::posix::Posix::settle_for_fork`).
    fn settle_for_fork(&self) -> Option<posix::ForkHold<'_>> {
        self.settle();
        None
    }
    /// Tells the daemon a socket went to the kernel and why (`flowstack stats`).
    fn report(&self, why: crate::addr::Reason, dst: Option<SocketAddrV4>);

    // ---- readiness fast path (`epoll`; `flowstack_client::posix` fast module) ----------
    /// Stops tokens for `id` if its readiness can be computed in this process; `Ok(false)`:
    /// watch the placeholder in the kernel instead.
    fn watch(&self, _id: SockId) -> Result<bool, Errno> {
        Ok(false)
    }
    /// Tokens again for `id` (before anyone sleeps on its placeholder in the kernel).
    fn tokens_on(&self, _id: SockId) {}
    /// A kernel epoll set waits for input on `id`: this process takes it from another that
    /// may hold it (`flowstack_client::posix` `hold`).
    fn want_read(&self, _id: SockId) {}
    /// A thread starts (`on`) or ends sleeping in the kernel on `ids`' placeholders.
    fn waiting(&self, _ids: &[SockId], _on: bool) {}
    /// `id`'s placeholder is in an epoll set the kernel keeps.
    fn in_kernel_set(&self, _id: SockId) {}
    /// The kernel said `id`'s placeholder is readable: false if this process's view says
    /// it is not (a stale token, now taken back: do not report it).
    fn confirm_readable(&self, _id: SockId) -> bool {
        true
    }
    /// Listener `id`'s readiness is also computed here (an epoll set watches its view):
    /// accepts on it are asked ahead (`Posix::accept_ahead`).
    fn accept_ahead(&self, _id: SockId) {}
    /// Drains the events and answers for `ids` (None: not computable here); returns the
    /// pump count for [`Backend::sleep_begin`]. `reads[i]`: the caller waits for input on
    /// `ids[i]` (a socket shared with another process is taken for this one). `woken`: the
    /// caller sleeps on the wake-up channel (the shim's epoll), not on placeholders.
    fn ready_many(
        &self,
        _ids: &[SockId],
        _reads: &[bool],
        _woken: bool,
        _out: &mut Vec<Option<FastReady>>,
    ) -> Result<u64, Errno> {
        Err(libc::ENOSYS)
    }
    /// Drains the events and appends to `out` the sockets that may have changed since `cur`
    /// (`Posix::changed`); returns whether that is known (false: look at every socket) and
    /// the pump count for [`Backend::sleep_begin`].
    fn changed(&self, _cur: &mut Cursor, _out: &mut Vec<SockId>) -> Result<(bool, u64), Errno> {
        Ok((false, 0))
    }
    /// The placeholder of `id` is writable again.
    fn unblock(&self, _id: SockId) {}
    /// This process's wake-up descriptor.
    fn wake_fd(&self) -> Result<i32, Errno> {
        Err(libc::ENOSYS)
    }
    /// Moves the library's own descriptor numbered `fd` elsewhere (the program is about to
    /// `dup2` onto it, `flowstack_sys::ownfd`); false if it has none by that number.
    fn move_own(&self, _fd: i32) -> bool {
        false
    }
    /// Announces a sleep; None: something arrived since pump count `gen`.
    fn sleep_begin(&self, _gen: u64, _writable: bool) -> Result<Option<SleepTicket>, Errno> {
        Err(libc::ENOSYS)
    }
    /// Ends a sleep (`pair_ready`: the wait saw the wake-up descriptor readable); true if
    /// the daemon is gone.
    fn sleep_end(&self, _t: SleepTicket, _pair_ready: bool) -> bool {
        true
    }
    /// The wake-up descriptor was readable in a wait that did not sleep
    /// (`Posix::drain_awake`).
    fn drain_awake(&self) {}
}

pub use flowstack_client::posix::{Cursor, FastReady, SleepTicket};

/// The daemon API: `flowstack_client::posix` on the daemon named by `FLOWSTACK_SOCKET`
/// (or the default path), registered now; `Err` says why not.
pub fn connect() -> Result<&'static dyn Backend, String> {
    match Posix::global() {
        Ok(p) => {
            static ADAPTER: std::sync::OnceLock<PosixBackend> = std::sync::OnceLock::new();
            Ok(ADAPTER.get_or_init(|| PosixBackend {
                p,
                scratch: std::sync::Mutex::new(None),
            }))
        }
        Err(e) => Err(format!("{e} ({})", posix::default_socket_path().display())),
    }
}

use flowstack_client::posix::{self, Opt, Posix, RecvFlags, Shutdown};
use flowstack_sys::ownfd::Own;
use std::os::fd::{AsRawFd, BorrowedFd};

/// [`Backend`] over `flowstack_client::posix`, always non-blocking (the shim sleeps itself).
struct PosixBackend {
    p: &'static Posix,
    /// A kernel TCP socket that answers options flowstack does not know, as the kernel
    /// would (value checks, defaults, `ENOPROTOOPT`).
    /// The library's own (`ownfd`).
    scratch: std::sync::Mutex<Option<Own<OwnedFd>>>,
}

fn opt_of(level: i32, name: i32) -> Option<Opt> {
    Some(match (level, name) {
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => Opt::NoDelay,
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => Opt::KeepAlive,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => Opt::KeepIdle,
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => Opt::KeepIntvl,
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => Opt::KeepCnt,
        (libc::SOL_SOCKET, libc::SO_LINGER) => Opt::Linger,
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => Opt::RcvBuf,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => Opt::SndBuf,
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) => Opt::UserTimeout,
        (libc::IPPROTO_TCP, libc::TCP_CORK) => Opt::Cork,
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => Opt::ReuseAddr,
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => Opt::ReusePort,
        _ => return None,
    })
}

impl PosixBackend {
    /// Runs `f` on the scratch kernel socket (created on first use).
    fn on_scratch(&self, f: impl FnOnce(i32) -> i32) -> Result<(), Errno> {
        use std::os::fd::FromRawFd;
        let mut g = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            // SAFETY: a new kernel socket, owned by the OwnedFd at once.
            let k = unsafe {
                crate::real::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
            };
            if k < 0 {
                return Err(crate::real::errno());
            }
            // SAFETY: `k` is ours and open.
            *g = Some(Own::lift(unsafe { OwnedFd::from_raw_fd(k) }));
        }
        let fd = g.as_ref().map(|k| k.as_raw_fd()).unwrap_or(-1);
        if f(fd) < 0 {
            Err(crate::real::errno())
        } else {
            Ok(())
        }
    }
}

fn e(x: posix::Errno) -> Errno {
    x.0
}

fn int_of(val: &[u8]) -> Result<i64, Errno> {
    let b: [u8; 4] = val
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(libc::EINVAL)?;
    Ok(i32::from_ne_bytes(b) as i64)
}

impl Backend for PosixBackend {
    fn socket(&self, dgram: bool, fl: FdFlags) -> Result<(OwnedFd, SockId), Errno> {
        let ty = if dgram {
            posix::Type::Dgram
        } else {
            posix::Type::Stream
        };
        self.p
            .socket_with(ty, fl)
            .map(|(fd, id)| (fd, id.0))
            .map_err(e)
    }
    fn adopt(&self, fd: i32) -> Option<SockId> {
        // SAFETY: `fd` is open for the duration of this call (the caller just received or
        // inherited it).
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        self.p.adopt(b).ok().flatten().map(|id| id.0)
    }
    fn carries(&self, dst: SocketAddrV4) -> bool {
        self.p.carries(dst).unwrap_or(false)
    }
    fn carries_dgram(&self, id: SockId, dst: SocketAddrV4) -> bool {
        self.p
            .carries_dgram(posix::SockId(id), dst)
            .unwrap_or(false)
    }
    fn bind(&self, id: SockId, a: SocketAddrV4) -> Result<(), Errno> {
        self.p.bind(posix::SockId(id), a).map(|_| ()).map_err(e)
    }
    fn listen(&self, id: SockId, backlog: i32, kernel: Option<OwnedFd>) -> Result<(), Errno> {
        let backlog = backlog.clamp(1, 65535) as u32;
        self.p
            .listen(posix::SockId(id), backlog, kernel)
            .map(|_| ())
            .map_err(e)
    }
    fn accept(&self, id: SockId, fl: FdFlags) -> Result<Accepted, Errno> {
        self.p
            .accept_with(posix::SockId(id), true, None, fl)
            .map(|(fd, nid, peer, _)| Accepted::Flowstack(fd, nid.0, peer))
            .map_err(e)
    }
    fn connect(&self, id: SockId, a: SocketAddrV4) -> Result<(), Errno> {
        self.p.connect(posix::SockId(id), a, true, None).map_err(e)
    }
    fn sendto(
        &self,
        id: SockId,
        buf: &[u8],
        _flags: i32,
        dst: Option<SocketAddrV4>,
    ) -> Result<usize, Errno> {
        // A destination on a stream socket is ignored, as Linux does for TCP.
        self.p
            .send_to(posix::SockId(id), buf, dst, true, None)
            .map_err(e)
    }
    fn recvfrom(
        &self,
        id: SockId,
        buf: &mut [u8],
        flags: i32,
    ) -> Result<(usize, Option<SocketAddrV4>), Errno> {
        let f = RecvFlags {
            peek: flags & libc::MSG_PEEK != 0,
            waitall: false,
            nonblock: true,
        };
        let id = posix::SockId(id);
        let (n, src) = self.p.recv_from(id, buf, f, None).map_err(e)?;
        if src.is_some() {
            // A datagram (its real length, perhaps more than `buf`).
            return Ok((n, src));
        }
        if !f.peek && n > 0 && n < buf.len() {
            // Probably drained: a peek that finds nothing takes the readiness tokens back
            // now, so level-triggered poll/epoll stop saying readable (as the kernel does
            // once the data is read) instead of waking the program for an EAGAIN.
            let mut one = [0u8; 1];
            let peek = RecvFlags { peek: true, ..f };
            let _ = self.p.recv(id, &mut one, peek, None);
        }
        Ok((n, None))
    }
    fn shutdown(&self, id: SockId, how: i32) -> Result<(), Errno> {
        let how = match how {
            libc::SHUT_RD => Shutdown::Read,
            libc::SHUT_WR => Shutdown::Write,
            libc::SHUT_RDWR => Shutdown::Both,
            _ => return Err(libc::EINVAL),
        };
        self.p.shutdown(posix::SockId(id), how).map_err(e)
    }
    fn local_addr(&self, id: SockId) -> Result<SocketAddrV4, Errno> {
        self.p.local_addr(posix::SockId(id)).map_err(e)
    }
    fn peer_addr(&self, id: SockId) -> Result<SocketAddrV4, Errno> {
        self.p.peer_addr(posix::SockId(id)).map_err(e)
    }
    fn take_error(&self, id: SockId) -> Errno {
        match self.p.take_error(posix::SockId(id)) {
            Ok(Some(x)) => x.0,
            Ok(None) => 0,
            Err(x) => x.0,
        }
    }
    fn set_option(&self, id: SockId, level: i32, name: i32, val: &[u8]) -> Result<(), Errno> {
        // The kernel's checks first (length, range), on the scratch socket.
        self.on_scratch(|k| {
            // SAFETY: `val` is readable for its length; `k` is the scratch socket.
            unsafe { crate::real::setsockopt(k, level, name, val.as_ptr().cast(), val.len() as _) }
        })?;
        let Some(o) = opt_of(level, name) else {
            crate::state::count_unknown_option();
            return Ok(());
        };
        let v = if o == Opt::Linger {
            let on = int_of(val)?;
            let secs = val
                .get(4..8)
                .map(|b| i32::from_ne_bytes(b.try_into().unwrap_or([0; 4])) as i64)
                .unwrap_or(0);
            if on != 0 {
                secs
            } else {
                -1
            }
        } else {
            int_of(val)?
        };
        self.p.set_option(posix::SockId(id), o, v).map_err(e)
    }
    fn get_option(
        &self,
        id: SockId,
        level: i32,
        name: i32,
        out: &mut [u8],
    ) -> Result<usize, Errno> {
        if (level, name) == (libc::IPPROTO_TCP, libc::TCP_INFO) {
            let info = self.p.tcp_info(posix::SockId(id)).map_err(e)?;
            let b = crate::tcpinfo::tcp_info_bytes(&info);
            let n = out.len().min(b.len());
            out[..n].copy_from_slice(&b[..n]);
            return Ok(n);
        }
        let Some(o) = opt_of(level, name) else {
            crate::state::count_unknown_option();
            let mut len = out.len() as libc::socklen_t;
            self.on_scratch(|k| {
                // SAFETY: `out` is writable for `len` bytes.
                unsafe {
                    crate::real::getsockopt(k, level, name, out.as_mut_ptr().cast(), &mut len)
                }
            })?;
            return Ok(len as usize);
        };
        let v = self.p.get_option(posix::SockId(id), o).map_err(e)?;
        let bytes: Vec<u8> = if o == Opt::Linger {
            let (on, secs) = if v < 0 { (0i32, 0i32) } else { (1, v as i32) };
            [on.to_ne_bytes(), secs.to_ne_bytes()].concat()
        } else {
            (v as i32).to_ne_bytes().to_vec()
        };
        let n = out.len().min(bytes.len());
        out[..n].copy_from_slice(&bytes[..n]);
        Ok(n)
    }
    fn readable_bytes(&self, id: SockId) -> usize {
        self.p.readable_bytes(posix::SockId(id)).unwrap_or(0)
    }
    fn unsent_bytes(&self, id: SockId) -> usize {
        self.p.unsent_bytes(posix::SockId(id)).unwrap_or(0)
    }
    fn send_file(&self, id: SockId, in_fd: i32, offset: u64, len: usize) -> Result<usize, Errno> {
        // SAFETY: the caller checked `in_fd` is open (fstat) and it stays open for the call.
        let f = unsafe { BorrowedFd::borrow_raw(in_fd) };
        self.p
            .send_file(posix::SockId(id), f, offset, len, true, None)
            .map_err(e)
    }
    fn forget(&self, id: SockId) {
        let _ = self.p.forget(posix::SockId(id));
    }
    fn pin(&self, id: SockId) {
        self.p.pin(posix::SockId(id));
    }
    fn settle(&self) {
        self.p.settle();
    }
    fn settle_for_fork(&self) -> Option<posix::ForkHold<'_>> {
        self.p.settle_for_fork()
    }
    fn after_fork(&self) {
        self.p.after_fork();
    }
    fn watch(&self, id: SockId) -> Result<bool, Errno> {
        self.p.watch(posix::SockId(id)).map_err(e)
    }
    fn accept_ahead(&self, id: SockId) {
        let _ = self.p.accept_ahead(posix::SockId(id));
    }
    fn tokens_on(&self, id: SockId) {
        let _ = self.p.tokens_on(posix::SockId(id));
    }
    fn want_read(&self, id: SockId) {
        let _ = self.p.want_read(posix::SockId(id));
    }
    fn waiting(&self, ids: &[SockId], on: bool) {
        self.p.waiting(ids.iter().map(|&i| posix::SockId(i)), on);
    }
    fn in_kernel_set(&self, id: SockId) {
        self.p.in_kernel_set(posix::SockId(id));
    }
    fn confirm_readable(&self, id: SockId) -> bool {
        self.p.confirm_readable(posix::SockId(id)).unwrap_or(true)
    }
    fn ready_many(
        &self,
        ids: &[SockId],
        reads: &[bool],
        woken: bool,
        out: &mut Vec<Option<FastReady>>,
    ) -> Result<u64, Errno> {
        self.p
            .ready_many(ids.iter().map(|&i| posix::SockId(i)), reads, woken, out)
            .map_err(e)
    }
    fn changed(&self, cur: &mut Cursor, out: &mut Vec<SockId>) -> Result<(bool, u64), Errno> {
        self.p.changed(cur, |i| out.push(i.0)).map_err(e)
    }
    fn wake_fd(&self) -> Result<i32, Errno> {
        self.p.wake_fd().map_err(e)
    }
    fn move_own(&self, fd: i32) -> bool {
        let mut g = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = g.as_mut().filter(|k| k.raw() == fd) {
            return k.relocate().is_ok();
        }
        drop(g);
        self.p.move_own(fd)
    }
    fn unblock(&self, id: SockId) {
        let _ = self.p.unblock(posix::SockId(id));
    }
    fn sleep_begin(&self, gen: u64, writable: bool) -> Result<Option<SleepTicket>, Errno> {
        self.p.sleep_begin(gen, writable).map_err(e)
    }
    fn sleep_end(&self, t: SleepTicket, pair_ready: bool) -> bool {
        self.p.sleep_end(t, pair_ready)
    }
    fn drain_awake(&self) {
        self.p.drain_awake();
    }
    fn report(&self, why: crate::addr::Reason, dst: Option<SocketAddrV4>) {
        use crate::addr::Reason;
        use flowstack_api::record::ReportKind;
        let kind = match why {
            Reason::NotCarried => ReportKind::NotCarried,
            Reason::Ipv6 | Reason::V6Only => ReportKind::Ipv6,
            Reason::NoDaemon => ReportKind::NoDaemon,
            Reason::OtherType | Reason::FdTooHigh | Reason::Refused => ReportKind::Unsupported,
            _ => ReportKind::Other,
        };
        let _ = self.p.report(kind, dst);
    }
}
