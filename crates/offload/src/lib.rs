//! `flowstackd`: the TCP/IP stack as a service that applications reach through shared memory
//! (seeds 001, 002, 004; the "Offload mode" paragraph of the design).
//!
//! The daemon owns the engines — in this first slice its own loopback interface on
//! 127.0.0.0/8 ([`loopback`]), which needs no privileges — and a unix socket where
//! applications register. Each application gets a sealed memfd ([`layout`]) with a command
//! ring, an event ring and two data areas, plus the daemon's doorbell eventfd, and talks to it
//! with `flowstack-client`.
//!
//! # The loop ([`Daemon::run`])
//! One thread: accept registrations; drain every application's command ring (validated
//! record by record, see [`app`](self)); run both engines; move bytes between the engines and
//! the applications' areas and post events; then, if nothing moved, sleep: announce it in
//! every application's header (`daemon_sleeping`), fence, check every command ring once more,
//! and `poll(2)` the unix listener, the doorbell eventfd and every application's socket until
//! the engines' next deadline. An application that posts after reading the announcement
//! signals the eventfd, so no command waits for a timeout; an idle daemon makes no system
//! call but a `poll` every [`IDLE_CHECK`] (for process liveness).
//!
//! # Faults
//! An application whose registration socket hangs up, whose process is gone (its pidfd
//! becomes readable, which wakes a sleeping daemon; without pidfds the pid is checked every
//! [`IDLE_CHECK`]) — also when the socket leaked into a child — or whose rings hold values
//! no honest client writes is dropped: its connections are reset or closed as the kernel
//! would on exit, its ports freed, its region unmapped.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod app;
pub mod layout;
pub mod loopback;
pub mod stats;

pub use app::{AppStats, DaemonCounters, EPHEMERAL};

use app::{App, Shared};
use flowstack_runtime::Clock;
use flowstack_sys::eventfd::EventFd;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest sleep of an idle daemon, so departed applications are noticed even without a
/// hang-up.
pub const IDLE_CHECK: Duration = Duration::from_millis(200);
/// Most applications registered at once.
pub const MAX_APPS: usize = 256;

/// The socket path used when none is given: `$XDG_RUNTIME_DIR/flowstack.sock`, or
/// `/run/flowstack/flowstack.sock` as root, else `/tmp/flowstack-UID.sock`.
pub fn default_socket_path() -> PathBuf {
    let uid = rustix_uid();
    if uid == 0 {
        return PathBuf::from("/run/flowstack/flowstack.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Path::new(&d).join("flowstack.sock"),
        _ => PathBuf::from(format!("/tmp/flowstack-{uid}.sock")),
    }
}

fn rustix_uid() -> u32 {
    // Our own uid, as the kernel reports it for a socket pair (no unsafe, no extra crate).
    UnixStream::pair()
        .ok()
        .and_then(|(a, _)| flowstack_sys::socket::peer_cred(&a).ok())
        .map(|(_, uid, _)| uid)
        .unwrap_or(u32::MAX)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Unix socket applications register on.
    pub socket: PathBuf,
    /// Most sockets one application may name at once; more are refused with `ENOBUFS`
    /// and counted (`FlowstackdLimitsHit`).
    pub max_sockets_per_app: usize,
    /// How long the daemon keeps polling (busy) after a turn found nothing before it
    /// announces that it sleeps (`--spin-us`); zero sleeps at once. In offload mode the daemon
    /// owns its core, so spinning costs no application any CPU and saves a wake-up per
    /// message; the spin is bounded, so an idle daemon still sleeps (0% CPU).
    pub spin: Duration,
    /// CPU to pin the daemon's thread to (`--cpu`); `None` leaves it unpinned.
    pub cpu: Option<usize>,
}

/// Default of [`DaemonConfig::spin`].
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// While the daemon is busy (or spinning) it looks for new registrations at most this often;
/// a sleeping daemon is woken by the listener at once.
const ACCEPT_CHECK: Duration = Duration::from_millis(1);

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            socket: default_socket_path(),
            max_sockets_per_app: 65536,
            spin: DEFAULT_SPIN,
            cpu: None,
        }
    }
}

/// A bound daemon, ready to [`run`](Daemon::run).
pub struct Daemon {
    listener: UnixListener,
    max_sockets_per_app: usize,
    spin: Duration,
    cpu: Option<usize>,
    path: PathBuf,
    bell: EventFd,
}

/// A daemon running on its own thread ([`Daemon::spawn`]); stops and joins on drop.
pub struct DaemonHandle {
    stop: Arc<AtomicBool>,
    tid: Arc<std::sync::atomic::AtomicU32>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    bell_fd: Option<std::os::fd::OwnedFd>,
    /// Where applications register.
    pub path: PathBuf,
}

impl DaemonHandle {
    /// The daemon thread's kernel id (for its CPU time in `/proc`), once it runs.
    pub fn thread_id(&self) -> Option<u32> {
        Some(self.tid.load(Ordering::SeqCst)).filter(|&t| t != 0)
    }

    /// Stops the daemon and waits for its thread.
    pub fn stop(mut self) -> io::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> io::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(fd) = self.bell_fd.take() {
            let _ = EventFd::from_fd(fd).signal();
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("daemon thread panicked"))),
            None => Ok(()),
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl Daemon {
    /// Binds the unix socket (its directory is created; a stale socket file left by a dead
    /// daemon is replaced, a live daemon's is not).
    pub fn bind(cfg: &DaemonConfig) -> io::Result<Self> {
        let path = cfg.socket.clone();
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("a daemon already listens on {}", path.display()),
                ));
            }
            std::fs::remove_file(&path)?;
        }
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener,
            max_sockets_per_app: cfg.max_sockets_per_app.max(1),
            spin: cfg.spin,
            cpu: cfg.cpu,
            path,
            bell: EventFd::new()?,
        })
    }

    /// Where applications register.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Binds and runs the daemon on a new thread.
    pub fn spawn(cfg: &DaemonConfig) -> io::Result<DaemonHandle> {
        let d = Self::bind(cfg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let bell_fd = d.bell.as_fd().try_clone_to_owned()?;
        let path = d.path.clone();
        let s = stop.clone();
        let tid = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let t = tid.clone();
        let thread = std::thread::Builder::new()
            .name("flowstackd".into())
            .spawn(move || {
                t.store(flowstack_sys::process::thread_id(), Ordering::SeqCst);
                d.run(&s)
            })?;
        Ok(DaemonHandle {
            stop,
            tid,
            thread: Some(thread),
            bell_fd: Some(bell_fd),
            path,
        })
    }

    /// Runs until `stop` is set (checked at least every [`IDLE_CHECK`]); removes the socket
    /// file on the way out.
    pub fn run(self, stop: &AtomicBool) -> io::Result<()> {
        if let Some(cpu) = self.cpu {
            flowstack_sys::affinity::pin_to_cpu(cpu)?;
        }
        let clock = Clock::start();
        let mut sh = Shared::new();
        sh.max_sockets_per_app = self.max_sockets_per_app;
        let mut apps: Vec<App> = Vec::new();
        let mut next_app = 1u64;
        let mut pending: Vec<(UnixStream, Instant)> = Vec::new();
        let mut last_check = Instant::now();
        let mut last_close_check = Instant::now();
        // When the daemon last looked for registrations (`None`: look now, e.g. it just woke).
        let mut last_accept: Option<Instant> = None;
        // When the current run of empty turns began (the spin before sleeping).
        let mut idle_since: Option<Instant> = None;
        while !stop.load(Ordering::SeqCst) {
            let mut busy = false;
            // An accept(2) per turn would be a system call per message; registrations wait
            // at most ACCEPT_CHECK while the daemon is awake (a sleeping daemon polls the
            // listener, so a registration wakes it and is taken on the first turn).
            if !matches!(last_accept, Some(t) if t.elapsed() < ACCEPT_CHECK) {
                last_accept = Some(Instant::now());
                busy |= self.accept_conns(&mut pending);
            }
            if !pending.is_empty() {
                busy |= self.serve_pending(&mut pending, &mut apps, &mut sh, &mut next_app);
            }
            for a in apps.iter_mut() {
                busy |= a.drain_commands(&mut sh) > 0;
            }
            let now = clock.now();
            sh.lo.set_now(now);
            busy |= sh.lo.poll(now);
            busy |= app::service(&mut sh, &mut apps);
            for a in apps.iter_mut() {
                busy |= a.flush_events();
            }
            // Tokens and filler after the events that explain them are published.
            busy |= sh.placeholder_actions();
            // Output the socket calls above produced.
            busy |= sh.lo.poll(clock.now());
            if last_check.elapsed() >= IDLE_CHECK {
                last_check = Instant::now();
                reap(&mut apps, &mut sh, true);
            }
            if busy && last_close_check.elapsed() >= LAST_CLOSE_CHECK {
                last_close_check = Instant::now();
                busy |= last_closes(&mut sh, &mut apps)?;
            }
            if busy {
                idle_since = None;
                continue;
            }
            // Spin (bounded) before sleeping: a command posted within `spin` is taken without
            // a doorbell (the applications see `daemon_sleeping` clear and make no call).
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < self.spin {
                std::hint::spin_loop();
                continue;
            }
            idle_since = None;
            // Sleep: announce it, then look once more (see the module docs).
            for a in &apps {
                a.set_sleeping(true);
            }
            fence(Ordering::SeqCst);
            if apps.iter().any(|a| a.pending()) {
                for a in &apps {
                    a.set_sleeping(false);
                }
                continue;
            }
            let wait = sh
                .lo
                .poll_at()
                .map(|t| t.saturating_since(clock.now()))
                .map(|d| Duration::from_nanos(d.as_nanos().min(u64::MAX as u128) as u64))
                .unwrap_or(IDLE_CHECK)
                .min(IDLE_CHECK);
            let (hangup, closed) = {
                let mut fds = vec![self.listener.as_fd(), self.bell.as_fd()];
                fds.extend(apps.iter().map(|a| a.stream.as_fd()));
                fds.extend(
                    apps.iter()
                        .filter_map(|a| a.pidfd.as_ref().map(|p| p.as_fd())),
                );
                fds.extend(sh.kernel_listeners());
                fds.extend(pending.iter().map(|p| p.0.as_fd()));
                let ds: Vec<_> = sh.placeholders().map(|(_, d)| d).collect();
                let (r, h) = flowstack_sys::placeholder::poll_sets(&fds, &ds, Some(wait))?;
                (r, h.iter().any(|&x| x))
            };
            for a in &apps {
                a.set_sleeping(false);
            }
            last_accept = None;
            let _ = self.bell.take();
            let pidfds = apps.iter().filter(|a| a.pidfd.is_some()).count();
            if hangup.iter().skip(2).take(apps.len() + pidfds).any(|&r| r) {
                reap(&mut apps, &mut sh, false);
            }
            if closed {
                last_closes(&mut sh, &mut apps)?;
            }
        }
        for mut a in apps.drain(..) {
            a.release_all(&mut sh);
        }
        sh.lo.poll(clock.now());
        let _ = std::fs::remove_file(&self.path);
        Ok(())
    }

    /// Accepts connections on the unix socket; each waits in `pending` for its first 8
    /// bytes ([`stats::REGISTER`] or [`stats::STATS_REQUEST`]).
    fn accept_conns(&self, pending: &mut Vec<(UnixStream, Instant)>) -> bool {
        let mut any = false;
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    any = true;
                    if pending.len() < MAX_APPS && s.set_nonblocking(true).is_ok() {
                        pending.push((s, Instant::now()));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return any,
            }
        }
    }

    /// Serves connections whose first bytes arrived: registration or a stats query.
    fn serve_pending(
        &self,
        pending: &mut Vec<(UnixStream, Instant)>,
        apps: &mut Vec<App>,
        sh: &mut Shared,
        next_app: &mut u64,
    ) -> bool {
        use std::io::Read;
        let mut any = false;
        let mut i = 0;
        while i < pending.len() {
            let mut tag = [0u8; 8];
            // Tags are written in one call; a connection that sends fewer bytes is dropped
            // (at its timeout, or now if it sent something else).
            let r = flowstack_sys::placeholder::peek_len(pending[i].0.as_fd(), &mut tag);
            let expired = pending[i].1.elapsed() >= PENDING_TIMEOUT;
            match r {
                Some(8) => {}
                Some(0) => {
                    pending.swap_remove(i); // it hung up
                    continue;
                }
                _ if !expired => {
                    i += 1;
                    continue;
                }
                _ => {
                    pending.swap_remove(i);
                    continue;
                }
            }
            let (mut s, _) = pending.swap_remove(i);
            any = true;
            let _ = s.read_exact(&mut tag);
            if &tag == stats::STATS_REQUEST {
                let json = serde_json::to_vec(&app::snapshot(sh, apps)).unwrap_or_default();
                let _ = s.set_nonblocking(false);
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = std::io::Write::write_all(&mut s, &json);
            } else if &tag == stats::REGISTER {
                self.register(s, apps, sh, next_app);
            }
        }
        any
    }

    fn register(
        &self,
        stream: UnixStream,
        apps: &mut Vec<App>,
        sh: &mut Shared,
        next_app: &mut u64,
    ) {
        if apps.len() >= MAX_APPS {
            sh.counters.apps_refused += 1;
            return; // dropped: the client sees the socket close
        }
        let Ok((pid, uid, _)) = flowstack_sys::socket::peer_cred(&stream) else {
            sh.counters.apps_refused += 1;
            return;
        };
        let id = *next_app;
        *next_app += 1;
        let Ok(app) = App::new(id, pid, uid, stream) else {
            return;
        };
        let sent = flowstack_sys::fdpass::send_fds(
            &app.stream,
            layout::HELLO,
            &[app.region.fd(), self.bell.as_fd()],
        );
        if sent.is_ok() {
            sh.counters.apps_registered += 1;
            apps.push(app);
        }
    }
}

/// How long a new connection may take to say what it wants.
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a busy daemon looks for placeholders closed everywhere (an idle one is woken
/// by them).
pub const LAST_CLOSE_CHECK: Duration = Duration::from_millis(5);

/// Closes every socket whose placeholder's last copy is gone; true if any.
///
/// Whatever an application posted before closing its last copy (sends, consumed bytes) is
/// in its ring by then: every ring is drained first, so the close comes after it.
fn last_closes(sh: &mut Shared, apps: &mut [App]) -> io::Result<bool> {
    let (gids, ds): (Vec<u32>, Vec<_>) = sh.placeholders().unzip();
    if ds.is_empty() {
        return Ok(false);
    }
    let (_, h) = flowstack_sys::placeholder::poll_sets(&[], &ds, Some(Duration::ZERO))?;
    let gone: Vec<u32> = gids
        .into_iter()
        .zip(h)
        .filter_map(|(g, x)| x.then_some(g))
        .collect();
    if gone.is_empty() {
        return Ok(false);
    }
    for a in apps.iter_mut() {
        for _ in 0..64 {
            if a.drain_commands(sh) == 0 {
                break;
            }
        }
    }
    for &g in &gone {
        sh.counters.last_closes += 1;
        sh.release(g, false);
    }
    Ok(!gone.is_empty())
}

/// Drops applications that hung up, died or broke their rings.
fn reap(apps: &mut Vec<App>, sh: &mut Shared, check_pids: bool) {
    let mut i = 0;
    while i < apps.len() {
        let a = &apps[i];
        let exited = match &a.pidfd {
            Some(p) => flowstack_sys::poll::wait_readable(p, Duration::ZERO).unwrap_or(false),
            None => check_pids && !flowstack_sys::process::is_alive(a.pid),
        };
        let gone = a.broken || hung_up(&a.stream) || exited;
        if gone {
            let mut a = apps.swap_remove(i);
            if !a.broken {
                // What it posted before leaving still counts (consumed bytes above all: a
                // socket closed with nothing unread ends with FIN, not RST).
                for _ in 0..64 {
                    if a.drain_commands(sh) == 0 {
                        break;
                    }
                }
            }
            a.release_all(sh);
        } else {
            i += 1;
        }
    }
}

fn hung_up(s: &UnixStream) -> bool {
    // Peek only: the stream also carries the descriptors of `Attach` records.
    flowstack_sys::placeholder::peer_closed(s.as_fd())
}
