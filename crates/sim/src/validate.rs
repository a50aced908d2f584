//! Validation first, prediction second: the simulator's predictions for the configurations
//! `flowstack bench` can run on this machine, next to fresh measurements, each marked
//! validated (within ±25 %) or NOT validated — never left out.
//!
//! The cases are stream, rr and crr at `--cores 1` and `--cores 2` for the flowstack and the
//! kernel peers, at the bench's default sizes (64 KiB writes, 64-byte requests) — not the
//! sizes the calibration was fitted at ([`crate::fit`]), so no row is a fitted point. The
//! measuring is the caller's (the `flowstack sim --validate` command runs the bench).

use crate::calib::Calibration;
use crate::fit::{bench_scenario, predict_metric, SEEDS};
use crate::model::{simulate, Clients, Workload};
use flowstack_prof::report::Peer;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The band inside which a prediction counts as validated: ±25 % of the measurement.
pub const BAND: f64 = 0.25;

/// One configuration to predict and measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    /// The workload.
    pub workload: Workload,
    /// flowstack (the `percore` architecture) or the kernel.
    pub peer: Peer,
    /// `bench --cores N`.
    pub cores: usize,
}

impl Case {
    /// The bench's default message size of the workload.
    pub fn size(&self) -> usize {
        match self.workload {
            Workload::Stream => 65536,
            _ => 64,
        }
    }

    /// The bench command that measures it.
    pub fn command(&self) -> String {
        format!(
            "flowstack bench {} --peer {} --cores {}",
            self.workload.name(),
            self.peer.name(),
            self.cores
        )
    }
}

/// Every validated configuration, in table order.
pub fn cases() -> Vec<Case> {
    let mut v = vec![];
    for w in [Workload::Stream, Workload::Rr, Workload::Crr] {
        for cores in [1, 2] {
            for peer in [Peer::Flowstack, Peer::Kernel] {
                v.push(Case {
                    workload: w,
                    peer,
                    cores,
                });
            }
        }
    }
    v
}

/// What the simulator predicts for a case.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Mbit/s (stream) or per second.
    pub metric: f64,
    /// Median response time, µs (rr).
    pub p50_us: f64,
}

/// Predicts a case under `cal` with `share` of each core available (averaged over
/// placements where the kernel's hash decides).
pub fn predict(cal: &Calibration, c: &Case, share: f64) -> Result<Prediction, String> {
    let metric = predict_metric(
        cal,
        share,
        c.peer,
        c.workload,
        c.size(),
        c.cores,
        c.cores,
        Clients::Colocated,
    )?;
    let seeds = if c.peer == Peer::Kernel && c.cores > 1 {
        SEEDS
    } else {
        1
    };
    let mut p50 = 0.0;
    for seed in 1..=seeds {
        let mut sc = bench_scenario(
            c.peer,
            c.workload,
            c.size(),
            c.cores,
            c.cores,
            Clients::Colocated,
            seed,
        );
        // A latency is measured while the thread runs: the share it gets between runs
        // does not stretch it.
        sc.host_share = 1.0;
        p50 += simulate(&sc, cal)?.p50_us;
    }
    Ok(Prediction {
        metric,
        p50_us: p50 / seeds as f64,
    })
}

/// A measurement: median and range over runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Median.
    pub median: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
}

/// A row's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Within ±25 % of the measurement.
    Validated,
    /// Outside the band.
    NotValidated,
    /// Not measured, and why.
    NotMeasured(String),
}

/// One line of the validation table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// What was run, e.g. "rr 64 B, --cores 2, kernel".
    pub config: String,
    /// The measuring command.
    pub command: String,
    /// The quantity ("tx/s", "Mbit/s", "conn/s", "p50 us").
    pub quantity: String,
    /// The prediction, with the CPU share the run got.
    pub predicted: f64,
    /// The prediction on an idle machine (every core entirely the run's).
    #[serde(default)]
    pub predicted_idle: Option<f64>,
    /// The share of its cores the run got (other processes took the rest), as measured.
    #[serde(default)]
    pub cpu_share: Option<f64>,
    /// The measurement.
    pub measured: Option<Measured>,
    /// (predicted − measured) / measured, percent.
    pub error_percent: Option<f64>,
    /// The verdict.
    pub status: Status,
}

/// Compares a prediction with a measurement.
pub fn row(
    config: String,
    command: String,
    quantity: &str,
    predicted: f64,
    measured: Option<Measured>,
) -> Row {
    let (error_percent, status) = match measured {
        Some(m) if m.median > 0.0 => {
            let e = (predicted - m.median) / m.median;
            (
                Some(e * 100.0),
                if e.abs() <= BAND {
                    Status::Validated
                } else {
                    Status::NotValidated
                },
            )
        }
        Some(_) => (None, Status::NotMeasured("measured zero".into())),
        None => (None, Status::NotMeasured("not run".into())),
    };
    Row {
        config,
        command,
        quantity: quantity.into(),
        predicted,
        predicted_idle: None,
        cpu_share: None,
        measured,
        error_percent,
        status,
    }
}

/// The rows of a case: its metric, and for rr the median latency. `p` is the prediction
/// at the measured CPU `share`, `idle` the one on an idle machine.
pub fn rows_of(
    c: &Case,
    p: &Prediction,
    idle: &Prediction,
    share: Option<f64>,
    metric: Option<Measured>,
    p50: Option<f64>,
) -> Vec<Row> {
    let config = format!(
        "{} {} B, --cores {}, {}",
        c.workload.name(),
        c.size(),
        c.cores,
        c.peer.name()
    );
    let q = match c.workload {
        Workload::Stream => "Mbit/s",
        Workload::Crr => "conn/s",
        _ => "tx/s",
    };
    let mut first = row(config.clone(), c.command(), q, p.metric, metric);
    first.predicted_idle = Some(idle.metric);
    first.cpu_share = share;
    let mut v = vec![first];
    if c.workload == Workload::Rr {
        v.push(row(
            config,
            c.command(),
            "p50 us",
            p.p50_us,
            p50.map(|m| Measured {
                median: m,
                min: m,
                max: m,
            }),
        ));
    }
    v
}

fn num(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The side-by-side table.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<37} {:>7} {:>10} {:>6} {:>10} {:>10} {:>21} {:>8}  verdict",
        "configuration",
        "unit",
        "idle pred",
        "share",
        "predicted",
        "measured",
        "(min..max)",
        "error"
    );
    for r in rows {
        let (m, range, e) = match (&r.measured, r.error_percent) {
            (Some(m), Some(e)) => (
                num(m.median),
                format!("({}..{})", num(m.min), num(m.max)),
                format!("{e:+.1}%"),
            ),
            _ => ("-".into(), String::new(), "-".into()),
        };
        let verdict = match &r.status {
            Status::Validated => "validated".to_string(),
            Status::NotValidated => "NOT validated".to_string(),
            Status::NotMeasured(why) => format!("not validated: {why}"),
        };
        let _ = writeln!(
            s,
            "{:<37} {:>7} {:>10} {:>6} {:>10} {:>10} {:>21} {:>8}  {}",
            r.config,
            r.quantity,
            r.predicted_idle.map(num).unwrap_or_default(),
            r.cpu_share
                .map(|x| format!("{:.0}%", x * 100.0))
                .unwrap_or_default(),
            num(r.predicted),
            m,
            range,
            e,
            verdict
        );
    }
    let n = rows.len();
    let ok = rows
        .iter()
        .filter(|r| r.status == Status::Validated)
        .count();
    let _ = writeln!(
        s,
        "{ok} of {n} rows within ±{:.0}% of the measurement",
        BAND * 100.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_is_inclusive_and_symmetric_and_nothing_is_hidden() {
        let m = |x| {
            Some(Measured {
                median: x,
                min: x,
                max: x,
            })
        };
        assert_eq!(
            row("a".into(), "".into(), "tx/s", 125.0, m(100.0)).status,
            Status::Validated
        );
        assert_eq!(
            row("a".into(), "".into(), "tx/s", 75.0, m(100.0)).status,
            Status::Validated
        );
        assert_eq!(
            row("a".into(), "".into(), "tx/s", 125.1, m(100.0)).status,
            Status::NotValidated
        );
        let r = row("b".into(), "".into(), "tx/s", 50.0, None);
        assert!(matches!(r.status, Status::NotMeasured(_)));
        let t = table(&[r, row("c".into(), "".into(), "tx/s", 10.0, m(100.0))]);
        assert!(
            t.contains("NOT validated") && t.contains("not validated: not run"),
            "{t}"
        );
        assert!(t.contains("0 of 2 rows"), "{t}");
    }

    #[test]
    fn twelve_configurations_are_validated() {
        let c = cases();
        assert_eq!(c.len(), 12);
        assert!(c
            .iter()
            .all(|c| c.size() == 64 || c.workload == Workload::Stream));
    }
}
