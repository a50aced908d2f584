//! Received bytes read straight from the receive area.
//!
//! The daemon writes a connection's bytes into this application's receive area and posts a
//! `Data` event per span. A socket the application reads with [`Sockets::tcp_recv`] (the
//! copying call) keeps its spans where they lie (*held*) and each read copies them once, from
//! the area into the caller's buffer; before, every span was first copied into the socket's
//! queue (`Sock::rx`, after zero-filling it) and again out of it — three passes over each
//! byte instead of one.
//!
//! The area is one ring for all of the application's sockets and is released in order
//! (`RX_FREED`), so a span is released once it and every span before it is read. A socket
//! that is not read must not hold the area for the others — neither with its own bytes nor
//! with the bytes of others read behind it, which cannot be released before it: when more
//! than half of the area is not released, the oldest unread spans are copied into their
//! sockets' queues (*evicted*) until it is half again.
//! Sockets read with [`Sockets::tcp_peek`] (which borrows bytes in place) are never held:
//! their spans are copied into the queue at once, as before. A socket starts holding at its
//! first `tcp_recv` (the POSIX layer's sockets: at their first `recv`);
//! [`Sockets::tcp_consume`] evicts its held spans and stops it, so a program that switches to
//! `tcp_peek` after consuming sees every byte. A POSIX `recv` with `MSG_PEEK` evicts the
//! socket's held spans into its queue and copies from there, leaving them unread.
//!
//! Every span was checked against the area when its event was decoded (`check_span`).
//!
//! [`Sockets::tcp_recv`]: flowstack_api::Sockets::tcp_recv
//! [`Sockets::tcp_peek`]: flowstack_api::Sockets::tcp_peek
//! [`Sockets::tcp_consume`]: flowstack_api::Sockets::tcp_consume

use super::*;

/// One `Data` span of the receive area, in delivery order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    handle: u32,
    /// Offset within the area, and length (a span never wraps: the daemon splits at the end).
    off: usize,
    len: usize,
    /// Bytes of it already read or evicted.
    taken: usize,
}

impl Client {
    /// A `Data` event of `len` bytes at `off` for socket `handle`.
    pub(crate) fn on_data(&mut self, handle: u32, off: usize, len: usize) {
        let mut taken = len;
        if let Some(s) = self.socks.get_mut(&handle) {
            s.rgen = s.rgen.wrapping_add(1);
            if s.direct {
                s.held += len;
                taken = 0;
            } else {
                append_from(&self.region, self.rx_off + off, len, &mut s.rx);
                self.rx_copied += len as u64;
            }
        }
        self.release_or_hold(handle, off, len, taken);
    }

    /// Span `off..off+len` of socket `handle`, `taken` bytes of it already copied out:
    /// released at once if wholly taken with nothing held before it, else held in order.
    fn release_or_hold(&mut self, handle: u32, off: usize, len: usize, taken: usize) {
        if taken == len && self.spans.is_empty() {
            self.release_rx(len as u64);
        } else {
            self.span_bytes += len as u64;
            self.spans.push_back(Span {
                handle,
                off,
                len,
                taken,
            });
        }
    }

    /// Reads socket `raw`'s unread bytes into `buf` (those copied out into its queue first,
    /// then those held in the area) and holds its next ones; how many. With `peek` they stay
    /// unread: its held bytes are moved into the queue and copied from there.
    pub(crate) fn read_unread(&mut self, raw: u32, buf: &mut [u8], peek: bool) -> usize {
        if peek {
            self.evict_sock(raw, true);
        }
        let Some(s) = self.socks.get_mut(&raw) else {
            return 0;
        };
        s.direct = true;
        if peek {
            let n = copy_front(&s.rx, buf);
            return n + self.pipe_read(raw, &mut buf[n..], true);
        }
        let n = take_front(&mut s.rx, buf);
        let n = n + self.read_held(raw, &mut buf[n..]);
        n + self.pipe_read(raw, &mut buf[n..], false)
    }

    /// `len` bytes at `off` already copied out (a datagram): released at once, or in order
    /// behind the spans still held.
    pub(crate) fn release_copied(&mut self, handle: u32, off: usize, len: usize) {
        self.release_or_hold(handle, off, len, len);
    }

    /// Copies socket `raw`'s held bytes, oldest first, into `buf`; how many.
    fn read_held(&mut self, raw: u32, buf: &mut [u8]) -> usize {
        let Some(s) = self.socks.get_mut(&raw) else {
            return 0;
        };
        let mut n = 0;
        for sp in self.spans.iter_mut() {
            if s.held == 0 || n == buf.len() {
                break;
            }
            if sp.handle != raw || sp.taken == sp.len {
                continue;
            }
            let k = (sp.len - sp.taken).min(buf.len() - n);
            let _ = self
                .region
                .read_at(self.rx_off + sp.off + sp.taken, &mut buf[n..n + k]);
            sp.taken += k;
            s.held -= k;
            n += k;
        }
        self.free_spans();
        n
    }

    /// Moves socket `raw`'s held bytes into its queue (and, unless `keep_direct`, stops
    /// holding for it), or forgets them if the socket is gone.
    pub(crate) fn evict_sock(&mut self, raw: u32, keep_direct: bool) {
        if let Some(s) = self.socks.get_mut(&raw) {
            s.direct &= keep_direct;
            if s.held == 0 {
                return;
            }
        }
        for i in 0..self.spans.len() {
            if self.spans[i].handle == raw {
                self.evict(i);
            }
        }
        self.free_spans();
    }

    /// After a batch of events: evicts the oldest unread spans while more than half the
    /// area is not released, so sockets nobody reads never stall delivery to the others.
    pub(crate) fn relieve_rx(&mut self) {
        while self.span_bytes > self.rx_size / 2 {
            let Some(i) = self.spans.iter().position(|sp| sp.taken < sp.len) else {
                break;
            };
            self.evict(i);
            self.free_spans();
        }
    }

    /// Copies what is left of span `i` into its socket's queue (or drops it: socket gone).
    fn evict(&mut self, i: usize) {
        let sp = &mut self.spans[i];
        let left = sp.len - sp.taken;
        if left == 0 {
            return;
        }
        if let Some(s) = self.socks.get_mut(&sp.handle) {
            append_from(
                &self.region,
                self.rx_off + sp.off + sp.taken,
                left,
                &mut s.rx,
            );
            s.held -= left;
            self.rx_copied += left as u64;
        }
        sp.taken = sp.len;
    }

    /// Releases the spans read or evicted at the front of the area.
    fn free_spans(&mut self) {
        let mut freed = 0u64;
        while let Some(sp) = self.spans.front() {
            if sp.taken < sp.len {
                break;
            }
            freed += sp.len as u64;
            self.span_bytes -= sp.len as u64;
            self.spans.pop_front();
        }
        if freed > 0 {
            self.release_rx(freed);
        }
    }

    /// Tells the daemon `n` more bytes of the area are free.
    fn release_rx(&mut self, n: u64) {
        self.rx_freed += n;
        if let Some(a) = self.region.atomic_u64(layout::at::RX_FREED) {
            a.store(self.rx_freed, Ordering::Release);
        }
    }
}

/// Appends `len` bytes of `region` from `at` to `rx`.
pub(crate) fn append_from(region: &SharedRegion, at: usize, len: usize, rx: &mut VecDeque<u8>) {
    let start = rx.len();
    rx.resize(start + len, 0);
    let (a, b) = rx.as_mut_slices();
    // The new bytes are the tail; copy into the (at most two) slices.
    let mut dst_at = start;
    let mut src = at;
    for part in [a, b] {
        if dst_at >= part.len() {
            dst_at -= part.len();
            continue;
        }
        let take = &mut part[dst_at..];
        let _ = region.read_at(src, take);
        src += take.len();
        dst_at = 0;
    }
}
