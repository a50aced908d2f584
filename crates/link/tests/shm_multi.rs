//! The multi-queue shm wire through its public API: RSS steering (spread, stickiness,
//! symmetry, ARP, floods) and engines on their own threads exchanging frames while sleeping
//! whenever idle.

use flowstack_link::shm::{ShmMulti, ShmOptions, ShmQueue, ShmStats};
use flowstack_link::{Device, Instant, TxBatch};
use flowstack_wire::rss::{queue_of, Toeplitz};
use flowstack_wire::{Duration, Ipv4Address};
use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

const NOW: Instant = Instant::ZERO;

/// Both sides of an `n`-queue wire in this process (two mappings of one memfd, as two
/// processes would have them).
fn wire(n: usize, opts: ShmOptions) -> (Vec<ShmQueue>, Vec<ShmQueue>) {
    let a = ShmMulti::create(n, opts).unwrap();
    // SAFETY: the descriptor is open as long as `a` lives; we only duplicate it.
    let fd = unsafe { BorrowedFd::borrow_raw(a.raw_fd()) };
    let b = ShmMulti::attach_fd(fd.try_clone_to_owned().unwrap(), opts).unwrap();
    (a.into_queues(), b.into_queues())
}

/// A UDP/IPv4 flow as the hash sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Flow {
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
}

impl Flow {
    /// The `k`-th of many distinct flows between addresses of 10.0.0.0/8.
    fn nth(k: u32) -> Self {
        let b = k.to_be_bytes();
        Self {
            src: [10, b[1], b[2], b[3]],
            dst: [10, 200, (k % 7) as u8, 1 + (k % 5) as u8],
            sport: 1024 + (k.wrapping_mul(2654435761) >> 16) as u16 % 60000,
            dport: [80, 443, 5201, 9000][k as usize % 4],
        }
    }

    fn reversed(self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
        }
    }

    /// The queue a NIC with the symmetric key and `n` queues gives this flow.
    fn queue(self, t: &Toeplitz, n: usize) -> usize {
        let h = t.hash_v4(
            Ipv4Address(self.src),
            Ipv4Address(self.dst),
            self.sport,
            self.dport,
        );
        queue_of(h, n)
    }
}

const PAYLOAD: usize = 16;
const FRAME: usize = 14 + 20 + 8 + PAYLOAD;

/// Appends a UDP/IPv4 frame of `flow` carrying `payload`.
fn push_udp(batch: &mut TxBatch, flow: Flow, payload: [u8; PAYLOAD]) {
    let f = batch.push(FRAME);
    f.fill(0);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((FRAME - 14) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&flow.src);
    ip[16..20].copy_from_slice(&flow.dst);
    f[34..36].copy_from_slice(&flow.sport.to_be_bytes());
    f[36..38].copy_from_slice(&flow.dport.to_be_bytes());
    f[38..40].copy_from_slice(&((8 + PAYLOAD) as u16).to_be_bytes());
    f[42..].copy_from_slice(&payload);
}

/// The flow and payload of a frame built by [`push_udp`].
fn parse_udp(f: &[u8]) -> (Flow, [u8; PAYLOAD]) {
    assert_eq!(f.len(), FRAME);
    let flow = Flow {
        src: f[26..30].try_into().unwrap(),
        dst: f[30..34].try_into().unwrap(),
        sport: u16::from_be_bytes([f[34], f[35]]),
        dport: u16::from_be_bytes([f[36], f[37]]),
    };
    (flow, f[42..].try_into().unwrap())
}

fn tag(k: u32) -> [u8; PAYLOAD] {
    let mut p = [0; PAYLOAD];
    p[..4].copy_from_slice(&k.to_be_bytes());
    p
}

/// Every frame waiting on each queue of `side`, as (queue, frame) pairs.
fn drain(side: &mut [ShmQueue]) -> Vec<(usize, Vec<u8>)> {
    let mut out = Vec::new();
    for (q, dev) in side.iter_mut().enumerate() {
        while dev.recv_batch(NOW, 64, &mut |f| out.push((q, f.to_vec()))) > 0 {}
    }
    out
}

/// Many flows, each sent twice from different engines: the flows spread over every queue,
/// each flow lands on exactly one queue, and that queue is the one RSS names.
#[test]
fn many_flows_spread_over_every_queue_and_each_stays_on_its_queue() {
    let t = Toeplitz::symmetric();
    for n in [2, 3, 4] {
        let (mut a, mut b) = wire(n, ShmOptions::default());
        const FLOWS: u32 = 2000;
        for round in 0..2 {
            for k in 0..FLOWS {
                let mut batch = TxBatch::new();
                push_udp(&mut batch, Flow::nth(k), tag(k));
                let engine = (k as usize + round) % n;
                assert_eq!(a[engine].send_batch(NOW, &batch), 1);
            }
        }
        let mut landed: HashMap<Flow, Vec<usize>> = HashMap::new();
        for (q, f) in drain(&mut b) {
            let (flow, p) = parse_udp(&f);
            assert_eq!(
                flow,
                Flow::nth(u32::from_be_bytes(p[..4].try_into().unwrap()))
            );
            landed.entry(flow).or_default().push(q);
        }
        assert_eq!(landed.len(), FLOWS as usize, "n {n}: every flow arrived");
        let mut per_queue = vec![0; n];
        for (flow, qs) in &landed {
            assert_eq!(qs.len(), 2, "n {n}: both copies of {flow:?}");
            assert_eq!(
                qs[0], qs[1],
                "n {n}: {flow:?} on one queue from two engines"
            );
            assert_eq!(qs[0], flow.queue(&t, n), "n {n}: the queue RSS names");
            per_queue[qs[0]] += 1;
        }
        for (q, &c) in per_queue.iter().enumerate() {
            assert!(
                c > FLOWS as usize / n / 2,
                "n {n}: queue {q} got {c} of {FLOWS} flows: {per_queue:?}"
            );
        }
        let rx: ShmStats = b.iter().map(ShmQueue::stats).sum();
        let tx: ShmStats = a.iter().map(ShmQueue::stats).sum();
        assert_eq!((tx.tx_frames, tx.tx_drops), (2 * FLOWS as u64, 0));
        assert_eq!(rx.rx_frames, 2 * FLOWS as u64);
        assert!(b.iter().all(|q| q.stats().rx_frames > 0));
    }
}

/// A reply goes back the way the request came: the engine that owns a flow's queue on one
/// side answers, and the answer lands on the same queue index on the other side.
#[test]
fn both_directions_of_a_flow_land_on_the_same_queue_index() {
    for n in [2, 3, 4, 8] {
        let (mut a, mut b) = wire(n, ShmOptions::default());
        for k in 0..500 {
            let flow = Flow::nth(k);
            let mut batch = TxBatch::new();
            push_udp(&mut batch, flow, tag(k));
            a[k as usize % n].send_batch(NOW, &batch);
            let got = drain(&mut b);
            assert_eq!(got.len(), 1);
            let q = got[0].0;
            // Queue q's engine answers.
            batch.clear();
            push_udp(&mut batch, flow.reversed(), tag(k));
            assert_eq!(b[q].send_batch(NOW, &batch), 1);
            let back = drain(&mut a);
            assert_eq!(back.len(), 1);
            assert_eq!(back[0].0, q, "n {n}: {flow:?} came back on another queue");
            assert_eq!(parse_udp(&back[0].1).0, flow.reversed());
        }
    }
}

/// Frames without a flow hash — ARP, other EtherTypes, IPv4 too short to parse — go to queue
/// 0 whichever engine sends them, in both directions.
#[test]
fn frames_without_a_hash_go_to_queue_0() {
    let (mut a, mut b) = wire(4, ShmOptions::default());
    let mut batch = TxBatch::new();
    for (ethertype, len) in [(0x0806u16, 42), (0x86dd, 80), (0x0800, 20)] {
        let f = batch.push(len);
        f.fill(0x11);
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    }
    for side in [&mut a, &mut b] {
        for dev in side.iter_mut() {
            assert_eq!(dev.send_batch(NOW, &batch), 3);
        }
    }
    for side in [&mut a, &mut b] {
        let got = drain(side);
        assert_eq!(got.len(), 12);
        assert!(got.iter().all(|(q, _)| *q == 0), "all on queue 0");
    }
}

/// A flood from one 4-tuple stays on one queue, in order; the other queues see nothing.
#[test]
fn a_flood_from_one_flow_stays_on_one_queue() {
    let t = Toeplitz::symmetric();
    let n = 4;
    let (mut a, mut b) = wire(n, ShmOptions::default());
    let flow = Flow::nth(7);
    let want = flow.queue(&t, n);
    let mut batch = TxBatch::new();
    let mut next = 0u32;
    for k in 0..20_000u32 {
        push_udp(&mut batch, flow, tag(k));
        if batch.len() == 32 {
            assert_eq!(a[1].send_batch(NOW, &batch), 32);
            batch.clear();
            for (q, f) in drain(&mut b) {
                assert_eq!(q, want);
                let (_, p) = parse_udp(&f);
                assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), next);
                next += 1;
            }
        }
    }
    assert_eq!(next, 20_000);
    for (q, dev) in b.iter().enumerate() {
        let expect = if q == want { 20_000 } else { 0 };
        assert_eq!(dev.stats().rx_frames, expect, "queue {q}");
    }
}

// ---- engines on threads ----

const TOKEN: u8 = 1;
const STOP: u8 = 2;

/// Flows by the queue they land on: `by_queue[q]` hash to queue `q` of `n`.
fn flows_by_queue(n: usize) -> Vec<Vec<Flow>> {
    let t = Toeplitz::symmetric();
    let mut by_queue = vec![Vec::new(); n];
    let mut k = 0;
    while by_queue.iter().any(|v| v.len() < 8) {
        let f = Flow::nth(k);
        by_queue[f.queue(&t, n)].push(f);
        k += 1;
    }
    by_queue
}

fn message(kind: u8, token: u32, hops: u32, target: usize) -> [u8; PAYLOAD] {
    let mut p = [0; PAYLOAD];
    p[0] = kind;
    p[1..5].copy_from_slice(&token.to_be_bytes());
    p[5..9].copy_from_slice(&hops.to_be_bytes());
    p[9] = target as u8;
    p
}

struct Engine {
    dev: ShmQueue,
    flows: Arc<Vec<Vec<Flow>>>,
    /// Tokens finished, over both sides.
    done: Arc<AtomicUsize>,
    tokens: usize,
    rng: u64,
}

/// What one engine thread saw.
struct Report {
    stats: ShmStats,
    longest_wait: std::time::Duration,
}

impl Engine {
    fn pick(&mut self, n: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % n as u64) as usize
    }

    /// Appends a message to a random queue of the peer (a flow that hashes there).
    fn push(&mut self, batch: &mut TxBatch, kind: u8, token: u32, hops: u32) {
        let n = self.flows.len();
        let target = self.pick(n);
        let k = self.pick(8);
        let flow = self.flows[target][k];
        push_udp(batch, flow, message(kind, token, hops, target));
    }

    fn push_stops(&mut self, batch: &mut TxBatch) {
        for target in 0..self.flows.len() {
            push_udp(batch, self.flows[target][0], message(STOP, 0, 0, target));
        }
    }

    /// Passes tokens on (each hop to a random peer queue) until every token has run out of
    /// hops, then stops everyone with STOP frames; sleeps on the wire whenever idle.
    fn run(mut self, initial: &[(u32, u32)]) -> Report {
        let start = std::time::Instant::now();
        let mut batch = TxBatch::new();
        for &(token, hops) in initial {
            self.push(&mut batch, TOKEN, token, hops);
        }
        let (mut got_stop, mut sent_stop) = (false, false);
        let mut longest_wait = std::time::Duration::ZERO;
        let mut inbox = Vec::new();
        loop {
            inbox.clear();
            let me = self.dev.index();
            self.dev.recv_batch(NOW, 32, &mut |f| {
                let (_, p) = parse_udp(f);
                assert_eq!(p[9] as usize, me, "landed on the queue its flow hashes to");
                inbox.push(p);
            });
            for p in &inbox {
                let hops = u32::from_be_bytes(p[5..9].try_into().unwrap());
                match p[0] {
                    TOKEN if hops == 0 => {
                        self.done.fetch_add(1, Ordering::SeqCst);
                    }
                    TOKEN => {
                        let token = u32::from_be_bytes(p[1..5].try_into().unwrap());
                        self.push(&mut batch, TOKEN, token, hops - 1);
                    }
                    STOP => got_stop = true,
                    k => panic!("unknown frame kind {k}"),
                }
            }
            let all_done = self.done.load(Ordering::SeqCst) == self.tokens;
            if (all_done || got_stop) && !sent_stop {
                self.push_stops(&mut batch);
                sent_stop = true;
            }
            if !batch.is_empty() {
                assert_eq!(self.dev.send_batch(NOW, &batch), batch.len(), "no drop");
                batch.clear();
            }
            if got_stop {
                break;
            }
            if !self.dev.rx_pending(NOW) {
                let t = std::time::Instant::now();
                self.dev.wait(Duration::from_secs(20));
                longest_wait = longest_wait.max(t.elapsed());
                assert!(
                    t.elapsed() < std::time::Duration::from_secs(15),
                    "engine {me} of side {} slept {:?} with tokens in flight: lost wake-up",
                    self.dev.side(),
                    t.elapsed()
                );
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(60),
                "engine {me} of side {}: stuck",
                self.dev.side()
            );
            assert!(!self.dev.link_down());
        }
        Report {
            stats: self.dev.stats(),
            longest_wait,
        }
    }
}

/// `n` engine threads per side pass tokens to random queues of the other side, each engine
/// sleeping (no spinning) whenever its queue is empty, so nearly every frame needs a wake-up
/// from whichever of the n peer engines sent it. Every token makes every hop (no loss), every
/// frame lands on its RSS queue, and no sleep lasts its 20 s timeout (no lost wake-up); the
/// whole exchange is bounded by 90 s.
fn exchange(n: usize, tokens_per_engine: u32, hops: u32) {
    let opts = ShmOptions {
        spin: Duration::ZERO,
        ..Default::default()
    };
    let (a, b) = wire(n, opts);
    let flows = Arc::new(flows_by_queue(n));
    let done = Arc::new(AtomicUsize::new(0));
    let tokens = n * tokens_per_engine as usize;
    let (tx, rx) = mpsc::channel();
    for (side, devs) in [a, b].into_iter().enumerate() {
        for dev in devs {
            let i = dev.index() as u32;
            let e = Engine {
                dev,
                flows: flows.clone(),
                done: done.clone(),
                tokens,
                rng: 0x9e37_79b9_7f4a_7c15 ^ (((side as u64) << 32) | (i as u64 + 1)),
            };
            // Side 0 injects the tokens, each starting with `hops` hops to go.
            let initial: Vec<(u32, u32)> = if side == 0 {
                (0..tokens_per_engine)
                    .map(|t| (i * tokens_per_engine + t, hops))
                    .collect()
            } else {
                Vec::new()
            };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let _ = tx.send((side, e.run(&initial)));
            });
        }
    }
    drop(tx);
    let mut sides = [ShmStats::default(), ShmStats::default()];
    for _ in 0..2 * n {
        let (side, r) = rx
            .recv_timeout(std::time::Duration::from_secs(90))
            .expect("an engine thread panicked or hung");
        assert!(
            r.longest_wait < std::time::Duration::from_secs(15),
            "a sleep of {:?}: lost wake-up",
            r.longest_wait
        );
        sides[side] += r.stats;
    }
    assert_eq!(done.load(Ordering::SeqCst), tokens, "every token finished");
    // Every hop is one frame; STOPs come on top (n per engine that sent them).
    let token_frames = tokens as u64 * (hops as u64 + 1);
    let sent = sides[0].tx_frames + sides[1].tx_frames;
    let received = sides[0].rx_frames + sides[1].rx_frames;
    assert_eq!(sides[0].tx_drops + sides[1].tx_drops, 0);
    assert!(sent >= token_frames && sent <= token_frames + (2 * n * n) as u64);
    assert!(received >= token_frames, "{received} of {token_frames}");
    // Only STOP frames may stay unread (those reaching an engine that already stopped).
    assert!(
        sent - received <= (2 * n * n) as u64,
        "{sent} sent, {received} read"
    );
    let total: ShmStats = sides.into_iter().sum();
    eprintln!("{n} engines per side: {total:?}");
    assert!(total.sleeps > 0 && total.wakeups > 0, "{total:?}");
    assert_eq!(total.corrupt, 0);
}

#[test]
fn two_engines_per_side_exchange_frames_with_no_loss_and_no_lost_wakeup() {
    exchange(2, 2, 20_000);
}

#[test]
fn three_engines_per_side_exchange_frames_with_no_loss_and_no_lost_wakeup() {
    exchange(3, 1, 10_000);
}
