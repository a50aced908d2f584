//! Round-trip time estimation and the retransmission timeout (RFC 6298).

use flowstack_wire::Duration;

/// SRTT/RTTVAR estimator with Karn's backoff.
///
/// Kept in 32 bytes (issue 19: every connection has one): SRTT and RTO in nanoseconds as
/// `u64` (half a `Duration`), RTTVAR in nanoseconds as `u32` (saturating at 4.29 s, where
/// the RTO is far above any RTT that matters), the bounds in microseconds.
#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    /// Smoothed RTT in nanoseconds; [`NO_SAMPLE`] before the first measurement.
    srtt: u64,
    rto: u64,
    rttvar: u32,
    /// Bounds on the RTO in microseconds (a bound below 1 µs counts as 1 µs).
    min_us: u32,
    max_us: u32,
    backoff: u8,
}

/// `srtt` before the first measurement.
const NO_SAMPLE: u64 = u64::MAX;

/// RFC 6298 §2: clock granularity G (we use 1 ms).
const G: Duration = Duration::from_millis(1);

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
}

fn sat32(ns: u64) -> u32 {
    u32::try_from(ns).unwrap_or(u32::MAX)
}

fn micros_up(d: Duration) -> u32 {
    u32::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(u32::MAX)
}

impl RttEstimator {
    /// Starts with `initial` RTO, bounded to `[min, max]` (microsecond resolution, at most
    /// about 71 minutes).
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        let mut e = Self {
            srtt: NO_SAMPLE,
            rttvar: 0,
            rto: 0,
            min_us: micros_up(min),
            max_us: micros_up(max),
            backoff: 0,
        };
        e.rto = nanos(e.clamp(initial));
        e
    }

    fn clamp(&self, d: Duration) -> Duration {
        let min = Duration::from_micros(self.min_us.into());
        let max = Duration::from_micros(self.max_us.into());
        d.clamp(min, max.max(min))
    }

    /// Feeds one RTT measurement (never from a retransmitted segment without timestamps:
    /// Karn's algorithm, RFC 6298 §3).
    pub fn sample(&mut self, r: Duration) {
        let r = nanos(r).min(NO_SAMPLE - 1);
        if self.srtt == NO_SAMPLE {
            // RFC 6298 §2.2: first measurement.
            self.srtt = r;
            self.rttvar = sat32(r / 2);
        } else {
            // RFC 6298 §2.3: alpha = 1/8, beta = 1/4.
            let delta = self.srtt.abs_diff(r);
            self.rttvar = sat32((self.rttvar as u64 * 3).saturating_add(delta) / 4);
            self.srtt = ((self.srtt as u128 * 7 + r as u128) / 8) as u64;
        }
        let srtt = Duration::from_nanos(self.srtt);
        let var4 = Duration::from_nanos(self.rttvar.into()).saturating_mul(4);
        self.rto = nanos(self.clamp(srtt.saturating_add(G.max(var4))));
        self.backoff = 0;
    }

    /// The current timeout, including backoff.
    pub fn rto(&self) -> Duration {
        let max = Duration::from_micros(self.max_us.into());
        (Duration::from_nanos(self.rto).saturating_mul(1u32 << self.backoff.min(16))).min(max)
    }

    /// RFC 6298 §5.5: double the timeout after it expires.
    pub fn back_off(&mut self) {
        self.backoff = (self.backoff + 1).min(16);
    }

    /// Smoothed RTT, if measured.
    pub fn srtt(&self) -> Option<Duration> {
        (self.srtt != NO_SAMPLE).then(|| Duration::from_nanos(self.srtt))
    }

    /// RTT variation.
    pub fn rttvar(&self) -> Duration {
        Duration::from_nanos(self.rttvar.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_rfc6298() {
        let ms = Duration::from_millis;
        let mut e = RttEstimator::new(Duration::from_secs(1), ms(200), Duration::from_secs(60));
        assert_eq!(e.rto(), Duration::from_secs(1));
        e.sample(ms(100));
        assert_eq!(e.srtt(), Some(ms(100)));
        assert_eq!(e.rto(), ms(300)); // 100 + 4*50
        e.back_off();
        assert_eq!(e.rto(), ms(600));
        e.sample(ms(100));
        assert!(e.rto() < ms(600));
        for _ in 0..50 {
            e.sample(ms(10));
        }
        assert_eq!(e.rto(), ms(200), "clamped to the minimum");
    }
}
