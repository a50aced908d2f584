//! Fault-injection middleware: loss, reordering, duplication, corruption and delay on the
//! transmit side of any device, all drawn from a seeded RNG so a run is reproducible.
//!
//! Spec syntax (the CLI's `--impair`): comma-separated `key=value` with keys `loss`, `reorder`,
//! `dup`, `corrupt` (probabilities as `0.02` or `2%`) and `delay` (`500us`, `1ms`, `0.2s`).
//! A reordered frame is held back for `delay + reorder_gap` so later frames overtake it.

use crate::rng::Rng;
use crate::{Device, DeviceCaps, Instant, TxBatch};
use flowstack_wire::Duration;
use std::fmt;
use std::str::FromStr;

/// What to do to frames.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImpairSpec {
    /// Probability a frame is dropped.
    pub loss: f64,
    /// Probability a frame is held back so later ones overtake it.
    pub reorder: f64,
    /// Probability a frame is sent twice.
    pub dup: f64,
    /// Probability one bit past the Ethernet header is flipped.
    pub corrupt: f64,
    /// One-way delay added to every frame.
    pub delay: Duration,
    /// Extra hold time for a reordered frame.
    pub reorder_gap: Duration,
}

impl Default for ImpairSpec {
    fn default() -> Self {
        Self {
            loss: 0.0,
            reorder: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            delay: Duration::ZERO,
            reorder_gap: Duration::from_millis(1),
        }
    }
}

impl ImpairSpec {
    /// True if the spec changes nothing.
    pub fn is_noop(&self) -> bool {
        self.loss == 0.0
            && self.reorder == 0.0
            && self.dup == 0.0
            && self.corrupt == 0.0
            && self.delay.is_zero()
    }
}

impl fmt::Display for ImpairSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss={},reorder={},dup={},corrupt={},delay={}us",
            self.loss,
            self.reorder,
            self.dup,
            self.corrupt,
            self.delay.as_micros()
        )
    }
}

/// Parses a duration such as `250us`, `1ms`, `0.5s` or `100ns`.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(n) = v.strip_suffix("ns") {
        (n, 1e-9)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!("duration '{v}' needs a unit: ns, us, ms or s"));
    };
    let x: f64 = num
        .parse()
        .map_err(|_| format!("duration '{v}' is not a number"))?;
    if !(0.0..=3600.0).contains(&(x * scale)) {
        return Err(format!("duration '{v}' out of range 0..3600s"));
    }
    Ok(Duration::from_secs_f64(x * scale))
}

fn parse_prob(k: &str, v: &str) -> Result<f64, String> {
    let (num, div) = match v.strip_suffix('%') {
        Some(n) => (n, 100.0),
        None => (v, 1.0),
    };
    let p: f64 = num.parse().map_err(|_| format!("{k}={v}: not a number"))?;
    let p = p / div;
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("{k}={v}: probability must be within 0..1"));
    }
    Ok(p)
}

impl FromStr for ImpairSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut spec = ImpairSpec::default();
        for item in s.split(',').filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("'{item}' is not key=value"))?;
            match k {
                "loss" => spec.loss = parse_prob(k, v)?,
                "reorder" => spec.reorder = parse_prob(k, v)?,
                "dup" => spec.dup = parse_prob(k, v)?,
                "corrupt" => spec.corrupt = parse_prob(k, v)?,
                "delay" => spec.delay = parse_duration(v)?,
                "gap" => spec.reorder_gap = parse_duration(v)?,
                _ => {
                    return Err(format!(
                        "unknown impairment '{k}' (known: loss, reorder, dup, corrupt, delay, gap)"
                    ))
                }
            }
        }
        Ok(spec)
    }
}

/// What the middleware did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImpairStats {
    /// Frames offered for transmission.
    pub offered: u64,
    /// Frames dropped.
    pub dropped: u64,
    /// Extra copies sent.
    pub duplicated: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Frames held back to be overtaken.
    pub reordered: u64,
}

struct Held {
    due: Instant,
    order: u64,
    frame: Vec<u8>,
}

/// A device wrapped with fault injection on its transmit side.
pub struct Impaired<D> {
    inner: D,
    spec: ImpairSpec,
    rng: Rng,
    held: Vec<Held>,
    pool: Vec<Vec<u8>>,
    order: u64,
    out: TxBatch,
    stats: ImpairStats,
}

impl<D: Device> Impaired<D> {
    /// Wraps `inner`, drawing decisions from a generator seeded with `seed`.
    pub fn new(inner: D, spec: ImpairSpec, seed: u64) -> Self {
        Self {
            inner,
            spec,
            rng: Rng::new(seed),
            held: Vec::new(),
            pool: Vec::new(),
            order: 0,
            out: TxBatch::new(),
            stats: ImpairStats::default(),
        }
    }
    /// What has been done so far.
    pub fn stats(&self) -> ImpairStats {
        self.stats
    }
    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn hold(&mut self, due: Instant, f: &[u8], corrupt: bool) {
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(f);
        if corrupt {
            self.flip(&mut buf);
        }
        let order = self.order;
        self.order += 1;
        let at = self
            .held
            .partition_point(|h| (h.due, h.order) <= (due, order));
        self.held.insert(
            at,
            Held {
                due,
                order,
                frame: buf,
            },
        );
    }

    fn flip(&mut self, buf: &mut [u8]) {
        if buf.len() > 14 {
            let i = 14 + self.rng.below(buf.len() - 14);
            buf[i] ^= 1 << self.rng.below(8);
        }
    }

    /// Sends every held frame that is due.
    fn release(&mut self, now: Instant) {
        let due = self.held.partition_point(|h| h.due <= now);
        if due == 0 {
            return;
        }
        self.out.clear();
        for h in self.held.drain(..due) {
            self.out.push(h.frame.len()).copy_from_slice(&h.frame);
            self.pool.push(h.frame);
        }
        self.inner.send_batch(now, &self.out);
    }
}

impl<D: Device> Device for Impaired<D> {
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }

    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        self.release(now);
        self.inner.recv_batch(now, budget, sink)
    }

    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        self.release(now);
        let mut now_batch = std::mem::take(&mut self.out);
        now_batch.clear();
        for f in batch.iter() {
            self.stats.offered += 1;
            if self.rng.chance(self.spec.loss) {
                self.stats.dropped += 1;
                continue;
            }
            let copies = if self.rng.chance(self.spec.dup) {
                self.stats.duplicated += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                let corrupt = self.rng.chance(self.spec.corrupt);
                self.stats.corrupted += corrupt as u64;
                let reorder = self.rng.chance(self.spec.reorder);
                if reorder || !self.spec.delay.is_zero() {
                    let mut due = now + self.spec.delay;
                    if reorder {
                        self.stats.reordered += 1;
                        due += self.spec.reorder_gap;
                    }
                    self.hold(due, f, corrupt);
                } else {
                    let b = now_batch.push(f.len());
                    b.copy_from_slice(f);
                    if corrupt {
                        self.flip(b);
                    }
                }
            }
        }
        if !now_batch.is_empty() {
            self.inner.send_batch(now, &now_batch);
        }
        self.out = now_batch;
        batch.len()
    }

    fn poll_at(&self) -> Option<Instant> {
        let mine = self.held.first().map(|h| h.due);
        match (mine, self.inner.poll_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn rx_pending(&self, now: Instant) -> bool {
        self.inner.rx_pending(now)
    }

    fn wait(&mut self, timeout: flowstack_wire::Duration) {
        self.inner.wait(timeout)
    }

    fn link_down(&self) -> bool {
        self.inner.link_down()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipe::pipe;

    #[test]
    fn spec_parses_and_rejects() {
        let s: ImpairSpec = "loss=0.02,reorder=2%,dup=0.01,corrupt=0.001,delay=1ms"
            .parse()
            .unwrap();
        assert_eq!(s.loss, 0.02);
        assert!((s.reorder - 0.02).abs() < 1e-12);
        assert_eq!(s.delay, Duration::from_millis(1));
        assert!("loss=2".parse::<ImpairSpec>().is_err());
        assert!("jitter=1".parse::<ImpairSpec>().is_err());
        assert!("loss".parse::<ImpairSpec>().is_err());
        assert!("delay=5".parse::<ImpairSpec>().is_err());
    }

    fn run(spec: &str, seed: u64) -> (Vec<u8>, ImpairStats) {
        let (a, mut b) = pipe(DeviceCaps::ETHERNET, 100_000);
        let mut a = Impaired::new(a, spec.parse().unwrap(), seed);
        let mut got = vec![];
        let mut batch = TxBatch::new();
        for i in 0..1000u32 {
            batch.clear();
            batch.push(20)[14..18].copy_from_slice(&i.to_be_bytes());
            let now = Instant::from_nanos(i as u64 * 1000);
            a.send_batch(now, &batch);
            b.recv_batch(now, 100, &mut |f| got.push(f[17]));
        }
        let end = Instant::from_millis(100);
        a.recv_batch(end, 0, &mut |_| {});
        b.recv_batch(end, 10_000, &mut |f| got.push(f[17]));
        (got, a.stats())
    }

    #[test]
    fn loss_rate_is_roughly_right_and_reproducible() {
        let (got, st) = run("loss=0.1", 42);
        assert_eq!(st.dropped as usize, 1000 - got.len());
        assert!((50..150).contains(&st.dropped), "dropped {}", st.dropped);
        assert_eq!(run("loss=0.1", 42).0, got, "same seed, same run");
        assert_ne!(run("loss=0.1", 43).0, got, "other seed, other run");
    }

    #[test]
    fn reorder_delivers_everything_out_of_order() {
        let (got, st) = run("reorder=0.1", 1);
        assert_eq!(got.len(), 1000);
        assert!(st.reordered > 0);
        assert!(got.windows(2).any(|w| w[1] != w[0].wrapping_add(1)));
    }

    #[test]
    fn delay_holds_frames_until_due() {
        let (a, b) = pipe(DeviceCaps::ETHERNET, 16);
        let mut a = Impaired::new(a.clone(), "delay=1ms".parse().unwrap(), 0);
        let mut batch = TxBatch::new();
        batch.push(30);
        a.send_batch(Instant::ZERO, &batch);
        assert!(!b.rx_pending(Instant::ZERO));
        assert_eq!(a.poll_at(), Some(Instant::from_millis(1)));
        a.recv_batch(Instant::from_millis(1), 0, &mut |_| {});
        assert!(b.rx_pending(Instant::from_millis(1)));
    }

    #[test]
    fn dup_and_corrupt() {
        let (got, st) = run("dup=0.2", 3);
        assert_eq!(got.len() as u64, 1000 + st.duplicated);
        let (_, st) = run("corrupt=0.5", 3);
        assert!(st.corrupted > 300);
    }
}
