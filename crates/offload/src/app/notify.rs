//! Readiness without tokens: the daemon side of the shim's epoll/poll fast path (record
//! version 4).
//!
//! An application that computes readiness from its own view of the event ring (the shim's
//! interposed `epoll_wait`/`poll`) does not need a token in a socket's placeholder per
//! readiness change; it needs to be woken when it sleeps. So:
//! - **Wake-up channel.** The application hands the daemon the write end of a pipe, or one
//!   end of a unix socket pair (`Attach{Wake}`; `flowstack_sys::wake` says why a pipe, and
//!   why the daemon opens the pipe again as its own); it sleeps in the kernel
//!   (`epoll_wait`/`poll` on its own descriptors plus its end). Before sleeping it counts itself in its header's `APP_SLEEPERS`
//!   (bits 16.. too if it waits for send space), issues a sequentially consistent fence and
//!   checks the event ring once more. After publishing events the daemon (whose publish
//!   fenced after storing `head`) reads `APP_SLEEPERS` and, if a sleeper could want them,
//!   writes one record into its end (`MSG_DONTWAIT`, never blocking on a full or hostile
//!   peer) — once per sleep: only when it turns the header's `APP_WOKEN` from 0 to 1, which
//!   the application clears after it read its end dry (`flowstack_sys::wake::should_signal`;
//!   `FlowstackdAppWakes` counts the writes). One side or the other sees the other's store: no lost wake-up (the ring's
//!   argument; `scripts/loom.sh` models it). When the daemon dies its end closes and every
//!   sleeper wakes at once (hang-up).
//! - **Quiet sockets.** `SetNotify{quiet}` stops token writes for a socket while the
//!   application that asked is its holder; any other holder (a child that took it, a process
//!   without the shim's fast path) gets tokens as before, and turning tokens back on writes
//!   one at once if the socket is readable (as `TokenCleared` does).

use super::{App, GSock, Shared};
use crate::layout::at;
use flowstack_api::SocketError;
use flowstack_sys::wake::DaemonEnd;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

/// An application's wake-up channel.
#[derive(Debug, Default)]
pub(crate) struct Wake {
    end: Option<DaemonEnd>,
    /// Its wake-up id (0: none, a unix socket end): peers fused with this application are
    /// given a write end of the channel and wake it directly when its pipe's flag names
    /// this id (`fuse`, `flowstack_sys::pipe::Wake`).
    pub id: u32,
    /// Wake-ups written (a system call each).
    pub signals: u64,
}

impl Wake {
    /// A write end of the channel for a peer, with this application's id (`None`: no
    /// direct wake-ups for it).
    pub(super) fn for_peer(&self) -> Option<(u32, OwnedFd)> {
        if self.id == 0 {
            return None;
        }
        Some((self.id, self.end.as_ref()?.peer_writer()?))
    }
}

/// Wake-up ids handed out (1..2^31, then round again: two live applications share one only
/// after two billion attachments between them).
static NEXT_WAKE_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// After events were published (the publish fenced after storing `head`): wakes a sleeper
/// that may want them. `loud`: events other than send credit.
pub(super) fn after_publish(app: &mut App, loud: bool) {
    let Some(end) = &app.wake.end else {
        return;
    };
    let (Some(sleepers), Some(woken)) = (
        app.region.atomic_u32(at::APP_SLEEPERS),
        app.region.atomic_u32(at::APP_WOKEN),
    ) else {
        return;
    };
    if flowstack_sys::wake::should_signal(sleepers, woken, loud) && end.signal().unwrap_or(false) {
        app.wake.signals += 1;
    }
}

/// `Attach{Wake}`: the daemon's end of the application's wake-up channel (a pipe's write
/// end, opened again as the daemon's own, or a unix stream socket; anything else is
/// refused, and the application falls back to a socket pair). Answers the application's
/// wake-up id (0 for a socket end).
pub(super) fn attach_wake(app: &mut App, fd: OwnedFd) -> Result<u64, SocketError> {
    let end = DaemonEnd::accept(fd).map_err(|_| SocketError::InvalidArgument)?;
    app.wake.id = match end {
        DaemonEnd::Pipe(_) => {
            let id = NEXT_WAKE_ID.fetch_add(1, Ordering::Relaxed) & (u32::MAX >> 1);
            id.max(1)
        }
        DaemonEnd::Unix(_) => 0,
    };
    app.wake.end = Some(end);
    Ok(app.wake.id as u64) // the application's id, for its pipes' flags
}

/// A deferred placeholder action (`Shared::placeholder_actions`): a token unless quiet,
/// the filler emptied.
pub(super) fn ph_action(g: &mut GSock, readable: bool, writable: bool) {
    let quiet = quiet(g);
    if let Some(ph) = g.ph.as_mut() {
        if readable {
            ph.readable(quiet);
        }
        if writable {
            ph.writable();
        }
    }
}

/// Whether token writes are off for this socket (quiet, and still held by the application
/// that asked).
pub(super) fn quiet(g: &GSock) -> bool {
    match (&g.ph, g.holder) {
        (Some(ph), Some((app, _))) => ph.quiet_for == Some(app),
        _ => false,
    }
}

/// `SetNotify`: quiet (no tokens) or tokens for socket `gid`, asked by application `app`.
pub(super) fn set_notify(sh: &mut Shared, gid: Result<u32, SocketError>, app: u64, on: bool) {
    let Some(g) = gid.ok().and_then(|gid| sh.socks.get_mut(&gid)) else {
        return;
    };
    let gid = gid.expect("found");
    let holder = g.holder.map(|h| h.0) == Some(app);
    let again = super::control::readable_now(&sh.lo, &g.kind);
    let Some(ph) = &mut g.ph else {
        return;
    };
    if on {
        if holder {
            ph.quiet_for = Some(app);
        }
    } else if ph.quiet_for.take().is_some() && again {
        sh.ph_actions.push((gid, true, false));
    }
}

/// Listener `gid` handed a connection to a sync accept — from the POSIX layer, only an
/// accept asked ahead (`Posix::accept_ahead`), which nobody waits for: a token for its
/// placeholder, so a program that polls it or blocks in accept on it is woken (one reading
/// its view in the shim's epoll is woken by its wake-up channel). If a token is already out,
/// `TokenCleared` writes a new one (the application may have taken the old one before this
/// connection reached its view). Native listeners (no placeholder) get nothing.
pub(super) fn handed(sh: &mut Shared, gid: u32) {
    let Some(ph) = sh.socks.get_mut(&gid).and_then(|g| g.ph.as_mut()) else {
        return;
    };
    ph.handed = true;
    sh.ph_actions.push((gid, true, false));
}

/// Application `app` became the holder: tokens again (one now if readable), unless it is
/// the one that asked for quiet (a parent taking back a socket it gave up for a fork).
pub(super) fn on_new_holder(sh: &mut Shared, gid: u32, app: u64) {
    let Some(g) = sh.socks.get_mut(&gid) else {
        return;
    };
    let again = super::control::readable_now(&sh.lo, &g.kind);
    if let Some(ph) = &mut g.ph {
        if ph.quiet_for.is_some_and(|q| q != app) {
            ph.quiet_for = None;
            if again {
                sh.ph_actions.push((gid, true, false));
            }
        }
    }
}
