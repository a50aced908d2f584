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

#[cfg(test)]
mod tests {
    use super::*;

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
