//! `flowstack`: a user-space TCP/IP stack and the tools that show what it does.

use clap::{Parser, Subcommand};
use flowstack_cli::{
    bench, daemon, demo, get, init_logging, net, ping, profile, run, serve, sim, simnet, stats,
};
use std::process::ExitCode;

/// flowstack — a user-space TCP/IP stack in Rust.
///
/// flowstack runs Ethernet, ARP, IPv4, ICMP, UDP and TCP in user space, one shared-nothing
/// engine per core. This command runs the stack's demonstration and tools.
///
/// EXIT STATUS: 0 on success, 1 when the job fails (e.g. data did not verify), 2 on misuse.
#[derive(Parser, Debug)]
#[command(name = "flowstack", version, about, long_about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two engines in one process over an in-process link: ARP, ping, UDP echo, a verified TCP
    /// bulk transfer and an HTTP/1.1 exchange, then a report.
    ///
    /// Needs no privileges. The link can be impaired (loss, reordering, duplication,
    /// corruption, delay) from a seeded generator, so every run with the same --seed is the
    /// same run; --pcap records host A's side of the link for tcpdump or Wireshark.
    Demo(demo::DemoArgs),
    /// Run a server (http, echo, sink) on a flowstack instance attached to a real link.
    ///
    /// LINK is --tap NAME (the kernel on the other side of a TAP) or --packet IFACE (an
    /// existing interface through AF_PACKET, e.g. one end of a veth pair); ADDR is
    /// --ip CIDR [--gw IP] [--mac MAC]. Example:
    ///   flowstack serve --tap fs0 --ip 10.7.0.2/24 http --root ./www --port 80
    Serve(serve::ServeArgs),
    /// HTTP/1.1 GET from a flowstack instance: flowstack get LINK ADDR URL [-o FILE].
    Get(get::GetArgs),
    /// ICMP echo from a flowstack instance: flowstack ping LINK ADDR HOST [-c N].
    Ping(ping::PingArgs),
    /// Per-layer cost of sending and receiving one TCP segment (seed 000's experiment).
    ///
    /// Runs single-segment send and receive between two engines over the in-process link and
    /// prints, per size, the cycles and nanoseconds of every layer, its share, hardware
    /// counters where the machine has them, and the throughput ceilings they imply.
    Profile(profile::ProfileArgs),
    /// flowstack and the Linux kernel side by side: stream, rr or crr, same machine, same run.
    ///
    /// The flowstack peer runs client and server in two processes joined by the shm wire;
    /// the kernel peer runs the same logic over loopback TCP. Ablation switches turn one
    /// optimisation off at a time. Example: flowstack bench rr --peer both --runs 5
    Bench(bench::BenchArgs),
    /// The offload daemon (flowstackd): the stack as a service for applications on this host.
    ///
    /// Serves TCP on its own loopback interface (127.0.0.0/8) to applications that
    /// register on a unix socket with the flowstack client library; needs no privileges.
    Daemon(daemon::DaemonArgs),
    /// Run an unmodified program on flowstack: flowstack run [--socket PATH] [-v] -- CMD ARGS...
    ///
    /// Starts the daemon on the socket if none answers, loads libflowstack_preload.so into CMD
    /// (LD_PRELOAD) and runs it; the exit status is CMD's. IPv4 TCP sockets go through the
    /// daemon, everything else stays on the kernel; -v prints per process which and why.
    Run(run::RunArgs),
    /// Sockets and counters of a running daemon, as `ss` and `nstat` show them.
    ///
    /// Example: flowstack stats --watch 1
    Stats(stats::StatsArgs),
    /// Seeded network simulations at scale: random links, paths, impairments and workloads,
    /// every byte checked; a failing seed prints the command that replays it.
    ///
    /// Example: flowstack simnet --seeds 10000; flowstack simnet --seed 42 --pcap s42.pcap
    Simnet(simnet::SimnetArgs),
    /// The architecture simulator: kernel, library, percore and offload on N cores, calibrated
    /// by the profiler and checked against the bench (--validate); seed 001 reproduced (--seed001).
    Sim(sim::SimArgs),
    /// (internal) the server process of `flowstack bench`.
    #[command(name = "__bench-server", hide = true)]
    BenchServer(bench::ServerArgs),
}

fn main() -> ExitCode {
    // Internal helper for the interop tests (not part of the documented interface).
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("__fanout-check") {
        return net::fanout_check(&argv[2..]);
    }
    let cli: Cli = match flowstack_cli::parse_args("flowstack") {
        Ok(c) => c,
        Err(code) => return code,
    };
    init_logging();
    match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Get(a) => get::run(a),
        Cmd::Ping(a) => ping::run(a),
        Cmd::Profile(a) => profile::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Daemon(a) => daemon::run(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Stats(a) => stats::run(a),
        Cmd::Simnet(a) => simnet::run(a),
        Cmd::Sim(a) => sim::run(a),
        Cmd::BenchServer(a) => bench::serve(a),
    }
}
