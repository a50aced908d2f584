//! The C library's socket surface, interposed. Each entry point looks the descriptor up in the
//! table (one atomic load): not a placeholder → the C library's own function; a placeholder →
//! the operation in `ops`, inside `catch_unwind` so that no Rust panic reaches C (a panic
//! becomes `EIO`).
//!
//! Readiness calls are in `epoll` (the shared-memory fast path for flowstack connections) and
//! `poll` (poll/ppoll/select/pselect: the kernel answers, kept honest for quiet sockets).
#![allow(clippy::missing_safety_doc)]

use crate::addr::{self, Reason};
use crate::backend::{Backend, Errno, FdFlags};
use crate::ops;
use crate::real;
use crate::state::{self, inside, is_inside, State};
use crate::table::{opt, Entry, MAX_FDS};
use flowstack_sys::ownfd;
use libc::{
    c_char, c_int, c_long, c_uint, c_ulong, c_void, iovec, mmsghdr, msghdr, off_t, pid_t, size_t,
    sockaddr, socklen_t, ssize_t,
};
use std::net::SocketAddrV4;
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The failure value of a C return type.
pub(crate) trait Fail {
    const FAIL: Self;
}
impl Fail for c_int {
    const FAIL: Self = -1;
}
impl Fail for ssize_t {
    const FAIL: Self = -1;
}

/// Runs a placeholder operation: interposition off for the thread, panics caught, errors to
/// `errno`.
pub(crate) fn run<R: Fail>(f: impl FnOnce() -> Result<R, Errno>) -> R {
    match catch_unwind(AssertUnwindSafe(|| inside(f))) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            real::set_errno(e);
            R::FAIL
        }
        Err(_) => {
            real::set_errno(libc::EIO);
            R::FAIL
        }
    }
}

/// The placeholder behind `fd`, if it is one and this thread is not inside the shim.
#[inline]
pub(crate) fn placeholder(fd: c_int) -> Option<(&'static State, &'static dyn Backend, Entry)> {
    let st = state::get()?;
    st.table.get(fd)?;
    if is_inside() {
        return None;
    }
    state::readopt_if_forked(st);
    let e = st.table.get(fd)?;
    Some((st, st.connected()?, e))
}

unsafe fn buf_mut<'a>(p: *mut c_void, n: size_t) -> Result<&'a mut [u8], Errno> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller of the C function promises `n` writable bytes at `p`.
    Ok(std::slice::from_raw_parts_mut(p.cast(), n))
}

unsafe fn buf<'a>(p: *const c_void, n: size_t) -> Result<&'a [u8], Errno> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller of the C function promises `n` readable bytes at `p`.
    Ok(std::slice::from_raw_parts(p.cast(), n))
}

unsafe fn iovs_mut<'a>(v: *const iovec, n: c_int) -> Result<Vec<&'a mut [u8]>, Errno> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return Err(libc::EINVAL);
    }
    if n > 0 && v.is_null() {
        return Err(libc::EFAULT);
    }
    (0..n as usize)
        .map(|i| {
            // SAFETY: `v` holds `n` iovecs (the C contract).
            let io = &*v.add(i);
            buf_mut(io.iov_base, io.iov_len)
        })
        .collect()
}

unsafe fn iovs<'a>(v: *const iovec, n: c_int) -> Result<Vec<&'a [u8]>, Errno> {
    Ok(iovs_mut(v, n)?.into_iter().map(|b| &*b).collect())
}

unsafe fn read_sockaddr<'a>(a: *const sockaddr, l: socklen_t) -> Option<&'a [u8]> {
    // SAFETY: the caller promises `l` readable bytes at `a`.
    (!a.is_null()).then(|| std::slice::from_raw_parts(a.cast::<u8>(), l as usize))
}

/// Writes `a` into the application's (addr, len) pair with the kernel's truncation rule:
/// at most `*len` bytes copied, `*len` set to the full size.
unsafe fn put_sockaddr(a: SocketAddrV4, inet6: bool, out: *mut sockaddr, len: *mut socklen_t) {
    if out.is_null() || len.is_null() {
        return;
    }
    let (bytes, n) = addr::write_addr(a, inet6);
    // SAFETY: `len` is the caller's; `out` has `*len` writable bytes.
    let room = (*len as usize).min(n);
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), room);
    *len = n as socklen_t;
}

unsafe fn put_int(v: c_int, out: *mut c_void, len: *mut socklen_t) -> Result<c_int, Errno> {
    if out.is_null() || len.is_null() {
        return Err(libc::EFAULT);
    }
    let b = v.to_ne_bytes();
    let n = (*len as usize).min(4);
    std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), n);
    *len = n as socklen_t;
    Ok(0)
}

// ---- creating sockets ---------------------------------------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    if is_inside() {
        return real::socket(domain, ty, proto);
    }
    let kind = match addr::socket_kind(domain, ty, proto) {
        Ok(k) => k,
        Err(why) => {
            let fd = real::socket(domain, ty, proto);
            if fd >= 0 {
                if let Some(st) = state::get() {
                    st.table.clear(fd);
                    if st.cfg.report.is_some() {
                        st.note_kernel(fd, why, false);
                    }
                }
            }
            return fd;
        }
    };
    let st = state::state();
    // In a forked child, the inherited sockets are re-attached before new ones exist.
    state::readopt_if_forked(st);
    let kernel = |why: Reason| {
        let fd = real::socket(domain, ty, proto);
        if fd >= 0 {
            st.table.clear(fd);
            st.note_kernel(fd, why, false);
        }
        fd
    };
    if st.cfg.disabled {
        return kernel(Reason::Disabled);
    }
    let b = match st.backend() {
        Ok(b) => b,
        Err(_) if st.cfg.fail_without_daemon => {
            real::set_errno(libc::EAFNOSUPPORT);
            return -1;
        }
        Err(_) => return kernel(Reason::NoDaemon),
    };
    // The placeholder is made with the program's descriptor flags: no `fcntl` after.
    let fl = FdFlags {
        cloexec: kind.cloexec,
        nonblock: kind.nonblock,
    };
    let made = catch_unwind(AssertUnwindSafe(|| inside(|| b.socket(kind.dgram, fl))));
    let (ofd, id) = match made {
        Ok(Ok(x)) => x,
        Ok(Err(e)) if st.cfg.fail_without_daemon => {
            real::set_errno(e);
            return -1;
        }
        _ => return kernel(Reason::Refused),
    };
    let fd = ofd.into_raw_fd();
    if fd as usize >= MAX_FDS {
        real::close(fd);
        inside(|| b.forget(id));
        return kernel(Reason::FdTooHigh);
    }
    st.table
        .set(fd, Entry::new(id, kind.inet6, kind.dgram, kind.nonblock));
    st.hold(id);
    inside(|| st.note_flowstack(fd, "socket"));
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, a: *const sockaddr, l: socklen_t) -> c_int {
    let Some((st, b, e)) = placeholder(fd) else {
        return real::bind(fd, a, l);
    };
    let moved = run(|| {
        let addr = addr::read_addr(read_sockaddr(a, l), e.inet6)?;
        ops::bind(b, st, fd, &e, addr).map(|fs| if fs { 0 } else { 1 })
    });
    match moved {
        1 => real::bind(fd, a, l),
        r => r,
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    match placeholder(fd) {
        None => real::listen(fd, backlog),
        Some((st, b, e)) => run(|| ops::listen(b, st, fd, &e, backlog).map(|_| 0)),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int {
    accept4(fd, a, l, 0)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some((st, b, e)) = placeholder(fd) else {
        let n = real::accept4(fd, a, l, flags);
        if n >= 0 {
            if let Some(st) = state::get() {
                st.table.clear(n);
            }
        }
        return n;
    };
    run(|| {
        let (nfd, peer) = ops::accept(b, st, fd, &e, flags)?;
        match peer {
            Some(p) => put_sockaddr(p, e.inet6, a, l),
            None if !a.is_null() && !l.is_null() => {
                real::getpeername(nfd, a, l);
            }
            None => {}
        }
        Ok(nfd)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, a: *const sockaddr, l: socklen_t) -> c_int {
    let Some((st, b, e)) = placeholder(fd) else {
        return real::connect(fd, a, l);
    };
    let r = run(|| {
        let addr = addr::read_addr(read_sockaddr(a, l), e.inet6)?;
        if e.dgram && addr == addr::Addr::Unspec {
            // AF_UNSPEC dissolves a datagram socket's association.
            let none = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
            return b.connect(e.id, none).map(|_| 0);
        }
        let carries = |d| match e.dgram {
            true => b.carries_dgram(e.id, d),
            false => b.carries(d),
        };
        match addr::connect_route(addr, e.v6only, carries) {
            Ok(dst) => ops::connect(b, st, fd, &e, dst).map(|_| 0),
            Err(why) => ops::to_kernel(st, fd, &e, why).map(|_| 1),
        }
    });
    match r {
        1 => real::connect(fd, a, l),
        r => r,
    }
}

// ---- data -----------------------------------------------------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, p: *mut c_void, n: size_t) -> ssize_t {
    match placeholder(fd) {
        None => real::read(fd, p, n),
        Some((st, b, e)) => run(|| {
            let mut s = [buf_mut(p, n)?];
            ops::recv(b, st, fd, &e, &mut s, 0).map(|r| r.0 as ssize_t)
        }),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, p: *mut c_void, n: size_t, room: size_t) -> ssize_t {
    if n > room {
        libc::abort();
    }
    read(fd, p, n)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, p: *const c_void, n: size_t) -> ssize_t {
    match placeholder(fd) {
        None => real::write(fd, p, n),
        Some((st, b, e)) => {
            run(|| ops::send(b, st, fd, &e, &[buf(p, n)?], 0, None).map(|n| n as ssize_t))
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, v: *const iovec, n: c_int) -> ssize_t {
    match placeholder(fd) {
        None => real::readv(fd, v, n),
        Some((st, b, e)) => run(|| {
            let mut s = iovs_mut(v, n)?;
            ops::recv(b, st, fd, &e, &mut s, 0).map(|r| r.0 as ssize_t)
        }),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, v: *const iovec, n: c_int) -> ssize_t {
    match placeholder(fd) {
        None => real::writev(fd, v, n),
        Some((st, b, e)) => {
            run(|| ops::send(b, st, fd, &e, &iovs(v, n)?, 0, None).map(|n| n as ssize_t))
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, p: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    match placeholder(fd) {
        None => real::recv(fd, p, n, flags),
        Some((st, b, e)) => run(|| {
            let mut s = [buf_mut(p, n)?];
            ops::recv(b, st, fd, &e, &mut s, flags).map(|r| r.0 as ssize_t)
        }),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    p: *mut c_void,
    n: size_t,
    room: size_t,
    flags: c_int,
) -> ssize_t {
    if n > room {
        libc::abort();
    }
    recv(fd, p, n, flags)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    p: *mut c_void,
    n: size_t,
    flags: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> ssize_t {
    match placeholder(fd) {
        None => real::recvfrom(fd, p, n, flags, a, l),
        Some((st, b, e)) => run(|| {
            let mut s = [buf_mut(p, n)?];
            let (got, src) = ops::recv(b, st, fd, &e, &mut s, flags)?;
            match src {
                Some(src) => put_sockaddr(src, e.inet6, a, l),
                None if !l.is_null() && !e.dgram => {
                    if let Ok(peer) = b.peer_addr(e.id) {
                        put_sockaddr(peer, e.inet6, a, l);
                    }
                }
                None => {}
            }
            Ok(got as ssize_t)
        }),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    p: *mut c_void,
    n: size_t,
    room: size_t,
    flags: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> ssize_t {
    if n > room {
        libc::abort();
    }
    recvfrom(fd, p, n, flags, a, l)
}

/// Calls `f` with each descriptor an `SCM_RIGHTS` control message of `m` carries.
///
/// # Safety
/// `m` points to a `msghdr` whose control buffer, if any, is valid (sendmsg's and
/// recvmsg's contract).
unsafe fn each_passed_fd(m: *const msghdr, mut f: impl FnMut(c_int)) {
    let m = &*m;
    if m.msg_control.is_null() || m.msg_controllen < libc::CMSG_LEN(0) as usize {
        return;
    }
    let mut c = libc::CMSG_FIRSTHDR(m);
    while !c.is_null() {
        if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
            let data = libc::CMSG_DATA(c) as *const c_int;
            let n = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize) / 4;
            for i in 0..n {
                f(data.add(i).read_unaligned());
            }
        }
        c = libc::CMSG_NXTHDR(m, c);
    }
}

/// Whether `fd` may be a placeholder: a unix stream socket (not a pipe, a file or an inet
/// socket).
fn maybe_placeholder(fd: c_int) -> bool {
    // SAFETY: `fd` was just received and stays open for this call.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    flowstack_sys::placeholder::is_unix_stream(fd)
}

/// Descriptors received with SCM_RIGHTS: placeholders of another process become ours. A
/// process that has made no socket of its own has not met the daemon yet: it does now if
/// a descriptor may be a placeholder (a receiver that only ever uses sockets it is sent —
/// a worker handed connections by its master — would otherwise write into the placeholder
/// itself, and its bytes would be lost).
unsafe fn adopt_received(m: *const msghdr) {
    let mut candidate = false;
    each_passed_fd(m, |fd| candidate |= maybe_placeholder(fd));
    if !candidate {
        return;
    }
    let st = state::state();
    let Ok(b) = st.backend() else { return };
    each_passed_fd(m, |fd| {
        st.table.clear(fd);
        if let Some(id) = inside(|| b.adopt(fd)) {
            // SAFETY: F_GETFL on a descriptor number; no memory is passed.
            let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
            let nb = fl >= 0 && fl & libc::O_NONBLOCK != 0;
            if st.table.set(fd, Entry::new(id, false, false, nb)) {
                st.hold(id);
                inside(|| st.note_flowstack(fd, "received"));
            }
        }
    });
}

/// Descriptors sent with SCM_RIGHTS: a flowstack socket's placeholder may now live in
/// another process, so it is never reused (`Backend::pin`).
///
/// # Safety
/// `m` points to a `msghdr` (the C contract of sendmsg).
unsafe fn pin_sent(m: *const msghdr) {
    let Some(st) = state::get() else { return };
    let Some(b) = st.connected() else { return };
    each_passed_fd(m, |fd| {
        if let Some(e) = st.table.get(fd) {
            inside(|| b.pin(e.id));
        }
    });
}

unsafe fn recvmsg_ours(
    st: &State,
    b: &dyn Backend,
    fd: c_int,
    e: &Entry,
    m: *mut msghdr,
    flags: c_int,
) -> Result<usize, Errno> {
    if m.is_null() {
        return Err(libc::EFAULT);
    }
    let m = &mut *m;
    let mut s = iovs_mut(m.msg_iov, m.msg_iovlen as c_int)?;
    let room: usize = s.iter().map(|x| x.len()).sum();
    // A datagram's real length, to report MSG_TRUNC in msg_flags.
    let ask = if e.dgram {
        flags | libc::MSG_TRUNC
    } else {
        flags
    };
    let (got, src) = ops::recv(b, st, fd, e, &mut s, ask)?;
    match src {
        Some(src) if !m.msg_name.is_null() => {
            let mut l = m.msg_namelen;
            put_sockaddr(src, e.inet6, m.msg_name.cast(), &mut l);
            m.msg_namelen = l;
        }
        _ => m.msg_namelen = 0,
    }
    m.msg_controllen = 0;
    m.msg_flags = if e.dgram && got > room {
        libc::MSG_TRUNC
    } else {
        0
    };
    // recvmsg(2): MSG_TRUNC in flags returns the real length, else what was copied.
    Ok(if flags & libc::MSG_TRUNC != 0 {
        got
    } else {
        got.min(room)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, m: *mut msghdr, flags: c_int) -> ssize_t {
    match placeholder(fd) {
        None => {
            let r = real::recvmsg(fd, m, flags);
            if r >= 0 && !m.is_null() && !is_inside() {
                adopt_received(m);
            }
            r
        }
        Some((st, b, e)) => run(|| recvmsg_ours(st, b, fd, &e, m, flags).map(|n| n as ssize_t)),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    v: *mut mmsghdr,
    n: c_uint,
    flags: c_int,
    t: *mut libc::timespec,
) -> c_int {
    let Some((st, b, e)) = placeholder(fd) else {
        return real::recvmmsg(fd, v, n, flags, t);
    };
    // Deviation: the timeout argument is not applied (the kernel's is checked only between
    // datagrams, too).
    run(|| {
        let mut done = 0u32;
        while done < n {
            let f = if done == 0 || flags & libc::MSG_WAITFORONE == 0 {
                flags & !libc::MSG_WAITFORONE
            } else {
                (flags & !libc::MSG_WAITFORONE) | libc::MSG_DONTWAIT
            };
            let f = if done > 0 { f | libc::MSG_DONTWAIT } else { f };
            let h = &mut *v.add(done as usize);
            match recvmsg_ours(st, b, fd, &e, &mut h.msg_hdr, f) {
                Ok(k) => h.msg_len = k as c_uint,
                Err(err) if done == 0 => return Err(err),
                Err(_) => break,
            }
            done += 1;
        }
        Ok(done as c_int)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, p: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    match placeholder(fd) {
        None => real::send(fd, p, n, flags),
        Some((st, b, e)) => {
            run(|| ops::send(b, st, fd, &e, &[buf(p, n)?], flags, None).map(|n| n as ssize_t))
        }
    }
}

/// sendto's destination for a datagram socket: flowstack's, or the socket moves to the kernel.
unsafe fn dgram_dst(
    st: &State,
    b: &dyn Backend,
    fd: c_int,
    e: &Entry,
    a: *const sockaddr,
    l: socklen_t,
) -> Result<Option<SocketAddrV4>, Errno> {
    if a.is_null() || !e.dgram {
        return Ok(None);
    }
    let addr = addr::read_addr(read_sockaddr(a, l), e.inet6)?;
    match addr::connect_route(addr, e.v6only, |d| b.carries_dgram(e.id, d)) {
        Ok(d) => Ok(Some(d)),
        Err(why) => {
            ops::to_kernel(st, fd, e, why)?;
            Err(-1)
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    p: *const c_void,
    n: size_t,
    flags: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> ssize_t {
    let Some((st, b, e)) = placeholder(fd) else {
        return real::sendto(fd, p, n, flags, a, l);
    };
    let mut moved = false;
    let r = run(|| match dgram_dst(st, b, fd, &e, a, l) {
        Err(-1) => {
            moved = true;
            Ok(0)
        }
        Err(err) => Err(err),
        Ok(dst) => ops::send(b, st, fd, &e, &[buf(p, n)?], flags, dst).map(|n| n as ssize_t),
    });
    if moved {
        return real::sendto(fd, p, n, flags, a, l);
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, m: *const msghdr, flags: c_int) -> ssize_t {
    let Some((st, b, e)) = placeholder(fd) else {
        if !m.is_null() && !is_inside() {
            // SAFETY: `m` is the caller's non-null msghdr (sendmsg's contract).
            pin_sent(m);
        }
        return real::sendmsg(fd, m, flags);
    };
    if m.is_null() {
        real::set_errno(libc::EFAULT);
        return -1;
    }
    let h = &*m;
    let mut moved = false;
    let r = run(
        || match dgram_dst(st, b, fd, &e, h.msg_name.cast(), h.msg_namelen) {
            Err(-1) => {
                moved = true;
                Ok(0)
            }
            Err(err) => Err(err),
            Ok(dst) => {
                let s = iovs(h.msg_iov, h.msg_iovlen as c_int)?;
                ops::send(b, st, fd, &e, &s, flags, dst).map(|n| n as ssize_t)
            }
        },
    );
    if moved {
        return real::sendmsg(fd, m, flags);
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmmsg(fd: c_int, v: *mut mmsghdr, n: c_uint, flags: c_int) -> c_int {
    if placeholder(fd).is_none() {
        return real::sendmmsg(fd, v, n, flags);
    }
    let mut done = 0u32;
    while done < n {
        let h = &mut *v.add(done as usize);
        let f = if done > 0 {
            flags | libc::MSG_DONTWAIT
        } else {
            flags
        };
        let r = sendmsg(fd, &h.msg_hdr, f);
        if r < 0 {
            if done == 0 {
                return -1;
            }
            break;
        }
        h.msg_len = r as c_uint;
        done += 1;
    }
    done as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    if let Some(st) = state::get() {
        if st.table.get(inp).is_some() && !is_inside() {
            // Linux: in_fd must support mmap-like operations; a socket does not.
            real::set_errno(libc::EINVAL);
            return -1;
        }
    }
    match placeholder(out) {
        None => real::sendfile(out, inp, off, n),
        Some((st, b, e)) => run(|| {
            let o = (!off.is_null()).then(|| &mut *off);
            crate::sendfile::sendfile(b, st, out, &e, inp, o, n).map(|n| n as ssize_t)
        }),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    sendfile(out, inp, off, n)
}

// ---- closing and duplicating ---------------------------------------------------------------

/// Bookkeeping before the kernel closes `fd` (or replaces it): the table forgets it and the
/// daemon API forgets its socket at the last descriptor.
fn forget_fd(fd: c_int) {
    if let Some(st) = state::get() {
        let aux = st.table.aux(fd);
        if let Some(e) = st.table.clear(fd) {
            if st.release(e.id) {
                crate::epoll::forget_sock(e.id);
                if let Some(k) = aux {
                    ops::close_kernel_copy(k);
                }
            }
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if refuse_own(fd) {
        return -1; // left open: the library's
    }
    if !is_inside() {
        forget_fd(fd);
        crate::epoll::on_close(fd);
    }
    real::close(fd)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close_range(lo: c_uint, hi: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 || is_inside() {
        return real::close_range(lo, hi, flags);
    }
    if let Some(st) = state::get() {
        let fds: Vec<c_int> = st.table.in_range(lo, hi).map(|(fd, _)| fd).collect();
        for fd in fds {
            forget_fd(fd);
        }
    }
    // The library's own descriptors stay (`flowstack_sys::ownfd`): the range is closed in
    // the pieces between them.
    let mut from = lo as u64;
    for own in ownfd::own_in(lo, hi) {
        let own = own as u64;
        if own > from && real::close_range(from as c_uint, (own - 1) as c_uint, flags) < 0 {
            return -1;
        }
        from = own + 1;
    }
    if from > hi as u64 {
        return 0; // the range ended on one of ours
    }
    real::close_range(from as c_uint, hi, flags)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn closefrom(lo: c_int) {
    let lo = lo.max(0) as c_uint;
    if close_range(lo, c_uint::MAX, 0) == 0 {
        return;
    }
    // Kernels without close_range: close what the table knows and the rest one by one.
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
    for fd in lo..(rl.rlim_cur.min(1 << 20) as c_uint) {
        if ownfd::is_own(fd as c_int) {
            continue;
        }
        real::close(fd as c_int);
    }
}

/// True (errno `EBADF`) if the program names one of the library's own descriptors
/// (`flowstack_sys::ownfd`): it never opened it, as far as it knows.
fn refuse_own(fd: c_int) -> bool {
    let own = !is_inside() && ownfd::is_own(fd);
    if own {
        real::set_errno(libc::EBADF);
    }
    own
}

/// Moves the shim's copy of a kernel listener numbered `k` (the aux of the listener's
/// numbers in the table) to another number: the program is about to `dup2` onto `k`.
fn move_kernel_listener(st: &State, k: c_int) {
    let holders: Vec<c_int> = st
        .table
        .in_range(0, c_uint::MAX)
        .map(|(fd, _)| fd)
        .filter(|&fd| st.table.aux(fd) == Some(k))
        .collect();
    if holders.is_empty() {
        return;
    }
    // SAFETY: `k` is the shim's own open descriptor (noted, in the table).
    let Ok(n) = ownfd::dup_noted(unsafe { BorrowedFd::borrow_raw(k) }) else {
        return;
    };
    for fd in holders {
        st.table.set_aux(fd, Some(n));
    }
    ops::close_kernel_copy(k); // the table names `n` now
}

/// After the kernel made `new` a copy of `old`: the table follows.
fn dup_done(old: c_int, new: c_int) {
    if let Some(st) = state::get() {
        if st.table.get(new).is_some() {
            forget_fd(new);
        }
        st.table.copy(old, new);
        crate::epoll::on_dup(old, new);
        if let Some(e) = st.table.get(new) {
            st.hold(e.id);
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if refuse_own(fd) {
        return -1;
    }
    let n = real::dup(fd);
    if n >= 0 && !is_inside() {
        dup_done(fd, n);
    }
    n
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        // dup2 of a descriptor onto itself only checks that it is open.
        return if real::fcntl(old, libc::F_GETFD, 0) < 0 {
            -1
        } else {
            new
        };
    }
    dup3(old, new, 0)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if refuse_own(old) {
        return -1;
    }
    if !is_inside() && ownfd::is_own(new) {
        // The program takes a number the library holds: the library's file moves elsewhere
        // first (`flowstack_sys::ownfd`).
        if let Some(st) = state::get() {
            if let Ok(b) = st.backend() {
                if !inside(|| b.move_own(new)) {
                    move_kernel_listener(st, new);
                }
            }
        }
    }
    let n = real::dup3(old, new, flags);
    if n >= 0 && !is_inside() {
        dup_done(old, n);
    }
    n
}

// ---- descriptor control --------------------------------------------------------------------

/// Records O_NONBLOCK for a placeholder after the kernel accepted the change.
fn learn_nonblock(fd: c_int, on: bool) {
    if let Some(st) = state::get() {
        st.table.update(fd, |e| e.nonblock = on);
    }
}

// fcntl and ioctl are variadic in C; on x86-64 and arm64 Linux the optional argument arrives
// in the register a fixed third parameter is read from, so the fixed signature is the ABI.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) && refuse_own(fd) {
        return -1;
    }
    let r = real::fcntl(fd, cmd, arg);
    if r < 0 || is_inside() {
        return r;
    }
    match cmd {
        libc::F_SETFL => learn_nonblock(fd, arg as c_int & libc::O_NONBLOCK != 0),
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => dup_done(fd, r),
        _ => {}
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl(fd, cmd, arg)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int {
    let Some((_, b, e)) = placeholder(fd) else {
        return real::ioctl(fd, req, arg);
    };
    match req {
        libc::FIONBIO => {
            let r = real::ioctl(fd, req, arg);
            if r == 0 && arg != 0 {
                learn_nonblock(fd, *(arg as *const c_int) != 0);
            }
            r
        }
        libc::FIONREAD | libc::TIOCOUTQ => run(|| {
            if arg == 0 {
                return Err(libc::EFAULT);
            }
            let n = if req == libc::FIONREAD {
                b.readable_bytes(e.id)
            } else {
                b.unsent_bytes(e.id)
            };
            *(arg as *mut c_int) = n.min(c_int::MAX as usize) as c_int;
            Ok(0)
        }),
        _ => {
            real::set_errno(libc::ENOTTY);
            -1
        }
    }
}

mod options;
pub(crate) use options::{getpeername, getsockname, getsockopt, setsockopt, shutdown};
mod process;
