//! Processes: is the peer of a shared region still there?

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
    fn hostile_values_are_not_probed() {
        assert!(!is_alive(0));
        assert!(!is_alive(u32::MAX)); // -1: every process
        assert!(!is_alive(1 << 31));
    }
}
