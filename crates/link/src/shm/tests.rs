use super::*;
use std::os::fd::IntoRawFd;

fn pair() -> (ShmWire, ShmWire) {
    let a = ShmWire::create(ShmOptions::default()).unwrap();
    // Duplicate the descriptor so each side owns one.
    let dup = a.q.region.fd().try_clone_to_owned().unwrap();
    let b = ShmWire::attach(dup.into_raw_fd(), ShmOptions::default()).unwrap();
    (a, b)
}

/// Both sides of an `n`-queue wire, with `ring_memory` bytes per direction.
fn multi(n: usize, ring_memory: usize) -> (Vec<ShmQueue>, Vec<ShmQueue>) {
    let opts = ShmOptions {
        ring_memory,
        ..Default::default()
    };
    let a = ShmMulti::create(n, opts).unwrap();
    let dup = a.region.fd().try_clone_to_owned().unwrap();
    let b = ShmMulti::attach_fd(dup, opts).unwrap();
    (a.into_queues(), b.into_queues())
}

/// A second mapping of the wire's memfd, as the peer process would have it.
fn peer_view(q: &ShmQueue) -> SharedRegion {
    SharedRegion::from_fd(q.region.fd().try_clone_to_owned().unwrap()).unwrap()
}

#[test]
fn frames_cross_in_order_across_wrap_around() {
    let (mut a, mut b) = pair();
    let mut batch = TxBatch::new();
    let mut expect = 0u32;
    let mut got = 0u32;
    // Push well over 16 MiB through the ring in batches, with odd sizes so the records
    // hit the end of the ring at every possible offset.
    for round in 0..2000u32 {
        batch.clear();
        for k in 0..8u32 {
            let len = 60 + ((round * 8 + k) * 977 % 9000) as usize;
            let f = batch.push(len);
            f[..4].copy_from_slice(&(round * 8 + k).to_be_bytes());
            f[len - 1] = 0xab;
        }
        assert_eq!(a.send_batch(Instant::ZERO, &batch), 8);
        b.recv_batch(Instant::ZERO, 1000, &mut |f| {
            assert_eq!(u32::from_be_bytes(f[..4].try_into().unwrap()), got);
            assert_eq!(*f.last().unwrap(), 0xab);
            got += 1;
        });
        expect += 8;
    }
    assert_eq!(got, expect);
    assert!(!b.rx_pending(Instant::ZERO), "empty after draining");
    assert_eq!(b.caps().queues, 1);
}

#[test]
fn full_ring_drops_and_counts_then_recovers() {
    let (mut a, mut b) = pair();
    let mut batch = TxBatch::new();
    for _ in 0..300 {
        batch.push(65000);
    }
    let sent = a.send_batch(Instant::ZERO, &batch);
    assert!(sent < 300 && sent > 200, "sent {sent}");
    assert_eq!(a.stats().tx_drops as usize, 300 - sent);
    let n = b.recv_batch(Instant::ZERO, 10_000, &mut |_| {});
    assert_eq!(n, sent);
    assert_eq!(a.send_batch(Instant::ZERO, &batch), sent, "space is back");
}

#[test]
fn oversized_frame_is_dropped() {
    let (mut a, _b) = pair();
    let mut batch = TxBatch::new();
    batch.push(MAX_FRAME + 1);
    assert_eq!(a.send_batch(Instant::ZERO, &batch), 0);
    assert_eq!(a.stats().tx_drops, 1);
}

#[test]
fn idle_wait_sleeps_and_returns_at_timeout() {
    let (mut a, _b) = pair();
    // A wait whose thread was descheduled through its whole spin ends spun out, without
    // sleeping (it failed so once at load 6): an idle link sleeps within a few waits.
    for _ in 0..200 {
        a.wait(Duration::from_millis(5));
        if a.stats().sleeps > 0 {
            break;
        }
    }
    assert_eq!(a.stats().sleeps, 1);
    assert!(!a.link_down(), "the peer (this process) is alive");
}

#[test]
fn a_peer_breaking_the_ring_takes_the_link_down() {
    let (mut a, mut b) = pair();
    let mut batch = TxBatch::new();
    batch.push(100);
    assert_eq!(a.send_batch(Instant::ZERO, &batch), 1);
    // The peer claims a head beyond the ring: b must not read past it.
    let g = Geometry::new(1, RING_BYTES).unwrap();
    let head = a.q.region.atomic_u64(g.ring(0, 0, 0).offset).unwrap();
    head.store(RING_BYTES as u64 * 3, Ordering::SeqCst);
    assert!(!b.link_down());
    assert_eq!(
        b.recv_batch(Instant::ZERO, 10, &mut |_| panic!("no frame")),
        0
    );
    assert!(b.link_down());
    assert_eq!(b.stats().corrupt, 1);
}

#[test]
fn attach_refuses_what_is_not_a_wire() {
    let len = Geometry::new(1, RING_BYTES).unwrap().len();
    let other = SharedRegion::create("not-a-wire", len).unwrap();
    let fd = other.fd().try_clone_to_owned().unwrap();
    let e = ShmWire::attach_fd(fd, ShmOptions::default()).err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "no magic");
    let small = SharedRegion::create("small", 4096).unwrap();
    let fd = small.fd().try_clone_to_owned().unwrap();
    assert!(
        ShmWire::attach_fd(fd, ShmOptions::default()).is_err(),
        "wrong size"
    );
}

/// A region whose header says one thing and whose size another, or whose header holds values
/// the creator cannot have written, is refused with `InvalidData`.
#[test]
fn attaching_to_a_wrong_size_or_bad_header_region_fails() {
    let two = Geometry::new(2, 1 << 20).unwrap();
    let bad = |len: usize, edit: &dyn Fn(&SharedRegion)| {
        let r = SharedRegion::create("bad-wire", len).unwrap();
        two.write_header(&r);
        edit(&r);
        let fd = r.fd().try_clone_to_owned().unwrap();
        ShmMulti::attach_fd(fd, ShmOptions::default())
            .expect_err("refused")
            .kind()
    };
    let invalid = io::ErrorKind::InvalidData;
    assert_eq!(bad(two.len() - 4096, &|_| {}), invalid, "a page short");
    assert_eq!(bad(two.len() + 4096, &|_| {}), invalid, "a page long");
    let set = |o: usize, v: u64| {
        move |r: &SharedRegion| r.atomic_u64(o).unwrap().store(v, Ordering::SeqCst)
    };
    assert_eq!(bad(two.len(), &set(8, 3)), invalid, "queue count");
    assert_eq!(bad(two.len(), &set(8, 0)), invalid, "no queues");
    assert_eq!(bad(two.len(), &set(8, 1 << 40)), invalid, "absurd queues");
    assert_eq!(bad(two.len(), &set(16, 3 << 18)), invalid, "ring not 2^k");
    assert_eq!(
        bad(two.len(), &set(16, 4096)),
        invalid,
        "ring under the floor"
    );
    assert_eq!(bad(two.len(), &set(24, 1500)), invalid, "max frame");
    // And the well-formed one attaches.
    let r = SharedRegion::create("good-wire", two.len()).unwrap();
    two.write_header(&r);
    let m = ShmMulti::attach_fd(r.fd().try_clone_to_owned().unwrap(), Default::default());
    assert_eq!(m.unwrap().queues(), 2);
}

#[test]
fn single_and_multi_attach_only_what_they_fit() {
    let m = ShmMulti::create(2, ShmOptions::default()).unwrap();
    let fd = m.region.fd().try_clone_to_owned().unwrap();
    let e = ShmWire::attach_fd(fd, ShmOptions::default()).err().unwrap();
    assert_eq!(
        e.kind(),
        io::ErrorKind::InvalidData,
        "two queues are not a ShmWire"
    );
    let w = ShmWire::create(ShmOptions::default()).unwrap();
    let fd = w.q.region.fd().try_clone_to_owned().unwrap();
    let m = ShmMulti::attach_fd(fd, ShmOptions::default()).unwrap();
    assert_eq!(m.queues(), 1, "a ShmWire is the one-queue ShmMulti");
}

#[test]
fn a_side_held_by_another_live_process_is_refused() {
    let m = ShmMulti::create(2, ShmOptions::default()).unwrap();
    // Process 1 (init) always exists.
    Geometry::pid(&m.region, 1).store(1, Ordering::SeqCst);
    let fd = m.region.fd().try_clone_to_owned().unwrap();
    let e = ShmMulti::attach_fd(fd, ShmOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
}

#[test]
fn queues_declare_the_queue_count_and_their_index() {
    let (a, b) = multi(3, 1 << 20);
    for (i, q) in a.iter().chain(&b).enumerate() {
        assert_eq!(q.caps().queues, 3);
        assert_eq!(q.index(), i % 3);
        assert_eq!(q.side(), i / 3);
        assert_eq!(q.queues(), 3);
        assert_eq!(
            q.ring_capacity(),
            MIN_RING_BYTES,
            "1 MiB / 9 is under the floor"
        );
    }
}

/// Ring memory per direction is split over n² rings, with a floor; the region follows.
#[test]
fn region_size_follows_the_ring_budget() {
    let mib = 1 << 20;
    for (n, ring, region) in [
        (1, 16 * mib, 32 * mib),
        (2, 4 * mib, 32 * mib),
        (4, mib, 32 * mib),
    ] {
        let m = ShmMulti::create(n, ShmOptions::default()).unwrap();
        assert_eq!(m.ring_capacity(), ring, "n {n}");
        let rings = 2 * n * n;
        assert_eq!(
            m.region_bytes(),
            4096 + rings * (ring + 192),
            "n {n}: about {region}"
        );
    }
}

/// A peer that corrupts one ring of the mesh takes every queue of this side down, not only
/// the one that found it.
#[test]
fn a_corrupt_ring_in_the_mesh_takes_the_whole_side_down() {
    let (mut a, mut b) = multi(2, 1 << 20);
    let g = Geometry::new(2, 1 << 20).unwrap();
    let view = peer_view(&a[0]);
    // Ring from A's engine 1 to B's queue 1: a length word beyond the ring, published.
    let ring = g.ring(0, 1, 1);
    view.atomic_u32(ring.offset + 192)
        .unwrap()
        .store(0x00ff_ffff, Ordering::SeqCst);
    view.atomic_u64(ring.offset)
        .unwrap()
        .store(64, Ordering::SeqCst);
    assert!(b.iter().all(|q| !q.link_down()));
    assert_eq!(b[0].recv_batch(Instant::ZERO, 10, &mut |_| panic!()), 0);
    assert!(!b[0].link_down(), "queue 0's rings are fine");
    assert_eq!(b[1].recv_batch(Instant::ZERO, 10, &mut |_| panic!()), 0);
    assert_eq!(b[1].stats().corrupt, 1);
    assert!(b.iter().all(|q| q.link_down()), "the whole side is down");
    assert!(
        a.iter().all(|q| !q.link_down()),
        "the other side did not see it"
    );
    // A consumer index the producer cannot have let it reach (the ring from A's engine 0 to
    // B's queue 0, where frames without a hash go): the producer refuses to trust it once it
    // needs the consumer's tail, i.e. once the frames outgrow the space it knew was free.
    let q0 = g.ring(0, 0, 0);
    view.atomic_u64(q0.offset + 64)
        .unwrap()
        .store(1 << 40, Ordering::SeqCst);
    let mut batch = TxBatch::new();
    for _ in 0..20 {
        batch.push(65000).fill(0);
    }
    a[0].send_batch(Instant::ZERO, &batch);
    assert!(a[0].stats().corrupt >= 1);
    assert!(a.iter().all(|q| q.link_down()));
}

/// A queue that sleeps and finds the peer process gone reports the link down.
#[test]
fn a_dead_peer_takes_every_queue_down() {
    let (mut a, _b) = multi(2, 1 << 20);
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let dead = c.id();
    c.wait().unwrap();
    Geometry::pid(&a[0].region, 1).store(dead, Ordering::SeqCst);
    // A wait whose spin outlasts its timeout (a preempted spin, on a loaded machine) ends
    // without sleeping; only a sleep looks at the peer. Bounded retries until one sleeps.
    for _ in 0..1000 {
        a[1].wait(Duration::from_millis(2));
        if a[1].stats().sleeps > 0 {
            break;
        }
    }
    assert_eq!(a[1].stats().sleeps, 1, "one wait slept");
    assert!(a.iter().all(|q| q.link_down()));
}

/// Every peer engine feeding one queue gets its turn first: with all n rings full and a small
/// budget, successive batches start at successive rings.
#[test]
fn a_queue_drains_its_rings_round_robin_within_the_budget() {
    let (mut a, mut b) = multi(3, 1 << 20);
    // ARP-like frames (no IPv4): no hash, so every engine's frames go to queue 0.
    for (i, q) in a.iter_mut().enumerate() {
        let mut batch = TxBatch::new();
        for k in 0..20u8 {
            let f = batch.push(60);
            f.fill(0);
            f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
            f[20] = i as u8;
            f[21] = k;
        }
        assert_eq!(q.send_batch(Instant::ZERO, &batch), 20);
    }
    let mut firsts = Vec::new();
    let mut per = [0u8; 3];
    for _ in 0..6 {
        let mut first = None;
        let n = b[0].recv_batch(Instant::ZERO, 5, &mut |f| {
            first.get_or_insert(f[20]);
            let s = f[20] as usize;
            assert_eq!(f[21], per[s], "in order per sender");
            per[s] += 1;
        });
        assert_eq!(n, 5, "the budget holds");
        firsts.push(first.unwrap());
    }
    assert_eq!(firsts, [0, 1, 2, 0, 1, 2]);
    assert_eq!(per, [10, 10, 10]);
    // A budget larger than one ring's backlog moves on to the next ring in the same batch.
    assert_eq!(b[0].recv_batch(Instant::ZERO, 25, &mut |_| {}), 25);
    assert_eq!(b[0].recv_batch(Instant::ZERO, 25, &mut |_| {}), 5);
    assert_eq!(b[0].stats().rx_frames, 60);
    assert!(b[1..].iter().all(|q| q.stats().rx_frames == 0));
}
