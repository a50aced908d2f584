//! Calibration: the costs the simulator charges, as a serde file (a *preset*), and how such a
//! file is made from this machine's `flowstack profile --json` (per-layer cost per segment
//! size) and `flowstack bench --json` results.
//!
//! All costs are nanoseconds at the calibration's own clock (`clock_ghz`); a stack core
//! running at `ratio` times that clock takes `ns / ratio`.

use flowstack_prof::report::{BenchReport, Peer, ProfileReport, Step as Phase};
use flowstack_prof::Layer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What one TCP/IP implementation costs per segment, per byte and per connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackCosts {
    /// Sending one data segment through the layers (socket to device), fixed part.
    pub send_fixed_ns: f64,
    /// ... and per payload byte (payload copy into the frame, checksum where computed).
    pub send_per_byte_ns: f64,
    /// Receiving one data segment (device to socket), fixed part.
    pub recv_fixed_ns: f64,
    /// ... and per payload byte.
    pub recv_per_byte_ns: f64,
    /// Sending a pure ACK or another control segment (SYN, FIN).
    pub ctrl_send_ns: f64,
    /// Receiving a pure ACK or another control segment.
    pub ctrl_recv_ns: f64,
    /// Per connection, beyond its control segments: socket and table set-up and tear-down
    /// (split evenly between the two ends).
    pub conn_ns: f64,
    /// The largest segment handed to the device (TSO or loopback MTU), bytes.
    pub max_segment: usize,
    /// Data segments per pure ACK in bulk transfer (delayed ACK: 2).
    #[serde(default = "two")]
    pub segments_per_ack: f64,
    /// Per write of a stream, beyond the system call and the segments: the stack's work
    /// per call that does not grow with its bytes (the kernel's socket lock, appending to
    /// the send queue's tail, the push decision). Fitted for the kernel to a stream
    /// calibration run at a second write size ([`crate::fit`]); 0 for flowstack, whose
    /// profile layers hold it. Charged in streams only: in rr and crr a transaction makes
    /// a fixed number of calls, and their per-call work is in the fitted wake-up and
    /// connection costs (charged there too, it moved the unvalidated mixed kernel
    /// placement's median, whose scheduling is sensitive to the steps' lengths).
    #[serde(default)]
    pub write_ns: f64,
}

fn two() -> f64 {
    2.0
}

/// What the host's operating system and CPU charge around the stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostCosts {
    /// One system call (entry, exit, the socket layer's dispatch).
    pub syscall_ns: f64,
    /// One call into a user-level library stack.
    pub lib_call_ns: f64,
    /// Posting a command to, or taking an event from, an offload ring (host side).
    pub ring_ns: f64,
    /// Copying payload between the application and the stack, per byte.
    pub copy_per_byte_ns: f64,
    /// One interrupt: device driver and handler.
    pub interrupt_ns: f64,
    /// Waking a blocked thread on its own core and switching to it (CPU time).
    pub wakeup_ns: f64,
    /// Extra latency of a wake-up on another core (inter-processor interrupt; in a VM, the
    /// idle vCPU's exit and re-entry), not CPU time of either core.
    pub cross_core_ns: f64,
    /// One turn of a polling loop that finds the hand-off (instead of a wake-up).
    pub poll_turn_ns: f64,
    /// Kernel only: the per-connection section all cores serialise on (listen socket, accept
    /// queue, connection hash locks), its hold time.
    pub shared_conn_ns: f64,
    /// Extra hold time when the lock's cache line comes from another core.
    pub bounce_ns: f64,
    /// Reading a file's bytes from the page cache (copying), per byte; zero-copy file send
    /// skips it.
    pub file_per_byte_ns: f64,
    /// An offload stack core's work per wake-up of a sleeping application beyond the ring
    /// records (`ring_ns` each): the wake-up's system call (flowstackd writes a byte to the
    /// application's wake socket only when it said it sleeps) and the event that caused it
    /// (0 in calibrations without an offload daemon). Fitted to the offload rr run's rate
    /// (two wake-ups per transaction), so charged only on `daemon-wake`: a polling daemon
    /// or a NIC wakes nobody. (It was charged per command, wake-up or not: a stream's
    /// every write paid a wake-up it does not make.)
    #[serde(default)]
    pub stack_op_ns: f64,
    /// An application's CPU per blocking wait on an offload daemon (`daemon-wake`): the
    /// futex wait, the switch out and back in when the stack core wakes it.
    #[serde(default)]
    pub app_wait_ns: f64,
    /// The OS scheduler's time slice: how long a thread that got a core may keep it while
    /// others wait (it keeps it until it blocks or this ends; a woken thread does not
    /// preempt it before). Linux 6.6+ (EEVDF): `sysctl_sched_base_slice`, 0.75 ms ×
    /// (1 + log2 of the online CPUs, at most 8) — 1.5 ms on this 2-CPU VM (kernel 6.18,
    /// `kernel/sched/fair.c`, `SCHED_TUNABLESCALING_LOG`).
    #[serde(default = "base_slice_2cpu")]
    pub sched_slice_ns: f64,
    /// A daemon's stack core (flowstackd's engine) spins this long after its last work,
    /// then sleeps until an application rings its doorbell (`--spin-us`, default 50 µs);
    /// the wake-up then takes [`HostCosts::cross_core_ns`]. 0: it never sleeps.
    #[serde(default = "daemon_spin")]
    pub engine_spin_ns: f64,
    /// Kernel, clients on this host: the local ports `connect()` takes for one destination
    /// — Linux tries the even ports of `ip_local_port_range` first (`__inet_hash_connect`),
    /// 14116 of 32768–60999 (0: no limit).
    #[serde(default)]
    pub connect_ports: f64,
    /// ... and how long a closed connection keeps its port: a port in TIME-WAIT is reused
    /// for the same destination once its last timestamp is older than
    /// `net.ipv4.tcp_tw_reuse_delay` (1000 ms; `tcp_tw_reuse` = 2 for loopback). So at
    /// most `connect_ports` connections per this time (0: no limit).
    #[serde(default)]
    pub port_reuse_ns: f64,
    /// `daemon-wake`: how long after the stack core's doorbell a sleeping application runs
    /// again — the futex wake-up across cores plus the wait for its core behind other
    /// processes. 0: [`HostCosts::cross_core_ns`]. Fitted to the offload rr calibration run's
    /// median response time.
    #[serde(default)]
    pub app_wake_ns: f64,
    /// `daemon-wake` rr and crr: the measured mean response time over the median (the tail
    /// of woken applications that wait longer behind other processes, which the model's
    /// latencies do not have); a closed loop's rate is one over the mean. Measured on the
    /// offload rr calibration run (1 over its rate, over its median); 0 or 1: none.
    #[serde(default)]
    pub app_tail: f64,
    /// `daemon-wake` crr: which calls of a connection block and sleep.
    #[serde(default)]
    pub offload_crr_waits: CrrWaits,
    /// A daemon's stack core (`daemon`, `daemon-wake`): **one** copy of a payload byte, as
    /// flowstackd makes [`daemon_copies`] of each (its stack core's whole per-byte work:
    /// the engine's own per-byte costs are those copies). A NIC (`offload`) moves bytes by
    /// DMA: not charged there. Fitted to the offload stream calibration run's rate.
    #[serde(default)]
    pub daemon_per_byte_ns: f64,
    /// `daemon-wake` stream: how often the applications sleep, per 64 KiB moved.
    #[serde(default)]
    pub offload_stream_waits: StreamWaits,
    /// A daemon's send credit per connection, bytes: how far an application's writes may
    /// run ahead of its stack core (flowstackd: `SOCK_SNDBUF`, 256 KiB). 0: no limit but the
    /// stream's window.
    #[serde(default = "daemon_credit")]
    pub daemon_credit_bytes: f64,
}

/// flowstackd's send credit per connection (`flowstack_api::region::SOCK_SNDBUF`, 1 MiB
/// since 2026-11-27 03:57 UTC; not used by the model, whose streams keep 1 MiB of writes
/// in flight).
pub fn daemon_credit() -> f64 {
    1_048_576.0
}

/// The smallest `TcpSend` flowstackd sends straight from the application's transmit area
/// (`ZC_MIN` in `crates/offload/src/app/txzc.rs`, 16 KiB; the simulator links no daemon).
pub const DAEMON_ZC_MIN: usize = 16 << 10;

/// How many times flowstackd copies each byte of a message of `bytes` on its stack core,
/// on the sending side (`sending`) or the receiving side, as its code does (2026-11-27,
/// `txzc`): a send of at least [`DAEMON_ZC_MIN`] leaves from the transmit area itself —
/// its segments are cut from the area and the loopback hands their payload to the
/// receiving connection — so **none** on the sending side; a smaller one is copied from
/// the area into the send buffer and from there into its frame (**two**). On the
/// receiving side **two**: the segment's payload into the connection's receive ring, and
/// the ring into the application's receive area (urgent delivery). So a bulk byte is
/// copied twice in all, a small one four times. (Before `txzc` every byte was copied four
/// times and the model charged two per side at least, at the kernel's whole per-byte cost:
/// the offload stream rows came out −20..−42 %.)
pub fn daemon_copies(bytes: usize, sending: bool) -> f64 {
    match (sending, bytes >= DAEMON_ZC_MIN) {
        (true, true) => 0.0,
        _ => 2.0,
    }
}

/// How often the applications of an offload stream (`bench stream --peer offload`: one
/// sender, one receiver, both on one core, the daemon's stack core on another) sleep on
/// the futex, per 64 KiB of payload. A sender ahead of its stack core finds its credit
/// used up and sleeps until the daemon returns some (it asked: `wants_writable`); a receiver
/// ahead of it finds nothing to read. Which of the two waits depends on which side is
/// faster, so the counts are measured (`cargo run --release -p flowstack-bench --example
/// offload_trace -- 2 stream`), not derived. Each costs its application
/// [`HostCosts::app_wait_ns`] of CPU, off the stream's path (the other writes in flight
/// carry on meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StreamWaits {
    /// The sender's sleeps per 64 KiB written.
    pub sender: f64,
    /// The receiver's sleeps per 64 KiB read.
    pub receiver: f64,
}

impl Default for StreamWaits {
    /// Measured 2026-11-27 06:41 UTC (load 1.8–2.4), with the bulk-transfer daemon (block
    /// copies, direct sends, bigger credits): 0.07–0.08 sleeps per 64 KiB write and 0.02 per
    /// 16 KiB one (0.08 per 64 KiB) for the sender, 0.13 per 64 KiB for the receiver, at
    /// 12–19 Gbit/s. Before it (03:28 UTC, load 5–6): 0.79 and 0.02–0.04 at 2.2 Gbit/s, the
    /// stack core the slower side.
    fn default() -> Self {
        StreamWaits {
            sender: 0.08,
            receiver: 0.13,
        }
    }
}

impl HostCosts {
    /// The mean response time over the median of the daemon's sleeping applications
    /// ([`HostCosts::app_tail`], at least 1).
    pub fn tail(&self) -> f64 {
        self.app_tail.max(1.0)
    }

    /// The latency of a stack core waking a sleeping application ([`HostCosts::app_wake_ns`]).
    pub fn app_wake(&self) -> f64 {
        if self.app_wake_ns > 0.0 {
            self.app_wake_ns
        } else {
            self.cross_core_ns
        }
    }
}

/// Which calls of a crr connection sleep when flowstackd's applications wait on a futex
/// (`bench crr --peer offload`: client `connect_send` (the request posted behind the
/// connect), `recv` of the answer, `close`; server `accept`, `recv` of the request, `send`,
/// `recv` of the FIN, `close`). Each one that sleeps costs its application
/// [`HostCosts::app_wait_ns`] of CPU on the applications' core; one on the client's path
/// (connect, the request, the answer, the client's close) also adds a wake-up's latency
/// ([`HostCosts::app_wake`]) to the connection's time. The server's accept is completed
/// with the client's connect and its FIN and close while the client's close completes, so
/// their wake-ups run beside the client's (off its path; their CPU still competes for the
/// core both applications share).
///
/// Measured 2026-11-27 06:41–06:42 UTC (`cargo run --release -p flowstack-bench --example
/// offload_trace -- 2`, the futex sleeps per connection, load 1.8–2.4, six runs, with the
/// short-connection shim and the bulk-transfer daemon): the client sleeps 1.0 times (its
/// connect; the answer is there when it asks: 0.3 µs from send to answer; 2.0 in the first
/// of the six runs), the server 1.0 (2.0 in one run): the accept's completion carries the
/// request, and the FIN arrives in the same batch as the next connection's accept (asked
/// ahead), so one wake-up serves both — counted as the accept's. At 03:29 UTC (load 3.5),
/// before those branches, the client slept 2.0 times (connect, answer). The default keeps
/// the answer's sleep: under the validation's load (8.7, 07:14 UTC) the applications' CPU
/// per connection was 101 µs, 3.6 waits' worth — the client does sleep for its answer
/// when its core is shared.
/// Before the daemon's short-connection changes (issue 15) all seven calls slept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrrWaits {
    /// The client's connect waits for its completion (on the path).
    pub connect: bool,
    /// The server's accept sleeps until the connection is there (off the path).
    pub accept: bool,
    /// The server's recv finds the request not yet delivered and sleeps (on the path): it
    /// runs after the client on their shared core, which posts the request first, but
    /// before the stack core has carried it.
    pub request: bool,
    /// The client's recv sleeps until the answer (on the path).
    pub answer: bool,
    /// The server's recv sleeps until the FIN (off the path).
    pub fin: bool,
    /// The server's close waits for its completion (off the path).
    pub server_close: bool,
    /// The client's close waits for its completion (on the path).
    pub client_close: bool,
}

impl Default for CrrWaits {
    fn default() -> Self {
        CrrWaits {
            connect: true,
            accept: true,
            request: false,
            answer: true,
            fin: false,
            server_close: false,
            client_close: false,
        }
    }
}

impl CrrWaits {
    /// Every call sleeps (flowstackd before issue 15's short-connection changes).
    pub fn all() -> Self {
        CrrWaits {
            connect: true,
            accept: true,
            request: true,
            answer: true,
            fin: true,
            server_close: true,
            client_close: true,
        }
    }
}

impl CrrWaits {
    /// How many calls sleep per connection.
    pub fn count(&self) -> usize {
        [
            self.connect,
            self.accept,
            self.request,
            self.answer,
            self.fin,
            self.server_close,
            self.client_close,
        ]
        .iter()
        .filter(|&&x| x)
        .count()
    }

    /// How many of them are on the client's path (each adds a wake-up's latency).
    pub fn on_path(&self) -> usize {
        [self.connect, self.request, self.answer, self.client_close]
            .iter()
            .filter(|&&x| x)
            .count()
    }
}

/// flowstackd's default spin before its engine sleeps (`DEFAULT_SPIN`, `--spin-us 50`).
pub fn daemon_spin() -> f64 {
    50_000.0
}

/// Linux's EEVDF base slice on 2 CPUs: 0.75 ms × (1 + log2 2).
pub fn base_slice_2cpu() -> f64 {
    1_500_000.0
}

/// The network link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkCosts {
    /// Bandwidth, Gbit/s.
    pub gbps: f64,
    /// One-way latency (propagation and switching), ns.
    pub latency_ns: f64,
    /// MTU, bytes (segments larger than this are cut into packets on the wire).
    pub mtu: usize,
    /// Header bytes per packet on the wire.
    pub header_bytes: usize,
    /// Packet error rate: a corrupted packet is received, dropped, and sent again.
    #[serde(default)]
    pub error_rate: f64,
}

/// The bus between host cores and stack cores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BusCosts {
    /// Bandwidth, Gbit/s.
    pub gbps: f64,
    /// Latency per transfer, ns.
    pub latency_ns: f64,
    /// Host CPU time per byte moved to or from the stack core: programmed I/O without DMA
    /// (seed 001's NIC), or the host's copy into shared memory (an offload daemon); 0 with
    /// DMA into the application's buffers.
    #[serde(default)]
    pub host_per_byte_ns: f64,
}

/// A calibration: every cost the simulator charges, and where they came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// A short name ("seed001-table1", "vm").
    pub name: String,
    /// Where the figures come from, in words.
    pub source: String,
    /// The clock the costs were measured at, GHz.
    pub clock_ghz: f64,
    /// The kernel's TCP/IP (used by the `kernel` architecture).
    pub kernel: StackCosts,
    /// flowstack's TCP/IP (used by `library`, `percore`, `offload`); absent: the kernel's.
    #[serde(default)]
    pub flowstack: Option<StackCosts>,
    /// Host costs around the stack.
    pub host: HostCosts,
    /// The link to remote clients.
    pub link: LinkCosts,
    /// The bus to stack cores.
    pub bus: BusCosts,
    /// Assumptions and fitted parameters, one line each.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The measurements each fitted parameter was fitted to (parameter → "what, value").
    #[serde(default)]
    pub fitted: BTreeMap<String, String>,
}

/// The presets shipped with flowstack (`presets/*.json`, compiled in): `vm` (this project's
/// machine, from its profile and bench runs) and `seed001` (seed 001's Table 1).
pub fn preset(name: &str) -> Option<&'static str> {
    match name {
        "vm" => Some(include_str!("../../../presets/vm.json")),
        "seed001" | "seed001-table1" => Some(include_str!("../../../presets/seed001-table1.json")),
        _ => None,
    }
}

/// The profile report `presets/vm.json` was fitted from (`presets/vm-inputs/profile.json`,
/// compiled in), for refitting the residual parameters to fresh bench runs.
pub fn preset_profile() -> &'static str {
    include_str!("../../../presets/vm-inputs/profile.json")
}

impl Calibration {
    /// flowstack's stack costs (the kernel's when the calibration has none of its own).
    pub fn flowstack(&self) -> &StackCosts {
        self.flowstack.as_ref().unwrap_or(&self.kernel)
    }

    /// Reads a preset or calibration file.
    pub fn from_json(s: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(s)
    }

    /// Writes it as indented JSON.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("plain data");
        s.push('\n');
        s
    }
}

/// flowstack's costs from a profile report: per size, the send path's send phase, the ACK
/// processing phase, the receive path without and with its ACK output; fixed and per-byte
/// parts by least squares over the sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileFit {
    /// The stack costs (conn_ns 0, to be fitted from a bench run).
    pub costs: StackCosts,
    /// Each size: (size, send ns, receive ns without ACK output).
    pub points: Vec<(usize, f64, f64)>,
}

fn is_ack_output(l: Layer) -> bool {
    matches!(
        l,
        Layer::TcpOutput | Layer::TcpEmit | Layer::IpOutput | Layer::EthOutput | Layer::DevTx
    )
}

/// Least-squares line through `(x, y)`: (intercept, slope), the slope at least 0.
fn line(pts: &[(f64, f64)]) -> (f64, f64) {
    let n = pts.len() as f64;
    if pts.len() < 2 {
        return (pts.first().map(|p| p.1).unwrap_or(0.0), 0.0);
    }
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
    ((my - slope * mx).max(0.0), slope)
}

/// Fits flowstack's [`StackCosts`] to a profile (see [`ProfileFit`]). The engine loop's own
/// layer (`Engine`) is left out of the segment costs: the bench's drive loop is charged as
/// `poll_turn_ns` per hand-off instead.
pub fn fit_profile(p: &ProfileReport) -> Result<ProfileFit, String> {
    if p.sizes.is_empty() {
        return Err("the profile has no sizes".into());
    }
    let mut send = vec![];
    let mut recv = vec![];
    let (mut ack_in, mut ack_out) = (vec![], vec![]);
    let mut points = vec![];
    for s in &p.sizes {
        let sp = &s.paths.send;
        let rp = &s.paths.receive;
        let keep = |l: Layer| l != Layer::Engine && l != Layer::Outside;
        let sn: f64 = sp
            .layers
            .iter()
            .filter(|l| l.phase == Phase::Send && keep(l.layer))
            .map(|l| l.ns)
            .sum();
        let an: f64 = sp
            .layers
            .iter()
            .filter(|l| l.phase == Phase::Ack && keep(l.layer))
            .map(|l| l.ns)
            .sum();
        let rn: f64 = rp
            .layers
            .iter()
            .filter(|l| keep(l.layer) && !is_ack_output(l.layer))
            .map(|l| l.ns)
            .sum();
        let ao: f64 = rp
            .layers
            .iter()
            .filter(|l| is_ack_output(l.layer))
            .map(|l| l.ns)
            .sum();
        send.push((s.size as f64, sn));
        recv.push((s.size as f64, rn));
        ack_in.push(an);
        ack_out.push(ao);
        points.push((s.size, sn, rn));
    }
    let (sf, sb) = line(&send);
    let (rf, rb) = line(&recv);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    Ok(ProfileFit {
        costs: StackCosts {
            send_fixed_ns: sf,
            send_per_byte_ns: sb,
            recv_fixed_ns: rf,
            recv_per_byte_ns: rb,
            ctrl_send_ns: mean(&ack_out),
            ctrl_recv_ns: mean(&ack_in),
            conn_ns: 0.0,
            max_segment: 65536,
            segments_per_ack: 2.0,
            write_ns: 0.0,
        },
        points,
    })
}

/// The median metric of `peer` in a bench report (transactions/s, connections/s or
/// Mbit/s).
pub fn bench_metric(r: &BenchReport, peer: Peer) -> Option<f64> {
    r.peers.get(&peer).map(|s| s.metric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_through_exact_points_is_found() {
        let (a, b) = line(&[(100.0, 150.0), (300.0, 250.0), (1400.0, 800.0)]);
        assert!(
            (a - 100.0).abs() < 1e-9 && (b - 0.5).abs() < 1e-12,
            "{a} {b}"
        );
        // A falling line is clamped to a flat one (costs do not fall with size).
        let (_, b) = line(&[(100.0, 300.0), (1000.0, 200.0)]);
        assert_eq!(b, 0.0);
    }
}
