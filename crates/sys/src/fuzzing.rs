//! Fuzz harnesses of this crate, shared by the `cargo fuzz` targets (`fuzz/fuzz_targets/`) and
//! the corpus replay test (`tests/ring_fuzz_corpus.rs`). Not an API.

use crate::ring::{Consumer, Producer, RingError, RingLayout, Waited, CTL_BYTES};
use crate::SharedRegion;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Data bytes of the fuzzed ring.
const CAP: usize = 1024;
/// Largest record.
const MAX_RECORD: usize = 200;
/// The ring ends exactly at the end of the region's only page: a read or write past it would
/// fault. The bytes before it are a canary no side may touch.
const OFFSET: usize = 4096 - CTL_BYTES - CAP;
const REGION: usize = 4096;
const MAX_OPS: usize = 512;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }
    fn u64(&mut self) -> u64 {
        let mut a = [0; 8];
        let b = self.bytes(8);
        a[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(a)
    }
}

/// The consumer of a ring whose peer, the producing side, is the fuzzer: between the
/// consumer's operations it publishes well-formed records through a real [`Producer`], or
/// writes arbitrary `head`/`tail`/flag/length/record bytes anywhere in the ring.
///
/// Checks: nothing panics; every error is [`RingError::Corrupt`] (or `Full`/`TooLarge` for the
/// producer), never an access outside the region; every record handed to the consumer lies in
/// the ring's data area and is at most the largest record; the bytes of the region before the
/// ring are never written; and as long as the peer has written no garbage, the consumer
/// receives exactly the records pushed, in order, byte for byte.
pub fn ring_peer(data: &[u8]) {
    thread_local! {
        // One memfd per thread, zeroed for every input: no system call per input.
        static SHARED: Arc<SharedRegion> =
            Arc::new(SharedRegion::create("fuzz-ring", REGION).expect("memfd"));
    }
    let region = SHARED.with(Arc::clone);
    region.write_at(0, &[0; REGION]).unwrap();
    let layout = RingLayout {
        offset: OFFSET,
        capacity: CAP,
        max_record: MAX_RECORD,
    };
    let mut prod = Some(Producer::new(region.clone(), layout).expect("fresh ring"));
    let mut cons = Some(Consumer::new(region.clone(), layout).expect("fresh ring"));
    let lo = region.as_ptr() as usize + OFFSET + CTL_BYTES;
    let hi = lo + CAP;
    // Records pushed and not yet received, while the peer has written no garbage.
    let mut expect: Option<VecDeque<Vec<u8>>> = Some(VecDeque::new());
    let mut seq = 0u8;
    let mut input = Input(data);
    for _ in 0..MAX_OPS {
        if input.0.is_empty() {
            break;
        }
        match input.u8() % 10 {
            0 => {
                // Arbitrary head.
                let v = input.u64();
                region.write_at(OFFSET, &v.to_ne_bytes()).unwrap();
                expect = None;
            }
            1 => {
                // A plausible head: the shared tail plus a small step.
                let mut t = [0; 8];
                region.read_at(OFFSET + 64, &mut t).unwrap();
                let v = u64::from_ne_bytes(t).wrapping_add(u64::from(input.u16()));
                region.write_at(OFFSET, &v.to_ne_bytes()).unwrap();
                expect = None;
            }
            2 => {
                // A record length word anywhere in the data.
                let at = usize::from(input.u16()) % (CAP - 3);
                let v = u32::from(input.u16()) | if input.u8() & 1 == 1 { 0xffff_0000 } else { 0 };
                region
                    .write_at(OFFSET + CTL_BYTES + at, &v.to_ne_bytes())
                    .unwrap();
                expect = None;
            }
            3 => {
                // Arbitrary bytes anywhere in the ring (control block or data).
                let at = usize::from(input.u16()) % (CTL_BYTES + CAP);
                let n = usize::from(input.u8()).min(CTL_BYTES + CAP - at);
                let b = input.bytes(n).to_vec();
                region.write_at(OFFSET + at, &b).unwrap();
                expect = None;
            }
            4 => {
                // Arbitrary tail (the producer must not trust it).
                let v = input.u64();
                region.write_at(OFFSET + 64, &v.to_ne_bytes()).unwrap();
                expect = None;
            }
            5 => {
                let budget = usize::from(input.u8());
                if let Some(c) = cons.as_mut() {
                    let mut got = Vec::new();
                    let r = c.recv(budget, |rec| {
                        let p = rec.as_ptr() as usize;
                        assert!(p >= lo && p + rec.len() <= hi, "record outside the ring");
                        assert!(rec.len() <= MAX_RECORD, "record over the largest");
                        got.push(rec.to_vec());
                    });
                    match r {
                        Ok(n) => assert!(n == got.len() && n <= budget),
                        Err(RingError::Corrupt { .. }) => expect = None,
                        Err(e) => panic!("recv: unexpected {e}"),
                    }
                    if let Some(q) = expect.as_mut() {
                        for g in got {
                            assert_eq!(
                                q.pop_front().as_ref(),
                                Some(&g),
                                "clean ring: same records"
                            );
                        }
                    }
                }
            }
            6 => {
                // The well-behaved side pushes (and maybe publishes) a record.
                let len = usize::from(input.u8());
                let publish = input.u8() & 1 == 1;
                if let Some(p) = prod.as_mut() {
                    seq = seq.wrapping_add(1);
                    let rec: Vec<u8> = (0..len).map(|i| seq ^ i as u8).collect();
                    match p.push(&rec) {
                        Ok(()) => {
                            if let Some(q) = expect.as_mut() {
                                q.push_back(rec);
                            }
                        }
                        Err(RingError::Full | RingError::TooLarge { .. }) => {}
                        Err(RingError::Corrupt { .. }) => expect = None,
                        Err(e) => panic!("push: unexpected {e}"),
                    }
                    if publish {
                        p.publish();
                    }
                }
            }
            7 => {
                // Either side attaches anew to whatever the ring holds now.
                if input.u8() & 1 == 0 {
                    cons = Consumer::new(region.clone(), layout).ok();
                } else {
                    prod = Producer::new(region.clone(), layout).ok();
                }
                // A new side starts from the shared indices, which may drop unpublished or
                // re-deliver released records: no longer comparable.
                expect = None;
            }
            8 => {
                // The producer waits for room, without sleeping.
                let len = usize::from(input.u8());
                if let Some(p) = prod.as_mut() {
                    match p.wait_room(len, Duration::ZERO, Duration::ZERO) {
                        Ok(_) | Err(RingError::TooLarge { .. }) => {}
                        Err(RingError::Corrupt { .. }) => expect = None,
                        Err(e) => panic!("wait_room: unexpected {e}"),
                    }
                }
            }
            _ => {
                if let Some(c) = cons.as_ref() {
                    c.pending();
                    // A zero timeout: returns at once, never sleeps.
                    assert_eq!(c.wait(Duration::ZERO, Duration::ZERO), Waited::SpunOut);
                }
            }
        }
        let mut canary = [0u8; OFFSET];
        region.read_at(0, &mut canary).unwrap();
        assert!(
            canary.iter().all(|&b| b == 0),
            "bytes before the ring written"
        );
    }
}
