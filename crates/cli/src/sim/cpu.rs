//! The CPU share a bench run got: from `/proc/stat` (what other processes took of the
//! CPUs) and this process's own CPU time, for the CPUs together ([`CpuSnapshot`]) or each
//! CPU by itself ([`OwnPerCpu`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// CPU time from `/proc/stat` (per CPU: busy incl. steal, and all) and this process's
/// (`/proc/self/stat`), in clock ticks: how much of the cores other processes (and the
/// hypervisor) took while a bench run ran.
pub(super) struct CpuSnapshot {
    /// Per CPU: (busy ticks incl. steal, all ticks).
    cpus: Vec<(u64, u64)>,
    /// This process's user + system ticks.
    own: u64,
}

impl CpuSnapshot {
    pub(super) fn take() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpus = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .map(|l| {
                let v: Vec<u64> = l
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                // user nice system idle iowait irq softirq steal
                let all: u64 = v.iter().take(8).sum();
                let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                (all - idle, all)
            })
            .collect();
        let own = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1.to_string();
                let f: Vec<&str> = rest.split_whitespace().collect();
                // After the name come fields 3 (state), 4, ...: utime and stime are fields
                // 14 and 15 of the line.
                let t = |i: usize| f.get(i - 3).and_then(|x| x.parse::<u64>().ok());
                Some(t(14)? + t(15)?)
            })
            .unwrap_or(0);
        CpuSnapshot { cpus, own }
    }

    /// The share of CPUs `0..cores` (where the bench pins its threads) not taken by others
    /// since `before`: 1 − (their busy ticks − this process's) / their ticks.
    pub(super) fn share_since(&self, before: &CpuSnapshot, cores: usize) -> Option<f64> {
        let n = cores.min(self.cpus.len()).min(before.cpus.len());
        if n == 0 {
            return None;
        }
        let (mut busy, mut all) = (0u64, 0u64);
        for i in 0..n {
            busy += self.cpus[i].0.saturating_sub(before.cpus[i].0);
            all += self.cpus[i].1.saturating_sub(before.cpus[i].1);
        }
        if all == 0 {
            return None;
        }
        let others = busy.saturating_sub(self.own.saturating_sub(before.own));
        Some((1.0 - others as f64 / all as f64).clamp(0.05, 1.0))
    }
}

/// Clock ticks per second of `/proc/stat` (`USER_HZ`: 100 on Linux's supported ABIs).
const TICKS_PER_S: f64 = 100.0;

/// This process's CPU time on each CPU while a run goes on: a thread of its own reads each
/// thread's run time (`/proc/self/task/T/schedstat`, ns) and the CPU it last ran on
/// (`/proc/self/task/T/stat`, field 39) every [`OwnPerCpu::EVERY`], and charges the run time
/// since the last reading to that CPU (the bench pins its threads, so a thread stays on its
/// CPU). A thread that starts between readings is counted from zero; one that ends loses at
/// most its last interval. With `/proc/stat`'s per-CPU ticks this gives each CPU's share
/// ([`OwnPerCpu::shares`]): what other processes took of *that* CPU.
pub(super) struct OwnPerCpu {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<f64>>,
    before: CpuSnapshot,
}

/// One thread's (run time ns, CPU).
fn task_reading(tid: &str) -> Option<(u64, usize)> {
    let run = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // After the name: field 3 (state) is the first; the CPU is field 39.
    let cpu = rest.split_whitespace().nth(39 - 3)?.parse().ok()?;
    Some((run, cpu))
}

fn tasks() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl OwnPerCpu {
    /// How often the threads are read.
    const EVERY: std::time::Duration = std::time::Duration::from_millis(5);

    /// Starts reading; `cpus` CPUs are tallied.
    pub(super) fn start(cpus: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let before = CpuSnapshot::take();
        let baseline: HashMap<String, u64> = tasks()
            .into_iter()
            .filter_map(|t| Some((t.clone(), task_reading(&t)?.0)))
            .collect();
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let me = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str().map(String::from));
            let mut last = baseline;
            let mut per_cpu = vec![0.0f64; cpus];
            loop {
                let done = s.load(Ordering::Relaxed);
                for t in tasks() {
                    if Some(&t) == me.as_ref() {
                        continue;
                    }
                    if let Some((run, cpu)) = task_reading(&t) {
                        let prev = last.insert(t, run).unwrap_or(0);
                        if let Some(c) = per_cpu.get_mut(cpu) {
                            *c += run.saturating_sub(prev) as f64;
                        }
                    }
                }
                if done {
                    return per_cpu;
                }
                std::thread::sleep(Self::EVERY);
            }
        });
        OwnPerCpu {
            stop,
            handle,
            before,
        }
    }

    /// Stops reading; each CPU's share since [`OwnPerCpu::start`]: 1 − (its busy ticks −
    /// this process's time on it) / its ticks (`None` where it has no ticks).
    pub(super) fn shares(self) -> Vec<Option<f64>> {
        self.stop.store(true, Ordering::Relaxed);
        let own = self.handle.join().unwrap_or_default();
        let now = CpuSnapshot::take();
        own.iter()
            .enumerate()
            .map(|(i, &ns)| {
                let (b, a) = (self.before.cpus.get(i)?, now.cpus.get(i)?);
                let all = a.1.saturating_sub(b.1) as f64;
                let busy = a.0.saturating_sub(b.0) as f64;
                (all > 0.0).then(|| {
                    let others = (busy - ns / 1e9 * TICKS_PER_S).max(0.0);
                    (1.0 - others / all).clamp(0.05, 1.0)
                })
            })
            .collect()
    }
}
