//! Which sockets may have changed, in order: the shim's `epoll_wait` looks at those (and at
//! the ones it reported ready last time) instead of every socket it watches, so its cost
//! follows the sockets that are busy, not the idle ones (an nginx worker's thousands of
//! keep-alive connections).
//!
//! [`Client::pump`] notes the socket of every event it takes (and the listener an accept's
//! answer lands on); a call of the POSIX layer on a socket notes it too (its own reads,
//! writes, shutdowns change what it is ready for). The log is a ring of [`CAP`] handles
//! with a running count: a reader keeps a [`Cursor`] and asks for what was noted since; if
//! the ring went round meanwhile (more than [`CAP`] notes) or the cursor is another log's
//! (a new registration after `fork`), the answer is "unknown" and the reader looks at
//! everything once. A handle noted twice in a row with no read between is kept once.

use std::sync::atomic::{AtomicU64, Ordering};

/// Notes kept (a reader falling further behind looks at everything once).
pub const CAP: usize = 4096;

/// A reader's place in a log ([`Changes::since`]); the default is "nowhere".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    log: u64,
    seq: u64,
}

#[derive(Debug)]
pub(crate) struct Changes {
    /// This log's identity (no two logs of a process share one).
    id: u64,
    /// Notes ever made; the latest is at `(seq - 1) % CAP`.
    seq: u64,
    /// `seq` at the latest read: a note before it may have been read already.
    read: u64,
    ring: Box<[u32]>,
}

static NEXT_LOG: AtomicU64 = AtomicU64::new(1);

impl Changes {
    pub(crate) fn new() -> Self {
        Self {
            id: NEXT_LOG.fetch_add(1, Ordering::Relaxed),
            seq: 0,
            read: 0,
            ring: vec![0; CAP].into_boxed_slice(),
        }
    }

    /// Socket `h` may have changed.
    pub(crate) fn note(&mut self, h: u32) {
        // The same as the latest note, which no reader has passed yet: kept once.
        if self.seq > self.read && self.ring[((self.seq - 1) % CAP as u64) as usize] == h {
            return;
        }
        self.ring[(self.seq % CAP as u64) as usize] = h;
        self.seq += 1;
    }

    /// Calls `f` with each handle noted since `cur` (oldest first, maybe repeated) and moves
    /// `cur` to now; false (and `f` never called) if that is unknown: look at everything.
    pub(crate) fn since(&mut self, cur: &mut Cursor, mut f: impl FnMut(u32)) -> bool {
        let from = *cur;
        self.read = self.seq;
        *cur = Cursor {
            log: self.id,
            seq: self.seq,
        };
        if from.log != self.id || from.seq > self.seq || self.seq - from.seq > CAP as u64 {
            return false;
        }
        for s in from.seq..self.seq {
            f(self.ring[(s % CAP as u64) as usize]);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(c: &mut Changes, cur: &mut Cursor) -> Option<Vec<u32>> {
        let mut v = Vec::new();
        c.since(cur, |h| v.push(h)).then_some(v)
    }

    #[test]
    fn a_reader_sees_what_was_noted_since_its_cursor_once() {
        let mut c = Changes::new();
        let mut cur = Cursor::default();
        assert_eq!(read(&mut c, &mut cur), None, "a fresh cursor knows nothing");
        c.note(5);
        c.note(5);
        c.note(7);
        c.note(5);
        assert_eq!(read(&mut c, &mut cur), Some(vec![5, 7, 5]));
        assert_eq!(read(&mut c, &mut cur), Some(vec![]));
        c.note(9);
        assert_eq!(read(&mut c, &mut cur), Some(vec![9]));
        // Read since: noted again, for this reader and for one further behind.
        let mut behind = Cursor::default();
        assert_eq!(read(&mut c, &mut behind), None);
        c.note(9);
        c.note(9);
        assert_eq!(read(&mut c, &mut cur), Some(vec![9]));
        c.note(9);
        assert_eq!(read(&mut c, &mut behind), Some(vec![9, 9]));
    }

    #[test]
    fn a_reader_left_behind_by_a_full_ring_or_another_log_is_told_to_look_at_everything() {
        let mut c = Changes::new();
        let mut cur = Cursor::default();
        assert_eq!(read(&mut c, &mut cur), None);
        for h in 0..CAP as u32 {
            c.note(h);
        }
        assert_eq!(read(&mut c, &mut cur).map(|v| v.len()), Some(CAP));
        for h in 0..=CAP as u32 {
            c.note(h);
        }
        assert_eq!(read(&mut c, &mut cur), None, "one note too many");
        assert_eq!(read(&mut c, &mut cur), Some(vec![]));
        let mut other = Changes::new();
        assert_eq!(read(&mut other, &mut cur), None);
    }
}
