//! Per-core shards: N shared-nothing engines, one per (pinned) thread, each with its own
//! device queue, timers and applications, and flows steered to them by the symmetric
//! Toeplitz hash (seed 003, built in).
//!
//! [`Runtime::start`] takes a [`RuntimeSpec`]: where the shards run ([`Placement`]), one
//! device [`Queue`] per shard, a factory for each shard's [`EngineConfig`] and one for its
//! application. Each shard thread pins itself, builds its engine and its application *on its
//! own thread* (the factories see only a [`ShardInfo`] and, for the application, a `&mut
//! Engine` for the length of the call), wraps its queue in [`Steered`] and runs the one drive
//! loop, [`Host::run`], until the runtime is stopped, its application is done or its link goes
//! down. [`Runtime::join`] hands back, per shard, a [`ShardReport`]: the application itself
//! (so the caller reads its own results in its own types), the engine's counters and the
//! steering counters. The engine never leaves its thread: no `&Engine` escapes (the
//! application type is `'static`), and what comes back is owned data.
//!
//! Per-core listeners come for free: each shard's application listens on the port on its own
//! engine, and a connection is accepted by the shard its 4-tuple hashes to.
//!
//! Hook for RSS-aware ephemeral ports: the engine factory receives the shard's index and the
//! number of shards ([`ShardInfo`]), and
//! [`Steering::owner_of_flow`](crate::steer::Steering::owner_of_flow) says which shard a
//! 4-tuple belongs to.

use crate::steer::{Queue, SteerCounters, Steered};
use crate::xring::{Doorbell, RingSpec};
use crate::Host;
use flowstack_api::app::{App, Progress};
use flowstack_link::Device;
use flowstack_stack::{Counters, Engine, EngineConfig};
use std::error::Error;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// Largest CPU number [`parse_cores`] accepts.
pub const MAX_CPU: usize = 4095;

/// Why a core list did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoresError(String);

impl fmt::Display for CoresError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for CoresError {}

/// Parses a CPU list as `taskset -c` and `/sys/devices/system/cpu/online` write it:
/// comma-separated CPUs and inclusive ranges, e.g. `0-3,6` → `[0, 1, 2, 3, 6]`, in the
/// order given. Empty items, backward ranges, repeated CPUs and CPUs above [`MAX_CPU`] are
/// errors.
pub fn parse_cores(list: &str) -> Result<Vec<usize>, CoresError> {
    let err = |m: String| Err(CoresError(m));
    let num = |s: &str| -> Result<usize, CoresError> {
        let s = s.trim();
        match s.parse::<usize>() {
            Ok(n) if n <= MAX_CPU => Ok(n),
            Ok(n) => Err(CoresError(format!("core {n} is beyond {MAX_CPU}"))),
            Err(_) => Err(CoresError(format!("`{s}` is not a core number"))),
        }
    };
    if list.trim().is_empty() {
        return err("empty core list".into());
    }
    let mut out = Vec::new();
    let mut seen = vec![false; MAX_CPU + 1];
    for item in list.split(',') {
        let (lo, hi) = match item.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(item)?;
                (n, n)
            }
        };
        if lo > hi {
            return err(format!("core range {lo}-{hi} runs backwards"));
        }
        for (c, seen) in seen.iter_mut().enumerate().take(hi + 1).skip(lo) {
            if std::mem::replace(seen, true) {
                return err(format!("core {c} is listed twice"));
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// Where the shards run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Shard `i` pinned to CPU `cpus[i]` (one shard per CPU: no CPU twice).
    Pinned(Vec<usize>),
    /// Threads the scheduler places (tests, machines with fewer CPUs than shards).
    Floating,
}

/// Who a shard is, as its factories see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardInfo {
    /// Index, `0..count`; also its queue's and its steering owner number.
    pub index: usize,
    /// Number of shards.
    pub count: usize,
    /// The CPU it is pinned to.
    pub cpu: Option<usize>,
}

/// What a [`Runtime`] runs.
pub struct RuntimeSpec<C, F> {
    /// Where the shards run; with [`Placement::Pinned`], one CPU per queue.
    pub placement: Placement,
    /// One device queue per shard; the number of queues is the number of shards.
    pub queues: Vec<Queue>,
    /// Size of the cross-shard rings.
    pub rings: RingSpec,
    /// Builds a shard's engine configuration, on the shard's thread. Shards of one host
    /// share its addresses: usually the same configuration for every shard.
    pub engine: C,
    /// Builds a shard's application, on the shard's thread, over its fresh engine (listen
    /// here: each shard listens on its own engine).
    pub app: F,
}

/// Why a runtime did not start.
#[derive(Debug)]
pub enum StartError {
    /// The spec is inconsistent (no queue, CPUs not matching queues, a CPU twice).
    Spec(String),
    /// The cross-shard rings or a thread could not be created.
    Io(io::Error),
    /// A shard could not pin itself to its CPU.
    Pin {
        /// The shard.
        shard: usize,
        /// Its CPU.
        cpu: usize,
        /// Why.
        error: io::Error,
    },
    /// A shard's application factory failed.
    App {
        /// The shard.
        shard: usize,
        /// Why.
        error: Box<dyn Error + Send + Sync>,
    },
    /// A shard's thread panicked while starting.
    Panicked {
        /// The panic message.
        message: String,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Spec(m) => write!(f, "shards: {m}"),
            StartError::Io(e) => write!(f, "shards: {e}"),
            StartError::Pin { shard, cpu, error } => {
                write!(f, "shard {shard}: cannot pin to CPU {cpu}: {error}")
            }
            StartError::App { shard, error } => write!(f, "shard {shard}: {error}"),
            StartError::Panicked { message } => write!(f, "a shard panicked: {message}"),
        }
    }
}

impl Error for StartError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            StartError::Io(e) | StartError::Pin { error: e, .. } => Some(e),
            StartError::App { error, .. } => Some(&**error),
            _ => None,
        }
    }
}

/// What a shard hands back when it ends.
#[derive(Debug)]
pub struct ShardReport<A> {
    /// Which shard.
    pub shard: ShardInfo,
    /// Its application, to read its results.
    pub app: A,
    /// The application's last progress ([`Progress::Done`] if it finished by itself).
    pub progress: Progress,
    /// The engine's counters.
    pub counters: Counters,
    /// What steering did.
    pub steer: SteerCounters,
    /// The shard ended because its link went down.
    pub link_down: bool,
}

/// A shard thread that panicked after it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPanic {
    /// Which shard.
    pub shard: usize,
    /// The panic message.
    pub message: String,
}

impl fmt::Display for ShardPanic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {} panicked: {}", self.shard, self.message)
    }
}

impl Error for ShardPanic {}

/// Stops a running [`Runtime`] from any thread.
#[derive(Clone)]
pub struct StopHandle {
    flag: Arc<AtomicBool>,
    bells: Arc<[Doorbell]>,
}

impl fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopHandle")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

impl StopHandle {
    /// Tells every shard to stop after its current turn, and wakes the sleeping ones.
    pub fn stop(&self) {
        self.flag.store(true, Ordering::Release);
        for b in self.bells.iter() {
            b.force();
        }
    }

    /// True once [`StopHandle::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

/// Running shards; [`Runtime::join`] collects them. Dropping it stops and joins them.
pub struct Runtime<A> {
    threads: Vec<JoinHandle<Option<ShardReport<A>>>>,
    stop: StopHandle,
}

impl<A> fmt::Debug for Runtime<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("shards", &self.threads.len())
            .field("stop", &self.stop)
            .finish()
    }
}

/// A shard thread's startup outcome.
type Started = Result<(), StartError>;

impl<A: App<Engine> + Send + 'static> Runtime<A> {
    /// Starts one thread per queue, each building its engine and application; returns once
    /// every shard is running (its application built, so its listeners are up), or the
    /// first error after stopping and joining the shards that did start.
    pub fn start<C, F, E>(spec: RuntimeSpec<C, F>) -> Result<Self, StartError>
    where
        C: Fn(&ShardInfo) -> EngineConfig + Send + Sync + 'static,
        F: Fn(&ShardInfo, &mut Engine) -> Result<A, E> + Send + Sync + 'static,
        E: Into<Box<dyn Error + Send + Sync>>,
    {
        let n = spec.queues.len();
        let cpus = check_placement(&spec.placement, n)?;
        let devs = Steered::group(spec.queues, spec.rings).map_err(StartError::Io)?;
        let stop = StopHandle {
            flag: Arc::new(AtomicBool::new(false)),
            bells: devs[0].doorbells(),
        };
        let (engine_f, app_f) = (Arc::new(spec.engine), Arc::new(spec.app));
        let (tx, rx) = mpsc::channel::<Started>();
        let mut rt = Runtime {
            threads: Vec::with_capacity(n),
            stop: stop.clone(),
        };
        for (index, dev) in devs.into_iter().enumerate() {
            let info = ShardInfo {
                index,
                count: n,
                cpu: cpus.as_ref().map(|c| c[index]),
            };
            let (engine_f, app_f, tx) = (engine_f.clone(), app_f.clone(), tx.clone());
            let flag = stop.flag.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("flowstack-shard-{index}"))
                .spawn(move || shard_main(info, dev, &*engine_f, &*app_f, &flag, tx));
            match spawned {
                Ok(t) => rt.threads.push(t),
                Err(e) => return Err(StartError::Io(e)), // `rt` drops: stops and joins
            }
        }
        drop(tx);
        let mut first_err = None;
        let mut started = 0;
        // Every thread sends once and then drops its sender: the loop ends after n messages
        // or when a thread died before sending.
        while let Ok(r) = rx.recv() {
            started += 1;
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        if started < n && first_err.is_none() {
            rt.stop.stop();
            let message = rt
                .collect()
                .into_iter()
                .find_map(|r| r.err().map(|p| p.message))
                .unwrap_or_else(|| "a shard ended before it started".into());
            return Err(StartError::Panicked { message });
        }
        match first_err {
            Some(e) => Err(e), // `rt` drops: stops and joins
            None => Ok(rt),
        }
    }
}

impl<A> Runtime<A> {
    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.threads.len()
    }

    /// A handle that stops the shards from anywhere.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Tells every shard to stop (see [`StopHandle::stop`]).
    pub fn stop(&self) {
        self.stop.stop()
    }

    /// True once every shard thread has ended.
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// Waits for every shard to end (after [`Runtime::stop`], or when their applications are
    /// done) and returns their reports in shard order.
    pub fn join(mut self) -> Vec<Result<ShardReport<A>, ShardPanic>> {
        self.collect()
    }

    /// Stops the shards and returns their reports.
    pub fn shutdown(self) -> Vec<Result<ShardReport<A>, ShardPanic>> {
        self.stop();
        self.join()
    }

    fn collect(&mut self) -> Vec<Result<ShardReport<A>, ShardPanic>> {
        self.threads
            .drain(..)
            .enumerate()
            .filter_map(|(shard, t)| match t.join() {
                Ok(Some(r)) => Some(Ok(r)),
                Ok(None) => None, // failed to start: reported by `start`
                Err(p) => Some(Err(ShardPanic {
                    shard,
                    message: panic_message(&*p),
                })),
            })
            .collect()
    }
}

impl<A> Drop for Runtime<A> {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop.stop();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

fn check_placement(p: &Placement, n: usize) -> Result<Option<Vec<usize>>, StartError> {
    if n == 0 {
        return Err(StartError::Spec("no device queue, so no shard".into()));
    }
    match p {
        Placement::Floating => Ok(None),
        Placement::Pinned(cpus) => {
            if cpus.len() != n {
                return Err(StartError::Spec(format!(
                    "{} CPUs for {n} queues: one shard per CPU",
                    cpus.len()
                )));
            }
            if let Some(c) = cpus
                .iter()
                .find(|&&c| cpus.iter().filter(|&&d| d == c).count() > 1)
            {
                return Err(StartError::Spec(format!("CPU {c} given twice")));
            }
            Ok(Some(cpus.clone()))
        }
    }
}

/// One shard's thread: pin, build the engine and the application here, report the start,
/// run the drive loop, report.
fn shard_main<A, E>(
    info: ShardInfo,
    dev: Steered,
    engine_f: &(dyn Fn(&ShardInfo) -> EngineConfig + Send + Sync),
    app_f: &(dyn Fn(&ShardInfo, &mut Engine) -> Result<A, E> + Send + Sync),
    stop: &AtomicBool,
    started: mpsc::Sender<Started>,
) -> Option<ShardReport<A>>
where
    A: App<Engine>,
    E: Into<Box<dyn Error + Send + Sync>>,
{
    let fail = |e: StartError| {
        let _ = started.send(Err(e));
        None
    };
    if let Some(cpu) = info.cpu {
        if let Err(error) = flowstack_sys::affinity::pin_to_cpu(cpu) {
            return fail(StartError::Pin {
                shard: info.index,
                cpu,
                error,
            });
        }
    }
    let mut engine = Engine::new(engine_f(&info), dev.caps());
    let mut app = match app_f(&info, &mut engine) {
        Ok(a) => a,
        Err(e) => {
            return fail(StartError::App {
                shard: info.index,
                error: e.into(),
            })
        }
    };
    let _ = started.send(Ok(()));
    drop(started);
    let mut host = Host::new(engine, dev);
    let progress = host.run(&mut app, || stop.load(Ordering::Relaxed));
    Some(ShardReport {
        shard: info,
        app,
        progress,
        counters: host.engine.counters(),
        steer: host.dev.counters(),
        link_down: host.dev.link_down(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists_parse_as_taskset_writes_them() {
        assert_eq!(parse_cores("0-3,6").unwrap(), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cores("5").unwrap(), vec![5]);
        assert_eq!(parse_cores(" 2 , 0-1 ").unwrap(), vec![2, 0, 1]);
        assert_eq!(parse_cores("7-7").unwrap(), vec![7]);
        for bad in [
            "", " ", "a", "1,", ",1", "3-1", "1-", "-1", "1,1", "0-2,2", "1--2", "4096", "0-99999",
        ] {
            let e = parse_cores(bad).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad:?}");
        }
        assert!(parse_cores("0-4095").is_ok());
    }

    #[test]
    fn placement_must_match_the_queues() {
        assert!(check_placement(&Placement::Floating, 0).is_err());
        assert!(check_placement(&Placement::Floating, 3).unwrap().is_none());
        assert!(check_placement(&Placement::Pinned(vec![0, 1]), 3).is_err());
        assert!(check_placement(&Placement::Pinned(vec![0, 0]), 2).is_err());
        assert_eq!(
            check_placement(&Placement::Pinned(vec![1, 0]), 2).unwrap(),
            Some(vec![1, 0])
        );
    }
}
