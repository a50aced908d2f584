//! Model checking of the ring's and the bell's wake-up protocol with `loom`
//! (`scripts/loom.sh`: `RUSTFLAGS="--cfg loom" cargo test -p flowstack-sys --lib loom`).
//!
//! The code under test is the ring's own ([`Producer`], [`Consumer`], [`Bell`]): under
//! `--cfg loom` its atomics, fences and futex calls are loom's (`crate::sync`), so loom runs
//! every interleaving of the threads below (up to a preemption bound) and every value a load
//! may return under the memory model. A lost wake-up leaves a side asleep with nobody left to
//! wake it: loom reports that as a deadlock and the model fails. A wait's timeout is never
//! taken under loom (see `crate::sync::futex`), so no timeout can hide a lost wake-up.

use super::*;
use loom::thread;

/// Long enough to mean "until woken"; under loom the timeout is never taken anyway.
const FOREVER: Duration = Duration::from_secs(3600);

/// Runs `f` under loom with at most `preemptions` preemptions per execution; reports (and
/// checks) how many executions loom explored.
fn check(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.check(move || {
        counted.fetch_add(1, Relaxed);
        f()
    });
    let runs = runs.load(Relaxed);
    eprintln!("loom explored {runs} executions (preemption bound {preemptions})");
    assert!(runs > 1, "a model with one execution checks nothing");
}

/// A region holding `rings` rings of 64 bytes (records up to `max` bytes) and a bell after
/// them, with loom's control blocks in place.
fn region(rings: usize, max: usize) -> (Arc<SharedRegion>, Vec<RingLayout>, usize) {
    let stride = ring_bytes(MIN_CAPACITY).next_multiple_of(RING_ALIGN);
    let bell_at = rings * stride;
    let r = Arc::new(SharedRegion::create("loom-ring", bell_at + BELL_BYTES).unwrap());
    let layouts: Vec<_> = (0..rings)
        .map(|i| RingLayout {
            offset: i * stride,
            capacity: MIN_CAPACITY,
            max_record: max,
        })
        .collect();
    for l in &layouts {
        loom_init(&r, l.offset);
    }
    bell::loom_init(&r, bell_at);
    (r, layouts, bell_at)
}

/// Pushes `rec`, waiting for room while the ring is full.
fn push_waiting(p: &mut Producer, rec: &[u8]) {
    loop {
        match p.push(rec) {
            Ok(()) => return,
            Err(RingError::Full) => {
                p.wait_room(rec.len(), Duration::ZERO, FOREVER).unwrap();
            }
            Err(e) => panic!("push: {e}"),
        }
    }
}

/// One producer publishes three records one by one; the consumer drains and sleeps whenever
/// the ring is empty. Every record arrives, in order, and the consumer never sleeps forever.
#[test]
fn loom_spsc_consumer_sleeps_and_every_record_arrives() {
    check(3, || {
        let (r, l, _) = region(1, 8);
        let mut p = Producer::new(r.clone(), l[0]).unwrap();
        let mut c = Consumer::new(r, l[0]).unwrap();
        let t = thread::spawn(move || {
            for i in 0..3u8 {
                p.push(&[i]).unwrap();
                p.publish();
            }
        });
        let mut got = Vec::new();
        loop {
            c.recv(usize::MAX, |rec| got.push(rec[0])).unwrap();
            if got.len() == 3 {
                break;
            }
            c.wait(Duration::ZERO, FOREVER);
        }
        t.join().unwrap();
        assert_eq!(got, [0, 1, 2]);
    });
}

/// A ring that holds two 24-byte records: the producer sends four, sleeping for room when it
/// is full, while the consumer takes one record at a time and sleeps when it is empty. Both
/// directions of the protocol at once; nobody sleeps forever and nothing is lost.
#[test]
fn loom_full_ring_producer_sleeps_for_room() {
    check(3, || {
        let (r, l, _) = region(1, 20);
        let mut p = Producer::new(r.clone(), l[0]).unwrap();
        let mut c = Consumer::new(r, l[0]).unwrap();
        let t = thread::spawn(move || {
            for i in 0..4u8 {
                push_waiting(&mut p, &[i; 20]);
                p.publish();
            }
        });
        let mut got = Vec::new();
        loop {
            c.recv(1, |rec| {
                assert_eq!(rec.len(), 20);
                got.push(rec[0]);
            })
            .unwrap();
            if got.len() == 4 {
                break;
            }
            if !c.pending() {
                c.wait(Duration::ZERO, FOREVER);
            }
        }
        t.join().unwrap();
        assert_eq!(got, [0, 1, 2, 3]);
    });
}

/// Two producers, each on its own ring, ring one bell; the consumer drains both rings and
/// sleeps on the bell when both are empty. Every record arrives; nobody sleeps forever.
#[test]
fn loom_bell_two_producers_one_consumer() {
    check(2, || {
        let (r, l, bell_at) = region(2, 8);
        let mut rings = Vec::new();
        let mut threads = Vec::new();
        for (k, layout) in l.iter().enumerate() {
            rings.push(Consumer::new(r.clone(), *layout).unwrap());
            let mut p = Producer::new(r.clone(), *layout).unwrap();
            let bell = Bell::new(r.clone(), bell_at).unwrap();
            threads.push(thread::spawn(move || {
                for i in 0..2u8 {
                    p.push(&[k as u8, i]).unwrap();
                    p.publish_with(&bell);
                }
            }));
        }
        let bell = Bell::new(r, bell_at).unwrap();
        let mut got = [Vec::new(), Vec::new()];
        loop {
            for (k, c) in rings.iter_mut().enumerate() {
                c.recv(usize::MAX, |rec| {
                    assert_eq!(rec[0] as usize, k);
                    got[k].push(rec[1]);
                })
                .unwrap();
            }
            if got.iter().all(|g| g.len() == 2) {
                break;
            }
            bell.wait(&rings, Duration::ZERO, FOREVER);
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(got, [[0, 1], [0, 1]]);
    });
}

/// Quiet publishing (the daemon's send-credit events): the producer publishes a record
/// without waking, then wakes only if a flag says the consumer wants such records; the
/// consumer sets the flag before it sleeps. The record is never stranded with the consumer
/// asleep: either the consumer sees it before sleeping or the producer sees the flag and wakes.
#[test]
fn loom_quiet_publish_wakes_a_consumer_that_asked() {
    check(3, || {
        let (r, l, _) = region(1, 8);
        let want = Arc::new(crate::sync::AtomicU32::new(0));
        let mut p = Producer::new(r.clone(), l[0]).unwrap();
        let mut c = Consumer::new(r, l[0]).unwrap();
        let w = want.clone();
        let t = thread::spawn(move || {
            p.push(&[7]).unwrap();
            if p.publish_quiet() && w.load(crate::sync::Ordering::SeqCst) != 0 {
                p.wake();
            }
        });
        want.store(1, crate::sync::Ordering::SeqCst);
        let mut got = Vec::new();
        loop {
            c.recv(usize::MAX, |rec| got.push(rec[0])).unwrap();
            if !got.is_empty() {
                break;
            }
            c.wait(Duration::ZERO, FOREVER);
        }
        t.join().unwrap();
        assert_eq!(got, [7]);
    });
}

/// The offload daemon's wake-up of an application asleep on its wake-up pair (the shim's
/// epoll fast path, `flowstack_client::posix` fast module and `offload::app::notify`): the
/// consumer counts itself in `sleepers`, fences and checks the ring once more before it
/// sleeps in the kernel on the pair (modelled as a futex on a token count: level-triggered,
/// it sleeps only while no token arrived since it last drained); the producer publishes,
/// fences (in `publish_quiet`), and writes a token if it sees a sleeper. Neither the ring's
/// own futex nor its `waiting` flag is used: only this protocol can wake the consumer.
#[test]
fn loom_wake_pair_sleeper_is_woken_after_a_publish() {
    use crate::sync::{fence, futex, AtomicU32, Ordering::SeqCst};
    check(3, || {
        let (r, l, _) = region(1, 8);
        let sleepers = Arc::new(AtomicU32::new(0));
        let tokens = Arc::new(AtomicU32::new(0));
        let mut p = Producer::new(r.clone(), l[0]).unwrap();
        let mut c = Consumer::new(r, l[0]).unwrap();
        let (s, t) = (sleepers.clone(), tokens.clone());
        let th = thread::spawn(move || {
            for v in [1u8, 2] {
                p.push(&[v]).unwrap();
                if p.publish_quiet() && s.load(SeqCst) != 0 {
                    t.fetch_add(1, SeqCst);
                    futex::wake(&t, 1);
                }
            }
        });
        let mut got = Vec::new();
        let mut drained = 0;
        while got.len() < 2 {
            c.recv(usize::MAX, |rec| got.push(rec[0])).unwrap();
            if got.len() == 2 {
                break;
            }
            sleepers.fetch_add(1, SeqCst);
            fence(SeqCst);
            if !c.pending() {
                while tokens.load(SeqCst) == drained {
                    futex::wait(&tokens, drained, Some(FOREVER));
                }
            }
            sleepers.fetch_sub(1, SeqCst);
            drained = tokens.load(SeqCst);
        }
        th.join().unwrap();
        assert_eq!(got, [1, 2]);
    });
}

/// The same wake-up with one channel write per sleep (`crate::wake::should_signal` and
/// `crate::wake::drained`, the header's `woken` word): the producer writes a token only when
/// it turns `woken` from 0 to 1; the consumer, once awake, reads the tokens dry and only then
/// clears `woken`. Three records, so the consumer sleeps and wakes more than once and a
/// stale `woken` (set, with its token already taken) would show up as a deadlock.
#[test]
fn loom_wake_pair_one_write_per_sleep() {
    use crate::sync::{fence, futex, AtomicU32, Ordering::SeqCst};
    use crate::wake::{drained, should_signal};
    check(3, || {
        let (r, l, _) = region(1, 8);
        let sleepers = Arc::new(AtomicU32::new(0));
        let woken = Arc::new(AtomicU32::new(0));
        let tokens = Arc::new(AtomicU32::new(0));
        let mut p = Producer::new(r.clone(), l[0]).unwrap();
        let mut c = Consumer::new(r, l[0]).unwrap();
        let (s, w, t) = (sleepers.clone(), woken.clone(), tokens.clone());
        let th = thread::spawn(move || {
            for v in [1u8, 2, 3] {
                p.push(&[v]).unwrap();
                if p.publish_quiet() && should_signal(&s, &w, true) {
                    t.fetch_add(1, SeqCst);
                    futex::wake(&t, 1);
                }
            }
        });
        let mut got = Vec::new();
        let mut drained_to = 0;
        while got.len() < 3 {
            c.recv(usize::MAX, |rec| got.push(rec[0])).unwrap();
            if got.len() == 3 {
                break;
            }
            sleepers.fetch_add(1, SeqCst);
            fence(SeqCst);
            let mut slept = false;
            if !c.pending() {
                while tokens.load(SeqCst) == drained_to {
                    futex::wait(&tokens, drained_to, Some(FOREVER));
                }
                slept = true;
            }
            sleepers.fetch_sub(1, SeqCst);
            if slept || tokens.load(SeqCst) != drained_to {
                // The channel was seen readable: read it dry, then clear.
                drained_to = tokens.load(SeqCst);
                drained(&woken);
            }
        }
        th.join().unwrap();
        assert_eq!(got, [1, 2, 3]);
    });
}
