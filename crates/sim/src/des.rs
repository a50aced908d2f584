//! The discrete-event core: FIFO single-server resources (cores, the bus, the link, a lock)
//! that run jobs at their own speed, pure delays, and transactions that walk a script of
//! steps from resource to resource. A core may instead schedule *threads* ([`Des::threads`]):
//! the thread holding it keeps it until it blocks or its slice ends, as Linux's EEVDF does
//! between threads of equal weight. Time is integer picoseconds, so the accounting is exact
//! (work submitted = work done + work still queued, to the picosecond); randomness comes
//! from one seeded generator, so a run is a function of its inputs and its seed.
//!
//! Driving contract: build with [`Des::new`], add resources ([`Des::resource`]) and flows
//! ([`Des::flow`]), then [`Des::run`] once; read the [`Tally`] it returns. Nothing here reads
//! a clock or does I/O.

use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Simulated time and durations, picoseconds.
pub type Ps = u64;

/// Picoseconds per nanosecond.
pub const PS_PER_NS: f64 = 1000.0;

/// What a piece of work is, for the CPU breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cat {
    /// The application's own work (not protocol processing).
    App,
    /// Entering the stack: a system call, a library call or posting to a ring.
    Api,
    /// Copying payload between the application and the stack.
    Copy,
    /// Protocol processing (TCP/IP layers).
    Stack,
    /// Interrupt handling (per packet or per message).
    Interrupt,
    /// Waking a blocked thread and switching to it.
    Wakeup,
    /// A polling loop's turn that found the hand-off (instead of a wake-up).
    Poll,
    /// Time holding a lock shared by cores.
    Lock,
    /// Moving bytes on the bus or the link (not CPU).
    Wire,
}

/// Every category, in table order.
pub const CATS: [Cat; 9] = [
    Cat::App,
    Cat::Api,
    Cat::Copy,
    Cat::Stack,
    Cat::Interrupt,
    Cat::Wakeup,
    Cat::Poll,
    Cat::Lock,
    Cat::Wire,
];

impl Cat {
    fn idx(self) -> usize {
        self as usize
    }

    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Cat::App => "app",
            Cat::Api => "api",
            Cat::Copy => "copy",
            Cat::Stack => "stack",
            Cat::Interrupt => "interrupt",
            Cat::Wakeup => "wakeup",
            Cat::Poll => "poll",
            Cat::Lock => "lock",
            Cat::Wire => "wire",
        }
    }

    /// Whether this is protocol work done by a CPU (everything but the application's own
    /// work and the wire).
    pub fn is_protocol_cpu(self) -> bool {
        !matches!(self, Cat::App | Cat::Wire)
    }
}

/// What a resource stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A host CPU core (applications, and the stack in kernel/library/percore).
    HostCore,
    /// A stack core: an offload daemon's core or a NIC processor.
    StackCore,
    /// The bus (DMA/PIO or shared memory) between host and stack cores.
    Bus,
    /// The network link (serialisation at its bandwidth).
    Link,
    /// A pool of tokens each held for a fixed time after it is taken ([`Des::pool`]): no
    /// work, only a wait when every token is held.
    Pool,
}

/// One step of a script: work on a resource, or a pure delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The resource (an index from [`Des::resource`]); `None`: a delay of `ns`.
    pub res: Option<usize>,
    /// Nanoseconds of work at speed 1 (or of delay).
    pub ns: f64,
    /// What the work is.
    pub cat: Cat,
    /// A lock (an index from [`Des::lock`]) the work must hold: the core spins until the
    /// lock is free (spinning counted in [`ResTally::spin_ps`]), then holds it for the work.
    pub lock: Option<usize>,
    /// Work the transaction does not wait for: it is queued on the resource (which is busy
    /// with it as with any other job) and the transaction goes on at once — e.g. a thread
    /// going to sleep after it posted its command, while the stack core already works on it.
    pub detached: bool,
    /// The thread the work runs in, on a core with a scheduler ([`Des::threads`]); `None`:
    /// not a thread's work (served in arrival order).
    pub thread: Option<u32>,
}

/// The transaction index of a detached job (no transaction continues when it is done).
const DETACHED: usize = usize::MAX;

/// How a flow starts its transactions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Closed loop: `outstanding` transactions in flight; each completion starts the next
    /// after `think_ns`.
    Closed {
        /// Transactions in flight.
        outstanding: usize,
        /// Pause between a completion and the next start.
        think_ns: f64,
    },
    /// Open loop: Poisson arrivals at `per_s` transactions per second.
    Open {
        /// Mean arrival rate.
        per_s: f64,
    },
}

/// A flow: a connection (or a client) repeating one script.
#[derive(Debug, Clone)]
pub struct Flow {
    /// The steps of one transaction, in order.
    pub script: Vec<Step>,
    /// How transactions start.
    pub arrivals: Arrivals,
    /// Payload bytes one transaction moves (for throughput).
    pub bytes: u64,
    /// Where the response time is observed: before this step (`None`: at the end). The
    /// steps after it are still part of the transaction (a closed loop starts the next one
    /// only after them), but the client has taken its time stamp already — as a drive
    /// loop that reads its clock once per turn does.
    pub observe_at: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
struct Job {
    txn: usize,
    ps: Ps,
    cat: Cat,
    enq: Ps,
    lock: Option<usize>,
    thread: Option<u32>,
}

/// One resource's account.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResTally {
    /// Its name (e.g. "host0", "engine1", "bus", "link").
    pub name: String,
    /// What it is.
    pub kind: Kind,
    /// Its speed relative to the calibration's clock.
    pub speed: f64,
    /// Picoseconds busy per category ([`CATS`] order), up to the end of the run.
    pub busy_ps: [u64; 9],
    /// Picoseconds of work submitted.
    pub submitted_ps: u64,
    /// Picoseconds of work not done at the end (queued, or the rest of the running job).
    pub queued_ps: u64,
    /// Jobs started.
    pub jobs: u64,
    /// Sum of the jobs' waits in the queue before their service started, picoseconds.
    pub wait_ps: u128,
    /// Picoseconds spent spinning on a lock another core held (busy, but no submitted
    /// work: not in `busy_ps`).
    #[serde(default)]
    pub spin_ps: u64,
    /// Times a sleeping core ([`Des::sleeps`]) was woken.
    #[serde(default)]
    pub wakes: u64,
    /// A core that sleeps ([`Des::sleeps`]): picoseconds it spun idle before work came or
    /// it slept (CPU time of its thread, no work: not in `busy_ps`).
    #[serde(default)]
    pub idle_spin_ps: u64,
}

impl ResTally {
    /// Picoseconds busy in all.
    pub fn busy(&self) -> u64 {
        self.busy_ps.iter().sum()
    }

    /// Mean wait in the queue, nanoseconds.
    pub fn mean_wait_ns(&self) -> f64 {
        if self.jobs == 0 {
            0.0
        } else {
            self.wait_ps as f64 / self.jobs as f64 / PS_PER_NS
        }
    }
}

struct Resource {
    t: ResTally,
    queue: VecDeque<Job>,
    /// The running job and when its work (after any spin) started.
    running: Option<(Job, Ps)>,
    /// With a scheduler ([`Des::threads`]): a thread's time slice.
    slice: Option<Ps>,
    /// The thread holding the core and when it got it.
    current: Option<(u32, Ps)>,
    /// A pool ([`Des::pool`]): when each token is free again, earliest first, and how long
    /// a token is held.
    pool: Option<(VecDeque<Ps>, Ps)>,
    /// A stack core that sleeps ([`Des::sleeps`]): its spin and its wake-up latency.
    sleep: Option<(Ps, Ps)>,
    /// When it last ran out of work.
    idle_since: Ps,
}

struct Txn {
    flow: usize,
    step: usize,
    start: Ps,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The transaction reached its current step.
    Ready(usize),
    /// The resource's running job is done.
    Done(usize),
    /// A flow starts a transaction.
    Start(usize),
}

/// What a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tally {
    /// Simulated time at the end, picoseconds.
    pub end_ps: Ps,
    /// Transactions completed.
    pub completed: u64,
    /// Transactions started.
    pub started: u64,
    /// Payload bytes of the completed transactions.
    pub bytes: u64,
    /// Each observed response time, picoseconds, in observation order (a transaction whose
    /// flow observes it before its last step may be observed and not yet completed).
    pub latencies_ps: Vec<Ps>,
    /// Each resource.
    pub resources: Vec<ResTally>,
}

/// A small seeded generator (splitmix64): deterministic, no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Exponential with mean `mean`.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -self.unit().ln() * mean
    }
}

/// The simulator.
pub struct Des {
    now: Ps,
    seq: u64,
    heap: BinaryHeap<Reverse<(Ps, u64, Ev)>>,
    res: Vec<Resource>,
    /// Each lock: when it is free again.
    locks: Vec<Ps>,
    flows: Vec<Flow>,
    txns: Vec<Txn>,
    free: Vec<usize>,
    rng: Rng,
    completed: u64,
    started: u64,
    bytes: u64,
    latencies: Vec<Ps>,
}

fn to_ps(ns: f64) -> Ps {
    (ns.max(0.0) * PS_PER_NS).round() as Ps
}

impl Des {
    /// An empty simulator whose randomness comes from `seed`.
    pub fn new(seed: u64) -> Self {
        Des {
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            res: Vec::new(),
            locks: Vec::new(),
            flows: Vec::new(),
            txns: Vec::new(),
            free: Vec::new(),
            rng: Rng::new(seed),
            completed: 0,
            started: 0,
            bytes: 0,
            latencies: Vec::new(),
        }
    }

    /// Adds a resource running at `speed` (work of `ns` takes `ns / speed`); returns its index.
    pub fn resource(&mut self, name: impl Into<String>, kind: Kind, speed: f64) -> usize {
        assert!(speed > 0.0, "a resource needs a positive speed");
        self.res.push(Resource {
            t: ResTally {
                name: name.into(),
                kind,
                speed,
                busy_ps: [0; 9],
                submitted_ps: 0,
                queued_ps: 0,
                jobs: 0,
                wait_ps: 0,
                spin_ps: 0,
                wakes: 0,
                idle_spin_ps: 0,
            },
            queue: VecDeque::new(),
            running: None,
            slice: None,
            current: None,
            pool: None,
            sleep: None,
            idle_since: 0,
        });
        self.res.len() - 1
    }

    /// Makes core `r` spin `spin_ns` after it runs out of work, then sleep: a job that
    /// arrives while it sleeps starts `wake_ns` later (the doorbell and the wake-up of a
    /// thread on another core), as flowstackd's engine loop does (`--spin-us`, 50 µs).
    pub fn sleeps(&mut self, r: usize, spin_ns: f64, wake_ns: f64) {
        self.res[r].sleep = Some((to_ps(spin_ns), to_ps(wake_ns)));
    }

    /// Adds a pool of `tokens` tokens, each held for `hold_ns` from when it is taken (e.g.
    /// the ephemeral ports a TIME-WAIT keeps: one is reused only after a delay); returns its
    /// index, a resource a step names (its `ns` is ignored). A step on it waits until a token
    /// is free and takes the one free first: at most `tokens` steps per `hold_ns` pass, and
    /// none waits while fewer are taken.
    pub fn pool(&mut self, name: impl Into<String>, tokens: usize, hold_ns: f64) -> usize {
        let r = self.resource(name, Kind::Pool, 1.0);
        self.res[r].pool = Some((
            std::iter::repeat_n(0, tokens.max(1)).collect(),
            to_ps(hold_ns),
        ));
        r
    }

    /// Gives core `r` a scheduler of threads that block (Linux's EEVDF between threads of
    /// equal weight and slice, as [`crate::arch`] describes): the thread that got the core
    /// keeps it — its next job goes before every other thread's — until it blocks (it has
    /// no job queued here) or it has held the core for `slice_ns`; then the thread whose
    /// job has waited longest gets it. A woken thread never preempts the running one before
    /// that: with equal slices EEVDF's `RUN_TO_PARITY` protects the running thread until its
    /// virtual deadline, a slice after it was picked. Without it, a core serves jobs in
    /// arrival order (every job its own turn).
    pub fn threads(&mut self, r: usize, slice_ns: f64) {
        self.res[r].slice = Some(to_ps(slice_ns).max(1));
    }

    /// Adds a lock shared by resources; returns its index.
    pub fn lock(&mut self) -> usize {
        self.locks.push(0);
        self.locks.len() - 1
    }

    /// Adds a flow; its first transactions start at time 0 (closed) or after a first
    /// inter-arrival time (open).
    pub fn flow(&mut self, f: Flow) {
        let i = self.flows.len();
        match f.arrivals {
            Arrivals::Closed { outstanding, .. } => {
                for _ in 0..outstanding {
                    self.push(0, Ev::Start(i));
                }
            }
            Arrivals::Open { per_s } => {
                let t = to_ps(self.rng.exp(1e9 / per_s));
                self.push(t, Ev::Start(i));
            }
        }
        self.flows.push(f);
    }

    fn push(&mut self, at: Ps, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    /// Runs until `until` picoseconds or until `max_completed` transactions completed,
    /// whichever comes first; returns the tally.
    pub fn run(mut self, until: Ps, max_completed: u64) -> Tally {
        while let Some(Reverse((at, _, ev))) = self.heap.pop() {
            if at > until || self.completed >= max_completed {
                break;
            }
            self.now = at;
            match ev {
                Ev::Start(f) => self.start(f),
                Ev::Ready(t) => self.ready(t),
                Ev::Done(r) => self.done(r),
            }
        }
        let end = self.now;
        let resources = self
            .res
            .into_iter()
            .map(|mut r| {
                if let Some((job, started)) = r.running {
                    // The running job's elapsed part is done, its rest still queued (a job
                    // still spinning has done none of its work).
                    let done = end.saturating_sub(started).min(job.ps);
                    r.t.busy_ps[job.cat.idx()] += done;
                    r.t.queued_ps += job.ps - done;
                }
                r.t.queued_ps += r.queue.iter().map(|j| j.ps).sum::<u64>();
                r.t
            })
            .collect();
        Tally {
            end_ps: end,
            completed: self.completed,
            started: self.started,
            bytes: self.bytes,
            latencies_ps: self.latencies,
            resources,
        }
    }

    fn start(&mut self, f: usize) {
        if let Arrivals::Open { per_s } = self.flows[f].arrivals {
            let next = self.now + to_ps(self.rng.exp(1e9 / per_s)).max(1);
            self.push(next, Ev::Start(f));
        }
        self.started += 1;
        let txn = Txn {
            flow: f,
            step: 0,
            start: self.now,
        };
        let t = match self.free.pop() {
            Some(i) => {
                self.txns[i] = txn;
                i
            }
            None => {
                self.txns.push(txn);
                self.txns.len() - 1
            }
        };
        self.ready(t);
    }

    fn ready(&mut self, t: usize) {
        let (f, s) = (self.txns[t].flow, self.txns[t].step);
        let flow = &self.flows[f];
        let observed_at_end = flow.observe_at.is_none_or(|o| o >= flow.script.len());
        if flow.observe_at == Some(s) && !observed_at_end {
            self.latencies.push(self.now - self.txns[t].start);
        }
        let Some(&step) = flow.script.get(s) else {
            // Completed.
            self.completed += 1;
            self.bytes += flow.bytes;
            if observed_at_end {
                self.latencies.push(self.now - self.txns[t].start);
            }
            self.free.push(t);
            if let Arrivals::Closed { think_ns, .. } = flow.arrivals {
                let at = self.now + to_ps(think_ns);
                self.push(at, Ev::Start(f));
            }
            return;
        };
        self.txns[t].step += 1;
        match step.res {
            None => {
                let at = self.now + to_ps(step.ns);
                self.push(at, Ev::Ready(t));
            }
            Some(r) if self.res[r].pool.is_some() => {
                let now = self.now;
                let res = &mut self.res[r];
                let (free, hold) = res.pool.as_mut().expect("checked");
                // Tokens are taken in the order they come free, and each is free again
                // `hold` after it is taken: the queue stays sorted.
                let at = free.pop_front().unwrap_or(0).max(now);
                free.push_back(at + *hold);
                res.t.jobs += 1;
                res.t.wait_ps += u128::from(at - now);
                self.push(at, Ev::Ready(t));
            }
            Some(r) => {
                let ps = to_ps(step.ns / self.res[r].t.speed);
                self.res[r].t.submitted_ps += ps;
                self.res[r].queue.push_back(Job {
                    txn: if step.detached { DETACHED } else { t },
                    ps,
                    cat: step.cat,
                    enq: self.now,
                    lock: step.lock,
                    thread: step.thread,
                });
                if self.res[r].running.is_none() {
                    // An idle core that spun out its spin sleeps: the job waits for it.
                    let res = &self.res[r];
                    let idle = self.now.saturating_sub(res.idle_since);
                    let wake = match res.sleep {
                        Some((spin, wake)) if idle >= spin => wake,
                        _ => 0,
                    };
                    if let Some((spin, _)) = res.sleep {
                        self.res[r].t.idle_spin_ps += idle.min(spin);
                    }
                    if wake > 0 {
                        self.res[r].t.wakes += 1;
                    }
                    self.serve_next(r, wake);
                }
                if step.detached {
                    self.push(self.now, Ev::Ready(t));
                }
            }
        }
    }

    /// The next job of core `r`: with a scheduler, the holding thread's while it has one and
    /// its slice lasts, else (and without one) the one that waited longest.
    fn next_job(&mut self, r: usize) -> Option<Job> {
        let now = self.now;
        let res = &mut self.res[r];
        let Some(slice) = res.slice else {
            return res.queue.pop_front();
        };
        let at = match res.current {
            Some((th, since)) if now - since < slice => res
                .queue
                .iter()
                .position(|j| j.thread == Some(th))
                .unwrap_or(0),
            _ => 0,
        };
        let job = res.queue.remove(at);
        match job {
            Some(j) => {
                let holds = matches!(res.current, Some((th, since))
                    if j.thread == Some(th) && now - since < slice);
                if !holds {
                    res.current = j.thread.map(|t| (t, now));
                }
            }
            // Idle: the next thread to come gets a fresh slice.
            None => res.current = None,
        }
        job
    }

    /// Starts core `r`'s next job, `wake` picoseconds from now (a sleeping core's wake-up).
    fn serve_next(&mut self, r: usize, wake: Ps) {
        if let Some(job) = self.next_job(r) {
            let now = self.now + wake;
            // With a lock: spin until it is free, then hold it for the work.
            let start = match job.lock {
                Some(l) => {
                    let s = self.locks[l].max(now);
                    self.locks[l] = s + job.ps;
                    s
                }
                None => now,
            };
            let res = &mut self.res[r];
            res.t.jobs += 1;
            res.t.wait_ps += u128::from(self.now - job.enq);
            res.t.spin_ps += start - now;
            res.running = Some((job, start));
            let at = start + job.ps;
            self.push(at, Ev::Done(r));
        }
    }

    fn done(&mut self, r: usize) {
        let (job, _) = self.res[r].running.take().expect("a Done event has a job");
        // Busy until now: a spin before sleeping starts here, not at the last idle time.
        self.res[r].idle_since = self.now;
        self.res[r].t.busy_ps[job.cat.idx()] += job.ps;
        if job.txn != DETACHED {
            self.ready(job.txn);
        }
        if self.res[r].running.is_none() {
            self.serve_next(r, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_loop_over_two_cores_alternates_exactly() {
        let mut d = Des::new(1);
        let a = d.resource("a", Kind::HostCore, 1.0);
        let b = d.resource("b", Kind::HostCore, 2.0);
        d.flow(Flow {
            script: vec![
                Step {
                    res: Some(a),
                    ns: 100.0,
                    cat: Cat::Stack,
                    lock: None,
                    detached: false,
                    thread: None,
                },
                Step {
                    res: None,
                    ns: 50.0,
                    cat: Cat::Wire,
                    lock: None,
                    detached: false,
                    thread: None,
                },
                Step {
                    res: Some(b),
                    ns: 100.0,
                    cat: Cat::App,
                    lock: None,
                    detached: false,
                    thread: None,
                },
            ],
            arrivals: Arrivals::Closed {
                outstanding: 1,
                think_ns: 0.0,
            },
            bytes: 10,
            observe_at: None,
        });
        let t = d.run(u64::MAX, 10);
        // 100 + 50 + 100/2 = 200 ns per transaction.
        assert_eq!(t.completed, 10);
        assert!(t.latencies_ps.iter().all(|&l| l == 200_000));
        assert_eq!(t.resources[0].busy_ps[Cat::Stack.idx()], 10 * 100_000);
        assert_eq!(t.resources[1].busy_ps[Cat::App.idx()], 10 * 50_000);
        assert_eq!(t.bytes, 100);
    }

    #[test]
    fn a_response_observed_before_the_last_step_excludes_it_from_the_latency_not_the_cycle() {
        let mut d = Des::new(1);
        let a = d.resource("a", Kind::HostCore, 1.0);
        let step = |ns| Step {
            res: Some(a),
            ns,
            cat: Cat::Poll,
            lock: None,
            detached: false,
            thread: None,
        };
        d.flow(Flow {
            script: vec![step(300.0), step(100.0)],
            arrivals: Arrivals::Closed {
                outstanding: 1,
                think_ns: 0.0,
            },
            bytes: 0,
            observe_at: Some(1),
        });
        let t = d.run(u64::MAX, 10);
        // A cycle of 400 ns, each response seen after 300 of them.
        assert_eq!(t.completed, 10);
        assert_eq!(t.end_ps, 10 * 400_000);
        assert!(t.latencies_ps.len() >= 10);
        assert!(
            t.latencies_ps.iter().all(|&l| l == 300_000),
            "{:?}",
            t.latencies_ps
        );
    }

    /// Thread A runs a burst of five 1 µs jobs on one core, then sleeps 10 µs; thread B is
    /// woken 0.5 µs after A got the core and needs 0.1 µs. B's first response time, in
    /// closed form: without a scheduler each job is its own turn, so B waits only for A's
    /// running job (0.5 + 0.5 + 0.1 = 1.1 µs); with one, B waits until A blocks
    /// (0.5 + 4.5 + 0.1 = 5.1 µs) or, with a 2 µs slice, until the first job boundary at or
    /// after A's slice ends (2 + 0.1 = 2.1 µs): the wait is bounded by the slice plus a job.
    #[test]
    fn a_woken_thread_waits_for_the_running_thread_to_block_or_its_slice_to_end() {
        let first_b = |slice_ns: Option<f64>| {
            let mut d = Des::new(1);
            let core = d.resource("core", Kind::HostCore, 1.0);
            if let Some(s) = slice_ns {
                d.threads(core, s);
            }
            let job = |thread| Step {
                res: Some(core),
                ns: 1000.0,
                cat: Cat::App,
                lock: None,
                detached: false,
                thread: Some(thread),
            };
            let sleep = |ns| Step {
                res: None,
                ns,
                cat: Cat::Wire,
                lock: None,
                detached: false,
                thread: None,
            };
            let closed = Arrivals::Closed {
                outstanding: 1,
                think_ns: 0.0,
            };
            let mut a = vec![job(0); 5];
            a.push(sleep(10_000.0));
            d.flow(Flow {
                script: a,
                arrivals: closed,
                bytes: 0,
                observe_at: None,
            });
            d.flow(Flow {
                script: vec![
                    sleep(500.0),
                    Step {
                        ns: 100.0,
                        ..job(1)
                    },
                ],
                arrivals: closed,
                bytes: 0,
                observe_at: None,
            });
            // Before A's first transaction ends (15 µs): only B's responses.
            let t = d.run(5_500_000, u64::MAX);
            t.latencies_ps[0]
        };
        assert_eq!(first_b(None), 1_100_000);
        assert_eq!(first_b(Some(1e6)), 5_100_000);
        assert_eq!(first_b(Some(2000.0)), 2_100_000);
    }

    /// A pool of 2 tokens held 1000 ns each: a closed loop of 100 ns steps runs two
    /// transactions per 1000 ns, not ten; a free token costs no wait.
    #[test]
    fn a_pool_lets_through_its_tokens_per_hold_time() {
        let mut d = Des::new(1);
        let a = d.resource("a", Kind::HostCore, 1.0);
        let p = d.pool("ports", 2, 1000.0);
        let st = |res, ns| Step {
            res: Some(res),
            ns,
            cat: Cat::Stack,
            lock: None,
            detached: false,
            thread: None,
        };
        d.flow(Flow {
            script: vec![st(p, 0.0), st(a, 100.0)],
            arrivals: Arrivals::Closed {
                outstanding: 1,
                think_ns: 0.0,
            },
            bytes: 0,
            observe_at: None,
        });
        let t = d.run(u64::MAX, 20);
        // Tokens taken at 0, 100, then 1000, 1100, 2000, 2100, ...: transaction 20 ends
        // at 9100 + 100.
        assert_eq!(t.end_ps, 9_200_000);
        assert_eq!(t.latencies_ps[0], 100_000);
        assert_eq!(t.latencies_ps[2], 900_000);
        assert_eq!(t.resources[p].busy(), 0);
    }

    #[test]
    fn detached_work_keeps_its_resource_busy_but_not_the_transaction_waiting() {
        let mut d = Des::new(1);
        let a = d.resource("a", Kind::HostCore, 1.0);
        let b = d.resource("b", Kind::StackCore, 1.0);
        let st = |res, ns, detached| Step {
            res: Some(res),
            ns,
            cat: Cat::Wakeup,
            lock: None,
            detached,
            thread: None,
        };
        d.flow(Flow {
            // Post (a, 100), go to sleep on a (300, detached) while b works (500).
            script: vec![st(a, 100.0, false), st(a, 300.0, true), st(b, 500.0, false)],
            arrivals: Arrivals::Closed {
                outstanding: 1,
                think_ns: 0.0,
            },
            bytes: 0,
            observe_at: None,
        });
        let t = d.run(u64::MAX, 5);
        // 100 + 500 per transaction: the 300 overlap with b's work.
        assert!(
            t.latencies_ps.iter().all(|&l| l == 600_000),
            "{:?}",
            t.latencies_ps
        );
        assert_eq!(t.resources[a].busy_ps[Cat::Wakeup.idx()], 5 * 400_000);
        assert_eq!(
            t.resources[a].submitted_ps,
            t.resources[a].busy() + t.resources[a].queued_ps
        );
    }
}
