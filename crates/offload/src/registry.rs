//! The control part of the daemon (run by engine 0, see [`Control`]): the unix listener,
//! registrations and their assignment to engines, and `flowstack stats`.
//!
//! # Which engine serves an application
//! Round robin over the engines, except that a process whose pid or parent pid belongs to an
//! application already registered goes to that application's engine: a forked child (nginx
//! workers) or an exec'd image uses its parent's process-shared sockets, and those live on
//! the parent's engine — a socket's bytes and events only reach applications of its engine.
//! `DaemonConfig::spread` (`--spread`) leaves out the exception, for processes whose
//! threads register one application each and share no sockets.
//! (An attach of a socket living on another engine — a descriptor passed to an unrelated
//! process — is refused with `EINVAL` and counted, `FlowstackdCrossEngineAttach`.)
//!
//! # Why engine 0 and not a thread of its own
//! With one engine (the default) the daemon stays one thread, exactly as before; with
//! several, registrations and stats are rare and cheap next to the engine's work, and a
//! control thread would need its own sleep and wake-up protocol for nothing. A stats query
//! stalls engine 0 for the time the other engines take to answer (one turn each).

use crate::app::{self, App, Shared};
use crate::engine::Ctl;
use crate::{layout, stats, MAX_APPS, PENDING_TIMEOUT};
use flowstack_sys::eventfd::EventFd;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// While the daemon is busy (or spinning) it looks for new registrations at most this often;
/// a sleeping daemon is woken by the listener at once.
const ACCEPT_CHECK: Duration = Duration::from_millis(1);
/// How long a stats query waits for each other engine's part.
const STATS_WAIT: Duration = Duration::from_secs(1);

/// Registered processes and their engines (written by the control part on registration and
/// by each engine when one of its applications leaves; never on the data path).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// pid → (engine, applications of that pid).
    pids: Mutex<HashMap<u32, (usize, u32)>>,
    total: AtomicUsize,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (usize, u32)>> {
        self.pids.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn join(&self, pid: u32, engine: usize) {
        self.lock().entry(pid).or_insert((engine, 0)).1 += 1;
        self.total.fetch_add(1, Ordering::SeqCst);
    }

    /// An application of `pid` left.
    pub fn leave(&self, pid: u32) {
        let mut m = self.lock();
        if let Some(e) = m.get_mut(&pid) {
            e.1 -= 1;
            if e.1 == 0 {
                m.remove(&pid);
            }
            self.total.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn engine_of(&self, pid: u32) -> Option<usize> {
        self.lock().get(&pid).map(|e| e.0)
    }
}

/// The parent of `pid` (from `/proc/PID/stat`).
fn parent_pid(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so cut at the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Another engine thread, as the control part reaches it.
pub(crate) struct Peer {
    pub tx: Sender<Ctl>,
    pub bell: Arc<EventFd>,
}

/// The control part (see the module docs).
pub(crate) struct Control {
    listener: UnixListener,
    pending: Vec<(UnixStream, Instant)>,
    next_app: u64,
    rr: usize,
    /// Every engine's doorbell eventfd (handed to its applications).
    bells: Vec<Arc<EventFd>>,
    /// Engines 1.. (index k-1 for engine k).
    peers: Vec<Peer>,
    registry: Arc<Registry>,
    /// When the daemon last looked for registrations (`None`: look now, e.g. it just woke).
    last_accept: Option<Instant>,
    /// Round robin only (`DaemonConfig::spread`).
    spread: bool,
}

impl Control {
    pub fn new(
        listener: UnixListener,
        bells: Vec<Arc<EventFd>>,
        peers: Vec<Peer>,
        registry: Arc<Registry>,
        spread: bool,
    ) -> Self {
        Self {
            listener,
            pending: Vec::new(),
            next_app: 1,
            rr: 0,
            bells,
            peers,
            registry,
            last_accept: None,
            spread,
        }
    }

    pub fn listener_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    pub fn pending_fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.pending.iter().map(|p| p.0.as_fd())
    }

    /// The engine woke at `now`: look for registrations on the next turn if its `poll` found
    /// the registration socket readable; if not, none waited when it woke, so the next look
    /// is one `ACCEPT_CHECK` later (an `accept(2)` on every wake-up answered `EAGAIN` nearly
    /// always: about two per ab connection).
    pub fn woke(&mut self, registering: bool, now: Instant) {
        self.last_accept = if registering { None } else { Some(now) };
    }

    /// Wakes the other engines so they see the stop.
    pub fn stop_peers(&self) {
        for p in &self.peers {
            let _ = p.bell.signal();
        }
    }

    /// One turn: registrations and stats queries; true if anything happened.
    /// `now` is the turn's clock reading.
    pub fn turn(&mut self, sh: &mut Shared, apps: &mut Vec<App>, now: Instant) -> bool {
        let mut busy = false;
        // An accept(2) per turn would be a system call per message; registrations wait
        // at most ACCEPT_CHECK while the daemon is awake (a sleeping daemon polls the
        // listener, so a registration wakes it and is taken on the first turn).
        if !matches!(self.last_accept, Some(t) if now.saturating_duration_since(t) < ACCEPT_CHECK) {
            self.last_accept = Some(now);
            busy |= self.accept_conns();
        }
        if !self.pending.is_empty() {
            busy |= self.serve_pending(sh, apps);
        }
        busy
    }

    /// Accepts connections on the unix socket; each waits in `pending` for its first 8
    /// bytes ([`stats::REGISTER`] or [`stats::STATS_REQUEST`]).
    fn accept_conns(&mut self) -> bool {
        let mut any = false;
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    any = true;
                    if self.pending.len() < MAX_APPS && s.set_nonblocking(true).is_ok() {
                        self.pending.push((s, Instant::now()));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return any,
            }
        }
    }

    /// Serves connections whose first bytes arrived: registration or a stats query.
    fn serve_pending(&mut self, sh: &mut Shared, apps: &mut Vec<App>) -> bool {
        use std::io::Read;
        let mut any = false;
        let mut i = 0;
        while i < self.pending.len() {
            let mut tag = [0u8; 8];
            // Tags are written in one call; a connection that sends fewer bytes is dropped
            // (at its timeout, or now if it sent something else).
            let r = flowstack_sys::placeholder::peek_len(self.pending[i].0.as_fd(), &mut tag);
            let expired = self.pending[i].1.elapsed() >= PENDING_TIMEOUT;
            match r {
                Some(8) => {}
                Some(0) => {
                    self.pending.swap_remove(i); // it hung up
                    continue;
                }
                _ if !expired => {
                    i += 1;
                    continue;
                }
                _ => {
                    self.pending.swap_remove(i);
                    continue;
                }
            }
            let (mut s, _) = self.pending.swap_remove(i);
            any = true;
            let _ = s.read_exact(&mut tag);
            if &tag == stats::STATS_REQUEST {
                let json = serde_json::to_vec(&self.stats(sh, apps)).unwrap_or_default();
                let _ = s.set_nonblocking(false);
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = std::io::Write::write_all(&mut s, &json);
            } else if &tag == stats::REGISTER {
                self.register(s, apps, sh);
            }
        }
        any
    }

    /// Every engine's part, as it is now: engine 0's here, the others' asked for and
    /// awaited (each answers at its next turn, woken by its doorbell if it sleeps).
    fn stats(&mut self, sh: &Shared, apps: &[App]) -> stats::Stats {
        let mut rxs = Vec::with_capacity(self.peers.len());
        for p in &self.peers {
            let (tx, rx) = std::sync::mpsc::channel();
            if p.tx.send(Ctl::Stats(tx)).is_ok() {
                let _ = p.bell.signal();
                rxs.push(rx);
            }
        }
        let mut all = app::snapshot(sh, apps);
        for rx in rxs {
            if let Ok(part) = rx.recv_timeout(STATS_WAIT) {
                all.merge(part);
            }
        }
        all.counters
            .insert("FlowstackdEngines".into(), 1 + self.peers.len() as u64);
        all
    }

    /// The engine a new application of `pid` goes to (module docs).
    fn assign(&mut self, pid: u32) -> usize {
        let n = 1 + self.peers.len();
        let family = if self.spread || n == 1 {
            None
        } else {
            self.registry
                .engine_of(pid)
                .or_else(|| parent_pid(pid).and_then(|pp| self.registry.engine_of(pp)))
        };
        family.unwrap_or_else(|| {
            let e = self.rr % n;
            self.rr = self.rr.wrapping_add(1);
            e
        })
    }

    fn register(&mut self, stream: UnixStream, apps: &mut Vec<App>, sh: &mut Shared) {
        if self.registry.total.load(Ordering::SeqCst) >= MAX_APPS {
            sh.counters.apps_refused += 1;
            return; // dropped: the client sees the socket close
        }
        let Ok((pid, uid, _)) = flowstack_sys::socket::peer_cred(&stream) else {
            sh.counters.apps_refused += 1;
            return;
        };
        let id = self.next_app;
        self.next_app += 1;
        let Ok(app) = App::new(id, pid, uid, stream) else {
            return;
        };
        let engine = self.assign(pid);
        let sent = flowstack_sys::fdpass::send_fds(
            &app.stream,
            layout::HELLO,
            &[app.region.fd(), self.bells[engine].as_fd()],
        );
        if sent.is_err() {
            return;
        }
        sh.counters.apps_registered += 1;
        self.registry.join(pid, engine);
        if engine == 0 {
            apps.push(app);
            return;
        }
        let p = &self.peers[engine - 1];
        if p.tx.send(Ctl::Adopt(Box::new(app))).is_ok() {
            let _ = p.bell.signal();
        } else {
            self.registry.leave(pid); // that engine is gone (the daemon is stopping)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_pid_of_this_process_is_read() {
        let me = std::process::id();
        let pp = parent_pid(me).expect("our own /proc entry");
        assert_ne!(pp, me);
        assert_eq!(parent_pid(u32::MAX), None);
    }

    #[test]
    fn registry_counts_applications_per_pid() {
        let r = Registry::default();
        r.join(10, 1);
        r.join(10, 1);
        assert_eq!(r.engine_of(10), Some(1));
        r.leave(10);
        assert_eq!(r.engine_of(10), Some(1));
        r.leave(10);
        assert_eq!(r.engine_of(10), None);
        assert_eq!(r.total.load(Ordering::SeqCst), 0);
        r.leave(10); // unknown: nothing
        assert_eq!(r.total.load(Ordering::SeqCst), 0);
    }
}
