//! An in-process multi-queue link: one port on one side, `n` queues on the other, with the
//! side sending into the queues choosing a queue per frame, as a NIC's RSS does.
//!
//! The "NIC" for per-core shards in tests and benchmarks, where the peer is one engine (or a
//! kernel-less client) in the same process: [`NicPort`] is a single-queue [`Device`] for the
//! peer, each [`NicQueue`] a [`Device`] for one shard (all are `Send`, for their own threads).
//! Frames cross on the cross-shard rings of [`crate::xring`] (one ring per direction per
//! queue), so nothing is locked and a steady flow allocates nothing; a full ring drops the
//! frame and counts it, as a NIC ring would. Each end sleeps on an eventfd its peer signals
//! only after it announced the sleep.
//!
//! The steering function picks the queue of every frame the port sends: pass
//! [`Steering::queue_for`](crate::steer::Steering::queue_for) for a NIC programmed with
//! flowstack's own hash, or any other function to model one that is not (TAP, AF_PACKET
//! fanout), whose misdirected frames the shards then forward.

use crate::steer::Queue;
use crate::xring::{Mesh, MeshPort, RingSpec, Wake};
use flowstack_link::{Device, DeviceCaps, Instant, TxBatch};
use flowstack_sys::eventfd::EventFd;
use flowstack_wire::Duration;
use std::io;
use std::sync::Arc;

/// Picks a frame's queue.
type SteerFn = Box<dyn FnMut(&[u8]) -> usize + Send>;

/// The single-queue side of the link.
pub struct NicPort {
    end: End,
    steer: SteerFn,
}

/// One queue of the multi-queue side.
pub struct NicQueue {
    end: End,
}

/// What both sides share: their end of the rings, their eventfd, the caps, the drop count.
struct End {
    port: MeshPort,
    bell: Arc<EventFd>,
    caps: DeviceCaps,
    tx_drops: u64,
}

impl End {
    fn recv(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        // In one process nobody corrupts a ring; a corrupt one would just stay silent.
        self.port.recv(budget, &mut |_, f| sink(f)).0
    }

    fn push(&mut self, to: usize, f: &[u8]) -> bool {
        let ok = self.port.push(to, f).is_ok();
        self.tx_drops += u64::from(!ok);
        ok
    }

    fn wait(&mut self, timeout: Duration) {
        let Self { port, bell, .. } = self;
        port.doorbell().sleep(
            || port.pending(),
            || {
                let _ = bell.wait(timeout);
            },
        );
    }
}

impl std::fmt::Debug for NicPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicPort")
            .field("queues", &(self.end.port.nodes() - 1))
            .finish()
    }
}

impl std::fmt::Debug for NicQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicQueue")
            .field("queue", &self.end.port.node())
            .finish()
    }
}

/// A link with `queues` queues of capabilities `caps` (its `queues` field is set to the
/// number of queues) and rings of `rings`; `steer` picks the queue (modulo `queues`) of each
/// frame the port sends.
pub fn nic(
    queues: usize,
    caps: DeviceCaps,
    rings: RingSpec,
    steer: impl FnMut(&[u8]) -> usize + Send + 'static,
) -> io::Result<(NicPort, Vec<NicQueue>)> {
    if queues == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a NIC needs at least one queue",
        ));
    }
    let caps = DeviceCaps { queues, ..caps };
    // Nodes 0..queues are the queues, node `queues` the port; rings between two queues are
    // laid out but never used (untouched pages of a memfd cost nothing).
    let bells = (0..=queues)
        .map(|_| EventFd::new().map(Arc::new))
        .collect::<io::Result<Vec<_>>>()?;
    let wakers = bells
        .iter()
        .map(|b| Some(b.clone() as Arc<dyn Wake>))
        .collect();
    let mut ports = Mesh::new("flowstack-nic", rings, wakers)?.into_ports();
    let mut bells = bells.into_iter();
    let mut ends: Vec<End> = ports
        .drain(..)
        .map(|port| End {
            port,
            bell: bells.next().expect("one eventfd per node"),
            caps,
            tx_drops: 0,
        })
        .collect();
    let port = NicPort {
        end: ends.pop().expect("the port's node"),
        steer: Box::new(steer),
    };
    Ok((port, ends.into_iter().map(|end| NicQueue { end }).collect()))
}

impl NicPort {
    /// Frames sent that were dropped because their queue's ring was full.
    pub fn tx_drops(&self) -> u64 {
        self.end.tx_drops
    }
}

impl NicQueue {
    /// The queue's index.
    pub fn index(&self) -> usize {
        self.end.port.node()
    }

    /// Frames sent that were dropped because the port's ring from this queue was full.
    pub fn tx_drops(&self) -> u64 {
        self.end.tx_drops
    }

    /// What ends this queue's `wait` at once, even if called just before it.
    pub fn waker(&self) -> Arc<dyn Wake> {
        self.end.bell.clone()
    }

    /// This queue as a shard's [`Queue`] whose sleep its peer shards interrupt.
    pub fn into_queue(self) -> Queue {
        let waker = self.waker();
        Queue::with_waker(Box::new(self), waker)
    }
}

impl Device for NicPort {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            queues: 1,
            ..self.end.caps
        }
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        self.end.recv(budget, sink)
    }

    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let queues = self.end.port.nodes() - 1;
        let mut sent = 0;
        for f in batch.iter() {
            let q = (self.steer)(f) % queues;
            sent += usize::from(self.end.push(q, f));
        }
        self.end.port.flush();
        sent
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        self.end.port.pending()
    }

    fn wait(&mut self, timeout: Duration) {
        self.end.wait(timeout)
    }
}

impl Device for NicQueue {
    fn caps(&self) -> DeviceCaps {
        self.end.caps
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        self.end.recv(budget, sink)
    }

    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let to = self.end.port.nodes() - 1;
        let mut sent = 0;
        for f in batch.iter() {
            sent += usize::from(self.end.push(to, f));
        }
        self.end.port.flush();
        sent
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        self.end.port.pending()
    }

    fn wait(&mut self, timeout: Duration) {
        self.end.wait(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(frames: &[&[u8]]) -> TxBatch {
        let mut b = TxBatch::new();
        for f in frames {
            b.push(f.len()).copy_from_slice(f);
        }
        b
    }

    fn take(d: &mut dyn Device) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        d.recv_batch(Instant::ZERO, 64, &mut |f| out.push(f.to_vec()));
        out
    }

    #[test]
    fn the_port_steers_and_the_queues_merge() {
        let (mut port, mut qs) = nic(3, DeviceCaps::ETHERNET, RingSpec::default(), |f| {
            f[0] as usize
        })
        .unwrap();
        assert_eq!(qs[1].caps().queues, 3);
        assert_eq!(port.caps().queues, 1);
        let sent = port.send_batch(Instant::ZERO, &batch(&[&[0, 1], &[1, 2], &[2, 3], &[4, 4]]));
        assert_eq!(sent, 4);
        assert_eq!(take(&mut qs[0]), vec![vec![0, 1]]);
        assert_eq!(take(&mut qs[1]), vec![vec![1, 2], vec![4, 4]]);
        assert_eq!(take(&mut qs[2]), vec![vec![2, 3]]);
        for (i, q) in qs.iter_mut().enumerate() {
            q.send_batch(Instant::ZERO, &batch(&[&[i as u8; 3]]));
        }
        let mut got = take(&mut port);
        got.sort();
        assert_eq!(got, vec![vec![0; 3], vec![1; 3], vec![2; 3]]);
    }

    #[test]
    fn a_waker_called_before_the_wait_ends_it_at_once() {
        let (_port, mut qs) = nic(1, DeviceCaps::ETHERNET, RingSpec::default(), |_| 0).unwrap();
        qs[0].waker().wake();
        let t = std::time::Instant::now();
        qs[0].wait(Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
