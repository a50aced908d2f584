//! `flowstack bench file`: seed 002's file-transfer experiment — one file sent over TCP, five
//! ways, in the same run, page cache warm:
//!
//! - **flowstack `send_file` (read)**: the default [`FileSendMode::Read`], chunks read once
//!   (`pread`) into pooled buffers that become the segments ([`Engine::send_file`]);
//! - **flowstack `send_file` (map)**: [`FileSendMode::Map`], mapped windows of the file become
//!   the segments;
//! - **flowstack read/write**: `pread` into the application's buffer, copied into the socket
//!   (`tcp_send`) — what a file server did before;
//! - **kernel `sendfile(2)`** and **kernel read/write** over loopback.
//!
//! flowstack's two engines (sender and receiver) run on one thread over the in-process pipe
//! (TSO and checksum offload on, as `bench --link pipe`); the time spent in the sender's
//! engine and application code is its CPU. The kernel's sender and receiver are two threads;
//! the sender's CPU is its thread CPU clock (which includes whatever loopback receive work the
//! kernel runs in its context). Receivers discard the bytes (flowstack borrows and consumes
//! them; the kernel reads them). Variants alternate within each round; the report gives
//! medians and the range, and the CPU time of both ends (thread CPU clocks), whose ratios do
//! not move when a loaded machine preempts the run.
//!
//! Also measured: what `pread` alone costs per GiB from the warm page cache — the copy the
//! mapped mode saves (it pays for mapping and populating windows instead).

use crate::flowstack::{engine, pipe_caps, CLIENT_IP, SERVER_IP};
use crate::spec::RunOpts;
use flowstack_api::{FileError, SocketError};
use flowstack_link::pipe::{pipe, PipeEnd};
use flowstack_runtime::Clock;
use flowstack_stack::{Engine, FileSendMode, TcpHandle};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const GIB: f64 = (1u64 << 30) as f64;
/// The read/write loops' buffer (and the kernel receiver's).
const BUF: usize = 256 * 1024;
/// The port flowstack's receiver listens on.
const PORT: u16 = 5002;
/// Longest a single transfer may take.
const LIMIT: Duration = Duration::from_secs(300);

/// Which stacks to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilePeers {
    /// flowstack's `send_file` (both modes) and read/write loop.
    Flowstack,
    /// The kernel's `sendfile` and read/write loop.
    Kernel,
    /// All five.
    Both,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct FileBenchSpec {
    /// File size in bytes.
    pub size: u64,
    /// Which stacks.
    pub peers: FilePeers,
    /// Rounds (each round runs every method once).
    pub runs: usize,
    /// The file to send (created with `size` bytes if absent, removed after); default a
    /// temporary file.
    pub path: Option<PathBuf>,
}

/// One way of sending the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// flowstack `send_file` in its default mode ([`FileSendMode::Read`]).
    FlowstackSendFile,
    /// flowstack `send_file` in [`FileSendMode::Map`].
    FlowstackSendFileMap,
    /// flowstack `pread` + `tcp_send`.
    FlowstackReadWrite,
    /// Kernel `sendfile(2)` over loopback.
    KernelSendfile,
    /// Kernel `pread` + `write` over loopback.
    KernelReadWrite,
}

impl Method {
    /// A short label.
    pub fn name(self) -> &'static str {
        match self {
            Method::FlowstackSendFile => "flowstack send_file (read)",
            Method::FlowstackSendFileMap => "flowstack send_file (map)",
            Method::FlowstackReadWrite => "flowstack read/write",
            Method::KernelSendfile => "kernel sendfile",
            Method::KernelReadWrite => "kernel read/write",
        }
    }
}

/// One transfer.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Sample {
    /// Wall time from the first byte queued to the last byte received.
    pub secs: f64,
    /// The sender's CPU time.
    pub sender_cpu_s: f64,
    /// flowstack: the time spent in the receiver's engine and application (the same receiver
    /// for every flowstack method); the kernel: 0 (its receive work is not separated).
    #[serde(default)]
    pub receiver_cpu_s: f64,
    /// CPU time of the whole transfer, both ends: flowstack, its one thread (sender and
    /// receiver engines and applications, including system time in `pread`); the kernel, the
    /// sender's and the receiver's threads (and the loopback work the kernel charges to them).
    /// Unlike wall time it does not grow while the threads wait for a core, so ratios of it
    /// hold on a loaded machine.
    #[serde(default)]
    pub total_cpu_s: f64,
}

/// Every transfer of one method and its medians.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MethodSummary {
    /// Which method.
    pub method: Method,
    /// Median throughput, GiB/s.
    pub gib_per_s: f64,
    /// Slowest and fastest run, GiB/s.
    pub gib_per_s_range: (f64, f64),
    /// Median sender CPU seconds per GiB sent.
    pub sender_cpu_s_per_gib: f64,
    /// Median receiver seconds per GiB (flowstack only; see [`Sample::receiver_cpu_s`]).
    #[serde(default)]
    pub receiver_cpu_s_per_gib: f64,
    /// Median GiB moved per CPU second of both ends ([`Sample::total_cpu_s`]): the
    /// throughput with a core for each thread whenever it wants one.
    #[serde(default)]
    pub gib_per_cpu_s: f64,
    /// The runs.
    pub samples: Vec<Sample>,
}

/// The report (`--json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileBenchReport {
    /// "flowstack bench file".
    pub tool: String,
    /// File size, bytes.
    pub size: u64,
    /// Rounds.
    pub runs: usize,
    /// `/proc/loadavg` at the start (the machine is shared: read the numbers next to it).
    pub loadavg: String,
    /// Per method, in the order run.
    pub methods: Vec<MethodSummary>,
    /// flowstack `send_file` (default mode, read) throughput over kernel `sendfile` (medians),
    /// when both ran.
    pub speedup: Option<f64>,
    /// flowstack `send_file` (default mode, read) throughput over flowstack's read/write loop.
    pub speedup_over_read_write: Option<f64>,
    /// The same two ratios for `send_file` in the other mode (map): over kernel `sendfile`.
    #[serde(default)]
    pub map_mode_speedup: Option<f64>,
    /// `send_file` in map mode over flowstack's read/write loop.
    #[serde(default)]
    pub map_mode_speedup_over_read_write: Option<f64>,
    /// `send_file` map mode over read mode (throughput medians).
    #[serde(default)]
    pub map_over_read: Option<f64>,
    /// Median sender CPU seconds per GiB, map mode over read mode (above 1: mapping costs more).
    #[serde(default)]
    pub map_over_read_cpu: Option<f64>,
    /// Kernel `sendfile` sender CPU per GiB over flowstack `send_file`'s (higher: flowstack
    /// spends less).
    pub cpu_ratio_vs_kernel_sendfile: Option<f64>,
    /// Median seconds `pread` alone takes per GiB from the page cache (into pooled 256 KiB
    /// buffers): the copy a mapped file would save.
    pub pread_s_per_gib: f64,
    /// [`MethodSummary::gib_per_cpu_s`] of `send_file` (default mode) over the read/write
    /// loop's: `speedup_over_read_write` measured in CPU time instead of wall time.
    #[serde(default)]
    pub cpu_speedup_over_read_write: Option<f64>,
    /// The same over kernel `sendfile` (both ends' CPU).
    #[serde(default)]
    pub cpu_speedup: Option<f64>,
}

impl FileBenchReport {
    /// The report as pretty-printed JSON (reads back with serde).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the benchmark; `on(method, round, sample)` sees each transfer.
pub fn run(
    spec: &FileBenchSpec,
    on: &mut dyn FnMut(Method, usize, &Sample),
) -> Result<FileBenchReport, String> {
    if spec.size == 0 || spec.runs == 0 {
        return Err("--size and --runs must be at least 1".into());
    }
    let loadavg = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    let (path, created) = match &spec.path {
        Some(p) if p.exists() => (p.clone(), false),
        Some(p) => (p.clone(), true),
        None => (
            std::env::temp_dir().join(format!("flowstack-bench-file-{}.bin", std::process::id())),
            true,
        ),
    };
    if created {
        make_file(&path, spec.size).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let r = run_on(spec, &path, loadavg, on);
    if created {
        let _ = std::fs::remove_file(&path);
    }
    r
}

fn run_on(
    spec: &FileBenchSpec,
    path: &std::path::Path,
    loadavg: String,
    on: &mut dyn FnMut(Method, usize, &Sample),
) -> Result<FileBenchReport, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size < spec.size {
        return Err(format!(
            "{} holds {size} bytes, fewer than --size",
            path.display()
        ));
    }
    let size = spec.size;
    let _ = flowstack_sys::file::advise_sequential(&file);
    let mut pread = Vec::new();
    // Warm the page cache (and time pread alone, once per round).
    pread.push(pread_all(&file, size)?);
    let methods: &[Method] = match spec.peers {
        FilePeers::Flowstack => &[
            Method::FlowstackSendFile,
            Method::FlowstackSendFileMap,
            Method::FlowstackReadWrite,
        ],
        FilePeers::Kernel => &[Method::KernelSendfile, Method::KernelReadWrite],
        FilePeers::Both => &[
            Method::FlowstackSendFile,
            Method::FlowstackSendFileMap,
            Method::FlowstackReadWrite,
            Method::KernelSendfile,
            Method::KernelReadWrite,
        ],
    };
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); methods.len()];
    for round in 0..spec.runs {
        // Alternate the order each round so no method always runs right after another.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..methods.len()).collect()
        } else {
            (0..methods.len()).rev().collect()
        };
        for i in order {
            let m = methods[i];
            let s = match m {
                Method::FlowstackSendFile => flowstack_run(&file, size, Some(FileSendMode::Read))?,
                Method::FlowstackSendFileMap => {
                    flowstack_run(&file, size, Some(FileSendMode::Map))?
                }
                Method::FlowstackReadWrite => flowstack_run(&file, size, None)?,
                Method::KernelSendfile => kernel_run(&file, size, true)?,
                Method::KernelReadWrite => kernel_run(&file, size, false)?,
            };
            on(m, round, &s);
            samples[i].push(s);
        }
        pread.push(pread_all(&file, size)?);
    }
    let gib = size as f64 / GIB;
    let summaries: Vec<MethodSummary> = methods
        .iter()
        .zip(samples)
        .map(|(&method, samples)| {
            let mut rates: Vec<f64> = samples.iter().map(|s| gib / s.secs).collect();
            let mut cpu: Vec<f64> = samples.iter().map(|s| s.sender_cpu_s / gib).collect();
            let mut rx: Vec<f64> = samples.iter().map(|s| s.receiver_cpu_s / gib).collect();
            let mut per_cpu: Vec<f64> = samples
                .iter()
                .map(|s| {
                    if s.total_cpu_s > 0.0 {
                        gib / s.total_cpu_s
                    } else {
                        0.0
                    }
                })
                .collect();
            let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rates.iter().copied().fold(0.0, f64::max);
            MethodSummary {
                method,
                gib_per_s: median(&mut rates),
                gib_per_s_range: (lo, hi),
                sender_cpu_s_per_gib: median(&mut cpu),
                receiver_cpu_s_per_gib: median(&mut rx),
                gib_per_cpu_s: median(&mut per_cpu),
                samples,
            }
        })
        .collect();
    let get = |m: Method| summaries.iter().find(|s| s.method == m);
    let ratio = |a: Method, b: Method| match (get(a), get(b)) {
        (Some(x), Some(y)) if y.gib_per_s > 0.0 => Some(x.gib_per_s / y.gib_per_s),
        _ => None,
    };
    let speedup = ratio(Method::FlowstackSendFile, Method::KernelSendfile);
    let cpu_ratio_of = |a: Method, b: Method| match (get(a), get(b)) {
        (Some(x), Some(y)) if y.gib_per_cpu_s > 0.0 => Some(x.gib_per_cpu_s / y.gib_per_cpu_s),
        _ => None,
    };
    let cpu_speedup_over_read_write =
        cpu_ratio_of(Method::FlowstackSendFile, Method::FlowstackReadWrite);
    let cpu_speedup = cpu_ratio_of(Method::FlowstackSendFile, Method::KernelSendfile);
    let speedup_over_read_write = ratio(Method::FlowstackSendFile, Method::FlowstackReadWrite);
    let map_mode_speedup = ratio(Method::FlowstackSendFileMap, Method::KernelSendfile);
    let map_mode_speedup_over_read_write =
        ratio(Method::FlowstackSendFileMap, Method::FlowstackReadWrite);
    let map_over_read = ratio(Method::FlowstackSendFileMap, Method::FlowstackSendFile);
    let map_over_read_cpu = match (
        get(Method::FlowstackSendFileMap),
        get(Method::FlowstackSendFile),
    ) {
        (Some(m), Some(r)) if r.sender_cpu_s_per_gib > 0.0 => {
            Some(m.sender_cpu_s_per_gib / r.sender_cpu_s_per_gib)
        }
        _ => None,
    };
    let cpu_ratio = match (get(Method::KernelSendfile), get(Method::FlowstackSendFile)) {
        (Some(k), Some(f)) if f.sender_cpu_s_per_gib > 0.0 => {
            Some(k.sender_cpu_s_per_gib / f.sender_cpu_s_per_gib)
        }
        _ => None,
    };
    let mut pread: Vec<f64> = pread.iter().map(|s| s / gib).collect();
    Ok(FileBenchReport {
        tool: "flowstack bench file".into(),
        size,
        runs: spec.runs,
        loadavg,
        methods: summaries,
        speedup,
        speedup_over_read_write,
        map_mode_speedup,
        map_mode_speedup_over_read_write,
        map_over_read,
        map_over_read_cpu,
        cpu_ratio_vs_kernel_sendfile: cpu_ratio,
        pread_s_per_gib: median(&mut pread),
        cpu_speedup_over_read_write,
        cpu_speedup,
    })
}

/// One transfer of `size` bytes of the file at `path` by `method`, after a warming read:
/// what `examples/file_once.rs` runs under an instruction profiler.
pub fn once(path: &std::path::Path, size: u64, method: Method) -> Result<Sample, String> {
    if !path.exists() {
        make_file(path, size).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    pread_all(&file, size)?;
    match method {
        Method::FlowstackSendFile => flowstack_run(&file, size, Some(FileSendMode::Read)),
        Method::FlowstackSendFileMap => flowstack_run(&file, size, Some(FileSendMode::Map)),
        Method::FlowstackReadWrite => flowstack_run(&file, size, None),
        Method::KernelSendfile => kernel_run(&file, size, true),
        Method::KernelReadWrite => kernel_run(&file, size, false),
    }
}

/// Writes `size` bytes of a cheap position-dependent pattern.
fn make_file(path: &std::path::Path, size: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, File::create(path)?);
    let mut block = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(block.len() as u64) as usize;
        for (i, b) in block[..n].iter_mut().enumerate() {
            *b = (((off + i as u64) * 2654435761) >> 13) as u8;
        }
        f.write_all(&block[..n])?;
        off += n as u64;
    }
    f.flush()
}

/// An application buffer of `len` bytes starting on a page. Every loop here reads into one:
/// the kernel's copy out of the page cache runs at half speed into a destination 16 bytes
/// past a 64-byte boundary (measured on the bench VM; see `CHUNK_ALIGN` in the engine's
/// `file.rs`), which is where a `Vec` of this size may land depending on the heap's history.
/// The same alignment for every method and every run (`send_file`'s chunks are page-aligned
/// too).
struct AlignedBuf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    const ALIGN: usize = 4096;

    fn new(len: usize) -> Self {
        let mem = vec![0u8; len + Self::ALIGN];
        let start = (Self::ALIGN - mem.as_ptr() as usize % Self::ALIGN) % Self::ALIGN;
        AlignedBuf { mem, start, len }
    }

    fn get(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }

    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }
}

/// Reads the first `size` bytes with `pread` into one 256 KiB buffer; seconds taken.
fn pread_all(file: &File, size: u64) -> Result<f64, String> {
    let mut buf = AlignedBuf::new(BUF);
    let buf = buf.get_mut();
    let t = Instant::now();
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(BUF as u64) as usize;
        match file.read_at(&mut buf[..n], off) {
            Ok(0) => return Err("the file shrank".into()),
            Ok(k) => off += k as u64,
            Err(e) => return Err(e.to_string()),
        }
    }
    std::hint::black_box(&buf);
    Ok(t.elapsed().as_secs_f64())
}

/// The sender's application: `send_file` (in a mode), or a read/write loop through `buf`.
struct Sender {
    send_file: Option<FileSendMode>,
    queued: u64,
    buf: AlignedBuf,
    /// `buf[pos..filled]` is read and not yet sent.
    pos: usize,
    filled: usize,
}

impl Sender {
    fn step(&mut self, e: &mut Engine, c: TcpHandle, file: &File, size: u64) -> Result<(), String> {
        if self.send_file.is_some() {
            while self.queued < size {
                match e.send_file(c, file, self.queued, size - self.queued) {
                    Ok(n) => self.queued += n as u64,
                    Err(FileError::Socket(SocketError::WouldBlock)) => break,
                    Err(err) => return Err(format!("send_file: {err}")),
                }
            }
            while e.tcp_zc_completion(c).is_some() {}
            return Ok(());
        }
        loop {
            if self.pos == self.filled {
                let at = self.queued;
                if at >= size {
                    return Ok(());
                }
                let want = (size - at).min(BUF as u64) as usize;
                let n = file
                    .read_at(&mut self.buf.get_mut()[..want], at)
                    .map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("the file shrank".into());
                }
                (self.pos, self.filled) = (0, n);
            }
            match e.tcp_send(c, &self.buf.get()[self.pos..self.filled]) {
                Ok(n) => {
                    self.pos += n;
                    self.queued += n as u64;
                }
                Err(SocketError::WouldBlock) => return Ok(()),
                Err(err) => return Err(format!("tcp_send: {err}")),
            }
        }
    }
}

/// flowstack: sender and receiver engines on this thread over the in-process pipe.
fn flowstack_run(file: &File, size: u64, mode: Option<FileSendMode>) -> Result<Sample, String> {
    let o = RunOpts::default();
    let caps = pipe_caps(&o);
    let (mut da, mut db) = pipe(caps, 1 << 16);
    let mut ea = engine(CLIENT_IP, caps, &o);
    let mut eb = engine(SERVER_IP, caps, &o);
    let clock = Clock::start();
    let l = eb.tcp_listen(PORT, 4).map_err(|e| e.to_string())?;
    ea.set_now(clock.now());
    let c = ea
        .tcp_connect(SocketAddrV4::new(SERVER_IP.into(), PORT))
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + LIMIT;
    let s = loop {
        let now = clock.now();
        ea.poll(now, &mut da);
        eb.poll(now, &mut db);
        if let Ok(s) = eb.tcp_accept(l) {
            if ea.tcp_conn(c).is_ok_and(|c| c.is_open()) {
                break s;
            }
        }
        if Instant::now() > deadline {
            return Err("flowstack handshake timed out".into());
        }
    };
    if let Some(m) = mode {
        ea.set_file_send_mode(m);
    }
    let mut sender = Sender {
        send_file: mode,
        queued: 0,
        buf: AlignedBuf::new(BUF),
        pos: 0,
        filled: 0,
    };
    let (mut got, mut sender_ns, mut receiver_ns) = (0u64, 0u128, 0u128);
    let t0 = Instant::now();
    let cpu0 = flowstack_sys::file::thread_cpu_ns();
    while got < size {
        let now = clock.now();
        let s0 = Instant::now();
        sender_turn(&mut ea, &mut da, &mut sender, c, file, size, now)?;
        let s1 = Instant::now();
        got += receiver_turn(&mut eb, &mut db, s, now)? as u64;
        sender_ns += (s1 - s0).as_nanos();
        receiver_ns += s1.elapsed().as_nanos();
        if t0.elapsed() > LIMIT {
            return Err("flowstack transfer timed out".into());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = flowstack_sys::file::thread_cpu_ns() - cpu0;
    Ok(Sample {
        secs,
        sender_cpu_s: sender_ns as f64 / 1e9,
        receiver_cpu_s: receiver_ns as f64 / 1e9,
        total_cpu_s: cpu as f64 / 1e9,
    })
}

/// The sender's share of one turn: its engine's input and output, and its application.
/// Not inlined, so an instruction profile (`callgrind`) tells the sender's cost from the
/// receiver's.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn sender_turn(
    ea: &mut Engine,
    da: &mut PipeEnd,
    sender: &mut Sender,
    c: TcpHandle,
    file: &File,
    size: u64,
    now: flowstack_wire::Instant,
) -> Result<(), String> {
    ea.poll(now, da);
    sender.step(ea, c, file, size)?;
    ea.dispatch(now);
    Ok(())
}

/// The receiver's share of one turn: its engine, then every readable byte borrowed where it
/// lies and consumed (discarded, the same for every flowstack method). Bytes consumed.
#[inline(never)]
fn receiver_turn(
    eb: &mut Engine,
    db: &mut PipeEnd,
    s: TcpHandle,
    now: flowstack_wire::Instant,
) -> Result<usize, String> {
    eb.poll(now, db);
    let (a, b) = eb.tcp_peek(s, usize::MAX).map_err(|e| e.to_string())?;
    let n = a.len() + b.len();
    std::hint::black_box((a, b));
    eb.tcp_consume(s, n).map_err(|e| e.to_string())?;
    Ok(n)
}

/// The kernel over loopback: receiver thread, sender on this thread.
fn kernel_run(file: &File, size: u64, sendfile: bool) -> Result<Sample, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let rx = std::thread::spawn(move || -> std::io::Result<(u64, u64)> {
        let (mut s, _) = l.accept()?;
        let mut buf = AlignedBuf::new(BUF);
        let mut got = 0u64;
        // From the first byte: the accept's wait is not part of the transfer.
        let mut cpu0 = None;
        loop {
            match s.read(buf.get_mut())? {
                0 => {
                    let cpu0 = cpu0.unwrap_or_else(flowstack_sys::file::thread_cpu_ns);
                    return Ok((got, flowstack_sys::file::thread_cpu_ns() - cpu0));
                }
                n => {
                    cpu0.get_or_insert_with(flowstack_sys::file::thread_cpu_ns);
                    got += n as u64;
                }
            }
        }
    });
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let cpu0 = flowstack_sys::file::thread_cpu_ns();
    let mut off = 0u64;
    let mut buf = AlignedBuf::new(BUF);
    let buf = buf.get_mut();
    while off < size {
        let want = (size - off).min(1 << 30) as usize;
        let n = if sendfile {
            flowstack_sys::file::sendfile(&s, file, off, want)
        } else {
            let want = want.min(BUF);
            file.read_at(&mut buf[..want], off)
                .and_then(|n| s.write_all(&buf[..n]).map(|_| n))
        }
        .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the file shrank".into());
        }
        off += n as u64;
    }
    let cpu = flowstack_sys::file::thread_cpu_ns() - cpu0;
    s.shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    let (got, rx_cpu) = rx
        .join()
        .map_err(|_| "kernel receiver panicked".to_string())?
        .map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    if got != size {
        return Err(format!("kernel receiver got {got} of {size} bytes"));
    }
    Ok(Sample {
        secs,
        sender_cpu_s: cpu as f64 / 1e9,
        receiver_cpu_s: 0.0,
        total_cpu_s: (cpu + rx_cpu) as f64 / 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_moves_the_whole_file() {
        let spec = FileBenchSpec {
            size: 3 * 256 * 1024 + 17,
            peers: FilePeers::Both,
            runs: 1,
            path: None,
        };
        let mut seen = Vec::new();
        let r = run(&spec, &mut |m, _, s| seen.push((m, s.secs))).unwrap();
        assert_eq!(seen.len(), 5);
        assert_eq!(r.methods.len(), 5);
        assert!(r.speedup.is_some() && r.speedup_over_read_write.is_some());
        assert!(r.cpu_speedup.is_some() && r.cpu_speedup_over_read_write.is_some());
        assert!(r.methods.iter().all(|m| m.gib_per_cpu_s > 0.0));
        assert!(r
            .methods
            .iter()
            .filter(|m| !matches!(m.method, Method::KernelSendfile | Method::KernelReadWrite))
            .all(|m| m.receiver_cpu_s_per_gib > 0.0));
        assert!(r.map_mode_speedup.is_some() && r.map_over_read.is_some());
        assert!(r
            .methods
            .iter()
            .all(|m| m.samples.len() == 1 && m.gib_per_s > 0.0));
        let json = serde_json::to_string(&r).unwrap();
        let back: FileBenchReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back.size, spec.size);
    }
}
