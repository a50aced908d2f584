//! The shim's per-process state: configuration from the environment, the descriptor table,
//! the daemon connection, reference counts, the signal dispositions it learnt, and reports.

use crate::addr::Reason;
use crate::backend::{self, Backend};
use crate::real;
use crate::table::{SockId, Table};
use flowstack_api::ids::IdMap;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// How `sendfile(2)` sends a regular file to a flowstack socket (`FLOWSTACK_SENDFILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendfileMode {
    /// Default: small files read here and written, larger ones read by the daemon.
    Auto,
    /// `copy`: every file read here and written (for comparisons).
    Copy,
    /// `daemon`: every file read by the daemon, small ones too.
    Daemon,
}

/// What `FLOWSTACK_*` said when the process started.
#[derive(Debug, Clone)]
pub struct Config {
    /// `FLOWSTACK_FALLBACK=error`: socket() fails when the daemon is unreachable.
    pub fail_without_daemon: bool,
    /// `FLOWSTACK_KERNEL_LISTEN` (default on): listeners also listen in the kernel.
    pub kernel_listen: bool,
    /// `FLOWSTACK_DISABLE=1`: every socket on the kernel (the shim only observes).
    pub disabled: bool,
    /// `FLOWSTACK_REPORT=PATH`: one line per socket decision appended there.
    pub report: Option<std::ffi::CString>,
    /// `FLOWSTACK_SENDFILE`: how sendfile(2) sends regular files (`crate::sendfile`).
    pub sendfile: SendfileMode,
    /// The environment entries exec must keep (`LD_PRELOAD=…`, `FLOWSTACK_*=…`).
    pub keep_env: Vec<std::ffi::CString>,
}

impl Config {
    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok();
        let keep_env = std::env::vars_os()
            .filter(|(k, _)| {
                let k = k.to_string_lossy();
                (k == "LD_PRELOAD" || k.starts_with("FLOWSTACK_")) && k != "FLOWSTACK_FDS"
            })
            .filter_map(|(k, v)| {
                let mut s = k.into_encoded_bytes();
                s.push(b'=');
                s.extend(v.into_encoded_bytes());
                std::ffi::CString::new(s).ok()
            })
            .collect();
        Config {
            fail_without_daemon: var("FLOWSTACK_FALLBACK").as_deref() == Some("error"),
            kernel_listen: var("FLOWSTACK_KERNEL_LISTEN").as_deref() != Some("0"),
            disabled: var("FLOWSTACK_DISABLE").as_deref() == Some("1"),
            report: var("FLOWSTACK_REPORT").and_then(|p| std::ffi::CString::new(p).ok()),
            sendfile: match var("FLOWSTACK_SENDFILE").as_deref() {
                Some("copy") => SendfileMode::Copy,
                Some("daemon") => SendfileMode::Daemon,
                _ => SendfileMode::Auto,
            },
            keep_env,
        }
    }
}

/// The process's shim state.
pub struct State {
    /// Descriptor → placeholder.
    pub table: Table,
    /// Descriptors per socket in this process (dup): `forget` at the last close.
    refs: Mutex<IdMap<SockId, u32>>,
    backend: OnceLock<Result<&'static dyn Backend, String>>,
    /// The environment's settings.
    pub cfg: Config,
    said_no_daemon: AtomicBool,
    /// Sockets through flowstack, and on the kernel per reason (index: `Reason as usize`).
    pub via_flowstack: AtomicU64,
    /// Kernel sockets per reason.
    pub via_kernel: [AtomicU64; 16],
}

static STATE: OnceLock<State> = OnceLock::new();

thread_local! {
    /// Set while this thread is inside the daemon API or the shim's own set-up: every
    /// interposed call made meanwhile (by the posix layer or the Rust standard library) goes
    /// straight to the C library.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// The state if any socket was ever seen (no placeholder can exist otherwise).
#[inline]
pub fn get() -> Option<&'static State> {
    STATE.get()
}

/// The state, created on first use.
pub fn state() -> &'static State {
    STATE.get_or_init(|| {
        inside(|| State {
            table: Table::new(),
            refs: Mutex::new(IdMap::default()),
            backend: OnceLock::new(),
            cfg: Config::from_env(),
            said_no_daemon: AtomicBool::new(false),
            via_flowstack: AtomicU64::new(0),
            via_kernel: Default::default(),
        })
    })
}

/// True while this thread is inside the shim's own machinery.
#[inline]
pub fn is_inside() -> bool {
    INSIDE.with(|c| c.get())
}

/// Runs `f` with interposition off for this thread (restored on unwind too).
pub fn inside<R>(f: impl FnOnce() -> R) -> R {
    with_inside(true, f)
}

/// Runs `f` with interposition on: the shim's sleeps, where a signal handler may run (and
/// may even `longjmp` out, leaving the flag as the application expects it).
pub fn outside<R>(f: impl FnOnce() -> R) -> R {
    with_inside(false, f)
}

fn with_inside<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            INSIDE.with(|c| c.set(self.0));
            if !self.0 {
                // Leaving the shim: signals that arrived meanwhile are delivered now.
                crate::sig::flush_deferred();
            }
        }
    }
    let _restore = Restore(INSIDE.with(|c| c.replace(on)));
    if !on {
        crate::sig::flush_deferred();
    }
    f()
}

impl State {
    /// The daemon API, connected on first use; `Err` says why not (printed once).
    pub fn backend(&self) -> Result<&'static dyn Backend, &str> {
        let r = self.backend.get_or_init(|| inside(backend::connect));
        match r {
            Ok(b) => Ok(*b),
            Err(m) => {
                if !self.said_no_daemon.swap(true, Ordering::Relaxed) {
                    let then = if self.cfg.fail_without_daemon {
                        "IPv4 sockets fail (FLOWSTACK_FALLBACK=error)"
                    } else {
                        "all sockets use the kernel"
                    };
                    say(&format!("flowstack: {m}; {then}"));
                }
                Err(m)
            }
        }
    }

    /// Unit tests: this backend instead of the daemon's (once per process).
    #[cfg(test)]
    pub(crate) fn set_backend(&self, b: &'static dyn Backend) -> bool {
        self.backend.set(Ok(b)).is_ok()
    }

    /// The backend if already connected (never connects).
    pub fn connected(&self) -> Option<&'static dyn Backend> {
        self.backend.get().and_then(|r| r.as_ref().ok().copied())
    }

    /// One more descriptor for `id`.
    pub fn hold(&self, id: SockId) {
        let mut m = self.refs.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(id).or_insert(0) += 1;
    }

    /// One descriptor fewer for `id`; the daemon API forgets the socket at the last one
    /// (then true).
    pub fn release(&self, id: SockId) -> bool {
        let last = {
            let mut m = self.refs.lock().unwrap_or_else(|p| p.into_inner());
            match m.get_mut(&id) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    m.remove(&id);
                    true
                }
            }
        };
        if last {
            if let Some(b) = self.connected() {
                inside(|| b.forget(id));
            }
        }
        last
    }

    /// Records that a socket went through flowstack (`how`: socket, accept, adopt).
    pub fn note_flowstack(&self, fd: i32, how: &str) {
        self.via_flowstack.fetch_add(1, Ordering::Relaxed);
        self.emit(fd, "flowstack", how);
    }

    /// Records that a socket is on the kernel and why (`moved`: it was a placeholder first);
    /// the daemon hears of it for `flowstack stats`.
    pub fn note_kernel(&self, fd: i32, why: Reason, moved: bool) {
        if let Some(c) = self.via_kernel.get(why as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let (Some(b), Reason::NotCarried | Reason::Ipv6 | Reason::V6Only) =
            (self.connected(), why)
        {
            inside(|| b.report(why, None));
        }
        self.emit(fd, if moved { "moved" } else { "kernel" }, why.name());
    }

    fn emit(&self, fd: i32, path: &str, why: &str) {
        let Some(file) = &self.cfg.report else {
            return;
        };
        inside(|| {
            let line = format!("{}\t{}\t{fd}\t{path}\t{why}\n", std::process::id(), comm());
            // SAFETY: `file` is a NUL-terminated path; the descriptor is ours and closed
            // before returning; `line` outlives the write.
            unsafe {
                let fd = real::sys(
                    libc::SYS_openat,
                    [
                        libc::AT_FDCWD as usize,
                        file.as_ptr() as usize,
                        (libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC)
                            as usize,
                        0o600,
                        0,
                        0,
                    ],
                );
                if fd >= 0 {
                    real::write(fd as i32, line.as_ptr().cast(), line.len());
                    real::close(fd as i32);
                }
            }
        });
    }
}

static UNKNOWN_OPTIONS: AtomicU64 = AtomicU64::new(0);

/// Counts a socket option flowstack does not know (answered by a kernel socket instead).
pub fn count_unknown_option() {
    UNKNOWN_OPTIONS.fetch_add(1, Ordering::Relaxed);
}

/// Socket options answered by the kernel's scratch socket so far.
pub fn unknown_options() -> u64 {
    UNKNOWN_OPTIONS.load(Ordering::Relaxed)
}

/// Set in the child of a fork: the daemon API's socket ids are the parent's until the
/// placeholders are adopted again (done on the next placeholder call).
static STALE: AtomicBool = AtomicBool::new(false);

/// Marks this (child) process's ids stale.
pub fn mark_forked() {
    STALE.store(true, Ordering::Release);
}

/// After a fork: adopts every placeholder of the table under its new id (once).
#[inline]
pub fn readopt_if_forked(st: &State) {
    if STALE.load(Ordering::Acquire) && STALE.swap(false, Ordering::AcqRel) {
        inside(|| st.readopt());
    }
}

impl State {
    fn readopt(&self) {
        self.refs.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let Some(b) = self.connected() else { return };
        b.after_fork();
        let all: Vec<(i32, crate::table::Entry)> = self
            .table
            .in_range(0, crate::table::MAX_FDS as u32)
            .collect();
        let mut ids: HashMap<SockId, SockId> = HashMap::new();
        for (fd, e) in all {
            let id = match ids.get(&e.id) {
                Some(&id) => Some(id),
                None => b.adopt(fd),
            };
            match id {
                Some(id) => {
                    ids.insert(e.id, id);
                    self.table.set(fd, crate::table::Entry { id, ..e });
                    self.hold(id);
                }
                None => {
                    self.table.clear(fd);
                    say(&format!(
                        "flowstack: pid {}: descriptor {fd} inherited from the parent is no \
                         longer a flowstack socket here (cannot attach to the daemon after \
                         fork: is its socket reachable by this user?)",
                        std::process::id()
                    ));
                }
            }
        }
    }
}

/// The process's command name (`/proc/self/comm`).
fn comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().replace(['\t', '\n'], " "))
        .unwrap_or_else(|_| "?".into())
}

/// Writes one line to stderr (no allocation-free guarantee; used once per process).
pub fn say(msg: &str) {
    let line = format!("{msg}\n");
    // SAFETY: writes `line`'s bytes to descriptor 2; a failure is ignored.
    unsafe {
        real::write(2, line.as_ptr().cast(), line.len());
    }
}

/// Signal dispositions learnt from sigaction/signal: which signals have handlers, and which
/// of those were installed without `SA_RESTART`.
pub mod signals {
    use std::sync::atomic::{AtomicU64, Ordering};

    static HANDLED: AtomicU64 = AtomicU64::new(0);
    static NO_RESTART: AtomicU64 = AtomicU64::new(0);

    /// Records the disposition of `sig`: `handler` false for SIG_DFL/SIG_IGN.
    pub fn learn(sig: i32, handler: bool, restart: bool) {
        if !(1..64).contains(&sig) {
            return;
        }
        let bit = 1u64 << sig;
        if handler {
            HANDLED.fetch_or(bit, Ordering::Relaxed);
        } else {
            HANDLED.fetch_and(!bit, Ordering::Relaxed);
        }
        if restart {
            NO_RESTART.fetch_and(!bit, Ordering::Relaxed);
        } else {
            NO_RESTART.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Whether a blocking call interrupted by a handled signal restarts. The shim does not
    /// know which signal interrupted its poll, so it restarts only if every installed handler
    /// asked for `SA_RESTART` (deviation: the kernel decides per signal).
    pub fn restart() -> bool {
        HANDLED.load(Ordering::Relaxed) & NO_RESTART.load(Ordering::Relaxed) == 0
    }

    /// Whether a call interrupted by `sig` restarts: its handler asked for `SA_RESTART`.
    pub fn restarts(sig: i32) -> bool {
        !(1..64).contains(&sig) || NO_RESTART.load(Ordering::Relaxed) & (1u64 << sig) == 0
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn restart_only_when_every_handler_asked_for_it() {
            assert!(restart());
            learn(10, true, true);
            assert!(restart());
            learn(12, true, false);
            assert!(!restart());
            learn(12, false, false);
            assert!(restart(), "SIG_DFL again: no handler without SA_RESTART");
            learn(99, true, false);
            assert!(restart(), "out-of-range signals are ignored");
        }
    }
}
