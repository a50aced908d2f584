//! Futex wait and wake on an `AtomicU32`.
//!
//! These are the shared (not `FUTEX_PRIVATE`) operations, so the word may live in memory that
//! several processes map (a [`SharedRegion`](crate::SharedRegion)): the kernel keys the wait
//! queue on the page, not on this process's address.
//!
//! The usual protocol: the sleeper reads the word, announces that it sleeps (somewhere the
//! waker checks), checks its condition once more, then calls [`wait`] with the value it read;
//! the waker changes the word before calling [`wake`], so a wake that races the sleeper's
//! [`wait`] makes that call return at once ([`Wait::Changed`]).

use rustix::thread::futex::{self, Flags};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// How a [`wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A [`wake`] (or a spurious wake-up: callers re-check their condition).
    Woken,
    /// The word no longer held the expected value: nothing to wait for.
    Changed,
    /// The timeout passed.
    TimedOut,
    /// A signal interrupted the wait.
    Interrupted,
}

/// Sleeps while `word` holds `expected`, for at most `timeout` (`None`: no limit).
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> Wait {
    let ts = timeout.map(|t| futex::Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: t.subsec_nanos() as _,
    });
    match futex::wait(word, Flags::empty(), expected, ts.as_ref()) {
        Ok(()) => Wait::Woken,
        Err(rustix::io::Errno::AGAIN) => Wait::Changed,
        Err(rustix::io::Errno::TIMEDOUT) => Wait::TimedOut,
        // EINTR; EFAULT/EINVAL cannot happen with a valid reference and shared flags.
        Err(_) => Wait::Interrupted,
    }
}

/// Wakes up to `n` waiters on `word`; returns how many were woken.
pub fn wake(word: &AtomicU32, n: u32) -> usize {
    futex::wake(word, Flags::empty(), n.min(i32::MAX as u32)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn changed_value_returns_at_once() {
        let w = AtomicU32::new(1);
        assert_eq!(wait(&w, 0, Some(Duration::from_secs(5))), Wait::Changed);
    }

    #[test]
    fn times_out() {
        let w = AtomicU32::new(0);
        let t = std::time::Instant::now();
        assert_eq!(wait(&w, 0, Some(Duration::from_millis(20))), Wait::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn wake_ends_a_wait() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let sleeper = std::thread::spawn(move || loop {
            // Re-check, as every futex user must (spurious wake-ups).
            if w2.load(Ordering::SeqCst) != 0 {
                return;
            }
            wait(&w2, 0, Some(Duration::from_secs(10)));
        });
        std::thread::sleep(Duration::from_millis(10));
        w.store(1, Ordering::SeqCst);
        wake(&w, 1);
        sleeper.join().unwrap();
    }

    #[test]
    fn wake_without_waiters_wakes_none() {
        assert_eq!(wake(&AtomicU32::new(0), 1), 0);
    }
}
