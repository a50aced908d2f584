//! Options shared by the commands that run flowstack on a real link: LINK and ADDR, parsed
//! here and handed to the runtime as a [`LinkSpec`].

use clap::Args;
use flowstack_link::impair::ImpairSpec;
use flowstack_link::Device;
use flowstack_runtime::link::fanout_counts;
use flowstack_runtime::{AddrSpec, Host, Link, LinkSpec};
use flowstack_stack::{Engine, EngineConfig};
use flowstack_wire::{EthernetAddress, Ipv4Address, Ipv4Cidr};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// LINK: the device flowstack runs on, plus capture and impairment. One device is required
/// (group `device`; `flowstack daemon`, whose link is optional, lifts that).
#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("device").required(true).args(["tap", "packet", "xdp", "shm_fd"])))]
pub struct LinkArgs {
    /// Attach to (or create) this TAP interface; the kernel is on its other side.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["packet", "xdp", "shm_fd"])]
    pub tap: Option<String>,
    /// Use this existing interface through an AF_PACKET socket (e.g. one end of a veth pair).
    #[arg(long, value_name = "IFACE", conflicts_with_all = ["xdp", "shm_fd"])]
    pub packet: Option<String>,
    /// Use this existing interface through AF_XDP sockets, one per queue, with a built-in XDP
    /// program redirecting its frames to them (needs root; copy mode on veth).
    #[arg(long, value_name = "IFACE", conflicts_with = "shm_fd")]
    pub xdp: Option<String>,
    /// With --xdp: the number of queues (sockets 0..N) one engine receives from.
    #[arg(long, value_name = "N", requires = "xdp", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub queues: Option<u16>,
    /// With --tap: do not use the vnet header (no segmentation or checksum offload).
    #[arg(long)]
    pub no_vnet: bool,
    /// Use the shm wire whose descriptor this process inherited (made by another flowstack
    /// process, e.g. a test or `flowstack bench`).
    #[arg(long, value_name = "FD")]
    pub shm_fd: Option<i32>,
    /// Capture every frame sent and received to this pcap file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Impair our transmit side, e.g. loss=0.02,reorder=0.02.
    #[arg(long, value_name = "SPEC", value_parser = |s: &str| s.parse::<ImpairSpec>())]
    pub impair: Option<ImpairSpec>,
    /// Seed of the impairment generator.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
}

/// ADDR: flowstack's own addresses on the link.
#[derive(Args, Debug, Clone)]
pub struct AddrArgs {
    /// Our address and prefix, e.g. 10.0.0.2/24.
    #[arg(long, value_name = "CIDR", value_parser = |s: &str| s.parse::<Ipv4Cidr>())]
    pub ip: Ipv4Cidr,
    /// Default gateway.
    #[arg(long, value_name = "IP", value_parser = |s: &str| s.parse::<Ipv4Address>())]
    pub gw: Option<Ipv4Address>,
    /// Our MAC (default 02:66:73 followed by the last three bytes of the address).
    #[arg(long, value_name = "MAC", value_parser = |s: &str| s.parse::<EthernetAddress>())]
    pub mac: Option<EthernetAddress>,
}

impl LinkArgs {
    /// The link these arguments describe, with addresses `addr`.
    pub fn spec(&self, addr: &AddrArgs) -> Result<LinkSpec, String> {
        let link = if let Some(name) = &self.tap {
            Link::Tap {
                name: name.clone(),
                vnet: !self.no_vnet,
            }
        } else if let Some(iface) = &self.packet {
            Link::Packet {
                iface: iface.clone(),
            }
        } else if let Some(iface) = &self.xdp {
            Link::Xdp {
                iface: iface.clone(),
                queues: self.queues.unwrap_or(1) as usize,
            }
        } else if let Some(fd) = self.shm_fd {
            Link::ShmFd(fd)
        } else {
            return Err("a link is required: --tap NAME, --packet IFACE or --xdp IFACE".into());
        };
        Ok(LinkSpec {
            link,
            pcap: self.pcap.clone(),
            impair: self.impair.unwrap_or_default(),
            seed: self.seed,
            addr: addr.spec(),
        })
    }
}

impl AddrArgs {
    /// The addresses these arguments describe.
    pub fn spec(&self) -> AddrSpec {
        AddrSpec {
            ip: self.ip,
            gateway: self.gw,
            mac: self.mac,
        }
    }
}

/// Opens the link and builds a host on it.
pub fn open(link: &LinkArgs, addr: &AddrArgs) -> Result<Host<Box<dyn Device>>, String> {
    open_tuned(link, addr, |_| {})
}

/// [`open`], letting `tune` adjust the engine's configuration first.
pub fn open_tuned(
    link: &LinkArgs,
    addr: &AddrArgs,
    tune: impl FnOnce(&mut EngineConfig),
) -> Result<Host<Box<dyn Device>>, String> {
    link.spec(addr)?.open(tune).map_err(|e| e.to_string())
}

/// [`open`], printing the reason on failure; `Err` is the exit status (1) to return.
pub fn open_or_exit(
    link: &LinkArgs,
    addr: &AddrArgs,
) -> Result<Host<Box<dyn Device>>, std::process::ExitCode> {
    open(link, addr).map_err(|e| {
        eprintln!("flowstack: {e}");
        std::process::ExitCode::from(1)
    })
}

/// A flag set by SIGINT/SIGTERM.
pub fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    stop
}

/// Prints the engine's nonzero counters, four per line.
pub fn print_counters(e: &Engine, out: &mut dyn std::io::Write) {
    let list: Vec<String> = e
        .counters()
        .nonzero()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for chunk in list.chunks(4) {
        let _ = writeln!(out, "  {}", chunk.join("  "));
    }
}

/// `flowstack __fanout-check IFACE N MS`: opens N AF_PACKET sockets on IFACE in one hash
/// fanout group, counts the frames each receives for MS milliseconds and prints the counts
/// (one per line). Used by the interop tests to show that flows are spread.
pub fn fanout_check(args: &[String]) -> std::process::ExitCode {
    let (Some(iface), Some(n), Some(ms)) = (
        args.first(),
        args.get(1).and_then(|s| s.parse::<usize>().ok()),
        args.get(2).and_then(|s| s.parse::<u64>().ok()),
    ) else {
        eprintln!("flowstack: usage: __fanout-check IFACE N MS");
        return std::process::ExitCode::from(2);
    };
    let ready = || {
        println!("ready");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    };
    match fanout_counts(iface, n, std::time::Duration::from_millis(ms), ready) {
        Ok(counts) => {
            for c in counts {
                println!("{c}");
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("flowstack: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
