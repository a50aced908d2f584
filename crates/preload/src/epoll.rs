//! `epoll` over shared memory: flowstack connections in an epoll set are watched from this
//! process's own view of the event ring, not through their placeholders.
//!
//! - **Interest lists.** `epoll_ctl(ADD)` of a flowstack *connection* (connected, connecting
//!   or failed) keeps the interest here (events, data, one-shot state) and turns the
//!   socket's tokens off (`Backend::watch`); the kernel's epoll set gets, once, this
//!   process's wake-up descriptor instead. Anything else — kernel descriptors, listeners and
//!   fresh flowstack sockets (their placeholders keep tokens) — goes to the kernel's
//!   `epoll_ctl` as before. A flowstack *listener* (level-triggered) is also watched from
//!   the view ([`Listen`]): its accepts are asked ahead, and a connection handed to this
//!   process is reported from the view — woken by the wake-up descriptor, so among several
//!   processes sharing the listener the one it was handed to wakes, whoever takes the
//!   placeholder's token (reported once per call if both say so).
//! - **`epoll_wait`** on a set with such interests drains the event ring once and reports
//!   the ready connections (level- or edge-triggered: an edge is a new event on the socket
//!   since the last report, as the kernel's wake-ups; `EPOLLONESHOT` disables the interest
//!   until `MOD`; `EPOLLERR`/`EPOLLHUP` always), then the kernel's ready descriptors without
//!   waiting. Only the connections that changed since the last look, or were reported
//!   ready then, are looked at ([`crate::interest`]: O(ready), not O(watched)).
//! - **`EPOLLEXCLUSIVE`** on a flowstack socket follows epoll_ctl(2): `ADD` only, with
//!   `EPOLLIN`/`EPOLLOUT`/`EPOLLERR`/`EPOLLHUP`/`EPOLLWAKEUP`/`EPOLLET` only (`EINVAL`
//!   otherwise, and for a `MOD` of such an interest). A listener's goes to the kernel's set
//!   with the flag (its placeholder's token wakes one set); the connections accepted ahead
//!   wake only the process they were handed to. With nothing ready it sleeps in the kernel's `epoll_pwait` on the set (kernel
//!   descriptors plus the wake-up descriptor) after announcing the sleep (no lost wake-up:
//!   `flowstack_client::posix` fast module), never holding a lock meanwhile; signals
//!   interrupt it (`EINTR`) as they do the kernel's. Sets without such interests cost one
//!   atomic load (and a map lookup once any exists) before the C library's call.
//! - **Lifetimes.** Closing a socket's last descriptor in this process removes it from every
//!   set (the kernel drops an epoll registration with the file's last reference); a `dup`'s
//!   interest stays under the number it was added with, as in the kernel. `dup` of an epoll
//!   descriptor shares the set; closing the last number forgets it.
//! - **Fallback.** A set used after `fork` by the child (its handles are the parent's) moves
//!   its interests to the kernel's set (the placeholders, tokens on), and so does a nested
//!   set (an epoll descriptor added to another set through the kernel, before or after its
//!   flowstack interests: the outer set could not see them); a dead daemon makes every
//!   interest report error and hang-up.

use crate::backend::{Backend, Errno};
use crate::interest::{Interest, Interests, EPOLLET, EPOLLONESHOT};
use crate::real;
use crate::state::{self, inside, outside};
use crate::table::SockId;
use flowstack_api::ids::IdMap;
use libc::{c_int, epoll_event};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The data word of the wake-up descriptor's registration in the kernel's set.
const WAKE_TAG: u64 = 0x666c_6f77_7374_6b57;
/// The high half of the data word of a placeholder registered for `EPOLLOUT` (the low half
/// is its descriptor).
const OUT_TAG: u64 = 0x666c_6f78 << 32;

/// `create`'s answer for a nested set (no errno of `epoll_ctl`).
const NESTED: Errno = -1;

const EPOLLEXCLUSIVE: u32 = 1 << 28;
/// What may come with `EPOLLEXCLUSIVE` (Linux `fs/eventpoll.c`, `EPOLLEXCLUSIVE_OK_BITS`).
const EXCLUSIVE_OK: u32 = (libc::EPOLLIN
    | libc::EPOLLOUT
    | libc::EPOLLERR
    | libc::EPOLLHUP
    | libc::EPOLLWAKEUP
    | libc::EPOLLET) as u32
    | EPOLLEXCLUSIVE;

/// epoll_ctl(2): `EPOLLEXCLUSIVE` only with `EPOLL_CTL_ADD`, and only with the events of
/// [`EXCLUSIVE_OK`] (no `EPOLLONESHOT`, no `EPOLLRDHUP`): `EINVAL` otherwise, checked before
/// the set is looked at, as the kernel does (a `MOD` of an interest added with it is refused
/// where the interest is found).
fn exclusive_ok(op: c_int, events: u32) -> bool {
    events & EPOLLEXCLUSIVE == 0
        || op == libc::EPOLL_CTL_ADD && events & !EXCLUSIVE_OK == 0
        || op == libc::EPOLL_CTL_DEL
}

/// A flowstack listener in the kernel's set whose view is watched here too (level-triggered
/// interests only): a connection accepted ahead (`Backend::accept_ahead`) is reported from
/// the view, woken by the wake-up descriptor, while the placeholder's token (connections the
/// daemon still holds, the kernel listener's) is reported by the kernel.
#[derive(Debug, Clone, Copy)]
struct Listen {
    fd: c_int,
    id: SockId,
    events: u32,
    data: u64,
}

#[derive(Debug, Default)]
pub struct Ep {
    pid: u32,
    fast: Interests,
    lst: Vec<Listen>,
    /// The wake-up descriptor registered in the kernel's set.
    wake: Option<c_int>,
    /// The daemon is gone: nothing to sleep for.
    gone: bool,
    /// Listeners taken out of the kernel's set when the daemon went, to be given their
    /// kernel listener ([`retire_listeners`]); those left out for good.
    retiring: Vec<Listen>,
    silenced: Vec<Listen>,
}

type Shared = Arc<Mutex<Ep>>;

/// Epoll descriptors with state here; `ACTIVE` is their count (0: nothing to look up).
static SETS: Mutex<Option<IdMap<c_int, Shared>>> = Mutex::new(None);
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

fn sets() -> MutexGuard<'static, Option<IdMap<c_int, Shared>>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock(ep: &Shared) -> MutexGuard<'_, Ep> {
    ep.lock().unwrap_or_else(|p| p.into_inner())
}

fn find(epfd: c_int) -> Option<Shared> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    sets().as_ref()?.get(&epfd).cloned()
}

/// This process's id, cached (the C library's `getpid` is a system call); reset by the
/// shim's `fork` in the child.
static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: getpid has no preconditions.
            let p = unsafe { libc::getpid() as u32 };
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// In the child of `fork`: sets made before belong to the parent (see `to_kernel`).
pub fn after_fork() {
    PID.store(0, Ordering::Relaxed);
}

/// `epoll_ctl` for a flowstack placeholder `fd` (the caller checked it is one).
///
/// # Safety
/// `ev` is null or points to an `epoll_event` (the C contract).
pub unsafe fn ctl(
    b: &dyn Backend,
    epfd: c_int,
    op: c_int,
    fd: c_int,
    id: SockId,
    listening: bool,
    ev: *mut epoll_event,
) -> Result<c_int, Errno> {
    let kernel = || {
        let r = real::epoll_ctl(epfd, op, fd, ev);
        if r < 0 {
            Err(real::errno())
        } else {
            Ok(r)
        }
    };
    // SAFETY: `ev` is null or valid (the caller's contract).
    if !ev.is_null() && !exclusive_ok(op, unsafe { (*ev).events }) {
        return Err(libc::EINVAL);
    }
    let ep = find(epfd);
    if let Some(ep) = &ep {
        let mut g = lock(ep);
        if g.pid != pid() {
            drop(g);
            to_kernel(epfd, ep);
            return kernel();
        }
        if let Some(i) = g.silenced.iter().position(|x| x.fd == fd) {
            match op {
                libc::EPOLL_CTL_MOD => return Ok(0),
                libc::EPOLL_CTL_DEL => {
                    g.silenced.swap_remove(i);
                    return Ok(0);
                }
                _ => {
                    g.silenced.swap_remove(i);
                }
            }
        }
        if let Some(i) = g.lst.iter().position(|x| x.fd == fd) {
            let r = kernel()?;
            match op {
                libc::EPOLL_CTL_DEL => {
                    g.lst.swap_remove(i);
                }
                libc::EPOLL_CTL_MOD if !ev.is_null() => {
                    let e = *ev;
                    if e.events & (EPOLLET | EPOLLONESHOT) != 0 {
                        g.lst.swap_remove(i);
                    } else {
                        g.lst[i].events = e.events;
                        g.lst[i].data = e.u64;
                    }
                }
                _ => {}
            }
            return Ok(r);
        }
        if let Some(old) = g.fast.get(fd).map(|x| x.events) {
            return match op {
                libc::EPOLL_CTL_ADD => Err(libc::EEXIST),
                libc::EPOLL_CTL_DEL => {
                    if g.fast.remove(fd).is_some_and(|x| x.out_armed) {
                        real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut());
                    }
                    Ok(0)
                }
                libc::EPOLL_CTL_MOD => {
                    if ev.is_null() {
                        return Err(libc::EFAULT);
                    }
                    let e = *ev;
                    if e.events & EPOLLEXCLUSIVE != 0 || old & EPOLLEXCLUSIVE != 0 {
                        return Err(libc::EINVAL);
                    }
                    g.fast.modify(fd, e);
                    Ok(0)
                }
                _ => Err(libc::EINVAL),
            };
        }
    }
    if op != libc::EPOLL_CTL_ADD || ev.is_null() || epfd == fd {
        return kernel();
    }
    if ep.as_ref().is_some_and(|ep| lock(ep).gone) {
        return kernel();
    }
    if !b.watch(id)? {
        let r = kernel()?;
        b.in_kernel_set(id);
        let e = *ev;
        if listening && e.events & (EPOLLET | EPOLLONESHOT) == 0 {
            watch_listener(b, epfd, ep, fd, id, e);
        }
        return Ok(r);
    }
    let ep = match ep {
        Some(ep) => ep,
        None => match create(b, epfd) {
            Err(NESTED) => {
                b.tokens_on(id);
                b.in_kernel_set(id);
                if (*ev).events & libc::EPOLLIN as u32 != 0 {
                    b.want_read(id);
                }
                b.pin(id); // the kernel's set keeps the registration on A's description
                return kernel();
            }
            r => r?,
        },
    };
    let e = *ev;
    lock(&ep).fast.add(Interest::new(fd, id, e));
    Ok(0)
}

/// Listener `fd` was added to the kernel's set `epfd`: its view is watched here too and its
/// accepts are asked ahead (see [`Listen`]); not for a nested set.
fn watch_listener(
    b: &dyn Backend,
    epfd: c_int,
    ep: Option<Shared>,
    fd: c_int,
    id: SockId,
    e: epoll_event,
) {
    let ep = match ep {
        Some(ep) => ep,
        None => match create(b, epfd) {
            Ok(ep) => ep,
            Err(_) => return,
        },
    };
    lock(&ep).lst.push(Listen {
        fd,
        id,
        events: e.events,
        data: e.u64,
    });
    b.accept_ahead(id);
}

/// Descriptors added to some kernel epoll set (one bit each): such an epoll descriptor is
/// nested, and its flowstack interests stay in the kernel's set (see the module docs).
static IN_SET: [AtomicU64; crate::table::MAX_FDS / 64] =
    [const { AtomicU64::new(0) }; crate::table::MAX_FDS / 64];

fn bit(fd: c_int) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok()?;
    Some((IN_SET.get(i / 64)?, 1u64 << (i % 64)))
}

/// `epoll_ctl(ADD)` of a kernel descriptor (or an epoll descriptor) to the kernel's set.
fn note_added(fd: c_int) {
    if let Some((w, b)) = bit(fd) {
        w.fetch_or(b, Ordering::Relaxed);
    }
    if let Some(inner) = find(fd) {
        // An epoll set with interests here goes inside another: back to the kernel.
        to_kernel(fd, &inner);
    }
}

fn nested(epfd: c_int) -> bool {
    bit(epfd).is_some_and(|(w, b)| w.load(Ordering::Relaxed) & b != 0)
}

/// State for `epfd`, with the wake-up descriptor in the kernel's set (which also checks
/// that `epfd` is an epoll descriptor).
fn create(b: &dyn Backend, epfd: c_int) -> Result<Shared, Errno> {
    if nested(epfd) {
        return Err(NESTED);
    }
    let ep: Shared = Arc::new(Mutex::new(Ep {
        pid: pid(),
        ..Ep::default()
    }));
    register_wake(b, epfd, &mut lock(&ep))?;
    let mut s = sets();
    let m = s.get_or_insert_with(IdMap::default);
    if m.insert(epfd, ep.clone()).is_none() {
        ACTIVE.fetch_add(1, Ordering::AcqRel);
    }
    Ok(ep)
}

fn register_wake(b: &dyn Backend, epfd: c_int, g: &mut Ep) -> Result<(), Errno> {
    let w = b.wake_fd()?;
    if g.wake == Some(w) {
        return Ok(());
    }
    let mut ev = epoll_event {
        events: libc::EPOLLIN as u32,
        u64: WAKE_TAG,
    };
    // SAFETY: a valid epoll_event on the stack.
    let r = unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, w, &mut ev) };
    if r < 0 && real::errno() != libc::EEXIST {
        return Err(real::errno());
    }
    g.wake = Some(w);
    Ok(())
}

/// The set is used by another process (after `fork`): its interests go to the kernel's set
/// as placeholders with tokens; the state is dropped here.
fn to_kernel(epfd: c_int, ep: &Shared) {
    let fast = lock(ep).fast.take_all();
    lock(ep).lst.clear(); // already in the kernel's set
    forget_set(epfd);
    let st = state::get();
    if let Some(st) = st {
        state::readopt_if_forked(st);
    }
    for x in fast {
        if let (Some(st), true) = (st, st.is_some_and(|s| s.table.get(x.fd).is_some())) {
            if let (Some(b), Some(e)) = (st.connected(), st.table.get(x.fd)) {
                inside(|| {
                    b.tokens_on(e.id);
                    b.in_kernel_set(e.id);
                    if x.events & libc::EPOLLIN as u32 != 0 {
                        b.want_read(e.id);
                    }
                });
            }
        }
        let mut ev = epoll_event {
            events: x.events & !EPOLLEXCLUSIVE,
            u64: x.data,
        };
        let op = if x.out_armed {
            libc::EPOLL_CTL_MOD
        } else {
            libc::EPOLL_CTL_ADD
        };
        // SAFETY: a valid epoll_event on the stack.
        unsafe { real::epoll_ctl(epfd, op, x.fd, &mut ev) };
    }
}

fn forget_set(epfd: c_int) {
    let mut s = sets();
    if let Some(m) = s.as_mut() {
        if m.remove(&epfd).is_some() {
            ACTIVE.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// `close(fd)`: forgets `fd` as an epoll descriptor (its other numbers keep the set).
pub fn on_close(fd: c_int) {
    if let Some((w, b)) = bit(fd) {
        if w.load(Ordering::Relaxed) & b != 0 {
            w.fetch_and(!b, Ordering::Relaxed);
        }
    }
    if ACTIVE.load(Ordering::Acquire) != 0 {
        forget_set(fd);
    }
}

/// `dup` of an epoll descriptor: the new number names the same set.
pub fn on_dup(old: c_int, new: c_int) {
    on_close(new);
    if let Some(ep) = find(old) {
        let mut s = sets();
        if s.get_or_insert_with(IdMap::default)
            .insert(new, ep)
            .is_none()
        {
            ACTIVE.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The last descriptor of socket `id` in this process was closed: out of every set.
pub fn forget_sock(id: SockId) {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let all: Vec<Shared> = sets()
        .as_ref()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    for ep in all {
        let mut g = lock(&ep);
        g.fast.remove_sock(id);
        g.lst.retain(|x| x.id != id);
        g.retiring.retain(|x| x.id != id);
        g.silenced.retain(|x| x.id != id);
    }
}

/// Whether `epoll_wait` on `epfd` takes the fast path.
pub fn takes(epfd: c_int) -> Option<Shared> {
    find(epfd)
}

/// Fills `out` with the ready interests, then the ready listeners; returns (count, pump
/// count, some interest waits for send space).
fn scan(
    b: &dyn Backend,
    epfd: c_int,
    g: &mut Ep,
    out: &mut [epoll_event],
) -> Result<(usize, u64, bool), Errno> {
    let Ep { fast, lst, .. } = g;
    let sc = fast.scan(b, lst.iter().map(|x| x.id), out, |x| {
        arm_out(epfd, x);
        if x.out_armed {
            b.pin(x.id); // in the kernel's set now: A is never reused
        }
    })?;
    // Listeners: every time (few), from the answers after the interests'.
    let mut n = sc.n;
    for (x, r) in lst.iter().zip(fast.extra_ready()) {
        let Some(f) = r else { continue };
        let mut ev = 0u32;
        if x.events & libc::EPOLLIN as u32 != 0 && f.r.readable {
            ev |= libc::EPOLLIN as u32;
        }
        if f.r.error.is_some() {
            ev |= libc::EPOLLERR as u32;
        }
        if ev != 0 && n < out.len() {
            out[n] = epoll_event {
                events: ev,
                u64: x.data,
            };
            n += 1;
        }
    }
    Ok((n, sc.gen, sc.want_w))
}

/// The daemon is gone: the wake-up descriptor leaves the kernel's set, and so do the
/// placeholders of the level-triggered listeners (their hang-up would otherwise be reported
/// for as long as the set lives); [`retire_listeners`] then finishes their move.
fn set_gone(epfd: c_int, g: &mut Ep) {
    g.gone = true;
    if let Some(w) = g.wake.take() {
        // SAFETY: removes a descriptor from a set; no memory is passed.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, w, std::ptr::null_mut()) };
    }
    for x in std::mem::take(&mut g.lst) {
        // SAFETY: as above.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, x.fd, std::ptr::null_mut()) };
        g.retiring.push(x);
    }
}

/// After [`set_gone`], with the set unlocked: each listener taken out gets its kernel
/// listener (the shim's, of the same port) under the program's number
/// (`ops::retire_gone_listener`), registered with the program's events and data, so the loop
/// is woken when a kernel client connects and its accept takes the kernel path. A listener
/// without one is left out: it can never accept again.
///
/// Why not leave this to the program's next accept (which retires the listener too): the
/// registration names the placeholder's open file description, which lives on in every
/// process that shares the listener (nginx's master and other workers), so replacing the
/// number in one process does not end it, and the loop would spin on reports of a hung-up
/// placeholder answered by `EAGAIN`s. `EPOLL_CTL_MOD`/`DEL` of a listener left out succeed;
/// an `EPOLL_CTL_ADD` of its number goes to the kernel again.
fn retire_listeners(epfd: c_int, ep: &Shared) {
    let list = std::mem::take(&mut lock(ep).retiring);
    for x in list {
        if crate::ops::retire_gone_listener(x.fd, x.id) {
            let mut ev = epoll_event {
                events: x.events,
                u64: x.data,
            };
            // SAFETY: a valid epoll_event on the stack.
            if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, x.fd, &mut ev) } == 0 {
                continue;
            }
        }
        lock(ep).silenced.push(x);
    }
}

/// Puts the placeholder of `x` in the kernel's set for `EPOLLOUT` (edge-triggered).
fn arm_out(epfd: c_int, x: &mut Interest) {
    let mut ev = epoll_event {
        events: (libc::EPOLLOUT | libc::EPOLLET) as u32,
        u64: OUT_TAG | x.fd as u32 as u64,
    };
    // SAFETY: a valid epoll_event on the stack.
    let r = unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, x.fd, &mut ev) };
    x.out_armed = r == 0;
}

/// Drops from `rest[..k]` (the kernel's answer) the listeners `done` (the view's) already
/// reported; returns the new count.
fn dedupe(lst: &[Listen], done: &[epoll_event], rest: &mut [epoll_event], k: usize) -> usize {
    if lst.is_empty() {
        return k;
    }
    let seen = |d: u64| lst.iter().any(|x| x.data == d) && done.iter().any(|e| e.u64 == d);
    let mut j = 0;
    for i in 0..k {
        if !seen(rest[i].u64) {
            rest[j] = rest[i];
            j += 1;
        }
    }
    j
}

/// Removes the shim's own entries (the wake-up descriptor, placeholders writable again)
/// from `evs[..n]`; returns the new count and whether the wake-up descriptor was among
/// them. Placeholders writable again are unblocked.
fn strip(b: &dyn Backend, ep: &Shared, evs: &mut [epoll_event], n: usize) -> (usize, bool) {
    let mut k = 0;
    let mut woke = false;
    let mut writable: Vec<c_int> = Vec::new();
    for i in 0..n {
        let d = evs[i].u64;
        if d == WAKE_TAG {
            woke = true;
            continue;
        }
        if d & !0xffff_ffff == OUT_TAG {
            writable.push(d as u32 as c_int);
            continue;
        }
        evs[k] = evs[i];
        k += 1;
    }
    if !writable.is_empty() {
        let ids: Vec<SockId> = {
            let g = lock(ep);
            writable
                .iter()
                .filter_map(|&fd| g.fast.get(fd).map(|x| x.id))
                .collect()
        };
        inside(|| ids.iter().for_each(|&id| b.unblock(id)));
    }
    (k, woke)
}

/// `epoll_pwait` with the fast path (`ms` < 0: forever).
///
/// # Safety
/// `events` holds `max` entries and `sigmask` is null or valid (the C contract).
pub unsafe fn wait(
    b: &dyn Backend,
    epfd: c_int,
    ep: &Shared,
    events: *mut epoll_event,
    max: c_int,
    ms: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    if max <= 0 || events.is_null() {
        return real::epoll_pwait(epfd, events, max, ms, sigmask);
    }
    if lock(ep).pid != pid() {
        to_kernel(epfd, ep);
        return real::epoll_pwait(epfd, events, max, ms, sigmask);
    }
    // SAFETY: the caller's array of `max` events.
    let evs = std::slice::from_raw_parts_mut(events, max as usize);
    let deadline = (ms > 0).then(|| Instant::now() + Duration::from_millis(ms as u64));
    loop {
        let r = inside(|| {
            let mut g = lock(ep);
            let (n, gen, want_w) = scan(b, epfd, &mut g, evs)?;
            let sleep = if n == 0 && ms != 0 && !g.gone {
                let t = register_wake(b, epfd, &mut g).and_then(|()| b.sleep_begin(gen, want_w));
                t.unwrap_or_else(|_| {
                    // The daemon is gone (or the wake-up channel could not be made): wait in the
                    // kernel from now on; the interests report error and hang-up.
                    set_gone(epfd, &mut g);
                    None
                })
            } else {
                None
            };
            // Listeners to move to the kernel only right after `set_gone` (not a lock per pass).
            Ok::<_, Errno>((n, sleep, !g.retiring.is_empty()))
        });
        if matches!(r, Ok((_, _, true))) {
            retire_listeners(epfd, ep);
        }
        let (n, ticket) = match r {
            Ok((n, t, _)) => (n, t),
            Err(e) => {
                real::set_errno(e);
                return -1;
            }
        };
        if n > 0 || ticket.is_none() && (ms == 0 || lock(ep).gone) {
            // Kernel descriptors too, without waiting.
            let rest = &mut evs[n..];
            let k = if rest.is_empty() {
                // The kernel's set is not looked at: the wake-up descriptor neither.
                inside(|| b.drain_awake());
                0
            } else {
                real::epoll_pwait(epfd, rest.as_mut_ptr(), rest.len() as c_int, 0, sigmask)
            };
            let k = if k > 0 {
                let (k, woke) = strip(b, ep, rest, k as usize);
                if woke {
                    // No sleep drains it: peers' news would wait for one (`drain_awake`).
                    inside(|| b.drain_awake());
                }
                k
            } else {
                0
            };
            let (done, rest) = evs.split_at_mut(n);
            let k = dedupe(&lock(ep).lst, done, rest, k);
            if n + k > 0 || ms == 0 || !lock(ep).gone {
                return (n + k) as c_int;
            }
            // The daemon is gone and nothing is ready: an ordinary kernel wait.
            return real::epoll_pwait(epfd, events, max, ms, sigmask);
        }
        let Some(t) = ticket else {
            continue; // something arrived meanwhile: look again
        };
        let left = match deadline {
            None => -1,
            Some(d) => {
                let l = d.saturating_duration_since(Instant::now());
                l.as_millis().min(i32::MAX as u128) as c_int
            }
        };
        // Peers may hold write ends of the wake-up channel: it does not hang up when the
        // daemon dies, so the next pass (which checks the daemon) comes within a bound.
        let bound = flowstack_client::LIVENESS_CHECK.as_millis() as c_int;
        let left = if t.bounded() && (left < 0 || left > bound) {
            bound
        } else {
            left
        };
        crate::sig::clear_last();
        let k = outside(|| real::epoll_pwait(epfd, events, max, left, sigmask));
        let err = real::errno();
        let pair_ready = k > 0 && evs[..k as usize].iter().any(|e| e.u64 == WAKE_TAG);
        let gone = inside(|| b.sleep_end(t, pair_ready));
        if gone {
            set_gone(epfd, &mut lock(ep));
            retire_listeners(epfd, ep);
        }
        if k < 0 {
            real::set_errno(err);
            return -1;
        }
        let (k, _) = strip(b, ep, evs, k as usize);
        if k > 0 {
            return k as c_int;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
    }
}

// ---- the C entry points ----------------------------------------------------------------------

fn guarded(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        real::set_errno(libc::EIO);
        -1
    })
}

/// The fast path's backend, if `epfd` has state here and this thread is not inside the shim.
fn fast_set(epfd: c_int) -> Option<(&'static dyn Backend, Shared)> {
    let ep = takes(epfd)?;
    if state::is_inside() {
        return None;
    }
    Some((state::get()?.connected()?, ep))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    match crate::shim::placeholder(fd) {
        None => {
            let r = real::epoll_ctl(epfd, op, fd, ev);
            if r == 0 && op == libc::EPOLL_CTL_ADD {
                note_added(fd);
            }
            r
        }
        Some((_, b, e)) => crate::shim::run(|| ctl(b, epfd, op, fd, e.id, e.listening, ev)),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut epoll_event,
    n: c_int,
    ms: c_int,
) -> c_int {
    epoll_pwait(epfd, ev, n, ms, std::ptr::null())
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    n: c_int,
    ms: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    match fast_set(epfd) {
        None => real::epoll_pwait(epfd, ev, n, ms, mask),
        Some((b, ep)) => guarded(|| wait(b, epfd, &ep, ev, n, ms, mask)),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    ev: *mut epoll_event,
    n: c_int,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    match fast_set(epfd) {
        None => real::epoll_pwait2(epfd, ev, n, ts, mask),
        Some((b, ep)) => {
            let ms = if ts.is_null() {
                -1
            } else {
                let t = *ts;
                if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                    real::set_errno(libc::EINVAL);
                    return -1;
                }
                // Rounded up to the millisecond (a sub-millisecond timeout still waits).
                let ms = t.tv_sec as i128 * 1000 + (t.tv_nsec as i128 + 999_999) / 1_000_000;
                ms.min(i32::MAX as i128) as c_int
            };
            guarded(|| wait(b, epfd, &ep, ev, n, ms, mask))
        }
    }
}
