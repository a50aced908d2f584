//! `send_file` from mapped windows of the file ([`FileSendMode::Map`]): the segments, and
//! their retransmissions, are cut straight from the page cache.
//!
//! # Windows
//!
//! The file is mapped read-only and shared ([`MappedWindow`], `flowstack-sys`'s `filemap`) in
//! windows of up to [`MAP_WINDOW`] bytes starting at the offset being sent (the mapping starts
//! at the page below it), populated as they are mapped (`MAP_POPULATE`, see the README for the
//! measurement against `madvise(WILLNEED)`). Sub-ranges of a window go to the connection as
//! zero-copy sends ([`ExtBuf::Shared`]), as large as the send buffer's room allows; the send
//! queue holds a reference to the window until those bytes are acknowledged, and the window is
//! unmapped once the engine's own reference is the last one. An engine keeps at most
//! [`MAX_WINDOWS`] windows mapped (it falls back to reading when they are all busy), so a file
//! larger than memory or than 4 GiB is sent through a bounded window of its pages.
//!
//! # Truncation: the connection is reset, never fed zeros
//!
//! A page of a window that lies past the end of a file truncated after it was mapped cannot
//! be read: the kernel raises `SIGBUS`. The process-wide guard (`flowstack_sys::filemap`)
//! catches it for registered windows, maps a zero page in its place and flags the window;
//! segment output resumes with zeros in the frame. A file cut inside a page faults on nothing
//! (the rest of that page reads as zeros). So before any frame leaves the engine
//! ([`Engine::poll`] before the device's `send_batch`, and [`Engine::tx`]) every window with
//! bytes still queued is checked: flagged by the guard, or its file now shorter than the bytes
//! handed out from it (one `fstat` per such window). If either holds:
//!
//! 1. every frame built since the last transmission is discarded ([`Counter::EthExtFileMapDrops`]):
//!    any of them may carry zeros instead of file bytes — other connections' frames among them
//!    are simply lost and retransmitted;
//! 2. the connection is reset ([`Engine::tcp_abort`]: RST to the peer, which sees a reset,
//!    never a complete-looking stream; [`Counter::TcpExtFileMapResets`]), and the RST is built
//!    at once;
//! 3. the sender's next `send_file` on that connection fails with [`FileError::ShortFile`] at
//!    the file's new size (once; calls after that see the aborted socket's error).
//!
//! Bytes sent before the truncation are file bytes; the peer got a prefix of the file and
//! then a reset. (`sendfile(2)` ends short on bytes it had not yet queued; pages it had queued
//! go out as they are.) A cut beyond every byte handed out ends the transfer short with
//! [`FileError::ShortFile`] and no reset, as in read mode.
//!
//! # Rewriting
//!
//! A page rewritten (not truncated) while its bytes are queued is sent as it reads at the
//! time each segment is cut: a segment sent before the write and retransmitted after it
//! carries different bytes, and the peer keeps whichever arrived first. This is the same
//! contract as Linux's `sendfile(2)`, whose socket buffers hold references to the page-cache
//! pages, not copies: the file must not be modified while it is being sent.

use super::Engine;
use crate::{Counter, TcpHandle};
use flowstack_api::socket::check_range;
use flowstack_api::{FileError, SocketError};
use flowstack_sys::filemap::{MappedWindow, Populate};
use flowstack_tcp::sendq::ExtBuf;
use flowstack_tcp::{FourTuple, State};
use flowstack_wire::ipv4::IpProtocol;
use flowstack_wire::tcp::{Flags, TcpOptions, TcpRepr};
use flowstack_wire::SeqNum;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// How [`Engine::send_file`] sends a file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileSendMode {
    /// `pread` into pooled [`super::FILE_CHUNK`] buffers that become the segments (one copy
    /// from the page cache); a truncated file simply reads short. The default: it costs less
    /// CPU per GiB than mapping on the machines measured (README, "File transfer").
    #[default]
    Read,
    /// Mapped windows of the file become the segments (no copy from the page cache, but
    /// every page is mapped and unmapped once per window; see the module docs for truncation).
    Map,
}

/// Bytes mapped per window.
pub const MAP_WINDOW: usize = 8 << 20;

/// Windows an engine keeps mapped at once.
pub const MAX_WINDOWS: usize = 64;

/// Smallest sub-range handed to a connection when more of the window remains: smaller room
/// waits for acknowledgements instead of queueing slivers (each chunk boundary makes one
/// segment gathered through a copy).
const MIN_PIECE: usize = 64 * 1024;

/// Connections whose reset for truncation is not yet reported to `send_file`.
const MAX_FAILED: usize = 64;

/// A mapped window and what the engine knows about it.
#[derive(Debug)]
struct Live {
    win: Arc<MappedWindow>,
    h: TcpHandle,
    /// The file, to check its size (its own descriptor).
    file: File,
    id: (u64, u64),
    /// File offset just past the last byte handed to the connection.
    handed_end: u64,
    /// SND.MAX of the connection when its frames last left the engine: the peer's RCV.NXT
    /// once they arrive (the reset's sequence number, module docs).
    tx_nxt: SeqNum,
}

impl Live {
    fn end(&self) -> u64 {
        self.win.offset() + self.win.len() as u64
    }
    /// Whether the send queue still references the window.
    fn in_flight(&self) -> bool {
        Arc::strong_count(&self.win) > 1
    }
}

/// The engine's mapped windows and the mode.
#[derive(Debug)]
pub(crate) struct MapSends {
    pub(crate) mode: FileSendMode,
    pub(crate) populate: Populate,
    live: Vec<Live>,
    failed: Vec<(TcpHandle, u64)>,
    mapped: u64,
}

impl Default for MapSends {
    fn default() -> Self {
        Self {
            mode: FileSendMode::default(),
            populate: Populate::Map,
            live: Vec::new(),
            failed: Vec::new(),
            mapped: 0,
        }
    }
}

impl MapSends {
    /// Drops windows nobody sends from any more: released by their queue and either used up
    /// or belonging to `h`'s past (`all`: any released window).
    fn evict(&mut self, all: bool) {
        self.live
            .retain(|l| l.in_flight() || (!all && l.handed_end < l.end()));
    }
}

impl Engine {
    /// Chooses how [`Engine::send_file`] sends (default [`FileSendMode::Read`]).
    pub fn set_file_send_mode(&mut self, mode: FileSendMode) {
        self.maps.mode = mode;
    }

    /// How [`Engine::send_file`] sends.
    pub fn file_send_mode(&self) -> FileSendMode {
        self.maps.mode
    }

    /// How mapped windows are populated (default `MAP_POPULATE`; for measurements).
    pub fn set_file_map_populate(&mut self, p: Populate) {
        self.maps.populate = p;
    }

    /// Windows mapped by this engine so far, and mapped now.
    pub fn file_windows(&self) -> (u64, usize) {
        (self.maps.mapped, self.maps.live.len())
    }

    /// [`Engine::send_file`] in [`FileSendMode::Map`].
    pub(super) fn send_file_mapped(
        &mut self,
        h: TcpHandle,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<usize, FileError> {
        check_range(offset, len)?;
        if let Some(i) = self.maps.failed.iter().position(|f| f.0 == h) {
            let (_, at) = self.maps.failed.remove(i);
            // Only for the connection that was reset, not a later one under the same handle.
            if self.tcp_conn(h).is_ok_and(|c| c.state() == State::Closed) {
                return Err(FileError::ShortFile { at });
            }
        }
        if len == 0 {
            return Ok(0);
        }
        self.tcp_send(h, &[])?;
        let meta = file.metadata().map_err(FileError::from)?;
        let (size, id) = (meta.len(), (meta.dev(), meta.ino()));
        let mut done = 0usize;
        while (done as u64) < len {
            let at = offset + done as u64;
            if at >= size {
                // As the read path: the error names where the caller's data ran out.
                return some_or(done, FileError::ShortFile { at });
            }
            let avail = (len - done as u64).min(size - at);
            let (room, queued) = {
                let c = self.tcp_conn(h)?;
                (c.send_room(), c.send_queue())
            };
            if room == 0 {
                break;
            }
            let i = match self.window_for(h, file, id, at, avail) {
                Some(i) => i,
                None => {
                    // Every window busy (or mapping failed): this call reads instead.
                    let r = self.send_file_read(h, file, at, len - done as u64);
                    return match r {
                        Ok(n) => Ok(done + n),
                        Err(e) => some_or(done, e),
                    };
                }
            };
            let l = &self.maps.live[i];
            let win_left = l.end() - at;
            let n = avail.min(win_left).min(room as u64) as usize;
            if (n as u64) < avail
                && (n as u64) < win_left
                && n < MIN_PIECE
                && room + queued >= MIN_PIECE
            {
                break;
            }
            let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = l.win.clone();
            let start = (at - l.win.offset()) as usize;
            let buf = ExtBuf::shared(owner, start, n).expect("the range lies in the window");
            match self.tcp_send_zc(h, buf) {
                Ok(_token) => {
                    done += n;
                    let l = &mut self.maps.live[i];
                    l.handed_end = l.handed_end.max(at + n as u64);
                }
                Err(SocketError::WouldBlock) => break,
                Err(e) => return some_or(done, e.into()),
            }
        }
        some_or(done, FileError::Socket(SocketError::WouldBlock))
    }

    /// The index of a live window of `h` holding `at`, mapping one if needed.
    fn window_for(
        &mut self,
        h: TcpHandle,
        file: &File,
        id: (u64, u64),
        at: u64,
        avail: u64,
    ) -> Option<usize> {
        let found = self
            .maps
            .live
            .iter()
            .position(|l| l.h == h && l.id == id && l.win.offset() <= at && at < l.end());
        if found.is_some() {
            return found;
        }
        self.maps.evict(false);
        if self.maps.live.len() >= MAX_WINDOWS {
            self.maps.evict(true);
            if self.maps.live.len() >= MAX_WINDOWS {
                return None;
            }
        }
        let len = avail.min(MAP_WINDOW as u64) as usize;
        let tx_nxt = self.tcp_conn(h).ok()?.send_seq().1;
        let win = MappedWindow::map(file, at, len, self.maps.populate).ok()?;
        let file = file.try_clone().ok()?;
        self.maps.mapped += 1;
        self.maps.live.push(Live {
            win: Arc::new(win),
            h,
            file,
            id,
            handed_end: at,
            tx_nxt,
        });
        Some(self.maps.live.len() - 1)
    }

    /// Before frames leave: resets every connection whose in-flight window's file was
    /// truncated, discarding the frames built meanwhile (module docs).
    pub(super) fn check_mapped_windows(&mut self) {
        // Each round resets at least one connection and forgets its windows: bounded.
        while !self.maps.live.is_empty() {
            let mut bad: Vec<(TcpHandle, u64, SeqNum)> = Vec::new();
            self.maps.live.retain(|l| {
                if !l.in_flight() {
                    return true;
                }
                let size = l.file.metadata().map(|m| m.len()).unwrap_or(0);
                if l.win.truncated() || size < l.handed_end {
                    bad.push((l.h, size.min(l.handed_end), l.tx_nxt));
                    return false; // the queue's references go with the connection
                }
                true
            });
            if bad.is_empty() {
                break;
            }
            let dropped = self.iface.tx().len() as u64;
            self.iface.tx_mut().clear();
            let c = self.iface.counters_mut();
            c.add(Counter::EthExtFileMapDrops, dropped);
            c.add(Counter::TcpExtFileMapResets, bad.len() as u64);
            let mut extra = Vec::new();
            for &(h, at, tx_nxt) in &bad {
                if let Ok(c) = self.tcp.conn(h) {
                    let (una, max) = c.send_seq();
                    extra.push((c.tuple(), una, tx_nxt, max));
                }
                let _ = self.tcp_abort(h);
                if !self.maps.failed.iter().any(|f| f.0 == h) {
                    if self.maps.failed.len() >= MAX_FAILED {
                        self.maps.failed.remove(0);
                    }
                    self.maps.failed.push((h, at));
                }
            }
            // The connections' own RSTs (at SND.NXT, which counts the discarded frames' bytes)
            // go out with this transmission, then the ones the peer can accept.
            let now = self.now;
            self.tcp.dispatch(now, &mut self.iface);
            for (t, una, tx_nxt, max) in extra {
                self.reset_at(&t, tx_nxt, max);
                if una != tx_nxt {
                    self.reset_at(&t, una, max);
                }
            }
        }
        // Frames leave now: remember how far each mapped connection's got.
        for l in &mut self.maps.live {
            if l.in_flight() {
                if let Ok(c) = self.tcp.conn(l.h) {
                    l.tx_nxt = c.send_seq().1;
                }
            }
        }
    }

    /// An RST with sequence number `seq` on `t` (unless it is SND.MAX, which the aborted
    /// connection's own RST carries). RFC 5961 §3.2: the peer resets only when `seq` is its
    /// RCV.NXT exactly; `seq` is where the last transmitted frames end (no loss: everything
    /// arrived before this RST) or SND.UNA (everything unacknowledged lost).
    fn reset_at(&mut self, t: &FourTuple, seq: SeqNum, max: SeqNum) {
        if seq == max {
            return;
        }
        let r = TcpRepr {
            src_port: t.local_port,
            dst_port: t.remote_port,
            seq,
            ack: SeqNum(0),
            flags: Flags::RST,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
            payload: &[],
        };
        let caps = self.iface.checksum();
        let (src, dst) = (t.local_ip, t.remote_ip);
        let now = self.now;
        // Best effort, as every RST: an unresolved neighbour or a full queue loses it.
        let _ = self.iface.send_ip_from(
            now,
            src,
            dst,
            IpProtocol::Tcp,
            r.buffer_len(),
            true,
            &mut |b| r.emit(b, src, dst, caps),
        );
        let c = self.iface.counters_mut();
        c.inc(Counter::TcpOutRsts);
        c.inc(Counter::TcpOutSegs);
    }
}

/// `done` bytes if any moved, else `e`.
fn some_or(done: usize, e: FileError) -> Result<usize, FileError> {
    if done > 0 {
        Ok(done)
    } else {
        Err(e)
    }
}
