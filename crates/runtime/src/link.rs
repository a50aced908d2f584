//! Link specs: what a tool or a shard runs on, described as plain data and opened here.
//!
//! A [`LinkSpec`] names the device ([`Link`]: a TAP, an interface through AF_PACKET, an
//! inherited shm wire, one end of an in-process pipe), its middleware (fault injection and
//! pcap capture) and flowstack's own addresses on it ([`AddrSpec`]). It knows nothing of
//! command lines: the CLI turns its arguments into one, a test or a daemon builds one
//! directly. [`LinkSpec::open`] opens and wraps the device and builds a [`Host`] on it.
//!
//! The device is wrapped inside out: impairment first (it acts on our transmit side), then
//! capture (so the pcap shows what left the impairment and what arrived).

use crate::Host;
use flowstack_link::impair::{ImpairSpec, Impaired};
use flowstack_link::packet::{PacketSocket, RxRing};
use flowstack_link::pcap::{Pcap, PcapWriter};
use flowstack_link::pipe::PipeEnd;
use flowstack_link::shm::ShmWire;
use flowstack_link::tap::Tap;
use flowstack_link::xdp::{XdpQueues, XdpSocket};
use flowstack_link::Device;
use flowstack_stack::{Engine, EngineConfig, IfaceConfig};
use flowstack_wire::{EthernetAddress, Instant, Ipv4Address, Ipv4Cidr};
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter};
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The first three bytes of flowstack's default MACs (a locally administered unicast prefix:
/// 02, then "fs" in ASCII).
pub const DEFAULT_MAC_PREFIX: [u8; 3] = [0x02, 0x66, 0x73];

/// flowstack's default MAC for address `ip`: [`DEFAULT_MAC_PREFIX`] followed by the
/// address's last three bytes (10.7.0.2 → 02:66:73:07:00:02), so hosts on one subnet get
/// distinct MACs without configuration.
pub fn default_mac(ip: Ipv4Address) -> EthernetAddress {
    let [p0, p1, p2] = DEFAULT_MAC_PREFIX;
    let a = ip.0;
    EthernetAddress([p0, p1, p2, a[1], a[2], a[3]])
}

/// The device a host runs on.
#[derive(Debug, Clone)]
pub enum Link {
    /// A TAP interface (attached, or created if it does not exist); the kernel is on its other
    /// side. With `vnet`, the vnet header carries segmentation and checksum offload.
    Tap {
        /// Interface name.
        name: String,
        /// Use the vnet header.
        vnet: bool,
    },
    /// An existing interface through an AF_PACKET socket (e.g. one end of a veth pair).
    Packet {
        /// Interface name.
        iface: String,
    },
    /// An existing interface through AF_XDP sockets (one per queue) and a built-in XDP
    /// program that redirects the interface's frames to them.
    Xdp {
        /// Interface name.
        iface: String,
        /// Queues (sockets) of a single-engine host; a per-core runtime opens one per engine.
        queues: usize,
    },
    /// The shm wire whose memfd this process inherited (made by another flowstack process).
    ShmFd(RawFd),
    /// One end of an in-process [`pipe`](flowstack_link::pipe::pipe); the caller holds (or
    /// runs a host on) the other end. Opening the spec clones the end, so a spec with a pipe
    /// opens the same cable every time.
    Pipe(PipeEnd),
}

impl fmt::Display for Link {
    /// `tap fs0`, `packet veth1`, `shm wire`, `in-process pipe`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::Tap { name, .. } => write!(f, "tap {name}"),
            Link::Packet { iface } => write!(f, "packet {iface}"),
            Link::Xdp { iface, .. } => write!(f, "xdp {iface}"),
            Link::ShmFd(_) => f.write_str("shm wire"),
            Link::Pipe(_) => f.write_str("in-process pipe"),
        }
    }
}

/// flowstack's own addresses on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrSpec {
    /// Address and prefix, e.g. 10.0.0.2/24.
    pub ip: Ipv4Cidr,
    /// Default gateway.
    pub gateway: Option<Ipv4Address>,
    /// MAC; `None` is [`default_mac`] of the address.
    pub mac: Option<EthernetAddress>,
}

impl AddrSpec {
    /// `ip` with no gateway and the default MAC.
    pub fn new(ip: Ipv4Cidr) -> Self {
        Self {
            ip,
            gateway: None,
            mac: None,
        }
    }

    /// The MAC in use: the configured one or [`default_mac`].
    pub fn mac(&self) -> EthernetAddress {
        self.mac.unwrap_or_else(|| default_mac(self.ip.addr))
    }

    /// The engine configuration for these addresses (everything else at its default).
    pub fn engine_config(&self) -> EngineConfig {
        let mut iface = IfaceConfig::new(self.mac(), self.ip);
        iface.gateway = self.gateway;
        EngineConfig::new(iface)
    }
}

/// Everything needed to put an engine on a link.
#[derive(Debug, Clone)]
pub struct LinkSpec {
    /// The device.
    pub link: Link,
    /// Capture every frame sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Fault injection on our transmit side (a no-op spec adds no middleware).
    pub impair: ImpairSpec,
    /// Seed of the impairment generator.
    pub seed: u64,
    /// Our addresses.
    pub addr: AddrSpec,
}

/// Why a link could not be opened. The messages are the ones the tools print after
/// `flowstack: `.
#[derive(Debug)]
pub enum LinkError {
    /// The TAP or AF_PACKET device could not be opened (the driver's message names it).
    Device(io::Error),
    /// The inherited shm wire could not be attached.
    Shm(io::Error),
    /// The capture file could not be created.
    Capture {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The capture file's header could not be written.
    CaptureHeader(io::Error),
    /// The link cannot be opened the way asked (e.g. several queues of a one-queue link).
    Unsupported(String),
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::Device(e) | LinkError::CaptureHeader(e) => write!(f, "{e}"),
            LinkError::Shm(e) => write!(f, "shm wire: {e}"),
            LinkError::Capture { path, source } => {
                write!(f, "cannot create {}: {source}", path.display())
            }
            LinkError::Unsupported(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for LinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LinkError::Device(e) | LinkError::Shm(e) | LinkError::CaptureHeader(e) => Some(e),
            LinkError::Capture { source, .. } => Some(source),
            LinkError::Unsupported(_) => None,
        }
    }
}

/// An opened link device and, where its driver has one, a duplicate of the descriptor that
/// becomes readable (`poll(2)` `POLLIN`) when frames wait — taken before the device is wrapped
/// in impairment or capture, so an idle engine can sleep on it instead of looking every slice
/// (`flowstack_runtime::steer::Queue::with_fd`, the offload daemon's sleep). Frames an
/// impairment delays are the device's `poll_at`, not the descriptor's.
pub struct Waitable {
    /// The device, wrapped as the spec asks.
    pub dev: Box<dyn Device + Send>,
    /// Readable when frames wait; `None` where the driver has no such descriptor (the shm
    /// wire, several AF_XDP sockets in one device).
    pub fd: Option<OwnedFd>,
}

impl fmt::Debug for Waitable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waitable")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

/// A duplicate of `d`'s descriptor (the same open file: readiness is shared).
fn dup(d: &impl AsFd) -> Result<OwnedFd, LinkError> {
    d.as_fd().try_clone_to_owned().map_err(LinkError::Device)
}

impl LinkSpec {
    /// `link` with addresses `addr`, no capture, no impairment (seed 1).
    pub fn new(link: Link, addr: AddrSpec) -> Self {
        Self {
            link,
            pcap: None,
            impair: ImpairSpec::default(),
            seed: 1,
            addr,
        }
    }

    /// Opens the device and wraps it in the middleware the spec asks for.
    pub fn open_device(&self) -> Result<Box<dyn Device>, LinkError> {
        match &self.link {
            Link::Pipe(end) => self.wrap(
                Box::new(end.clone()) as Box<dyn Device>,
                |d| Box::new(d),
                |d| Box::new(d),
            ),
            _ => self.open_device_send().map(|d| d as Box<dyn Device>),
        }
    }

    /// [`LinkSpec::open_device`] as a `Send` device, for an engine thread other than the
    /// opener's (the daemon's): every link but an in-process pipe.
    pub fn open_device_send(&self) -> Result<Box<dyn Device + Send>, LinkError> {
        self.open_device_waitable().map(|w| w.dev)
    }

    /// [`LinkSpec::open_device_send`], with the descriptor an idle engine can sleep on
    /// ([`Waitable`]) where the driver has one: a TAP, a packet socket, one AF_XDP socket.
    pub fn open_device_waitable(&self) -> Result<Waitable, LinkError> {
        let (dev, fd): (Box<dyn Device + Send>, _) = match &self.link {
            Link::Tap { name, vnet } => {
                let t = Tap::open(name, *vnet).map_err(LinkError::Device)?;
                let fd = dup(&t)?;
                (Box::new(t), Some(fd))
            }
            Link::Packet { iface } => {
                let p = PacketSocket::open(iface).map_err(LinkError::Device)?;
                let fd = dup(&p)?;
                (Box::new(p), Some(fd))
            }
            Link::Xdp { iface, queues } => {
                let mut socks =
                    XdpSocket::open_queues(iface, (*queues).max(1)).map_err(LinkError::Device)?;
                if socks.len() == 1 {
                    let x = socks.remove(0);
                    let fd = dup(&x)?;
                    (Box::new(x), Some(fd))
                } else {
                    (Box::new(XdpQueues::new(socks)), None)
                }
            }
            Link::ShmFd(fd) => (
                Box::new(ShmWire::attach(*fd, Default::default()).map_err(LinkError::Shm)?),
                None,
            ),
            Link::Pipe(_) => {
                return Err(LinkError::Unsupported(
                    "an in-process pipe stays on the thread that made it".into(),
                ))
            }
        };
        let dev = self.wrap(dev, |d| Box::new(d), |d| Box::new(d))?;
        Ok(Waitable { dev, fd })
    }

    /// Wraps `dev` in the impairment and capture the spec asks for (`imp` and `cap` box
    /// each layer as `B`).
    fn wrap<B: Device>(
        &self,
        dev: B,
        imp: fn(Impaired<B>) -> B,
        cap: fn(Pcap<B, BufWriter<File>>) -> B,
    ) -> Result<B, LinkError> {
        let dev = if self.impair.is_noop() {
            dev
        } else {
            imp(Impaired::new(dev, self.impair, self.seed))
        };
        let Some(path) = &self.pcap else {
            return Ok(dev);
        };
        let f = File::create(path).map_err(|source| LinkError::Capture {
            path: path.clone(),
            source,
        })?;
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let w = PcapWriter::new(BufWriter::new(f), epoch).map_err(LinkError::CaptureHeader)?;
        Ok(cap(Pcap::new(dev, w)))
    }

    /// Opens `n` queues of the link, one per engine of a per-core runtime: a multi-queue TAP
    /// (`IFF_MULTI_QUEUE`; the kernel steers flows by its own table), an AF_PACKET fanout
    /// group (the kernel's flow hash) or AF_XDP sockets on queues `0..n` (the NIC's RSS). The runtime's steering forwards what the kernel's hash
    /// puts on the wrong queue. Impairment applies per queue (seed + queue index). `n = 1`
    /// is [`LinkSpec::open_device`]'s device without capture.
    pub fn open_queues(&self, n: usize) -> Result<Vec<Box<dyn Device + Send>>, LinkError> {
        Ok(self
            .open_queues_waitable(n)?
            .into_iter()
            .map(|w| w.dev)
            .collect())
    }

    /// [`LinkSpec::open_queues`], each queue with the descriptor its engine can sleep on
    /// ([`Waitable`]).
    pub fn open_queues_waitable(&self, n: usize) -> Result<Vec<Waitable>, LinkError> {
        if self.pcap.is_some() && n > 1 {
            return Err(LinkError::Unsupported(
                "--pcap records one queue; use it with one core".into(),
            ));
        }
        fn boxed<D: Device + Send + AsFd + 'static>(
            devs: Vec<D>,
        ) -> Result<Vec<Waitable>, LinkError> {
            devs.into_iter()
                .map(|d| {
                    let fd = Some(dup(&d)?);
                    Ok(Waitable {
                        dev: Box::new(d),
                        fd,
                    })
                })
                .collect()
        }
        let devs = match &self.link {
            Link::Tap { name, vnet } => {
                boxed(Tap::open_queues(name, n, *vnet).map_err(LinkError::Device)?)?
            }
            Link::Packet { iface } => {
                boxed(PacketSocket::open_queues(iface, n).map_err(LinkError::Device)?)?
            }
            Link::Xdp { iface, queues } => {
                if *queues > 1 && *queues != n {
                    return Err(LinkError::Unsupported(format!(
                        "--queues {queues} with {n} cores: each engine owns one queue, give as many as cores"
                    )));
                }
                boxed(XdpSocket::open_queues(iface, n).map_err(LinkError::Device)?)?
            }
            Link::ShmFd(_) | Link::Pipe(_) => {
                return Err(LinkError::Unsupported(format!(
                    "{} has one queue; several cores need --tap, --packet or --xdp",
                    self.link
                )))
            }
        };
        Ok(devs
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                let dev = if self.impair.is_noop() {
                    w.dev
                } else {
                    Box::new(Impaired::new(w.dev, self.impair, self.seed + i as u64))
                        as Box<dyn Device + Send>
                };
                Waitable { dev, fd: w.fd }
            })
            .collect())
    }

    /// Opens the link and builds a host on it, letting `tune` adjust the engine's
    /// configuration (buffers, offloads, limits) before the engine is made.
    pub fn open(
        &self,
        tune: impl FnOnce(&mut EngineConfig),
    ) -> Result<Host<Box<dyn Device>>, LinkError> {
        let dev = self.open_device()?;
        let mut cfg = self.addr.engine_config();
        tune(&mut cfg);
        let engine = Engine::new(cfg, dev.caps());
        Ok(Host::new(engine, dev))
    }
}

/// Opens `n` AF_PACKET sockets on `iface` in one hash fanout group, calls `ready` once they
/// are open, counts the frames each receives during `window`, and returns the counts (one per
/// socket). Shows that the kernel spreads flows over the group (the interop tests use it).
pub fn fanout_counts(
    iface: &str,
    n: usize,
    window: std::time::Duration,
    ready: impl FnOnce(),
) -> Result<Vec<u64>, LinkError> {
    // TPACKET_V3: its large blocks hold thousands of small frames, so a burst is counted
    // whole even when this loop is late; its 1 ms block timeout does not matter here.
    let mut socks =
        PacketSocket::open_queues_with(iface, n, RxRing::V3).map_err(LinkError::Device)?;
    ready();
    let mut counts = vec![0u64; n];
    let end = std::time::Instant::now() + window;
    while std::time::Instant::now() < end {
        for (c, s) in counts.iter_mut().zip(socks.iter_mut()) {
            *c += s.recv_batch(Instant::ZERO, 256, &mut |_| {}) as u64;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstack_link::pipe::{pipe, DEFAULT_CAPACITY};
    use flowstack_link::DeviceCaps;

    #[test]
    fn default_mac_is_the_prefix_and_the_last_three_address_bytes() {
        let mac = default_mac(Ipv4Address::new(10, 7, 0, 2));
        assert_eq!(mac, EthernetAddress([0x02, 0x66, 0x73, 7, 0, 2]));
        let a = AddrSpec::new(Ipv4Cidr::new(Ipv4Address::new(192, 168, 1, 9), 24));
        assert_eq!(a.mac(), EthernetAddress([0x02, 0x66, 0x73, 168, 1, 9]));
    }

    #[test]
    fn links_describe_themselves_as_the_tools_print_them() {
        let (end, _) = pipe(DeviceCaps::ETHERNET, DEFAULT_CAPACITY);
        let shown: Vec<String> = [
            Link::Tap {
                name: "fs0".into(),
                vnet: true,
            },
            Link::Packet {
                iface: "veth1".into(),
            },
            Link::Xdp {
                iface: "veth2".into(),
                queues: 1,
            },
            Link::ShmFd(3),
            Link::Pipe(end),
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            shown,
            [
                "tap fs0",
                "packet veth1",
                "xdp veth2",
                "shm wire",
                "in-process pipe"
            ]
        );
    }

    #[test]
    fn a_pipe_spec_opens_a_tuned_host_with_its_addresses() {
        let (end, _peer) = pipe(DeviceCaps::ETHERNET, DEFAULT_CAPACITY);
        let mut addr = AddrSpec::new(Ipv4Cidr::new(Ipv4Address::new(10, 0, 0, 9), 24));
        addr.gateway = Some(Ipv4Address::new(10, 0, 0, 1));
        let spec = LinkSpec::new(Link::Pipe(end), addr);
        let mut tuned = false;
        let host = spec.open(|_| tuned = true).unwrap();
        assert!(tuned);
        assert_eq!(host.engine.ip(), Ipv4Address::new(10, 0, 0, 9));
    }

    #[test]
    fn an_unwritable_capture_is_a_clear_error() {
        let (end, _peer) = pipe(DeviceCaps::ETHERNET, DEFAULT_CAPACITY);
        let mut spec = LinkSpec::new(
            Link::Pipe(end),
            AddrSpec::new(Ipv4Cidr::new(Ipv4Address::new(10, 0, 0, 9), 24)),
        );
        spec.pcap = Some("/nonexistent-dir/x.pcap".into());
        let e = spec.open(|_| {}).err().expect("capture cannot be created");
        assert!(
            e.to_string()
                .starts_with("cannot create /nonexistent-dir/x.pcap: "),
            "{e}"
        );
    }
}
