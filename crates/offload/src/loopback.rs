//! The daemon's own interface on 127.0.0.0/8: no privileges, no kernel.
//!
//! [`LoopbackDevice`] is the device a loopback interface wants: every frame transmitted comes
//! back as a received frame. Each engine is configured as a loopback interface
//! (`IfaceConfig::loopback`): it owns the whole prefix, so a connection from 127.0.0.1:x to
//! 127.0.0.1:y (or any 127/8 address) stays inside one engine, as on Linux's `lo`.
//!
//! [`Loopback`] holds one engine per daemon core (one today); a connection lives on the
//! engine of the application that opened it, and every listener listens on every engine, so
//! any engine's connections reach every listener.

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

/// The loopback interface's own address (the prefix is 127.0.0.0/8).
pub const LOOPBACK_IP: Ipv4Addr = Ipv4Addr::LOCALHOST;

fn engine(i: usize) -> Engine {
    let mac = EthernetAddress([0x02, 0x66, 0x73, 0x7f, 0, 1 + i as u8]);
    let cfg = EngineConfig::new(IfaceConfig::loopback(
        mac,
        Ipv4Cidr::new(Ipv4Address::from(LOOPBACK_IP), 8),
    ));
    Engine::new(cfg, LINK_CAPS)
}

/// True if `ip` is on the daemon's loopback (127.0.0.0/8).
pub fn is_loopback(ip: &Ipv4Addr) -> bool {
    ip.octets()[0] == 127
}

/// The daemon's 127.0.0.0/8: one loopback engine per core, each with its own device.
pub struct Loopback {
    /// The engines; a connection lives on one of them.
    pub engines: Vec<Engine>,
    devs: Vec<LoopbackDevice>,
}

impl Default for Loopback {
    fn default() -> Self {
        Self::new(1)
    }
}

impl Loopback {
    /// Builds `n` (at least one) loopback engines.
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        Self {
            engines: (0..n).map(engine).collect(),
            devs: (0..n).map(|_| LoopbackDevice::default()).collect(),
        }
    }

    /// One turn of every engine; true if frames moved.
    pub fn poll(&mut self, now: Instant) -> bool {
        let mut moved = false;
        // Twice, so frames an engine sent to itself are taken in the same turn.
        for _ in 0..2 {
            for (e, d) in self.engines.iter_mut().zip(self.devs.iter_mut()) {
                moved |= e.poll(now, d);
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

    /// The earliest deadline of any engine.
    pub fn poll_at(&self) -> Option<Instant> {
        self.engines.iter().filter_map(|e| e.poll_at()).min()
    }

    /// The engine a connection to `remote` is opened from: `home` (the connecting
    /// application's engine) if the destination is on the loopback.
    pub fn engine_for(&self, remote: &SocketAddrV4, home: usize) -> Result<usize, SocketError> {
        if is_loopback(remote.ip()) && !remote.ip().is_broadcast() {
            Ok(home % self.engines.len())
        } else {
            Err(SocketError::NoRoute)
        }
    }

    /// Listens on `port` on every engine (all or nothing).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<Vec<TcpHandle>, SocketError> {
        let mut hs = Vec::with_capacity(self.engines.len());
        for i in 0..self.engines.len() {
            match self.engines[i].tcp_listen(port, backlog) {
                Ok(h) => hs.push(h),
                Err(e) => {
                    for (j, h) in hs.into_iter().enumerate() {
                        let _ = self.engines[j].tcp_close(h);
                    }
                    return Err(e);
                }
            }
        }
        Ok(hs)
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

    /// One engine reaches itself on 127.0.0.1 and on another address of the prefix.
    #[test]
    fn one_engine_reaches_itself() {
        for ip in [LOOPBACK_IP, Ipv4Addr::new(127, 1, 2, 3)] {
            let mut lo = Loopback::new(1);
            let ls = lo.listen(80, 8).unwrap();
            let remote = SocketAddrV4::new(ip, 80);
            let i = lo.engine_for(&remote, 0).unwrap();
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
            assert!(lo.engines[0].tcp_accept(ls[0]).is_ok(), "{ip}");
        }
        let lo = Loopback::new(1);
        assert_eq!(
            lo.engine_for(&SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 1), 0),
            Err(SocketError::NoRoute)
        );
    }
}
