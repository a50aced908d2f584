//! Seed 001's headline reproduced: the host CPU time a server spends on protocol processing
//! for requests arriving over TCP, kernel-resident vs user-level vs NIC-resident stack, and
//! the reduction `r = 1 − 2·t_NIC / (t_kernel + t_user)` (its eq. 4; 68 % ideal, 68–71 % with
//! packet error rates of Table 2), from its Table 1 costs (`presets/seed001-table1.json`).
//!
//! The experiment (§5.1, Figure 7, Table 2): a server processes 60 requests of 1 KB received
//! over TCP from a remote client, and answers each; the host's protocol CPU time is what is
//! compared. Packet errors inflate the kernel and user-level stacks' work by 1/(1−e) (eq. 5)
//! while the NIC's host side stays the same (in the simulator: every corrupted packet is
//! received and sent again by whoever runs the stack).

use crate::calib::Calibration;
use crate::model::{simulate, Arch, Clients, Scenario, Workload};
use serde::{Deserialize, Serialize};

/// The paper's figure: 68 % (ideal link).
pub const PAPER_REDUCTION: f64 = 0.68;
/// The band of the reproduction: ±10 percentage points.
pub const BAND_PP: f64 = 10.0;
/// Table 2's packet error rates and the paper's reductions.
pub const TABLE2: [(f64, f64); 4] = [(0.0, 0.68), (8.0e-4, 0.68), (8.2e-3, 0.69), (7.9e-2, 0.71)];

/// One error rate's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Packet error rate.
    pub error_rate: f64,
    /// Host protocol CPU per request, µs: kernel, library (user-level), offload (NIC-NET).
    pub host_us: [f64; 3],
    /// The simulated reduction.
    pub reduction: f64,
    /// The paper's.
    pub paper: f64,
}

/// The reproduction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reproduction {
    /// One point per Table 2 error rate.
    pub points: Vec<Point>,
    /// Whether the ideal-link reduction is within ±10 points of the paper's 68 %.
    pub within_band: bool,
}

/// Runs the experiment on `cal` (normally seed 001's Table 1 preset).
pub fn reproduce(cal: &Calibration) -> Result<Reproduction, String> {
    let mut points = vec![];
    for (e, paper) in TABLE2 {
        let mut c = cal.clone();
        c.link.error_rate = e;
        let mut host = [0.0; 3];
        for (i, a) in ["kernel", "library", "offload"].iter().enumerate() {
            let mut sc = Scenario::new(Arch::parse(a)?, Workload::Rr, 1024, 1);
            sc.conns = 1;
            sc.clients = Clients::Remote;
            sc.txns = 60;
            sc.max_secs = 100.0;
            host[i] = simulate(&sc, &c)?.host_protocol_us_per_txn;
        }
        let reduction = 1.0 - 2.0 * host[2] / (host[0] + host[1]);
        points.push(Point {
            error_rate: e,
            host_us: host,
            reduction,
            paper,
        });
    }
    let within_band = (points[0].reduction - PAPER_REDUCTION).abs() * 100.0 <= BAND_PP;
    Ok(Reproduction {
        points,
        within_band,
    })
}
