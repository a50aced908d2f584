//! Processes: is the peer of a shared region still there? And `fork` for tests of
//! process-shared sockets.

use rustix::process::{test_kill_process, Pid};

/// True if a process with id `pid` exists (it may belong to another user). `pid` typically
/// comes from shared memory, so it is untrusted: 0, or a value that is not a positive `pid_t`
/// (which `kill(2)` would read as a process group or "every process"), is reported as not
/// alive rather than probed.
pub fn is_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .and_then(Pid::from_raw)
    else {
        return false;
    };
    // Signal 0 only checks for existence; EPERM means it exists but is not ours.
    !matches!(test_kill_process(pid), Err(rustix::io::Errno::SRCH))
}

/// A pidfd for process `pid` (`pidfd_open(2)`): readable once the process has exited, and
/// naming that process only (no pid reuse). `pid` is untrusted (as for [`is_alive`]).
pub fn pidfd(pid: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    let p = i32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    Ok(rustix::process::pidfd_open(
        p,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// This process's id without a system call per query (glibc no longer caches `getpid`):
/// cached on first use and forgotten in the child of every `fork` (a `pthread_atfork` child
/// handler), so a forked child sees its own id. (A child made by a raw `clone` system call
/// runs no fork handlers and would see its parent's id.)
#[allow(unsafe_code)]
pub fn cached_pid() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static PID: AtomicU32 = AtomicU32::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget_in_child() {
        PID.store(0, Ordering::Relaxed);
    }
    HOOK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic (async-signal-safe, as a
        // fork handler in a multi-threaded process must be).
        unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
    });
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = std::process::id();
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// The calling thread's kernel id (`gettid(2)`).
pub fn thread_id() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

/// CPU time (user + system) of process `pid`, or of its thread `tid`, from `/proc` (10 ms
/// resolution: `USER_HZ` is 100 on every Linux architecture).
pub fn cpu_time(pid: u32, tid: Option<u32>) -> std::io::Result<std::time::Duration> {
    let path = match tid {
        Some(t) => format!("/proc/{pid}/task/{t}/stat"),
        None => format!("/proc/{pid}/stat"),
    };
    let s = std::fs::read_to_string(path)?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = s
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| std::io::Error::other("unreadable stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime and stime are fields 14 and 15.
    let tick = |i: usize| -> std::io::Result<u64> {
        f.get(i - 3)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| std::io::Error::other("unreadable stat"))
    };
    Ok(std::time::Duration::from_millis(
        (tick(14)? + tick(15)?) * 10,
    ))
}

/// Which side of a [`fork`] we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The new process.
    Child,
    /// The caller, with the child's pid.
    Parent(u32),
}

/// `fork(2)`. In a multi-threaded caller the child has only the calling thread: it must not
/// wait for locks other threads held at the time (tests use it with that care, then leave
/// with [`exit_now`]).
#[allow(unsafe_code)]
pub fn fork() -> std::io::Result<Forked> {
    // SAFETY: fork(2) has no memory-safety preconditions; the child continues with a copy of
    // this thread's state only, which the caller accounts for (documented above).
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        p => Ok(Forked::Parent(p as u32)),
    }
}

/// `_exit(2)`: leaves at once without running exit handlers (the way out of a forked child).
#[allow(unsafe_code)]
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes a plain integer and never returns; no Rust state is used after it.
    unsafe { libc::_exit(code) }
}

/// Waits for child `pid` and returns its exit code (or 128 + signal).
pub fn wait_exit(pid: u32) -> std::io::Result<i32> {
    let p = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    loop {
        match rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, st))) => {
                if let Some(c) = st.exit_status() {
                    return Ok(c);
                }
                if let Some(s) = st.terminating_signal() {
                    return Ok(128 + s);
                }
            }
            Ok(None) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Stops (`stop`: SIGSTOP) or resumes (SIGCONT) process `pid`, for tests of a peer that does
/// not run. `pid` 0 or beyond `pid_t` is refused (`EINVAL`) rather than read by kill(2) as a
/// process group.
pub fn pause(pid: u32, stop: bool) -> std::io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::from_raw_os_error(22))?;
    let sig = if stop {
        rustix::process::Signal::STOP
    } else {
        rustix::process::Signal::CONT
    };
    Ok(rustix::process::kill_process(pid, sig)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_pid_is_the_childs_own_after_fork() {
        let parent = cached_pid();
        assert_eq!(parent, std::process::id());
        match fork().unwrap() {
            // The child checks its own id (exit 0) against the parent's cached one (exit 1).
            Forked::Child => exit_now(if cached_pid() == std::process::id() {
                0
            } else {
                1
            }),
            Forked::Parent(child) => {
                assert_ne!(child, parent);
                assert_eq!(wait_exit(child).unwrap(), 0, "the child saw a stale pid");
                assert_eq!(cached_pid(), parent);
            }
        }
    }

    #[test]
    fn this_process_is_alive() {
        assert!(is_alive(std::process::id()));
    }

    #[test]
    fn reaped_child_is_not() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!is_alive(pid));
    }

    #[test]
    fn cpu_time_of_this_thread_grows_with_work() {
        let me = (std::process::id(), Some(thread_id()));
        let t0 = cpu_time(me.0, me.1).unwrap();
        let start = std::time::Instant::now();
        let mut x = 1u64;
        while cpu_time(me.0, me.1).unwrap() < t0 + std::time::Duration::from_millis(20) {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
            assert!(start.elapsed().as_secs() < 30, "no CPU time counted ({x})");
        }
        assert!(cpu_time(me.0, None).unwrap() >= cpu_time(me.0, me.1).unwrap());
    }

    #[test]
    fn a_pidfd_becomes_readable_when_its_process_exits() {
        use std::os::fd::AsFd;
        let mut c = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let fd = pidfd(c.id()).unwrap();
        let ready = |t| crate::poll::wait_readable(&fd.as_fd(), t).unwrap();
        assert!(!ready(std::time::Duration::ZERO));
        c.wait().unwrap();
        assert!(ready(std::time::Duration::from_secs(10)));
        assert!(pidfd(0).is_err());
    }

    #[test]
    fn a_forked_child_exits_with_its_code() {
        match fork().unwrap() {
            Forked::Child => exit_now(7),
            Forked::Parent(pid) => assert_eq!(wait_exit(pid).unwrap(), 7),
        }
    }

    #[test]
    fn hostile_values_are_not_probed() {
        assert!(!is_alive(0));
        assert!(!is_alive(u32::MAX)); // -1: every process
        assert!(!is_alive(1 << 31));
    }
}
