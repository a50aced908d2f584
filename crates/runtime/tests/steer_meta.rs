//! Checksum metadata through steering: a frame its device marked `l4_csum_ok` (partial
//! TCP/UDP checksum, as a TAP hands over a packet the local kernel built) keeps the mark when
//! its own shard takes it, and is forwarded to its owner with the checksum completed (the
//! cross-shard ring carries bytes only), so the owner's engine verifies it and accepts it.

use flowstack_link::{Device, DeviceCaps, RxMeta, TxBatch};
use flowstack_runtime::steer::{Queue, Steered, Steering};
use flowstack_runtime::xring::RingSpec;
use flowstack_wire::checksum::{pseudo_header, Accumulator};
use flowstack_wire::{Instant, Ipv4Address};
use std::collections::VecDeque;

const A: Ipv4Address = Ipv4Address([10, 5, 0, 1]);
const B: Ipv4Address = Ipv4Address([10, 5, 0, 2]);

/// A UDP frame from A to B with a partial checksum (the pseudo-header sum only).
fn partial_udp(sport: u16, dport: u16) -> Vec<u8> {
    let payload = b"steered";
    let ulen = 8 + payload.len();
    let mut f = vec![0u8; 14 + 20 + ulen];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let h = &mut f[14..34];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + ulen) as u16).to_be_bytes());
    h[6] = 0x40;
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&A.0);
    h[16..20].copy_from_slice(&B.0);
    let c = flowstack_wire::checksum::checksum(h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    let u = &mut f[34..];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&(ulen as u16).to_be_bytes());
    u[6..8].copy_from_slice(&pseudo_header(A, B, 17, ulen as u32).to_be_bytes());
    u[8..].copy_from_slice(payload);
    f
}

/// True if the frame's UDP checksum verifies as a full checksum.
fn udp_checksum_ok(f: &[u8]) -> bool {
    let u = &f[34..];
    let mut acc = Accumulator::new();
    acc.add_sum(pseudo_header(A, B, 17, u.len() as u32));
    acc.add(u);
    acc.finish() == 0
}

/// Hands over its frames marked `l4_csum_ok` (partial checksums), as a TAP does.
struct Offloading(VecDeque<Vec<u8>>);

impl Device for Offloading {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::ETHERNET
    }
    fn recv_batch(&mut self, _: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(mut f) = self.0.pop_front() else {
                break;
            };
            flowstack_link::sys::complete_checksum(&mut f);
            sink(&f);
            n += 1;
        }
        n
    }
    fn recv_batch_meta(
        &mut self,
        _: Instant,
        budget: usize,
        sink: &mut dyn FnMut(&[u8], RxMeta),
    ) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(f) = self.0.pop_front() else {
                break;
            };
            sink(&f, RxMeta { l4_csum_ok: true });
            n += 1;
        }
        n
    }
    fn send_batch(&mut self, _: Instant, batch: &TxBatch) -> usize {
        batch.len()
    }
    fn rx_pending(&self, _: Instant) -> bool {
        !self.0.is_empty()
    }
}

#[test]
fn marked_frames_keep_the_mark_locally_and_are_completed_when_forwarded() {
    let s = Steering::new(2);
    let port_of = |owner: usize| {
        (1000u16..)
            .find(|&p| s.owner_of_flow(A, B, p, 9) == owner)
            .unwrap()
    };
    let mine = partial_udp(port_of(0), 9);
    let theirs = partial_udp(port_of(1), 9);
    assert!(!udp_checksum_ok(&mine) && !udp_checksum_ok(&theirs));

    let q0 = Queue::new(Offloading(VecDeque::from([mine.clone(), theirs.clone()])));
    let q1 = Queue::new(Offloading(VecDeque::new()));
    let mut shards = Steered::group(vec![q0, q1], RingSpec::default()).unwrap();

    let mut got0 = Vec::new();
    shards[0].recv_batch_meta(Instant::ZERO, 64, &mut |f, m| got0.push((f.to_vec(), m)));
    assert_eq!(got0, vec![(mine, RxMeta { l4_csum_ok: true })]);
    assert_eq!(shards[0].counters().forwarded, 1);

    let mut got1 = Vec::new();
    shards[1].recv_batch_meta(Instant::ZERO, 64, &mut |f, m| got1.push((f.to_vec(), m)));
    assert_eq!(got1.len(), 1);
    let (f, m) = &got1[0];
    assert_eq!(*m, RxMeta::default(), "the mark does not cross the ring");
    assert!(udp_checksum_ok(f), "forwarded with its checksum completed");
    assert_eq!(f[..40], theirs[..40]);
    assert_eq!(f[42..], theirs[42..]);
}

#[test]
fn without_metadata_every_frame_has_complete_checksums() {
    let s = Steering::new(2);
    let port = (1000u16..)
        .find(|&p| s.owner_of_flow(A, B, p, 9) == 0)
        .unwrap();
    let q0 = Queue::new(Offloading(VecDeque::from([partial_udp(port, 9)])));
    let q1 = Queue::new(Offloading(VecDeque::new()));
    let mut shards = Steered::group(vec![q0, q1], RingSpec::default()).unwrap();
    let mut got = Vec::new();
    shards[0].recv_batch(Instant::ZERO, 64, &mut |f| got.push(f.to_vec()));
    assert_eq!(got.len(), 1);
    assert!(udp_checksum_ok(&got[0]));
}
