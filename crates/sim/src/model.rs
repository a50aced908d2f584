//! Architectures as configurations and workloads as scripts: a [`Scenario`] becomes
//! resources and flows of the discrete-event core ([`crate::des`]), and its tally an
//! [`Outcome`].
//!
//! One message of `s` bytes from side A to side B is, in every architecture, the same
//! sequence — A's application calls the stack, the payload is copied or lent, the stack
//! sends it in segments, the medium carries them, B's side is notified, B's stack receives
//! them, B's application is handed the data — and the architecture decides *where* each step
//! runs and *what* it costs ([`Arch`]):
//!
//! | arch | API | copy | stack runs on | receive notification | hand-off to the app |
//! |---|---|---|---|---|---|
//! | kernel | system call | yes | host core (rx: the packet's core) | interrupt per packet | wake-up (cross-core if the rx core differs) |
//! | library | library call | yes | host core (rx: the packet's core) | interrupt per packet | wake-up |
//! | percore | library call | no (zero-copy) | the flow's core (RSS) | polling | polling loop turn |
//! | offload[:E] | ring post | over the bus | E stack cores at `ratio`x | interrupt per *message* | wake-up |
//! | daemon[:E] | ring post | over the bus (shared memory) | E stack cores at `ratio`x | event ring | polling loop turn |

pub use crate::arch::{Api, Arch, Handoff, Notify};
use crate::calib::{Calibration, StackCosts};
use crate::des::{Arrivals, Cat, Des, Flow, Kind, Rng, Step, Tally};
use serde::{Deserialize, Serialize};

/// What the clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// One-way bulk transfer of `size`-byte writes.
    Stream,
    /// Request and response of `size` bytes each on an open connection.
    Rr,
    /// Connect, request, response (`size` bytes each), close.
    Crr,
    /// A small request, then a file of `size` bytes back (read from the page cache).
    File,
}

impl Workload {
    /// Parses `stream`, `rr`, `crr`, `file`.
    pub fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "stream" => Workload::Stream,
            "rr" => Workload::Rr,
            "crr" => Workload::Crr,
            "file" => Workload::File,
            _ => return Err(format!("unknown workload {s:?} (stream, rr, crr, file)")),
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Stream => "stream",
            Workload::Rr => "rr",
            Workload::Crr => "crr",
            Workload::File => "file",
        }
    }
}

/// Where the load generator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clients {
    /// On other machines across the link; their own costs are not simulated.
    Remote,
    /// On the same cores as the server, as `flowstack bench --cores N` runs them: flow k's
    /// client on core k mod N, both sides using the architecture, over loopback.
    Colocated,
    /// Two cores, client on core 0 and server on core 1 (`bench --kernel-placement split`).
    Split,
}

/// One simulation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scenario {
    /// The architecture.
    pub arch: Arch,
    /// The workload.
    pub workload: Workload,
    /// Message (or write, or file) size, bytes.
    pub size: usize,
    /// Host cores.
    pub cores: usize,
    /// Connections (closed loop) or clients (open loop).
    pub conns: usize,
    /// Open loop: offered transactions per second in all; `None`: closed loop.
    pub load: Option<f64>,
    /// Application work per request on the server, ns.
    pub app_ns: f64,
    /// Where the clients run.
    pub clients: Clients,
    /// Transactions to complete (the run also stops after `max_secs` simulated).
    pub txns: u64,
    /// Longest simulated time, seconds.
    pub max_secs: f64,
    /// The seed of every random choice (flow placement, arrivals, errors).
    pub seed: u64,
    /// The share of each host core this run gets (1: all of it; less when other processes
    /// compete for the cores, as on a shared machine): host cores run at this speed.
    #[serde(default = "one")]
    pub host_share: f64,
    /// Colocated clients, flows not steered to their core (the kernel's `SO_REUSEPORT`):
    /// the server core of each connection, instead of the seeded hash (to predict each
    /// placement a run can get).
    #[serde(default)]
    pub server_cores: Option<Vec<usize>>,
}

fn one() -> f64 {
    1.0
}

impl Scenario {
    /// A closed-loop scenario with remote clients and the defaults (four connections per
    /// core, one per core for stream).
    pub fn new(arch: Arch, workload: Workload, size: usize, cores: usize) -> Self {
        Scenario {
            arch,
            workload,
            size,
            cores,
            conns: cores.max(1) * if workload == Workload::Stream { 1 } else { 4 },
            load: None,
            app_ns: 0.0,
            clients: Clients::Remote,
            txns: 20_000,
            max_secs: 10.0,
            seed: 1,
            host_share: 1.0,
            server_cores: None,
        }
    }
}

/// What a simulation predicts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    /// Architecture name.
    pub arch: String,
    /// Workload name.
    pub workload: String,
    /// Size, bytes.
    pub size: usize,
    /// Host cores.
    pub cores: usize,
    /// Offered load (open loop), per s.
    pub load: Option<f64>,
    /// Completed transactions per second (connections/s for crr).
    pub per_s: f64,
    /// Payload throughput, Mbit/s.
    pub mbps: f64,
    /// Mean response time, µs.
    pub mean_us: f64,
    /// Median response time, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Host CPU busy, share of all host cores (0..1).
    pub host_util: f64,
    /// Host CPU time spent on protocol work per transaction, µs (everything but the
    /// application's own work).
    pub host_protocol_us_per_txn: f64,
    /// Host CPU per transaction by category, µs.
    pub host_us_by_cat: Vec<(String, f64)>,
    /// Stack cores busy, share (offload; 0 otherwise).
    pub engine_util: f64,
    /// Link busy, share.
    pub link_util: f64,
    /// Simulated seconds.
    pub sim_secs: f64,
    /// Transactions completed.
    pub completed: u64,
}

/// Places a script step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// The resources one flow touches.
#[derive(Debug, Clone, Copy)]
struct Places {
    /// The client's application core (`None`: remote, not simulated).
    c_app: Option<usize>,
    /// The client's receive core.
    c_rx: Option<usize>,
    /// The server's application core.
    s_app: usize,
    /// The server's receive core.
    s_rx: usize,
    /// The flow's stack core (offload).
    engine: Option<usize>,
    link: Option<usize>,
    bus: Option<usize>,
    lock: Option<usize>,
    /// The local ports the client's `connect()` takes ([`Des::pool`]), where they limit.
    ports: Option<usize>,
}

struct Builder<'a> {
    cal: &'a Calibration,
    arch: &'a Arch,
    stack: &'a StackCosts,
    p: Places,
    steps: Vec<Step>,
    remote: bool,
    error_rate: f64,
    /// The step before which the client observes the response (`None`: at the end).
    observe_at: Option<usize>,
    /// The flow's index (its threads are `2 k` for the client, `2 k + 1` for the server).
    flow: u32,
    /// Whose thread the next host steps run in.
    who: Side,
}

impl Builder<'_> {
    /// The thread of `self.who` on a core with a scheduler: a simulated application thread
    /// (a remote client's work, and interrupts on its behalf, are no thread here).
    fn thread(&self) -> Option<u32> {
        self.app(self.who)?;
        Some(2 * self.flow + u32::from(self.who == Side::Server))
    }

    fn on(&mut self, res: Option<usize>, ns: f64, cat: Cat) {
        if ns > 0.0 {
            if let Some(r) = res {
                self.steps.push(Step {
                    res: Some(r),
                    ns,
                    cat,
                    lock: None,
                    detached: false,
                    thread: self.thread(),
                });
            }
        }
    }

    fn delay(&mut self, ns: f64) {
        if ns > 0.0 {
            self.steps.push(Step {
                res: None,
                ns,
                cat: Cat::Wire,
                lock: None,
                detached: false,
                thread: self.thread(),
            });
        }
    }

    /// Work on `res` the transaction does not wait for.
    fn detach(&mut self, res: Option<usize>, ns: f64, cat: Cat) {
        if let (Some(r), true) = (res, ns > 0.0) {
            self.steps.push(Step {
                res: Some(r),
                ns,
                cat,
                lock: None,
                detached: true,
                thread: self.thread(),
            });
        }
    }

    /// After a woken application's first call: the CPU of its blocking wait (going to
    /// sleep, the switches), which it spends off the transaction's path — while the stack
    /// core works on what it posted, and after it took the event (`daemon-wake` only).
    fn after_wake(&mut self, side: Side) {
        self.who = side;
        if self.arch.handoff == Handoff::Futex && self.p.engine.is_some() {
            let a = self.app(side);
            self.detach(a, self.cal.host.app_wait_ns, Cat::Wakeup);
        }
    }

    fn app(&self, side: Side) -> Option<usize> {
        match side {
            Side::Client => self.p.c_app,
            Side::Server => Some(self.p.s_app),
        }
    }

    fn rx(&self, side: Side) -> Option<usize> {
        match side {
            Side::Client => self.p.c_rx,
            Side::Server => Some(self.p.s_rx),
        }
    }

    /// Where `side`'s stack runs when it sends.
    fn tx_stack(&self, side: Side) -> Option<usize> {
        match self.p.engine {
            Some(e) => match side {
                Side::Server => Some(e),
                // Remote clients cost nothing here.
                Side::Client => (!self.remote).then_some(e),
            },
            None => self.app(side),
        }
    }

    /// Where `to`'s stack receives what `from` sent.
    fn rx_stack(&self, from: Side, to: Side) -> Option<usize> {
        if let Some(e) = self.p.engine {
            return (to == Side::Server || !self.remote).then_some(e);
        }
        if self.remote {
            self.rx(to)
        } else {
            // Loopback: the receive processing runs on the sender's core (softirq on the
            // sending CPU; a flowstack per-core pipe is turned by that core's loop).
            self.app(from)
        }
    }

    /// One application call into the stack on `side`.
    fn api(&mut self, side: Side) {
        self.who = side;
        let h = self.cal.host.clone();
        let (ns, cat) = match self.arch.api {
            Api::Syscall => (h.syscall_ns, Cat::Api),
            Api::Library => (h.lib_call_ns, Cat::Api),
            Api::Ring => (h.ring_ns, Cat::Api),
        };
        let r = self.app(side);
        self.on(r, ns, cat);
        if self.arch.api == Api::Ring && (side == Side::Server || !self.remote) {
            // The stack core reads the command (or posts the event) and dispatches it.
            let e = self.p.engine;
            self.on(e, h.stack_op_ns, Cat::Api);
        }
    }

    fn packets(&self, bytes: usize) -> usize {
        let seg = self.stack.max_segment.max(1);
        let mtu = if self.remote { self.cal.link.mtu } else { seg };
        let per_seg = seg.min(mtu.max(64));
        bytes.div_ceil(per_seg).max(1)
    }

    fn segments(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.stack.max_segment.max(1)).max(1)
    }

    /// Carries `bytes` in `pkts` packets across the medium between the two sides.
    fn medium(&mut self, bytes: usize, pkts: usize) {
        if self.remote {
            let l = &self.cal.link;
            let wire = (bytes + pkts * l.header_bytes) as f64 * 8.0 / l.gbps;
            let link = self.p.link;
            self.on(link, wire, Cat::Wire);
            self.delay(l.latency_ns);
        }
    }

    /// Moves `bytes` over the bus between a host core and a stack core.
    fn bus(&mut self, side: Side, bytes: usize) {
        self.who = side;
        let b = &self.cal.bus;
        let host = self.app(side);
        let pio = bytes as f64 * b.host_per_byte_ns;
        self.on(host, pio, Cat::Copy);
        let b = &self.cal.bus;
        let bus = self.p.bus;
        self.on(bus, bytes as f64 * 8.0 / b.gbps, Cat::Wire);
        self.delay(b.latency_ns);
    }

    /// Hands received data from the core that received it (`from_core`) to `to`'s
    /// application.
    fn handoff(&mut self, from_core: Option<usize>, to: Side) {
        self.who = to;
        let target = self.app(to);
        let h = &self.cal.host;
        match self.arch.handoff {
            Handoff::Poll => self.on(target, h.poll_turn_ns, Cat::Poll),
            Handoff::Wakeup => {
                if from_core.is_some() && target.is_some() && from_core != target {
                    self.delay(h.cross_core_ns);
                }
                self.on(target, h.wakeup_ns, Cat::Wakeup);
            }
            Handoff::Futex => self.futex_wake(to),
        }
    }

    /// A synchronous ring call (connect, close) on a daemon whose applications sleep: the
    /// stack core posts the completion and wakes the caller (`daemon-wake` only; other
    /// architectures' costs for these calls are in their connection work).
    fn sync_wait(&mut self, side: Side) {
        if self.arch.handoff == Handoff::Futex && self.p.engine.is_some() {
            let e = self.p.engine;
            self.on(e, self.cal.host.stack_op_ns, Cat::Api);
            self.futex_wake(side);
            self.after_wake(side);
        }
    }

    /// The stack core wakes `to`'s sleeping application on another core: the wake-up's
    /// latency (its CPU is [`Builder::after_wake`]'s).
    fn futex_wake(&mut self, to: Side) {
        if self.app(to).is_some() {
            self.delay(self.cal.host.cross_core_ns);
        }
    }

    /// One message of `s` bytes from `from` to `to` (`wake`: the receiver was blocked
    /// waiting for it).
    fn message(&mut self, from: Side, to: Side, s: usize, wake: bool) {
        let h = self.cal.host.clone();
        let st = self.stack.clone();
        let segs = self.segments(s);
        let pkts = self.packets(s);
        // Inflation by corrupted packets: each is sent and received again (seed 001 eq. 5).
        let again = 1.0 / (1.0 - self.error_rate.clamp(0.0, 0.99));
        // Sender (the loopback receive processing too: it runs in the sender's call).
        self.api(from);
        let a = self.app(from);
        if self.arch.copy && self.p.engine.is_none() {
            self.on(a, s as f64 * h.copy_per_byte_ns, Cat::Copy);
        }
        if self.p.engine.is_some() && (from == Side::Server || !self.remote) {
            self.bus(from, s);
        }
        let txs = self.tx_stack(from);
        let send = segs as f64 * st.send_fixed_ns + s as f64 * st.send_per_byte_ns;
        self.on(txs, send * again, Cat::Stack);
        // Medium.
        self.medium(s, pkts);
        // Receiver.
        let rxs = self.rx_stack(from, to);
        if self.remote && self.arch.notify == Notify::InterruptPerPacket && self.p.engine.is_none()
        {
            self.on(rxs, pkts as f64 * h.interrupt_ns * again, Cat::Interrupt);
        }
        if self.arch.notify == Notify::Poll && self.p.engine.is_none() && rxs != a {
            self.on(rxs, h.poll_turn_ns, Cat::Poll);
        }
        let recv = segs as f64 * st.recv_fixed_ns + s as f64 * st.recv_per_byte_ns;
        self.on(rxs, recv * again, Cat::Stack);
        let b = self.app(to);
        if self.p.engine.is_some() {
            if to == Side::Server || !self.remote {
                self.bus(to, s);
                // One notification per message (not per packet): an interrupt on a NIC,
                // a ring event the application's wait picks up on a daemon.
                match self.arch.handoff {
                    // A NIC interrupts the host once per message; a blocked reader is woken.
                    Handoff::Wakeup => {
                        self.on(b, h.interrupt_ns, Cat::Interrupt);
                        if wake {
                            self.on(b, h.wakeup_ns, Cat::Wakeup);
                        }
                    }
                    // A daemon's event ring, polled by the busy application.
                    Handoff::Poll => self.on(b, h.poll_turn_ns, Cat::Poll),
                    // A daemon wakes the application sleeping for the message.
                    Handoff::Futex => {
                        if wake {
                            self.futex_wake(to);
                        }
                    }
                }
            }
            self.api(to);
            if wake {
                self.after_wake(to);
            }
        } else {
            if wake {
                self.handoff(rxs, to);
            }
            self.api(to);
            if self.arch.copy {
                self.on(b, s as f64 * h.copy_per_byte_ns, Cat::Copy);
            }
        }
    }

    /// Whether both sides run in flowstack's bench drive loop (`bench --cores N`): one
    /// thread per core turning the client engine, the client app, the server engine and the
    /// server app, with one clock read per turn.
    fn drive_loop(&self) -> bool {
        !self.remote
            && self.p.engine.is_none()
            && self.arch.handoff == Handoff::Poll
            && self.p.c_app == Some(self.p.s_app)
    }

    /// One rr transaction in the drive loop: four turns. (1) The client app sends, stamped
    /// with the turn's clock read; (2) the client engine transmits, the server engine
    /// receives, the server app answers; (3) the server engine transmits; (4) the client
    /// engine receives and the client app sees the answer — stamped with turn 4's clock
    /// read, taken *before* that turn's work, so the response time is turns 1–3 — and the
    /// next request waits for turn 5 (the client steps each connection once per turn). The
    /// cycle (and so the rate) is all four turns.
    fn drive_loop_rr(&mut self, s: usize, app_ns: f64) {
        let st = self.stack.clone();
        let turn = self.cal.host.poll_turn_ns;
        let segs = self.segments(s) as f64;
        let send = segs * st.send_fixed_ns + s as f64 * st.send_per_byte_ns;
        let recv = segs * st.recv_fixed_ns + s as f64 * st.recv_per_byte_ns;
        let (c, srv) = (self.p.c_app, Some(self.p.s_app));
        self.on(c, turn, Cat::Poll);
        self.on(c, turn, Cat::Poll);
        self.on(c, send, Cat::Stack);
        self.on(srv, recv, Cat::Stack);
        self.app_work(app_ns);
        self.on(srv, turn, Cat::Poll);
        self.on(srv, send, Cat::Stack);
        self.observe_at = Some(self.steps.len());
        self.on(c, turn, Cat::Poll);
        self.on(c, recv, Cat::Stack);
    }

    /// A control segment (SYN, FIN, pure ACK) from `from` to `to`.
    fn control(&mut self, from: Side, to: Side) {
        let st = self.stack.clone();
        let h = self.cal.host.clone();
        self.who = from;
        let txs = self.tx_stack(from);
        self.on(txs, st.ctrl_send_ns, Cat::Stack);
        self.medium(0, 1);
        let rxs = self.rx_stack(from, to);
        if self.remote && self.arch.notify == Notify::InterruptPerPacket && self.p.engine.is_none()
        {
            self.on(rxs, h.interrupt_ns, Cat::Interrupt);
        }
        self.on(rxs, st.ctrl_recv_ns, Cat::Stack);
    }

    /// The client's `connect()` takes a local port: it waits when every port is still in
    /// TIME-WAIT ([`HostCosts::connect_ports`](crate::calib::HostCosts::connect_ports)).
    fn take_port(&mut self) {
        if let Some(p) = self.p.ports {
            self.who = Side::Client;
            self.steps.push(Step {
                res: Some(p),
                ns: 0.0,
                cat: Cat::Wire,
                lock: None,
                detached: false,
                thread: None,
            });
        }
    }

    fn app_work(&mut self, ns: f64) {
        self.who = Side::Server;
        let s = Some(self.p.s_app);
        self.on(s, ns, Cat::App);
    }

    /// The connection's set-up and tear-down work beyond its segments.
    fn conn_work(&mut self) {
        let st = self.stack.clone();
        let h = self.cal.host.clone();
        // Both halves run in the client's connect (the server's in its loopback receive).
        self.who = Side::Client;
        let c = self.tx_stack(Side::Client);
        self.on(c, st.conn_ns / 2.0, Cat::Stack);
        let s = self.rx_stack(Side::Client, Side::Server);
        if self.arch.shared_conn_lock && self.p.lock.is_some() {
            // The server side's connection work runs under the lock all cores share (its
            // time is counted as host CPU: some core holds the lock meanwhile).
            let hold = h.shared_conn_ns.min(st.conn_ns / 2.0);
            self.on(s, st.conn_ns / 2.0 - hold, Cat::Stack);
            if let Some(core) = s {
                self.steps.push(Step {
                    res: Some(core),
                    ns: hold + h.bounce_ns,
                    cat: Cat::Lock,
                    lock: self.p.lock,
                    detached: false,
                    thread: self.thread(),
                });
            }
        } else {
            self.on(s, st.conn_ns / 2.0, Cat::Stack);
        }
    }
}

fn hash(seed: u64, k: usize) -> u64 {
    let mut r = Rng::new(seed.wrapping_mul(0x100_0000_01b3) ^ k as u64);
    r.next_u64()
}

/// Builds the simulator for `sc` under `cal`.
fn build(sc: &Scenario, cal: &Calibration) -> Result<(Des, Vec<usize>, Vec<usize>), String> {
    if sc.cores == 0 || sc.conns == 0 || sc.size == 0 {
        return Err("a scenario needs cores, connections and a size of at least 1".into());
    }
    if !(sc.host_share > 0.0 && sc.host_share <= 1.0) {
        return Err("the host share must be in (0, 1]".into());
    }
    let a = &sc.arch;
    let mut d = Des::new(sc.seed);
    let host_cores = match sc.clients {
        Clients::Split => 2,
        _ => sc.cores,
    };
    let hosts: Vec<usize> = (0..host_cores)
        .map(|i| d.resource(format!("host{i}"), Kind::HostCore, sc.host_share))
        .collect();
    if a.handoff != Handoff::Poll {
        // Threads that block and are woken share the host cores under the OS scheduler; a
        // polling architecture runs one loop per core.
        for &h in &hosts {
            d.threads(h, cal.host.sched_slice_ns);
        }
    }
    let engine_speed = a.engine_ratio
        * if a.engines_on_host {
            sc.host_share
        } else {
            1.0
        };
    let engines: Vec<usize> = (0..a.engines)
        .map(|i| d.resource(format!("engine{i}"), Kind::StackCore, engine_speed))
        .collect();
    if a.engines_on_host && cal.host.engine_spin_ns > 0.0 {
        // A daemon's engine thread spins, then sleeps until a doorbell wakes it.
        for &e in &engines {
            d.sleeps(e, cal.host.engine_spin_ns, cal.host.cross_core_ns);
        }
    }
    let remote = sc.clients == Clients::Remote;
    let link = remote.then(|| d.resource("link", Kind::Link, 1.0));
    let bus = (!engines.is_empty()).then(|| d.resource("bus", Kind::Bus, 1.0));
    let lock = (a.shared_conn_lock && sc.workload == Workload::Crr).then(|| d.lock());
    // The kernel's clients on this host connect to one address: its ephemeral ports limit
    // the connection rate. Simulated as a pool held at most a millisecond (the same tokens
    // per second), so that a run of a few thousand connections reaches the steady state.
    let h = &cal.host;
    let ports = (a.kernel_stack
        && sc.clients != Clients::Remote
        && sc.workload == Workload::Crr
        && h.connect_ports >= 1.0
        && h.port_reuse_ns > 0.0)
        .then(|| {
            let tokens = (h.connect_ports * (1e6 / h.port_reuse_ns).min(1.0)).ceil();
            let hold = tokens / h.connect_ports * h.port_reuse_ns;
            d.pool("ports", tokens as usize, hold)
        });
    let stack = if a.kernel_stack {
        &cal.kernel
    } else {
        cal.flowstack()
    };
    // In a single-core run the lock's line never moves.
    let mut cal2 = cal.clone();
    if host_cores <= 1 {
        cal2.host.bounce_ns = 0.0;
    } else {
        cal2.host.bounce_ns *= (host_cores - 1) as f64 / host_cores as f64;
    }
    let n = hosts.len();
    for k in 0..sc.conns {
        let h = hash(sc.seed, k);
        let (c_app, s_app) = match sc.clients {
            Clients::Remote => (None, hosts[k % n]),
            Clients::Colocated => {
                // Per-core listeners: flowstack's RSS-aware ports keep the server on the
                // client's core; the kernel's SO_REUSEPORT hash picks any listener.
                let s = match &sc.server_cores {
                    Some(v) if !a.flow_affinity => v.get(k).copied().unwrap_or(k) % n,
                    _ if a.flow_affinity => k % n,
                    _ => (h % n as u64) as usize,
                };
                (Some(hosts[k % n]), hosts[s])
            }
            Clients::Split => (Some(hosts[0]), hosts[1]),
        };
        let s_rx = if a.flow_affinity || !remote {
            s_app
        } else {
            hosts[((h >> 17) % n as u64) as usize]
        };
        let engine = (!engines.is_empty()).then(|| engines[(h % engines.len() as u64) as usize]);
        let places = Places {
            c_app,
            c_rx: c_app,
            s_app,
            s_rx,
            engine,
            link,
            bus,
            lock,
            ports,
        };
        let mut b = Builder {
            cal: &cal2,
            arch: a,
            stack,
            p: places,
            steps: vec![],
            remote,
            error_rate: if remote { cal.link.error_rate } else { 0.0 },
            observe_at: None,
            flow: k as u32,
            who: Side::Client,
        };
        let (arrivals, bytes) = script(&mut b, sc);
        d.flow(Flow {
            script: b.steps,
            arrivals,
            bytes,
            observe_at: b.observe_at,
        });
    }
    Ok((d, hosts, engines))
}

fn script(b: &mut Builder, sc: &Scenario) -> (Arrivals, u64) {
    let s = sc.size;
    let closed = |outstanding| Arrivals::Closed {
        outstanding,
        think_ns: 0.0,
    };
    let arrivals = |outstanding| match sc.load {
        Some(l) => Arrivals::Open {
            per_s: l / sc.conns as f64,
        },
        None => closed(outstanding),
    };
    match sc.workload {
        Workload::Rr if b.drive_loop() => {
            b.drive_loop_rr(s, sc.app_ns);
            (closed(1), 2 * s as u64)
        }
        Workload::Rr => {
            b.message(Side::Client, Side::Server, s, true);
            b.app_work(sc.app_ns);
            b.message(Side::Server, Side::Client, s, true);
            (arrivals(1), 2 * s as u64)
        }
        Workload::Crr => {
            // Client: socket + connect (a local port); SYN, SYN-ACK, ACK.
            b.api(Side::Client);
            b.api(Side::Client);
            b.take_port();
            b.control(Side::Client, Side::Server);
            b.control(Side::Server, Side::Client);
            // An offload daemon's client library waits for connect's completion.
            b.sync_wait(Side::Client);
            b.control(Side::Client, Side::Server);
            b.conn_work();
            // The server's accept is woken.
            let rx = b.rx_stack(Side::Client, Side::Server);
            b.handoff(rx, Side::Server);
            b.api(Side::Server);
            b.after_wake(Side::Server);
            b.message(Side::Client, Side::Server, s, false);
            b.app_work(sc.app_ns);
            b.message(Side::Server, Side::Client, s, true);
            // close() on both ends: FIN, FIN, last ACK; the server is woken by the FIN.
            b.api(Side::Client);
            b.control(Side::Client, Side::Server);
            let rx = b.rx_stack(Side::Client, Side::Server);
            b.handoff(rx, Side::Server);
            b.api(Side::Server);
            b.after_wake(Side::Server);
            b.api(Side::Server);
            // The server's close waits for its completion too (the bench's server calls
            // accept, recv, recv and close, and a blocking one sleeps), but not on the
            // client's path: only its wait's CPU, on the core both applications share.
            b.after_wake(Side::Server);
            b.control(Side::Server, Side::Client);
            // ... and for close's.
            b.sync_wait(Side::Client);
            b.control(Side::Client, Side::Server);
            (arrivals(1), 2 * s as u64)
        }
        Workload::Stream => {
            // One write per transaction, a window of writes in flight; a pure ACK per
            // `segments_per_ack` segments; the receiver's reads and wake-ups amortised over
            // 64 KiB (it reads what has arrived, up to its buffer). A window of 1 MiB (the
            // default socket buffers) in flight.
            let window = (1usize << 20).div_ceil(s).clamp(1, 64);
            // Writes queue behind unacknowledged data and leave in full segments (TSO or
            // the loopback MTU): a write smaller than a segment is held while data is
            // unacknowledged (RFC 9293 §3.7.4, Nagle) and the next ones join it. So the
            // per-segment costs are per `max_segment` bytes, not per write — charged per
            // write, 16 KiB writes cost 1.24x (flowstack) and 1.35x (kernel) 64 KiB's per
            // byte, where the bench measures 0.95–1.05x and 1.05–1.25x (2026-11-26).
            let max_seg = b.stack.max_segment.max(1) as f64;
            let segs = if window > 1 {
                s as f64 / max_seg
            } else {
                b.segments(s) as f64
            };
            let frac = (s as f64 / 65536.0).min(1.0);
            let h = b.cal.host.clone();
            let st = b.stack.clone();
            let c_copy = b.arch.copy && b.p.engine.is_none();
            // Sender.
            b.api(Side::Client);
            let a = b.app(Side::Client);
            if c_copy {
                b.on(a, s as f64 * h.copy_per_byte_ns, Cat::Copy);
            }
            if b.p.engine.is_some() && !b.remote {
                b.bus(Side::Client, s);
                // A sleeping sender ahead of its stack core finds the transmit area full and
                // waits for send space: flowstackd wakes it for credit only when it said it
                // waits (`wants_writable`; credit for a reader is published quietly). Once
                // per write is the least it can be (a partial write may wait again).
                if b.arch.handoff == Handoff::Futex {
                    b.detach(a, frac * h.app_wait_ns, Cat::Wakeup);
                }
            }
            let txs = b.tx_stack(Side::Client);
            let again = 1.0 / (1.0 - b.error_rate.clamp(0.0, 0.99));
            b.on(
                txs,
                (segs * st.send_fixed_ns + s as f64 * st.send_per_byte_ns) * again,
                Cat::Stack,
            );
            let pkts = b.packets(s);
            b.medium(s, pkts);
            let rxs = b.rx_stack(Side::Client, Side::Server);
            if b.remote && b.arch.notify == Notify::InterruptPerPacket && b.p.engine.is_none() {
                b.on(rxs, pkts as f64 * h.interrupt_ns * again, Cat::Interrupt);
            }
            b.on(
                rxs,
                (segs * st.recv_fixed_ns + s as f64 * st.recv_per_byte_ns) * again,
                Cat::Stack,
            );
            let acks = segs / st.segments_per_ack.max(1.0);
            b.on(rxs, acks * st.ctrl_send_ns, Cat::Stack);
            b.on(txs, acks * st.ctrl_recv_ns, Cat::Stack);
            let srv = b.app(Side::Server);
            b.who = Side::Server;
            if b.p.engine.is_some() {
                b.bus(Side::Server, s);
                if b.arch.handoff == Handoff::Wakeup {
                    b.on(srv, frac * h.interrupt_ns, Cat::Interrupt);
                }
            }
            match b.arch.handoff {
                Handoff::Poll => b.on(srv, frac * h.poll_turn_ns, Cat::Poll),
                Handoff::Wakeup => b.on(srv, frac * h.wakeup_ns, Cat::Wakeup),
                Handoff::Futex => b.detach(srv, frac * h.app_wait_ns, Cat::Wakeup),
            }
            let api = match b.arch.api {
                Api::Syscall => h.syscall_ns,
                Api::Library => h.lib_call_ns,
                Api::Ring => h.ring_ns,
            };
            b.on(srv, frac * api, Cat::Api);
            if c_copy {
                b.on(srv, s as f64 * h.copy_per_byte_ns, Cat::Copy);
            }
            (arrivals(window), s as u64)
        }
        Workload::File => {
            b.message(Side::Client, Side::Server, 100, true);
            if b.arch.copy {
                let f = b.cal.host.file_per_byte_ns * s as f64;
                b.app_work(0.0);
                let srv = Some(b.p.s_app);
                b.on(srv, f, Cat::Copy);
            }
            b.app_work(sc.app_ns);
            b.message(Side::Server, Side::Client, s, true);
            (arrivals(1), s as u64)
        }
    }
}

fn pct(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i] as f64 / 1e6
}

/// Runs one scenario.
pub fn simulate(sc: &Scenario, cal: &Calibration) -> Result<Outcome, String> {
    let (d, hosts, engines) = build(sc, cal)?;
    let until = (sc.max_secs * 1e12) as u64;
    let t = d.run(until, sc.txns);
    Ok(outcome(sc, &t, &hosts, &engines))
}

/// Runs one scenario and returns the raw tally too (for tests of the accounting).
pub fn simulate_tally(sc: &Scenario, cal: &Calibration) -> Result<Tally, String> {
    let (d, _, _) = build(sc, cal)?;
    Ok(d.run((sc.max_secs * 1e12) as u64, sc.txns))
}

fn outcome(sc: &Scenario, t: &Tally, hosts: &[usize], engines: &[usize]) -> Outcome {
    let secs = (t.end_ps as f64 / 1e12).max(1e-12);
    let mut lat = t.latencies_ps.clone();
    lat.sort_unstable();
    let n = t.completed.max(1) as f64;
    let mut by_cat = vec![];
    let mut protocol = 0u64;
    let mut busy = 0u64;
    for c in crate::des::CATS {
        let ps: u64 = hosts
            .iter()
            .map(|&h| t.resources[h].busy_ps[c as usize])
            .sum();
        busy += ps;
        if c.is_protocol_cpu() {
            protocol += ps;
        }
        if ps > 0 {
            by_cat.push((c.name().to_string(), ps as f64 / 1e6 / n));
        }
    }
    // Spinning on a lock another core holds is host CPU too.
    let spin: u64 = hosts.iter().map(|&h| t.resources[h].spin_ps).sum();
    if spin > 0 {
        busy += spin;
        protocol += spin;
        by_cat.push(("lock spin".to_string(), spin as f64 / 1e6 / n));
    }
    let engine_busy: u64 = engines.iter().map(|&e| t.resources[e].busy()).sum();
    let link_busy: u64 = t
        .resources
        .iter()
        .filter(|r| r.kind == Kind::Link)
        .map(|r| r.busy())
        .sum();
    Outcome {
        arch: sc.arch.name.clone(),
        workload: sc.workload.name().into(),
        size: sc.size,
        cores: sc.cores,
        load: sc.load,
        per_s: t.completed as f64 / secs,
        mbps: t.bytes as f64 * 8.0 / secs / 1e6,
        mean_us: lat.iter().map(|&l| l as f64).sum::<f64>() / lat.len().max(1) as f64 / 1e6,
        p50_us: pct(&lat, 0.5),
        p99_us: pct(&lat, 0.99),
        host_util: busy as f64 / (t.end_ps.max(1) as f64 * hosts.len() as f64),
        host_protocol_us_per_txn: protocol as f64 / 1e6 / n,
        host_us_by_cat: by_cat,
        engine_util: if engines.is_empty() {
            0.0
        } else {
            engine_busy as f64 / (t.end_ps.max(1) as f64 * engines.len() as f64)
        },
        link_util: link_busy as f64 / t.end_ps.max(1) as f64,
        sim_secs: secs,
        completed: t.completed,
    }
}
