//! The socket operations on placeholders, in Rust terms: blocking built from a non-blocking
//! call plus `poll(2)` on the placeholder, moving a socket to the kernel, and the data path.
//!
//! Every function here runs with interposition off for the thread (`state::inside`), so the
//! daemon API's own calls on placeholders go to the C library.

use crate::addr::{self, Addr, Reason};
use crate::backend::{Accepted, Backend, Errno, FdFlags};
use crate::real;
use crate::state::{inside, State};
use crate::table::{opt, Entry, SockId, MAX_FDS};
use std::net::SocketAddrV4;
use std::os::fd::{AsFd, IntoRawFd};
use std::time::{Duration, Instant};

/// Whether the placeholder is non-blocking: the cached flag, confirmed with the kernel (the
/// owner of the open file description) before the caller would sleep.
pub(crate) fn nonblocking(fd: i32, e: &Entry, flags: i32) -> bool {
    if e.nonblock || flags & libc::MSG_DONTWAIT != 0 {
        return true;
    }
    // SAFETY: F_GETFL on a descriptor number; no memory is passed.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Sleeps until `fd` shows `events` (or hang-up/error), the timeout passes (`EAGAIN`, as the
/// kernel answers for SO_RCVTIMEO/SO_SNDTIMEO) or a signal interrupts (`EINTR`, unless every
/// handler asked for `SA_RESTART` and no timeout is set: signal(7)). `Ok(true)`: the
/// placeholder hung up — the daemon's end is gone.
fn wait(fd: i32, events: i16, deadline: Option<Instant>) -> Result<bool, Errno> {
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(libc::EAGAIN);
                }
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            }
        };
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        crate::sig::clear_last();
        // SAFETY: one valid pollfd on the stack.
        let r = crate::state::outside(|| unsafe { real::poll(&mut p, 1, ms) });
        if r > 0 {
            return Ok(p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0);
        }
        if r == 0 {
            continue;
        }
        let e = real::errno();
        if e == libc::EINTR && deadline.is_none() && crate::sig::restart_after_eintr() {
            continue;
        }
        return Err(e);
    }
}

pub(crate) fn deadline(ms: u32) -> Option<Instant> {
    (ms != 0).then(|| Instant::now() + Duration::from_millis(ms as u64))
}

/// Runs the non-blocking `op` until it stops answering `EAGAIN`, sleeping on `events` between
/// tries unless the socket (or `flags`) is non-blocking.
pub(crate) fn blocking<T>(
    fd: i32,
    e: &Entry,
    flags: i32,
    events: i16,
    timeo_ms: u32,
    mut op: impl FnMut() -> Result<T, Errno>,
) -> Result<T, Errno> {
    let dl = deadline(timeo_ms);
    let mut hup = false;
    loop {
        match op() {
            // The daemon is gone and the call still has nothing: fail rather than spin.
            Err(libc::EAGAIN) if hup => return Err(libc::ECONNRESET),
            Err(libc::EAGAIN) if !nonblocking(fd, e, flags) => {
                // A socket watched by the epoll fast path has no tokens: turn them on first.
                // While this thread sleeps, a fork (another thread) leaves the socket here.
                let b = crate::state::get().and_then(|s| s.connected());
                if let Some(b) = b {
                    b.tokens_on(e.id);
                    b.waiting(&[e.id], true);
                }
                let r = wait(fd, events, dl);
                if let Some(b) = b {
                    b.waiting(&[e.id], false);
                }
                hup = r?
            }
            r => return r,
        }
    }
}

/// Raises SIGPIPE on the calling thread for a write to a reset/shut connection, as the kernel
/// does unless `MSG_NOSIGNAL` (an ignored SIGPIPE is discarded by the kernel itself).
pub(crate) fn sigpipe(r: Result<usize, Errno>, flags: i32) -> Result<usize, Errno> {
    if r == Err(libc::EPIPE) && flags & libc::MSG_NOSIGNAL == 0 {
        // SAFETY: tgkill to this very thread with a valid signal number.
        unsafe {
            real::sys(
                libc::SYS_tgkill,
                [
                    libc::getpid() as usize,
                    real::sys(libc::SYS_gettid, [0; 6]) as usize,
                    libc::SIGPIPE as usize,
                    0,
                    0,
                    0,
                ],
            );
        }
    }
    r
}

/// Receives into `bufs` (scattered), honouring MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL and
/// SO_RCVTIMEO. Returns the byte count and, for datagrams, the source.
pub fn recv(
    b: &dyn Backend,
    st: &State,
    fd: i32,
    e: &Entry,
    bufs: &mut [&mut [u8]],
    flags: i32,
) -> Result<(usize, Option<SocketAddrV4>), Errno> {
    let (timeo, _) = st.table.timeouts(fd);
    let id = e.id;
    let pass = flags & !(libc::MSG_WAITALL | libc::MSG_DONTWAIT);
    if bufs.len() > 1 || (e.dgram && bufs.len() != 1) {
        // Scatter through one buffer: a datagram is one message, a peek must not consume.
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut tmp = vec![0u8; total];
        let (n, src) = recv(b, st, fd, e, &mut [&mut tmp[..]], flags)?;
        let mut at = 0;
        for buf in bufs.iter_mut() {
            let k = buf.len().min(n - at);
            buf[..k].copy_from_slice(&tmp[at..at + k]);
            at += k;
        }
        return Ok((n, src));
    }
    let Some(buf) = bufs.first_mut() else {
        return Ok((0, None));
    };
    // A datagram's length beyond the buffer: its real length only with MSG_TRUNC.
    let clamp = |n: usize, cap: usize| match e.dgram && flags & libc::MSG_TRUNC == 0 {
        true => n.min(cap),
        false => n,
    };
    if buf.is_empty() {
        let cap = buf.len();
        return b
            .recvfrom(id, buf, pass)
            .map(|(n, a)| (clamp(n, cap), a))
            .or(Ok((0, None)));
    }
    let (got, src) = blocking(fd, e, flags, libc::POLLIN, timeo, || {
        b.recvfrom(id, buf, pass)
    })?;
    let mut got = clamp(got, buf.len());
    // MSG_WAITALL on a stream: keep going until full, end of stream, an error or a signal.
    let waitall = flags & libc::MSG_WAITALL != 0 && !e.dgram && flags & libc::MSG_PEEK == 0;
    while waitall && got != 0 && got < buf.len() {
        let rest = &mut buf[got..];
        match blocking(fd, e, flags, libc::POLLIN, timeo, || {
            b.recvfrom(id, rest, pass)
        }) {
            Ok((0, _)) | Err(_) => break,
            Ok((n, _)) => got += n,
        }
    }
    Ok((got, src))
}

/// Sends the gathered `bufs`, honouring MSG_DONTWAIT, MSG_NOSIGNAL and SO_SNDTIMEO: a blocking
/// stream send queues everything unless interrupted (then the partial count).
pub fn send(
    b: &dyn Backend,
    st: &State,
    fd: i32,
    e: &Entry,
    bufs: &[&[u8]],
    flags: i32,
    dst: Option<SocketAddrV4>,
) -> Result<usize, Errno> {
    let (_, timeo) = st.table.timeouts(fd);
    let id = e.id;
    let pass = flags & !libc::MSG_DONTWAIT;
    if e.dgram {
        let one: Vec<u8>;
        let data: &[u8] = if bufs.len() == 1 {
            bufs[0]
        } else {
            one = bufs.concat();
            &one
        };
        let r = blocking(fd, e, flags, libc::POLLOUT, timeo, || {
            b.sendto(id, data, pass, dst)
        });
        return sigpipe(r, flags);
    }
    if bufs.len() > 1 {
        let total: usize = bufs.iter().map(|p| p.len()).sum();
        if total <= GATHER_MAX {
            // One send for the whole vector: one command on the rings (one segment when the
            // daemon takes it) or one pipe write and one wake-up of a fused peer, where a
            // send per part would wake the reader between parts (nginx's header and body).
            return GATHER.with(|g| {
                let mut g = g.borrow_mut();
                g.clear();
                for p in bufs {
                    g.extend_from_slice(p);
                }
                send_parts(b, fd, e, &[&g[..]], flags, timeo)
            });
        }
    }
    send_parts(b, fd, e, bufs, flags, timeo)
}

/// A vectored stream send of at most this many bytes in all is gathered into one buffer and
/// sent as one (see [`send`]); a larger one goes part by part (its parts are large enough
/// that the per-part cost is small beside the copy).
pub(crate) const GATHER_MAX: usize = 16 * 1024;

thread_local! {
    /// [`send`]'s gather buffer, kept between calls (no allocation per call once warm).
    static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The stream part of [`send`]: the parts in order, blocking as the socket says; a partial
/// count once something went and the rest would block or failed.
fn send_parts(
    b: &dyn Backend,
    fd: i32,
    e: &Entry,
    bufs: &[&[u8]],
    flags: i32,
    timeo: u32,
) -> Result<usize, Errno> {
    let id = e.id;
    let pass = flags & !libc::MSG_DONTWAIT;
    let mut sent = 0usize;
    for part in bufs {
        let mut off = 0;
        while off < part.len() {
            let r = blocking(fd, e, flags, libc::POLLOUT, timeo, || {
                b.sendto(id, &part[off..], pass, None)
            });
            match r {
                Ok(n) => {
                    off += n;
                    sent += n;
                }
                Err(err) if sent > 0 => {
                    let _ = err;
                    return Ok(sent);
                }
                Err(err) => return sigpipe(Err(err), flags),
            }
            if nonblocking(fd, e, flags) && off < part.len() {
                return Ok(sent);
            }
        }
    }
    Ok(sent)
}

/// Connects, blocking unless non-blocking: `EINPROGRESS` → wait writable → result.
pub fn connect(
    b: &dyn Backend,
    st: &State,
    fd: i32,
    e: &Entry,
    dst: SocketAddrV4,
) -> Result<(), Errno> {
    match b.connect(e.id, dst) {
        Err(libc::EINPROGRESS) if !nonblocking(fd, e, 0) => {}
        r => return r,
    }
    // The wait below is on the placeholder in the kernel: its filler first (left out by a
    // non-blocking connect for programs whose readiness comes from the view).
    b.tokens_on(e.id);
    let (_, timeo) = st.table.timeouts(fd);
    let dl = deadline(timeo);
    loop {
        let hup = match wait(fd, libc::POLLOUT, dl) {
            Err(libc::EAGAIN) => return Err(libc::EINPROGRESS),
            Err(err) => return Err(err),
            Ok(h) => h,
        };
        match b.connect(e.id, dst) {
            Ok(()) | Err(libc::EISCONN) => return Ok(()),
            Err(libc::EALREADY | libc::EINPROGRESS) if hup => return Err(libc::ECONNRESET),
            Err(libc::EALREADY | libc::EINPROGRESS) => continue,
            Err(err) => return Err(err),
        }
    }
}

/// Accepts one connection (blocking unless non-blocking): the descriptor and the peer (None
/// for a kernel connection: the caller asks the kernel).
pub fn accept(
    b: &dyn Backend,
    st: &State,
    fd: i32,
    e: &Entry,
    flags: i32,
) -> Result<(i32, Option<SocketAddrV4>), Errno> {
    let (timeo, _) = st.table.timeouts(fd);
    let kernel = st.table.aux(fd);
    let cloexec = flags & libc::SOCK_CLOEXEC != 0;
    let nonblock = flags & libc::SOCK_NONBLOCK != 0;
    // A flowstack connection's placeholder is made with these flags (no `fcntl` after).
    let fl = FdFlags { cloexec, nonblock };
    let got = blocking(fd, e, 0, libc::POLLIN, timeo, || match b.accept(e.id, fl) {
        // Nothing through flowstack: an ordinary client on the kernel side?
        Err(libc::EAGAIN) if kernel.is_some() => kernel_accept(kernel.unwrap_or(-1)),
        r => r,
    });
    let got = match got {
        Err(err) if daemon_gone(fd) => {
            // The placeholder would stay readable (end of stream) forever and every accept
            // fail: an event loop would spin. Give the number a kernel description instead.
            return match retire_listener(st, fd, e)? {
                true => {
                    // The kernel listener now: accept there (blocking unless non-blocking).
                    // SAFETY: accept on the caller's descriptor; no address asked for here.
                    let n = unsafe {
                        real::accept4(fd, std::ptr::null_mut(), std::ptr::null_mut(), flags)
                    };
                    if n < 0 {
                        Err(real::errno())
                    } else {
                        st.table.clear(n);
                        st.note_kernel(n, Reason::KernelListener, false);
                        Ok((n, None))
                    }
                }
                false => Err(if err == libc::EAGAIN {
                    libc::ECONNABORTED
                } else {
                    err
                }),
            };
        }
        r => r?,
    };
    // What the new descriptor has now: a placeholder pair is made with the flags asked for,
    // a kernel connection close-on-exec and non-blocking (`kernel_accept`).
    let (nfd, peer, was) = match got {
        Accepted::Flowstack(ofd, id, peer) => {
            let nfd = ofd.into_raw_fd();
            if nfd as usize >= MAX_FDS {
                // SAFETY: our own new descriptor; the daemon sees its hang-up.
                unsafe { real::close(nfd) };
                b.forget(id);
                return Err(libc::EMFILE);
            }
            st.table.set(nfd, Entry::new(id, e.inet6, false, nonblock));
            st.hold(id);
            st.note_flowstack(nfd, "accept");
            (nfd, Some(peer), fl)
        }
        Accepted::Kernel(ofd) => {
            let nfd = ofd.into_raw_fd();
            if st.table.clear(nfd).is_some() {
                // A number the table still had: its socket was closed behind our back.
            }
            st.note_kernel(nfd, Reason::KernelListener, false);
            let k = FdFlags {
                cloexec: true,
                nonblock: true,
            };
            (nfd, None, k)
        }
    };
    // Only the flags that differ from what the descriptor has (a system call each, per
    // connection).
    // SAFETY: flag changes on the descriptor just created.
    unsafe {
        if cloexec != was.cloexec {
            let fd_fl = if cloexec { libc::FD_CLOEXEC } else { 0 };
            real::fcntl(nfd, libc::F_SETFD, fd_fl as usize);
        }
        if nonblock != was.nonblock {
            // No other status flag (O_APPEND, O_ASYNC, …) is set on either kind.
            let fl = if nonblock { libc::O_NONBLOCK } else { 0 };
            real::fcntl(nfd, libc::F_SETFL, fl as usize);
        }
    }
    Ok((nfd, peer))
}

/// The daemon is gone: the placeholder's other end (which only the daemon holds) hung up.
fn daemon_gone(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack, no waiting.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLHUP != 0
}

/// The epoll layer saw the daemon go: retires listener `fd` (still socket `id`) as its next
/// accept would; true if `fd` is now the kernel listener.
pub(crate) fn retire_gone_listener(fd: i32, id: SockId) -> bool {
    let Some(st) = crate::state::get() else {
        return false;
    };
    match st.table.get(fd) {
        Some(e) if e.id == id && e.listening => {
            inside(|| retire_listener(st, fd, &e)).unwrap_or(false)
        }
        _ => false,
    }
}

/// Replaces listening placeholder `fd`, whose daemon died, by a kernel description under the
/// same number (`dup3`, keeping `FD_CLOEXEC` and `O_NONBLOCK`): the shim's kernel listener
/// when it has one (true: later accepts take the kernel path), else an unconnected datagram
/// socket, which is never readable nor hung up (false: accept then fails with `EOPNOTSUPP`).
///
/// Why `dup3` onto the number: the program keeps using the number it knows (select/poll
/// sets, blocking accept). An epoll registration names the open file description, not the
/// number: the old placeholder's registration goes away when its last copy is closed (the
/// shim drops its own copy here), so the loop stops being woken for it — it does not spin;
/// it is not woken for the kernel listener either until it registers the number again.
fn retire_listener(st: &State, fd: i32, e: &Entry) -> Result<bool, Errno> {
    let kernel = st.table.aux(fd);
    // SAFETY: plain descriptor calls on the caller's descriptor and on ones we own.
    unsafe {
        let cloexec = real::fcntl(fd, libc::F_GETFD, 0) > 0;
        let nonblock = real::fcntl(fd, libc::F_GETFL, 0).max(0) & libc::O_NONBLOCK;
        let (src, own) = match kernel {
            Some(k) => (k, false),
            None => {
                let u = real::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                if u < 0 {
                    return Err(real::errno());
                }
                (u, true)
            }
        };
        let r = real::dup3(src, fd, if cloexec { libc::O_CLOEXEC } else { 0 });
        let err = real::errno();
        if own {
            real::close(src);
        }
        if r < 0 {
            return Err(err);
        }
        st.table.set_aux(fd, None);
        st.table.clear(fd);
        let last = st.release(e.id);
        if let (true, Some(k)) = (last, kernel) {
            // The shim's own copy of the kernel listener (fd is a dup of it now).
            close_kernel_copy(k);
        }
        // O_NONBLOCK belongs to the description: set it only once the shim's own copy (which
        // other numbers of this listener still use, non-blocking) is gone.
        if last || kernel.is_none() {
            let fl = real::fcntl(fd, libc::F_GETFL, 0).max(0);
            real::fcntl(
                fd,
                libc::F_SETFL,
                ((fl & !libc::O_NONBLOCK) | nonblock) as usize,
            );
        }
    }
    st.note_kernel(fd, Reason::KernelListener, true);
    Ok(kernel.is_some())
}

fn kernel_accept(k: i32) -> Result<Accepted, Errno> {
    use std::os::fd::FromRawFd;
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: accept on the shim's kernel listener; no address is asked for.
    let n = unsafe { real::accept4(k, std::ptr::null_mut(), std::ptr::null_mut(), flags) };
    if n < 0 {
        let err = real::errno();
        // Connections that died while queued look like "try again" to the application.
        return Err(if err == libc::ECONNABORTED {
            libc::EAGAIN
        } else {
            err
        });
    }
    // SAFETY: `n` is a new descriptor we own.
    Ok(Accepted::Kernel(unsafe {
        std::os::fd::OwnedFd::from_raw_fd(n)
    }))
}

/// Replaces the placeholder `fd` with a kernel socket of the same family and type, keeping
/// the descriptor number, its flags and the options set so far; the daemon forgets the
/// socket. The caller then makes the kernel call.
pub fn to_kernel(st: &State, fd: i32, e: &Entry, why: Reason) -> Result<(), Errno> {
    let family = if e.inet6 {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    let ty = if e.dgram {
        libc::SOCK_DGRAM
    } else {
        libc::SOCK_STREAM
    };
    let local = if e.bound {
        st.connected().and_then(|b| b.local_addr(e.id).ok())
    } else {
        None
    };
    // SAFETY: plain descriptor calls; option values point at locals that outlive the calls.
    unsafe {
        let k = real::socket(family, ty | libc::SOCK_CLOEXEC, 0);
        if k < 0 {
            return Err(real::errno());
        }
        let on: libc::c_int = 1;
        let set = |lv, nm| {
            real::setsockopt(k, lv, nm, (&on as *const libc::c_int).cast(), 4);
        };
        if e.opts & opt::REUSEADDR != 0 {
            set(libc::SOL_SOCKET, libc::SO_REUSEADDR);
        }
        if e.opts & opt::REUSEPORT != 0 {
            set(libc::SOL_SOCKET, libc::SO_REUSEPORT);
        }
        if e.opts & opt::NODELAY != 0 {
            set(libc::IPPROTO_TCP, libc::TCP_NODELAY);
        }
        if e.opts & opt::KEEPALIVE != 0 {
            set(libc::SOL_SOCKET, libc::SO_KEEPALIVE);
        }
        if e.v6only {
            set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY);
        }
        let (r, s) = st.table.timeouts(fd);
        for (ms, nm) in [(r, libc::SO_RCVTIMEO), (s, libc::SO_SNDTIMEO)] {
            if ms != 0 {
                let tv = libc::timeval {
                    tv_sec: (ms / 1000) as _,
                    tv_usec: ((ms % 1000) * 1000) as _,
                };
                let p = (&tv as *const libc::timeval).cast();
                real::setsockopt(k, libc::SOL_SOCKET, nm, p, 16);
            }
        }
        if let Some(a) = local {
            let (bytes, n) = addr::write_addr(a, e.inet6);
            real::bind(k, bytes.as_ptr().cast(), n as _);
        }
        if e.nonblock {
            real::fcntl(k, libc::F_SETFL, libc::O_NONBLOCK as usize);
        }
        let cloexec = real::fcntl(fd, libc::F_GETFD, 0) > 0;
        let r = real::dup3(k, fd, if cloexec { libc::O_CLOEXEC } else { 0 });
        let err = real::errno();
        real::close(k);
        if r < 0 {
            return Err(err);
        }
    }
    st.table.clear(fd);
    st.release(e.id);
    st.note_kernel(fd, why, true);
    Ok(())
}

/// Where `bind` goes, after reading the application's address.
pub fn bind(b: &dyn Backend, st: &State, fd: i32, e: &Entry, a: Addr) -> Result<bool, Errno> {
    match addr::bind_route(a, e.v6only) {
        // UDP is carried on the daemon's loopback only: a link address stays the kernel's.
        Ok(v4) if e.dgram && !(v4.ip().is_unspecified() || v4.ip().octets()[0] == 127) => {
            to_kernel(st, fd, e, Reason::NotCarried)?;
            Ok(false)
        }
        Ok(v4) => {
            b.bind(e.id, v4)?;
            st.table.update(fd, |x| x.bound = true);
            Ok(true)
        }
        Err(why) => {
            to_kernel(st, fd, e, why)?;
            Ok(false)
        }
    }
}

/// listen(2), with the kernel listener on the same port unless FLOWSTACK_KERNEL_LISTEN=0.
pub fn listen(b: &dyn Backend, st: &State, fd: i32, e: &Entry, backlog: i32) -> Result<(), Errno> {
    let kernel = if st.cfg.kernel_listen && !e.dgram && !e.listening {
        b.local_addr(e.id)
            .ok()
            .filter(|a| a.port() != 0)
            .and_then(|a| kernel_listener(a, e.inet6, backlog))
    } else {
        None
    };
    // The shim keeps its own copy to accept ordinary clients from, out of the program's way
    // (`flowstack_sys::ownfd`; un-noted where it is closed).
    let mine = kernel
        .as_ref()
        .and_then(|k| flowstack_sys::ownfd::dup_noted(k.as_fd()).ok());
    if let Err(err) = b.listen(e.id, backlog, kernel) {
        if let Some(k) = mine {
            close_kernel_copy(k);
        }
        return Err(err);
    }
    st.table.update(fd, |x| x.listening = true);
    if mine.is_some() {
        st.table.set_aux(fd, mine);
    }
    Ok(())
}

/// Closes the shim's copy of a kernel listener, kept by number and noted
/// (`flowstack_sys::ownfd::dup_noted`), once nothing names it.
pub(crate) fn close_kernel_copy(k: i32) {
    flowstack_sys::ownfd::unnote(k);
    // SAFETY: the shim's own descriptor, never handed out, closed once.
    unsafe { real::close(k) };
}

fn kernel_listener(a: SocketAddrV4, inet6: bool, backlog: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let family = if inet6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: a new kernel socket we own until handed over; option and address buffers are
    // locals that outlive the calls.
    unsafe {
        let k = real::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if k < 0 {
            return None;
        }
        let owned = std::os::fd::OwnedFd::from_raw_fd(k);
        let on: libc::c_int = 1;
        real::setsockopt(
            k,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&on as *const i32).cast(),
            4,
        );
        let (bytes, n) = addr::write_addr(a, inet6);
        if real::bind(k, bytes.as_ptr().cast(), n as _) != 0 || real::listen(k, backlog) != 0 {
            return None;
        }
        real::fcntl(k, libc::F_SETFL, libc::O_NONBLOCK as usize);
        Some(owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// The sends the fake backend saw for socket `id`.
    fn sends_of(id: SockId) -> Vec<usize> {
        let f = crate::poll::tests::fake();
        let all = f.sends.lock().unwrap();
        all.iter().filter(|s| s.0 == id).map(|s| s.1).collect()
    }

    #[test]
    fn a_small_vectored_stream_send_goes_as_one_and_a_large_one_part_by_part() {
        let f = crate::poll::tests::fake();
        let st = crate::state::state();
        // Non-blocking, as nginx's sockets: a partial send returns at once.
        let e = Entry::new(7001, false, false, true);
        let (head, body) = (vec![b'h'; 200], vec![b'b'; 19]);
        let n = send(f, st, -1, &e, &[&head, &body], 0, None).unwrap();
        assert_eq!(n, 219);
        assert_eq!(sends_of(7001), vec![219], "one send for header and body");

        let e = Entry::new(7002, false, false, true);
        let big = vec![b'x'; GATHER_MAX];
        let n = send(f, st, -1, &e, &[&head, &big], 0, None).unwrap();
        assert_eq!(n, 200 + GATHER_MAX);
        assert_eq!(
            sends_of(7002),
            vec![200, GATHER_MAX],
            "past GATHER_MAX: per part"
        );

        // A gathered send that only partly goes returns its count, as writev does.
        let e = Entry::new(7003, false, false, true);
        f.send_room.store(100, Ordering::Relaxed);
        let n = send(f, st, -1, &e, &[&head, &body], 0, None);
        f.send_room.store(0, Ordering::Relaxed);
        assert_eq!(n, Ok(100));
        assert_eq!(sends_of(7003), vec![100]);
    }
}
