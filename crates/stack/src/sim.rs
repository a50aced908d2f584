//! Deterministic network simulation: engines over an in-process link with seeded fault
//! injection and a virtual clock. A failing seed reproduces exactly.
//!
//! Virtual time advances by `step_cost` for every turn in which frames moved, and jumps to the
//! next deadline (timer or delayed frame) when nothing did.

use crate::{Engine, EngineConfig, IfaceConfig};
use flowstack_link::impair::{ImpairSpec, Impaired};
use flowstack_link::pcap::{Pcap, PcapWriter};
use flowstack_link::pipe::{pipe, DEFAULT_CAPACITY};
use flowstack_link::{Device, DeviceCaps};
use flowstack_wire::{Duration, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr};
use std::cell::RefCell;
use std::io::{self, Write};
use std::rc::Rc;

/// A writer that several owners can share (the capture and whoever finishes it).
#[derive(Clone)]
pub struct SharedWriter(pub Rc<RefCell<Box<dyn Write>>>);

impl Write for SharedWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

/// Address of host A in simulations.
pub const A_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
/// Address of host B in simulations.
pub const B_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

/// Two engines, A and B, on a virtual cable.
pub struct Net {
    /// Host A (10.0.0.1).
    pub a: Engine,
    /// Host B (10.0.0.2).
    pub b: Engine,
    dev_a: Box<dyn Device>,
    dev_b: Box<dyn Device>,
    /// The virtual clock.
    pub now: Instant,
    /// Virtual time charged per productive turn.
    pub step_cost: Duration,
    pcap: Option<SharedWriter>,
}

/// How to build a [`Net`].
#[derive(Clone)]
pub struct NetConfig {
    /// Impairment applied to each direction.
    pub impair: ImpairSpec,
    /// Seed for the impairment RNGs (A→B uses `seed`, B→A `seed + 1`).
    pub seed: u64,
    /// Link capabilities.
    pub caps: DeviceCaps,
    /// Frames per direction the cable holds.
    pub capacity: usize,
    /// Adjusts each engine's configuration before it is built.
    pub tune: fn(&mut EngineConfig),
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            impair: ImpairSpec::default(),
            seed: 0,
            caps: DeviceCaps::ETHERNET,
            capacity: DEFAULT_CAPACITY,
            tune: |_| {},
        }
    }
}

fn engine_cfg(ip: Ipv4Address, last: u8, tune: fn(&mut EngineConfig)) -> EngineConfig {
    let mac = EthernetAddress([0x02, 0, 0, 0, 0, last]);
    let mut cfg = EngineConfig::new(IfaceConfig::new(mac, Ipv4Cidr::new(ip, 24)));
    tune(&mut cfg);
    cfg
}

impl Net {
    /// Builds the pair; with `pcap`, A's traffic in both directions is captured there.
    pub fn new(cfg: NetConfig, pcap: Option<Box<dyn Write>>) -> io::Result<Self> {
        let (pa, pb) = pipe(cfg.caps, cfg.capacity);
        let ia = Impaired::new(pa, cfg.impair, cfg.seed);
        let ib = Impaired::new(pb, cfg.impair, cfg.seed.wrapping_add(1));
        let (dev_a, shared): (Box<dyn Device>, _) = match pcap {
            Some(w) => {
                let shared = SharedWriter(Rc::new(RefCell::new(w)));
                let epoch = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                let writer = PcapWriter::new(shared.clone(), epoch)?;
                (Box::new(Pcap::new(ia, writer)), Some(shared))
            }
            None => (Box::new(ia), None),
        };
        Ok(Self {
            a: Engine::new(engine_cfg(A_IP, 1, cfg.tune), cfg.caps),
            b: Engine::new(engine_cfg(B_IP, 2, cfg.tune), cfg.caps),
            dev_a,
            dev_b: Box::new(ib),
            now: Instant::from_millis(1),
            step_cost: Duration::from_micros(5),
            pcap: shared,
        })
    }

    /// One turn of both engines at the current time. Returns true if frames moved.
    pub fn turn(&mut self) -> bool {
        let x = self.a.poll(self.now, &mut self.dev_a);
        let y = self.b.poll(self.now, &mut self.dev_b);
        x || y
    }

    /// The next instant at which anything is scheduled.
    pub fn next_deadline(&self) -> Option<Instant> {
        [
            self.a.poll_at(),
            self.b.poll_at(),
            self.dev_a.poll_at(),
            self.dev_b.poll_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Advances the simulation until `done` holds or virtual time passes `limit` (relative to
    /// now). Returns whether `done` held. `done` may act on the engines (send, receive).
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Net) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if self.now >= end {
                return false;
            }
            if self.turn() {
                self.now += self.step_cost;
                continue;
            }
            // Idle: give the application one more look, then jump to the next deadline.
            if done(self) {
                return true;
            }
            match self.next_deadline() {
                Some(t) if t > self.now => self.now = t.min(end),
                Some(_) => self.now += self.step_cost,
                None => self.now = end,
            }
        }
    }

    /// Flushes the capture, if any.
    pub fn finish_pcap(&mut self) -> io::Result<()> {
        if let Some(w) = &mut self.pcap {
            w.flush()?;
        }
        Ok(())
    }
}
