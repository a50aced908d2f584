//! Fused loopback connections: once a connection between two applications of this engine
//! has carried [`Shared::fuse_after`] bytes one way, its two ends get one pipe
//! (`flowstack_sys::pipe`, [`Shared::fuse_cap`] bytes each way) and their bytes go from one
//! program to the other through it — two copies, as the kernel's loopback makes, instead of
//! three (into the transmit area, into the receive area here, out of it) with a daemon
//! between them. Solaris's TCP fusion and Onload's loopback acceleration do the same.
//!
//! # The switch, in order
//! 1. The daemon sends the pipe's descriptor on each application's registration stream and
//!    posts `Fused`. Nothing changes until the applications act.
//! 2. A writer's first send after `Fused` posts `Pipe{Switch}` and writes into the pipe: every
//!    byte it sent before is in its rings ahead of that record.
//! 3. Once those bytes are all delivered into the reader's area (the writer's queues here
//!    and in the engine empty, the reader's engine buffer empty), the reader is told
//!    `PipeOpen`, behind their `Data` events: it reads its area first, then the pipe.
//!    End of stream also comes behind every byte sent before the switch, so the reader
//!    reads the pipe once it saw the end too, and reports the end when the pipe is empty.
//!
//! The TCP connection stays: the handshake, FIN, RST, errors and `TCP_INFO` keep going
//! through the engine; only the payload moves. Wake-ups: a side that finds the pipe empty
//! (full) sets a flag in it; the other side, seeing the flag after writing (reading), posts
//! `Pipe{Kick}` and the daemon tells the first `PipeNews` and writes its placeholder's token
//! (empties its filler) as the pipe says. A reader that sleeps on its own wake-up channel
//! names itself in the flag instead, and its writer — given a write end of that channel
//! with the pipe ([`send_pipe`]) — wakes it directly, with no daemon between them.
//!
//! # Limits
//! Both ends on one engine; each held by one application that alone names it when fused
//! (a socket adopted later, by a forked child or a program after exec, gets the pipe with
//! its adoption). Pipe memory is not counted against `--max-app-memory`; live pipes take at
//! most `--fuse-memory` in all (each engine its share), beyond which connections stay on
//! the daemon's path.

use super::*;
use flowstack_api::record::PipeOp;
use flowstack_api::record::{FUSED_OPEN, FUSED_SWITCHED, FUSED_WRITES_1, PIPE_TAG};
use flowstack_sys::pipe::Pipe;

/// Default of `--fuse-after`: bytes one way before a loopback connection is fused.
pub const FUSE_AFTER: u64 = 64 << 10;
/// Default of `--fuse-pipe`: the pipe's bytes per direction.
pub const FUSE_CAP: u64 = 512 << 10;
/// Default of `--fuse-memory`: bytes all live pipes may take (shared out among engines).
pub const FUSE_MEMORY: u64 = 256 << 20;

/// Whether a pipe of `cap` fits in `sh.fuse_memory` with the live ones (counted as
/// `FlowstackdPipesRefused` when not).
fn room_for_pipe(sh: &mut Shared, cap: u64) -> bool {
    sh.pipes.retain(|(p, _)| p.strong_count() > 0);
    let live: u64 = sh.pipes.iter().map(|(_, b)| b).sum();
    live.saturating_add(pipe_bytes(cap)) <= sh.fuse_memory
}

/// A pipe's memory: its header and both rings.
fn pipe_bytes(cap: u64) -> u64 {
    flowstack_sys::pipe::HEADER as u64 + 2 * cap
}

/// A fused connection's end.
#[derive(Debug)]
pub(crate) struct ConnFuse {
    pub pipe: Arc<Pipe>,
    /// The other end's socket.
    pub peer: u32,
    /// The direction this end writes (it reads the other).
    pub wdir: usize,
    /// This end's bytes go on the pipe (`Pipe{Switch}` seen).
    pub switched: bool,
    /// `PipeOpen` was told for the direction this end reads.
    pub rx_open: bool,
}

impl ConnFuse {
    fn rdir(&self) -> usize {
        1 - self.wdir
    }
    /// Pipe bytes this end may read now; when there are none the writer is asked to wake
    /// this end through the daemon again (the kick that brought us here took the request;
    /// a reader with tokens needs the next write's).
    pub fn readable_arm(&self) -> bool {
        self.rx_open
            && self
                .pipe
                .readable_arm(self.rdir(), flowstack_sys::pipe::Wake::DAEMON)
                .map_or(true, |n| n > 0)
    }
    /// Pipe bytes this end may read now (nothing asked: a quiet reader asks for itself).
    pub fn readable(&self) -> bool {
        self.rx_open && self.pipe.readable(self.rdir()).map_or(true, |n| n > 0)
    }
    /// Room to write (a quarter of the pipe, as the client's readiness), or the reader gone.
    /// When not, the reader is asked for a wake-up again (a read that freed less than a
    /// quarter took the request; without asking again the next read would not tell).
    pub fn writable_arm(&self) -> bool {
        self.pipe.reader_closed(self.wdir) || self.pipe.writable_arm(self.wdir).unwrap_or(true)
    }
    /// Bytes the other end wrote that this end never read.
    pub fn unread(&self) -> bool {
        self.pipe.readable(self.rdir()).is_ok_and(|n| n > 0)
    }
}

/// The `Fused` event for `handle`.
fn fused(handle: u32, token: u64, f: &ConnFuse) -> EventRecord {
    let mut flags = 0;
    if f.wdir == 1 {
        flags |= FUSED_WRITES_1;
    }
    if f.switched {
        flags |= FUSED_SWITCHED;
    }
    if f.rx_open {
        flags |= FUSED_OPEN;
    }
    EventRecord {
        kind: EventKind::Fused,
        id: 0,
        handle,
        result: flags,
        offset: token,
        len: f.pipe.cap(),
    }
}

fn note(kind: EventKind, handle: u32) -> EventRecord {
    EventRecord {
        kind,
        id: 0,
        handle,
        result: 0,
        offset: 0,
        len: 0,
    }
}

/// Sends `pipe`'s descriptor to `app` (the token names it); false if it could not go. With
/// `peer` (the other end's application and its handle there) and a wake-up channel for it,
/// also the peer's id and handle and a write end of its channel: `app` then wakes the peer
/// directly when the pipe's flag names it (`flowstack_sys::wake`).
fn send_pipe(app: &App, pipe: &Pipe, token: u64, peer: Option<(&App, u32)>) -> bool {
    let mut msg = [0u8; 24];
    msg[..8].copy_from_slice(&PIPE_TAG);
    msg[8..16].copy_from_slice(&token.to_le_bytes());
    let end = peer.and_then(|(p, h)| Some((p.wake.for_peer()?, h)));
    let sent = match &end {
        Some(((id, fd), h)) => {
            msg[16..20].copy_from_slice(&id.to_le_bytes());
            msg[20..].copy_from_slice(&h.to_le_bytes());
            flowstack_sys::fdpass::try_send_fds(&app.stream, &msg, &[pipe.fd(), fd.as_fd()])
        }
        None => flowstack_sys::fdpass::try_send_fds(&app.stream, &msg[..16], &[pipe.fd()]),
    };
    sent.ok() == Some(if end.is_some() { 24 } else { 16 })
}

/// Tells `app`, which just adopted socket `gid` as `handle`, the pipe of a fused connection.
pub(super) fn tell_adopter(sh: &mut Shared, app: &mut App, gid: u32, handle: u32) {
    let Some(Kind::Conn(Conn { fuse: Some(f), .. })) = sh.socks.get(&gid).map(|g| &g.kind) else {
        return;
    };
    let token = sh.next_pipe_token;
    sh.next_pipe_token += 1;
    if send_pipe(app, &f.pipe, token, None) {
        let ev = fused(handle, token, f);
        app.post(ev);
    } else {
        sh.counters.pipes_refused += 1;
    }
}

/// A new holder of `gid`: told `PipeOpen` if the pipe it reads is open.
pub(super) fn tell_holder(sh: &Shared, app: &mut App, gid: u32, handle: u32) {
    if let Some(Kind::Conn(Conn { fuse: Some(f), .. })) = sh.socks.get(&gid).map(|g| &g.kind) {
        if f.rx_open {
            app.post(note(EventKind::PipeOpen, handle));
        }
    }
}

/// Connection `gid` whose holder's area got [`Shared::fuse_after`] bytes: both ends fused if
/// they can be, else asked again after as many more.
pub(super) fn try_fuse(sh: &mut Shared, apps: &mut [App], gid: u32) {
    let fused = fuse_pair(sh, apps, gid);
    if !fused {
        let after = sh.fuse_after;
        if let Some(Kind::Conn(c)) = sh.socks.get_mut(&gid).map(|g| &mut g.kind) {
            c.fuse_next = c.rx_total.saturating_add(after);
        }
    }
}

/// The application (index) and handle that alone name and hold `gid`, if it is a
/// connection that can be fused now.
fn sole(sh: &Shared, apps: &[App], gid: u32) -> Option<(usize, u32, usize, TcpHandle)> {
    let g = sh.socks.get(&gid)?;
    let Kind::Conn(c) = &g.kind else {
        return None;
    };
    let ok = !g.closing
        && g.owners.len() == 1
        && g.holder == g.owners.first().copied()
        && c.fuse.is_none()
        && c.open_told
        && !c.eof_told
        && !c.closed_told
        && !c.shutdown_pending
        && c.file_want.is_none();
    let (app, h) = g.holder.filter(|_| ok)?;
    let i = apps.iter().position(|a| a.id == app && !a.broken)?;
    Some((i, h, c.eng, c.h))
}

fn fuse_pair(sh: &mut Shared, apps: &mut [App], gid: u32) -> bool {
    let Some((ia, ha, eng, h)) = sole(sh, apps, gid) else {
        return false;
    };
    let Ok(k) = sh.lo.engines[eng].tcp_conn(h) else {
        return false;
    };
    let mut t = k.tuple();
    std::mem::swap(&mut t.local_ip, &mut t.remote_ip);
    std::mem::swap(&mut t.local_port, &mut t.remote_port);
    let Some(ph) = sh.lo.engines[eng].tcp_find(&t) else {
        return false; // not a connection of two applications of this engine
    };
    let Some(&pgid) = sh.by_slot.get(eng).and_then(|v| v.get(ph.index())) else {
        return false;
    };
    let Some((ib, hb, peng, pc)) = sole(sh, apps, pgid) else {
        return false;
    };
    if pgid == gid || peng != eng || pc != ph {
        return false;
    }
    if !room_for_pipe(sh, sh.fuse_cap) {
        sh.counters.pipes_refused += 1; // asked again after `fuse_after` more bytes
        return false;
    }
    let Ok(pipe) = Pipe::create(sh.fuse_cap) else {
        sh.counters.pipes_refused += 1;
        sh.fuse_after = u64::MAX; // no memory for pipes: stop trying
        return false;
    };
    sh.pipes
        .push((Arc::downgrade(&pipe), pipe_bytes(pipe.cap())));
    let token = sh.next_pipe_token;
    sh.next_pipe_token += 1;
    if !send_pipe(&apps[ia], &pipe, token, Some((&apps[ib], hb)))
        || !send_pipe(&apps[ib], &pipe, token, Some((&apps[ia], ha)))
    {
        sh.counters.pipes_refused += 1;
        return false;
    }
    for (g, peer, wdir, i, handle) in [(gid, pgid, 0, ia, ha), (pgid, gid, 1, ib, hb)] {
        let f = ConnFuse {
            pipe: pipe.clone(),
            peer,
            wdir,
            switched: false,
            rx_open: false,
        };
        apps[i].post(fused(handle, token, &f));
        if let Some(Kind::Conn(c)) = sh.socks.get_mut(&g).map(|g| &mut g.kind) {
            c.fuse = Some(Box::new(f));
        }
    }
    sh.counters.pipes_fused += 1;
    true
}

/// `Pipe{op}` from an application on its socket `gid`.
pub(super) fn on_command(sh: &mut Shared, gid: u32, op: PipeOp) {
    let Some(Kind::Conn(Conn { fuse: Some(f), .. })) = sh.socks.get_mut(&gid).map(|g| &mut g.kind)
    else {
        return; // not fused (a late record): nothing to do
    };
    match op {
        PipeOp::Switch => {
            if !f.switched {
                f.switched = true;
                sh.fusing.push(gid);
            }
        }
        PipeOp::Kick => {
            sh.counters.pipe_kicks += 1;
            let peer = f.peer;
            sh.kicks.push(peer);
        }
    }
}

/// The turn's pipe work: wake-ups asked for, and directions whose bytes sent before the
/// switch are all delivered (told `PipeOpen`).
pub(super) fn service(sh: &mut Shared, apps: &mut [App]) -> bool {
    let mut busy = false;
    let kicks = std::mem::take(&mut sh.kicks);
    for &gid in &kicks {
        let Some(g) = sh.socks.get(&gid) else {
            continue;
        };
        let Kind::Conn(Conn { fuse: Some(f), .. }) = &g.kind else {
            continue;
        };
        // A quiet reader (its readiness computed in its process, woken on its channel) asks
        // for itself each time it finds the pipe empty: asking here for it would bring every
        // later write through the daemon. A reader with tokens is asked for again.
        let r = if notify::quiet(g) {
            f.readable()
        } else {
            f.readable_arm()
        };
        let w = f.switched && f.writable_arm();
        if let Some((app, h)) = g.holder {
            if let Some(a) = apps.iter_mut().find(|a| a.id == app) {
                a.post(note(EventKind::PipeNews, h));
            }
        }
        if g.ph.is_some() && (r || w) {
            sh.ph_actions.push((gid, r, w));
        }
        busy = true;
    }
    sh.kicks = kicks;
    sh.kicks.clear();
    let mut i = 0;
    while i < sh.fusing.len() {
        let gid = sh.fusing[i];
        match drained(sh, gid) {
            None => {
                sh.fusing.swap_remove(i);
            }
            Some(false) => i += 1,
            Some(true) => {
                sh.fusing.swap_remove(i);
                busy = true;
                open(sh, apps, gid);
            }
        }
    }
    busy
}

/// Whether every byte `gid` sent before its switch reached its peer's holder (None: the
/// connection or its peer is gone, or ended).
fn drained(sh: &Shared, gid: u32) -> Option<bool> {
    let Kind::Conn(c) = &sh.socks.get(&gid)?.kind else {
        return None;
    };
    let f = c.fuse.as_ref()?;
    let Kind::Conn(p) = &sh.socks.get(&f.peer)?.kind else {
        return None;
    };
    if c.closed_told || p.closed_told {
        return None;
    }
    let e = &sh.lo.engines[c.eng];
    let sent = c.queued_here() == 0
        && c.file_want.is_none()
        && e.tcp_conn(c.h).is_ok_and(|k| k.send_queue() == 0);
    let taken = e.tcp_conn(p.h).is_ok_and(|k| k.recv_queue() == 0) && !p.direct_rx;
    Some(sent && taken)
}

/// Tells `gid`'s peer that the pipe `gid` writes may be read.
fn open(sh: &mut Shared, apps: &mut [App], gid: u32) {
    let Some(peer) = sh.socks.get(&gid).and_then(|g| match &g.kind {
        Kind::Conn(Conn { fuse: Some(f), .. }) => Some(f.peer),
        _ => None,
    }) else {
        return;
    };
    let Some(g) = sh.socks.get_mut(&peer) else {
        return;
    };
    let Kind::Conn(Conn { fuse: Some(f), .. }) = &mut g.kind else {
        return;
    };
    f.rx_open = true;
    sh.counters.pipes_opened += 1;
    if let Some((app, h)) = g.holder {
        if let Some(a) = apps.iter_mut().find(|a| a.id == app) {
            a.post(note(EventKind::PipeOpen, h));
        }
    }
    // Asked for through the daemon: a reader asleep on its placeholder could not ask while
    // the pipe was closed to it (a quiet one's writer turns back to it after one kick).
    if g.ph.is_some() && f.readable_arm() {
        sh.ph_actions.push((peer, true, false));
    }
}

/// Socket `gid`'s end is closed for good: its peer's writes fail from now on, and the peer
/// is woken to see it. True if bytes the peer wrote were never read (the close resets).
pub(super) fn closing(sh: &mut Shared, c: &Conn) -> bool {
    let Some(f) = &c.fuse else {
        return false;
    };
    f.pipe.close_reader(f.rdir());
    sh.kicks.push(f.peer);
    f.unread()
}
