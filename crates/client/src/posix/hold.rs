//! Which process receives a socket that several share, and the unread bytes a forked child
//! carries.
//!
//! The daemon delivers a socket's bytes, end of stream, errors and send credit to one
//! application, its *holder* (`Command::Hold`; the `offload` crate's `app` module docs).
//! In the kernel, processes that share a socket read one queue; here:
//! - **Adopting does not take.** A forked child, a program after exec, or a receiver of a
//!   passed descriptor adopts its sockets without becoming their holder. It takes one
//!   ([`take`]) when the program first reads it or waits to read it: `recv`, `FIONREAD`, a
//!   `poll`/`select`/`epoll` wait asking for input, a kernel wait that woke on its
//!   placeholder. Sending does not take it (its send credit and errors come to the sender
//!   anyway), so a child that only writes takes nothing from a parent that reads — not
//!   even while nobody holds the socket, when the parent's bytes would then be delivered to
//!   the child.
//! - **Before a fork** ([`before_fork`]) the parent gives up each connection it has no send
//!   credit outstanding on and that nothing waits on in the kernel — no thread of it blocked
//!   on it or in `poll`/`select` on it now, no kernel epoll set (received bytes then wait in
//!   the daemon), and copies the bytes it has not read into a carry the child
//!   inherits; the child's adopt serves them first.
//!   Whichever process reads first then takes the connection. So a server that accepts,
//!   forks a child for the connection and closes its copy (python's `ForkingTCPServer`, the
//!   classic C server) loses nothing that arrived before or after the fork, and a parent
//!   that goes on reading (redis after `BGSAVE`'s fork) takes its connections back at its
//!   next wait — the daemon wakes it for that (an `Unheld` event on its ring, which wakes
//!   a thread sleeping in the shim's epoll or poll fast path).
//!
//! Limits: bytes delivered to a holder stay with it, so two processes reading one
//! connection at the same time each read part of the stream (a race in the kernel too);
//! the bytes unread at a fork are in both processes' views, and are read twice if both read
//! them; datagram sockets are neither given up nor carried; bytes unread at an `exec` are
//! not carried into the new program.

use super::*;
use crate::Client;
use flowstack_api::record::HoldHow;

/// A connection's unread bytes at a fork, for the child.
#[derive(Debug, Default)]
pub(super) struct Carried {
    bytes: Vec<u8>,
    eof: bool,
    error: Option<SocketError>,
}

/// Carried connections by placeholder identity (device, inode of A).
pub(super) type Carries = HashMap<(u64, u64), Carried>;

impl Posix {
    /// The program waits for input on `id` in the kernel (an epoll set the kernel keeps):
    /// takes the socket if another process may hold it (module docs).
    pub fn want_read(&self, id: SockId) -> Result<(), Errno> {
        let mut g = self.lock()?;
        if let Some(c) = g.client.as_mut() {
            take(c, id.0);
        }
        Ok(())
    }

    /// A thread starts (`on`) or ends sleeping in the kernel on these sockets' placeholders.
    pub fn waiting(&self, ids: impl Iterator<Item = SockId>, on: bool) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            if let Some(ps) = g.socks.get_mut(&id.0) {
                ps.waiters = if on {
                    ps.waiters.saturating_add(1)
                } else {
                    ps.waiters.saturating_sub(1)
                };
            }
        }
    }

    /// The socket's placeholder is in an epoll set the kernel keeps.
    pub fn in_kernel_set(&self, id: SockId) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ps) = g.socks.get_mut(&id.0) {
            ps.kernel_set = true;
        }
    }
}

/// The program reads, or waits to read, socket `h`: take it if another process may hold it.
pub(super) fn take(c: &mut Client, h: u32) {
    let Some(s) = c.socks.get_mut(&h) else { return };
    if !s.unheld {
        return;
    }
    s.unheld = false;
    ask(c, h, HoldHow::Take);
}

/// Posts `Hold{how}` for `h` (async: nothing waits for the answer).
fn ask(c: &mut Client, h: u32, how: HoldHow) -> bool {
    c.post(Mode::Async, Command::Hold { handle: h, how })
        .is_ok()
}

/// Before a fork, lock held: gives up the connections this process has no send credit
/// outstanding on and fills the carry with what it has unread of them (module docs).
pub(super) fn before_fork(g: &mut Inner) {
    let Inner {
        client,
        socks,
        carry,
        ..
    } = g;
    carry.clear();
    let Some(c) = client.as_mut() else { return };
    c.pump();
    if c.dead {
        return;
    }
    let mut given = Vec::new();
    for (&h, ps) in socks.iter() {
        // (A connect's state here is updated lazily: the client's view says it opened.)
        // A socket waited on in the kernel (a thread blocked on it, in poll/select, or a
        // kernel epoll set) is kept: such a wait would not wake to take it back.
        if ps.dgram
            || ps.waiters > 0
            || ps.kernel_set
            || !matches!(ps.state, State::Connected | State::Connecting)
        {
            continue;
        }
        let Some(s) = c.socks.get_mut(&h) else {
            continue;
        };
        if !s.open || s.unheld || s.unflushed > 0 {
            continue;
        }
        s.unheld = true;
        if !ask(c, h, HoldHow::Release) {
            return;
        }
        given.push(h);
    }
    if given.is_empty() {
        return;
    }
    // Answered in ring order: once this is, nothing more is delivered here for them, and
    // every byte delivered before is in the view.
    let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
    let _ = sync(c, Command::Carries { remote: any });
    c.pump();
    for h in given {
        // A wait of this process looks at it again (and takes it back if it reads it).
        c.changes.note(h);
        let Some(s) = c.socks.get(&h) else { continue };
        // Bytes in a fused connection's pipe are shared, not carried.
        let n = s.rx.len() + s.held;
        if n == 0 && !s.eof && s.error.is_none() {
            continue;
        }
        let (eof, error) = (s.eof, s.error);
        let mut bytes = vec![0; n];
        let got = c.read_unread(h, &mut bytes, true);
        bytes.truncate(got);
        let Some(ident) = socks
            .get(&h)
            .and_then(|ps| placeholder::identity(ps.a.as_fd()).ok())
        else {
            continue;
        };
        carry.insert(ident, Carried { bytes, eof, error });
    }
}

/// In the child, at the adopt of the socket with placeholder identity `ident` (handle `h`):
/// what the parent had unread comes first. Every adopted socket starts unheld.
pub(super) fn on_adopt(g: &mut Inner, ident: (u64, u64), h: u32) {
    let carried = g.inherited.remove(&ident);
    let Some(s) = g.client.as_mut().and_then(|c| c.socks.get_mut(&h)) else {
        return;
    };
    s.unheld = true;
    if let Some(cv) = carried {
        s.rx.extend(cv.bytes);
        s.eof |= cv.eof;
        s.error = s.error.or(cv.error);
        s.rgen = s.rgen.wrapping_add(1);
    }
}
