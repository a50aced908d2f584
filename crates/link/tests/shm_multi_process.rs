//! The multi-queue shm wire between two real processes: this test binary re-runs itself as the
//! peer (the `peer_process` test, which does nothing unless the parent names the descriptor).

use flowstack_link::shm::{ShmMulti, ShmOptions, ShmQueue};
use flowstack_link::{Device, Instant, TxBatch};
use flowstack_wire::rss::{queue_of, Toeplitz};
use flowstack_wire::Duration;
use std::process::{Command, Stdio};

const NOW: Instant = Instant::ZERO;
const FD_VAR: &str = "FLOWSTACK_SHM_MULTI_PEER_FD";
const QUEUES: usize = 3;

fn flow_frame(batch: &mut TxBatch, k: u16) {
    let f = batch.push(14 + 20 + 8 + 4);
    f.fill(0);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&(20u16 + 8 + 4).to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[34..36].copy_from_slice(&(10_000 + k).to_be_bytes());
    f[36..38].copy_from_slice(&80u16.to_be_bytes());
    f[42..44].copy_from_slice(&k.to_be_bytes());
}

fn queue_of_frame(t: &Toeplitz, f: &[u8]) -> usize {
    queue_of(t.hash_frame(f).expect("a UDP frame"), QUEUES)
}

/// Swaps source and destination (addresses and ports): the reply of a flow.
fn reverse(f: &mut [u8]) {
    let (src, dst) = f[26..34].split_at_mut(4);
    src.swap_with_slice(dst);
    let (sport, dport) = f[34..38].split_at_mut(2);
    sport.swap_with_slice(dport);
}

/// The peer process: one thread per queue, each echoing every frame back reversed, until the
/// link goes down or 60 s pass. Does nothing when run as an ordinary test.
#[test]
fn peer_process() {
    let Ok(fd) = std::env::var(FD_VAR) else {
        return;
    };
    let m = ShmMulti::attach(fd.parse().unwrap(), ShmOptions::default()).unwrap();
    assert_eq!(m.queues(), QUEUES);
    let threads: Vec<_> = m
        .into_queues()
        .into_iter()
        .map(|mut q| {
            std::thread::spawn(move || {
                let t = Toeplitz::symmetric();
                let start = std::time::Instant::now();
                let mut batch = TxBatch::new();
                while !q.link_down() && start.elapsed() < std::time::Duration::from_secs(60) {
                    batch.clear();
                    let me = q.index();
                    q.recv_batch(NOW, 32, &mut |f| {
                        assert_eq!(queue_of_frame(&t, f), me);
                        let out = batch.push(f.len());
                        out.copy_from_slice(f);
                        reverse(out);
                    });
                    if batch.is_empty() {
                        q.wait(Duration::from_millis(100));
                    } else {
                        assert_eq!(q.send_batch(NOW, &batch), batch.len());
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Frames of many flows cross to the peer process, which echoes each from the queue it
/// landed on; every reply comes back on the same queue index. When the peer process dies,
/// every queue of this side reports the link down.
#[test]
fn two_processes_echo_on_every_queue_and_see_the_peer_die() {
    let m = ShmMulti::create(QUEUES, ShmOptions::default()).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_process", "--nocapture", "--test-threads=1"])
        .env(FD_VAR, m.raw_fd().to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut queues: Vec<ShmQueue> = m.into_queues();
    let t = Toeplitz::symmetric();
    const FLOWS: u16 = 600;
    let mut batch = TxBatch::new();
    // Engine k % QUEUES sends flow k, wherever it hashes.
    let mut expect = [0usize; QUEUES];
    for k in 0..FLOWS {
        batch.clear();
        flow_frame(&mut batch, k);
        let f = batch.iter().next().unwrap();
        expect[queue_of_frame(&t, f)] += 1;
        assert_eq!(queues[k as usize % QUEUES].send_batch(NOW, &batch), 1);
    }
    let mut got = [0usize; QUEUES];
    let start = std::time::Instant::now();
    while got != expect {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "echoes {got:?} of {expect:?}"
        );
        for q in queues.iter_mut() {
            let me = q.index();
            let n = q.recv_batch(NOW, 64, &mut |f| {
                assert_eq!(
                    queue_of_frame(&t, f),
                    me,
                    "the reply's queue is the request's"
                );
                assert_eq!(&f[26..30], &[10, 0, 0, 2], "reversed by the peer");
            });
            got[me] += n;
            if n == 0 {
                q.wait(Duration::from_millis(1));
            }
        }
    }
    assert!(
        expect.iter().all(|&e| e > 0),
        "every queue carried flows: {expect:?}"
    );
    assert!(queues.iter().all(|q| !q.link_down()));
    child.kill().unwrap();
    child.wait().unwrap();
    for q in queues.iter_mut() {
        for _ in 0..500 {
            if q.link_down() {
                break;
            }
            q.wait(Duration::from_millis(10));
        }
        assert!(q.link_down(), "queue {} saw its peer die", q.index());
    }
}
