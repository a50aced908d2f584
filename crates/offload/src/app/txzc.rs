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
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Smallest `TcpSend` span sent from the transmit area without a copy. Below it the copy
/// path is cheaper than a span's bookkeeping (an `Arc`, a slot) and frees the
/// area at once; iperf3 and bulk writers post 128 KiB, requests and replies stay below.
pub const ZC_MIN: usize = 16 << 10;
/// Spans pinned at most at once (a span that finds them all taken goes the copy path). A
/// span that starts a connection's waiting spans is at least `ZC_MIN` long (the area holds
/// `TX_SIZE / ZC_MIN` of them); smaller ones join only behind those (the rest of a credit).
const SLOTS: usize = 8 * TX_SIZE / ZC_MIN;
/// Held area (pinned spans and the bytes behind them) beyond which the oldest pinned spans
/// are copied out of it once they are stuck (the default of `DaemonConfig::tx_hold_limit`).
/// A bulk sender holds up to its send buffer in the engine plus its send credit waiting here
/// (the whole area): the limit only matters for spans that stopped moving ([`STUCK`]).
pub const TX_HOLD_LIMIT: u64 = TX_SIZE as u64 * 3 / 4;
/// How long the oldest pinned span may stay unreleased, with more than the hold limit held,
/// before it is copied out: far above a loopback round trip (a span moving at all is
/// released within microseconds) and above the time slices the daemon thread loses on a
/// loaded machine (2 ms copied ~1% of iperf3's bytes at load 4), far below anything an
/// application would notice.
const STUCK: Duration = Duration::from_millis(10);
/// Room (daemon's view) at which the area's waiters are woken: a quarter of the area, not
/// every released span (one wake-up per quarter, as credit wakes at half the buffer).
const WAKE_ROOM: u64 = TX_SIZE as u64 / 4;

// The slots cover an area of bulk spans; the hold limit lets one connection's send buffer be.
const _: () = assert!(SLOTS * ZC_MIN >= TX_SIZE);
const _: () = assert!(TX_HOLD_LIMIT > SOCK_SNDBUF && TX_HOLD_LIMIT < TX_SIZE as u64);

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
struct Pinned {
    /// Its first byte in the transmit stream (the count `tx_freed` runs on).
    start: u64,
    slot: usize,
    /// Its connection (socket id, engine, handle), to copy it out of under pressure.
    gid: u32,
    eng: usize,
    h: TcpHandle,
    /// The span, without keeping it alive.
    owner: Weak<dyn AsRef<[u8]> + Send + Sync>,
    rehomed: bool,
}

/// A connection's spans waiting in the daemon for send-buffer room, in order (pinned too).
/// While any waits, nothing of the connection is queued in `pending_tx` (the copy path).
#[derive(Default)]
pub(crate) struct ConnSpans {
    q: VecDeque<(SharedOwner, usize, usize)>,
    bytes: usize,
}

impl std::fmt::Debug for ConnSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConnSpans({} spans, {} bytes)", self.q.len(), self.bytes)
    }
}

impl ConnSpans {
    /// Bytes waiting.
    pub(crate) fn len(&self) -> usize {
        self.bytes
    }
    /// Nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

/// Moves a connection's waiting spans into the engine, as its send buffer takes them (whole
/// spans, or pieces of at least [`ZC_MIN`]); returns the bytes taken. Completions carry
/// nothing for the daemon (a span's release is its drop) and are never taken: a completion
/// not taken holds no memory in the connection (it is a count), so it is left there.
pub(super) fn push_spans(e: &mut Engine, c: &mut Conn) -> u64 {
    let mut taken = 0u64;
    while let Some((owner, off, len)) = c.zc.q.front_mut() {
        let room = e.tcp_conn(c.h).map(|k| k.send_room()).unwrap_or(0);
        let n = (*len - *off).min(room);
        if n == 0 || (n < *len - *off && n < ZC_MIN) {
            break;
        }
        let buf = ExtBuf::shared(owner.clone(), *off, n).expect("within the span");
        if e.tcp_send_zc(c.h, buf).is_err() {
            break; // reported by the error check next turn
        }
        *off += n;
        c.zc.bytes -= n;
        taken += n as u64;
        if *off == *len {
            c.zc.q.pop_front();
        }
    }
    taken
}

/// Copies a connection's waiting spans into its copy-path queue (`pending_tx`, empty while
/// spans wait), releasing them: before bytes that cannot wait as a span, and under pressure.
pub(super) fn spill(c: &mut Conn) -> usize {
    let n = c.zc.bytes;
    for (owner, off, len) in c.zc.q.drain(..) {
        if let Some(b) = (*owner).as_ref().get(off..len) {
            c.pending_tx.extend(b);
        }
    }
    c.zc.bytes = 0;
    n
}

/// An application's pinned transmit spans, in area order.
pub(crate) struct TxZc {
    slots: Arc<Slots>,
    pinned: VecDeque<Pinned>,
    next_slot: usize,
    /// Sockets whose holder waits for area room (`WantWritable` with the area full):
    /// (socket id, handle).
    waiters: Vec<(u32, u32)>,
    /// The oldest pinned span's start, and since when it has been the oldest.
    front_since: Option<(u64, Instant)>,
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
            front_since: None,
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

    /// Whether a span of `len` bytes for a connection with `waiting` spans can be pinned
    /// now: a bulk one, or a smaller one behind waiting spans (copying it would copy them
    /// all, [`spill`]: bytes must stay in order).
    pub(crate) fn takes(&self, len: usize, waiting: bool) -> bool {
        (len >= ZC_MIN || waiting) && self.pinned.len() < SLOTS
    }

    /// Pins `len` bytes of the area at region offset `at` (stream position `pos`) for
    /// connection `c` (socket `gid`) and queues them behind its waiting spans, moving what
    /// the engine's send buffer takes now; returns those bytes (the rest wait in the daemon,
    /// pinned, for `service_conn`'s `push_spans`). The caller checked [`TxZc::takes`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        region: &Arc<SharedRegion>,
        e: &mut Engine,
        gid: u32,
        c: &mut Conn,
        at: usize,
        pos: u64,
        len: usize,
    ) -> u64 {
        let slot = self.next_slot % SLOTS;
        self.next_slot = self.next_slot.wrapping_add(1);
        self.slots.released[slot].store(false, Ordering::Relaxed);
        let owner: SharedOwner = Arc::new(TxSpan {
            region: region.clone(),
            at,
            len,
            slots: self.slots.clone(),
            slot,
        });
        self.pinned.push_back(Pinned {
            start: pos,
            slot,
            gid,
            eng: c.eng,
            h: c.h,
            owner: Arc::downgrade(&owner),
            rehomed: false,
        });
        c.zc.q.push_back((owner, 0, len));
        c.zc.bytes += len;
        push_spans(e, c)
    }

    /// Under pressure (more than `limit` of the area held, the oldest span stuck for
    /// [`STUCK`]), copies the oldest pinned spans out of the area until at most half of it
    /// is held: out of their send queues ([`Engine::tcp_zc_rehome`]) and out of their
    /// connections' waiting spans ([`spill`]); returns the bytes copied.
    fn rehome(&mut self, sh: &mut Shared, seen: u64, limit: u64) -> u64 {
        let Some(front) = self.pinned.front() else {
            self.front_since = None;
            return 0;
        };
        if seen - front.start <= limit {
            self.front_since = None;
            return 0;
        }
        let now = Instant::now();
        match self.front_since {
            Some((s, t)) if s == front.start => {
                if now.duration_since(t) < STUCK {
                    return 0;
                }
            }
            _ => {
                self.front_since = Some((front.start, now));
                return 0;
            }
        }
        self.front_since = None;
        let mut copied = 0u64;
        for p in self.pinned.iter_mut() {
            if seen - p.start <= TX_SIZE as u64 / 2 {
                break;
            }
            if p.rehomed {
                continue;
            }
            p.rehomed = true;
            let Some(owner) = p.owner.upgrade() else {
                continue; // released meanwhile
            };
            if let Some(Kind::Conn(c)) = sh.socks.get_mut(&p.gid).map(|g| &mut g.kind) {
                if c.zc.q.iter().any(|(o, ..)| Arc::ptr_eq(o, &owner)) {
                    copied += spill(c) as u64;
                }
            }
            if let Some(e) = sh.lo.engines.get_mut(p.eng) {
                copied += e.tcp_zc_rehome(p.h, &owner).unwrap_or(0) as u64;
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

    /// Free room in the transmit area in the daemon's view (at least the client's).
    fn tx_room_seen(&self) -> u64 {
        TX_SIZE as u64 - (self.tx_freed - self.tx_released()).min(TX_SIZE as u64)
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
        self.tx_room_seen() == 0
    }

    /// The turn's transmit-area work: copies stuck spans out under pressure, advances
    /// `TX_FREED` over released spans and wakes those waiting for area room; true if the
    /// area's state changed.
    pub(crate) fn tx_turn(&mut self, sh: &mut Shared) -> bool {
        if self.txzc.pinned.is_empty() && self.txzc.waiters.is_empty() {
            return false;
        }
        let before = self.tx_released();
        let room_before = self.tx_room_seen();
        let copied = self.txzc.rehome(sh, self.tx_freed, sh.tx_hold_limit);
        if copied > 0 {
            sh.counters.tx_rehomed_bytes += copied;
        }
        self.txzc.pop_released();
        if self.tx_released() == before {
            return copied > 0;
        }
        self.publish_tx_freed();
        let room = self.tx_room_seen();
        if room >= WAKE_ROOM {
            for (gid, handle) in std::mem::take(&mut self.txzc.waiters) {
                self.post(super::service::writable(handle, 0));
                sh.ph_actions.push((gid, false, true));
            }
            if room_before < WAKE_ROOM && self.wants_writable() {
                // A native client waiting for room (or credit): a wake-up for no socket.
                self.post(super::service::writable(0, 0));
            }
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
            let s = span(&z, &region, slot);
            let owner: SharedOwner = Arc::new(s);
            z.pinned.push_back(Pinned {
                start: 100 + i * ZC_MIN as u64,
                slot,
                gid: 1,
                eng: 0,
                h: TcpHandle::from_raw(1),
                owner: Arc::downgrade(&owner),
                rehomed: false,
            });
            spans.push(Some(owner));
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
}
