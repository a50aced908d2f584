//! Explicit time for the sans-IO core: a monotonic instant in nanoseconds.
//!
//! The protocol code never reads a clock; callers pass `now` in. Tests drive a virtual clock.

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
