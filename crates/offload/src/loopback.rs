//! The daemon's own interface on 127.0.0.0/8: no privileges, no kernel.
//!
//! [`LoopbackDevice`] is the device a loopback interface wants: every frame transmitted comes
//! back as a received frame. An engine on it cannot talk to itself today, though: the
//! engine's router (`Iface::route` in `flowstack-stack`) refuses a destination equal to its
//! own address (`NoRoute`), and its input accepts only its own address, not the whole
//! 127.0.0.0/8 (see `engine_cannot_reach_itself` below, which pins this down).
//!
//! **First-slice limitation**: [`Loopback`] therefore runs two engines, 127.0.0.1 and
//! 127.0.0.2, joined by an in-process pipe. Every listener listens on both engines; a
//! connection to 127.0.0.1 is opened from the 127.0.0.2 engine and vice versa, so either
//! address reaches every listener. The engine change that would make one engine enough: a
//! loopback flag in `IfaceConfig` under which `route` sends a datagram for any address of
//! the prefix to our own MAC (no ARP) and `accepts` takes the whole prefix.

use flowstack_link::pipe::{pipe, PipeEnd};
use flowstack_link::{Device, DeviceCaps, TxBatch};
use flowstack_stack::{Engine, EngineConfig, IfaceConfig, SocketError, TcpHandle};
use flowstack_wire::{ChecksumCaps, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};

/// A device whose transmitted frames are received back (a loopback interface).
#[derive(Debug, Default)]
pub struct LoopbackDevice {
    frames: VecDeque<Vec<u8>>,
    pool: Vec<Vec<u8>>,
}

/// Frames a loopback device holds at most (more are dropped, as a full ring would).
pub const LOOPBACK_CAPACITY: usize = 4096;

impl Device for LoopbackDevice {
    fn caps(&self) -> DeviceCaps {
        LINK_CAPS
    }
    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(f) = self.frames.pop_front() else {
                break;
            };
            sink(&f);
            self.pool.push(f);
            n += 1;
        }
        n
    }
    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let mut sent = 0;
        for f in batch.iter() {
            if self.frames.len() >= LOOPBACK_CAPACITY {
                continue;
            }
            let mut b = self.pool.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(f);
            self.frames.push_back(b);
            sent += 1;
        }
        sent
    }
    fn rx_pending(&self, _now: Instant) -> bool {
        !self.frames.is_empty()
    }
}

/// The loopback link: a trusted in-memory path, so checksums are skipped as Linux loopback
/// does, with a 64 KiB MTU.
pub const LINK_CAPS: DeviceCaps = DeviceCaps {
    mtu: 65535 - 14,
    checksum: ChecksumCaps {
        verify_rx: false,
        fill_tx: false,
    },
    max_tx_datagram: 65535 - 14,
    queues: 1,
};

/// Address of engine `i` (0 → 127.0.0.1, 1 → 127.0.0.2).
pub fn engine_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 1 + i as u8)
}

fn engine(i: usize) -> Engine {
    let mac = EthernetAddress([0x02, 0x66, 0x73, 0x7f, 0, 1 + i as u8]);
    let ip = engine_ip(i);
    let cfg = EngineConfig::new(IfaceConfig::new(
        mac,
        Ipv4Cidr::new(Ipv4Address::from(ip), 8),
    ));
    Engine::new(cfg, LINK_CAPS)
}

/// Two engines (127.0.0.1 and 127.0.0.2) joined by a pipe: the daemon's 127.0.0.0/8.
pub struct Loopback {
    /// The engines; a connection lives on one of them.
    pub engines: [Engine; 2],
    ends: [PipeEnd; 2],
}

impl Default for Loopback {
    fn default() -> Self {
        Self::new()
    }
}

impl Loopback {
    /// Builds both engines and their cable.
    pub fn new() -> Self {
        let (a, b) = pipe(LINK_CAPS, flowstack_link::pipe::DEFAULT_CAPACITY);
        Self {
            engines: [engine(0), engine(1)],
            ends: [a, b],
        }
    }

    /// One turn of both engines; true if frames moved.
    pub fn poll(&mut self, now: Instant) -> bool {
        let mut moved = false;
        // Twice, so frames one engine sent are taken by the other in the same turn.
        for _ in 0..2 {
            for i in 0..2 {
                moved |= self.engines[i].poll(now, &mut self.ends[i]);
            }
        }
        moved
    }

    /// Stamps socket calls made before the next poll.
    pub fn set_now(&mut self, now: Instant) {
        for e in &mut self.engines {
            e.set_now(now);
        }
    }

    /// The earliest deadline of either engine.
    pub fn poll_at(&self) -> Option<Instant> {
        self.engines.iter().filter_map(|e| e.poll_at()).min()
    }

    /// The engine a connection to `remote` is opened from: the other one of the pair.
    pub fn engine_for(remote: &SocketAddrV4) -> Result<usize, SocketError> {
        match remote.ip().octets() {
            [127, 0, 0, 1] => Ok(1),
            [127, 0, 0, 2] => Ok(0),
            _ => Err(SocketError::NoRoute),
        }
    }

    /// Listens on `port` on both engines (all or nothing).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<[TcpHandle; 2], SocketError> {
        let a = self.engines[0].tcp_listen(port, backlog)?;
        match self.engines[1].tcp_listen(port, backlog) {
            Ok(b) => Ok([a, b]),
            Err(e) => {
                let _ = self.engines[0].tcp_close(a);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstack_wire::Duration;

    #[test]
    fn loopback_device_returns_what_it_sends() {
        let mut d = LoopbackDevice::default();
        let mut b = TxBatch::new();
        b.push(20)[0] = 7;
        assert_eq!(d.send_batch(Instant::ZERO, &b), 1);
        let mut got = vec![];
        d.recv_batch(Instant::ZERO, 8, &mut |f| got.push(f[0]));
        assert_eq!(got, vec![7]);
    }

    /// Documents the engine change a one-engine loopback needs: today an engine refuses to
    /// route to its own address.
    #[test]
    fn engine_cannot_reach_itself() {
        let mut e = engine(0);
        let mut dev = LoopbackDevice::default();
        let l = e.tcp_listen(7, 8).unwrap();
        let r = e.tcp_connect(SocketAddrV4::new(engine_ip(0), 7));
        let mut t = Instant::ZERO;
        for _ in 0..50 {
            e.poll(t, &mut dev);
            t += Duration::from_millis(10);
        }
        let refused = match r {
            Err(_) => true,
            Ok(h) => e.tcp_error(h).is_some() || !e.tcp_conn(h).unwrap().is_open(),
        };
        assert!(
            refused,
            "an engine reached its own address: collapse Loopback to one engine"
        );
        assert!(e.tcp_accept(l).is_err());
    }

    #[test]
    fn two_engines_reach_each_other_both_ways() {
        let mut lo = Loopback::new();
        let [_, _] = lo.listen(80, 8).unwrap();
        for ip in [engine_ip(0), engine_ip(1)] {
            let remote = SocketAddrV4::new(ip, 80);
            let i = Loopback::engine_for(&remote).unwrap();
            let h = lo.engines[i].tcp_connect(remote).unwrap();
            let mut t = Instant::ZERO;
            for _ in 0..100 {
                lo.poll(t);
                t += Duration::from_millis(1);
                if lo.engines[i].tcp_conn(h).unwrap().is_open() {
                    break;
                }
            }
            assert!(lo.engines[i].tcp_conn(h).unwrap().is_open(), "{ip}");
        }
        assert_eq!(
            Loopback::engine_for(&SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 1)),
            Err(SocketError::NoRoute)
        );
    }
}
