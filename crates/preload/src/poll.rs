//! `poll`, `ppoll`, `select`, `pselect` with flowstack placeholders in the set.
//!
//! The kernel answers these (placeholders are real descriptors); the shim only keeps that
//! honest for sockets the epoll fast path made quiet (`crate::epoll`): their tokens are
//! turned back on first, and a socket already readable in this process's view (whose token
//! may not be written yet) makes the call look without waiting and report it. Sets without
//! placeholders cost a table lookup per descriptor.

use crate::backend::Backend;
use crate::real;
use crate::state::{self, inside, is_inside};
use crate::table::SockId;
use libc::{c_int, nfds_t, pollfd};

/// Turns tokens on for the placeholders among `fds`; returns those readable (or in error)
/// in this process's view, as (position in `fds`, error or hang-up).
fn prepare(fds: &[(usize, c_int)]) -> Vec<(usize, bool)> {
    let Some(st) = state::get() else {
        return Vec::new();
    };
    if is_inside() {
        return Vec::new();
    }
    let Some(b) = st.connected() else {
        return Vec::new();
    };
    let ours: Vec<(usize, SockId)> = fds
        .iter()
        .filter_map(|&(i, fd)| st.table.get(fd).map(|e| (i, e.id)))
        .collect();
    if ours.is_empty() {
        return Vec::new();
    }
    inside(|| view(b, &ours))
}

fn view(b: &dyn Backend, ours: &[(usize, SockId)]) -> Vec<(usize, bool)> {
    let ids: Vec<SockId> = ours.iter().map(|x| x.1).collect();
    for &id in &ids {
        b.tokens_on(id);
    }
    let mut out = Vec::new();
    if b.ready_many(&ids, &mut out).is_err() {
        return Vec::new();
    }
    ours.iter()
        .zip(out)
        .filter_map(|(&(i, _), r)| {
            let r = r?;
            r.r.readable.then_some((i, r.r.hup || r.r.error.is_some()))
        })
        .collect()
}

/// # Safety
/// `fds` holds `n` entries (the C contract).
unsafe fn poll_with(
    fds: *mut pollfd,
    n: nfds_t,
    call: impl Fn(bool) -> c_int, // true: without waiting
) -> c_int {
    if fds.is_null() || n == 0 || state::get().is_none() {
        return call(false);
    }
    // SAFETY: `n` entries at `fds`.
    let set = std::slice::from_raw_parts_mut(fds, n as usize);
    let list: Vec<(usize, c_int)> = set.iter().enumerate().map(|(i, p)| (i, p.fd)).collect();
    let ready: Vec<(usize, bool)> = prepare(&list)
        .into_iter()
        .filter(|&(i, _)| set[i].events & libc::POLLIN != 0)
        .collect();
    if ready.is_empty() {
        return call(false);
    }
    let r = call(true);
    if r < 0 {
        return r;
    }
    for (i, bad) in ready {
        set[i].revents |= libc::POLLIN | if bad { libc::POLLHUP } else { 0 };
    }
    set.iter().filter(|p| p.revents != 0).count() as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, ms: c_int) -> c_int {
    poll_with(fds, n, |now| real::poll(fds, n, if now { 0 } else { ms }))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __poll_chk(fds: *mut pollfd, n: nfds_t, ms: c_int, _len: usize) -> c_int {
    poll(fds, n, ms)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll_with(fds, n, |now| {
        real::ppoll(fds, n, if now { &zero } else { ts }, mask)
    })
}

/// # Safety
/// The sets are null or valid `fd_set`s covering `n` descriptors.
unsafe fn select_with(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    call: impl Fn(bool) -> c_int,
) -> c_int {
    if n <= 0 || r.is_null() || state::get().is_none() {
        return call(false);
    }
    let n = n.min(libc::FD_SETSIZE as c_int);
    let list: Vec<(usize, c_int)> = (0..n)
        .filter(|&fd| {
            libc::FD_ISSET(fd, r)
                || (!w.is_null() && libc::FD_ISSET(fd, w))
                || (!e.is_null() && libc::FD_ISSET(fd, e))
        })
        .map(|fd| (fd as usize, fd))
        .collect();
    let ready: Vec<c_int> = prepare(&list)
        .into_iter()
        .map(|(fd, _)| fd as c_int)
        .filter(|&fd| libc::FD_ISSET(fd, r))
        .collect();
    if ready.is_empty() {
        return call(false);
    }
    let r0 = *r;
    let k = call(true);
    if k < 0 {
        return k;
    }
    let mut k = k;
    for fd in ready {
        if libc::FD_ISSET(fd, &r0) && !libc::FD_ISSET(fd, r) {
            libc::FD_SET(fd, r);
            k += 1;
        }
    }
    k
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    let mut zero = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let zp: *mut libc::timeval = &mut zero;
    select_with(n, r, w, e, |now| {
        real::select(n, r, w, e, if now { zp } else { tv })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    select_with(n, r, w, e, |now| {
        real::pselect(n, r, w, e, if now { &zero } else { ts }, mask)
    })
}
