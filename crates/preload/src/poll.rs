//! `poll`, `ppoll`, `select`, `pselect` with flowstack placeholders in the set.
//!
//! The kernel answers these (placeholders are real descriptors); the shim only keeps that
//! honest for sockets the epoll fast path made quiet (`crate::epoll`): their tokens are
//! turned back on first, and a socket already readable in this process's view (whose token
//! may not be written yet) makes the call look without waiting and report it. The other way
//! round, a connection the kernel reports readable on a *stale* token (written by the daemon
//! for bytes this process read meanwhile) is checked against the view and left out, its
//! token taken back, and the call sleeps on for what is left of its timeout: a program is
//! never told that a socket is readable when its blocking read would sleep. Sets without
//! placeholders cost a table lookup per descriptor.

use crate::backend::{Backend, FastReady};
use crate::real;
use crate::state::{self, inside, is_inside};
use crate::table::SockId;
use libc::{c_int, nfds_t, pollfd};
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// Per-thread buffers for [`prepare`]: no allocation per call once warm.
#[derive(Default)]
struct Scratch {
    ours: Vec<(usize, SockId)>,
    ids: Vec<SockId>,
    /// Per id: input is asked for.
    reads: Vec<bool>,
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

/// Turns tokens on for the placeholders among `fds` (position, descriptor, input asked
/// for); leaves in `sc.ready` those readable (or in error) in this process's view, as
/// (position, error or hang-up).
fn prepare(fds: impl Iterator<Item = (usize, c_int, bool)>, sc: &mut Scratch) {
    sc.ready.clear();
    sc.ids.clear();
    let Some(st) = state::get() else {
        return;
    };
    if is_inside() {
        return;
    }
    // In a forked child, the inherited sockets get this process's ids first (a child's
    // first call may be this wait).
    state::readopt_if_forked(st);
    let Some(b) = st.connected() else {
        return;
    };
    sc.ours.clear();
    sc.reads.clear();
    for (i, fd, read) in fds {
        if let Some(e) = st.table.get(fd) {
            sc.ours.push((i, e.id));
            sc.reads.push(read);
        }
    }
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
    if b.ready_many(&sc.ids, &sc.reads, false, &mut sc.out)
        .is_err()
    {
        return;
    }
    sc.ready
        .extend(sc.ours.iter().zip(&sc.out).filter_map(|(&(i, _), r)| {
            let r = r.as_ref()?;
            r.r.readable.then_some((i, r.r.hup || r.r.error.is_some()))
        }));
}

/// Runs the kernel wait `f`; while it may sleep, the flowstack sockets `ids` in it count as
/// waited on, so a `fork` meanwhile (another thread) leaves them with this process
/// (`flowstack_client::posix` `hold`).
fn marked<R>(ids: &[SockId], sleeps: bool, f: impl FnOnce() -> R) -> R {
    let b = match sleeps && !ids.is_empty() {
        true => state::get().and_then(|s| s.connected()),
        false => None,
    };
    if let Some(b) = b {
        inside(|| b.waiting(ids, true));
    }
    let r = f();
    if let Some(b) = b {
        inside(|| b.waiting(ids, false));
    }
    r
}

/// Of the placeholders the kernel reported readable (`(position, fd)`), those whose token
/// was stale (`Posix::confirm_readable`: taken back now); their positions.
fn stale(reported: impl Iterator<Item = (usize, c_int)>) -> Vec<usize> {
    let Some(st) = state::get() else {
        return Vec::new();
    };
    if is_inside() {
        return Vec::new();
    }
    let Some(b) = st.connected() else {
        return Vec::new();
    };
    reported
        .filter_map(|(i, fd)| st.table.get(fd).map(|e| (i, e.id)))
        .filter(|&(_, id)| !inside(|| b.confirm_readable(id)))
        .map(|(i, _)| i)
        .collect()
}

/// What is left of a timeout (`None`: none set, wait for ever).
fn left(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

/// A duration as poll(2)'s milliseconds, rounded up (so a loop never spins on a 0).
fn ms_of(d: Option<Duration>) -> c_int {
    match d {
        None => -1,
        Some(d) => d.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int,
    }
}

fn timespec_of(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// Loops the kernel's `call` (told how long it may wait) over the same descriptors until it
/// reports something real or the timeout ends: a placeholder it reports readable on a stale
/// token only (see [`stale`]) is taken out of the answer, and if nothing else was ready the
/// call sleeps again for what is left of the timeout — a program must not be told that a
/// socket is readable when its read would block.
///
/// # Safety
/// `fds` holds `n` entries (the C contract).
unsafe fn poll_with(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: Option<Duration>,
    call: impl Fn(Option<Duration>) -> c_int,
) -> c_int {
    if fds.is_null() || n == 0 || state::get().is_none() {
        return call(timeout);
    }
    // SAFETY: `n` entries at `fds`.
    let set = std::slice::from_raw_parts_mut(fds, n as usize);
    let deadline = timeout.map(|t| Instant::now() + t);
    with_scratch(|sc| loop {
        let input = libc::POLLIN | libc::POLLRDNORM | libc::POLLPRI;
        prepare(
            set.iter()
                .enumerate()
                .map(|(i, p)| (i, p.fd, p.events & input != 0)),
            sc,
        );
        sc.ready.retain(|&(i, _)| set[i].events & libc::POLLIN != 0);
        let sleeps = sc.ready.is_empty();
        let r = marked(&sc.ids, sleeps, || {
            call(if sleeps {
                left(deadline)
            } else {
                Some(Duration::ZERO)
            })
        });
        if r < 0 {
            return r;
        }
        let ready = &sc.ready;
        let dropped = stale(
            set.iter()
                .enumerate()
                .filter(|&(i, p)| {
                    p.revents & libc::POLLIN != 0 && !ready.iter().any(|&(j, _)| j == i)
                })
                .map(|(i, p)| (i, p.fd)),
        );
        for i in dropped {
            set[i].revents &= !libc::POLLIN;
        }
        for &(i, bad) in &sc.ready {
            set[i].revents |= libc::POLLIN | if bad { libc::POLLHUP } else { 0 };
        }
        let k = set.iter().filter(|p| p.revents != 0).count() as c_int;
        if k > 0 || r == 0 || left(deadline).is_some_and(|d| d.is_zero()) {
            return k;
        }
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, ms: c_int) -> c_int {
    let timeout = (ms >= 0).then(|| Duration::from_millis(ms as u64));
    poll_with(fds, n, timeout, |t| real::poll(fds, n, ms_of(t)))
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
    let timeout = if ts.is_null() {
        None
    } else {
        match duration_of((*ts).tv_sec, (*ts).tv_nsec) {
            Ok(d) => Some(d),
            Err(()) => return real::ppoll(fds, n, ts, mask),
        }
    };
    poll_with(fds, n, timeout, |t| match t {
        None => real::ppoll(fds, n, std::ptr::null(), mask),
        Some(d) => real::ppoll(fds, n, &timespec_of(d), mask),
    })
}

/// A timeout as a duration: `Ok(None)` for none (null), `Err` for one the kernel refuses
/// (negative, or nanoseconds out of range: the caller passes it on and gets `EINVAL`).
fn duration_of(sec: libc::time_t, nsec: libc::c_long) -> Result<Duration, ()> {
    if sec < 0 || !(0..1_000_000_000).contains(&nsec) {
        return Err(());
    }
    Ok(Duration::new(sec as u64, nsec as u32))
}

/// # Safety
/// The sets are null or valid `fd_set`s covering `n` descriptors. As [`poll_with`]: a
/// placeholder reported readable on a stale token is taken out and the call repeated (from
/// the sets as passed) for what is left of the timeout.
unsafe fn select_with(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: Option<Duration>,
    call: impl Fn(Option<Duration>) -> c_int,
) -> c_int {
    if n <= 0 || r.is_null() || state::get().is_none() {
        return call(timeout);
    }
    let n = n.min(libc::FD_SETSIZE as c_int);
    // The sets as the program passed them (the kernel's answer overwrites them).
    let r0 = *r;
    let w0 = (!w.is_null()).then(|| *w);
    let e0 = (!e.is_null()).then(|| *e);
    let deadline = timeout.map(|t| Instant::now() + t);
    with_scratch(|sc| loop {
        let listed = (0..n).filter(|&fd| {
            libc::FD_ISSET(fd, &r0)
                || w0.as_ref().is_some_and(|w| libc::FD_ISSET(fd, w))
                || e0.as_ref().is_some_and(|e| libc::FD_ISSET(fd, e))
        });
        prepare(
            listed.map(|fd| (fd as usize, fd, libc::FD_ISSET(fd, &r0))),
            sc,
        );
        sc.ready.retain(|&(fd, _)| libc::FD_ISSET(fd as c_int, &r0));
        let sleeps = sc.ready.is_empty();
        let k = marked(&sc.ids, sleeps, || {
            call(if sleeps {
                left(deadline)
            } else {
                Some(Duration::ZERO)
            })
        });
        if k < 0 {
            return k;
        }
        let ready = &sc.ready;
        let dropped = stale(
            (0..n)
                .filter(|&fd| {
                    libc::FD_ISSET(fd, r) && !ready.iter().any(|&(j, _)| j == fd as usize)
                })
                .map(|fd| (fd as usize, fd)),
        );
        let mut k = k - dropped.len() as c_int;
        for &fd in &dropped {
            libc::FD_CLR(fd as c_int, r);
        }
        for &(fd, _) in &sc.ready {
            let fd = fd as c_int;
            if !libc::FD_ISSET(fd, r) {
                libc::FD_SET(fd, r);
                k += 1;
            }
        }
        if k > 0 || dropped.is_empty() || left(deadline).is_some_and(|d| d.is_zero()) {
            return k;
        }
        *r = r0;
        if let Some(w0) = w0 {
            *w = w0;
        }
        if let Some(e0) = e0 {
            *e = e0;
        }
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
    let timeout = if tv.is_null() {
        None
    } else {
        match duration_of((*tv).tv_sec, (*tv).tv_usec.saturating_mul(1000)) {
            Ok(d) => Some(d),
            Err(()) => return real::select(n, r, w, e, tv),
        }
    };
    let start = Instant::now();
    let k = select_with(n, r, w, e, timeout, |t| match t {
        None => real::select(n, r, w, e, std::ptr::null_mut()),
        Some(d) => {
            let mut v = libc::timeval {
                tv_sec: d.as_secs() as libc::time_t,
                tv_usec: d.subsec_micros() as libc::suseconds_t,
            };
            real::select(n, r, w, e, &mut v)
        }
    });
    if let Some(t) = timeout {
        // Linux's select leaves the time not slept in the timeout (select(2), NOTES).
        let rest = t.saturating_sub(start.elapsed());
        (*tv).tv_sec = rest.as_secs() as libc::time_t;
        (*tv).tv_usec = rest.subsec_micros() as libc::suseconds_t;
    }
    k
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
    let timeout = if ts.is_null() {
        None
    } else {
        match duration_of((*ts).tv_sec, (*ts).tv_nsec) {
            Ok(d) => Some(d),
            Err(()) => return real::pselect(n, r, w, e, ts, mask),
        }
    };
    select_with(n, r, w, e, timeout, |t| match t {
        None => real::pselect(n, r, w, e, std::ptr::null(), mask),
        Some(d) => real::pselect(n, r, w, e, &timespec_of(d), mask),
    })
}

#[cfg(test)]
pub(crate) mod tests;
