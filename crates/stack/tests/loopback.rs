//! A loopback interface (`IfaceConfig::loopback`): one engine owns all of 127.0.0.0/8 and
//! reaches itself, as Linux's `lo` does.

use flowstack_link::{Device, DeviceCaps, TxBatch};
use flowstack_stack::{Engine, EngineConfig, IfaceConfig, SocketError};
use flowstack_wire::{ChecksumCaps, Duration, EthernetAddress, Instant, Ipv4Address};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};

/// Every frame sent is received back.
#[derive(Default)]
struct Lo(VecDeque<Vec<u8>>);

const CAPS: DeviceCaps = DeviceCaps {
    mtu: 65535 - 14,
    checksum: ChecksumCaps {
        verify_rx: false,
        fill_tx: false,
    },
    max_tx_datagram: 65535 - 14,
    queues: 1,
};

impl Device for Lo {
    fn caps(&self) -> DeviceCaps {
        CAPS
    }
    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(f) = self.0.pop_front() else { break };
            sink(&f);
            n += 1;
        }
        n
    }
    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        for f in batch.iter() {
            self.0.push_back(f.to_vec());
        }
        batch.iter().count()
    }
    fn rx_pending(&self, _now: Instant) -> bool {
        !self.0.is_empty()
    }
}

fn engine(loopback: bool) -> Engine {
    let mac = EthernetAddress([2, 0x66, 0x73, 0x7f, 0, 1]);
    let addr = "127.0.0.1/8".parse().unwrap();
    let iface = if loopback {
        IfaceConfig::loopback(mac, addr)
    } else {
        IfaceConfig::new(mac, addr)
    };
    Engine::new(EngineConfig::new(iface), CAPS)
}

fn run(e: &mut Engine, dev: &mut Lo, t: &mut Instant, turns: usize) {
    for _ in 0..turns {
        e.poll(*t, dev);
        *t += Duration::from_millis(1);
    }
}

/// A connection between two ports of one engine, byte-exact both ways, for 127.0.0.1 and for
/// another address of the prefix (whose replies come from that address).
#[test]
fn one_loopback_engine_connects_to_itself_byte_exact() {
    for dst in [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 3, 2, 1)] {
        let mut e = engine(true);
        let mut dev = Lo::default();
        let mut t = Instant::ZERO;
        let l = e.tcp_listen(8080, 8).unwrap();
        let c = e.tcp_connect(SocketAddrV4::new(dst, 8080)).unwrap();
        run(&mut e, &mut dev, &mut t, 10);
        let s = e.tcp_accept(l).unwrap_or_else(|err| {
            let c: Vec<_> = e.counters().nonzero().collect();
            panic!("{dst}: no connection accepted ({err:?}); counters {c:?}")
        });
        assert!(e.tcp_conn(c).unwrap().is_open(), "{dst}");
        assert_eq!(
            e.tcp_conn(s).unwrap().tuple().local_ip,
            Ipv4Address::from(dst)
        );
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (mut sent, mut got, mut back) = (0, Vec::new(), Vec::new());
        let mut buf = vec![0u8; 65536];
        for _ in 0..10_000 {
            if sent < data.len() {
                sent += e.tcp_send(c, &data[sent..]).unwrap_or(0);
            }
            run(&mut e, &mut dev, &mut t, 1);
            while let Ok(n @ 1..) = e.tcp_recv(s, &mut buf) {
                got.extend_from_slice(&buf[..n]);
                // Echo it back.
                assert_eq!(e.tcp_send(s, &buf[..n]).unwrap_or(0), n);
            }
            while let Ok(n @ 1..) = e.tcp_recv(c, &mut buf) {
                back.extend_from_slice(&buf[..n]);
            }
            if back.len() == data.len() {
                break;
            }
        }
        assert!(
            got == data,
            "server got {} of {} bytes",
            got.len(),
            data.len()
        );
        assert!(back == data, "client got {} echoed bytes", back.len());
    }
}

/// Without the flag an engine refuses to route to its own address (an ordinary interface).
#[test]
fn without_the_flag_an_engine_cannot_reach_itself() {
    let mut e = engine(false);
    let mut dev = Lo::default();
    let mut t = Instant::ZERO;
    let l = e.tcp_listen(7, 8).unwrap();
    let r = e.tcp_connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7));
    run(&mut e, &mut dev, &mut t, 50);
    assert!(matches!(e.tcp_accept(l), Err(SocketError::WouldBlock)));
    if let Ok(h) = r {
        assert!(!e.tcp_conn(h).map(|c| c.is_open()).unwrap_or(false));
    }
}
