//! CPU affinity of the calling thread: pin to one CPU (one engine per core), unpin, and the
//! CPUs there are and that the thread may use.
#![allow(unsafe_code)]

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use std::io;

/// Pins the calling thread to one CPU (for benchmarks and per-core engines).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "cpu {cpu} is beyond the largest CPU set ({})",
                CpuSet::MAX_CPU
            ),
        ));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set)?;
    Ok(())
}

/// Lets the calling thread run on every online CPU again (undoes [`pin_to_cpu`], whose mask a
/// child process inherits).
pub fn unpin() -> io::Result<()> {
    let mut set = CpuSet::new();
    for cpu in 0..cpu_count().min(CpuSet::MAX_CPU) {
        set.set(cpu);
    }
    sched_setaffinity(None, &set)?;
    Ok(())
}

/// Number of online CPUs (not this thread's affinity mask, which a pinned parent passes on to
/// its children; for that see [`allowed_cpus`]).
pub fn cpu_count() -> usize {
    // rustix offers no sysconf; std's available_parallelism counts the affinity mask.
    // SAFETY: sysconf takes a value and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// The CPUs the calling thread may run on, in increasing order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a fresh thread, so the test's own mask is left alone.
    fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn pin_then_unpin() {
        let first = allowed_cpus().unwrap()[0];
        let (pinned, unpinned) = on_thread(move || {
            pin_to_cpu(first).unwrap();
            let pinned = allowed_cpus().unwrap();
            unpin().unwrap();
            (pinned, allowed_cpus().unwrap())
        });
        assert_eq!(pinned, vec![first]);
        assert_eq!(unpinned.len(), cpu_count());
    }

    #[test]
    fn cpu_beyond_the_set_is_an_error_not_a_panic() {
        let e = pin_to_cpu(CpuSet::MAX_CPU).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn counts_are_sane() {
        let n = cpu_count();
        assert!(n >= 1);
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        assert!(allowed.windows(2).all(|w| w[0] < w[1]));
    }
}
