use super::*;

const CAP: usize = 1 << 16;

fn layout(offset: usize) -> RingLayout {
    RingLayout {
        offset,
        capacity: CAP,
        max_record: 9000,
    }
}

fn region() -> Arc<SharedRegion> {
    Arc::new(SharedRegion::create("ring-test", 4096 + ring_bytes(CAP)).unwrap())
}

/// A producer and a consumer on one ring, through two separate mappings of the memfd (as two
/// processes would have them).
fn pair() -> (Producer, Consumer, Arc<SharedRegion>) {
    let r = region();
    let other = Arc::new(SharedRegion::from_fd(r.fd().try_clone_to_owned().unwrap()).unwrap());
    let p = Producer::new(r.clone(), layout(4096)).unwrap();
    let c = Consumer::new(other, layout(4096)).unwrap();
    (p, c, r)
}

fn drain(c: &mut Consumer) -> Result<Vec<Vec<u8>>, RingError> {
    let mut out = Vec::new();
    c.recv(usize::MAX, |r| out.push(r.to_vec()))?;
    Ok(out)
}

/// The word at byte `at` of the data area (after the control block at 4096).
fn data_word(r: &SharedRegion, at: usize) -> &AtomicU32 {
    r.atomic_u32(4096 + CTL_BYTES + at).unwrap()
}

fn head(r: &SharedRegion) -> &AtomicU64 {
    r.atomic_u64(4096).unwrap()
}

fn tail(r: &SharedRegion) -> &AtomicU64 {
    r.atomic_u64(4096 + 64).unwrap()
}

#[test]
fn records_cross_in_order_across_wrap_around_at_every_offset() {
    let (mut p, mut c, _r) = pair();
    let mut next = 0u32;
    let mut got = 0u32;
    for round in 0..3000u32 {
        for k in 0..5u32 {
            let i = round * 5 + k;
            let len = 4 + (i * 977 % 3000) as usize;
            p.push_with(len, |b| {
                b[..4].copy_from_slice(&i.to_be_bytes());
                b[4..].fill(i as u8);
            })
            .unwrap();
            next += 1;
        }
        assert!(p.unpublished() > 0);
        p.publish();
        assert_eq!(p.unpublished(), 0);
        let n = c
            .recv(1000, |rec| {
                assert_eq!(u32::from_be_bytes(rec[..4].try_into().unwrap()), got);
                assert!(rec[4..].iter().all(|&b| b == got as u8));
                assert_eq!(rec.len(), 4 + (got * 977 % 3000) as usize);
                got += 1;
            })
            .unwrap();
        assert_eq!(n, 5);
    }
    assert_eq!(got, next);
    assert!(!c.pending());
}

#[test]
fn nothing_is_visible_before_publish() {
    let (mut p, mut c, _r) = pair();
    p.push(b"one").unwrap();
    p.push(b"").unwrap();
    assert!(!c.pending());
    assert_eq!(drain(&mut c).unwrap().len(), 0);
    assert!(!p.publish(), "nobody waits: no wake-up");
    assert!(c.pending());
    assert_eq!(drain(&mut c).unwrap(), vec![b"one".to_vec(), vec![]]);
    assert!(!p.publish(), "nothing new: no store");
}

#[test]
fn budget_limits_a_batch() {
    let (mut p, mut c, _r) = pair();
    for i in 0..10u8 {
        p.push(&[i]).unwrap();
    }
    p.publish();
    let mut seen = Vec::new();
    assert_eq!(c.recv(4, |r| seen.push(r[0])).unwrap(), 4);
    assert_eq!(c.recv(100, |r| seen.push(r[0])).unwrap(), 6);
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
}

#[test]
fn full_ring_refuses_then_recovers() {
    let (mut p, mut c, _r) = pair();
    let rec = vec![7u8; 9000];
    let mut pushed = 0;
    while p.push(&rec).is_ok() {
        pushed += 1;
    }
    assert_eq!(pushed, CAP / record_bytes(9000));
    assert_eq!(p.push(&rec), Err(RingError::Full));
    p.publish();
    assert_eq!(drain(&mut c).unwrap().len(), pushed);
    for _ in 0..pushed {
        p.push(&rec).unwrap();
    }
    p.publish();
    assert_eq!(drain(&mut c).unwrap().len(), pushed);
}

#[test]
fn too_large_is_refused_and_fill_not_called() {
    let (mut p, _c, _r) = pair();
    assert_eq!(
        p.push_with(9001, |_| panic!("not called")),
        Err(RingError::TooLarge {
            len: 9001,
            max: 9000
        })
    );
    assert_eq!(p.unpublished(), 0);
}

#[test]
fn layout_errors() {
    let r = region();
    let bad = |l: RingLayout| Producer::new(r.clone(), l).err().unwrap();
    let ok = layout(4096);
    assert!(matches!(
        bad(RingLayout {
            capacity: 3000,
            ..ok
        }),
        RingError::Layout(_)
    ));
    assert!(matches!(
        bad(RingLayout {
            capacity: 32,
            max_record: 8,
            ..ok
        }),
        RingError::Layout(_)
    ));
    assert!(matches!(
        bad(RingLayout {
            offset: 4096 + 8,
            ..ok
        }),
        RingError::Layout(_)
    ));
    assert!(matches!(
        bad(RingLayout { offset: 8192, ..ok }),
        RingError::Layout(_)
    ));
    assert!(matches!(
        bad(RingLayout {
            offset: usize::MAX - 63,
            ..ok
        }),
        RingError::Layout(_)
    ));
    assert!(matches!(
        bad(RingLayout {
            max_record: CAP,
            ..ok
        }),
        RingError::Layout(_)
    ));
    assert!(Consumer::new(r.clone(), ok).is_ok());
}

#[test]
fn corrupt_head_is_an_error() {
    let (mut p, mut c, r) = pair();
    p.push(b"x").unwrap();
    p.publish();
    for bad in [CAP as u64 + 8, 4, u64::MAX - 7] {
        head(&r).store(bad, Ordering::SeqCst);
        let e = c.recv(10, |_| panic!("nothing delivered")).unwrap_err();
        assert!(
            matches!(
                e,
                RingError::Corrupt {
                    what: "producer head",
                    ..
                }
            ),
            "{e}"
        );
    }
}

#[test]
fn corrupt_lengths_are_errors_and_good_records_before_them_get_through() {
    for (bad, what) in [
        (9001u32, "too large"),
        (600, "past the published head"),
        (SKIP - 1, "huge"),
    ] {
        let (mut p, mut c, r) = pair();
        p.push(b"good").unwrap();
        p.push(&[0u8; 500]).unwrap();
        p.publish();
        data_word(&r, record_bytes(4)).store(bad, Ordering::SeqCst);
        let mut seen = Vec::new();
        let e = c.recv(10, |rec| seen.push(rec.to_vec())).unwrap_err();
        assert_eq!(seen, vec![b"good".to_vec()], "{what}");
        assert!(
            matches!(
                e,
                RingError::Corrupt {
                    what: "record length",
                    ..
                }
            ),
            "{what}: {e}"
        );
        assert_eq!(
            tail(&r).load(Ordering::SeqCst),
            record_bytes(4) as u64,
            "good one released"
        );
        assert!(c.recv(10, |_| panic!()).is_err(), "stays stuck: {what}");
    }
}

#[test]
fn record_running_past_the_end_of_the_ring_is_an_error() {
    let (mut p, mut c, r) = pair();
    // Fill up to 16 bytes before the end, consume, then publish one small record there and
    // claim it is 100 bytes long.
    let big = CAP - 16 - 8 * record_bytes(8000);
    for _ in 0..8 {
        p.push(&[0; 8000]).unwrap();
    }
    p.push(&vec![0; big - 4]).unwrap();
    p.publish();
    drain(&mut c).unwrap();
    p.push(b"0123456789").unwrap(); // 16 bytes, to the end exactly
    p.push(b"x").unwrap(); // wraps to the start
    p.publish();
    data_word(&r, CAP - 16).store(100, Ordering::SeqCst);
    let e = c.recv(10, |_| panic!()).unwrap_err();
    assert!(
        matches!(
            e,
            RingError::Corrupt {
                what: "record length",
                value: 100
            }
        ),
        "{e}"
    );
}

#[test]
fn skip_marker_past_head_is_an_error() {
    let (mut p, mut c, r) = pair();
    p.push(b"a").unwrap();
    p.publish();
    drain(&mut c).unwrap();
    p.push(b"b").unwrap();
    p.publish();
    data_word(&r, 8).store(SKIP, Ordering::SeqCst);
    let e = c.recv(10, |_| panic!()).unwrap_err();
    assert!(
        matches!(
            e,
            RingError::Corrupt {
                what: "skip marker past the published head",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn corrupt_tail_is_an_error_for_the_producer() {
    let (mut p, _c, r) = pair();
    let rec = vec![0u8; 9000];
    while p.push(&rec).is_ok() {}
    p.publish();
    // The consumer claims to have read past what was published.
    tail(&r).store(CAP as u64 + 8, Ordering::SeqCst);
    assert!(matches!(
        p.push(&rec),
        Err(RingError::Corrupt {
            what: "consumer tail",
            ..
        })
    ));
    // ... or to have gone backwards.
    let (mut p, mut c, r) = pair();
    while p.push(&rec).is_ok() {}
    p.publish();
    c.recv(2, |_| {}).unwrap();
    p.push(&rec).unwrap(); // re-reads the tail: two records' space is free
    tail(&r).store(0, Ordering::SeqCst);
    p.push(&rec).unwrap(); // fits in the space already known free: no re-read
    assert!(matches!(
        p.push(&rec),
        Err(RingError::Corrupt {
            what: "consumer tail",
            value: 0
        })
    ));
}

#[test]
fn attaching_to_a_corrupt_ring_is_an_error() {
    let r = region();
    head(&r).store(CAP as u64 * 2, Ordering::SeqCst);
    assert!(matches!(
        Producer::new(r.clone(), layout(4096)),
        Err(RingError::Corrupt { .. })
    ));
    assert!(matches!(
        Consumer::new(r.clone(), layout(4096)),
        Err(RingError::Corrupt { .. })
    ));
    head(&r).store(0, Ordering::SeqCst);
    tail(&r).store(3, Ordering::SeqCst);
    assert!(matches!(
        Consumer::new(r.clone(), layout(4096)),
        Err(RingError::Corrupt { .. })
    ));
}

#[test]
fn a_new_side_continues_where_the_old_one_stopped() {
    let (mut p, mut c, r) = pair();
    p.push(b"1").unwrap();
    p.push(b"2").unwrap();
    p.publish();
    c.recv(1, |_| {}).unwrap();
    drop((p, c));
    let mut p = Producer::new(r.clone(), layout(4096)).unwrap();
    let mut c = Consumer::new(r.clone(), layout(4096)).unwrap();
    p.push(b"3").unwrap();
    p.publish();
    assert_eq!(drain(&mut c).unwrap(), vec![b"2".to_vec(), b"3".to_vec()]);
}

/// A hostile peer scribbling over the whole ring: the consumer reports errors or delivers
/// records, never panics, and every record lies inside the ring's data area.
#[test]
fn garbage_never_panics_or_escapes_the_ring() {
    let r = region();
    let mut c = Consumer::new(r.clone(), layout(4096)).unwrap();
    let lo = r.as_ptr() as usize + 4096 + CTL_BYTES;
    let hi = lo + CAP;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut ok, mut bad) = (0, 0);
    for _ in 0..20_000 {
        // Scribble a few words, sometimes plausible lengths, sometimes the skip marker.
        for _ in 0..8 {
            let at = (rand() as usize % (CAP / 4)) * 4;
            let v = match rand() % 4 {
                0 => SKIP,
                1 => (rand() % 64) as u32,
                2 => (rand() % 10_000) as u32,
                _ => rand() as u32,
            };
            data_word(&r, at).store(v, Ordering::Relaxed);
        }
        let t = tail(&r).load(Ordering::Relaxed);
        let h: u64 = match rand() % 3 {
            0 => t + (rand() % 256) * 8,
            1 => t + rand() % (2 * CAP as u64),
            _ => rand(),
        };
        head(&r).store(h, Ordering::Relaxed);
        match c.recv(64, |rec| {
            let s = rec.as_ptr() as usize;
            assert!(s >= lo && s + rec.len() <= hi, "record outside the ring");
            assert!(rec.len() <= 9000);
        }) {
            Ok(_) => ok += 1,
            Err(RingError::Corrupt { .. }) => {
                bad += 1;
                // A new consumer resynchronises at the head, as a restarted peer would.
                head(&r).store(tail(&r).load(Ordering::Relaxed), Ordering::Relaxed);
                c = Consumer::new(r.clone(), layout(4096)).unwrap();
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(ok > 0 && bad > 0, "both paths taken: ok {ok} bad {bad}");
}

#[test]
fn wait_spins_out_or_sleeps_and_times_out() {
    let (_p, c, _r) = pair();
    assert_eq!(
        c.wait(Duration::from_millis(2), Duration::from_millis(1)),
        Waited::SpunOut
    );
    let t = std::time::Instant::now();
    assert_eq!(
        c.wait(Duration::ZERO, Duration::from_millis(10)),
        Waited::Slept
    );
    assert!(t.elapsed() >= Duration::from_millis(10));
}

#[test]
fn wait_returns_ready_when_records_wait() {
    let (mut p, c, _r) = pair();
    p.push(b"x").unwrap();
    p.publish();
    assert_eq!(
        c.wait(Duration::from_millis(1), Duration::from_secs(5)),
        Waited::Ready
    );
    assert_eq!(
        c.wait(Duration::ZERO, Duration::from_secs(5)),
        Waited::Ready
    );
}

#[test]
fn publish_wakes_a_sleeping_consumer() {
    let (mut p, mut c, _r) = pair();
    let t = std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let mut got = Vec::new();
        while got.is_empty() && start.elapsed() < Duration::from_secs(20) {
            c.wait(Duration::ZERO, Duration::from_secs(20));
            c.recv(10, |r| got.push(r.to_vec())).unwrap();
        }
        (got, start.elapsed())
    });
    // Publish only once the consumer has announced that it sleeps.
    let start = std::time::Instant::now();
    let waiting = p.raw.ctl();
    while waiting.waiting.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(5));
    p.push(b"wake").unwrap();
    assert!(p.publish(), "the sleeper was woken");
    let (got, took) = t.join().unwrap();
    assert_eq!(got, vec![b"wake".to_vec()]);
    assert!(took < Duration::from_secs(10), "woken, not timed out");
}

/// Producer and consumer on two threads through two mappings, the consumer sleeping whenever it
/// runs dry: every record arrives, in order, and no wake-up is lost (a lost one would leave the
/// consumer asleep for its full 10 s timeout and fail the time bound).
#[test]
fn threads_stream_through_with_sleeps_and_no_lost_wakeups() {
    let (mut p, mut c, _r) = pair();
    const N: u32 = 200_000;
    let consumer = std::thread::spawn(move || {
        let mut next = 0u32;
        let start = std::time::Instant::now();
        while next < N {
            c.recv(256, |r| {
                assert_eq!(u32::from_ne_bytes(r[..4].try_into().unwrap()), next);
                next += 1;
            })
            .unwrap();
            if next < N && !c.pending() {
                c.wait(Duration::ZERO, Duration::from_secs(10));
            }
            assert!(
                start.elapsed() < Duration::from_secs(9),
                "stalled at {next}"
            );
        }
    });
    let mut i = 0u32;
    while i < N {
        let burst = 1 + i % 7;
        for _ in 0..burst.min(N - i) {
            let len = 4 + (i % 61) as usize;
            match p.push_with(len, |b| b[..4].copy_from_slice(&i.to_ne_bytes())) {
                Ok(()) => i += 1,
                Err(RingError::Full) => break,
                Err(e) => panic!("{e}"),
            }
        }
        p.publish();
        if i.is_multiple_of(1000) {
            std::thread::yield_now();
        }
    }
    consumer.join().unwrap();
}

/// `k` rings of CAP bytes after one bell at 4096, producers on one mapping and consumers on
/// another (as two processes would have them).
fn bell_rings(k: usize) -> (Vec<Producer>, Vec<Consumer>, Bell, Bell, Arc<SharedRegion>) {
    let len = 8192 + k * ring_bytes(CAP);
    let a = Arc::new(SharedRegion::create("bell-test", len).unwrap());
    let b = Arc::new(SharedRegion::from_fd(a.fd().try_clone_to_owned().unwrap()).unwrap());
    let at = |i: usize| layout(8192 + i * ring_bytes(CAP));
    let p = (0..k)
        .map(|i| Producer::new(a.clone(), at(i)).unwrap())
        .collect();
    let c = (0..k)
        .map(|i| Consumer::new(b.clone(), at(i)).unwrap())
        .collect();
    let (pb, cb) = (Bell::new(a.clone(), 4096), Bell::new(b, 4096));
    (p, c, pb.unwrap(), cb.unwrap(), a)
}

#[test]
fn bell_layout_errors() {
    let r = region();
    assert!(Bell::new(r.clone(), 0).is_ok());
    assert!(Bell::new(r.clone(), 32).is_err(), "misaligned");
    assert!(Bell::new(r.clone(), r.len() - 32).is_err(), "past the end");
    assert!(Bell::new(r, usize::MAX - 10).is_err(), "overflow");
}

#[test]
fn bell_wait_sees_any_ring_and_times_out_when_none() {
    let (mut p, c, pbell, bell, _r) = bell_rings(3);
    assert_eq!(
        bell.wait(&c, Duration::from_millis(2), Duration::from_millis(1)),
        Waited::SpunOut
    );
    let t = std::time::Instant::now();
    assert_eq!(
        bell.wait(&c, Duration::ZERO, Duration::from_millis(10)),
        Waited::Slept
    );
    assert!(t.elapsed() >= Duration::from_millis(10));
    p[2].push(b"x").unwrap();
    assert!(!p[2].publish_with(&pbell), "nobody sleeps: no wake");
    assert_eq!(
        bell.wait(&c, Duration::ZERO, Duration::from_secs(5)),
        Waited::Ready
    );
    assert_eq!(
        bell.wait(&c, Duration::from_millis(1), Duration::from_secs(5)),
        Waited::Ready
    );
}

#[test]
fn publish_with_wakes_a_consumer_sleeping_on_the_bell() {
    let (mut p, mut c, pbell, bell, r) = bell_rings(2);
    let t = std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let mut got = Vec::new();
        while got.is_empty() && start.elapsed() < Duration::from_secs(20) {
            bell.wait(&c, Duration::ZERO, Duration::from_secs(20));
            for r in c.iter_mut() {
                r.recv(10, |x| got.push(x.to_vec())).unwrap();
            }
        }
        (got, start.elapsed())
    });
    let waiting = r.atomic_u32(4096).unwrap();
    let start = std::time::Instant::now();
    while waiting.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(5));
    p[1].push(b"wake").unwrap();
    assert!(p[1].publish_with(&pbell), "the sleeper was woken");
    let (got, took) = t.join().unwrap();
    assert_eq!(got, vec![b"wake".to_vec()]);
    assert!(took < Duration::from_secs(10), "woken, not timed out");
}

/// Four producer threads, one consumer draining their four rings and sleeping on the bell
/// whenever all are dry: every record arrives, in order per ring, and no wake-up is lost (a
/// lost one leaves the consumer asleep for its whole 10 s timeout, which the bound catches).
#[test]
fn many_producers_one_sleeping_consumer_lose_no_wakeup() {
    const K: usize = 4;
    const N: u32 = 50_000;
    let (ps, mut cs, pbell, bell, _r) = bell_rings(K);
    let pbell = Arc::new(pbell);
    let consumer = std::thread::spawn(move || {
        let mut next = [0u32; K];
        let start = std::time::Instant::now();
        let mut sleeps = 0u32;
        while next.iter().any(|&n| n < N) {
            for (k, c) in cs.iter_mut().enumerate() {
                let nk = &mut next[k];
                c.recv(64, |r| {
                    assert_eq!(u32::from_ne_bytes(r[..4].try_into().unwrap()), *nk);
                    *nk += 1;
                })
                .unwrap();
            }
            if next.iter().any(|&n| n < N)
                && bell.wait(&cs, Duration::ZERO, Duration::from_secs(10)) == Waited::Slept
            {
                sleeps += 1;
            }
            assert!(
                start.elapsed() < Duration::from_secs(9),
                "stalled at {next:?}"
            );
        }
        sleeps
    });
    let producers: Vec<_> = ps
        .into_iter()
        .enumerate()
        .map(|(k, mut p)| {
            let bell = pbell.clone();
            std::thread::spawn(move || {
                let mut i = 0u32;
                while i < N {
                    let burst = 1 + (i + k as u32) % 5;
                    for _ in 0..burst.min(N - i) {
                        match p.push_with(8, |b| b[..4].copy_from_slice(&i.to_ne_bytes())) {
                            Ok(()) => i += 1,
                            Err(RingError::Full) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    p.publish_with(&bell);
                    if i.is_multiple_of(64) {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let sleeps = consumer.join().unwrap();
    assert!(sleeps > 0, "the consumer slept at least once");
}

/// Three producers each send one record at a time and wait for the consumer to take it, so the
/// consumer is often asleep with every producer waiting on it: a single lost wake-up stalls
/// everyone until the consumer's 10 s timeout, which the bound catches.
#[test]
fn bell_ping_pong_loses_no_wakeup() {
    use std::sync::atomic::AtomicUsize;
    const K: usize = 3;
    const M: usize = 20_000;
    let (ps, mut cs, pbell, bell, _r) = bell_rings(K);
    let pbell = Arc::new(pbell);
    let acked: Arc<[AtomicUsize; K]> = Arc::new(Default::default());
    let consumer = {
        let acked = acked.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let (mut got, mut sleeps) = ([0usize; K], 0u32);
            while got.iter().any(|&g| g < M) {
                for (k, c) in cs.iter_mut().enumerate() {
                    got[k] += c.recv(16, |_| {}).unwrap();
                    acked[k].store(got[k], Ordering::Release);
                }
                let idle = got.iter().any(|&g| g < M);
                if idle && bell.wait(&cs, Duration::ZERO, Duration::from_secs(10)) == Waited::Slept
                {
                    sleeps += 1;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(9),
                    "stalled at {got:?}"
                );
            }
            sleeps
        })
    };
    let producers: Vec<_> = ps
        .into_iter()
        .enumerate()
        .map(|(k, mut p)| {
            let (bell, acked) = (pbell.clone(), acked.clone());
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                for i in 0..M {
                    p.push(&i.to_ne_bytes()).unwrap();
                    p.publish_with(&bell);
                    while acked[k].load(Ordering::Acquire) <= i {
                        assert!(start.elapsed() < Duration::from_secs(9), "no ack for {i}");
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let sleeps = consumer.join().unwrap();
    assert!(sleeps > 0, "the consumer slept");
}

#[test]
fn wait_room_publishes_spins_out_when_full_and_is_ready_once_drained() {
    let (mut p, mut c, _r) = pair();
    let rec = vec![3u8; 9000];
    while p.push(&rec).is_ok() {}
    assert!(!c.pending(), "nothing published yet");
    assert_eq!(
        p.wait_room(9000, Duration::ZERO, Duration::ZERO),
        Ok(Waited::SpunOut)
    );
    assert!(c.pending(), "wait_room published the batch");
    assert_eq!(
        p.wait_room(9001, Duration::ZERO, Duration::ZERO),
        Err(RingError::TooLarge {
            len: 9001,
            max: 9000
        })
    );
    assert_eq!(c.recv(1, |_| {}), Ok(1));
    assert_eq!(
        p.wait_room(9000, Duration::ZERO, Duration::from_secs(5)),
        Ok(Waited::Ready)
    );
    p.push(&rec).unwrap();
}

#[test]
fn wait_room_reports_a_corrupt_tail_and_withdraws_its_announcement() {
    let (mut p, _c, r) = pair();
    while p.push(&[1; 9000]).is_ok() {}
    tail(&r).store(12, Ordering::SeqCst);
    assert!(matches!(
        p.wait_room(9000, Duration::ZERO, Duration::from_secs(5)),
        Err(RingError::Corrupt { .. })
    ));
    assert_eq!(r.atomic_u32(4096 + 8).unwrap().load(Ordering::SeqCst), 0);
}

#[test]
fn recv_wakes_a_producer_sleeping_for_room() {
    let (mut p, mut c, r) = pair();
    let rec = vec![5u8; 9000];
    let mut pushed = 0;
    while p.push(&rec).is_ok() {
        pushed += 1;
    }
    let t = std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let mut pushed = false;
        while !pushed && start.elapsed() < Duration::from_secs(20) {
            let w = p.wait_room(9000, Duration::ZERO, Duration::from_secs(20));
            assert!(matches!(w, Ok(Waited::Ready | Waited::Slept)), "{w:?}");
            pushed = p.push(&rec).is_ok();
        }
        p.publish();
        (pushed, start.elapsed())
    });
    // Release records only once the producer has announced that it sleeps for room.
    let start = std::time::Instant::now();
    let room_waiting = r.atomic_u32(4096 + 8).unwrap();
    while room_waiting.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(c.recv(1, |_| {}), Ok(1));
    let (fit, took) = t.join().unwrap();
    assert!(fit, "room was made");
    // A lost wake-up would leave the producer asleep for its whole 20 s.
    assert!(took < Duration::from_secs(10), "woken, not timed out");
    assert_eq!(drain(&mut c).unwrap().len(), pushed);
}

/// Positions are u64 counters compared modulo 2^64: a ring left by a previous producer and
/// consumer just below 2^64 (as a hostile peer may set it, and as the fuzzer found:
/// `fuzz/corpus/ring_peer/crash-40d22e99…`, a subtraction overflow in `has_room`) carries
/// records in order across the wrap of the counters, and the ring's own wrap, without
/// overflowing (a build with overflow checks — the fuzzer's — panicked here before).
#[test]
fn records_cross_the_wrap_of_the_position_counters() {
    let r = region();
    let start = u64::MAX - 8 * 1024 + 1; // a multiple of 8, 8 KiB below 2^64
    head(&r).store(start, Ordering::SeqCst);
    tail(&r).store(start, Ordering::SeqCst);
    let other = Arc::new(SharedRegion::from_fd(r.fd().try_clone_to_owned().unwrap()).unwrap());
    let mut p = Producer::new(r.clone(), layout(4096)).unwrap();
    let mut c = Consumer::new(other, layout(4096)).unwrap();
    let mut sent = 0u32;
    let mut got = 0u32;
    for _ in 0..64 {
        for _ in 0..8 {
            let rec = vec![sent as u8; 1000 + (sent as usize % 7) * 100];
            if p.push(&rec).is_err() {
                break;
            }
            sent += 1;
        }
        p.publish();
        assert_eq!(p.unpublished(), 0);
        for rec in drain(&mut c).unwrap() {
            assert_eq!(rec, vec![got as u8; 1000 + (got as usize % 7) * 100]);
            got += 1;
        }
    }
    assert_eq!(got, sent);
    assert!(sent > 200, "the counters wrapped: {sent} records");
    assert!(head(&r).load(Ordering::SeqCst) < start, "head passed 2^64");
}
