//! Readiness from this process's own view, for the shim's `epoll_wait`/`poll` fast path.
//!
//! - [`Posix::watch`] makes a socket *quiet* (the daemon stops writing tokens into its
//!   placeholder, `Command::SetNotify`) when its readiness can be computed here: connections
//!   (connected, connecting or failed). Listeners and fresh sockets keep their tokens (the
//!   caller watches their placeholder in the kernel). [`Posix::tokens_on`] undoes it before a
//!   sleep on the placeholder itself (a blocking call, a `poll` the shim hands to the kernel).
//! - [`Posix::ready_many`] drains the event ring once and answers for many sockets under one
//!   lock, with per-socket event counts for edge-triggered waits.
//! - Sleeping: the caller sleeps in the kernel on its own descriptors plus this process's end
//!   of its *wake-up channel* ([`Posix::wake_fd`], a pipe; the daemon holds the write end,
//!   handed over with `Attach{Wake}`). [`Posix::sleep_begin`] counts the caller in the header's
//!   `APP_SLEEPERS`, fences (SeqCst) and checks once more that nothing arrived since the view
//!   it computed — the ring's `head`, and [`Client`]'s pump count for events another thread
//!   took meanwhile; the daemon stores `head`, fences, reads `APP_SLEEPERS` and writes a
//!   byte into its end: one side sees the other (no lost wake-up). [`Posix::sleep_end`]
//!   uncounts the caller; the last sleeper out drains the channel, so every thread asleep on
//!   it (level-triggered) wakes for the same byte, and then clears the header's `APP_WOKEN`
//!   (the daemon writes once per sleep, while that word is 0: `wake::should_signal`). When the daemon dies its end closes: every
//!   sleeper wakes at once and finds the client dead (sockets report error and hang-up).
//!
//! The lock is never held while the caller sleeps.

use super::{placeholder, Errno, Inner, Posix, Readiness, SockId, State, Tokens};
use crate::Client;
use flowstack_api::record::{AttachOp, Command, Mode};
use flowstack_api::region::at;
use flowstack_sys::ownfd::Own;
use flowstack_sys::wake;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, Ordering};

/// One socket's readiness and event counts (edge-triggered waits compare them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FastReady {
    /// Readable, writable, hang-up, error.
    pub r: Readiness,
    /// Peer closed its side (`EPOLLRDHUP`).
    pub rdhup: bool,
    /// Events that may have made it readable, counted.
    pub rgen: u32,
    /// Events that may have made it writable, counted.
    pub wgen: u32,
    /// A send found no room: unwritable until the daemon empties the placeholder (watch it
    /// for `EPOLLOUT` in the kernel, then [`Posix::unblock`]) or returns credit.
    pub blocked: bool,
}

/// What [`Posix::sleep_begin`] announced (hand it back to [`Posix::sleep_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SleepTicket(u32, bool);

impl SleepTicket {
    /// The sleep must end within [`LIVENESS_CHECK`](crate::LIVENESS_CHECK) (and the caller
    /// look again, which checks the daemon): peers hold write ends of the wake-up channel,
    /// so it does not hang up when the daemon dies.
    pub fn bounded(&self) -> bool {
        self.1
    }
}

fn sleepers(c: &Client) -> Option<&std::sync::atomic::AtomicU32> {
    c.region.atomic_u32(at::APP_SLEEPERS)
}

impl Posix {
    /// Makes `id` quiet if its readiness can be computed here; `Ok(false)`: watch its
    /// placeholder in the kernel instead (listener, fresh socket).
    ///
    /// Does not wait for the socket's `Attach` answer (an accept's or a `socket()`'s, see
    /// [`Posix::socket`]): the `SetNotify` follows it in the ring, and a refusal is the
    /// error of the socket's next call (a round trip per connection less).
    pub fn watch(&self, id: SockId) -> Result<bool, Errno> {
        let mut g = self.lock()?;
        let ps = g.sock_as_is(id)?;
        if !matches!(
            ps.state,
            State::Connected | State::Connecting | State::Failed
        ) {
            ps.in_kernel = true;
            ps.shared = true;
            return Ok(false);
        }
        if ps.quiet {
            return Ok(true);
        }
        ps.quiet = true;
        let c = g.client.as_mut().expect("registered");
        c.post(
            Mode::Async,
            Command::SetNotify {
                handle: id.0,
                quiet: true,
            },
        )
        .map_err(Errno::from)?;
        Ok(true)
    }

    /// From now on, each connection [`Posix::accept`] returns on listener `id` is followed by
    /// an accept asked ahead (`Client::accept`'s accept-ahead): the daemon hands the next
    /// connection to this process as it comes, and the program's next `accept` takes it
    /// from the view with no round trip (nginx's worker spent a quarter of its CPU waiting
    /// for that answer). For a caller whose readiness of the listener comes from the view
    /// ([`Posix::ready_many`] answers for listeners: the shim's epoll), which wakes on the
    /// wake-up channel when the answer lands; the daemon also writes a token into the
    /// placeholder for such an answer (`offload::app::notify::handed`), so a later `poll`
    /// or blocking accept on A sees it. Not asked for a listener used by several processes
    /// through `poll`: one could take the token of a connection handed to the other.
    /// A connection asked ahead and never taken is closed with the listener (or when this
    /// process exits), where the kernel would leave it in the backlog for another process.
    pub fn accept_ahead(&self, id: SockId) -> Result<(), Errno> {
        let mut g = self.lock()?;
        let ps = g.sock_as_is(id)?;
        if ps.state == State::Listening {
            ps.ahead_ok = true;
        }
        Ok(())
    }

    /// Tokens again for `id` (before a sleep on its placeholder), and the filler a
    /// non-blocking connect left out (see [`Posix::connect`]); no-op if neither.
    pub fn tokens_on(&self, id: SockId) -> Result<(), Errno> {
        let mut g = self.lock()?;
        if let Some(c) = g.client.as_mut() {
            c.pipe_via_daemon(id.0);
        }
        let ps = g.sock_as_is(id)?;
        ps.in_kernel = true;
        if ps.fill_later {
            fill_now(&mut g, id)?;
        }
        let ps = g.sock_as_is(id)?;
        if std::mem::take(&mut ps.placed) {
            // Bytes may have reached this accepted connection (its event published, no
            // token: the daemon had not taken its `Place` yet) after this process last
            // looked: as if a token were handed back, the daemon writes one if it is
            // readable (ring order puts this after the `Place`). Stale at worst, which
            // every kernel wait's caller checks (`Posix::confirm_readable`).
            token_cleared(g.client.as_mut().expect("registered"), id)?;
        }
        let ps = g.sock_as_is(id)?;
        if !ps.quiet {
            return Ok(());
        }
        ps.quiet = false;
        let c = g.client.as_mut().expect("registered");
        c.post(
            Mode::Async,
            Command::SetNotify {
                handle: id.0,
                quiet: false,
            },
        )
        .map(|_| ())
        .map_err(Errno::from)
    }

    /// Drains the event ring once and writes each socket's readiness into `out` (`None`:
    /// unknown here — closed, or a fresh socket; a listener is readable when a connection
    /// accepted ahead waits in the view). Returns the pump count to hand to
    /// [`Posix::sleep_begin`]. `reads`, one per id: the caller waits for input on it — a
    /// socket another process may hold is taken (`hold`). `woken`: the caller sleeps on the
    /// wake-up channel (an empty pipe then asks its writer for this process directly).
    pub fn ready_many(
        &self,
        ids: impl Iterator<Item = SockId>,
        reads: &[bool],
        woken: bool,
        out: &mut Vec<Option<FastReady>>,
    ) -> Result<u64, Errno> {
        let mut g = self.lock()?;
        let g = &mut *g;
        let c = g.client.as_mut().expect("registered");
        super::ready::pump_checked(c);
        out.clear();
        for (i, id) in ids.enumerate() {
            if reads.get(i) == Some(&true) {
                super::hold::take(c, id.0);
            }
            // Its readiness is computed here and the caller sleeps on the wake-up channel:
            // an empty pipe asks its writer for this process directly (`fused`).
            let who = c.wake_id();
            let r = match (g.socks.get(&id.0), c.socks.get_mut(&id.0)) {
                (Some(ps), Some(s)) => {
                    if woken {
                        s.pipe_who = who;
                    }
                    super::ready::one(ps, s, c.dead)
                }
                _ => None,
            };
            out.push(r);
        }
        Ok(c.gen)
    }

    /// The kernel reported `id`'s placeholder readable (`select`/`poll` on it): whether this
    /// process's view agrees, after draining the event ring. For a connection the view is the
    /// truth — the daemon writes a token only after publishing the events that explain it —
    /// so a connection unreadable here holds a *stale* token: one the daemon wrote, at a
    /// `TokenCleared`, for bytes this process read meanwhile (their `TcpConsume` was still in
    /// the ring). Reporting it would make a program's blocking read after `select` sleep
    /// until the next data — forever on a control connection nobody writes to (iperf3 -R's
    /// stall). So the token is taken back (the daemon writes a new one at once if the socket
    /// became readable since) and `Ok(false)` says: do not report it. Datagram sockets are
    /// judged the same way; listeners and fresh stream sockets are not (their readiness is
    /// partly the kernel's): `Ok(true)`.
    pub fn confirm_readable(&self, id: SockId) -> Result<bool, Errno> {
        let mut g = self.lock()?;
        let g = &mut *g;
        let c = g.client.as_mut().expect("registered");
        c.pump();
        if c.dead {
            return Ok(true); // hang-up and error: reported as readable
        }
        let (Some(ps), Some(s)) = (g.socks.get(&id.0), c.socks.get(&id.0)) else {
            return Ok(true);
        };
        let judged = ps.dgram
            || matches!(
                ps.state,
                State::Connected | State::Connecting | State::Failed
            );
        if !judged || conn_readable(ps, s) {
            return Ok(true);
        }
        // A kernel wait for input woke on it (a token written while it was this process's,
        // since taken by another, `hold`): this process wants it back.
        super::hold::take(c, id.0);
        clear_tokens(g, id)?;
        Ok(false)
    }

    /// The placeholder of `id` was seen writable again (the daemon emptied it): writable in
    /// the view too (an edge).
    pub fn unblock(&self, id: SockId) -> Result<(), Errno> {
        let mut g = self.lock()?;
        let c = g.client.as_mut().expect("registered");
        if let Some(s) = c.socks.get_mut(&id.0) {
            if s.blocked {
                s.blocked = false;
                s.wgen = s.wgen.wrapping_add(1);
                c.changes.note(id.0);
            }
        }
        Ok(())
    }

    /// This process's end of its wake-up channel, created and handed to the daemon when the
    /// process registers (`make_wake`).
    pub fn wake_fd(&self) -> Result<RawFd, Errno> {
        let mut g = self.lock()?;
        make_wake(&mut g)
    }

    /// Announces that the caller is about to sleep (waiting for send space too if
    /// `writable`); `None` if something arrived since the view of pump count `gen` (compute
    /// again instead of sleeping); `ECONNRESET` once the daemon is gone. See the module docs.
    pub fn sleep_begin(&self, gen: u64, writable: bool) -> Result<Option<SleepTicket>, Errno> {
        let g = self.lock()?;
        let c = g.client.as_ref().expect("registered");
        if c.dead {
            return Err(Errno::ECONNRESET); // nothing will wake a sleeper
        }
        let t = SleepTicket(1 | if writable { 1 << 16 } else { 0 }, c.sleep_bounded());
        let Some(a) = sleepers(c) else {
            return Ok(None);
        };
        a.fetch_add(t.0, Ordering::SeqCst);
        // Pairs with the daemon's fence between its store of `head` and its load of
        // APP_SLEEPERS (`offload::app::notify`).
        fence(Ordering::SeqCst);
        if c.evt.pending() || c.gen != gen || c.dead {
            a.fetch_sub(t.0, Ordering::SeqCst);
            return Ok(None);
        }
        Ok(Some(t))
    }

    /// The wake-up descriptor was seen readable by a wait that did not sleep (its scan found
    /// sockets ready, or the caller's array was full). A sleeper, if any, drains it when it
    /// wakes; with none, it is drained here: a loop that never sleeps (redis-benchmark's
    /// end, writable sockets reported on every pass while one connection waits for its
    /// reply) would otherwise never hear of the sockets that peers named there, as the
    /// scan looks only at sockets that changed. A socket named moves the pump count, so a
    /// sleep begun on an older view (another thread's, under this lock) looks again.
    pub fn drain_awake(&self) {
        let Ok(mut g) = self.lock() else {
            return;
        };
        let g: &mut Inner = &mut g;
        let Some(c) = g.client.as_mut() else {
            return;
        };
        // Only peers' records need it (the daemon's say the event ring has news, which
        // the scan pumps anyway).
        if !c.sleep_bounded() || sleepers(c).is_some_and(|a| a.load(Ordering::SeqCst) & 0xffff != 0)
        {
            return;
        }
        let Some(w) = &g.wake else {
            return;
        };
        if drain_channel(c, w.as_fd()) {
            c.gen += 1;
        }
    }

    /// The caller woke (or gave up sleeping): uncounts it; the last sleeper drains the
    /// wake-up channel if its wait saw it readable (`pair_ready`; a byte written after
    /// its wait returned is drained by the next sleeper, which it wakes at once: one
    /// spurious wake-up at worst, and no `recv` answering `EAGAIN` per sleep). A hung-up
    /// pair means the daemon is gone. Returns true if the daemon is gone.
    pub fn sleep_end(&self, t: SleepTicket, pair_ready: bool) -> bool {
        let Ok(mut g) = self.lock() else {
            return true;
        };
        let g: &mut Inner = &mut g;
        let Some(c) = g.client.as_mut() else {
            return true;
        };
        let Some(a) = sleepers(c) else {
            return c.dead;
        };
        let before = a.fetch_sub(t.0, Ordering::SeqCst);
        if before & 0xffff == 1 && pair_ready {
            if let Some(w) = &g.wake {
                drain_channel(c, w.as_fd());
            }
        }
        c.dead
    }
}

/// Reads the wake-up channel `w` dry: peers' records mark their sockets changed
/// ([`Client::peer_news`]); its hang-up means the daemon is gone. Whether a peer named any.
fn drain_channel(c: &mut crate::Client, w: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut named = false;
    let r = wake::drain_records(w, |h| {
        named = true;
        c.peer_news(h)
    });
    // After the read, never before (`wake::drained`): the daemon may write again.
    if let Some(woken) = c.region.atomic_u32(at::APP_WOKEN) {
        wake::drained(woken);
    }
    if let Ok(wake::Drained::Closed) = r {
        c.dead = true;
    }
    named
}

/// This process's end of its wake-up channel, made and handed to the daemon if it does not
/// exist yet: a pipe (`flowstack_sys::wake`), or a unix socket pair if the daemon refuses the
/// pipe (it cannot open it again without `/proc`). Made when the process registers, not at
/// its first sleep in epoll: the daemon gives a fused connection's writer a write end of its
/// reader's channel when it fuses them, and a process that had none then would be woken
/// through the daemon for the connection's life.
pub(super) fn make_wake(g: &mut Inner) -> Result<RawFd, Errno> {
    if let Some(w) = &g.wake {
        return Ok(w.as_raw_fd());
    }
    let c = g.client.as_mut().expect("registered");
    let (mine, theirs) = wake::pipe().map_err(|_| Errno(24))?;
    let mine = match super::attach_fds(c, 0, AttachOp::Wake, &[theirs.as_fd()]) {
        Ok(id) => {
            // The daemon's answer is this process's wake-up id (peers fused with it wake it
            // directly, `fused`).
            g.client.as_mut().expect("registered").set_wake_id(id);
            mine
        }
        Err(Errno::EINVAL) => {
            let (mine, theirs) = wake::socket_pair().map_err(|_| Errno(24))?;
            super::attach_fds(c, 0, AttachOp::Wake, &[theirs.as_fd()])?;
            mine
        }
        Err(e) => return Err(e),
    };
    let mine: Own<OwnedFd> = Own::lift(mine);
    let fd = mine.raw();
    g.wake = Some(mine);
    Ok(fd)
}

/// Writes the filler a non-blocking connect left out, unless the connect already ended in
/// this process's view (then A is rightly writable).
pub(super) fn fill_now(g: &mut Inner, id: SockId) -> Result<(), Errno> {
    let ps = g.sock_as_is(id)?;
    if !std::mem::take(&mut ps.fill_later) || ps.state != State::Connecting {
        return Ok(());
    }
    let c = g.client.as_mut().expect("registered");
    c.pump();
    let ended = c
        .socks
        .get(&id.0)
        .is_none_or(|s| s.open || s.error.is_some() || s.eof);
    if ended || c.dead {
        return Ok(());
    }
    super::make_unwritable(g, id)
}

/// A connection's readability in this process's view (data, end of stream, an error, or
/// shut for reading: a read would not block); a datagram socket's: a datagram or an error.
pub(super) fn conn_readable(ps: &super::PSock, s: &crate::Sock) -> bool {
    if ps.dgram {
        return !s.dgrams.is_empty() || s.error.is_some();
    }
    s.unread() > 0 || s.eof || s.error.is_some() || ps.shut_rd
}

/// Tells the daemon `id`'s tokens are taken (`TokenCleared`): it writes one at once if the
/// socket is readable.
fn token_cleared(c: &mut Client, id: SockId) -> Result<(), Errno> {
    c.post(
        Mode::Async,
        Command::TokenCleared {
            handle: id.0,
            seen: 0,
        },
    )
    .map(|_| ())
    .map_err(Errno::from)
}

/// The socket's view here is unreadable: read the tokens back and tell the daemon.
pub(super) fn clear_tokens(g: &mut Inner, id: SockId) -> Result<(), Errno> {
    let ps = g.sock(id)?;
    if ps.quiet {
        return Ok(()); // no tokens to take (stale ones cost a spurious wake-up at most)
    }
    let taken = placeholder::take_tokens(ps.a.as_fd());
    match taken {
        Ok(Tokens::Read(0)) => Ok(()), // none outstanding: nothing to tell
        Ok(Tokens::Read(_)) => token_cleared(g.client.as_mut().expect("registered"), id),
        Ok(Tokens::Closed) => {
            g.client.as_mut().expect("registered").dead = true;
            Err(Errno::ECONNRESET)
        }
        Err(_) => Err(Errno::EBADF),
    }
}
