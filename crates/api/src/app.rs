//! The [`App`] trait: an application as a non-blocking state machine over [`Sockets`].
//!
//! A drive loop (the runtime's, a test's, a simulation's) owns the stack and the clock and
//! calls every application in turn:
//!
//! ```text
//! loop {
//!     engine.poll(now, device);           // frames in, timers, frames out
//!     for app in apps { app.poll(now, &mut engine) }
//!     sleep until min(engine.poll_at(), app.poll_at(), a frame arrives)
//!         unless some app said Busy
//! }
//! ```
//!
//! The same application code therefore runs in one process with two engines (tests, the demo,
//! the profiler), on a real link, or — later — over the offload client's rings.

use crate::Sockets;
use flowstack_wire::Instant;

/// What an application's turn achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nothing more to do until the stack moves or [`App::poll_at`] passes: the loop may
    /// sleep.
    Idle,
    /// Did work and may have more: poll again without sleeping.
    Busy,
    /// Finished; the loop stops polling it. How it ended is the application's own report.
    Done,
}

impl Progress {
    /// The progress of two applications polled in one turn: `Busy` wins over `Idle`, and the
    /// turn is `Done` only when both are.
    pub fn and(self, other: Progress) -> Progress {
        match (self, other) {
            (Progress::Done, Progress::Done) => Progress::Done,
            (Progress::Busy, _) | (_, Progress::Busy) => Progress::Busy,
            _ => Progress::Idle,
        }
    }
}

/// A step-driven application over any [`Sockets`] implementation.
///
/// `poll` must not block and must not read a clock of its own for protocol decisions: `now`
/// (the drive loop's clock, the same the stack runs on) is for its own measurements and
/// deadlines. Socket calls made in `poll` take effect at the stack's next poll.
pub trait App<S: Sockets + ?Sized> {
    /// Does whatever socket work is possible now.
    fn poll(&mut self, now: Instant, sockets: &mut S) -> Progress;

    /// When the application next needs a turn even if no socket becomes ready (an interval
    /// report, a deadline), if ever.
    fn poll_at(&self) -> Option<Instant> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Progress::{self, *};

    #[test]
    fn busy_wins_and_done_needs_both() {
        let all = [Idle, Busy, Done];
        for a in all {
            for b in all {
                let r: Progress = a.and(b);
                assert_eq!(r, b.and(a));
                assert_eq!(r == Done, a == Done && b == Done);
                assert_eq!(r == Busy, a == Busy || b == Busy);
            }
        }
    }
}
