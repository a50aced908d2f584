//! Fused connections: both ends are applications of one daemon engine, and once the
//! connection carried enough bytes the daemon gives both one pipe (`flowstack_sys::pipe`;
//! the daemon's `app::fuse` explains the switch). From then on a send writes into the pipe
//! and a receive reads from it — two copies from program to program, none in the daemon.
//!
//! - **Sending:** the first send after `Fused` posts `Pipe{Switch}` (behind every byte this
//!   process sent on the connection's rings), then writes into the pipe. A full pipe is
//!   `WouldBlock`; the wait ends when the reader frees a quarter of it (`PipeNews`, and the
//!   placeholder's filler emptied by the daemon). A pipe whose reader is gone fails the send
//!   (`ConnectionReset`, as a reset connection).
//! - **Receiving:** the pipe's bytes come after those delivered into the receive area:
//!   they count as unread ([`Sock::unread`]) once the daemon said `PipeOpen` (every byte sent
//!   before the switch was delivered ahead of it) or the end of stream came (which follows
//!   every byte sent before the switch). End of stream is reported once the pipe is empty.
//! - **Wake-ups:** a side that finds the pipe empty (full) flags it; the other side seeing
//!   the flag posts `Pipe{Kick}` and the daemon wakes the first. A reader whose readiness
//!   the shim's epoll computes here and that sleeps on this process's wake-up channel
//!   names itself in the flag instead (`Sock::pipe_who`): the writer, which the
//!   daemon gave a write end of that channel with the pipe, writes the reader's handle into
//!   it ([`flowstack_sys::wake::signal_peer`]) — one system call, no daemon. The drain of
//!   the channel ([`Client::peer_news`]) marks the socket changed for the epoll. A flag that
//!   names another process (a forked child reading now), a full channel, or a writer with
//!   no end for it, turns to the daemon as before. Since peers then hold write ends of the
//!   channel, its hang-up no longer tells the daemon's death: such a process bounds its
//!   sleeps ([`Client::sleep_bounded`]) and checks the daemon on each.
//!
//! The pipe's descriptor comes on the registration stream ([`Client::read_stream`]) ahead
//! of the `Fused` event that names it by token.

use super::*;
use flowstack_api::record::{PipeOp, FUSED_OPEN, FUSED_SWITCHED, FUSED_WRITES_1, PIPE_TAG};
use flowstack_sys::pipe::{Pipe, Wake};
use std::os::fd::AsFd;

/// Pipe descriptors kept waiting for their `Fused` event at most (older ones are closed).
const MAX_WAITING_PIPES: usize = 64;

/// A pipe the daemon sent, waiting for its `Fused` event: its token, its descriptor, and
/// the peer's wake-up id, handle and channel when the daemon gave them.
#[derive(Debug)]
pub(crate) struct Waiting {
    token: u64,
    fd: Own<OwnedFd>,
    peer: Option<(u32, u32, Own<OwnedFd>)>,
}

/// The other end's process, woken directly: its wake-up id, the socket's handle there, and
/// a write end of its channel (shared by this process's sockets fused with it).
#[derive(Debug)]
struct PeerWake {
    id: u32,
    handle: u32,
    end: Arc<Own<OwnedFd>>,
}

/// A socket's end of its pipe.
#[derive(Debug)]
pub(crate) struct SockPipe {
    pipe: Arc<Pipe>,
    /// The direction this end writes; it reads the other.
    wdir: usize,
    /// This end's bytes go on the pipe.
    switched: bool,
    /// The other end's pipe bytes may be read (`PipeOpen`).
    open: bool,
    /// Bytes read from the pipe since the last `TcpConsume` (not the daemon's to count).
    pub(crate) taken: u64,
    /// Who this end's reader may be woken by directly.
    peer: Option<PeerWake>,
}

impl Sock {
    /// Pipe bytes this socket may read now; when none, the writer is asked for a wake-up.
    pub(crate) fn piped(&self) -> usize {
        match &self.pipe {
            Some(p) if (p.open || self.eof) && self.error.is_none() => {
                p.pipe
                    .readable_arm(1 - p.wdir, Wake::direct(self.pipe_who))
                    .unwrap_or(0) as usize
            }
            _ => 0,
        }
    }

    /// Its sends go through the pipe (`sendfile`'s too, to stay in order with them). Until
    /// the first send after `Fused`, `sendfile` keeps the daemon's file path (the daemon
    /// reads the file): the bytes it queued are delivered before the pipe opens.
    pub(crate) fn pipe_switched(&self) -> bool {
        self.pipe.as_ref().is_some_and(|p| p.switched)
    }

    /// Bytes this end wrote into its pipe that the other end has not read (`SIOCOUTQ`).
    pub(crate) fn pipe_queued(&self) -> u64 {
        self.pipe
            .as_ref()
            .map_or(0, |p| p.pipe.readable(p.wdir).unwrap_or(0))
    }

    /// A fused socket whose bytes go on the pipe: whether a send would take bytes now (a
    /// quarter of the pipe free, or its reader gone); when not, the reader is asked for a
    /// wake-up. `None`: not fused, the send buffer decides.
    pub(crate) fn pipe_writable(&self) -> Option<bool> {
        match &self.pipe {
            Some(p) if p.switched => Some(
                self.open
                    && (p.pipe.reader_closed(p.wdir)
                        || p.pipe.writable_arm(p.wdir).unwrap_or(true)),
            ),
            _ => None,
        }
    }
}

impl Client {
    /// Reads what the daemon sent on the registration stream: pipe descriptors (kept for
    /// their `Fused` event) and end of file (the daemon is gone).
    pub(crate) fn read_stream(&mut self) {
        loop {
            let mut b = [0u8; 24];
            let mut fds = Vec::new();
            match flowstack_sys::fdpass::recv_fds(&self.stream, &mut b, &mut fds) {
                Ok(0) => {
                    self.dead = true;
                    return;
                }
                Ok(n) => {
                    // [PIPE_TAG, token] with the pipe, or [.., peer id, peer handle] with
                    // the pipe and the peer's wake-up channel.
                    if (n == 16 && fds.len() == 1 || n == 24 && fds.len() == 2)
                        && b[..8] == PIPE_TAG
                    {
                        let token = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
                        let mut fds = fds.into_iter().map(Own::lift);
                        let fd = fds.next().expect("one");
                        let peer = fds.next().map(|end| {
                            let word = |i: usize| {
                                u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
                            };
                            (word(16), word(20), end)
                        });
                        if self.pipe_fds.len() >= MAX_WAITING_PIPES {
                            self.pipe_fds.pop_front();
                        }
                        self.pipe_fds.push_back(Waiting { token, fd, peer });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.dead = true;
                    return;
                }
            }
        }
    }

    /// `Fused`, `PipeOpen` and `PipeNews`.
    pub(crate) fn on_pipe_event(&mut self, e: &EventRecord) {
        match e.kind {
            EventKind::Fused => {
                let pipe = self.take_pipe(e.offset).filter(|p| p.0.cap() == e.len);
                let Some(s) = self.socks.get_mut(&e.handle) else {
                    return;
                };
                match pipe {
                    Some((pipe, peer)) => {
                        s.pipe = Some(Box::new(SockPipe {
                            pipe,
                            wdir: (e.result & FUSED_WRITES_1 != 0) as usize,
                            switched: e.result & FUSED_SWITCHED != 0,
                            open: e.result & FUSED_OPEN != 0,
                            taken: 0,
                            peer,
                        }));
                        self.peers_wake = true;
                        if s.peeking {
                            self.pulls.push(e.handle);
                        }
                        s.rgen = s.rgen.wrapping_add(1);
                        if self.fused.len() >= 64 && self.fused.len().is_power_of_two() {
                            let socks = &self.socks;
                            self.fused
                                .retain(|h| socks.get(h).is_some_and(|s| s.pipe.is_some()));
                        }
                        self.fused.push(e.handle);
                    }
                    None => {
                        // The other end may write into a pipe nobody here reads: reset
                        // the connection rather than lose its bytes.
                        s.error = Some(SocketError::ConnectionReset);
                        let _ = self.post(Mode::Async, Command::TcpAbort { handle: e.handle });
                    }
                }
            }
            EventKind::PipeOpen => {
                if let Some(s) = self.socks.get_mut(&e.handle) {
                    if let Some(p) = &mut s.pipe {
                        p.open = true;
                    }
                    s.rgen = s.rgen.wrapping_add(1);
                }
            }
            _ => {
                if let Some(s) = self.socks.get_mut(&e.handle) {
                    s.rgen = s.rgen.wrapping_add(1);
                    s.wgen = s.wgen.wrapping_add(1);
                    s.blocked = false;
                }
            }
        }
    }

    /// The pipe the daemon sent with `token`, mapped, and its peer's wake-up channel.
    fn take_pipe(&mut self, token: u64) -> Option<(Arc<Pipe>, Option<PeerWake>)> {
        let find = |c: &Self| c.pipe_fds.iter().position(|w| w.token == token);
        let i = match find(self) {
            Some(i) => i,
            None => {
                self.read_stream();
                find(self)?
            }
        };
        let w = self.pipe_fds.remove(i)?;
        let pipe = Pipe::open(w.fd.try_clone().ok()?).ok()?;
        let peer = w.peer.and_then(|(id, handle, end)| {
            Wake::direct(id).id()?; // an id that does not fit is never asked for
                                    // One channel per peer process, however many sockets are fused with it.
            self.peer_wakes.retain(|(_, e)| e.strong_count() > 0);
            let end = match self.peer_wakes.iter().find(|(i, _)| *i == id) {
                Some((_, e)) => e.upgrade()?,
                None => {
                    let end = Arc::new(end);
                    self.peer_wakes.push((id, Arc::downgrade(&end)));
                    end
                }
            };
            Some(PeerWake { id, handle, end })
        });
        Some((pipe, peer))
    }

    /// Handles that peers wrote into this process's wake-up channel (`None`: something that
    /// does not decode, so every fused socket): their sockets changed (a new edge for the
    /// epoll's edge-triggered interests too).
    pub(crate) fn peer_news(&mut self, h: Option<u32>) {
        let mark = |c: &mut Self, h: u32| {
            if let Some(s) = c.socks.get_mut(&h).filter(|s| s.pipe.is_some()) {
                s.rgen = s.rgen.wrapping_add(1);
                c.changes.note(h);
                true
            } else {
                false
            }
        };
        if h.is_some_and(|h| mark(self, h)) {
            return;
        }
        for h in self.fused.clone() {
            mark(self, h);
        }
    }

    /// Whether a sleep on the wake-up channel must be bounded (peers hold write ends of it:
    /// its hang-up no longer tells the daemon's death).
    pub fn sleep_bounded(&self) -> bool {
        self.peers_wake
    }

    /// This process's wake-up id, as the daemon answered `Attach{Wake}` (0: none).
    pub(crate) fn set_wake_id(&mut self, id: u64) {
        self.wake_id = u32::try_from(id)
            .ok()
            .filter(|&i| Wake::direct(i).id().is_some())
            .unwrap_or(0);
    }

    /// This process's wake-up id (0: none yet).
    pub(crate) fn wake_id(&self) -> u32 {
        self.wake_id
    }

    /// Socket `h` is about to be waited for on its placeholder (a blocking call, a kernel
    /// `poll`): its empty pipe asks the daemon (which writes the token) from now on, and
    /// asks now — a writer that finds this process's id there turns to the daemon too. The
    /// shim's epoll asks for this process directly again when it next computes the
    /// socket's readiness ([`Posix::ready_many`](crate::posix::Posix::ready_many)).
    pub(crate) fn pipe_via_daemon(&mut self, h: u32) {
        if let Some(s) = self.socks.get_mut(&h) {
            s.pipe_who = 0;
            let _ = s.piped();
        }
    }

    /// Whether the daemon is alive, looked at every [`LIVENESS_CHECK`] at most: a fused
    /// socket's bytes do not go through it, but the connection ends with it (its sockets
    /// all fail when it dies, as every waiting call's do).
    fn pipe_alive(&mut self) -> bool {
        if self.last_liveness.elapsed() >= LIVENESS_CHECK {
            self.last_liveness = Instant::now();
            self.check_daemon();
        }
        !self.dead
    }

    /// A send on a fused socket: `None` if it is not fused (the send goes on the rings).
    pub(crate) fn pipe_send(
        &mut self,
        raw: u32,
        data: &[u8],
    ) -> Option<Result<usize, SocketError>> {
        self.socks.get(&raw)?.pipe.as_ref()?;
        if !self.pipe_alive() {
            return Some(Err(SocketError::ConnectionReset));
        }
        let s = self.socks.get_mut(&raw)?;
        let p = s.pipe.as_mut()?;
        if !p.switched {
            p.switched = true;
            let _ = self.post(
                Mode::Async,
                Command::Pipe {
                    handle: raw,
                    op: PipeOp::Switch,
                },
            );
        }
        let p = self.socks.get(&raw)?.pipe.as_ref()?;
        if p.pipe.reader_closed(p.wdir) {
            return Some(Err(SocketError::ConnectionReset));
        }
        Some(match p.pipe.write(p.wdir, data) {
            Ok((0, _)) if !data.is_empty() => Err(SocketError::WouldBlock),
            Ok((n, wake)) => {
                let mut daemon = wake.daemon();
                if let Some(id) = wake.id() {
                    let direct =
                        p.peer.as_ref().filter(|w| w.id == id).is_some_and(|w| {
                            flowstack_sys::wake::signal_peer(w.end.as_fd(), w.handle)
                        });
                    daemon |= !direct;
                }
                if daemon {
                    self.kick(raw);
                }
                Ok(n)
            }
            Err(_) => Err(SocketError::ConnectionReset),
        })
    }

    /// Reads socket `raw`'s pipe into `buf` (after its other unread bytes); how many.
    pub(crate) fn pipe_read(&mut self, raw: u32, buf: &mut [u8], peek: bool) -> usize {
        if buf.is_empty() || self.socks.get(&raw).is_none_or(|s| s.pipe.is_none()) {
            return 0;
        }
        let alive = self.pipe_alive();
        let Some(s) = self.socks.get_mut(&raw) else {
            return 0;
        };
        if !alive {
            s.error = Some(SocketError::ConnectionReset);
            return 0;
        }
        let eof = s.eof;
        let Some(p) = s
            .pipe
            .as_mut()
            .filter(|p| (p.open || eof) && !buf.is_empty())
        else {
            return 0;
        };
        match p.pipe.read(1 - p.wdir, buf, peek) {
            Ok((n, kick)) => {
                if !peek {
                    p.taken += n as u64;
                }
                if kick {
                    self.kick(raw);
                }
                n
            }
            Err(_) => {
                s.error = Some(SocketError::ConnectionReset);
                0
            }
        }
    }

    /// After a pump: the pipe bytes of fused sockets read in place ([`Sockets::tcp_peek`]
    /// and `tcp_consume`, not `tcp_recv`) are moved into their queues, where `tcp_peek` borrows from. (Their
    /// `TcpConsume` then counts them too; the daemon's count stops at zero.)
    ///
    /// [`Sockets::tcp_peek`]: flowstack_api::Sockets::tcp_peek
    pub(crate) fn pull_pipes(&mut self) {
        let mut kicks = Vec::new();
        let socks = &mut self.socks;
        self.pulls.retain(|h| {
            let Some(s) = socks.get_mut(h) else {
                return false;
            };
            let eof = s.eof;
            // Only sockets this process reads in place: a pipe is shared with every process
            // that has the socket (a forked child must not take its parent's bytes).
            let Some(p) = s.pipe.as_ref().filter(|p| (p.open || eof) && s.peeking) else {
                return true;
            };
            let mut buf = [0u8; 16 << 10];
            let mut budget = p.pipe.cap(); // a writer refilling it does not keep us here
            while budget > 0 {
                match p.pipe.read(1 - p.wdir, &mut buf, false) {
                    Ok((0, _)) => break,
                    Ok((n, kick)) => {
                        budget = budget.saturating_sub(n as u64);
                        s.rx.extend(&buf[..n]);
                        s.rgen = s.rgen.wrapping_add(1);
                        if kick {
                            kicks.push(*h);
                        }
                    }
                    Err(_) => {
                        s.error = Some(SocketError::ConnectionReset);
                        break;
                    }
                }
            }
            true
        });
        for h in kicks {
            self.kick(h);
        }
    }

    fn kick(&mut self, raw: u32) {
        let _ = self.post(
            Mode::Async,
            Command::Pipe {
                handle: raw,
                op: PipeOp::Kick,
            },
        );
    }
}
