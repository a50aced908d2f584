//! The application's signal handlers, wrapped by the shim.
//!
//! Two things the kernel knows per signal and the shim must too:
//!
//! - **Which signal interrupted a blocking call**, so that the call restarts exactly when that
//!   signal's handler was installed with `SA_RESTART` (signal(7)), as the kernel decides per
//!   signal. The wrapper notes the signal in a thread-local before running the handler.
//! - **Never in the middle of the shim's own work.** A handler that runs while this thread is
//!   inside the daemon API (holding the process's client lock, half-way through a ring
//!   operation) and that calls a socket function would deadlock or, with interposition off
//!   for the thread, reach the kernel with a placeholder. Asynchronous signals that arrive
//!   meanwhile are deferred: noted, and raised again at this thread (`tgkill`) the moment it
//!   leaves the shim, when the kernel delivers them with their mask and flags as usual.
//!
//! Not wrapped (installed as the application asked): synchronous signals (SIGSEGV, SIGBUS,
//! SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT — their handlers need the faulting context, and
//! deferring a fault would re-execute it), one-shot handlers (`SA_RESETHAND`: the kernel has
//! already reset the disposition when a deferred signal would be raised again), SIG_DFL and
//! SIG_IGN. Limits: a deferred signal is delivered again with `si_code` SI_TKILL and this
//! process as its sender (the original `siginfo` is not kept), and a queued real-time
//! signal's value is lost if it arrives while the thread is inside the shim.
#![allow(unsafe_code)]

use crate::real;
use libc::{c_int, c_void};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const NSIG: usize = 65;

/// The application's handler per signal (0: not wrapped).
static USER: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
/// Signals whose handler takes `(sig, info, context)` (`SA_SIGINFO`).
static WANTS_INFO: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last signal whose wrapped handler ran (or was deferred) on this thread.
    static LAST: Cell<c_int> = const { Cell::new(0) };
    /// Signals deferred while this thread was inside the shim.
    static DEFERRED: Cell<u64> = const { Cell::new(0) };
}

fn bit(sig: c_int) -> u64 {
    1u64 << (sig as u32 & 63)
}

/// Whether the shim may wrap `sig`'s handler (see the module docs).
fn wrappable(sig: c_int, flags: c_int) -> bool {
    (1..NSIG as c_int).contains(&sig)
        && flags & libc::SA_RESETHAND == 0
        && !matches!(
            sig,
            libc::SIGSEGV
                | libc::SIGBUS
                | libc::SIGILL
                | libc::SIGFPE
                | libc::SIGTRAP
                | libc::SIGSYS
                | libc::SIGABRT
        )
}

extern "C" fn trampoline(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // Only async-signal-safe work here: const-initialised thread-locals and atomics.
    let Some(slot) = USER.get(sig as usize) else {
        return;
    };
    let h = slot.load(Ordering::Acquire);
    if h == 0 {
        return;
    }
    LAST.with(|l| l.set(sig));
    if crate::state::is_inside() {
        DEFERRED.with(|d| d.set(d.get() | bit(sig)));
        return;
    }
    if WANTS_INFO.load(Ordering::Relaxed) & bit(sig) != 0 {
        // SAFETY: `h` was installed by the application as an SA_SIGINFO handler for `sig`.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: `h` was installed by the application as a plain handler for `sig`.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// Raises again, at this thread, the signals deferred while it was inside the shim. Called
/// whenever the thread leaves the shim (or enters one of its sleeps).
pub fn flush_deferred() {
    let mut pending = DEFERRED.with(|d| d.replace(0));
    while pending != 0 {
        let sig = pending.trailing_zeros() as c_int;
        pending &= pending - 1;
        // SAFETY: tgkill on this process's own thread with a signal number in range.
        unsafe {
            real::sys(
                libc::SYS_tgkill,
                [
                    libc::getpid() as usize,
                    libc::gettid() as usize,
                    sig as usize,
                    0,
                    0,
                    0,
                ],
            );
        }
    }
}

/// Clears this thread's note of the last signal (before a sleep).
pub fn clear_last() {
    LAST.with(|l| l.set(0));
}

/// Whether a blocking call interrupted by a signal restarts: by the handler of the signal the
/// wrapper saw last on this thread, else by the process-wide rule of
/// [`crate::state::signals::restart`] (a handler the shim did not wrap).
pub fn restart_after_eintr() -> bool {
    match LAST.with(|l| l.get()) {
        0 => crate::state::signals::restart(),
        sig => crate::state::signals::restarts(sig),
    }
}

/// `sigaction(2)` with the handler wrapped; `old` shows the application's own handler.
///
/// # Safety
/// As `sigaction`: `act` and `old` are null or valid.
pub unsafe fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let idx = sig as usize;
    let (prev_h, prev_info) = match USER.get(idx) {
        Some(s) => (
            s.load(Ordering::Acquire),
            WANTS_INFO.load(Ordering::Relaxed) & bit(sig) != 0,
        ),
        None => (0, false),
    };
    let mut kact: Option<libc::sigaction> = None;
    if sig == libc::SIGPIPE && !act.is_null() && (*act).sa_sigaction != libc::SIG_IGN {
        // Before the kernel has it: a peer wake-up must mask SIGPIPE again from now on.
        flowstack_sys::wake::set_sigpipe_ignored(false);
    }
    if !act.is_null() {
        let a = *act;
        let h = a.sa_sigaction;
        let handler = h != libc::SIG_DFL && h != libc::SIG_IGN;
        if handler && wrappable(sig, a.sa_flags) {
            let mut k = a;
            k.sa_sigaction = trampoline as *const () as usize;
            k.sa_flags |= libc::SA_SIGINFO;
            // The handler is in place before the kernel can call the trampoline for it.
            if a.sa_flags & libc::SA_SIGINFO != 0 {
                WANTS_INFO.fetch_or(bit(sig), Ordering::Relaxed);
            } else {
                WANTS_INFO.fetch_and(!bit(sig), Ordering::Relaxed);
            }
            USER[idx].store(h, Ordering::Release);
            kact = Some(k);
        } else {
            kact = Some(a);
        }
    }
    let r = match &kact {
        Some(k) => real::sigaction(sig, k, old),
        None => real::sigaction(sig, std::ptr::null(), old),
    };
    if r != 0 {
        if let Some(s) = USER.get(idx) {
            s.store(prev_h, Ordering::Release);
        }
        return r;
    }
    if !old.is_null() && (*old).sa_sigaction == trampoline as *const () as usize {
        (*old).sa_sigaction = prev_h;
        if !prev_info {
            (*old).sa_flags &= !libc::SA_SIGINFO;
        }
    }
    // `kact` is set exactly when `act` is not null.
    if let Some(k) = &kact {
        if k.sa_sigaction != trampoline as *const () as usize {
            if let Some(s) = USER.get(idx) {
                s.store(0, Ordering::Release);
            }
        }
        let a = *act;
        let h = a.sa_sigaction;
        if sig == libc::SIGPIPE && h == libc::SIG_IGN {
            flowstack_sys::wake::set_sigpipe_ignored(true);
        }
        crate::state::signals::learn(
            sig,
            h != libc::SIG_DFL && h != libc::SIG_IGN,
            a.sa_flags & libc::SA_RESTART != 0,
        );
    }
    r
}

/// Tells the peer wake-ups whether SIGPIPE is ignored now (at load: an ignored signal stays
/// ignored across exec), see [`flowstack_sys::wake::set_sigpipe_ignored`].
pub fn learn_sigpipe() {
    // SAFETY: sigaction with a null new action only reads the disposition into `old`.
    let ignored = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        real::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    };
    flowstack_sys::wake::set_sigpipe_ignored(ignored);
}

/// `signal(3)` with glibc's (BSD) semantics — `SA_RESTART`, the signal blocked in its own
/// handler — through the wrapping [`sigaction`]; returns the previous handler.
///
/// # Safety
/// As `signal`.
pub unsafe fn signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    let mut a: libc::sigaction = std::mem::zeroed();
    a.sa_sigaction = h;
    a.sa_flags = libc::SA_RESTART;
    libc::sigemptyset(&mut a.sa_mask);
    libc::sigaddset(&mut a.sa_mask, sig);
    let mut old: libc::sigaction = std::mem::zeroed();
    if sigaction(sig, &a, &mut old) != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn on_pipe(_: c_int) {}

    #[test]
    fn peer_wake_ups_know_whether_sigpipe_is_ignored() {
        // The test harness runs with SIGPIPE ignored (Rust's runtime sets it).
        learn_sigpipe();
        assert!(flowstack_sys::wake::sigpipe_ignored());
        // SAFETY: installs a handler that does nothing, then SIG_IGN again, through the
        // wrapper; both are valid dispositions for SIGPIPE.
        unsafe {
            assert_ne!(
                signal(libc::SIGPIPE, on_pipe as *const () as libc::sighandler_t),
                libc::SIG_ERR
            );
            assert!(
                !flowstack_sys::wake::sigpipe_ignored(),
                "a handler: masked writes"
            );
            assert_ne!(signal(libc::SIGPIPE, libc::SIG_IGN), libc::SIG_ERR);
        }
        assert!(flowstack_sys::wake::sigpipe_ignored());
        learn_sigpipe();
        assert!(flowstack_sys::wake::sigpipe_ignored());
    }
}
