//! Which sockets a turn looks at: the marks.
//!
//! A turn (`service`) used to look at every socket, so its cost grew with the connections an
//! engine holds, busy or not (wrk's 20 keep-alive connections: a quarter of the daemon's
//! time went to looking at connections with nothing new). Now it looks at the sockets
//! marked since the last turn ([`Shared::mark`]), and a socket is marked by whatever can
//! give it something to do:
//!
//! - **its engine connection was dispatched** — a segment arrived (bytes, an ACK that frees
//!   send space, a FIN, a RST), a timer fired, or a call changed it
//!   ([`Engine::tcp_take_changed`](flowstack_stack::Engine::tcp_take_changed), read after
//!   every poll: [`Shared::collect_changes`]);
//! - **a command names it** (or creates it): sends, consumed bytes, tokens taken back,
//!   attaches, shutdowns, closes ([`named`], in `App::execute`);
//! - **its application freed receive-area room** it was waiting for (`App::area_wait`), or
//!   came back under its memory limit (`memory::account`);
//! - **it is new** (`Shared::insert`), **closing** with bytes still queued, **a listener**
//!   or **a UDP socket** — these few stay marked for every turn (their news comes from places
//!   that do not mark: accept queues of several engines, reuseport hand-overs, datagrams).
//!
//! A mark that is missing would leave a socket's news waiting, so the loop does not rely on
//! the list alone: every [`SWEEP_EVERY`](super::SWEEP_EVERY)th turn, and the last turn before
//! the engine spins and sleeps, look at every socket (a *sweep*), and a socket a sweep finds
//! with work that no mark named is counted (`FlowstackdServiceUnmarked`) — so a missed mark
//! costs latency, never a hang, and shows in `flowstack stats`.

use super::*;

/// The handle a command names, if any (creating commands name theirs once executed, see
/// `App::execute`).
pub(super) fn named(cmd: &Command) -> Option<u32> {
    use Command::*;
    match *cmd {
        TcpAccept { listener } => Some(listener),
        TcpSend { handle, .. }
        | TcpConsume { handle, .. }
        | TcpShutdown { handle }
        | TcpClose { handle }
        | TcpAbort { handle }
        | TcpSetNodelay { handle, .. }
        | TcpSendFile { handle, .. }
        | FileRelease { handle }
        | UdpSendTo { handle, .. }
        | UdpClose { handle }
        | Attach { handle, .. }
        | Bind { handle, .. }
        | Listen { handle, .. }
        | Connect { handle, .. }
        | TokenCleared { handle, .. }
        | WantWritable { handle }
        | SetNotify { handle, .. }
        | Forget { handle, .. }
        | GetAddr { handle, .. }
        | TcpInfo { handle, .. }
        | Hold { handle, .. }
        | Pipe { handle, .. } => Some(handle),
        TcpListen { .. }
        | TcpConnect { .. }
        | UdpBind { .. }
        | Carries { .. }
        | UdpCarries { .. }
        | Report { .. } => None,
    }
}

impl Shared {
    /// Marks the sockets whose engine connections were dispatched since the last call.
    pub(super) fn collect_changes(&mut self) {
        let mut changed = std::mem::take(&mut self.changed);
        for eng in 0..self.lo.engines.len() {
            changed.clear();
            self.lo.engines[eng].tcp_take_changed(&mut changed);
            for h in &changed {
                let gid = self
                    .by_slot
                    .get(eng)
                    .and_then(|v| v.get(h.index()))
                    .copied();
                if let Some(gid) = gid.filter(|&g| self.is_conn(g, eng, *h)) {
                    self.mark(gid);
                }
            }
        }
        changed.clear();
        self.changed = changed;
    }

    /// Whether socket `gid` is connection `h` of engine `eng` (a slot-map entry may be stale).
    fn is_conn(&self, gid: u32, eng: usize, h: TcpHandle) -> bool {
        matches!(self.socks.get(&gid), Some(GSock { kind: Kind::Conn(c), .. }) if c.eng == eng && c.h == h)
    }
}

/// Records that connection `h` of engine `eng` is socket `gid` (done as a connection is
/// served, so every connection is known once its first turn looked at it — and a new socket
/// is always marked for that turn).
pub(super) fn note_slot(by_slot: &mut Vec<Vec<u32>>, eng: usize, h: TcpHandle, gid: u32) {
    if by_slot.len() <= eng {
        by_slot.resize_with(eng + 1, Vec::new);
    }
    let v = &mut by_slot[eng];
    if v.len() <= h.index() {
        // Grows with the engine's slot table (amortised; never per packet).
        v.resize(h.index() + 1, 0);
    }
    v[h.index()] = gid;
}
