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

fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(d.subsec_nanos().into())
}

fn sat32(ns: u64) -> u32 {
    u32::try_from(ns).unwrap_or(u32::MAX)
}

fn micros_up(d: Duration) -> u32 {
    u32::try_from(nanos(d).div_ceil(1000)).unwrap_or(u32::MAX)
}

/// RFC 6298 §2: clock granularity G in nanoseconds.
const G_NS: u64 = 1_000_000;

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
        e.rto = e.clamp(nanos(initial));
        e
    }

    fn max_ns(&self) -> u64 {
        u64::from(self.max_us.max(self.min_us)) * 1000
    }

    fn clamp(&self, ns: u64) -> u64 {
        ns.clamp(u64::from(self.min_us) * 1000, self.max_ns())
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
            self.rttvar = sat32((u64::from(self.rttvar) * 3).saturating_add(delta) / 4);
            self.srtt = self.srtt.saturating_mul(7).saturating_add(r) / 8;
        }
        let var4 = u64::from(self.rttvar) * 4;
        self.rto = self.clamp(self.srtt.saturating_add(G_NS.max(var4)));
        self.backoff = 0;
    }

    /// The current timeout, including backoff.
    pub fn rto(&self) -> Duration {
        let backed_off = self.rto.saturating_mul(1u64 << self.backoff.min(16));
        Duration::from_nanos(backed_off.min(self.max_ns()))
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
