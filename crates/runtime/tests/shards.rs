//! Per-core shards: steering (every frame to the shard owning its flow, forwarded over the
//! cross-shard rings when it arrives on another queue; ARP requests to shard 0, replies to
//! all; full rings counted), waking a sleeping shard when a peer forwards to it, starting
//! and failing to start, and TCP echo end to end over a 2-shard runtime on an in-process
//! multi-queue NIC — with flowstack's hash and with a hash that is not flowstack's.
//!
//! Every loop is bounded; the steering tests run on one thread and are deterministic.

use flowstack_api::app::{App, Progress};
use flowstack_api::{SocketError, TcpHandle};
use flowstack_apps::serve::{ServeSpec, Server, Service};
use flowstack_link::{Device, DeviceCaps, TxBatch};
use flowstack_runtime::nic::{nic, NicPort, NicQueue};
use flowstack_runtime::shard::{Placement, Runtime, RuntimeSpec, ShardInfo, StartError};
use flowstack_runtime::steer::{Owner, Queue, SteerCounters, Steered, Steering};
use flowstack_runtime::xring::RingSpec;
use flowstack_runtime::Host;
use flowstack_stack::{Counter, Engine, EngineConfig, IfaceConfig};
use flowstack_wire::rss::{Toeplitz, MICROSOFT_KEY};
use flowstack_wire::{Duration, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddrV4;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::time::Instant as WallClock;

// ---- frames ---------------------------------------------------------------------------------

const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;

fn ip(s: &str) -> Ipv4Address {
    s.parse().unwrap()
}

/// An Ethernet/IPv4 frame with 8 bytes of L4 header (ports first) and a 4-byte tag after it.
/// `more_frags` makes it a first fragment (hashed by addresses only).
fn ipv4_frame(
    src: Ipv4Address,
    dst: Ipv4Address,
    proto: u8,
    ports: (u16, u16),
    more_frags: bool,
    tag: u32,
) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8 + 4];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ipl = f.len() - 14;
    let h = &mut f[14..34];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&(ipl as u16).to_be_bytes());
    h[6] = if more_frags { 0x20 } else { 0x40 };
    h[8] = 64;
    h[9] = proto;
    h[12..16].copy_from_slice(&src.0);
    h[16..20].copy_from_slice(&dst.0);
    f[34..36].copy_from_slice(&ports.0.to_be_bytes());
    f[36..38].copy_from_slice(&ports.1.to_be_bytes());
    f[42..46].copy_from_slice(&tag.to_be_bytes());
    f
}

fn arp_frame(request: bool, tag: u8) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 28];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, tag]);
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    let a = &mut f[14..];
    a[0..2].copy_from_slice(&1u16.to_be_bytes());
    a[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
    a[4] = 6;
    a[5] = 4;
    a[6..8].copy_from_slice(&(if request { 1u16 } else { 2 }).to_be_bytes());
    a[8..14].copy_from_slice(&[0x02, 0, 0, 0, 0, tag]);
    a[14..18].copy_from_slice(&[10, 0, 0, tag]);
    a[24..28].copy_from_slice(&[10, 0, 0, 1]);
    f
}

fn batch(frames: &[Vec<u8>]) -> TxBatch {
    let mut b = TxBatch::new();
    for f in frames {
        b.push(f.len()).copy_from_slice(f);
    }
    b
}

// ---- steered groups on one thread ----------------------------------------------------------

/// `n` steered shards on an in-process NIC whose port puts frames on queues by `link`.
fn group(
    n: usize,
    rings: RingSpec,
    link: impl FnMut(&[u8]) -> usize + Send + 'static,
) -> (NicPort, Vec<Steered>) {
    let (port, queues) = nic(n, DeviceCaps::ETHERNET, RingSpec::default(), link).unwrap();
    let queues = queues.into_iter().map(NicQueue::into_queue).collect();
    (port, Steered::group(queues, rings).unwrap())
}

/// Polls every shard in turn until a whole round delivers nothing; returns what each shard's
/// engine would have been handed.
fn pump(shards: &mut [Steered]) -> Vec<Vec<Vec<u8>>> {
    let mut got = vec![Vec::new(); shards.len()];
    for _round in 0..10_000 {
        let mut moved = 0;
        for (i, s) in shards.iter_mut().enumerate() {
            moved += s.recv_batch(Instant::ZERO, 64, &mut |f| got[i].push(f.to_vec()));
        }
        if moved == 0 && !shards.iter().any(|s| s.rx_pending(Instant::ZERO)) {
            return got;
        }
    }
    panic!("frames kept moving");
}

fn totals(shards: &[Steered]) -> SteerCounters {
    let mut t = SteerCounters::default();
    for s in shards {
        t.merge(&s.counters());
    }
    t
}

/// A link steering by a hash that is not flowstack's (the published RSS key, not symmetric),
/// with frames it cannot hash on the last queue — as a kernel's own flow steering would.
fn foreign_link(n: usize) -> impl FnMut(&[u8]) -> usize + Send + 'static {
    let t = Toeplitz::new(&MICROSOFT_KEY);
    move |f| match t.hash_frame(f) {
        Some(h) => (h as usize >> 3) % n,
        None => n - 1,
    }
}

#[test]
fn frames_of_many_flows_reach_their_owner_whatever_queue_they_arrive_on() {
    let n = 4;
    // The link spreads frames round-robin: three in four arrive on a queue not their owner's.
    let mut next = 0usize;
    let (mut port, mut shards) = group(n, RingSpec::default(), move |_| {
        next += 1;
        next
    });
    let steering = Steering::new(n);
    let (a, b) = (ip("10.1.0.1"), ip("10.1.0.2"));
    let mut frames = Vec::new();
    let mut owner = BTreeMap::new();
    for i in 0..400u32 {
        let (proto, sport, dport) = match i % 4 {
            0 | 1 => (TCP, 30_000 + i as u16, 80),
            2 => (UDP, 40_000 + i as u16, 53),
            _ => (ICMP, 0, 0),
        };
        let (src, dst) = if i % 2 == 0 { (a, b) } else { (b, a) };
        let f = ipv4_frame(src, dst, proto, (sport, dport), i % 5 == 0, i);
        let want = match steering.owner(&f) {
            Owner::Shard(k) => k,
            o => panic!("an IPv4 frame has one owner, not {o:?}"),
        };
        if proto != ICMP && i % 5 != 0 {
            assert_eq!(want, steering.owner_of_flow(src, dst, sport, dport));
        }
        owner.insert(i, want);
        frames.push(f);
    }
    assert_eq!(
        port.send_batch(Instant::ZERO, &batch(&frames)),
        frames.len()
    );
    let got = pump(&mut shards);
    let mut seen = BTreeSet::new();
    for (k, fs) in got.iter().enumerate() {
        for f in fs {
            let tag = u32::from_be_bytes(f[42..46].try_into().unwrap());
            assert_eq!(owner[&tag], k, "frame {tag} delivered to shard {k}");
            assert!(seen.insert(tag), "frame {tag} delivered twice");
        }
        let c = shards[k].counters();
        assert_eq!(c.local + c.received, fs.len() as u64, "shard {k}: {c:?}");
    }
    assert_eq!(seen.len(), frames.len(), "every frame delivered");
    let t = totals(&shards);
    assert_eq!(t.forwarded, t.received);
    assert_eq!(t.local + t.forwarded, frames.len() as u64);
    // Round-robin over 4 queues puts about three quarters on a foreign queue.
    assert!(t.forwarded > frames.len() as u64 / 2, "{t:?}");
    assert_eq!(
        (t.ring_full, t.too_large, t.ring_errors, t.unsteered),
        (0, 0, 0, 0)
    );
    assert!(
        got.iter().all(|fs| !fs.is_empty()),
        "flows spread over every shard"
    );
}

#[test]
fn both_directions_of_a_flow_have_one_owner() {
    let s = Steering::new(4);
    let mut per_shard = [0usize; 4];
    let (a, b) = (ip("192.168.7.10"), ip("10.0.0.1"));
    for p in 0..5000u16 {
        let (sp, dp) = (1024 + p * 11, 80 + p % 7);
        let there = ipv4_frame(a, b, TCP, (sp, dp), false, 0);
        let back = ipv4_frame(b, a, TCP, (dp, sp), false, 0);
        let o = s.owner(&there);
        assert_eq!(o, s.owner(&back), "{a}:{sp} <-> {b}:{dp}");
        assert_eq!(o, Owner::Shard(s.owner_of_flow(b, a, dp, sp)));
        if let Owner::Shard(k) = o {
            per_shard[k] += 1;
        }
    }
    assert!(per_shard.iter().all(|&c| c > 5000 / 8), "{per_shard:?}");
}

#[test]
fn a_flood_from_one_flow_stays_on_one_shard_in_order() {
    let n = 3;
    let (a, b) = (ip("10.2.0.9"), ip("10.2.0.1"));
    let owner = Steering::new(n).owner_of_flow(a, b, 5555, 80);
    // The link puts the flow on one queue, but not its owner's.
    let (mut port, mut shards) = group(n, RingSpec::default(), move |_| owner + 1);
    let flood: Vec<_> = (0..3000)
        .map(|i| ipv4_frame(a, b, TCP, (5555, 80), false, i))
        .collect();
    let mut got = vec![0usize; n];
    let mut next_tag = 0;
    for chunk in flood.chunks(200) {
        assert_eq!(port.send_batch(Instant::ZERO, &batch(chunk)), chunk.len());
        for (k, fs) in pump(&mut shards).iter().enumerate() {
            got[k] += fs.len();
            for f in fs {
                assert_eq!(u32::from_be_bytes(f[42..46].try_into().unwrap()), next_tag);
                next_tag += 1;
            }
        }
    }
    let want: Vec<usize> = (0..n).map(|k| if k == owner { 3000 } else { 0 }).collect();
    assert_eq!(got, want);
    let t = totals(&shards);
    assert_eq!((t.forwarded, t.received, t.local), (3000, 3000, 0));
    assert_eq!(t.ring_full, 0);
}

#[test]
fn arp_requests_reach_shard_0_only_and_replies_reach_every_shard() {
    let n = 4;
    // Requests arrive on queue 3, replies on queue 2 (the link decides; steering corrects).
    let (mut port, mut shards) = group(
        n,
        RingSpec::default(),
        |f| {
            if f[14 + 7] == 1 {
                3
            } else {
                2
            }
        },
    );
    let frames = vec![arp_frame(true, 7), arp_frame(false, 8), arp_frame(true, 9)];
    port.send_batch(Instant::ZERO, &batch(&frames));
    let got = pump(&mut shards);
    let requests = |fs: &Vec<Vec<u8>>| fs.iter().filter(|f| f[21] == 1).count();
    let replies = |fs: &Vec<Vec<u8>>| fs.iter().filter(|f| f[21] == 2).count();
    assert_eq!(requests(&got[0]), 2, "both requests at shard 0");
    for (k, fs) in got.iter().enumerate() {
        assert_eq!(replies(fs), 1, "shard {k} gets the reply once");
        if k != 0 {
            assert_eq!(requests(fs), 0, "shard {k} never sees a request");
        }
    }
    let c: Vec<SteerCounters> = shards.iter().map(Steered::counters).collect();
    assert_eq!(c[3].arp_requests, 2);
    assert_eq!(c[3].forwarded, 2, "both requests forwarded to shard 0");
    assert_eq!(c[2].arp_replies, 1);
    assert_eq!(
        c[2].forwarded, 3,
        "the reply copied to the three other shards"
    );
    assert_eq!(c[2].local, 1);
    assert_eq!(c[0].received, 3);
    let steering = Steering::new(n);
    assert_eq!(steering.owner(&frames[0]), Owner::Shard(0));
    assert_eq!(steering.owner(&frames[1]), Owner::Every);
    // Nothing to steer by: kept where it arrived, and counted.
    let mut junk = arp_frame(true, 1);
    junk[12] = 0x86; // 0x86dd: not IPv4, not ARP
    junk[13] = 0xdd;
    assert_eq!(steering.owner(&junk), Owner::Receiver);
    assert_eq!(steering.owner(&junk[..10]), Owner::Receiver);
    port.send_batch(Instant::ZERO, &batch(&[junk]));
    let got = pump(&mut shards);
    assert_eq!(got[3].len(), 1, "kept on the queue it arrived on");
    assert_eq!(shards[3].counters().unsteered, 1);
}

#[test]
fn a_full_ring_drops_and_counts_and_oversized_frames_are_refused() {
    let n = 2;
    let rings = RingSpec {
        capacity: 4096,
        max_frame: 100,
    };
    // Everything arrives on queue 0.
    let (mut port, mut shards) = group(n, rings, |_| 0);
    let (a, b) = (ip("10.3.0.1"), ip("10.3.0.2"));
    let s = Steering::new(n);
    let theirs: Vec<_> = (0..2000u16)
        .map(|p| (p, ipv4_frame(a, b, UDP, (p, 9), false, p as u32)))
        .filter(|(p, _)| s.owner_of_flow(a, b, *p, 9) == 1)
        .map(|(_, f)| f)
        .take(300)
        .collect();
    port.send_batch(Instant::ZERO, &batch(&theirs));
    // Shard 0 takes them all before shard 1 runs: its ring holds 4096 / 56 of them.
    let mut taken = 0;
    for _ in 0..100 {
        taken += shards[0].recv_batch(Instant::ZERO, 1000, &mut |_| panic!("not shard 0's"));
        if !shards[0].device().rx_pending(Instant::ZERO) {
            break;
        }
    }
    assert_eq!(taken, 0);
    let c0 = shards[0].counters();
    assert_eq!(c0.forwarded + c0.ring_full, 300, "{c0:?}");
    assert!(c0.ring_full > 0 && c0.forwarded >= 4096 / 64, "{c0:?}");
    let got = pump(&mut shards);
    assert_eq!(got[1].len() as u64, c0.forwarded);
    // A frame beyond the rings' largest is dropped and counted, not truncated.
    let mut big = ipv4_frame(a, b, UDP, (0, 9), false, 0);
    big.resize(200, 0);
    let (p, _) = (0..2000u16)
        .map(|p| (p, s.owner_of_flow(a, b, p, 9)))
        .find(|&(_, o)| o == 1)
        .unwrap();
    big[34..36].copy_from_slice(&p.to_be_bytes());
    port.send_batch(Instant::ZERO, &batch(&[big]));
    pump(&mut shards);
    assert_eq!(shards[0].counters().too_large, 1);
}

// ---- waking a sleeping shard ----------------------------------------------------------------

/// A device over a unix datagram socket: readable on its descriptor, as a TAP is.
struct Dgram(UnixDatagram);

impl Device for Dgram {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::ETHERNET
    }
    fn recv_batch(&mut self, _: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while n < budget {
            let Ok(len) = self.0.recv(&mut buf) else {
                break;
            };
            sink(&buf[..len]);
            n += 1;
        }
        n
    }
    fn send_batch(&mut self, _: Instant, batch: &TxBatch) -> usize {
        batch.iter().filter(|f| self.0.send(f).is_ok()).count()
    }
    fn rx_pending(&self, _: Instant) -> bool {
        true
    }
    fn wait(&mut self, timeout: Duration) {
        let _ = flowstack_sys::poll::wait_readable(&self.0, timeout);
    }
}

/// A frame of a flow shard 1 of 2 owns.
fn frame_for_shard_1() -> Vec<u8> {
    let (a, b) = (ip("10.4.0.1"), ip("10.4.0.2"));
    let s = Steering::new(2);
    let p = (1000..)
        .find(|&p| s.owner_of_flow(a, b, p, 7) == 1)
        .unwrap();
    ipv4_frame(a, b, TCP, (p, 7), false, 42)
}

/// Shard 1 sleeps (for up to 30 s per wait); shard 0 receives a frame of shard 1's and
/// forwards it: shard 1 must wake and take it long before its timeout.
fn forwarded_frame_wakes_a_sleeping_shard(queues: Vec<Queue>, inject: impl FnOnce()) {
    let mut shards = Steered::group(queues, RingSpec::default()).unwrap();
    let mut s1 = shards.pop().unwrap();
    let mut s0 = shards.pop().unwrap();
    let sleeper = std::thread::spawn(move || {
        let start = WallClock::now();
        let mut got = Vec::new();
        while got.is_empty() && start.elapsed() < std::time::Duration::from_secs(60) {
            s1.wait(Duration::from_secs(30));
            s1.recv_batch(Instant::ZERO, 64, &mut |f| got.push(f.to_vec()));
        }
        (got, start.elapsed(), s1.counters())
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    inject();
    let start = WallClock::now();
    while s0.counters().forwarded == 0 && start.elapsed() < std::time::Duration::from_secs(10) {
        s0.wait(Duration::from_millis(10));
        s0.recv_batch(Instant::ZERO, 64, &mut |_| panic!("not shard 0's"));
    }
    let (got, took, c1) = sleeper.join().unwrap();
    assert_eq!(got, vec![frame_for_shard_1()]);
    assert_eq!(c1.received, 1);
    assert!(
        took < std::time::Duration::from_secs(20),
        "woken, not timed out"
    );
}

#[test]
fn a_shard_sleeping_in_its_device_is_woken_by_a_forward() {
    let (mut port, qs) = nic(2, DeviceCaps::ETHERNET, RingSpec::default(), |_| 0).unwrap();
    let queues = qs.into_iter().map(NicQueue::into_queue).collect();
    forwarded_frame_wakes_a_sleeping_shard(queues, move || {
        port.send_batch(Instant::ZERO, &batch(&[frame_for_shard_1()]));
    });
}

#[test]
fn a_shard_polling_a_descriptor_is_woken_by_a_forward() {
    let (d0, peer0) = UnixDatagram::pair().unwrap();
    let (d1, _peer1) = UnixDatagram::pair().unwrap();
    let mut queues = Vec::new();
    for d in [d0, d1] {
        d.set_nonblocking(true).unwrap();
        let fd = d.as_fd().try_clone_to_owned().unwrap();
        queues.push(Queue::with_fd(Box::new(Dgram(d)), fd).unwrap());
    }
    forwarded_frame_wakes_a_sleeping_shard(queues, move || {
        peer0.send(&frame_for_shard_1()).unwrap();
    });
}

#[test]
fn a_shard_on_a_device_nobody_can_wake_still_takes_forwarded_frames() {
    let (mut port, qs) = nic(2, DeviceCaps::ETHERNET, RingSpec::default(), |_| 0).unwrap();
    // Queue::new: no waker, so the shard sleeps in slices.
    let queues = qs.into_iter().map(Queue::new).collect();
    forwarded_frame_wakes_a_sleeping_shard(queues, move || {
        port.send_batch(Instant::ZERO, &batch(&[frame_for_shard_1()]));
    });
}

// ---- the runtime ----------------------------------------------------------------------------

const SERVER_IP: &str = "10.9.0.1";
const CLIENT_IP: &str = "10.9.0.2";
const ECHO_PORT: u16 = 7;

fn engine_config(ip: &str, mac: u8) -> EngineConfig {
    let cidr: Ipv4Cidr = format!("{ip}/24").parse().unwrap();
    EngineConfig::new(IfaceConfig::new(
        EthernetAddress([0x02, 0x66, 0x73, 0, 0, mac]),
        cidr,
    ))
}

/// The echo server, and the client ports of every connection it has seen.
struct RecordingEcho {
    server: Server,
    peers: BTreeSet<u16>,
}

impl App<Engine> for RecordingEcho {
    fn poll(&mut self, now: Instant, e: &mut Engine) -> Progress {
        let p = self.server.poll(now, e);
        for c in e.tcp_iter() {
            let t = c.tuple();
            if t.local_port == ECHO_PORT && t.remote_port != 0 {
                self.peers.insert(t.remote_port);
            }
        }
        p
    }
}

fn echo_spec() -> ServeSpec {
    ServeSpec {
        service: Service::Echo,
        port: ECHO_PORT,
        backlog: 128,
    }
}

/// The byte at `i` of connection `k`'s stream.
fn pattern(k: usize, i: usize) -> u8 {
    (k.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 9)) as u8
}

struct Conn {
    h: TcpHandle,
    port: u16,
    sent: usize,
    echoed: usize,
    done: bool,
}

/// Opens `conns` connections at once, sends `len` pattern bytes on each, checks every byte
/// echoed, closes.
struct EchoClient {
    target: SocketAddrV4,
    conns: Vec<Conn>,
    want: usize,
    len: usize,
    buf: Vec<u8>,
    failed: Option<String>,
}

impl EchoClient {
    fn new(conns: usize, len: usize) -> Self {
        Self {
            target: SocketAddrV4::new(ip(SERVER_IP).into(), ECHO_PORT),
            conns: Vec::new(),
            want: conns,
            len,
            buf: vec![0; 64 * 1024],
            failed: None,
        }
    }
}

impl App<Engine> for EchoClient {
    fn poll(&mut self, _now: Instant, e: &mut Engine) -> Progress {
        let mut moved = false;
        while self.conns.len() < self.want {
            let h = e.tcp_connect(self.target).expect("connect");
            let port = e.tcp_conn(h).unwrap().tuple().local_port;
            self.conns.push(Conn {
                h,
                port,
                sent: 0,
                echoed: 0,
                done: false,
            });
            moved = true;
        }
        for (k, c) in self.conns.iter_mut().enumerate().filter(|(_, c)| !c.done) {
            if c.sent < self.len {
                let chunk: Vec<u8> = (c.sent..self.len.min(c.sent + 8192))
                    .map(|i| pattern(k, i))
                    .collect();
                match e.tcp_send(c.h, &chunk) {
                    Ok(n) => {
                        c.sent += n;
                        moved |= n > 0;
                    }
                    Err(SocketError::WouldBlock) => {}
                    Err(err) => self.failed = Some(format!("conn {k}: send: {err}")),
                }
            }
            match e.tcp_recv(c.h, &mut self.buf) {
                Ok(0) => self.failed = Some(format!("conn {k}: early end of stream")),
                Ok(n) => {
                    for (j, &b) in self.buf[..n].iter().enumerate() {
                        if b != pattern(k, c.echoed + j) {
                            self.failed = Some(format!("conn {k}: byte {} wrong", c.echoed + j));
                        }
                    }
                    c.echoed += n;
                    moved = true;
                }
                Err(SocketError::WouldBlock) => {}
                Err(err) => self.failed = Some(format!("conn {k}: recv: {err}")),
            }
            if c.echoed == self.len {
                let _ = e.tcp_close(c.h);
                c.done = true;
            }
        }
        if self.failed.is_some() || self.conns.iter().all(|c| c.done) {
            Progress::Done
        } else if moved {
            Progress::Busy
        } else {
            Progress::Idle
        }
    }
}

/// Serves echo on a 2-shard runtime behind an in-process NIC steering by `link`, runs a
/// single-engine client with `conns` connections of `len` bytes against it, and checks that
/// every byte came back and every connection was served by exactly the shard owning it.
/// Returns the shards' steering totals.
fn echo_over_shards(
    placement: Placement,
    link: impl FnMut(&[u8]) -> usize + Send + 'static,
    conns: usize,
    len: usize,
) -> SteerCounters {
    let n = 2;
    let (port, queues) = nic(n, DeviceCaps::ETHERNET, RingSpec::default(), link).unwrap();
    let spec = RuntimeSpec {
        placement,
        queues: queues.into_iter().map(NicQueue::into_queue).collect(),
        rings: RingSpec::default(),
        engine: |_: &ShardInfo| engine_config(SERVER_IP, 1),
        app: |_: &ShardInfo, e: &mut Engine| {
            Server::listen(e, echo_spec()).map(|server| RecordingEcho {
                server,
                peers: BTreeSet::new(),
            })
        },
    };
    let rt = Runtime::start(spec).unwrap();
    assert_eq!(rt.shards(), n);

    let client = Engine::new(engine_config(CLIENT_IP, 2), port.caps());
    let mut host = Host::new(client, port);
    let mut app = EchoClient::new(conns, len);
    let start = WallClock::now();
    let limit = std::time::Duration::from_secs(120);
    let progress = host.run(&mut app, || start.elapsed() > limit);
    let reports = rt.shutdown();

    assert_eq!(app.failed, None);
    assert_eq!(progress, Progress::Done, "client finished in time");
    assert!(app.conns.iter().all(|c| c.echoed == len && c.sent == len));
    eprintln!(
        "client: {} frames dropped at the NIC's full queues",
        host.dev.tx_drops()
    );

    let steering = Steering::new(n);
    let (c_ip, s_ip) = (ip(CLIENT_IP), ip(SERVER_IP));
    let client_ports: BTreeSet<u16> = app.conns.iter().map(|c| c.port).collect();
    assert_eq!(client_ports.len(), conns);
    let mut accepted = 0;
    let mut passive_opens = 0;
    let mut served = BTreeSet::new();
    let mut t = SteerCounters::default();
    for r in reports {
        let r = r.expect("no shard panicked");
        let k = r.shard.index;
        accepted += r.app.server.totals().conns;
        passive_opens += r.counters.get(Counter::TcpPassiveOpens);
        for &p in &r.app.peers {
            assert_eq!(
                steering.owner_of_flow(c_ip, s_ip, p, ECHO_PORT),
                k,
                "client port {p} served by shard {k}"
            );
            assert!(served.insert(p), "client port {p} served by two shards");
        }
        assert_eq!(
            r.app.server.totals().bytes_in,
            r.app.server.totals().bytes_out
        );
        assert!(r.app.server.totals().conns > 0, "shard {k} served nothing");
        assert!(!r.link_down);
        t.merge(&r.steer);
    }
    assert_eq!(accepted, conns as u64, "every connection accepted once");
    assert_eq!(passive_opens, conns as u64);
    assert_eq!(served, client_ports, "every connection served");
    // A full ring drops like a full NIC queue (TCP recovers); nothing else may be lost.
    assert_eq!((t.too_large, t.ring_errors), (0, 0), "{t:?}");
    eprintln!("shards: {t:?}");
    t
}

#[test]
fn echo_over_two_shards_behind_a_nic_with_flowstacks_hash() {
    let steering = Steering::new(2);
    let t = echo_over_shards(
        Placement::Floating,
        move |f| steering.queue_for(f),
        48,
        24 * 1024,
    );
    // The link steered every flow to its owner: only ARP replies were copied across.
    assert_eq!(t.forwarded, t.arp_replies, "{t:?}");
    assert!(t.arp_replies > 0);
}

#[test]
fn echo_over_two_pinned_shards_behind_a_nic_with_a_foreign_hash() {
    let cpus = flowstack_sys::affinity::allowed_cpus().unwrap();
    let placement = if cpus.len() >= 2 {
        Placement::Pinned(cpus[..2].to_vec())
    } else {
        Placement::Floating
    };
    let t = echo_over_shards(placement, foreign_link(2), 48, 24 * 1024);
    // About half the frames arrived on the wrong queue and were forwarded.
    assert!(t.forwarded > t.local / 4, "{t:?}");
    assert!(t.arp_requests > 0);
}

#[test]
fn a_shard_that_cannot_start_stops_the_runtime_with_its_reason() {
    let (_port, queues) = nic(2, DeviceCaps::ETHERNET, RingSpec::default(), |_| 0).unwrap();
    let spec = RuntimeSpec {
        placement: Placement::Floating,
        queues: queues.into_iter().map(NicQueue::into_queue).collect(),
        rings: RingSpec::default(),
        engine: |_: &ShardInfo| engine_config(SERVER_IP, 1),
        // Shard 1 asks for port 0, which cannot be listened on.
        app: |s: &ShardInfo, e: &mut Engine| {
            let port = if s.index == 1 { 0 } else { ECHO_PORT };
            Server::listen(
                e,
                ServeSpec {
                    port,
                    ..echo_spec()
                },
            )
        },
    };
    match Runtime::start(spec) {
        Err(StartError::App { shard: 1, error }) => {
            assert!(error.to_string().contains("port 0"), "{error}")
        }
        other => panic!("expected shard 1's listen error, got {other:?}"),
    }

    let (_port, queues) = nic(2, DeviceCaps::ETHERNET, RingSpec::default(), |_| 0).unwrap();
    let spec = RuntimeSpec {
        placement: Placement::Floating,
        queues: queues.into_iter().map(NicQueue::into_queue).collect(),
        rings: RingSpec::default(),
        engine: |_: &ShardInfo| engine_config(SERVER_IP, 1),
        app: |s: &ShardInfo, e: &mut Engine| {
            assert!(s.index == 0, "shard {} refuses to start", s.index);
            Server::listen(e, echo_spec())
        },
    };
    match Runtime::start(spec) {
        Err(StartError::Panicked { message }) => {
            assert!(message.contains("shard 1 refuses"), "{message}")
        }
        other => panic!("expected shard 1's panic, got {other:?}"),
    }

    let (_port, queues) = nic(1, DeviceCaps::ETHERNET, RingSpec::default(), |_| 0).unwrap();
    let spec = RuntimeSpec {
        placement: Placement::Pinned(vec![flowstack_runtime::shard::MAX_CPU]),
        queues: queues.into_iter().map(NicQueue::into_queue).collect(),
        rings: RingSpec::default(),
        engine: |_: &ShardInfo| engine_config(SERVER_IP, 1),
        app: |_: &ShardInfo, e: &mut Engine| Server::listen(e, echo_spec()),
    };
    assert!(matches!(
        Runtime::start(spec),
        Err(StartError::Pin { shard: 0, .. })
    ));

    let spec = RuntimeSpec {
        placement: Placement::Pinned(vec![0, 1]),
        queues: Vec::new(),
        rings: RingSpec::default(),
        engine: |_: &ShardInfo| engine_config(SERVER_IP, 1),
        app: |_: &ShardInfo, e: &mut Engine| Server::listen(e, echo_spec()),
    };
    assert!(matches!(Runtime::start(spec), Err(StartError::Spec(_))));
}

#[test]
fn a_shard_whose_app_is_done_ends_and_reports() {
    struct Once(u32);
    impl App<Engine> for Once {
        fn poll(&mut self, _: Instant, _: &mut Engine) -> Progress {
            self.0 += 1;
            Progress::Done
        }
    }
    let (_port, queues) = nic(3, DeviceCaps::ETHERNET, RingSpec::default(), |_| 0).unwrap();
    let rt = Runtime::start(RuntimeSpec {
        placement: Placement::Floating,
        queues: queues.into_iter().map(NicQueue::into_queue).collect(),
        rings: RingSpec::default(),
        engine: |_: &ShardInfo| engine_config(SERVER_IP, 1),
        app: |s: &ShardInfo, _: &mut Engine| Ok::<_, std::io::Error>(Once(s.index as u32 * 10)),
    })
    .unwrap();
    let reports = rt.join();
    let polls: Vec<u32> = reports.into_iter().map(|r| r.unwrap().app.0).collect();
    assert_eq!(polls, vec![1, 11, 21]);
}

#[test]
fn idle_shards_sleep_instead_of_spinning() {
    /// Counts its turns; never has work.
    struct Count(u64);
    impl App<Engine> for Count {
        fn poll(&mut self, _: Instant, _: &mut Engine) -> Progress {
            self.0 += 1;
            Progress::Idle
        }
    }
    // Queues peers can wake (the shard sleeps up to the drive loop's longest sleep), and
    // queues nobody can wake (it sleeps in slices of 1 ms).
    for wakeable in [true, false] {
        let (_port, queues) = nic(2, DeviceCaps::ETHERNET, RingSpec::default(), |_| 0).unwrap();
        let queues = queues
            .into_iter()
            .map(|q| {
                if wakeable {
                    q.into_queue()
                } else {
                    Queue::new(q)
                }
            })
            .collect();
        let rt = Runtime::start(RuntimeSpec {
            placement: Placement::Floating,
            queues,
            rings: RingSpec::default(),
            engine: |_: &ShardInfo| engine_config(SERVER_IP, 1),
            app: |_: &ShardInfo, _: &mut Engine| Ok::<_, std::io::Error>(Count(0)),
        })
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let start = WallClock::now();
        for r in rt.shutdown() {
            let r = r.unwrap();
            // A spinning shard turns millions of times in 300 ms; a sleeping one a few
            // (wakeable: every 50 ms) or a few hundred (slices: every 1 ms).
            let bound = if wakeable { 100 } else { 3000 };
            assert!(r.app.0 < bound, "wakeable {wakeable}: {} turns", r.app.0);
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "stop wakes sleeping shards"
        );
    }
}
