//! flowstack's drive loop measured beside each validation run: a probe at the calibration
//! size (`bench rr --peer flowstack --cores N --msg-size 1024` for 0.2 s just before and
//! just after the run) gives the loop's speed ([`loop_speed`], from its median) and the
//! share of its cores it got ([`loop_share`], from its rate).

use crate::calib::Calibration;
use crate::fit::{bench_scenario, CAL_CONFIGS};
use crate::model::{simulate, Clients, Scenario, Workload};
use flowstack_prof::report::Peer;

/// The message size of the loop-speed probe: flowstack's rr calibration run's.
pub const SPEED_PROBE_SIZE: usize = CAL_CONFIGS[0].msg_size;

/// The probe's configuration: `bench rr --peer flowstack --cores N --msg-size 1024`, one
/// connection per core.
fn probe_scenario(cores: usize) -> Scenario {
    bench_scenario(
        Peer::Flowstack,
        Workload::Rr,
        SPEED_PROBE_SIZE,
        cores,
        cores,
        Clients::Colocated,
        1,
    )
}

/// How fast flowstack's drive loop runs now relative to the calibration: the calibration's
/// median response time of `bench rr --peer flowstack --cores N --msg-size 1024` (the
/// calibration run's configuration, at N cores) over the one a probe run of it measured
/// now. Every step of that loop is host CPU work (no fixed delay), so its median scales as
/// one over the cores' speed. A median is measured while the loop runs: the CPU share does
/// not enter (the probe is not the validated size, so no validated row is fitted).
pub fn loop_speed(cal: &Calibration, cores: usize, probe_p50_us: f64) -> Result<f64, String> {
    if !(probe_p50_us > 0.0 && probe_p50_us.is_finite()) {
        return Err("a speed probe needs a positive median".into());
    }
    let p = simulate(&probe_scenario(cores), cal)?.p50_us;
    Ok(p / probe_p50_us)
}

/// The share of its cores flowstack's drive loop got beside a validation run, as the loop
/// itself shows it: the speed probe's rate (`bench rr --peer flowstack --cores N
/// --msg-size 1024` for 0.2 s just before and after the run, [`loop_speed`]) over the
/// calibration's prediction of that probe on whole cores at the probe's `speed`. `/proc/stat`
/// gives what other processes took of the CPUs, but a loop that shares its core runs slower
/// than its turns' speed for a while after each switch back (cold caches, the switch
/// itself), so it moves fewer transactions than that share: on 2026-11-27 04:11 UTC, at
/// 49 % and 26 % by `/proc/stat`, flowstack's rr medians were predicted within −9 % and
/// −5 % but its rates +44 % and +35 %. The probe is the calibration size, not a validated
/// one: the rows still test the model's size and workload scaling.
pub fn loop_share(
    cal: &Calibration,
    cores: usize,
    speed: f64,
    probe_per_s: f64,
) -> Result<f64, String> {
    if !(probe_per_s > 0.0 && probe_per_s.is_finite()) {
        return Err("a share probe needs a positive rate".into());
    }
    let mut sc = probe_scenario(cores);
    sc.host_speed = speed;
    let whole = simulate(&sc, cal)?.per_s;
    Ok((probe_per_s / whole).clamp(0.02, 1.0))
}
