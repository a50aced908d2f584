//! The POSIX socket model over `flowstackd`, for the LD_PRELOAD shim (and anything that needs
//! sockets that survive `fork`, `exec`, `dup` and fd passing).
//!
//! # The model
//! - **A placeholder pair per socket.** [`Posix::socket`] creates a unix socket pair (A, D)
//!   and returns A: the descriptor the program sees (its number comes from the kernel, so it
//!   never collides with files, pipes or eventfds). D and a copy of A go to the daemon, which
//!   keeps D and records A's inode as the socket's identity. When every copy of A anywhere is
//!   closed, D hangs up and the daemon closes the socket as the kernel would.
//! - **Readiness through the kernel.** A is readable when the daemon wrote a token (data,
//!   end of stream, error, a connection to accept) and writable unless this layer filled it
//!   because the socket's send buffer is full or a connect is in progress (a non-blocking
//!   connect's filler is written only once something will wait on A in the kernel:
//!   [`Posix::tokens_on`], which every such wait calls first); so
//!   `poll`/`select`/`epoll` on A work, mixed with any other descriptors, edge-triggered too.
//!   When this process's own view of a socket is unreadable it reads the tokens back and
//!   tells the daemon ([`Command::TokenCleared`]), which writes a new token at once if the
//!   socket became readable meanwhile. While a socket is busy no system call is made per
//!   message. A token can therefore be *stale* (written for bytes read meanwhile): a caller
//!   that reports readiness to a program checks it first ([`Posix::confirm_readable`]).
//! - **Handles.** A [`SockId`] is this process's name for a socket (the handle its ring
//!   records carry). After `fork` the child registers anew on first use (the parent's
//!   rings are single-producer and must not be touched: the pid change is detected) and
//!   attaches inherited sockets with [`Posix::adopt`] (the daemon compares A's inode); after
//!   `exec` the same call rediscovers them (a negative answer is cached by inode).
//! - **Blocking calls** sleep in `poll(2)` on A in slices of at most
//!   [`LIVENESS_CHECK`](crate::LIVENESS_CHECK); if the daemon dies, D closes, A hangs up and
//!   the call fails with `ECONNRESET` (or `EPIPE` for a send) within a second.
//! - **Kernel path of a listener**: [`Posix::listen`] may hand the daemon the kernel's
//!   listener of the same port; its readability makes A readable too. The shim accepts from
//!   the kernel listener itself (non-blocking `accept` on it after A became readable);
//!   [`Posix::accept`] only takes flowstack connections and reports [`Path::Flowstack`].
//!
//! Nonblocking state belongs to the caller (the shim keeps `O_NONBLOCK` per open file
//! description): every call that may wait takes `nonblock` (and a timeout).
//!
//! **UDP** (`SOCK_DGRAM`): the same placeholder model, datagram calls in `udp`
//! ([`Posix::send_to`], [`Posix::recv_from`], [`Posix::carries_dgram`]).
//!
//! # Not yet (first slice of this module)
//! `TCP_INFO` beyond its common fields (`flowstack_api::tcpinfo`), and options other than
//! `TCP_NODELAY`, are remembered and
//! reported back but not applied.

use crate::{Client, Sock, LIVENESS_CHECK};
use flowstack_api::ids::{IdMap, IdSet};
use flowstack_api::record::{AttachOp, Command, Mode, ReportKind, SockType};
use flowstack_api::region::{POSIX_BASE, SOCK_RCVBUF, SOCK_SNDBUF};
use flowstack_api::SocketError;
use flowstack_sys::ownfd::Own;
use flowstack_sys::placeholder::{self, Tokens};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

mod calls;
mod carried;
mod fast;
mod file;
mod fork;
mod hold;
mod own;
mod pool;
mod ready;
mod types;
mod udp;
use calls::{
    addr_of_value, attach_fds, finish, get_addr, make_unwritable, post_attach, sync, wait_on,
};
use fast::clear_tokens;
pub use fast::{FastReady, SleepTicket};
pub use file::MAX_SENDFILE;
pub use fork::ForkHold;
pub use ready::Cursor;

pub use types::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Fresh,
    Listening,
    Connecting,
    Connected,
    Failed,
}

#[derive(Debug)]
struct PSock {
    /// Our own copy of A (close-on-exec, above the program's numbers: `ownfd`), for tokens
    /// and filler; dropped by `forget`.
    a: Own<OwnedFd>,
    state: State,
    shut_rd: bool,
    opts: HashMap<Opt, i64>,
    /// The file attached in the daemon for `sendfile` (its device and inode), if any.
    file: Option<(u64, u64)>,
    /// No tokens for it (`Command::SetNotify`): readiness from this process's view only.
    quiet: bool,
    /// The id of its `Attach{New}`, posted and not yet answered (see [`Posix::socket`]).
    attach: Option<u32>,
    /// Where it connects (`connect`), to forget a refused destination (`carried`).
    remote: Option<SocketAddrV4>,
    /// The program may wait on A in the kernel (a kernel epoll set took it, or tokens were
    /// asked for before a kernel wait): a connect fills A at once (see `fast`).
    in_kernel: bool,
    /// A non-blocking connect left A unfilled (its writability is the view's until someone
    /// waits on A in the kernel: [`Posix::tokens_on`] fills it then).
    fill_later: bool,
    /// A listener whose accepts are asked ahead ([`Posix::accept_ahead`]).
    ahead_ok: bool,
    /// A datagram socket (`udp`); its state stays `Fresh`.
    dgram: bool,
    /// A datagram socket's last destination the daemon said it carries (`udp`).
    carried_dst: Option<SocketAddrV4>,
    /// A may be held or watched outside this library (adopted, filled, waited on in the
    /// kernel, alive at a fork or exec, sent away): never recycled (`pool`).
    shared: bool,
    /// An accepted connection whose `Place` was posted unanswered: events the daemon
    /// published before taking it wrote no token (`Posix::tokens_on` asks for one).
    placed: bool,
    /// Threads of this process sleeping in the kernel on A now (`hold`: kept at a fork).
    waiters: u32,
    /// A is in an epoll set the kernel keeps (`hold`: kept at a fork).
    kernel_set: bool,
}

struct Inner {
    client: Option<Client>,
    pid: u32,
    socks: IdMap<u32, PSock>,
    next: u32,
    /// Inodes known not to be placeholders of this daemon.
    not_ours: IdSet<(u64, u64)>,
    /// Destinations the daemon carries (`Posix::carries`).
    carried: carried::Carried,
    /// This process's end of its wake-up channel (the daemon has the write end), see `fast`.
    wake: Option<Own<OwnedFd>>,
    /// An accept's `Attach{Place}` was posted since the last [`Posix::settle`] (its answer
    /// is never waited for).
    placed: bool,
    /// Unread bytes of the connections given up for a fork under way (`hold`).
    carry: hold::Carries,
    /// In a forked child: the parent's carry, taken by the adopts.
    inherited: hold::Carries,
}

/// The process-wide POSIX layer (`Send + Sync`; one mutex inside, never held while a call
/// sleeps).
pub struct Posix {
    path: PathBuf,
    inner: Mutex<Inner>,
}

/// The default daemon socket: `$FLOWSTACK_SOCKET`, else `$XDG_RUNTIME_DIR/flowstack.sock`,
/// else `/run/flowstack/flowstack.sock` as root, else `/tmp/flowstack-UID.sock` (the
/// daemon's own default).
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLOWSTACK_SOCKET").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let uid = std::os::unix::net::UnixStream::pair()
        .ok()
        .and_then(|(a, _)| flowstack_sys::socket::peer_cred(&a).ok())
        .map(|(_, uid, _)| uid)
        .unwrap_or(u32::MAX);
    if uid == 0 {
        return PathBuf::from("/run/flowstack/flowstack.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => FsPath::new(&d).join("flowstack.sock"),
        _ => PathBuf::from(format!("/tmp/flowstack-{uid}.sock")),
    }
}

fn sync_timeout() -> Duration {
    Duration::from_secs(5)
}

type Guard<'a> = MutexGuard<'a, Inner>;

impl Posix {
    /// Registers with the daemon at `path` (at once, so a missing daemon is an error here).
    pub fn attach(path: impl AsRef<FsPath>) -> Result<Self, crate::ConnectError> {
        let path = path.as_ref().to_path_buf();
        let client = Client::connect(&path)?;
        let p = Self {
            path,
            inner: Mutex::new(Inner {
                client: Some(client),
                pid: std::process::id(),
                socks: IdMap::default(),
                next: POSIX_BASE,
                not_ours: IdSet::default(),
                carried: carried::Carried::default(),
                wake: None,
                placed: false,
                carry: HashMap::new(),
                inherited: HashMap::new(),
            }),
        };
        // Without one, the process is woken through the daemon (`fast::make_wake`).
        let _ = fast::make_wake(&mut p.inner.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(p)
    }

    /// The process's instance on [`default_socket_path`], registered on first use.
    pub fn global() -> Result<&'static Posix, crate::ConnectError> {
        static G: OnceLock<Posix> = OnceLock::new();
        if let Some(p) = G.get() {
            return Ok(p);
        }
        let p = Posix::attach(default_socket_path())?;
        Ok(G.get_or_init(|| p))
    }

    fn lock(&self) -> Result<Guard<'_>, Errno> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let pid = flowstack_sys::process::cached_pid();
        if g.pid != pid {
            forked(&mut g, pid);
        }
        if g.client.is_none() {
            g.client = Some(Client::connect(&self.path).map_err(|_| Errno::ECONNRESET)?);
            // Without one, the process is woken through the daemon (`fast::make_wake`).
            let _ = fast::make_wake(&mut g);
        }
        Ok(g)
    }

    /// Call in a child after `fork` (also detected on any call): forgets the parent's rings
    /// and sockets without touching them; the child registers on its next call and adopts
    /// the sockets it inherited with [`Posix::adopt`].
    pub fn after_fork(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        forked(&mut g, pid);
    }

    /// A new socket: returns A (the descriptor the program sees; close-on-exec as created, the
    /// caller clears it where the program asks) and its id.
    pub fn socket(&self, ty: Type) -> Result<(OwnedFd, SockId), Errno> {
        self.socket_with(ty, FdFlags::default())
    }

    /// [`Posix::socket`] whose A has the descriptor flags `fl` (the caller then changes
    /// none).
    pub fn socket_with(&self, ty: Type, fl: FdFlags) -> Result<(OwnedFd, SockId), Errno> {
        let mut g = self.lock()?;
        let h = g.alloc();
        let c = g.client.as_mut().expect("registered");
        let ph = pool::take(c, fl)?;
        c.socks.insert(h, Sock::default());
        // Posted, not waited for: the answer is taken by the socket's next call
        // (`Inner::sock`), by when it has usually arrived, so a short connection's socket()
        // costs no round trip. A refusal (the daemon's socket limit) fails that next call.
        let sty = match ty {
            Type::Stream => SockType::Stream,
            Type::Dgram => SockType::Dgram,
        };
        let (call, a, mine) = match pool::post(c, h, false, sty, ph) {
            Ok(x) => x,
            Err(e) => {
                c.socks.remove(&h);
                return Err(e);
            }
        };
        let mut ps = PSock::new(mine, State::Fresh);
        ps.attach = Some(call);
        ps.dgram = ty == Type::Dgram;
        g.socks.insert(h, ps);
        Ok((a, SockId(h)))
    }

    /// Attaches an inherited or passed descriptor: `Ok(None)` if it is no placeholder of this
    /// daemon (remembered by inode).
    pub fn adopt(&self, fd: BorrowedFd<'_>) -> Result<Option<SockId>, Errno> {
        if !placeholder::is_unix_stream(fd) {
            return Ok(None);
        }
        let ident = placeholder::identity(fd).map_err(|_| Errno::EBADF)?;
        let mut g = self.lock()?;
        if g.not_ours.contains(&ident) {
            return Ok(None);
        }
        let h = g.alloc();
        let c = g.client.as_mut().expect("registered");
        c.socks.insert(h, Sock::default());
        let v = match attach_fds(c, h, AttachOp::Adopt, &[fd]) {
            Ok(v) => v,
            Err(e) => {
                c.socks.remove(&h);
                if e == Errno::EBADF {
                    g.not_ours.insert(ident);
                    return Ok(None);
                }
                return Err(e);
            }
        };
        let state = match v >> 32 {
            2 => State::Listening,
            3 => State::Connected,
            5 => State::Failed,
            _ => State::Fresh,
        };
        let s = c.socks.get_mut(&h).expect("inserted");
        s.listener = state == State::Listening;
        s.open = state == State::Connected;
        let mine = Own::dup(fd).map_err(|_| Errno(24))?;
        let mut ps = PSock::new(mine, state);
        ps.dgram = v >> 32 == 6;
        ps.shared = true;
        g.socks.insert(h, ps);
        hold::on_adopt(&mut g, ident, h);
        Ok(Some(SockId(h)))
    }

    /// `bind(2)`; returns the port (chosen when 0).
    pub fn bind(&self, id: SockId, addr: SocketAddrV4) -> Result<u16, Errno> {
        let mut g = self.lock()?;
        // SO_REUSEADDR / SO_REUSEPORT as set now: the daemon's port table decides by them.
        let opts = &g.sock(id)?.opts;
        let on = |o| opts.get(&o).is_some_and(|&v| v != 0);
        let flags = flowstack_api::record::bind_flags(on(Opt::ReuseAddr), on(Opt::ReusePort));
        let c = g.client.as_mut().expect("registered");
        sync(
            c,
            Command::Bind {
                handle: id.0,
                local: addr,
                flags,
            },
        )
        .map(|p| p as u16)
    }

    /// `listen(2)`, optionally with the kernel's listener of the same port (see the module
    /// docs); returns the port.
    pub fn listen(
        &self,
        id: SockId,
        backlog: u32,
        kernel_listener: Option<OwnedFd>,
    ) -> Result<u16, Errno> {
        let mut g = self.lock()?;
        g.sock(id)?;
        let c = g.client.as_mut().expect("registered");
        let port = sync(
            c,
            Command::Listen {
                handle: id.0,
                backlog,
            },
        )? as u16;
        if let Some(s) = c.socks.get_mut(&id.0) {
            s.listener = true;
        }
        if let Some(k) = kernel_listener {
            attach_fds(c, id.0, AttachOp::KernelListener, &[k.as_fd()])?;
        }
        g.sock(id)?.state = State::Listening;
        Ok(port)
    }

    /// `accept(2)` of a flowstack connection: its A, id and peer.
    pub fn accept(
        &self,
        id: SockId,
        nonblock: bool,
        timeout: Option<Duration>,
    ) -> Result<(OwnedFd, SockId, SocketAddrV4, Path), Errno> {
        self.accept_with(id, nonblock, timeout, FdFlags::default())
    }

    /// [`Posix::accept`] whose new A has the descriptor flags `fl` (`accept4`'s).
    pub fn accept_with(
        &self,
        id: SockId,
        nonblock: bool,
        timeout: Option<Duration>,
        fl: FdFlags,
    ) -> Result<(OwnedFd, SockId, SocketAddrV4, Path), Errno> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let mut g = self.lock()?;
            let ps = g.sock(id)?;
            if ps.state != State::Listening {
                return Err(Errno::EINVAL);
            }
            let ahead_ok = ps.ahead_ok;
            let c = g.client.as_mut().expect("registered");
            c.pump();
            let l = c.socks.get_mut(&id.0).ok_or(Errno::EBADF)?;
            let got = match l.accepted.pop_front() {
                Some(h) => Ok(h),
                None if l.accept_err.is_some() => Err(l.accept_err.take().expect("some")),
                // The daemon holds our accept asked ahead: nothing to ask, no round trip.
                None if l.ahead.is_some() => Err(SocketError::WouldBlock),
                None => {
                    let aid = c
                        .post(Mode::Async, Command::TcpAccept { listener: id.0 })
                        .map_err(Errno::from)?;
                    c.waiting.insert(aid);
                    c.complete(aid, sync_timeout()).map(|(_, h)| h as u32)
                }
            };
            match got {
                Ok(h) => {
                    let c = g.client.as_mut().expect("registered");
                    let ph = pool::take(c, fl)?;
                    // The placeholder is posted and its answer never waited for: the
                    // daemon refuses a `Place` only for a record no honest client writes,
                    // and a refusal is then the connection's error (`Client::on_event`, as
                    // for any async call), so its first recv costs no round trip. The peer
                    // came with the accept's completion (from an older daemon: asked for).
                    let (placed, a, mine) = pool::post(c, h, true, SockType::Stream, ph)?;
                    c.waiting.remove(&placed);
                    let said = c.socks.get(&h).map_or(0, |s| s.peer);
                    let peer = if said != 0 {
                        addr_of_value(said)
                    } else {
                        get_addr(c, h, true).unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))
                    };
                    let mut ps = PSock::new(mine, State::Connected);
                    ps.placed = true;
                    g.socks.insert(h, ps);
                    g.placed = true;
                    let c = g.client.as_mut().expect("registered");
                    if ahead_ok && c.socks.get(&id.0).is_some_and(|s| s.ahead.is_none()) {
                        // The next connection is asked for now (see `Posix::accept_ahead`).
                        c.ask_accept(id.0, true).map_err(Errno::from)?;
                    }
                    let more = c.socks.get(&id.0).is_some_and(|s| !s.accepted.is_empty());
                    if !more {
                        // As in recv: no stale token on the listener after the last accept
                        // (a blocking accept after select would wait for the next one).
                        let _ = clear_tokens(&mut g, id);
                    }
                    return Ok((a, SockId(h), peer, Path::Flowstack));
                }
                Err(SocketError::WouldBlock) => {
                    clear_tokens(&mut g, id)?;
                    if nonblock {
                        return Err(Errno::EAGAIN);
                    }
                    let a = g.sock(id)?.a.try_clone().map_err(|_| Errno(24))?;
                    drop(g);
                    wait_on(&a, true, false, deadline)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// `connect(2)`: `Ok` once connected (blocking), `EINPROGRESS` (non-blocking, started),
    /// `EALREADY` (still in progress), `EISCONN` (connected since), or the failure once
    /// (`ECONNREFUSED`, …; also kept for `SO_ERROR` until taken).
    pub fn connect(
        &self,
        id: SockId,
        addr: SocketAddrV4,
        nonblock: bool,
        timeout: Option<Duration>,
    ) -> Result<(), Errno> {
        if self.is_dgram(id)? {
            return self.udp_connect(id, addr);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        {
            let mut g = self.lock()?;
            // Not waiting for a posted Attach{New} here: the Connect follows it in the ring
            // (a refused attach fails the Connect, and the socket's next call says why), so
            // a short connection's socket() and connect() cost no round trip.
            let state = g.sock_as_is(id)?.state;
            match state {
                State::Fresh => {
                    let c = g.client.as_mut().expect("registered");
                    c.post(
                        Mode::Async,
                        Command::Connect {
                            handle: id.0,
                            remote: addr,
                        },
                    )
                    .map_err(Errno::from)?;
                    let s = g.sock_as_is(id)?;
                    s.state = State::Connecting;
                    s.remote = Some(addr);
                    // The filler (A unwritable while connecting) only matters to a wait on A
                    // in the kernel; a program whose readiness comes from the view (the
                    // shim's epoll) never needs it: two system calls here and one in the
                    // daemon less per connection. It is written when such a wait comes
                    // (`tokens_on`), or now if A may already be in a kernel set.
                    if nonblock && !s.in_kernel {
                        s.fill_later = true;
                    } else {
                        make_unwritable(&mut g, id)?;
                    }
                    if nonblock {
                        return Err(Errno::EINPROGRESS);
                    }
                }
                State::Connecting => {
                    let st = connect_state(&mut g, id)?;
                    match st {
                        Some(Ok(())) => return Err(Errno::EISCONN),
                        Some(Err(e)) => return Err(e),
                        None if nonblock => return Err(Errno::EALREADY),
                        None => {}
                    }
                }
                State::Connected => return Err(Errno::EISCONN),
                State::Listening => return Err(Errno::EINVAL),
                State::Failed => return Err(Errno::EINVAL),
            }
        }
        loop {
            let a = {
                let mut g = self.lock()?;
                match connect_state(&mut g, id)? {
                    Some(r) => return r,
                    None => g.sock(id)?.a.try_clone().map_err(|_| Errno(24))?,
                }
            };
            wait_on(&a, false, true, deadline)?;
        }
    }

    /// Would flowstack carry a connect or sendto to `addr`? (On the loopback: a flowstack
    /// listener on that port.)
    pub fn carries(&self, addr: SocketAddrV4) -> Result<bool, Errno> {
        let mut g = self.lock()?;
        if g.carried.knows(addr) {
            return Ok(true);
        }
        let c = g.client.as_mut().expect("registered");
        let yes = sync(c, Command::Carries { remote: addr })? == 1;
        if yes {
            g.carried.learn(addr);
        }
        Ok(yes)
    }

    /// `send(2)`: bytes taken (at least one), `EAGAIN` when the send buffer is full and
    /// `nonblock`.
    pub fn send(
        &self,
        id: SockId,
        data: &[u8],
        nonblock: bool,
        timeout: Option<Duration>,
    ) -> Result<usize, Errno> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let a = {
                let mut g = self.lock()?;
                let st = g.sock(id)?.state;
                match st {
                    State::Connected | State::Connecting => {}
                    State::Failed => return Err(Errno::EPIPE),
                    _ => return Err(Errno::ENOTCONN),
                }
                let c = g.client.as_mut().expect("registered");
                match crate::Sockets::tcp_send(c, tcp(id), data) {
                    Ok(n) => return Ok(n),
                    Err(SocketError::WouldBlock) => {}
                    Err(SocketError::ConnectionReset) if c.dead => return Err(Errno::EPIPE),
                    Err(e) => return Err(e.into()),
                }
                make_unwritable(&mut g, id).map_err(|e| {
                    if e == Errno::ECONNRESET {
                        Errno::EPIPE
                    } else {
                        e
                    }
                })?;
                if nonblock {
                    return Err(Errno::EAGAIN);
                }
                g.sock(id)?.a.try_clone().map_err(|_| Errno(24))?
            };
            wait_on(&a, false, true, deadline).map_err(|e| {
                if e == Errno::ECONNRESET {
                    Errno::EPIPE
                } else {
                    e
                }
            })?;
        }
    }

    /// `recv(2)`: bytes copied; `Ok(0)` at end of stream (or for an empty `buf`).
    pub fn recv(
        &self,
        id: SockId,
        buf: &mut [u8],
        flags: RecvFlags,
        timeout: Option<Duration>,
    ) -> Result<usize, Errno> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut got = 0;
        loop {
            let a = {
                let mut g = self.lock()?;
                let ps = g.sock(id)?;
                if ps.shut_rd {
                    return Ok(got);
                }
                if ps.state == State::Listening || ps.state == State::Fresh {
                    return Err(Errno::ENOTCONN);
                }
                let c = g.client.as_mut().expect("registered");
                c.pump();
                // After the pump: an `Unheld` just published is seen.
                hold::take(c, id.0);
                let s = c.socks.get_mut(&id.0).ok_or(Errno::EBADF)?;
                if s.unread() > 0 {
                    // One copy: from the queue, then from the receive area (`held`).
                    let n = c.read_unread(id.0, &mut buf[got..], flags.peek);
                    if n == 0 && got < buf.len() {
                        continue; // a fused socket's pipe failed: its error is set now
                    }
                    if !flags.peek {
                        if let Some(s) = c.socks.get_mut(&id.0) {
                            s.unreported += n as u64;
                        }
                        c.report_consumed(id.0, false);
                    }
                    got += n;
                    let drained = c
                        .socks
                        .get(&id.0)
                        .is_some_and(|s| s.unread() == 0 && !s.eof && s.error.is_none())
                        && !c.dead;
                    if !flags.waitall || flags.peek || got == buf.len() {
                        if drained && !flags.peek {
                            // Not readable any more: take the token back now, so that a
                            // select/poll after this recv does not report readiness that a
                            // blocking read would then wait on (iperf3's control socket).
                            let _ = clear_tokens(&mut g, id);
                        }
                        return Ok(got);
                    }
                    continue;
                }
                if buf.is_empty() {
                    return Ok(0);
                }
                if let Some(e) = s.error.take() {
                    s.error = Some(e); // SO_ERROR keeps it until taken
                    return if got > 0 { Ok(got) } else { Err(e.into()) };
                }
                if s.eof {
                    return Ok(got);
                }
                if c.dead {
                    return Err(Errno::ECONNRESET);
                }
                clear_tokens(&mut g, id)?;
                if flags.nonblock {
                    return if got > 0 { Ok(got) } else { Err(Errno::EAGAIN) };
                }
                g.sock(id)?.a.try_clone().map_err(|_| Errno(24))?
            };
            match wait_on(&a, true, false, deadline) {
                Ok(()) => {}
                Err(e) if got > 0 && e == Errno::EAGAIN => return Ok(got),
                Err(e) => return Err(e),
            }
        }
    }

    /// `shutdown(2)`.
    pub fn shutdown(&self, id: SockId, how: Shutdown) -> Result<(), Errno> {
        let mut g = self.lock()?;
        let ps = g.sock(id)?;
        if ps.state != State::Connected && ps.state != State::Connecting {
            return Err(Errno::ENOTCONN);
        }
        if how != Shutdown::Write {
            ps.shut_rd = true;
        }
        if how != Shutdown::Read {
            let c = g.client.as_mut().expect("registered");
            crate::Sockets::tcp_shutdown(c, tcp(id)).map_err(Errno::from)?;
        }
        Ok(())
    }

    /// `getsockname(2)`.
    pub fn local_addr(&self, id: SockId) -> Result<SocketAddrV4, Errno> {
        let mut g = self.lock()?;
        g.sock(id)?;
        get_addr(g.client.as_mut().expect("registered"), id.0, false)
    }

    /// `getpeername(2)`.
    pub fn peer_addr(&self, id: SockId) -> Result<SocketAddrV4, Errno> {
        let mut g = self.lock()?;
        g.sock(id)?;
        get_addr(g.client.as_mut().expect("registered"), id.0, true)
    }

    /// `SO_ERROR`: the pending error, cleared by reading it.
    pub fn take_error(&self, id: SockId) -> Result<Option<Errno>, Errno> {
        let mut g = self.lock()?;
        g.sock(id)?;
        let c = g.client.as_mut().expect("registered");
        c.pump();
        let s = c.socks.get_mut(&id.0).ok_or(Errno::EBADF)?;
        let err = s.error.take().map(Errno::from);
        if err == Some(Errno::ECONNREFUSED) {
            if let Some(to) = g.sock(id)?.remote {
                g.carried.forget(to); // as in `connect_state`
            }
        }
        Ok(err)
    }

    /// `setsockopt(2)` (see the module docs for what is applied).
    pub fn set_option(&self, id: SockId, opt: Opt, value: i64) -> Result<(), Errno> {
        let mut g = self.lock()?;
        g.sock(id)?.opts.insert(opt, value);
        if opt == Opt::NoDelay {
            let c = g.client.as_mut().expect("registered");
            c.post(
                Mode::Async,
                Command::TcpSetNodelay {
                    handle: id.0,
                    on: value != 0,
                },
            )
            .map_err(Errno::from)?;
        }
        Ok(())
    }

    /// `getsockopt(2)`: what was set, else the default (buffers: the daemon's sizes).
    pub fn get_option(&self, id: SockId, opt: Opt) -> Result<i64, Errno> {
        let mut g = self.lock()?;
        let ps = g.sock(id)?;
        Ok(match (ps.opts.get(&opt), opt) {
            (_, Opt::RcvBuf) => SOCK_RCVBUF as i64,
            (_, Opt::SndBuf) => SOCK_SNDBUF as i64,
            (Some(v), _) => *v,
            (None, Opt::Linger) => -1,
            (None, Opt::KeepIdle) => 7200,
            (None, Opt::KeepIntvl) => 75,
            (None, Opt::KeepCnt) => 9,
            (None, _) => 0,
        })
    }

    /// `TCP_INFO`: the state, and for a connected socket the common fields the daemon's
    /// engine knows (`flowstack_api::tcpinfo`, one sync call per part). If the daemon
    /// cannot answer (no connection yet, or gone), the state alone.
    pub fn tcp_info(&self, id: SockId) -> Result<TcpInfo, Errno> {
        let mut g = self.lock()?;
        let st = g.sock(id)?.state;
        let state = match st {
            State::Connected => 1,
            State::Connecting => 2,
            State::Listening => 10,
            State::Fresh | State::Failed => 7,
        };
        // Connecting too: the POSIX state learns of the handshake's end lazily (and taking
        // it here would take a pending SO_ERROR); the daemon knows the engine's state.
        if matches!(st, State::Connected | State::Connecting) {
            let c = g.client.as_mut().expect("registered");
            let mut info = TcpInfo::default();
            let whole = (0..flowstack_api::tcpinfo::PARTS).try_for_each(|part| {
                let v = sync(c, Command::TcpInfo { handle: id.0, part })?;
                info.set_part(part, v);
                Ok::<_, Errno>(())
            });
            if whole.is_ok() {
                return Ok(info);
            }
        }
        Ok(TcpInfo {
            state,
            ..TcpInfo::default()
        })
    }

    /// `FIONREAD`.
    pub fn readable_bytes(&self, id: SockId) -> Result<usize, Errno> {
        let mut g = self.lock()?;
        g.sock(id)?;
        let dgram = g.sock(id)?.dgram;
        let c = g.client.as_mut().expect("registered");
        c.pump();
        hold::take(c, id.0);
        let s = c.socks.get(&id.0);
        Ok(match dgram {
            // The size of the next datagram, as Linux's FIONREAD on UDP.
            true => s.and_then(|s| s.dgrams.front()).map_or(0, |d| d.1),
            false => s.map(|s| s.unread()).unwrap_or(0),
        })
    }

    /// Received bytes this process copied into sockets' queues rather than reading them
    /// straight from its receive area ([`Client::rx_copied`]).
    pub fn rx_copied(&self) -> Result<u64, Errno> {
        let g = self.lock()?;
        Ok(g.client.as_ref().map_or(0, |c| c.rx_copied()))
    }

    /// `SIOCOUTQ` (bytes posted and not yet taken by the stack).
    pub fn unsent_bytes(&self, id: SockId) -> Result<usize, Errno> {
        let mut g = self.lock()?;
        g.sock(id)?;
        let c = g.client.as_mut().expect("registered");
        c.pump();
        Ok(c.socks
            .get(&id.0)
            .map(|s| (s.unflushed + s.pipe_queued()) as usize)
            .unwrap_or(0))
    }

    /// This process's own view of the socket.
    pub fn poll_state(&self, id: SockId) -> Result<Readiness, Errno> {
        let mut g = self.lock()?;
        let ps = g.sock(id)?;
        let (state, token, ps_dgram) = (ps.state, ps.a.try_clone().ok(), ps.dgram);
        let c = g.client.as_mut().expect("registered");
        c.pump();
        let s = c.socks.get(&id.0).ok_or(Errno::EBADF)?;
        let error = s.error.map(Errno::from);
        if ps_dgram {
            return Ok(Readiness {
                readable: !s.dgrams.is_empty() || s.error.is_some(),
                writable: true,
                hup: false,
                error,
            });
        }
        Ok(match state {
            State::Listening => Readiness {
                readable: !s.accepted.is_empty()
                    || token.is_some_and(|a| {
                        placeholder::wait_a(a.as_fd(), true, false, Duration::ZERO)
                            .map(|r| r.0)
                            .unwrap_or(false)
                    }),
                ..Readiness::default()
            },
            State::Connected | State::Connecting | State::Failed => Readiness {
                readable: s.unread() > 0 || s.eof || s.error.is_some(),
                writable: s
                    .pipe_writable()
                    .unwrap_or(s.open && s.unflushed < SOCK_SNDBUF)
                    || s.error.is_some(),
                hup: s.eof || s.error.is_some(),
                error,
            },
            State::Fresh => Readiness {
                writable: true,
                ..Readiness::default()
            },
        })
    }

    /// Tells the daemon this process sent a socket to the kernel instead (`flowstack stats`).
    pub fn report(&self, kind: ReportKind, dst: Option<SocketAddrV4>) -> Result<(), Errno> {
        let mut g = self.lock()?;
        let c = g.client.as_mut().expect("registered");
        c.post(
            Mode::Async,
            Command::Report {
                kind: kind as u32,
                dst: dst.unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            },
        )
        .map_err(Errno::from)?;
        Ok(())
    }

    /// The registered application's daemon id (changes after `fork`).
    pub fn app_id(&self) -> Result<u64, Errno> {
        Ok(self.lock()?.client.as_ref().expect("registered").app_id())
    }
}

impl PSock {
    fn new(a: Own<OwnedFd>, state: State) -> Self {
        Self {
            a,
            state,
            shut_rd: false,
            opts: HashMap::new(),
            file: None,
            quiet: false,
            attach: None,
            remote: None,
            in_kernel: false,
            fill_later: false,
            ahead_ok: false,
            dgram: false,
            carried_dst: None,
            shared: false,
            placed: false,
            waiters: 0,
            kernel_set: false,
        }
    }
}

impl Inner {
    fn alloc(&mut self) -> u32 {
        // Skips handles still in use (after a wrap).
        loop {
            let h = self.next;
            self.next = if h >= flowstack_api::record::MAX_HANDLE {
                POSIX_BASE
            } else {
                h + 1
            };
            if !self.socks.contains_key(&h) {
                return h;
            }
        }
    }

    /// The socket `id` as this process knows it, its `Attach` possibly not answered yet.
    fn sock_as_is(&mut self, id: SockId) -> Result<&mut PSock, Errno> {
        ready::noted(self, id);
        self.socks.get_mut(&id.0).ok_or(Errno::EBADF)
    }

    /// The socket `id`, once its `Attach{New}` is answered (see [`Posix::socket`]); if the
    /// daemon refused it, the socket is gone and the refusal is this call's error.
    fn sock(&mut self, id: SockId) -> Result<&mut PSock, Errno> {
        ready::noted(self, id);
        let call = self.socks.get_mut(&id.0).ok_or(Errno::EBADF)?.attach.take();
        if let Some(call) = call {
            let c = self.client.as_mut().ok_or(Errno::ECONNRESET)?;
            if let Err(e) = finish(c, call) {
                c.socks.remove(&id.0);
                self.socks.remove(&id.0);
                return Err(e);
            }
        }
        self.socks.get_mut(&id.0).ok_or(Errno::EBADF)
    }
}

fn forked(g: &mut Inner, pid: u32) {
    // The parent's rings are single-producer: never touch them here. Dropping our copies
    // only unmaps and closes this process's descriptors.
    g.client = None;
    g.socks.clear();
    g.wake = None;
    g.placed = false;
    if !g.carry.is_empty() {
        // (`after_fork` may run after the first call noticed the fork.)
        g.inherited = std::mem::take(&mut g.carry);
    }
    g.pid = pid;
}

fn tcp(id: SockId) -> flowstack_api::TcpHandle {
    flowstack_api::TcpHandle::from_raw(id.0 as usize)
}

/// The connect's outcome if known: `Some(Ok)` connected, `Some(Err)` failed (reported once).
fn connect_state(g: &mut Inner, id: SockId) -> Result<Option<Result<(), Errno>>, Errno> {
    let c = g.client.as_mut().expect("registered");
    c.pump();
    let s = c.socks.get_mut(&id.0).ok_or(Errno::EBADF)?;
    let r = if let Some(e) = s.error.take() {
        Some(Err(Errno::from(e)))
    } else if s.open {
        Some(Ok(()))
    } else if c.dead {
        Some(Err(Errno::ECONNRESET))
    } else {
        None
    };
    let ps = g.sock(id)?;
    match r {
        Some(Ok(())) => ps.state = State::Connected,
        Some(Err(_)) => ps.state = State::Failed,
        None => {}
    }
    if let (Some(Err(Errno::ECONNREFUSED)), Some(to)) = (r, ps.remote) {
        g.carried.forget(to); // nobody listens there through flowstack any more
    }
    Ok(r)
}
