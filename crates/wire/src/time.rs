//! Explicit time for the sans-IO core: a monotonic instant in nanoseconds.
//!
//! The protocol code never reads a clock; callers pass `now` in. Tests drive a virtual clock.
//! [`PollAt`] is the answer to "when do you next need me?".

use core::fmt;
use core::ops::{Add, AddAssign, Sub};

pub use core::time::Duration;

/// A point on a monotonic clock, in nanoseconds since an arbitrary origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The clock's origin.
    pub const ZERO: Instant = Instant(0);
    /// An instant later than any the stack will see (used for "never").
    pub const FAR_FUTURE: Instant = Instant(u64::MAX / 2);

    /// Builds an instant from nanoseconds since the origin.
    pub const fn from_nanos(ns: u64) -> Self {
        Instant(ns)
    }
    /// Builds an instant from milliseconds since the origin.
    pub const fn from_millis(ms: u64) -> Self {
        Instant(ms * 1_000_000)
    }
    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Microseconds since the origin.
    pub const fn as_micros(self) -> u64 {
        self.0 / 1_000
    }
    /// Milliseconds since the origin.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }
    /// Time elapsed since `earlier`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// When a sans-IO state machine next needs its owner's attention.
///
/// The answer of a `poll_at()`: act at once, at a deadline, or not until new input (a segment,
/// an application call) arrives. The variants are ordered by urgency — `Now` < `At(_)` <
/// `Idle`, and `At` by instant — so the earliest of several answers is their `min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PollAt {
    /// Work is pending now (something to send, or a timer already due).
    Now,
    /// Nothing to do before this instant.
    At(Instant),
    /// No deadline: only new input can create work.
    Idle,
}

impl PollAt {
    /// True if the owner must act at `now`.
    pub fn is_due(self, now: Instant) -> bool {
        match self {
            PollAt::Now => true,
            PollAt::At(t) => t <= now,
            PollAt::Idle => false,
        }
    }

    /// The instant to act at, with `Now` read as `now` (any instant not later than the
    /// current one will do, e.g. as a key in a timer heap); `None` when idle.
    pub fn instant_or(self, now: Instant) -> Option<Instant> {
        match self {
            PollAt::Now => Some(now),
            PollAt::At(t) => Some(t),
            PollAt::Idle => None,
        }
    }
}

impl From<Option<Instant>> for PollAt {
    /// A deadline if there is one, otherwise `Idle`.
    fn from(t: Option<Instant>) -> Self {
        t.map_or(PollAt::Idle, PollAt::At)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64),
        )
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:06}s",
            self.0 / 1_000_000_000,
            (self.0 % 1_000_000_000) / 1000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_at_orders_by_urgency() {
        let t = |ms| PollAt::At(Instant::from_millis(ms));
        assert!(PollAt::Now < t(0));
        assert!(t(1) < t(2));
        assert!(t(u64::MAX / 2_000_000) < PollAt::Idle);
        assert_eq!([PollAt::Idle, t(5), t(3)].into_iter().min(), Some(t(3)));
        assert_eq!(PollAt::from(None), PollAt::Idle);
    }

    #[test]
    fn poll_at_is_due() {
        let now = Instant::from_millis(10);
        assert!(PollAt::Now.is_due(now));
        assert!(PollAt::At(now).is_due(now));
        assert!(!PollAt::At(now + Duration::from_nanos(1)).is_due(now));
        assert!(!PollAt::Idle.is_due(now));
        assert_eq!(PollAt::Now.instant_or(now), Some(now));
        assert_eq!(PollAt::Idle.instant_or(now), None);
    }
}
