//! The report schemas: what `flowstack bench --json` and `flowstack profile --json` write, as
//! types that serialize and deserialize with serde, so that other programs (the architecture
//! simulator, plotting scripts, CI comparisons) read the files with these types instead of
//! linking the command-line tool.
//!
//! Field names are the JSON's (see README, "JSON"); fields added after the first version carry
//! `#[serde(default)]`, so files written before them still read.
//!
//! - bench: [`BenchReport`] ← [`PeerSummary`] per [`Peer`] ← [`RunResult`] per run, with
//!   [`Percentiles`] for latency and the flowstack/other `speedup`;
//! - profile: [`ProfileReport`] ← [`SizeReport`] per segment size ← [`PathReport`] per path ←
//!   [`LayerReport`] per layer, with seed 000 §5's [`Ceilings`].

use crate::stats::{median, summarize};
use crate::Layer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Writes a report as indented JSON (with a final newline).
pub fn to_json<T: Serialize>(report: &T) -> String {
    let mut s = serde_json::to_string_pretty(report).expect("reports hold only plain data");
    s.push('\n');
    s
}

/// Reads a report written by [`to_json`].
pub fn from_json<'a, T: Deserialize<'a>>(s: &'a str) -> Result<T, serde_json::Error> {
    serde_json::from_str(s)
}

// ---- bench ----------------------------------------------------------------------------

/// What a bench client measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// One-way bulk throughput.
    Stream,
    /// Request/response ping-pong on open connections.
    Rr,
    /// Connect, request, response, close.
    Crr,
}

impl Workload {
    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Stream => "stream",
            Workload::Rr => "rr",
            Workload::Crr => "crr",
        }
    }

    /// Bytes per write (stream) or per request and response (rr, crr) unless told otherwise.
    pub fn default_msg_size(self) -> usize {
        match self {
            Workload::Stream => 65536,
            Workload::Rr | Workload::Crr => 64,
        }
    }

    /// The unit of the workload's metric ([`RunResult::metric`]).
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Stream => "Mbit/s",
            Workload::Rr | Workload::Crr => "per s",
        }
    }
}

/// A stack measured by bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Peer {
    /// flowstack: two engines joined by the shm wire (or the in-process pipe).
    Flowstack,
    /// The Linux kernel over loopback.
    Kernel,
    /// smoltcp (the reference peer, stream only).
    Smoltcp,
}

impl Peer {
    /// The name in output and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Flowstack => "flowstack",
            Peer::Kernel => "kernel",
            Peer::Smoltcp => "smoltcp",
        }
    }
}

/// How flowstack's two engines were joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchLink {
    /// Two processes over the shared-memory wire.
    Shm,
    /// One process, both engines over the in-process pipe.
    Pipe,
}

/// Which optimisations were on (the ablation switches, inverted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchOptions {
    /// Zero-copy send and receive.
    pub zero_copy: bool,
    /// 64 KiB segments handed to the link (segmentation offload).
    pub tso: bool,
    /// Delayed ACKs.
    pub delayed_ack: bool,
    /// Checksums skipped on the trusted link.
    pub checksum_offload: bool,
    /// Socket buffer size, if set.
    pub window: Option<usize>,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p99_9_us: f64,
}

impl Percentiles {
    /// Each percentile's median over runs (`None` if no run measured latency).
    pub fn median_of<'a>(runs: impl IntoIterator<Item = &'a Percentiles>) -> Option<Self> {
        let v: Vec<&Percentiles> = runs.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        let m = |f: fn(&Percentiles) -> f64| median(&v.iter().map(|p| f(p)).collect::<Vec<_>>());
        Some(Percentiles {
            p50_us: m(|p| p.p50_us),
            p90_us: m(|p| p.p90_us),
            p99_us: m(|p| p.p99_us),
            p99_9_us: m(|p| p.p99_9_us),
        })
    }
}

/// One measured run of one peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Throughput in Mbit/s (stream) or transactions per second (rr, crr).
    pub metric: f64,
    /// Bytes the server reported receiving (stream).
    pub bytes: u64,
    /// Seconds measured.
    pub secs: f64,
    /// Completed transactions (rr, crr).
    pub transactions: u64,
    /// Transaction latency (rr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Percentiles>,
    /// Bytes the sender queued per one-second interval (stream).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intervals: Vec<u64>,
    /// `bench --cores N`: each core's share of the run, in core order (empty without
    /// `--cores`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_core: Vec<CoreResult>,
    /// `bench --cores N`, flowstack: the engines' counters and leftovers summed over the
    /// cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summed: Option<EnginePair>,
}

/// One core's share of a `bench --cores N` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoreResult {
    /// The core's index, `0..N`.
    pub core: usize,
    /// The CPU its threads were pinned to (`None`: not pinned, e.g. a one-CPU machine).
    #[serde(default)]
    pub cpu: Option<usize>,
    /// This core's metric (its clients' transactions per second, or Mbit/s for stream).
    pub metric: f64,
    /// Bytes the server reported receiving (stream).
    #[serde(default)]
    pub bytes: u64,
    /// Seconds measured.
    #[serde(default)]
    pub secs: f64,
    /// Completed transactions.
    #[serde(default)]
    pub transactions: u64,
    /// The connections this core's clients ran in parallel.
    #[serde(default)]
    pub conns: usize,
    /// Transaction latency (rr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Percentiles>,
    /// Kernel peer: connections this core's `SO_REUSEPORT` listener accepted (the kernel's
    /// hash decides which listener gets a connection, not the core its client runs on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<u64>,
    /// flowstack peer: this core's two engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engines: Option<EnginePair>,
}

/// The client and server engines of one flowstack core (or their sums over cores).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnginePair {
    /// The client engine.
    pub client: EngineCounts,
    /// The server engine.
    pub server: EngineCounts,
    /// SYNs the server engine received whose symmetric Toeplitz hash names another core's
    /// queue (0 when every client picked RSS-aware ports: a multi-queue NIC steering by the
    /// same hash would have delivered every connection to this core).
    #[serde(default)]
    pub misdirected_syns: u64,
}

impl EnginePair {
    /// Adds `other` (summing over cores).
    pub fn merge(&mut self, other: &EnginePair) {
        self.client.merge(&other.client);
        self.server.merge(&other.server);
        self.misdirected_syns += other.misdirected_syns;
    }
}

/// One engine at the end of a run, after a drain period (virtual time run past TIME_WAIT),
/// proving what it leaked or did not.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineCounts {
    /// Connections opened: `TcpActiveOpens` + `TcpPassiveOpens`.
    pub opened: u64,
    /// Connections gone from the table after the drain: `opened` − `connections_left`.
    pub closed: u64,
    /// Connections still in the table after the drain (each holds its local port: 0 means
    /// no port is held either).
    pub connections_left: u64,
    /// Engines with a timer still pending after the drain (0 or 1 per engine; summed over
    /// cores).
    pub timers_left: u64,
    /// Every nonzero counter, by its nstat-style name.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
}

impl EngineCounts {
    /// Adds `other` (summing over cores).
    pub fn merge(&mut self, other: &EngineCounts) {
        self.opened += other.opened;
        self.closed += other.closed;
        self.connections_left += other.connections_left;
        self.timers_left += other.timers_left;
        for (k, v) in &other.counters {
            *self.counters.entry(k.clone()).or_default() += v;
        }
    }
}

impl RunResult {
    /// A run's result, its metric derived from the workload's counts.
    pub fn new(
        workload: Workload,
        bytes: u64,
        secs: f64,
        transactions: u64,
        latency: Option<Percentiles>,
        intervals: Vec<u64>,
    ) -> Self {
        let metric = match workload {
            Workload::Stream => bytes as f64 * 8.0 / secs / 1e6,
            Workload::Rr | Workload::Crr => transactions as f64 / secs,
        };
        Self {
            metric,
            bytes,
            secs,
            transactions,
            latency: if workload == Workload::Rr {
                latency
            } else {
                None
            },
            intervals,
            per_core: Vec::new(),
            summed: None,
        }
    }
}

/// One peer over its runs: the median of the metric (under the workload's name), its range,
/// the median of each latency percentile, and every run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerSummary {
    /// Median throughput, Mbit/s (stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput_mbps: Option<f64>,
    /// Median transactions per second (rr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transactions_per_s: Option<f64>,
    /// Median of each latency percentile over the runs (rr).
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Percentiles>,
    /// Median connections (connect/request/response/close) per second (crr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_per_s: Option<f64>,
    /// The metric's median (the same figure as the workload-named field).
    #[serde(default)]
    pub median: f64,
    /// The metric's smallest value over the runs.
    #[serde(default)]
    pub min: f64,
    /// The metric's largest value over the runs.
    #[serde(default)]
    pub max: f64,
    /// The metric of each run, in order.
    pub each_run: Vec<f64>,
    /// Each run in full.
    #[serde(default)]
    pub run_results: Vec<RunResult>,
}

impl PeerSummary {
    /// Summarises a peer's runs.
    pub fn new(workload: Workload, runs: Vec<RunResult>) -> Self {
        let each: Vec<f64> = runs.iter().map(|r| r.metric).collect();
        let m = median(&each);
        let range = summarize(&each);
        Self {
            throughput_mbps: (workload == Workload::Stream).then_some(m),
            transactions_per_s: (workload == Workload::Rr).then_some(m),
            latency: Percentiles::median_of(runs.iter().filter_map(|r| r.latency.as_ref())),
            connections_per_s: (workload == Workload::Crr).then_some(m),
            median: m,
            min: range.min,
            max: range.max,
            each_run: each,
            run_results: runs,
        }
    }

    /// The metric's median, whichever workload.
    pub fn metric(&self) -> f64 {
        self.throughput_mbps
            .or(self.transactions_per_s)
            .or(self.connections_per_s)
            .unwrap_or(self.median)
    }
}

/// What the speedup compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeedupBasis {
    /// flowstack's median metric / the other's (stream, crr).
    ThroughputRatio,
    /// The other's median p50 latency / flowstack's (rr).
    P50LatencyRatio,
}

impl SpeedupBasis {
    /// How the ratio is described in text output.
    pub fn describe(self) -> &'static str {
        match self {
            SpeedupBasis::ThroughputRatio => "throughput ratio",
            SpeedupBasis::P50LatencyRatio => "kernel p50 / flowstack p50",
        }
    }
}

/// `flowstack bench --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// "flowstack bench".
    #[serde(default = "bench_tool")]
    pub tool: String,
    /// The workload.
    pub workload: Workload,
    /// Bytes per write or per request/response.
    pub msg_size: usize,
    /// Parallel connections.
    pub conns: usize,
    /// Seconds per run.
    pub duration_s: f64,
    /// Runs per peer.
    pub runs: usize,
    /// How flowstack's engines were joined.
    pub link: BenchLink,
    /// Optimisations on or off.
    pub options: BenchOptions,
    /// Each measured peer.
    pub peers: BTreeMap<Peer, PeerSummary>,
    /// flowstack vs the other peer (> 1 = flowstack better) when two peers ran.
    pub speedup: Option<f64>,
    /// The peer flowstack was compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_vs: Option<Peer>,
    /// What the speedup compares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_basis: Option<SpeedupBasis>,
    /// `bench --cores N`: N cores, each running one client and one server shard of each peer
    /// (`None`: the classic run without `--cores`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<usize>,
    /// How the peers were placed on the cores, in words (with `--cores`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

fn bench_tool() -> String {
    "flowstack bench".into()
}

impl BenchReport {
    /// Sets `speedup`: flowstack against the one other peer, if exactly two ran.
    pub fn compute_speedup(&mut self) {
        self.speedup = None;
        self.speedup_vs = None;
        self.speedup_basis = None;
        let Some(f) = self.peers.get(&Peer::Flowstack) else {
            return;
        };
        let mut others = self.peers.iter().filter(|(p, _)| **p != Peer::Flowstack);
        let (Some((&other, k)), None) = (others.next(), others.next()) else {
            return;
        };
        let (s, basis) = match self.workload {
            Workload::Rr => {
                let p50 = |s: &PeerSummary| s.latency.map(|l| l.p50_us).unwrap_or(0.0);
                (p50(k) / p50(f).max(1e-9), SpeedupBasis::P50LatencyRatio)
            }
            _ => (
                f.metric() / k.metric().max(1e-9),
                SpeedupBasis::ThroughputRatio,
            ),
        };
        self.speedup = Some(s);
        self.speedup_vs = Some(other);
        self.speedup_basis = Some(basis);
    }
}

// ---- profile --------------------------------------------------------------------------

/// One measured step of seed 000's experiment (a "phase" in JSON).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Step {
    /// The application writes one segment; TCP/IP send it (sender side).
    #[serde(rename = "send")]
    Send,
    /// The sender processes the ACK for it.
    #[serde(rename = "ack_processing")]
    Ack,
    /// The receiver takes one segment in, hands it to the application and ACKs it.
    #[serde(rename = "receive")]
    Receive,
}

impl Step {
    /// The step's name in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Step::Send => "send",
            Step::Ack => "ack_processing",
            Step::Receive => "receive",
        }
    }
}

/// How hardware counters were read for a profile.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Counting {
    /// Not available.
    #[serde(rename = "none")]
    None,
    /// Read with a system call around each step; shared out to its layers by cycles.
    #[serde(rename = "step")]
    PerStep,
    /// Read with RDPMC at every probe: charged to each layer.
    #[serde(rename = "layer")]
    PerLayer,
}

/// What a layer is called in a given step.
pub fn layer_name(step: Step, l: Layer) -> &'static str {
    use Layer::*;
    match (step, l) {
        (Step::Send, AppCopyIn) => "app -> socket copy",
        (Step::Send, TcpOutput) => "TCP output: what to send",
        (Step::Send, TcpEmit) => "TCP output: header, payload copy, checksum",
        (Step::Send, IpOutput) => "IPv4 output",
        (Step::Send, EthOutput) => "ARP/Ethernet output",
        (Step::Send, DevTx) => "device transmit",
        (Step::Ack, DevRx) | (Step::Receive, DevRx) => "device receive",
        (Step::Ack, EthIpInput) | (Step::Receive, EthIpInput) => "Ethernet/IPv4 input",
        (Step::Ack, TcpInput) => "TCP ACK input",
        (Step::Ack, BufRelease) => "send buffer release",
        (Step::Ack, TcpOutput) => "TCP output check (nothing to send)",
        (Step::Receive, TcpInput) => "TCP input",
        (Step::Receive, SockAppend) => "socket append (readiness is polled)",
        (Step::Receive, AppCopyOut) => "socket -> app copy",
        (Step::Receive, TcpOutput) => "ACK output: TCP",
        (Step::Receive, TcpEmit) => "ACK output: TCP header, checksum",
        (Step::Receive, IpOutput) => "ACK output: IPv4",
        (Step::Receive, EthOutput) => "ACK output: Ethernet",
        (Step::Receive, DevTx) => "ACK output: device transmit",
        (_, Engine) => "engine loop (timers, dispatch)",
        (Step::Send, DevRx) => "device receive (poll, nothing waiting)",
        (Step::Send, EthIpInput) | (Step::Send, TcpInput) => "input (stray frame)",
        _ => "other",
    }
}

/// A cost in cycles and in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct CyclesNs {
    /// TSC cycles.
    pub cycles: f64,
    /// Nanoseconds.
    pub ns: f64,
}

/// Hardware events per segment (the names of [`crate::counters::NAMES`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HwEvents {
    /// Instructions retired.
    pub instructions: f64,
    /// Cache misses.
    pub cache_misses: f64,
    /// Data-TLB read misses.
    pub dtlb_misses: f64,
}

impl HwEvents {
    /// From values in the order of [`crate::counters::NAMES`].
    pub fn from_array(v: [f64; crate::counters::N]) -> Self {
        Self {
            instructions: v[0],
            cache_misses: v[1],
            dtlb_misses: v[2],
        }
    }
}

/// One layer's cost on a path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerReport {
    /// What the layer does in this step ([`layer_name`]).
    pub name: String,
    /// The probed layer.
    pub layer: Layer,
    /// The step it ran in.
    pub phase: Step,
    /// Mean cycles per segment.
    pub cycles: f64,
    /// Mean nanoseconds per segment.
    pub ns: f64,
    /// Spread (standard deviation) in nanoseconds.
    pub stddev_ns: f64,
    /// Share of the path's layer sum, percent.
    #[serde(default)]
    pub share_percent: f64,
    /// Hardware events per segment, when counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<HwEvents>,
}

/// One path (send with its ACK processing, or receive with its ACK output) at one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathReport {
    /// Its layers, in the order a segment meets them, step by step.
    pub layers: Vec<LayerReport>,
    /// Sum of the layers.
    pub total: CyclesNs,
    /// End-to-end cost with the probes off.
    pub end_to_end: CyclesNs,
    /// `total` as a share of `end_to_end`, percent: the instrument's error bar.
    pub coverage_percent: f64,
    /// "inclusive" or "full" per step, joined by '+'.
    pub method: String,
    /// Samples used (the fewest of the path's steps).
    pub samples_kept: usize,
    /// Samples discarded (disturbed or outlying), over all the path's steps.
    pub samples_discarded: usize,
    /// Samples taken, over all the path's steps.
    #[serde(default)]
    pub samples_taken: usize,
    /// Time inside the measured window but outside every probe (not in `total`).
    #[serde(default)]
    pub unattributed: CyclesNs,
}

impl PathReport {
    /// Sum of the layers that satisfy `f`, in cycles.
    pub fn cycles_where(&self, f: impl Fn(&LayerReport) -> bool) -> f64 {
        self.layers.iter().filter(|l| f(l)).map(|l| l.cycles).sum()
    }

    /// A warning when more than a fifth of the samples were discarded: the machine was busy
    /// (in a VM, the host), and what was kept may not stand for the whole run.
    pub fn busy_warning(&self) -> Option<String> {
        (self.samples_discarded * 5 > self.samples_taken).then(|| {
            format!(
                "{:.0}% of the samples were discarded (the machine was busy); these figures are less reliable, run again",
                100.0 * self.samples_discarded as f64 / self.samples_taken.max(1) as f64
            )
        })
    }
}

/// The two paths of one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paths {
    /// Send path and its ACK processing (sender).
    pub send: PathReport,
    /// Receive path, ACK output included (receiver).
    pub receive: PathReport,
}

/// Seed 000 §5's upper bounds, Mbit/s: one segment per path cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ceilings {
    /// Send path with ACK processing.
    pub send_with_ack_mbps: f64,
    /// Send path alone.
    pub send_without_ack_mbps: f64,
    /// Receive path with its ACK output.
    pub receive_with_ack_output_mbps: f64,
    /// Receive path without the ACK output.
    pub receive_without_ack_output_mbps: f64,
}

impl Ceilings {
    /// From a size's paths.
    pub fn of(size: usize, paths: &Paths, tsc_ghz: f64) -> Self {
        let bits = size as f64 * 8.0;
        let mbps = |cycles: f64| {
            if cycles > 0.0 {
                bits / (cycles / tsc_ghz) * 1e3
            } else {
                0.0
            }
        };
        let send = paths.send.cycles_where(|l| l.phase == Step::Send);
        let ack = paths.send.cycles_where(|l| l.phase == Step::Ack);
        let recv = paths.receive.total.cycles;
        let ack_out = paths.receive.cycles_where(|l| {
            matches!(
                l.layer,
                Layer::TcpOutput | Layer::IpOutput | Layer::EthOutput | Layer::DevTx
            )
        });
        Self {
            send_with_ack_mbps: mbps(send + ack),
            send_without_ack_mbps: mbps(send),
            receive_with_ack_output_mbps: mbps(recv),
            receive_without_ack_output_mbps: mbps(recv - ack_out),
        }
    }
}

/// One segment size's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeReport {
    /// Segment payload bytes.
    pub size: usize,
    /// Its two paths.
    pub paths: Paths,
    /// The ceilings they imply.
    pub ceilings: Ceilings,
    /// Segments the receiver took through header prediction's fast path.
    pub fast_path_hits: u64,
}

impl SizeReport {
    /// A layer's name in text output: [`layer_name`], with header prediction's outcome for
    /// the receiver's TCP input.
    pub fn display_name(&self, l: &LayerReport) -> &'static str {
        if l.layer == Layer::TcpInput && l.phase == Step::Receive {
            if self.fast_path_hits > 0 {
                "TCP input (header prediction: fast path)"
            } else {
                "TCP input (header prediction: slow path)"
            }
        } else {
            layer_name(l.phase, l.layer)
        }
    }
}

/// The probe's own cost in cycles, subtracted from every figure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProbeOverhead {
    /// Charged to the probed layer per entry.
    pub own: f64,
    /// Charged to the enclosing layer per child probe.
    pub parent: f64,
}

/// Whether hardware counters were read: `true`, or the reason they were not (a string
/// starting with "n/a").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HwAvailability {
    /// Counted (how: [`ProfileReport::counters_per`]).
    Available(bool),
    /// Not counted, and why.
    Unavailable(String),
}

/// `flowstack profile --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileReport {
    /// "flowstack profile".
    pub tool: String,
    /// Where it ran (the in-process link, or a real link against the kernel).
    pub link: String,
    /// TSC ticks per nanosecond.
    pub tsc_ghz: f64,
    /// The probes' calibrated cost.
    pub probe_overhead_cycles: ProbeOverhead,
    /// Whether hardware counters were read.
    pub hardware_counters: HwAvailability,
    /// How they were read.
    pub counters_per: Counting,
    /// Their names.
    pub counter_names: Vec<String>,
    /// One entry per segment size.
    pub sizes: Vec<SizeReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(w: Workload, x: u64, p50: f64) -> RunResult {
        RunResult::new(
            w,
            x * 1_000_000,
            2.0,
            x,
            Some(Percentiles {
                p50_us: p50,
                p90_us: p50 * 2.0,
                p99_us: p50 * 3.0,
                p99_9_us: p50 * 4.0,
            }),
            vec![x, x + 1],
        )
    }

    fn bench(w: Workload) -> BenchReport {
        let mut peers = BTreeMap::new();
        peers.insert(
            Peer::Flowstack,
            PeerSummary::new(
                w,
                vec![run(w, 30, 10.0), run(w, 10, 12.0), run(w, 20, 11.0)],
            ),
        );
        peers.insert(Peer::Kernel, PeerSummary::new(w, vec![run(w, 10, 33.0)]));
        let mut r = BenchReport {
            tool: bench_tool(),
            workload: w,
            msg_size: 64,
            conns: 1,
            duration_s: 2.0,
            runs: 3,
            link: BenchLink::Shm,
            options: BenchOptions {
                zero_copy: true,
                tso: true,
                delayed_ack: false,
                checksum_offload: true,
                window: None,
            },
            peers,
            speedup: None,
            speedup_vs: None,
            speedup_basis: None,
            cores: None,
            placement: None,
        };
        r.compute_speedup();
        r
    }

    #[test]
    fn per_core_fields_are_optional_and_round_trip() {
        // A file written before `--cores` existed still reads.
        let mut old: serde_json::Value =
            serde_json::from_str(&to_json(&bench(Workload::Crr))).unwrap();
        assert!(old.get("cores").is_none());
        old.as_object_mut().unwrap().remove("placement");
        let back: BenchReport = from_json(&old.to_string()).unwrap();
        assert_eq!(back.cores, None);
        assert!(back.peers[&Peer::Flowstack].run_results[0]
            .per_core
            .is_empty());
        // And the per-core fields survive a round trip.
        let mut r = bench(Workload::Crr);
        r.cores = Some(2);
        let mut e = EnginePair::default();
        e.client.opened = 5;
        e.client.closed = 5;
        e.client.counters.insert("TcpActiveOpens".into(), 5);
        let mut sum = EnginePair::default();
        sum.merge(&e);
        sum.merge(&e);
        assert_eq!(sum.client.opened, 10);
        assert_eq!(sum.client.counters["TcpActiveOpens"], 10);
        let run = &mut r.peers.get_mut(&Peer::Flowstack).unwrap().run_results[0];
        run.per_core = (0..2)
            .map(|core| CoreResult {
                core,
                cpu: Some(core),
                metric: 1.0,
                bytes: 0,
                secs: 1.0,
                transactions: 1,
                conns: 1,
                latency: None,
                accepted: None,
                engines: Some(e.clone()),
            })
            .collect();
        run.summed = Some(sum);
        let back: BenchReport = from_json(&to_json(&r)).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn bench_summary_has_median_range_and_the_workload_named_fields() {
        let r = bench(Workload::Rr);
        let f = &r.peers[&Peer::Flowstack];
        assert_eq!(f.transactions_per_s, Some(10.0));
        assert_eq!((f.min, f.max, f.median), (5.0, 15.0, 10.0));
        assert_eq!(f.latency.unwrap().p50_us, 11.0);
        assert_eq!(f.throughput_mbps, None);
        assert_eq!(r.speedup, Some(3.0));
        assert_eq!(r.speedup_basis, Some(SpeedupBasis::P50LatencyRatio));
        let s = bench(Workload::Stream);
        assert_eq!(s.peers[&Peer::Flowstack].latency, None);
        assert_eq!(s.speedup, Some(2.0));
    }

    #[test]
    fn bench_json_keeps_its_field_names_and_reads_back() {
        for w in [Workload::Stream, Workload::Rr, Workload::Crr] {
            let r = bench(w);
            let j = to_json(&r);
            let back: BenchReport = from_json(&j).unwrap();
            assert_eq!(back, r, "{j}");
            let key = match w {
                Workload::Stream => "\"throughput_mbps\"",
                Workload::Rr => "\"p99_9_us\"",
                Workload::Crr => "\"connections_per_s\"",
            };
            assert!(j.contains(key), "{j}");
            assert!(j.contains(&format!("\"workload\": \"{}\"", w.name())));
            assert!(j.contains("\"flowstack\": {") && j.contains("\"each_run\""));
        }
        // A file from before the added fields (median, min, max, run_results, tool) reads.
        let old = r#"{"workload": "crr", "msg_size": 64, "conns": 1, "duration_s": 5,
            "runs": 1, "link": "shm", "options": {"zero_copy": true, "tso": true,
            "delayed_ack": true, "checksum_offload": true, "window": null},
            "peers": {"flowstack": {"connections_per_s": 12345.6, "each_run": [12345.6]}},
            "speedup": null}"#;
        let r: BenchReport = from_json(old).unwrap();
        assert_eq!(r.peers[&Peer::Flowstack].metric(), 12345.6);
        assert_eq!(r.peers[&Peer::Flowstack].latency, None);
        assert_eq!(r.speedup, None);
    }

    fn path(layers: &[(Layer, Step, f64)]) -> PathReport {
        PathReport {
            layers: layers
                .iter()
                .map(|&(layer, phase, cycles)| LayerReport {
                    name: layer_name(phase, layer).into(),
                    layer,
                    phase,
                    cycles,
                    ns: cycles / 2.0,
                    stddev_ns: 1.0,
                    share_percent: 0.0,
                    counters: None,
                })
                .collect(),
            total: CyclesNs {
                cycles: layers.iter().map(|l| l.2).sum(),
                ns: 0.0,
            },
            end_to_end: CyclesNs::default(),
            coverage_percent: 100.0,
            method: "inclusive+full".into(),
            samples_kept: 10,
            samples_discarded: 0,
            samples_taken: 10,
            unattributed: CyclesNs::default(),
        }
    }

    #[test]
    fn ceilings_follow_seed_000() {
        let paths = Paths {
            send: path(&[
                (Layer::TcpOutput, Step::Send, 1000.0),
                (Layer::TcpInput, Step::Ack, 1000.0),
            ]),
            receive: path(&[
                (Layer::TcpInput, Step::Receive, 1500.0),
                (Layer::TcpOutput, Step::Receive, 500.0),
            ]),
        };
        // 1000 bytes at 2 GHz: 2000 cycles = 1000 ns → 8000 Mbit/s.
        let c = Ceilings::of(1000, &paths, 2.0);
        assert_eq!(c.send_with_ack_mbps, 8000.0);
        assert_eq!(c.send_without_ack_mbps, 16000.0);
        assert_eq!(c.receive_with_ack_output_mbps, 8000.0);
        assert!((c.receive_without_ack_output_mbps - 8000.0 * 2000.0 / 1500.0).abs() < 1e-6);
    }

    #[test]
    fn profile_json_reads_back_with_counters_or_without() {
        let mut send = path(&[(Layer::AppCopyIn, Step::Send, 80.0)]);
        send.layers[0].counters = Some(HwEvents::from_array([100.0, 1.5, 0.25]));
        let receive = path(&[(Layer::DevRx, Step::Receive, 50.0)]);
        let paths = Paths { send, receive };
        let size = SizeReport {
            size: 100,
            ceilings: Ceilings::of(100, &paths, 2.0),
            paths,
            fast_path_hits: 7,
        };
        for hw in [
            HwAvailability::Available(true),
            HwAvailability::Unavailable("n/a: no PMU".into()),
        ] {
            let r = ProfileReport {
                tool: "flowstack profile".into(),
                link: "in-process link".into(),
                tsc_ghz: 2.0,
                probe_overhead_cycles: ProbeOverhead {
                    own: 30.0,
                    parent: 4.0,
                },
                hardware_counters: hw,
                counters_per: Counting::PerStep,
                counter_names: crate::counters::NAMES.map(String::from).to_vec(),
                sizes: vec![size.clone()],
            };
            let j = to_json(&r);
            for key in [
                "\"size\": 100",
                "\"layer\": \"AppCopyIn\"",
                "\"phase\": \"send\"",
                "\"counters_per\": \"step\"",
                "\"method\": \"inclusive",
                "\"instructions\": 100.0",
                "\"send_with_ack_mbps\"",
            ] {
                assert!(j.contains(key), "{key} in {j}");
            }
            assert_eq!(from_json::<ProfileReport>(&j).unwrap(), r);
        }
    }

    #[test]
    fn a_busy_run_is_flagged_from_a_fifth_of_the_samples_discarded() {
        let mut p = path(&[]);
        p.samples_taken = 10_000;
        p.samples_discarded = 2_000;
        assert_eq!(p.busy_warning(), None);
        p.samples_discarded = 2_001;
        let w = p.busy_warning().expect("flagged");
        assert!(w.starts_with("20% of the samples were discarded"), "{w}");
    }
}
