//! The synchronisation primitives of the ring's and the bell's wake-up protocol, in one place
//! so that a model checker can stand in for them.
//!
//! Normally these are `std`'s atomics and fence and the real futex ([`crate::futex`]). Built
//! with `RUSTFLAGS="--cfg loom"` (`scripts/loom.sh`) they are `loom`'s, and the futex is a
//! loom model ([`futex`]), so the loom tests in `ring/loom_models.rs` check the protocol code
//! itself, not a copy of it.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// The futex operations the protocol uses.
#[cfg(not(loom))]
pub(crate) mod futex {
    pub(crate) use crate::futex::{wait, wake};
}

/// A loom model of the futex: what the protocol may rely on, nothing more.
///
/// - [`wait`] sleeps only if the word still holds the expected value, checked atomically with
///   respect to [`wake`] (the kernel's hash-bucket lock; here one loom mutex for every word);
///   otherwise it returns [`Wait::Changed`] at once.
/// - [`wake`] wakes every sleeper on any word: a sleeper on another word sees a spurious
///   wake-up, which every caller must tolerate anyway (its count is therefore not modelled and
///   it returns 0).
/// - A timeout is never taken: a wait with a timeout sleeps until woken. A protocol that needs
///   the timeout to make progress has lost a wake-up, and loom reports the sleeper as
///   deadlocked instead of letting the timeout hide it.
#[cfg(loom)]
pub(crate) mod futex {
    pub(crate) use crate::futex::Wait;
    use loom::sync::{Condvar, Mutex};
    use std::time::Duration;

    use super::{AtomicU32, Ordering};

    loom::lazy_static! {
        static ref PARK: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    pub(crate) fn wait(word: &AtomicU32, expected: u32, _timeout: Option<Duration>) -> Wait {
        let (lock, cv) = &*PARK;
        let guard = lock.lock().unwrap();
        if word.load(Ordering::SeqCst) != expected {
            return Wait::Changed;
        }
        drop(cv.wait(guard).unwrap());
        Wait::Woken
    }

    pub(crate) fn wake(_word: &AtomicU32, _n: u32) -> usize {
        let (lock, cv) = &*PARK;
        let _guard = lock.lock().unwrap();
        cv.notify_all();
        0
    }
}
