//! Tests of the daemon's loopback and link engines.
use super::*;
use flowstack_wire::Duration;

/// Polls `lo` (a millisecond a turn, at most 100 turns) until engine `i`'s connection `h` is
/// open.
fn poll_until_open(lo: &mut Loopback, i: usize, h: TcpHandle) {
    let mut t = Instant::ZERO;
    for _ in 0..100 {
        lo.poll(t);
        t += Duration::from_millis(1);
        if lo.engines[i].tcp_conn(h).unwrap().is_open() {
            break;
        }
    }
}

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

/// Counts the frames a device hands over gathered (a tail referencing the sender's
/// memory) on their way to the engine.
struct Spy<'a> {
    dev: &'a mut LoDev,
    gathered: usize,
}

impl Device for Spy<'_> {
    fn caps(&self) -> DeviceCaps {
        self.dev.caps()
    }
    fn recv_batch(&mut self, n: Instant, b: usize, s: &mut dyn FnMut(&[u8])) -> usize {
        self.dev.recv_batch(n, b, s)
    }
    fn recv_batch_parts(&mut self, n: Instant, b: usize, sink: &mut PartsSink) -> usize {
        let g = &mut self.gathered;
        self.dev.recv_batch_parts(n, b, &mut |h, t, m| {
            *g += usize::from(!t.is_empty());
            sink(h, t, m)
        })
    }
    fn can_gather(&self) -> bool {
        self.dev.can_gather()
    }
    fn send_batch(&mut self, n: Instant, b: &TxBatch) -> usize {
        self.dev.send_batch(n, b)
    }
    fn send_batch_take(&mut self, n: Instant, b: &mut TxBatch) -> usize {
        self.dev.send_batch_take(n, b)
    }
    fn rx_pending(&self, n: Instant) -> bool {
        self.dev.rx_pending(n)
    }
}

/// A file sent with `send_file` over the daemon's loopback crosses gathered (the frames
/// reference its pooled chunks; the receiver copies each payload once) and arrives
/// byte-exact, odd tail included.
#[test]
fn send_file_crosses_the_loopback_gathered_and_byte_exact() {
    use std::io::Write;
    let len = (3 << 20) + 12345;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
    let path = std::env::temp_dir().join(format!("flowstack-lo-sg-{}", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let mut lo = Loopback::new(1);
    assert!(lo.devs[0].can_gather());
    let ls = lo.listen(Ipv4Addr::UNSPECIFIED, 81, 8).unwrap();
    let h = lo.engines[0]
        .tcp_connect(SocketAddrV4::new(LOOPBACK_IP, 81))
        .unwrap();
    let mut t = Instant::ZERO;
    let mut spy_gathered = 0;
    let (mut sent, mut got, mut acc) = (0usize, Vec::with_capacity(len), None);
    let mut buf = vec![0u8; 256 * 1024];
    for _ in 0..20_000 {
        let e = &mut lo.engines[0];
        if acc.is_none() {
            acc = e.tcp_accept(ls[0].1).ok();
        }
        if e.tcp_conn(h).unwrap().is_open() && sent < len {
            if let Ok(n) = e.send_file(h, &file, sent as u64, (len - sent) as u64) {
                sent += n;
            }
        }
        if let Some(a) = acc {
            while let Ok(n) = e.tcp_recv(a, &mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        }
        if got.len() == len {
            break;
        }
        let mut spy = Spy {
            dev: &mut lo.devs[0],
            gathered: 0,
        };
        lo.engines[0].poll(t, &mut spy);
        spy_gathered += spy.gathered;
        t += Duration::from_millis(1);
    }
    assert_eq!(got.len(), len, "all bytes arrived");
    assert!(got == data, "byte-exact");
    // Whole 512 KiB chunks go as zero-copy sends: most of their segments gather.
    assert!(spy_gathered >= 24, "{spy_gathered} frames gathered");
}

/// Connections on the daemon's loopback use its full MSS (one segment per 64 KiB, as
/// Linux's `lo`), both ends, from an ephemeral port and from a bound one.
#[test]
fn loopback_connections_use_the_full_mss() {
    let full = LINK_CAPS.mtu - 20 - 20;
    let mut lo = Loopback::new(1);
    let ls = lo.listen(Ipv4Addr::UNSPECIFIED, 82, 8).unwrap();
    let remote = SocketAddrV4::new(LOOPBACK_IP, 82);
    let a = lo.engines[0].tcp_connect(remote).unwrap();
    let cfg = lo.engines[0].tcp_defaults();
    let b = lo.engines[0].tcp_connect_from(40_001, remote, cfg).unwrap();
    let mut t = Instant::ZERO;
    let mut accepted = Vec::new();
    for _ in 0..100 {
        lo.poll(t);
        t += Duration::from_millis(1);
        while let Ok(c) = lo.engines[0].tcp_accept(ls[0].1) {
            accepted.push(c);
        }
        if accepted.len() == 2 {
            break;
        }
    }
    assert_eq!(accepted.len(), 2);
    for h in [a, b].into_iter().chain(accepted) {
        let c = lo.engines[0].tcp_conn(h).unwrap();
        assert!(c.is_open());
        assert_eq!(c.mss(), full);
    }
}

/// One engine reaches itself on 127.0.0.1 and on another address of the prefix.
#[test]
fn one_engine_reaches_itself() {
    for ip in [LOOPBACK_IP, Ipv4Addr::new(127, 1, 2, 3)] {
        let mut lo = Loopback::new(1);
        let ls = lo.listen(Ipv4Addr::UNSPECIFIED, 80, 8).unwrap();
        let remote = SocketAddrV4::new(ip, 80);
        let i = lo.engine_for(&remote, 0).unwrap();
        let h = lo.engines[i].tcp_connect(remote).unwrap();
        poll_until_open(&mut lo, i, h);
        assert!(lo.engines[i].tcp_conn(h).unwrap().is_open(), "{ip}");
        assert!(lo.engines[0].tcp_accept(ls[0].1).is_ok(), "{ip}");
    }
    let lo = Loopback::new(1);
    assert_eq!(
        lo.engine_for(&SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 1), 0),
        Err(SocketError::NoRoute)
    );
}

/// A link beside the loopback: routes by destination, listeners by bound address.
#[test]
fn a_link_engine_routes_its_subnet_and_listens_on_its_address() {
    let cidr = Ipv4Cidr::new(Ipv4Address::new(10, 0, 0, 2), 24);
    let mut lo = Loopback::new(1);
    lo.attach_link(
        LinkDev::One(Box::new(LoopbackDevice::default())),
        AddrSpec::new(cidr),
        None,
        None,
    );
    let at = |ip: [u8; 4]| SocketAddrV4::new(Ipv4Addr::from(ip), 80);
    assert_eq!(lo.engine_for(&at([127, 0, 0, 1]), 0), Ok(0));
    assert_eq!(lo.engine_for(&at([10, 0, 0, 9]), 0), Ok(1));
    // Our own address: the engine that carries it locally.
    assert_eq!(lo.engine_for(&at([10, 0, 0, 2]), 0), Ok(2));
    // Off the subnet without a gateway, or the subnet's broadcast: no route.
    assert_eq!(
        lo.engine_for(&at([8, 8, 8, 8]), 0),
        Err(SocketError::NoRoute)
    );
    assert_eq!(
        lo.engine_for(&at([10, 0, 0, 255]), 0),
        Err(SocketError::NoRoute)
    );
    assert!(lo.is_local(&Ipv4Addr::new(10, 0, 0, 2)));
    assert!(!lo.is_local(&Ipv4Addr::new(10, 0, 0, 3)));
    let engines = |hs: Vec<(usize, TcpHandle)>| hs.iter().map(|h| h.0).collect::<Vec<_>>();
    // Engine 2 carries connections to the link's own address.
    let any = lo.listen(Ipv4Addr::UNSPECIFIED, 80, 8).unwrap();
    assert_eq!(engines(any), vec![0, 1, 2]);
    let link = lo.listen(Ipv4Addr::new(10, 0, 0, 2), 81, 8).unwrap();
    assert_eq!(engines(link), vec![1, 2]);
    let local = lo.listen(Ipv4Addr::new(127, 0, 0, 1), 82, 8).unwrap();
    assert_eq!(engines(local), vec![0]);
    assert_eq!(
        lo.listen(Ipv4Addr::new(10, 0, 0, 3), 83, 8),
        Err(SocketError::AddrNotAvailable)
    );
    // With a gateway, everything off the loopback leaves through the link.
    let mut gw = AddrSpec::new(cidr);
    gw.gateway = Some(Ipv4Address::new(10, 0, 0, 1));
    let mut lo = Loopback::new(1);
    lo.attach_link(
        LinkDev::One(Box::new(LoopbackDevice::default())),
        gw,
        None,
        None,
    );
    assert_eq!(lo.engine_for(&at([8, 8, 8, 8]), 0), Ok(1));
    assert_eq!(lo.engine_for(&at([127, 9, 9, 9]), 0), Ok(0));
}

/// A link device that counts what it is given to send and never receives.
struct Wire(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Device for Wire {
    fn caps(&self) -> DeviceCaps {
        LINK_CAPS
    }
    fn recv_batch(&mut self, _: Instant, _: usize, _: &mut dyn FnMut(&[u8])) -> usize {
        0
    }
    fn send_batch(&mut self, _: Instant, batch: &TxBatch) -> usize {
        let n = batch.iter().count();
        self.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        n
    }
    fn rx_pending(&self, _: Instant) -> bool {
        false
    }
}

/// A connection to the link's own address is carried locally, as Linux carries a local
/// address over `lo`: it reaches a listener on the address (or on 0.0.0.0) and not one
/// frame goes out the link. Not 127/8's engine either: its tuple says the link address.
#[test]
fn a_connect_to_the_links_own_address_stays_local() {
    let own = Ipv4Addr::new(10, 0, 0, 2);
    for listen_on in [own, Ipv4Addr::UNSPECIFIED] {
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut lo = Loopback::new(1);
        let cidr = Ipv4Cidr::new(Ipv4Address::from(own), 24);
        let wire = LinkDev::One(Box::new(Wire(sent.clone())));
        lo.attach_link(wire, AddrSpec::new(cidr), None, None);
        let ls = lo.listen(listen_on, 80, 8).unwrap();
        let remote = SocketAddrV4::new(own, 80);
        let i = lo.engine_for(&remote, 0).unwrap();
        assert_eq!(i, 2, "the engine of the link's own address");
        let h = lo.engines[i].tcp_connect(remote).unwrap();
        poll_until_open(&mut lo, i, h);
        let k = lo.engines[i].tcp_conn(h).unwrap();
        let c = lo.engines[i].counters();
        let nz: Vec<_> = flowstack_api::counters::Counter::ALL
            .iter()
            .filter(|&&x| c.get(x) != 0)
            .map(|&x| (x.name(), c.get(x)))
            .collect();
        assert!(k.is_open(), "{listen_on} {:?} {nz:?}", k.state());
        assert_eq!(Ipv4Addr::from(k.tuple().local_ip), own);
        let l = ls.iter().find(|(e, _)| *e == i).expect("listens there").1;
        assert!(lo.engines[i].tcp_accept(l).is_ok(), "{listen_on}");
        assert_eq!(
            sent.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "{listen_on}"
        );
    }
}

/// With several engine threads, a connection to the link's own address is carried between
/// the threads' own-address engines over their mesh, routed by port as on 127/8: a listener
/// on the other thread or on the same one, bound to the address or to 0.0.0.0, is reached;
/// bytes cross both ways and not one frame goes out the link.
#[test]
fn several_engine_threads_reach_the_links_own_address() {
    use crate::ports::BindOpts;
    use flowstack_runtime::xring::{Mesh, RingSpec};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let own = Ipv4Addr::new(10, 0, 0, 2);
    let cidr = Ipv4Cidr::new(Ipv4Address::from(own), 24);
    let ports = Arc::new(PortTable::new(crate::app::EPHEMERAL, 2));
    let spec = RingSpec::default();
    let lo_mesh = Mesh::new("lo-own-test", spec, vec![None, None]).unwrap();
    let own_mesh = Mesh::with_doorbells("own-test", spec, lo_mesh.doorbells()).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut los: Vec<Loopback> = lo_mesh
        .into_ports()
        .into_iter()
        .zip(own_mesh.into_ports())
        .enumerate()
        .map(|(i, (p, o))| {
            let mut lo = Loopback::routed(i, p, ports.clone());
            let wire = LinkDev::One(Box::new(Wire(sent.clone())));
            let slice = Some(ports.connect_slice(i));
            lo.attach_link(wire, AddrSpec::new(cidr), slice, Some((o, ports.clone())));
            lo
        })
        .collect();
    let mut t = Instant::ZERO;
    let cases = [
        (1, 0, own),
        (1, 0, Ipv4Addr::UNSPECIFIED),
        (0, 0, own),
        (0, 1, own),
    ];
    for (k, (server, client, listen_on)) in cases.into_iter().enumerate() {
        let port = 8000 + k as u16;
        ports
            .bind(server, k as u32 + 1, listen_on, port, BindOpts::default())
            .unwrap();
        let ls = los[server].listen(listen_on, port, 8).unwrap();
        let remote = SocketAddrV4::new(own, port);
        let i = los[client].engine_for(&remote, 0).unwrap();
        assert_eq!(i, 2, "the engine of the link's own address");
        let h = los[client].engines[i].tcp_connect(remote).unwrap();
        let l = ls.iter().find(|(e, _)| *e == 2).expect("listens there").1;
        let mut acc = None;
        for _ in 0..200 {
            for lo in los.iter_mut() {
                lo.poll(t);
            }
            t += Duration::from_millis(1);
            acc = acc.or_else(|| los[server].engines[2].tcp_accept(l).ok());
            if acc.is_some() && los[client].engines[i].tcp_conn(h).unwrap().is_open() {
                break;
            }
        }
        let a = acc.unwrap_or_else(|| panic!("case {k}: not accepted"));
        let c = los[client].engines[i].tcp_conn(h).unwrap();
        assert_eq!(Ipv4Addr::from(c.tuple().local_ip), own, "case {k}");
        let (lp, sp) = (
            c.tuple().local_port,
            los[server].engines[2].tcp_conn(a).unwrap().tuple(),
        );
        assert_eq!((sp.remote_port, sp.local_port), (lp, port), "case {k}");
        // Bytes both ways.
        los[client].engines[i].tcp_send(h, b"ping").unwrap();
        los[server].engines[2].tcp_send(a, b"pong").unwrap();
        let (mut got_s, mut got_c) = (Vec::new(), Vec::new());
        let mut buf = [0u8; 16];
        for _ in 0..200 {
            for lo in los.iter_mut() {
                lo.poll(t);
            }
            t += Duration::from_millis(1);
            if let Ok(n) = los[server].engines[2].tcp_recv(a, &mut buf) {
                got_s.extend_from_slice(&buf[..n]);
            }
            if let Ok(n) = los[client].engines[i].tcp_recv(h, &mut buf) {
                got_c.extend_from_slice(&buf[..n]);
            }
            if got_s.len() == 4 && got_c.len() == 4 {
                break;
            }
        }
        assert_eq!(
            (&got_s[..], &got_c[..]),
            (&b"ping"[..], &b"pong"[..]),
            "case {k}"
        );
    }
    assert_eq!(sent.load(Ordering::Relaxed), 0, "nothing out the link");
    // Cases across threads crossed the own-address mesh.
    let forwarded: u64 = los.iter().map(|lo| lo.mesh_counters().1).sum();
    assert!(forwarded > 0, "frames crossed between the threads");
}
