//! The one mapping from the wall clock to the engine's [`Instant`].

use flowstack_wire::Instant;

/// Where engine time starts: engine time is the wall-clock time elapsed since the clock was
/// started, plus one millisecond, so that no real moment is ever [`Instant::ZERO`] (which
/// tests and initial values use for "before anything happened").
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: std::time::Instant,
}

/// Offset of the first engine instant.
const START: u64 = 1_000_000;

impl Clock {
    /// A clock whose engine time starts now.
    pub fn start() -> Self {
        Self {
            origin: std::time::Instant::now(),
        }
    }

    /// The current engine time.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.origin.elapsed().as_nanos() as u64 + START)
    }

    /// The engine time of a wall-clock moment taken after the clock started.
    pub fn at(&self, t: std::time::Instant) -> Instant {
        Instant::from_nanos(t.saturating_duration_since(self.origin).as_nanos() as u64 + START)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_time_is_never_zero_and_never_goes_back() {
        let c = Clock::start();
        let a = c.now();
        let b = c.now();
        assert!(a >= Instant::from_nanos(START));
        assert!(b >= a);
        assert_eq!(c.at(c.origin), Instant::from_nanos(START));
    }
}
