//! `flowstack bench stream|rr|crr`: arguments → [`flowstack_bench::run()`] → printing;
//! `flowstack bench file`: arguments → [`flowstack_bench::file::run`] → printing (`file.rs`);
//! `flowstack bench conns`: arguments → [`flowstack_bench::conns::run`] → printing (`conns.rs`).
//!
//! The runs themselves (the flowstack peer's two processes over the shm wire, the kernel and
//! smoltcp peers) live in the `flowstack-bench` crate; the results are
//! [`flowstack_prof::report`] types, and `--json` writes them with serde.

mod conns;
mod file;
mod print;

use clap::{Args, ValueEnum};
use flowstack_bench::{BenchSpec, Event, ServerSpec};
use flowstack_prof::report::{self, BenchLink, Workload};
use std::path::PathBuf;
use std::process::ExitCode;

/// The workload to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadArg {
    /// One-way bulk throughput.
    Stream,
    /// Request/response ping-pong on open connections.
    Rr,
    /// Connect, request, response, close.
    Crr,
    /// One file sent four ways: flowstack send_file and read/write, kernel sendfile and
    /// read/write (seed 002).
    File,
    /// Memory per idle established connection, and the time to open and close many.
    Conns,
}

impl WorkloadArg {
    /// The socket workload (`None` for `file`, which runs apart).
    fn stack(self) -> Option<Workload> {
        match self {
            WorkloadArg::Stream => Some(Workload::Stream),
            WorkloadArg::Rr => Some(Workload::Rr),
            WorkloadArg::Crr => Some(Workload::Crr),
            WorkloadArg::File | WorkloadArg::Conns => None,
        }
    }
}

/// Which stacks to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerSel {
    /// flowstack only.
    Flowstack,
    /// The Linux kernel over loopback only.
    Kernel,
    /// smoltcp (from crates.io) over an in-process link, next to flowstack over the
    /// in-process pipe with the same settings (software checksums, MTU 1500): stream only.
    Smoltcp,
    /// flowstack and the kernel, compared.
    Both,
    /// The client library over flowstackd's loopback, and the kernel over 127.0.0.1, in the
    /// same run: throughput, latency, application and stack CPU per request (rr, crr,
    /// stream; one connection).
    Offload,
}

/// The link between flowstack's two engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LinkSel {
    /// Two processes over the shared-memory wire.
    Shm,
    /// One process, both engines over the in-process pipe.
    Pipe,
}

/// Kernel peer placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Placement {
    /// Scheduler's choice.
    Free,
    /// Client on core 0, server on core 1.
    Split,
    /// Both on core 0.
    Same,
}

/// Options shared by the client and the server of a run.
#[derive(Args, Debug, Clone)]
pub struct RunOpts {
    /// Bytes per write (stream) or per request and response (rr, crr) [default: 65536 for
    /// stream, 64 otherwise].
    #[arg(long, value_name = "B")]
    pub msg_size: Option<usize>,
    /// Ablation: copy data into and out of the socket buffers instead of lending the
    /// application's buffers to the stack (send) and borrowing the receive buffer (receive).
    #[arg(long)]
    pub no_zero_copy: bool,
    /// Ablation: segment in software to the MTU instead of handing 64 KiB segments down.
    #[arg(long)]
    pub no_tso: bool,
    /// Ablation: acknowledge every segment at once.
    #[arg(long)]
    pub no_delayed_ack: bool,
    /// Ablation: compute and verify checksums in software on the shm wire.
    #[arg(long)]
    pub no_checksum_offload: bool,
    /// Socket send and receive buffer size (the largest window).
    #[arg(long, value_name = "BYTES")]
    pub window: Option<usize>,
    /// Where the kernel peer's client and server run: `free` (the scheduler decides),
    /// `split` (pinned to different cores, like flowstack's engines) or `same` (one core,
    /// which avoids cross-core wake-ups and is the kernel's best case for rr in a VM).
    #[arg(long, value_enum, default_value = "free")]
    pub kernel_placement: Placement,
}

impl RunOpts {
    fn spec(&self) -> flowstack_bench::RunOpts {
        flowstack_bench::RunOpts {
            msg_size: self.msg_size,
            no_zero_copy: self.no_zero_copy,
            no_tso: self.no_tso,
            no_delayed_ack: self.no_delayed_ack,
            no_checksum_offload: self.no_checksum_offload,
            window: self.window,
            kernel_placement: match self.kernel_placement {
                Placement::Free => flowstack_bench::Placement::Free,
                Placement::Split => flowstack_bench::Placement::Split,
                Placement::Same => flowstack_bench::Placement::Same,
            },
        }
    }
}

/// Options of `flowstack bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// stream: one-way bulk throughput; rr: request/response latency; crr: connect/request/response/close rate; file: file transfer (send_file vs sendfile).
    #[arg(value_enum)]
    workload: WorkloadArg,
    /// Which stacks to run.
    #[arg(long, value_enum, default_value = "both")]
    peer: PeerSel,
    /// How flowstack's two engines are joined.
    #[arg(long, value_enum, default_value = "shm")]
    link: LinkSel,
    /// Seconds per run.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    duration: f64,
    /// Parallel connections.
    #[arg(long, value_name = "N", default_value_t = 1)]
    conns: usize,
    /// Runs per peer; the report gives the median (and min/max).
    #[arg(long, value_name = "N", default_value_t = 1)]
    runs: usize,
    /// Split both peers by flow over N cores: core k runs shard k of the client side and
    /// shard k of the server side, pinned to CPU k (flowstack: client and server engine k on
    /// one thread over their own pipe, RSS-aware ports; kernel: a SO_REUSEPORT server thread
    /// and the core's client threads). Without it: the classic run (one client, one server).
    #[arg(long, value_name = "N")]
    cores: Option<usize>,
    /// --peer offload: the daemon's engine CPUs, one pinned engine thread each (`0,1`); the
    /// client and server applications are spread over them (two or more: their connection
    /// crosses engines) [default: one engine on the first allowed CPU].
    #[arg(long, value_name = "LIST")]
    daemon_cores: Option<String>,
    /// Write results as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// file: bytes to send (K, M, G suffixes) [default: 1G].
    #[arg(long, value_name = "N", value_parser = crate::demo::parse_size)]
    size: Option<u64>,
    /// file: the file to send (created with --size bytes and removed after, if absent)
    /// [default: a temporary file].
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// conns: connections to open [default: 100000].
    #[arg(long, value_name = "N")]
    count: Option<usize>,
    /// conns: each engine's connection limit [default: --count].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    #[command(flatten)]
    opts: RunOpts,
}

impl BenchArgs {
    fn spec(&self, workload: Workload) -> BenchSpec {
        BenchSpec {
            workload,
            peer: match self.peer {
                PeerSel::Flowstack => flowstack_bench::PeerSel::Flowstack,
                PeerSel::Kernel => flowstack_bench::PeerSel::Kernel,
                PeerSel::Smoltcp => flowstack_bench::PeerSel::Smoltcp,
                PeerSel::Both | PeerSel::Offload => flowstack_bench::PeerSel::Both,
            },
            link: match self.link {
                LinkSel::Shm => BenchLink::Shm,
                LinkSel::Pipe => BenchLink::Pipe,
            },
            duration: self.duration,
            conns: self.conns,
            runs: self.runs,
            opts: self.opts.spec(),
            cores: self.cores,
        }
    }
}

/// Options of the hidden server process (written by `flowstack-bench`, not by hand).
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// The server's spec as JSON.
    #[arg(long)]
    spec: String,
}

/// Entry of the hidden server process.
pub fn serve(a: ServerArgs) -> ExitCode {
    let spec = match ServerSpec::from_arg(&a.spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(2);
        }
    };
    let stop = crate::net::stop_flag();
    match flowstack_bench::serve(&spec, &stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flowstack: {e}");
            ExitCode::from(1)
        }
    }
}

/// Entry of `flowstack bench`.
pub fn run(a: BenchArgs) -> ExitCode {
    if a.workload == WorkloadArg::Conns {
        return conns::run(&a);
    }
    if a.count.is_some() || a.max_connections.is_some() {
        eprintln!("flowstack: --count and --max-connections are for `bench conns`");
        return ExitCode::from(2);
    }
    let Some(workload) = a.workload.stack() else {
        return file::run(&a);
    };
    if a.size.is_some() || a.file.is_some() {
        eprintln!("flowstack: --size and --file are for `bench file`");
        return ExitCode::from(2);
    }
    let spec = match a.spec(workload).validated() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(2);
        }
    };
    if a.peer == PeerSel::Offload {
        return offload(&a, &spec);
    }
    print::header(&spec);
    let bar = print::Progress::new(&spec);
    let result = flowstack_bench::run(&spec, &mut |ev| match ev {
        Event::Started { peer, run } => bar.started(peer, run),
        Event::Finished { peer, result, .. } => {
            bar.suspend(|| print::run(spec.workload, peer, result));
            bar.finished();
        }
    });
    bar.clear();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(1);
        }
    };
    print::summary(&report);
    if let Some(p) = &a.json {
        if let Err(e) = std::fs::write(p, report::to_json(&report)) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

/// `--peer offload`: the daemon's client library against the kernel, same run.
fn offload(a: &BenchArgs, spec: &BenchSpec) -> ExitCode {
    let daemon_cores = match a
        .daemon_cores
        .as_deref()
        .map(flowstack_runtime::parse_cores)
    {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            eprintln!("flowstack: --daemon-cores: {e}");
            return ExitCode::from(2);
        }
    };
    let o = flowstack_bench::offload::OffloadSpec {
        workload: spec.workload,
        msg: spec.msg_size(),
        duration: spec.duration,
        runs: spec.runs,
        daemon_cores,
    };
    let r = match flowstack_bench::offload::run(&o) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(1);
        }
    };
    print!("{}", r.table());
    if let Some(p) = &a.json {
        if let Err(e) = std::fs::write(p, r.to_json()) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
