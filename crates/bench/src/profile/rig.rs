//! What the profiler measures on: a connected TCP pair and the three steps of seed 000's
//! experiment — send one segment, process its ACK, receive one segment (and ACK it).
//!
//! [`SimRig`] is two flowstack engines on the in-process link (both sides probed, one at a
//! time). [`LinkRig`] is one flowstack engine on a real link (TAP or AF_PACKET) talking to a
//! kernel socket of this process on the link's other side: the kernel acknowledges what
//! flowstack sends and sends what flowstack receives.

use flowstack_link::Device;
pub use flowstack_prof::report::Step;
use flowstack_runtime::Host;
use flowstack_stack::netsim::{Net, NetConfig, B_IP};
use flowstack_stack::{Counter, EngineConfig, TcpHandle};
use flowstack_wire::{Duration, Ipv4Address};
use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};

/// Opens the real link a [`LinkRig`] runs on and builds its host, letting the given function
/// tune the engine's configuration (the rig passes [`tune`]).
pub type OpenLink = dyn Fn(fn(&mut EngineConfig)) -> Result<Host<Box<dyn Device>>, String>;

/// A connected pair the three steps run on.
pub trait Rig {
    /// Unmeasured work that makes `step` possible (the peer acknowledges, or sends).
    /// False if the step cannot run this time (e.g. the peer's ACK did not come in time).
    fn prepare(&mut self, step: Step) -> bool;
    /// The measured work of `step`. False if it did not do what it should (the sample is
    /// then not used).
    fn run(&mut self, step: Step) -> bool;
    /// Unmeasured clean-up after the receive step.
    fn finish(&mut self);
    /// Segments the receiver took through header prediction's fast path so far.
    fn fast_path_hits(&self) -> u64;
    /// True if samples must be checked for disturbance one by one (the rig makes blocking
    /// system calls between steps), not once per iteration.
    fn blocks(&self) -> bool;
}

/// Engine settings for the experiment: one ACK per segment, no Nagle.
pub fn tune(c: &mut EngineConfig) {
    c.tcp.defaults.delayed_ack = false;
    c.tcp.defaults.nodelay = true;
}

/// Two flowstack engines on the in-process link; A sends, B receives.
pub struct SimRig {
    net: Net,
    c: TcpHandle,
    s: TcpHandle,
    data: Vec<u8>,
    buf: Vec<u8>,
}

impl SimRig {
    /// A connected pair exchanging `size`-byte segments.
    pub fn new(size: usize) -> Result<Self, String> {
        let mut net = Net::new(
            NetConfig {
                tune,
                ..Default::default()
            },
            None,
        )
        .map_err(|e| format!("in-process link: {e}"))?;
        let l = net.b.tcp_listen(9, 4).map_err(|e| e.to_string())?;
        net.stamp();
        let c = net
            .a
            .tcp_connect(SocketAddrV4::new(B_IP.into(), 9))
            .map_err(|e| e.to_string())?;
        let mut s = None;
        net.run_until(Duration::from_secs(5), |n| {
            s = s.or_else(|| n.b.tcp_accept(l).ok());
            s.is_some() && n.a.tcp_conn(c).map(|k| k.is_open()).unwrap_or(false)
        });
        let s = s.ok_or("in-process connection did not open")?;
        Ok(Self {
            net,
            c,
            s,
            data: vec![0x5a; size],
            buf: vec![0; 4096],
        })
    }

    fn drain_b(&mut self) {
        while matches!(self.net.b.tcp_recv(self.s, &mut self.buf), Ok(n) if n > 0) {}
    }
}

impl Rig for SimRig {
    fn prepare(&mut self, step: Step) -> bool {
        match step {
            Step::Send => self.net.now += Duration::from_micros(20),
            Step::Ack => {
                self.net.poll_b();
            }
            Step::Receive => {
                self.drain_b();
                let _ = self.net.a.tcp_send(self.c, &self.data);
                self.net.poll_a();
            }
        }
        true
    }

    fn run(&mut self, step: Step) -> bool {
        match step {
            Step::Send => {
                let sent = self.net.a.tcp_send(self.c, &self.data);
                self.net.poll_a();
                sent.is_ok()
            }
            Step::Ack => {
                self.net.poll_a();
                true
            }
            Step::Receive => {
                self.net.poll_b();
                self.drain_b();
                true
            }
        }
    }

    fn finish(&mut self) {
        self.net.poll_a();
    }

    fn fast_path_hits(&self) -> u64 {
        self.net.b.counters().get(Counter::TcpExtTCPHPHits)
    }

    fn blocks(&self) -> bool {
        false
    }
}

/// How long the rig waits for the kernel's ACK or segment before giving the sample up.
const PEER_WAIT: Duration = Duration::from_millis(200);

/// One flowstack engine on a real link and a kernel socket on the other side.
pub struct LinkRig {
    host: Host<Box<dyn Device>>,
    conn: TcpHandle,
    kernel: TcpStream,
    data: Vec<u8>,
    buf: Vec<u8>,
}

impl LinkRig {
    /// Opens the link, listens on the kernel at `peer` (an address of this host on the
    /// link's other side), connects flowstack to it.
    pub fn new(open: &OpenLink, peer: Ipv4Address, size: usize) -> Result<Self, String> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::from(peer.0), 0)).map_err(|e| {
            format!("cannot listen on the kernel at {peer} (it must be an address of this host on the link's other side): {e}")
        })?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let mut host = open(tune)?;
        let conn = host
            .connect(
                SocketAddrV4::new(peer.0.into(), port),
                Duration::from_secs(5),
            )
            .map_err(|e| format!("cannot connect to the kernel at {peer}:{port}: {e}"))?;
        let (kernel, _) = listener.accept().map_err(|e| e.to_string())?;
        kernel.set_nodelay(true).map_err(|e| e.to_string())?;
        kernel.set_nonblocking(true).map_err(|e| e.to_string())?;
        let rig = Self {
            host,
            conn,
            kernel,
            data: vec![0x5a; size],
            buf: vec![0; 64 << 10],
        };
        rig.quickack();
        Ok(rig)
    }

    /// Asks the kernel to acknowledge the next segments at once (no delayed ACK).
    fn quickack(&self) {
        let _ = flowstack_link::sys::tcp_quickack(&self.kernel);
    }

    fn drain_kernel(&mut self) {
        while matches!(self.kernel.read(&mut self.buf), Ok(n) if n > 0) {}
        self.quickack();
    }

    fn drain_flowstack(&mut self) -> usize {
        let mut got = 0;
        while let Ok(n) = self.host.engine.tcp_recv(self.conn, &mut self.buf) {
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    }
}

impl Rig for LinkRig {
    fn prepare(&mut self, step: Step) -> bool {
        match step {
            Step::Send => {
                // Linux leaves quick-ACK mode once it sends data itself (the receive step):
                // ask again before each segment it must acknowledge at once.
                self.quickack();
                true
            }
            Step::Ack => {
                // The kernel holds a lone segment's ACK back (delayed ACK) until its
                // application reads: read it, then TCP_QUICKACK pushes the ACK out at once.
                let t = std::time::Instant::now();
                let mut got = 0;
                while got < self.data.len() && t.elapsed() < PEER_WAIT {
                    match self.kernel.read(&mut self.buf) {
                        Ok(0) => return false,
                        Ok(n) => got += n,
                        Err(_) => std::hint::spin_loop(),
                    }
                }
                self.quickack();
                self.host.dev.wait(PEER_WAIT);
                got == self.data.len()
            }
            Step::Receive => {
                self.drain_kernel();
                if self.kernel.write_all(&self.data).is_err() {
                    return false;
                }
                self.host.dev.wait(PEER_WAIT);
                true
            }
        }
    }

    fn run(&mut self, step: Step) -> bool {
        match step {
            Step::Send => {
                let sent = self.host.engine.tcp_send(self.conn, &self.data);
                self.host.turn() && sent.is_ok()
            }
            Step::Ack => self.host.turn(),
            Step::Receive => {
                let moved = self.host.turn();
                moved && self.drain_flowstack() > 0
            }
        }
    }

    fn finish(&mut self) {
        // Anything that arrived late (a delayed ACK, the rest of a segment) is taken in
        // here, unmeasured, so the next iteration starts from a quiet link.
        self.host.turn();
        self.drain_flowstack();
    }

    fn fast_path_hits(&self) -> u64 {
        self.host.engine.counters().get(Counter::TcpExtTCPHPHits)
    }

    fn blocks(&self) -> bool {
        true
    }
}
