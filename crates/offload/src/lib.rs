//! `flowstackd`: the TCP/IP stack as a service that applications reach through shared memory
//! (seeds 001, 002, 004; the "Offload mode" paragraph of the design).
//!
//! The daemon owns the engines — its own loopback interface on 127.0.0.0/8 ([`loopback`]),
//! which needs no privileges, and optionally a real link ([`DaemonConfig::link`]: one more
//! engine per engine thread, each on its own queue of the link) — and a unix socket where
//! applications register. It runs one engine thread by default, or one per CPU of `--cores`
//! (pinned) or `--engines N` (unpinned): each serves the applications assigned to it
//! (registry.rs: round robin, a process's children and exec'd images with it) with its own
//! engine, sockets, doorbell and sleep; a connection between applications of two engines
//! runs over the mesh rings between them ([`loopback`]), and the port namespace is one for
//! the whole daemon ([`ports`]). Each application gets a sealed memfd ([`layout`]) with a command
//! ring, an event ring and two data areas, plus the daemon's doorbell eventfd, and talks to it
//! with `flowstack-client`.
//!
//! # The loop of an engine thread ([`Daemon::run`], engine.rs)
//! Engine 0 also accepts registrations and stats queries (registry.rs). Every engine
//! drains its applications' command rings (validated record by record, see
//! [`app`](self)); runs its engine; moves bytes between the engine and the applications'
//! areas and posts events; then, if nothing moved, sleeps: it announces it in every one of
//! its applications' headers (`daemon_sleeping`) and on its mesh doorbell, fences, checks
//! every command ring and mesh ring once more, and `poll(2)`s its doorbell eventfd, its
//! applications' sockets (engine 0: and the unix listener) until its engine's next
//! deadline. An application that posts after reading the announcement, or another engine
//! that sends it frames, signals the eventfd, so nothing waits for a timeout; an idle engine
//! makes no system call but a `poll` every [`IDLE_CHECK`] (for process liveness).
//!
//! # Faults
//! An application whose registration socket hangs up, whose process is gone (its pidfd
//! becomes readable, which wakes its sleeping engine; without pidfds the pid is checked
//! every [`IDLE_CHECK`]) — also when the socket leaked into a child — or whose rings hold
//! values no honest client writes is dropped by its engine: its connections are reset or
//! closed as the kernel would on exit, its ports freed daemon-wide, its region unmapped.
//! Nothing an application writes reaches another engine but the frames of its connections,
//! which its engine built. If one engine thread fails, the whole daemon stops (every
//! application's blocked calls then fail as on the daemon's death).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod app;
mod engine;
pub mod layout;
pub mod loopback;
pub mod ports;
mod registry;
pub mod stats;
pub mod udp_ports;

pub use app::{AppStats, DaemonCounters, EPHEMERAL};

use app::Shared;
use engine::EngineLoop;
use flowstack_runtime::xring::{Doorbell, Mesh, RingSpec, Wake};
use flowstack_runtime::{AddrSpec, LinkSpec, Waitable};
use flowstack_runtime::{Queue, Steered};
use flowstack_sys::eventfd::EventFd;
use ports::PortTable;
use registry::{Control, Peer, Registry};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    /// CPU to pin the daemon's (only) engine thread to (`--cpu`, an alias of a one-CPU
    /// `cores`); `None` leaves it unpinned. Ignored when `cores` is not empty.
    pub cpu: Option<usize>,
    /// One engine thread per CPU listed, pinned to it (`--cores LIST`).
    pub cores: Vec<usize>,
    /// Engine threads when `cores` is empty (`--engines N`, unpinned); at least one.
    pub engines: usize,
    /// Assign every application round robin, even one whose process (or parent) has one
    /// registered already (`--spread`): for a process whose threads register one
    /// application each and share no sockets (a thread-per-core server, a benchmark).
    pub spread: bool,
    /// A real link the daemon owns beside its loopback (`--tap`, `--packet`, `--xdp`,
    /// `--shm-fd` with `--ip`): connections to its subnet (or through its gateway) leave
    /// through it, listeners on 0.0.0.0 or its address accept on it. With several engines
    /// each owns one queue of it, and frames are steered to the engine that owns their
    /// destination port ([`ports`]).
    pub link: Option<LinkSpec>,
    /// Most bytes the sockets of one application may hold queued in the daemon (send and
    /// receive queues, `--max-app-memory`): above it new sockets are refused with `ENOBUFS`
    /// and its sends stall until its queues drain (`FlowstackdAppMemLimited`).
    pub max_app_memory: u64,
    /// Bytes of an application's transmit area that bulk sends sent from it without a copy
    /// may hold (unacknowledged) before the oldest are copied out of it (`app::txzc`,
    /// `FlowstackdTxRehomedBytes`); default [`TX_HOLD_LIMIT`]. Not a command-line option:
    /// tests set it to `u64::MAX` to keep spans pinned.
    pub tx_hold_limit: u64,
    /// Bytes one way before a connection between two applications is fused (`--fuse-after`;
    /// `app::fuse`); default [`FUSE_AFTER`].
    pub fuse_after: u64,
    /// A fused connection's pipe bytes per direction (`--fuse-pipe`); 0: no fusing. Default
    /// [`FUSE_CAP`].
    pub fuse_pipe: u64,
    /// Bytes all live pipes may take (`--fuse-memory`), shared out equally among the
    /// engines; a connection that would pass it is not fused. Default [`FUSE_MEMORY`].
    pub fuse_memory: u64,
    /// Permission bits of the registration socket (`--socket-mode`), set right after bind;
    /// default [`DEFAULT_SOCKET_MODE`]: every local user may connect, as every user may use
    /// the kernel's loopback (a server's workers often run as another user than the master
    /// that started them). The directory's own permissions still apply.
    pub socket_mode: u32,
}

/// Default of [`DaemonConfig::socket_mode`]: `0o666`.
pub const DEFAULT_SOCKET_MODE: u32 = 0o666;

pub use app::{FUSE_AFTER, FUSE_CAP, FUSE_MEMORY, TX_HOLD_LIMIT};

/// Default of [`DaemonConfig::max_app_memory`]: 256 MiB, the full send and receive buffers
/// (1 MiB each) of 128 connections.
pub const DEFAULT_MAX_APP_MEMORY: u64 = 256 << 20;

/// Why the daemon cannot take a link.
#[derive(Debug)]
pub enum LinkError {
    /// The device could not be opened (privileges, no such interface), or cannot give one
    /// queue per engine (the shm wire, `--pcap` with several engines: `Unsupported`).
    Open(flowstack_runtime::link::LinkError),
}

impl LinkError {
    /// The request cannot be served as asked (a usage error, not a runtime failure).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            LinkError::Open(flowstack_runtime::link::LinkError::Unsupported(_))
        )
    }
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Open(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LinkError {}

impl DaemonConfig {
    /// Opens the link (if any): one device for one engine, else one queue per engine
    /// (`LinkSpec::open_queues`: multi-queue TAP, AF_PACKET fanout, AF_XDP queues). Empty
    /// without a link.
    /// Each comes with the descriptor its engine sleeps on when idle, where the driver has
    /// one (`Waitable`).
    pub fn open_link(&self) -> Result<Vec<Waitable>, LinkError> {
        let Some(spec) = &self.link else {
            return Ok(Vec::new());
        };
        match self.placement().len() {
            1 => spec.open_device_waitable().map(|d| vec![d]),
            n => spec.open_queues_waitable(n),
        }
        .map_err(LinkError::Open)
    }
}

impl DaemonConfig {
    /// Where each engine thread runs: `cores` if given, else `engines` threads (the first
    /// pinned to `cpu` if given).
    pub fn placement(&self) -> Vec<Option<usize>> {
        if !self.cores.is_empty() {
            return self.cores.iter().map(|&c| Some(c)).collect();
        }
        let mut p = vec![None; self.engines.clamp(1, ports::MAX_ENGINES)];
        p[0] = self.cpu;
        p
    }

    /// The spin to use when none is asked for (`--spin-us` not given): [`DEFAULT_SPIN`]
    /// when the engines have CPUs of their own — pinned (`--cpu`, `--cores`), or more
    /// CPUs available to the process (`sched_getaffinity`) than engine threads plus one —
    /// else zero. On a host with no CPU to spare the daemon and the applications take turns
    /// on the same CPUs, and a spinning daemon takes the time the application it waits for
    /// needs: on 2 vCPUs, wrk against nginx (both under `flowstack run`) made 72–76 k
    /// requests/s with a 50 µs spin and 95–111 k with none (`scripts/bench-apps.sh`, README).
    pub fn auto_spin(&self, available_cpus: usize) -> Duration {
        let placement = self.placement();
        let pinned = placement.iter().all(|c| c.is_some());
        if pinned || available_cpus > placement.len() + 1 {
            DEFAULT_SPIN
        } else {
            Duration::ZERO
        }
    }
}

/// Bytes of frame data in each ring between two engines (up to four engines): a window's
/// worth of the loopback's 64 KiB segments, so a burst between two engines is not dropped at
/// the ring. With more engines each ring gets [`MESH_RING_BYTES_MANY`] (the rings are
/// `n·(n-1)`; their pages are only backed once used).
pub const MESH_RING_BYTES: usize = 8 << 20;
/// Bytes of each ring between engines with more than four engines.
pub const MESH_RING_BYTES_MANY: usize = 2 << 20;

/// Default of [`DaemonConfig::spin`], and the daemon's spin when its engines have CPUs of
/// their own ([`DaemonConfig::auto_spin`]).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            socket: default_socket_path(),
            max_sockets_per_app: 65536,
            spin: DEFAULT_SPIN,
            cpu: None,
            cores: Vec::new(),
            engines: 1,
            spread: false,
            link: None,
            max_app_memory: DEFAULT_MAX_APP_MEMORY,
            tx_hold_limit: TX_HOLD_LIMIT,
            fuse_after: FUSE_AFTER,
            fuse_pipe: FUSE_CAP,
            fuse_memory: FUSE_MEMORY,
            socket_mode: DEFAULT_SOCKET_MODE,
        }
    }
}

/// A bound daemon, ready to [`run`](Daemon::run).
pub struct Daemon {
    listener: UnixListener,
    max_sockets_per_app: usize,
    spin: Duration,
    /// Each engine thread's CPU.
    placement: Vec<Option<usize>>,
    spread: bool,
    path: PathBuf,
    /// Each engine thread's doorbell eventfd.
    bells: Vec<Arc<EventFd>>,
    tids: Arc<[AtomicU32]>,
    /// The real link's devices (one per engine) and addresses.
    link: Option<(Vec<Waitable>, AddrSpec)>,
    max_app_memory: u64,
    tx_hold_limit: u64,
    fuse_after: u64,
    fuse_pipe: u64,
    fuse_memory: u64,
}

/// A daemon running on its own thread ([`Daemon::spawn`]); stops and joins on drop.
pub struct DaemonHandle {
    stop: Arc<AtomicBool>,
    tids: Arc<[AtomicU32]>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    bell_fd: Option<std::os::fd::OwnedFd>,
    /// Where applications register.
    pub path: PathBuf,
}

impl DaemonHandle {
    /// Engine 0's thread's kernel id (for its CPU time in `/proc`), once it runs.
    pub fn thread_id(&self) -> Option<u32> {
        Some(self.tids[0].load(Ordering::SeqCst)).filter(|&t| t != 0)
    }

    /// Every engine thread's kernel id (0 for one not started yet).
    pub fn thread_ids(&self) -> Vec<u32> {
        self.tids.iter().map(|t| t.load(Ordering::SeqCst)).collect()
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
    /// daemon is replaced, a live daemon's is not) and opens the link, if any.
    pub fn bind(cfg: &DaemonConfig) -> io::Result<Self> {
        let devs = cfg.open_link().map_err(|e| {
            let kind = if e.is_usage() {
                io::ErrorKind::InvalidInput
            } else {
                io::ErrorKind::Other
            };
            io::Error::new(kind, e)
        })?;
        Self::bind_on(cfg, devs)
    }

    /// [`Daemon::bind`] with the link's devices already opened ([`DaemonConfig::open_link`]:
    /// one per engine).
    pub fn bind_on(cfg: &DaemonConfig, devs: Vec<Waitable>) -> io::Result<Self> {
        let link = match (devs.is_empty(), &cfg.link) {
            (true, None) => None,
            (false, Some(spec)) if devs.len() == cfg.placement().len() => Some((devs, spec.addr)),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a link needs its spec in the configuration and one device per engine",
                ))
            }
        };
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
        let placement = cfg.placement();
        let bells = (0..placement.len())
            .map(|_| EventFd::new().map(Arc::new))
            .collect::<io::Result<Vec<_>>>()?;
        let listener = UnixListener::bind(&path)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(cfg.socket_mode & 0o777),
            )?;
        }
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener,
            max_sockets_per_app: cfg.max_sockets_per_app.max(1),
            spin: cfg.spin,
            tids: placement.iter().map(|_| AtomicU32::new(0)).collect(),
            placement,
            spread: cfg.spread,
            path,
            bells,
            link,
            max_app_memory: cfg.max_app_memory,
            tx_hold_limit: cfg.tx_hold_limit,
            fuse_after: cfg.fuse_after,
            fuse_pipe: cfg.fuse_pipe,
            fuse_memory: cfg.fuse_memory,
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
        let bell_fd = d.bells[0].as_fd().try_clone_to_owned()?;
        let path = d.path.clone();
        let s = stop.clone();
        let tids = d.tids.clone();
        let thread = std::thread::Builder::new()
            .name("flowstackd".into())
            .spawn(move || d.run(&s))?;
        Ok(DaemonHandle {
            stop,
            tids,
            thread: Some(thread),
            bell_fd: Some(bell_fd),
            path,
        })
    }

    /// Runs until `stop` is set (checked at least every [`IDLE_CHECK`]); removes the socket
    /// file on the way out. Engine 0 runs on the calling thread, the others on threads of
    /// their own (`flowstackd-N`); they all stop when one fails.
    pub fn run(mut self, stop: &AtomicBool) -> io::Result<()> {
        let n = self.placement.len();
        let ports = Arc::new(PortTable::new(EPHEMERAL, n));
        let registry = Arc::new(Registry::default());
        let (mut los, bells) = if n == 1 {
            (vec![loopback::Loopback::new(1)], None)
        } else {
            let wakers = self
                .bells
                .iter()
                .map(|b| Some(b.clone() as Arc<dyn Wake>))
                .collect();
            let spec = RingSpec {
                capacity: if n <= 4 {
                    MESH_RING_BYTES
                } else {
                    MESH_RING_BYTES_MANY
                },
                ..RingSpec::default()
            };
            let mesh = Mesh::new("flowstackd-mesh", spec, wakers)?;
            let doorbells = mesh.doorbells();
            let los = mesh
                .into_ports()
                .into_iter()
                .enumerate()
                .map(|(i, p)| loopback::Loopback::routed(i, p, ports.clone()))
                .collect();
            (los, Some(doorbells))
        };
        if let Some((devs, addr)) = self.link.take() {
            attach_link(&mut los, devs, addr, &ports, &self.bells, bells.as_ref())?;
        }
        let mut engines = Vec::with_capacity(n);
        let mut peers = Vec::new();
        for (i, lo) in los.drain(..).enumerate() {
            let mut sh = Shared::new(i, lo, ports.clone())?;
            sh.max_sockets_per_app = self.max_sockets_per_app;
            sh.max_app_memory = self.max_app_memory;
            sh.tx_hold_limit = self.tx_hold_limit;
            sh.fuse_cap = self
                .fuse_pipe
                .clamp(flowstack_sys::pipe::MIN_CAP, flowstack_sys::pipe::MAX_CAP);
            sh.fuse_memory = self.fuse_memory / n.max(1) as u64;
            sh.fuse_after = match self.fuse_pipe {
                0 => u64::MAX,
                _ => self.fuse_after,
            };
            let inbox = if i == 0 {
                None
            } else {
                let (tx, rx) = std::sync::mpsc::channel();
                peers.push(Peer {
                    tx,
                    bell: self.bells[i].clone(),
                });
                Some(rx)
            };
            engines.push(EngineLoop {
                me: i,
                sh,
                apps: Vec::new(),
                bell: self.bells[i].clone(),
                bells: bells.clone(),
                inbox,
                spin: self.spin,
                registry: registry.clone(),
            });
        }
        let Daemon {
            listener,
            placement,
            path,
            bells: all_bells,
            tids,
            spread,
            ..
        } = self;
        let ctl = Control::new(listener, all_bells.clone(), peers, registry, spread);
        let start = |i: usize| -> io::Result<()> {
            tids[i].store(flowstack_sys::process::thread_id(), Ordering::SeqCst);
            if let Some(cpu) = placement[i] {
                flowstack_sys::affinity::pin_to_cpu(cpu)?;
            }
            Ok(())
        };
        let stop_all = || {
            stop.store(true, Ordering::SeqCst);
            for b in &all_bells {
                let _ = b.signal();
            }
        };
        let r = std::thread::scope(|s| {
            let mut it = engines.into_iter();
            let first = it.next().expect("at least one engine");
            let mut threads = Vec::new();
            for e in it {
                let i = e.me;
                let t = std::thread::Builder::new()
                    .name(format!("flowstackd-{i}"))
                    .spawn_scoped(s, move || {
                        let r = start(i).and_then(|_| e.run(None, stop));
                        if r.is_err() {
                            stop_all();
                        }
                        r
                    });
                match t {
                    Ok(t) => threads.push(t),
                    Err(e) => {
                        stop_all();
                        return Err(e);
                    }
                }
            }
            let r = start(0).and_then(|_| first.run(Some(ctl), stop));
            stop_all();
            let mut out = r;
            for t in threads {
                let r = t
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("engine thread panicked")));
                if out.is_ok() {
                    out = r;
                }
            }
            out
        });
        let _ = std::fs::remove_file(&path);
        r
    }
}

/// Gives each engine thread its queue of the link. With several, every queue is steered
/// (runtime `Steered`, its own mesh between the engines): a TCP frame goes to the engine that
/// owns its destination port in the daemon's port table (a listener's, or the connect slice
/// it was sent from), ARP requests to engine 0 and replies to all, whatever queue the kernel
/// put them on; each link engine connects from its own slice. The engines of the link's own
/// address get a mesh of their own, routed the same way and ringing the doorbells of the
/// loopback's mesh (`mesh_bells`), which every engine already announces its sleep on.
fn attach_link(
    los: &mut [loopback::Loopback],
    devs: Vec<Waitable>,
    addr: AddrSpec,
    ports: &Arc<PortTable>,
    bells: &[Arc<EventFd>],
    mesh_bells: Option<&Arc<[Doorbell]>>,
) -> io::Result<()> {
    let mesh_bells = match (los.len(), mesh_bells) {
        (1, _) => {
            for (lo, w) in los.iter_mut().zip(devs) {
                lo.attach_link(loopback::LinkDev::One(w.dev), addr, None, None);
                lo.set_link_wait(loopback::LinkWait {
                    fd: w.fd,
                    steer: None,
                });
            }
            return Ok(());
        }
        (_, Some(b)) => b.clone(),
        (_, None) => return Err(io::Error::other("several engines without a loopback mesh")),
    };
    // A frame steered to an engine that announced sleep on the steering mesh rings that
    // engine's doorbell eventfd, which its sleep polls.
    let mut fds = Vec::with_capacity(devs.len());
    let queues = devs
        .into_iter()
        .zip(bells)
        .map(|(w, b)| {
            fds.push(w.fd);
            Queue::with_waker(w.dev, b.clone() as Arc<dyn Wake>)
        })
        .collect();
    let spec = RingSpec {
        capacity: MESH_RING_BYTES_MANY,
        ..RingSpec::default()
    };
    let steered = Steered::group(queues, spec)?;
    let own = Mesh::with_doorbells("flowstackd-own", spec, mesh_bells)?.into_ports();
    for (i, (((lo, s), fd), own)) in los.iter_mut().zip(steered).zip(fds).zip(own).enumerate() {
        let p = ports.clone();
        let s = s.with_rule(Box::new(move |f| {
            loopback::tcp_dst_port(f).and_then(|port| p.route(port))
        }));
        let steer = Some((s.doorbells(), i));
        let d = loopback::LinkDev::Steered(Box::new(s));
        let slice = Some(ports.connect_slice(i));
        lo.attach_link(d, addr, slice, Some((own, ports.clone())));
        lo.set_link_wait(loopback::LinkWait { fd, steer });
    }
    Ok(())
}

/// How long a new connection may take to say what it wants.
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a busy daemon looks for placeholders closed everywhere (an idle one is woken
/// by them).
pub const LAST_CLOSE_CHECK: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spin_is_on_only_when_the_engines_have_cpus_of_their_own() {
        let mut c = DaemonConfig::default();
        // One engine: a spare CPU takes three.
        assert_eq!(c.auto_spin(1), Duration::ZERO);
        assert_eq!(c.auto_spin(2), Duration::ZERO);
        assert_eq!(c.auto_spin(3), DEFAULT_SPIN);
        c.engines = 2;
        assert_eq!(c.auto_spin(3), Duration::ZERO);
        assert_eq!(c.auto_spin(4), DEFAULT_SPIN);
        // Pinned: the operator gave the engines their CPUs.
        c.engines = 1;
        c.cpu = Some(1);
        assert_eq!(c.auto_spin(2), DEFAULT_SPIN);
        c.cpu = None;
        c.cores = vec![0, 1];
        assert_eq!(c.auto_spin(2), DEFAULT_SPIN);
    }
}
