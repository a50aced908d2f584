//! Round-trip time estimation and the retransmission timeout (RFC 6298).

use flowstack_wire::Duration;

/// SRTT/RTTVAR estimator with Karn's backoff.
#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    min: Duration,
    max: Duration,
    backoff: u32,
}

/// RFC 6298 §2: clock granularity G (we use 1 ms).
const G: Duration = Duration::from_millis(1);

impl RttEstimator {
    /// Starts with `initial` RTO, bounded to `[min, max]`.
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        Self {
            srtt: None,
            rttvar: Duration::ZERO,
            rto: initial.clamp(min, max),
            min,
            max,
            backoff: 0,
        }
    }

    /// Feeds one RTT measurement (never from a retransmitted segment without timestamps:
    /// Karn's algorithm, RFC 6298 §3).
    pub fn sample(&mut self, r: Duration) {
        match self.srtt {
            // RFC 6298 §2.2: first measurement.
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            // RFC 6298 §2.3: alpha = 1/8, beta = 1/4.
            Some(srtt) => {
                let delta = srtt.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + delta) / 4;
                self.srtt = Some((srtt * 7 + r) / 8);
            }
        }
        let srtt = self.srtt.expect("set above");
        self.rto = (srtt + G.max(self.rttvar * 4)).clamp(self.min, self.max);
        self.backoff = 0;
    }

    /// The current timeout, including backoff.
    pub fn rto(&self) -> Duration {
        (self.rto * (1u32 << self.backoff.min(16))).min(self.max)
    }

    /// RFC 6298 §5.5: double the timeout after it expires.
    pub fn back_off(&mut self) {
        self.backoff = (self.backoff + 1).min(16);
    }

    /// Smoothed RTT, if measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// RTT variation.
    pub fn rttvar(&self) -> Duration {
        self.rttvar
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
