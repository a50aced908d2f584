//! `poll`, `ppoll`, `select`, `pselect` with flowstack placeholders in the set.
//!
//! The kernel answers these (placeholders are real descriptors); the shim only keeps that
//! honest for sockets the epoll fast path made quiet (`crate::epoll`): their tokens are
//! turned back on first, and a socket already readable in this process's view (whose token
//! may not be written yet) makes the call look without waiting and report it. Sets without
//! placeholders cost a table lookup per descriptor.

use crate::backend::{Backend, FastReady};
use crate::real;
use crate::state::{self, inside, is_inside};
use crate::table::SockId;
use libc::{c_int, nfds_t, pollfd};
use std::cell::RefCell;

/// Per-thread buffers for [`prepare`]: no allocation per call once warm.
#[derive(Default)]
struct Scratch {
    ours: Vec<(usize, SockId)>,
    ids: Vec<SockId>,
    out: Vec<Option<FastReady>>,
    /// [`prepare`]'s answer.
    ready: Vec<(usize, bool)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's buffers, or fresh ones if they are in use (a signal
/// handler's `poll` inside the interrupted `poll`) or gone (the thread is exiting).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut f = Some(f);
    let mine = SCRATCH.try_with(|s| {
        let mut g = s.try_borrow_mut().ok()?;
        f.take().map(|f| f(&mut g))
    });
    match (mine, f) {
        (Ok(Some(r)), _) => r,
        (_, Some(f)) => f(&mut Scratch::default()),
        (_, None) => unreachable!("ran with the thread's buffers"),
    }
}

/// Turns tokens on for the placeholders among `fds` (position, descriptor); leaves in
/// `sc.ready` those readable (or in error) in this process's view, as (position, error or
/// hang-up).
fn prepare(fds: impl Iterator<Item = (usize, c_int)>, sc: &mut Scratch) {
    sc.ready.clear();
    let Some(st) = state::get() else {
        return;
    };
    if is_inside() {
        return;
    }
    let Some(b) = st.connected() else {
        return;
    };
    sc.ours.clear();
    sc.ours
        .extend(fds.filter_map(|(i, fd)| st.table.get(fd).map(|e| (i, e.id))));
    if sc.ours.is_empty() {
        return;
    }
    inside(|| view(b, sc))
}

fn view(b: &dyn Backend, sc: &mut Scratch) {
    sc.ids.clear();
    sc.ids.extend(sc.ours.iter().map(|x| x.1));
    for &id in &sc.ids {
        b.tokens_on(id);
    }
    if b.ready_many(&sc.ids, &mut sc.out).is_err() {
        return;
    }
    sc.ready
        .extend(sc.ours.iter().zip(&sc.out).filter_map(|(&(i, _), r)| {
            let r = r.as_ref()?;
            r.r.readable.then_some((i, r.r.hup || r.r.error.is_some()))
        }));
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
    with_scratch(|sc| {
        prepare(set.iter().enumerate().map(|(i, p)| (i, p.fd)), sc);
        sc.ready.retain(|&(i, _)| set[i].events & libc::POLLIN != 0);
        if sc.ready.is_empty() {
            return call(false);
        }
        let r = call(true);
        if r < 0 {
            return r;
        }
        for &(i, bad) in &sc.ready {
            set[i].revents |= libc::POLLIN | if bad { libc::POLLHUP } else { 0 };
        }
        set.iter().filter(|p| p.revents != 0).count() as c_int
    })
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
    with_scratch(|sc| {
        let listed = (0..n).filter(|&fd| {
            libc::FD_ISSET(fd, r)
                || (!w.is_null() && libc::FD_ISSET(fd, w))
                || (!e.is_null() && libc::FD_ISSET(fd, e))
        });
        prepare(listed.map(|fd| (fd as usize, fd)), sc);
        sc.ready.retain(|&(fd, _)| libc::FD_ISSET(fd as c_int, r));
        if sc.ready.is_empty() {
            return call(false);
        }
        let r0 = *r;
        let k = call(true);
        if k < 0 {
            return k;
        }
        let mut k = k;
        for &(fd, _) in &sc.ready {
            let fd = fd as c_int;
            if libc::FD_ISSET(fd, &r0) && !libc::FD_ISSET(fd, r) {
                libc::FD_SET(fd, r);
                k += 1;
            }
        }
        k
    })
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
