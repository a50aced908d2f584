//! Congestion control behind one small enum-dispatched type: NewReno (RFC 5681, RFC 6582) and
//! CUBIC (RFC 9438). Windows are in bytes.

use flowstack_wire::{Duration, Instant};

/// Which algorithm a socket uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CcAlgorithm {
    /// RFC 5681 slow start and congestion avoidance, RFC 6582 recovery.
    NewReno,
    /// RFC 9438.
    #[default]
    Cubic,
}

impl std::str::FromStr for CcAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "newreno" | "reno" => Ok(Self::NewReno),
            "cubic" => Ok(Self::Cubic),
            _ => Err(format!("unknown congestion control '{s}' (newreno, cubic)")),
        }
    }
}

/// RFC 9438 §4.6: multiplicative decrease factor.
const BETA: f64 = 0.7;
/// RFC 9438 §5: the C constant.
const C: f64 = 0.4;

#[derive(Debug, Clone, Copy)]
struct Cubic {
    w_max: f64,
    k: f64,
    w_est: f64,
    /// Start of the current epoch; [`NO_EPOCH`] between a loss and the next epoch.
    epoch: Instant,
}

/// `Cubic::epoch` outside an epoch.
const NO_EPOCH: Instant = Instant::from_nanos(u64::MAX);

/// Congestion-avoidance state (32 bytes): allocated by the first congestion-avoidance step
/// or the first loss.
#[derive(Debug, Clone, Copy)]
struct Avoidance {
    cubic: Cubic,
}

impl Default for Avoidance {
    fn default() -> Self {
        Self {
            cubic: Cubic {
                w_max: 0.0,
                k: 0.0,
                w_est: 0.0,
                epoch: NO_EPOCH,
            },
        }
    }
}

/// Congestion window state.
///
/// 24 bytes (issue 19): windows in `u32` (they are bounded by the send buffer, itself
/// below 4 GiB), and the congestion-avoidance state — NewReno's byte count, CUBIC's curve —
/// allocated when it is first needed, so a connection that never left slow start (every
/// idle one that never sent much) holds none. Once allocated it is kept: CUBIC's `W_max`
/// shapes the window for the rest of the connection's life.
#[derive(Debug, Clone)]
pub struct Congestion {
    algo: CcAlgorithm,
    /// The sender's MSS (a TCP MSS fits 16 bits).
    mss: u16,
    cwnd: u32,
    /// [`NO_SSTHRESH`] until the first loss.
    ssthresh: u32,
    /// Bytes acknowledged toward the next NewReno increase (RFC 5681 §3.1); below `cwnd`.
    acked: u32,
    ca: Option<Box<Avoidance>>,
}

/// `ssthresh` before the first loss (reported as `usize::MAX`).
const NO_SSTHRESH: u32 = u32::MAX;

/// A window in bytes as stored (saturating at 4 GiB − 1).
fn mss16(mss: usize) -> u16 {
    u16::try_from(mss).unwrap_or(u16::MAX)
}

fn w(bytes: usize) -> u32 {
    u32::try_from(bytes).unwrap_or(u32::MAX - 1)
}

impl Congestion {
    /// Initial window per RFC 6928: min(10·MSS, max(2·MSS, 14600)).
    pub fn new(algo: CcAlgorithm, mss: usize) -> Self {
        Self {
            algo,
            mss: mss16(mss),
            cwnd: w((10 * mss).min((2 * mss).max(14600))),
            ssthresh: NO_SSTHRESH,
            acked: 0,
            ca: None,
        }
    }

    /// Heap held: the congestion-avoidance state once allocated.
    pub fn heap_bytes(&self) -> usize {
        self.ca
            .as_ref()
            .map_or(0, |_| std::mem::size_of::<Avoidance>())
    }

    fn ca(&mut self) -> &mut Avoidance {
        self.ca.get_or_insert_with(Box::default)
    }

    fn smss(&self) -> usize {
        self.mss as usize
    }

    /// The algorithm.
    pub fn algorithm(&self) -> CcAlgorithm {
        self.algo
    }
    /// Congestion window in bytes.
    pub fn cwnd(&self) -> usize {
        self.cwnd as usize
    }
    /// Slow-start threshold in bytes.
    pub fn ssthresh(&self) -> usize {
        if self.ssthresh == NO_SSTHRESH {
            usize::MAX
        } else {
            self.ssthresh as usize
        }
    }
    /// Changes the MSS the window is counted in without resetting the window (a lower path
    /// MTU is not congestion, RFC 1191 §6.5).
    pub fn set_smss(&mut self, mss: usize) {
        self.mss = mss16(mss);
        self.cwnd = self.cwnd.max(w(2 * mss));
    }

    /// Updates the MSS (after the handshake).
    pub fn set_mss(&mut self, mss: usize) {
        self.mss = mss16(mss);
        self.cwnd = w((10 * mss).min((2 * mss).max(14600)));
    }

    /// New data acknowledged outside recovery.
    pub fn on_ack(&mut self, now: Instant, acked: usize, srtt: Option<Duration>) {
        if self.cwnd() < self.ssthresh() {
            // RFC 5681 §3.1 slow start by bytes acknowledged (RFC 3465). Deliberately without
            // RFC 3465's L = 2·SMSS cap, as Linux does: with segmentation offload one ACK
            // covers up to 44 segments, and the cap would starve slow start.
            let grown = self.cwnd().saturating_add(acked);
            self.cwnd = w(grown.min(self.ssthresh().max(self.cwnd())));
            return;
        }
        match self.algo {
            CcAlgorithm::NewReno => self.reno_ca(acked),
            CcAlgorithm::Cubic => {
                self.cubic_ca(now, acked, srtt.unwrap_or(Duration::from_millis(100)))
            }
        }
    }

    fn reno_ca(&mut self, acked: usize) {
        // RFC 5681 §3.1: about one SMSS per RTT, by counting acknowledged bytes.
        let total = self.acked as usize + acked;
        if total >= self.cwnd() {
            self.acked = w(total - self.cwnd());
            self.cwnd = w(self.cwnd() + self.smss());
        } else {
            self.acked = w(total);
        }
    }

    fn cubic_ca(&mut self, now: Instant, acked: usize, rtt: Duration) {
        let mss = self.mss as f64;
        let cw = self.cwnd as f64;
        let c = &mut self.ca().cubic;
        if c.epoch == NO_EPOCH {
            // RFC 9438 §4.2: a new congestion-avoidance epoch.
            if c.w_max < cw {
                c.w_max = cw;
                c.k = 0.0;
            } else {
                c.k = ((c.w_max - cw) / mss / C).cbrt();
            }
            c.w_est = cw;
            c.epoch = now;
        }
        let epoch = c.epoch;
        let t = now.saturating_since(epoch).as_secs_f64() + rtt.as_secs_f64();
        let w_cubic = (C * (t - c.k).powi(3)) * mss + c.w_max;
        // RFC 9438 §4.3: the Reno-friendly estimate, alpha = 3(1-β)/(1+β).
        let alpha = 3.0 * (1.0 - BETA) / (1.0 + BETA);
        c.w_est += alpha * (acked as f64 / cw) * mss;
        let target = if c.w_est > w_cubic {
            c.w_est
        } else {
            // RFC 9438 §4.4: the target is bounded to [cwnd, 1.5·cwnd].
            w_cubic.clamp(cw, 1.5 * cw)
        };
        if target > cw {
            let inc = (target - cw) / cw * acked as f64;
            self.cwnd = w(self.cwnd().saturating_add((inc as usize).max(1)));
        }
    }

    /// Loss detected by duplicate ACKs or SACK: the new ssthresh and cwnd for recovery.
    pub fn on_loss(&mut self, flight: usize) {
        let mss = self.smss();
        let ssthresh = match self.algo {
            // RFC 5681 eq. (4).
            CcAlgorithm::NewReno => (flight / 2).max(2 * mss),
            CcAlgorithm::Cubic => {
                let cw = self.cwnd as f64;
                let c = &mut self.ca().cubic;
                // RFC 9438 §4.7 fast convergence.
                c.w_max = if cw < c.w_max {
                    cw * (1.0 + BETA) / 2.0
                } else {
                    cw
                };
                c.epoch = NO_EPOCH;
                ((cw * BETA) as usize).max(2 * mss)
            }
        };
        self.ssthresh = w(ssthresh);
        self.cwnd = self.ssthresh;
        self.acked = 0;
    }

    /// Retransmission timeout: RFC 5681 eq. (4) and a one-segment loss window.
    pub fn on_rto(&mut self, flight: usize) {
        self.on_loss(flight);
        self.cwnd = self.mss.into();
    }

    /// The window and threshold, to restore if a timeout proves spurious.
    pub fn save(&self) -> (usize, usize) {
        (self.cwnd(), self.ssthresh())
    }

    /// Restores what [`Congestion::save`] returned (RFC 4015 §3: a spurious timeout's
    /// reduction is undone).
    pub fn restore(&mut self, (cwnd, ssthresh): (usize, usize)) {
        self.cwnd = w(cwnd.max(self.cwnd()));
        self.ssthresh = if ssthresh == usize::MAX {
            NO_SSTHRESH
        } else {
            w(ssthresh)
        };
    }

    /// Leaving recovery: deflate to ssthresh (RFC 6582 §3.2 step 3).
    pub fn exit_recovery(&mut self) {
        self.cwnd = w(self.ssthresh());
    }

    /// Temporarily inflates cwnd during NewReno recovery (RFC 6582 §3.2).
    pub fn inflate(&mut self, bytes: usize) {
        self.cwnd = w(self.cwnd().saturating_add(bytes));
    }

    /// Deflates cwnd by `bytes` (partial ACK, RFC 6582 §3.2 step 3).
    pub fn deflate(&mut self, bytes: usize) {
        self.cwnd = w(self.cwnd().saturating_sub(bytes).max(self.smss()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_start_then_halving() {
        let mut c = Congestion::new(CcAlgorithm::NewReno, 1000);
        assert_eq!(c.cwnd(), 10_000);
        c.on_ack(Instant::ZERO, 1000, None);
        assert_eq!(c.cwnd(), 11_000);
        // One ACK for a large (offloaded) segment grows the window by what it acknowledged.
        c.on_ack(Instant::ZERO, 30_000, None);
        assert_eq!(c.cwnd(), 41_000);
        c.on_loss(20_000);
        assert_eq!((c.cwnd(), c.ssthresh()), (10_000, 10_000));
        // Congestion avoidance: one MSS per cwnd of acknowledged bytes.
        for _ in 0..10 {
            c.on_ack(Instant::ZERO, 1000, None);
        }
        assert_eq!(c.cwnd(), 11_000);
        c.on_rto(11_000);
        assert_eq!(c.cwnd(), 1000);
    }

    #[test]
    fn cubic_reduces_by_beta_and_regrows() {
        let mut c = Congestion::new(CcAlgorithm::Cubic, 1000);
        for _ in 0..90 {
            c.on_ack(Instant::ZERO, 1000, None);
        }
        let before = c.cwnd();
        c.on_loss(before);
        assert_eq!(c.cwnd(), (before as f64 * BETA) as usize);
        let after = c.cwnd();
        let mut t = Instant::from_millis(0);
        for _ in 0..2000 {
            t += Duration::from_millis(1);
            c.on_ack(t, 1000, Some(Duration::from_millis(10)));
        }
        assert!(
            c.cwnd() > after,
            "window grows again in congestion avoidance"
        );
    }
}
