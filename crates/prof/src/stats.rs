//! The measurement method of seed 000: subtract the probe's own cost, discard disturbed and
//! deviating samples, average the clean ones and report their spread.

/// Mean and spread of the kept samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Mean of kept samples.
    pub mean: f64,
    /// Standard deviation of kept samples.
    pub stddev: f64,
    /// Smallest kept sample.
    pub min: f64,
    /// Largest kept sample.
    pub max: f64,
    /// Samples kept.
    pub kept: usize,
}

/// Median of `v` (0 for an empty slice).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Mean of `v` without its lowest and highest `frac` share (0 for an empty slice).
///
/// Used for the probe's own cost: a virtual machine's TSC may tick in coarse steps (26
/// cycles here), which makes a median land on a step while the true cost lies between steps;
/// the mean of many samples recovers it, and trimming keeps interrupt-sized spikes out.
pub fn trimmed_mean(v: &[f64], frac: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let cut = ((s.len() as f64) * frac.clamp(0.0, 0.49)) as usize;
    let kept = &s[cut..s.len() - cut];
    kept.iter().sum::<f64>() / kept.len() as f64
}

/// Indices of the samples to keep: not `disturbed` (an interrupt, context switch or CPU
/// migration was seen) and within `k` scaled median absolute deviations of the median of the
/// undisturbed ones — the deviation taken as at least `min_spread`, the clock's resolution:
/// a clock that ticks in steps (26 cycles in this VM) makes most samples of a short layer
/// equal, and keeping only those would bias the mean to one step.
pub fn clean(samples: &[f64], disturbed: &[bool], k: f64, min_spread: f64) -> Vec<usize> {
    let calm: Vec<f64> = samples
        .iter()
        .zip(disturbed)
        .filter(|(_, &d)| !d)
        .map(|(&s, _)| s)
        .collect();
    let med = median(&calm);
    let dev: Vec<f64> = calm.iter().map(|s| (s - med).abs()).collect();
    // 1.4826 · MAD estimates the standard deviation of normally distributed data.
    let mad = (1.4826 * median(&dev)).max(min_spread);
    samples
        .iter()
        .enumerate()
        .filter(|&(i, &s)| !disturbed[i] && (s - med).abs() <= k * mad)
        .map(|(i, _)| i)
        .collect()
}

/// Mean, standard deviation and range of `v`.
pub fn summarize(v: &[f64]) -> Summary {
    if v.is_empty() {
        return Summary {
            mean: 0.0,
            stddev: 0.0,
            min: 0.0,
            max: 0.0,
            kept: 0,
        };
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    Summary {
        mean,
        stddev: var.sqrt(),
        min: v.iter().cloned().fold(f64::MAX, f64::min),
        max: v.iter().cloned().fold(f64::MIN, f64::max),
        kept: v.len(),
    }
}

/// The probe's own cost, split where it lands: `own` cycles in the probed layer per entry,
/// `parent` cycles in the enclosing layer per child probe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeCost {
    /// Charged to the layer itself per entry.
    pub own: f64,
    /// Charged to the enclosing layer per child entered.
    pub parent: f64,
}

/// A layer's cycles with the probes' cost removed: `own` per entry and `parent` per child
/// probe entered inside it (never below 0).
pub fn net_of_overhead(cycles: u64, entries: u32, children: u32, cost: ProbeCost) -> f64 {
    (cycles as f64 - entries as f64 * cost.own - children as f64 * cost.parent).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_is_subtracted_per_activation_and_child_and_floored() {
        let c = ProbeCost {
            own: 25.0,
            parent: 10.0,
        };
        assert_eq!(net_of_overhead(1000, 4, 0, c), 900.0);
        assert_eq!(net_of_overhead(1000, 4, 3, c), 870.0);
        assert_eq!(net_of_overhead(50, 4, 0, c), 0.0);
        assert_eq!(net_of_overhead(1000, 0, 0, c), 1000.0);
    }

    #[test]
    fn outliers_and_disturbed_samples_are_dropped() {
        let mut s: Vec<f64> = (0..100).map(|i| 1000.0 + (i % 7) as f64).collect();
        s[10] = 50_000.0; // an interrupt-sized spike
        s[20] = 10.0; // impossible fast sample
        let mut d = vec![false; 100];
        d[30] = true; // a context switch was seen
        let kept = clean(&s, &d, 5.0, 0.0);
        assert_eq!(kept.len(), 97);
        assert!(!kept.contains(&10) && !kept.contains(&20) && !kept.contains(&30));
        let sum = summarize(&kept.iter().map(|&i| s[i]).collect::<Vec<_>>());
        assert!((sum.mean - 1003.0).abs() < 1.0);
        assert!(sum.max <= 1006.0 && sum.min >= 1000.0);
    }

    #[test]
    fn trimmed_mean_sees_between_coarse_clock_steps() {
        // A 62-cycle cost read by a clock ticking every 26 cycles: 52 or 78, by phase.
        let mut v: Vec<f64> = (0..1000)
            .map(|i| if i % 26 < 16 { 52.0 } else { 78.0 })
            .collect();
        v[3] = 90_000.0; // an interrupt
        assert_eq!(median(&v), 52.0);
        let m = trimmed_mean(&v, 0.01);
        assert!((m - 62.0).abs() < 0.6, "{m}");
        assert_eq!(trimmed_mean(&[], 0.1), 0.0);
        assert_eq!(trimmed_mean(&[4.0], 0.4), 4.0);
    }

    #[test]
    fn zero_spread_keeps_the_median_only_unless_the_clock_is_coarse() {
        let s = vec![5.0, 5.0, 5.0, 9.0];
        assert_eq!(clean(&s, &[false; 4], 3.0, 0.0), vec![0, 1, 2]);
        // With a 2-cycle clock, 9 is within 3 × 2 of 5: kept.
        assert_eq!(clean(&s, &[false; 4], 3.0, 2.0), vec![0, 1, 2, 3]);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0]), 2.0);
    }
}
