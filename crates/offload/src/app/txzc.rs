//! Bulk sends straight from the transmit area (zero-copy `TcpSend`).
//!
//! A `TcpSend` span of at least [`ZC_MIN`] bytes, on a connection with nothing queued in the
//! daemon before it, is not copied into the engine's send buffer: it is queued as a shared
//! range of the application's region ([`Engine::tcp_send_zc`]) whose owner is a [`TxSpan`],
//! and segments (and retransmissions) are cut from the area itself; the loopback device
//! hands such a segment's payload to the receiving connection, which copies it once into its
//! receive ring. Two copies of every bulk byte fewer than the copy path (area → send buffer,
//! send buffer → frame).
//!
//! - **Area room is held until the bytes are done with.** A span's area is released when the
//!   *last* reference to its `TxSpan` drops: the send queue's (every byte acknowledged, or the
//!   connection released) and any frame still in a device's queue. Its `Drop` sets the span's
//!   flag in the application's [`Slots`] (an atomic, no lock); each turn ([`App::tx_turn`])
//!   the daemon advances the published `TX_FREED` over the released prefix of spans, in area
//!   order (bytes sent by copy are freed at once, but not past an older pinned span).
//! - **Small spans keep the copy path** (a request or a reply: latency, not bandwidth).
//! - **No hang when the area is pinned.** A connection whose peer stops reading pins its
//!   spans (up to its send buffer), and the area is a ring: the other connections' bytes
//!   would stop behind them. When more than [`TX_HOLD_LIMIT`] of the area is held (the
//!   daemon's `tx_hold_limit`), the oldest
//!   pinned spans are copied to the heap inside their send queues
//!   ([`Engine::tcp_zc_rehome`], counted in `FlowstackdTxRehomedBytes`) until at most half
//!   of the area is held, so their area is released once frames in flight let go of it.
//! - **Waiters on area room are woken.** A client whose send found no area room and asks
//!   `WantWritable` (the POSIX layer) while the area is full in the daemon's view is
//!   remembered and gets a `Writable` event (and its placeholder's filler emptied) when
//!   `TX_FREED` next advances; a native client waiting with `wants_writable` set gets a
//!   `Writable` event for no handle (a wake-up) at every advance.
//! - **Untrusted memory.** The span was validated (`check_span`) before it gets here; the
//!   application may write its area while segments are cut from it — that garbles only its
//!   own stream (as with `MSG_ZEROCOPY`), never the daemon (see
//!   [`SharedRegion::peer_bytes`]). An application that dies leaves its region mapped until
//!   the last span referencing it drops (each `TxSpan` holds the region).

use super::*;
use flowstack_stack::{Engine, ExtBuf, SharedOwner};
use std::sync::atomic::AtomicBool;

/// Smallest `TcpSend` span sent from the transmit area without a copy. Below it the copy
/// path is cheaper than a span's bookkeeping (an `Arc`, a slot, a completion) and frees the
/// area at once; iperf3 and bulk writers post 128 KiB, requests and replies stay below.
pub const ZC_MIN: usize = 16 << 10;
/// Spans pinned at most at once: every pinned span lies in the unreleased part of the area
/// and is at least `ZC_MIN` long, so this many slots never run out (checked anyway).
const SLOTS: usize = TX_SIZE / ZC_MIN;
/// Held area (pinned spans and the bytes behind them) beyond which the oldest pinned spans
/// are copied out of it (the default of `DaemonConfig::tx_hold_limit`). Above one connection's send buffer (half the area), so a single bulk
/// sender never triggers it.
pub const TX_HOLD_LIMIT: u64 = TX_SIZE as u64 * 3 / 4;

/// Release flags, one per slot, shared by an application's pinned spans.
struct Slots {
    released: [AtomicBool; SLOTS],
}

/// A pinned span of an application's transmit area: the owner of a zero-copy send's bytes.
struct TxSpan {
    region: Arc<SharedRegion>,
    /// Byte offset in the region.
    at: usize,
    len: usize,
    slots: Arc<Slots>,
    slot: usize,
}

impl AsRef<[u8]> for TxSpan {
    fn as_ref(&self) -> &[u8] {
        // Checked when the span was made: it lies in the region.
        self.region.peer_bytes(self.at, self.len).unwrap_or(&[])
    }
}

impl Drop for TxSpan {
    fn drop(&mut self) {
        self.slots.released[self.slot].store(true, Ordering::Release);
    }
}

/// A pinned span, as the application's side sees it.
#[derive(Debug)]
struct Pinned {
    /// Its first byte in the transmit stream (the count `tx_freed` runs on).
    start: u64,
    slot: usize,
    eng: usize,
    h: TcpHandle,
    token: u64,
    rehomed: bool,
}

/// An application's pinned transmit spans, in area order.
pub(crate) struct TxZc {
    slots: Arc<Slots>,
    pinned: VecDeque<Pinned>,
    next_slot: usize,
    /// Sockets whose holder waits for area room (`WantWritable` with the area full):
    /// (socket id, handle).
    waiters: Vec<(u32, u32)>,
}

impl std::fmt::Debug for TxZc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxZc")
            .field("pinned", &self.pinned.len())
            .field("waiters", &self.waiters.len())
            .finish()
    }
}

impl Default for TxZc {
    fn default() -> Self {
        Self {
            slots: Arc::new(Slots {
                released: std::array::from_fn(|_| AtomicBool::new(false)),
            }),
            pinned: VecDeque::new(),
            next_slot: 0,
            waiters: Vec::new(),
        }
    }
}

impl TxZc {
    /// Where the area is held from: the first pinned span's start, or `seen` (every byte
    /// the application posted and the daemon took) when none is pinned.
    pub(crate) fn freed(&self, seen: u64) -> u64 {
        self.pinned.front().map_or(seen, |p| p.start)
    }

    /// Pops the released prefix of pinned spans; true if any.
    fn pop_released(&mut self) -> bool {
        let mut any = false;
        while let Some(p) = self.pinned.front() {
            if !self.slots.released[p.slot].load(Ordering::Acquire) {
                break;
            }
            self.pinned.pop_front();
            any = true;
        }
        any
    }

    /// Queues `len` bytes of the area at region offset `at` (stream position `pos`) on
    /// connection `h` without a copy, as much as the send buffer takes whole (a prefix of at
    /// least [`ZC_MIN`]); returns how many bytes (0: not eligible, the copy path takes them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        region: &Arc<SharedRegion>,
        e: &mut Engine,
        eng: usize,
        h: TcpHandle,
        at: usize,
        pos: u64,
        len: usize,
    ) -> usize {
        if len < ZC_MIN || self.pinned.len() >= SLOTS {
            return 0;
        }
        // Completions carry nothing for us (the span's drop is its release): drop them.
        while e.tcp_zc_completion(h).is_some() {}
        let room = e.tcp_conn(h).map(|k| k.send_room()).unwrap_or(0);
        let n = len.min(room);
        if n < ZC_MIN || region.peer_bytes(at, n).is_none() {
            return 0;
        }
        let slot = self.next_slot % SLOTS;
        self.slots.released[slot].store(false, Ordering::Relaxed);
        let owner: SharedOwner = Arc::new(TxSpan {
            region: region.clone(),
            at,
            len: n,
            slots: self.slots.clone(),
            slot,
        });
        let buf = ExtBuf::shared(owner, 0, n).expect("the span holds n bytes");
        match e.tcp_send_zc(h, buf) {
            Ok(token) => {
                self.next_slot = self.next_slot.wrapping_add(1);
                self.pinned.push_back(Pinned {
                    start: pos,
                    slot,
                    eng,
                    h,
                    token,
                    rehomed: false,
                });
                n
            }
            // Not queued: the span was dropped (its slot flag set) and is free again.
            Err(_) => 0,
        }
    }

    /// Under pressure (more than [`TX_HOLD_LIMIT`] of the area held), copies the oldest pinned
    /// spans out of the area until at most half of it is held; returns the bytes copied.
    fn rehome(&mut self, engines: &mut [Engine], seen: u64, limit: u64) -> u64 {
        let Some(front) = self.pinned.front() else {
            return 0;
        };
        if seen - front.start <= limit {
            return 0;
        }
        let mut copied = 0u64;
        for p in self.pinned.iter_mut() {
            if seen - p.start <= TX_SIZE as u64 / 2 {
                break;
            }
            if p.rehomed || self.slots.released[p.slot].load(Ordering::Acquire) {
                continue;
            }
            p.rehomed = true;
            if let Some(e) = engines.get_mut(p.eng) {
                copied += e.tcp_zc_rehome(p.h, p.token).unwrap_or(0) as u64;
            }
        }
        copied
    }

    /// Remembers that socket `gid`'s holder (as `handle`) waits for area room.
    pub(crate) fn wait_for_room(&mut self, gid: u32, handle: u32) {
        if !self.waiters.contains(&(gid, handle)) {
            self.waiters.push((gid, handle));
        }
    }
}

impl App {
    /// Bytes of the transmit area the application may write again: what the daemon took,
    /// up to the oldest span still pinned.
    pub(super) fn tx_released(&self) -> u64 {
        self.txzc.freed(self.tx_freed)
    }

    /// Publishes [`App::tx_released`] as `TX_FREED` (sequentially consistent: a native
    /// client stores `wants_writable` before it re-reads it).
    pub(super) fn publish_tx_freed(&self) {
        if let Some(a) = self.region.atomic_u64(at::TX_FREED) {
            a.store(self.tx_released(), Ordering::SeqCst);
        }
    }

    /// The transmit area is full in the daemon's view: every byte the application posted is
    /// taken and none is released. A client that found no room sees the same or more.
    pub(super) fn tx_area_full(&self) -> bool {
        self.tx_freed - self.tx_released() >= TX_SIZE as u64
    }

    /// The turn's transmit-area work: copies pinned spans out under pressure, advances
    /// `TX_FREED` over released spans and wakes those waiting for area room; true if the
    /// area's state changed.
    pub(crate) fn tx_turn(&mut self, sh: &mut Shared) -> bool {
        if self.txzc.pinned.is_empty() && self.txzc.waiters.is_empty() {
            return false;
        }
        let before = self.tx_released();
        let copied = self
            .txzc
            .rehome(&mut sh.lo.engines, self.tx_freed, sh.tx_hold_limit);
        if copied > 0 {
            sh.counters.tx_rehomed_bytes += copied;
        }
        self.txzc.pop_released();
        let after = self.tx_released();
        if after == before {
            return copied > 0;
        }
        self.publish_tx_freed();
        for (gid, handle) in std::mem::take(&mut self.txzc.waiters) {
            self.post(super::service::writable(handle, 0));
            sh.ph_actions.push((gid, false, true));
        }
        if self.wants_writable() {
            // A native client waiting for room (or credit): a wake-up for no socket.
            self.post(super::service::writable(0, 0));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(z: &TxZc, region: &Arc<SharedRegion>, slot: usize) -> TxSpan {
        TxSpan {
            region: region.clone(),
            at: 0,
            len: 1,
            slots: z.slots.clone(),
            slot,
        }
    }

    /// Spans released out of order free the area only over the released prefix.
    #[test]
    fn released_spans_free_the_area_in_order() {
        let region = Arc::new(SharedRegion::create("txzc-test", 4096).unwrap());
        let mut z = TxZc::default();
        let mut spans = Vec::new();
        for i in 0..3u64 {
            let slot = z.next_slot % SLOTS;
            z.next_slot += 1;
            z.slots.released[slot].store(false, Ordering::Relaxed);
            spans.push(Some(span(&z, &region, slot)));
            z.pinned.push_back(Pinned {
                start: 100 + i * ZC_MIN as u64,
                slot,
                eng: 0,
                h: TcpHandle::from_raw(1),
                token: i,
                rehomed: false,
            });
        }
        let seen = 100 + 3 * ZC_MIN as u64 + 7; // and 7 bytes sent by copy behind them
        assert_eq!(z.freed(seen), 100);
        // The second and third are released first: nothing moves.
        spans[1] = None;
        spans[2] = None;
        assert!(!z.pop_released());
        assert_eq!(z.freed(seen), 100, "not past the first, still pinned");
        spans[0] = None;
        assert!(z.pop_released());
        assert_eq!(z.freed(seen), seen, "all released: up to every byte taken");
        assert!(z.pinned.is_empty());
    }

    /// A slot is reused only after its span was popped; the table covers the whole area.
    #[test]
    fn slots_cover_the_area() {
        assert_eq!(SLOTS * ZC_MIN, TX_SIZE);
        const { assert!(TX_HOLD_LIMIT > SOCK_SNDBUF && TX_HOLD_LIMIT < TX_SIZE as u64) };
    }
}
