//! Cross-shard rings: a bounded single-producer/single-consumer ring of frames for every
//! ordered pair of shards, and a doorbell per shard that wakes it when it sleeps.
//!
//! A [`Mesh`] of `n` nodes lays `n·(n-1)` rings ([`flowstack_sys::ring`]) out in one
//! [`SharedRegion`] and splits into one [`MeshPort`] per node: the producers of the rings
//! leaving the node, the consumers of the rings arriving at it, and the doorbells of every
//! node. A port belongs to its node's thread (it is `Send`, not `Sync`); no two threads ever
//! write the same index, so the data path takes no lock and does one copy per frame (the
//! producer's push; the consumer reads records in place).
//!
//! # Sleeping and waking
//! A consumer that runs out of work announces it sleeps on its own [`Doorbell`], re-checks its
//! rings, and only then sleeps; a producer that publishes a batch checks the doorbell of the
//! node it wrote to and calls its waker only if that node announced it sleeps. Both sides put
//! a sequentially consistent fence between their store and their load (the sleeper: announce,
//! fence, look at the rings; the producer: publish, fence, look at the announcement), so at
//! least one sees the other's store: no lost wake-up, and a busy receiver costs its producers
//! no system call. What a waker does depends on how the node sleeps ([`Wake`]): signal an
//! eventfd it polls, or interrupt its device's own wait.

use flowstack_sys::eventfd::EventFd;
use flowstack_sys::ring::{ring_bytes, Consumer, Producer, RingError, RingLayout};
use flowstack_sys::SharedRegion;
use std::io;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

/// Default bytes of frame data per ring (a power of two).
pub const DEFAULT_RING_CAPACITY: usize = 256 * 1024;
/// Default largest frame a ring carries: an Ethernet header and the largest IPv4 datagram
/// (what a device with segmentation offload may hand up).
pub const DEFAULT_MAX_FRAME: usize = 14 + 65_535;

/// Size of every ring of a [`Mesh`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSpec {
    /// Bytes of frame data per ring: a power of two, at least 64. A frame takes its length
    /// plus 4, rounded up to 8.
    pub capacity: usize,
    /// Largest frame, in bytes; longer frames are refused ([`RingError::TooLarge`]).
    pub max_frame: usize,
}

impl Default for RingSpec {
    fn default() -> Self {
        Self {
            capacity: DEFAULT_RING_CAPACITY,
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

/// How a sleeping node is woken.
pub trait Wake: Send + Sync {
    /// Wakes the node, or makes its next sleep return at once if it is not asleep yet (a
    /// wake is never lost: eventfd counters and futex words keep it).
    fn wake(&self);
}

impl Wake for EventFd {
    fn wake(&self) {
        // Fails only if the descriptor is gone, which the owner of the Arc prevents.
        let _ = self.signal();
    }
}

/// A node's doorbell: the announcement that it sleeps, and how to wake it.
pub struct Doorbell {
    sleeping: AtomicU32,
    waker: Option<Arc<dyn Wake>>,
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell")
            .field("sleeping", &self.sleeping.load(Ordering::Relaxed))
            .field("waker", &self.waker.is_some())
            .finish()
    }
}

impl Doorbell {
    /// A doorbell that calls `waker`; `None` for a node that never announces a sleep (it
    /// sleeps in short slices and looks at its rings between them).
    pub fn new(waker: Option<Arc<dyn Wake>>) -> Self {
        Self {
            sleeping: AtomicU32::new(0),
            waker,
        }
    }

    /// Producer side, after publishing: wakes the node if it announced that it sleeps.
    /// Returns whether it called the waker.
    #[inline]
    pub fn ring(&self) -> bool {
        // Pairs with the fence in `sleep`: see the module docs.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) == 0 {
            return false;
        }
        match &self.waker {
            Some(w) => {
                w.wake();
                true
            }
            None => false,
        }
    }

    /// Wakes the node whether or not it sleeps (to stop it).
    pub fn force(&self) {
        if let Some(w) = &self.waker {
            w.wake();
        }
    }

    /// Consumer side: announces the sleep, returns at once if `pending()` (checked after the
    /// announcement) says work arrived, else runs `sleep`; withdraws the announcement either
    /// way. Returns whether it slept. Without a waker nobody would wake it: it does not
    /// announce and just runs `sleep`.
    pub fn sleep(&self, pending: impl FnOnce() -> bool, sleep: impl FnOnce()) -> bool {
        if self.waker.is_none() {
            sleep();
            return true;
        }
        self.sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let slept = !pending();
        if slept {
            sleep();
        }
        self.sleeping.store(0, Ordering::Relaxed);
        slept
    }

    /// True if this doorbell can wake its node (it has a waker).
    pub fn wakes(&self) -> bool {
        self.waker.is_some()
    }
}

/// The rings between every ordered pair of `n` nodes, in one shared region; split it with
/// [`Mesh::into_ports`].
pub struct Mesh {
    region: Option<Arc<SharedRegion>>,
    spec: RingSpec,
    bells: Arc<[Doorbell]>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("nodes", &self.bells.len())
            .field("spec", &self.spec)
            .finish()
    }
}

impl Mesh {
    /// Rings of `spec` between every ordered pair of nodes; node `i` is woken by `wakers[i]`
    /// (so there are `wakers.len()` nodes). The region is a sealed memfd named `name`; its
    /// pages are only backed once a ring reaches them.
    pub fn new(name: &str, spec: RingSpec, wakers: Vec<Option<Arc<dyn Wake>>>) -> io::Result<Self> {
        let bells = wakers.into_iter().map(Doorbell::new).collect();
        Self::with_doorbells(name, spec, bells)
    }

    /// Rings of `spec` between the nodes of `bells`, woken through those doorbells: a second
    /// mesh between the same nodes (another interface's frames) whose pushes ring the
    /// doorbell a node already announces its sleep on, so one announcement covers both.
    pub fn with_doorbells(name: &str, spec: RingSpec, bells: Arc<[Doorbell]>) -> io::Result<Self> {
        let n = bells.len();
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a mesh needs at least one node",
            ));
        }
        let rings = n * (n - 1);
        // Check the spec once here, so that into_ports cannot fail on it.
        let layout = |i: usize| RingLayout {
            offset: i * ring_bytes(spec.capacity),
            capacity: spec.capacity,
            max_record: spec.max_frame,
        };
        let region = if rings == 0 {
            None
        } else {
            let len = rings
                .checked_mul(ring_bytes(spec.capacity))
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "mesh too large"))?;
            let region = Arc::new(SharedRegion::create(name, len)?);
            Producer::new(region.clone(), layout(0)).map_err(invalid)?;
            Some(region)
        };
        Ok(Self {
            region,
            spec,
            bells,
        })
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.bells.len()
    }

    /// Every node's doorbell (to stop them all).
    pub fn doorbells(&self) -> Arc<[Doorbell]> {
        self.bells.clone()
    }

    /// One port per node, in node order.
    pub fn into_ports(self) -> Vec<MeshPort> {
        let n = self.nodes();
        let ring = |from: usize, to: usize| {
            let region = self
                .region
                .clone()
                .expect("a mesh of 2+ nodes has a region");
            let i = from * (n - 1) + if to < from { to } else { to - 1 };
            let layout = RingLayout {
                offset: i * ring_bytes(self.spec.capacity),
                capacity: self.spec.capacity,
                max_record: self.spec.max_frame,
            };
            (region, layout)
        };
        (0..n)
            .map(|me| {
                let tx = (0..n)
                    .map(|to| {
                        (to != me).then(|| {
                            let (r, l) = ring(me, to);
                            Producer::new(r, l).expect("layout checked in Mesh::new")
                        })
                    })
                    .collect();
                let rx = (0..n)
                    .map(|from| {
                        (from != me).then(|| {
                            let (r, l) = ring(from, me);
                            Consumer::new(r, l).expect("layout checked in Mesh::new")
                        })
                    })
                    .collect();
                MeshPort {
                    me,
                    tx,
                    rx,
                    next_rx: 0,
                    bells: self.bells.clone(),
                }
            })
            .collect()
    }
}

fn invalid(e: RingError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// One node's ends of a [`Mesh`]: producers towards every other node, consumers from every
/// other node, and the doorbells.
pub struct MeshPort {
    me: usize,
    /// `tx[j]`: the ring to node `j` (`None` at `me`).
    tx: Vec<Option<Producer>>,
    /// `rx[j]`: the ring from node `j` (`None` at `me`).
    rx: Vec<Option<Consumer>>,
    /// Where the next [`MeshPort::recv`] starts, so no peer's ring starves the others.
    next_rx: usize,
    bells: Arc<[Doorbell]>,
}

impl std::fmt::Debug for MeshPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshPort")
            .field("node", &self.me)
            .field("nodes", &self.tx.len())
            .finish()
    }
}

impl MeshPort {
    /// This node's index.
    pub fn node(&self) -> usize {
        self.me
    }

    /// Number of nodes of the mesh.
    pub fn nodes(&self) -> usize {
        self.tx.len()
    }

    /// Copies `frame` into the ring to node `to`; it becomes visible at the next
    /// [`MeshPort::flush`]. Fails with [`RingError::Full`] when `to` is behind,
    /// [`RingError::TooLarge`] for a frame beyond the ring's largest, and
    /// [`RingError::Layout`] for `to` out of range or this node itself.
    #[inline]
    pub fn push(&mut self, to: usize, frame: &[u8]) -> Result<(), RingError> {
        match self.tx.get_mut(to) {
            Some(Some(p)) => p.push(frame),
            _ => Err(RingError::Layout("no ring to that node")),
        }
    }

    /// Publishes what was pushed to each node since the last flush and rings the doorbells
    /// of those that sleep. Returns how many it woke.
    #[inline]
    pub fn flush(&mut self) -> usize {
        let mut woke = 0;
        for (to, p) in self.tx.iter_mut().enumerate() {
            if let Some(p) = p {
                if p.unpublished() > 0 {
                    p.publish();
                    woke += usize::from(self.bells[to].ring());
                }
            }
        }
        woke
    }

    /// True if some peer published frames not yet received here.
    #[inline]
    pub fn pending(&self) -> bool {
        self.rx.iter().flatten().any(|c| c.pending())
    }

    /// Hands up to `budget` frames from the peers' rings to `sink` (in order per peer, peers
    /// taken in turn), each as a slice of the shared pages. Returns how many, and the first
    /// ring error met (a corrupt ring stays stuck; the others go on).
    pub fn recv(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> (usize, Option<RingError>) {
        let n = self.rx.len();
        let mut got = 0;
        let mut err = None;
        for k in 0..n {
            if got >= budget {
                break;
            }
            let from = (self.next_rx + k) % n;
            let Some(c) = &mut self.rx[from] else {
                continue;
            };
            match c.recv(budget - got, |f| sink(from, f)) {
                Ok(m) => got += m,
                Err(e) => {
                    err.get_or_insert(e);
                }
            }
        }
        self.next_rx = (self.next_rx + 1) % n.max(1);
        (got, err)
    }

    /// This node's doorbell (to sleep on).
    pub fn doorbell(&self) -> &Doorbell {
        &self.bells[self.me]
    }

    /// Every node's doorbell.
    pub fn doorbells(&self) -> Arc<[Doorbell]> {
        self.bells.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn mesh(n: usize, spec: RingSpec) -> (Vec<MeshPort>, Vec<Arc<EventFd>>) {
        let fds: Vec<Arc<EventFd>> = (0..n).map(|_| Arc::new(EventFd::new().unwrap())).collect();
        let wakers = fds
            .iter()
            .map(|f| Some(f.clone() as Arc<dyn Wake>))
            .collect();
        (
            Mesh::new("mesh-test", spec, wakers).unwrap().into_ports(),
            fds,
        )
    }

    fn drain(p: &mut MeshPort) -> Vec<(usize, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let (n, e) = p.recv(usize::MAX, &mut |from, f| out.push((from, f.to_vec())));
            assert!(e.is_none());
            if n == 0 {
                return out;
            }
        }
    }

    #[test]
    fn every_ordered_pair_has_its_own_ring() {
        let (mut ports, _fds) = mesh(4, RingSpec::default());
        for (from, port) in ports.iter_mut().enumerate() {
            for to in 0..4 {
                let r = port.push(to, &[from as u8, to as u8]);
                assert_eq!(r.is_ok(), from != to, "{from} -> {to}");
            }
            port.flush();
        }
        for (to, port) in ports.iter_mut().enumerate() {
            assert!(port.pending());
            let mut got = drain(port);
            got.sort();
            let want: Vec<_> = (0..4)
                .filter(|&f| f != to)
                .map(|f| (f, vec![f as u8, to as u8]))
                .collect();
            assert_eq!(got, want);
            assert!(!port.pending());
        }
        assert!(ports[0].push(9, b"x").is_err());
    }

    #[test]
    fn nothing_is_visible_before_flush_and_full_is_reported() {
        let spec = RingSpec {
            capacity: 256,
            max_frame: 100,
        };
        let (mut ports, _fds) = mesh(2, spec);
        let (a, b) = ports.split_at_mut(1);
        a[0].push(1, &[7; 100]).unwrap();
        assert!(!b[0].pending());
        a[0].flush();
        assert!(b[0].pending());
        a[0].push(1, &[8; 100]).unwrap();
        assert_eq!(a[0].push(1, &[9; 100]), Err(RingError::Full));
        assert!(matches!(
            a[0].push(1, &[0; 101]),
            Err(RingError::TooLarge { .. })
        ));
        a[0].flush();
        assert_eq!(drain(&mut b[0]).len(), 2);
        a[0].push(1, &[9; 100]).unwrap();
    }

    #[test]
    fn a_single_node_mesh_has_no_rings() {
        let (mut ports, _) = mesh(1, RingSpec::default());
        assert_eq!(ports.len(), 1);
        assert!(!ports[0].pending());
        assert_eq!(ports[0].recv(10, &mut |_, _| panic!()).0, 0);
        assert_eq!(ports[0].flush(), 0);
    }

    #[test]
    fn bad_specs_are_refused() {
        let bad = RingSpec {
            capacity: 1000,
            max_frame: 100,
        };
        assert!(Mesh::new("mesh-test", bad, vec![None, None]).is_err());
        let bad = RingSpec {
            capacity: 1024,
            max_frame: 1024,
        };
        assert!(Mesh::new("mesh-test", bad, vec![None, None]).is_err());
        assert!(Mesh::new("mesh-test", RingSpec::default(), vec![]).is_err());
    }

    #[test]
    fn a_producer_wakes_only_a_node_that_announced_its_sleep() {
        let (mut ports, fds) = mesh(2, RingSpec::default());
        ports[0].push(1, b"busy").unwrap();
        assert_eq!(ports[0].flush(), 0, "node 1 is not asleep: no system call");
        assert_eq!(fds[1].take().unwrap(), 0);
        drain(&mut ports[1]);
        let mut p0 = ports.remove(0);
        let mut p1 = ports.remove(0);
        let sleeper = std::thread::spawn(move || {
            let mut got = Vec::new();
            let start = std::time::Instant::now();
            while got.is_empty() && start.elapsed() < Duration::from_secs(10) {
                let fd = fds[1].clone();
                p1.doorbell().sleep(
                    || p1.pending(),
                    || {
                        let _ = fd.wait(Duration::from_secs(10));
                    },
                );
                got = drain(&mut p1);
            }
            (got, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(20));
        p0.push(1, b"wake").unwrap();
        p0.flush();
        let (got, took) = sleeper.join().unwrap();
        assert_eq!(got, vec![(0, b"wake".to_vec())]);
        assert!(took < Duration::from_secs(5), "woken, not timed out");
    }

    /// A second mesh built on the first's doorbells: a node asleep on the first mesh's
    /// announcement is woken by a frame on the second (one announcement covers both).
    #[test]
    fn a_mesh_sharing_doorbells_wakes_a_node_asleep_on_the_other() {
        let (first, fds) = mesh(2, RingSpec::default());
        let bells = first[0].doorbells();
        let mut second = Mesh::with_doorbells("mesh-test-2", RingSpec::default(), bells)
            .unwrap()
            .into_ports();
        let mut woke = None;
        let slept = first[1].doorbell().sleep(
            || false,
            || {
                second[0].push(1, b"own").unwrap();
                woke = Some(second[0].flush());
            },
        );
        assert!(slept);
        assert_eq!(woke, Some(1), "the push on the second mesh rang node 1");
        assert_eq!(fds[1].take().unwrap(), 1);
        assert_eq!(drain(&mut second[1]), vec![(0, b"own".to_vec())]);
        // Awake again: no ring.
        second[0].push(1, b"x").unwrap();
        assert_eq!(second[0].flush(), 0);
    }
}
