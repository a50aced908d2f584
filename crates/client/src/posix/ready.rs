//! One socket's readiness from this process's view, and which sockets may have changed
//! since a reader last looked (`crate::changes`): the shim's `epoll_wait` asks
//! [`Posix::changed`] and then [`Posix::ready_many`] for those (and for the ones it reported
//! ready last time), not for every socket it watches.

use super::{Errno, Inner, PSock, Posix, Readiness, SockId, State};
use crate::{Client, Sock};
use flowstack_api::region::SOCK_SNDBUF;

pub use crate::changes::Cursor;

/// A call of the POSIX layer on `id`: it may change what the socket is ready for.
pub(super) fn noted(g: &mut Inner, id: SockId) {
    if let Some(c) = g.client.as_mut() {
        c.changes.note(id.0);
    }
}

/// Drains the event ring, and checks now and then that the daemon lives (a busy loop never
/// sleeps on the wake-up channel, whose hang-up tells of a dead daemon).
pub(super) fn pump_checked(c: &mut Client) {
    c.pump();
    if !c.dead && c.last_liveness.elapsed() >= crate::LIVENESS_CHECK {
        c.last_liveness = std::time::Instant::now();
        c.check_daemon();
    }
}

/// The readiness of a socket (`None`: not computable here — a fresh socket).
pub(super) fn one(ps: &PSock, s: &Sock, dead: bool) -> Option<super::FastReady> {
    if dead {
        return Some(super::FastReady {
            r: Readiness {
                readable: true,
                writable: true,
                hup: true,
                error: Some(Errno::ECONNRESET),
            },
            rdhup: true,
            rgen: s.rgen.wrapping_add(1),
            wgen: s.wgen.wrapping_add(1),
            blocked: false,
        });
    }
    let r = match ps.state {
        // A connection accepted ahead, or the error of an accept asked ahead.
        State::Listening => Readiness {
            readable: !s.accepted.is_empty() || s.accept_err.is_some(),
            ..Readiness::default()
        },
        State::Connected | State::Connecting | State::Failed => Readiness {
            readable: super::fast::conn_readable(ps, s),
            writable: s
                .pipe_writable()
                .unwrap_or(s.open && !s.blocked && s.unflushed < SOCK_SNDBUF)
                || s.error.is_some(),
            hup: s.error.is_some() || ps.state == State::Failed,
            error: s.error.map(Errno::from),
        },
        _ => return None,
    };
    Some(super::FastReady {
        r,
        rdhup: s.eof || ps.shut_rd,
        rgen: s.rgen,
        wgen: s.wgen,
        blocked: s.blocked,
    })
}

impl Posix {
    /// Drains the event ring once and calls `f` with each socket that may have changed since
    /// `cur` (repeats possible), moving `cur` on. Returns whether that is known —
    /// false for a new cursor, one left more than `changes::CAP` notes behind, or a dead
    /// daemon (every socket reports error and hang-up): then look at every socket — and the
    /// pump count to hand to [`Posix::sleep_begin`].
    pub fn changed(
        &self,
        cur: &mut Cursor,
        mut f: impl FnMut(SockId),
    ) -> Result<(bool, u64), Errno> {
        let mut g = self.lock()?;
        let c = g.client.as_mut().expect("registered");
        pump_checked(c);
        let known = c.changes.since(cur, |h| f(SockId(h))) && !c.dead;
        Ok((known, c.gen))
    }
}
