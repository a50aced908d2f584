//! Zero-copy file transfer (seed 002's `direct_rw(file, bytes, socket)`): `send_file` and
//! `recv_to_file`.
//!
//! # Sending (read mode): read once into pooled chunks that become the segments
//!
//! [`Engine::send_file`] reads the file with `pread(2)` into [`FILE_CHUNK`]-byte buffers taken
//! from a per-engine pool and hands each buffer to the connection whole as a zero-copy send
//! ([`Engine::tcp_send_zc`]): the segments, and their retransmissions, are cut from that
//! buffer until the peer acknowledges it; the send queue then drops its reference and the
//! buffer is free for the next chunk. A chunk is therefore read from the page cache exactly
//! once and copied at most once more: into the outgoing frame, or — on a device that gathers
//! (the in-process pipe: scatter-gather transmit, `Iface::send_ip_gather`) — not on the
//! sending side at all, the frame referencing the chunk until the receiver copied it. A
//! read/write loop makes three copies (file → application buffer → send ring → frame), and
//! a frame in flight keeps its chunk out of the pool (reuse needs `Arc::get_mut`). Once the pool holds a
//! connection's window of chunks, nothing is allocated.
//!
//! This is [`FileSendMode::Read`], the default. [`FileSendMode::Map`] (`file_map.rs`) sends
//! from mapped windows of the file instead, saving the copy into the chunk; it needs a
//! `SIGBUS` guard and resets the connection when the file is truncated under queued bytes,
//! and sends rewritten pages as they read (as `sendfile(2)` does). Measured with `bench file`
//! it costs more CPU than it saves here (mapping and unmapping each page costs about as much
//! as copying it; see the README), hence the default. Reading once gives the stream the
//! file's bytes as of the read, and a truncation shows as a short read: the transfer ends
//! short with [`FileError::ShortFile`], as `sendfile(2)` does.
//!
//! Tails shorter than a chunk (and sends into a send buffer smaller than a chunk) are
//! copied into the send ring through a pooled buffer: no allocation per request for small
//! files.
//!
//! # Receiving: straight from the receive buffer
//!
//! [`Engine::recv_to_file`] borrows the readable bytes where they lie in the receive ring (one
//! or two slices), writes them with one `pwritev(2)`, and only then consumes them.

use super::{Engine, FileSendMode};
use crate::TcpHandle;
use flowstack_api::socket::{check_range, read_at};
use flowstack_api::{FileError, SocketError};
use flowstack_tcp::sendq::ExtBuf;
use std::collections::VecDeque;
use std::fs::File;
use std::sync::Arc;

/// Bytes per zero-copy chunk. Large enough that few segments straddle two chunks (a
/// straddling segment is gathered, one extra copy; with 64 KiB segments one in eight), small
/// enough that two fit in the default 1 MiB send buffer, so one is in flight while the next
/// waits for room. Measured with `bench file` (1 GiB, 7 rounds, same machine and load):
/// send_file over the read/write loop 1.36x with 512 KiB chunks, 1.27x with 256 KiB.
pub const FILE_CHUNK: usize = 512 * 1024;

/// Free buffers the pool keeps (16 MiB of chunks); beyond that, buffers of a burst are freed
/// when their connection lets go of them. Busy buffers are bounded by the send buffers.
const POOL_KEEP: usize = 32;

/// How many of the oldest pooled buffers are tried before a new one is allocated.
const POOL_PROBES: usize = 4;

/// Where a chunk starts within its allocation: a page boundary. The kernel's copy out of the
/// page cache (`pread`) is sensitive to the destination's alignment: on the 2-vCPU AMD EPYC
/// VM `bench file` runs on, 512 KiB preads into a destination 16 bytes past a 64-byte
/// boundary ran at half speed (0.51 against 0.24–0.27 s/GiB at 0, 32 and 48 bytes past it,
/// same run, load 9.5; 0.14 against 0.056 quiet). Where the allocator puts a buffer depends
/// on the heap's history: `Arc<[u8]>` chunks as allocated before landed at 32, 0, 48 and
/// then 16 bytes past a cache line (glibc's mmap threshold rises once a large block is
/// freed, and later chunks come from the heap). Aligning costs one page per chunk.
pub(crate) const CHUNK_ALIGN: usize = 4096;

/// One pooled chunk: [`FILE_CHUNK`] bytes starting at a [`CHUNK_ALIGN`] boundary inside a
/// slightly larger allocation. Never re-zeroed: a chunk is filled by `pread` before any of it
/// is handed out, and only the bytes read are.
#[derive(Debug)]
pub(crate) struct Chunk {
    mem: Box<[u8]>,
    start: usize,
}

impl Chunk {
    fn new() -> Self {
        // Zeroed by the allocator (fresh pages from the kernel for a block this large).
        let mem = vec![0u8; FILE_CHUNK + CHUNK_ALIGN].into_boxed_slice();
        let start = (CHUNK_ALIGN - mem.as_ptr() as usize % CHUNK_ALIGN) % CHUNK_ALIGN;
        Chunk { mem, start }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + FILE_CHUNK]
    }
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.mem[self.start..self.start + FILE_CHUNK]
    }
}

/// The per-engine pool of file chunks. A chunk is free when the pool holds its only
/// reference (its connection acknowledged it, or closed).
#[derive(Debug, Default)]
pub(crate) struct FilePool {
    /// Chunks in the order they were last handed out: the front is the oldest, the likeliest
    /// acknowledged.
    bufs: VecDeque<Arc<Chunk>>,
    allocated: u64,
}

impl FilePool {
    /// A chunk nobody else references (ready to be filled), reused when possible.
    fn take(&mut self) -> Arc<Chunk> {
        for _ in 0..self.bufs.len().min(POOL_PROBES) {
            let Some(mut b) = self.bufs.pop_front() else {
                break;
            };
            if Arc::get_mut(&mut b).is_some() {
                return b;
            }
            self.bufs.push_back(b);
        }
        self.allocated += 1;
        Arc::new(Chunk::new())
    }

    /// Remembers `b` (about to be lent to a connection) for reuse once it is released.
    fn lend(&mut self, b: &Arc<Chunk>) {
        if self.bufs.len() < POOL_KEEP {
            self.bufs.push_back(b.clone());
        }
    }

    /// Returns a chunk that was only used as scratch: it is the first to be reused.
    fn give_back(&mut self, b: Arc<Chunk>) {
        if self.bufs.len() < POOL_KEEP {
            self.bufs.push_front(b);
        }
    }
}

/// The writable bytes of a chunk the pool just handed out.
fn fill(b: &mut Arc<Chunk>) -> &mut [u8] {
    Arc::get_mut(b)
        .expect("the pool hands out unshared chunks")
        .bytes_mut()
}

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full(file: &File, buf: &mut [u8], mut offset: u64) -> Result<usize, FileError> {
    let mut got = 0;
    while got < buf.len() {
        match read_at(file, &mut buf[got..], offset)? {
            0 => break,
            n => {
                got += n;
                offset += n as u64;
            }
        }
    }
    Ok(got)
}

/// `done` bytes if any moved, else `e`.
fn some_or(done: usize, e: FileError) -> Result<usize, FileError> {
    if done > 0 {
        Ok(done)
    } else {
        Err(e)
    }
}

impl Engine {
    /// Queues up to `len` bytes of `file` from `offset` on connection `h`, as much as its send
    /// buffer takes now, and returns how many were queued (a non-blocking `sendfile(2)`: call
    /// again with the offset advanced once the socket is writable). `WouldBlock` if none fit.
    ///
    /// Whole [`FILE_CHUNK`]s go out without a copy into the send buffer (see the module docs)
    /// and each reports a zero-copy token through [`Engine::tcp_zc_completion`] when
    /// acknowledged (taking them is optional: one not taken holds no memory); every byte is
    /// acknowledged once the connection's send queue is empty.
    /// A file ending before `offset + len` ends the transfer short: the bytes before its end
    /// are queued, and the call that starts at the end fails with [`FileError::ShortFile`].
    /// A range whose end is not a file offset is [`FileError::BadRange`].
    pub fn send_file(
        &mut self,
        h: TcpHandle,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<usize, FileError> {
        match self.maps.mode {
            FileSendMode::Map => self.send_file_mapped(h, file, offset, len),
            FileSendMode::Read => self.send_file_read(h, file, offset, len),
        }
    }

    /// [`Engine::send_file`] in [`FileSendMode::Read`] (and when no window can be mapped).
    pub(super) fn send_file_read(
        &mut self,
        h: TcpHandle,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<usize, FileError> {
        check_range(offset, len)?;
        if len == 0 {
            return Ok(0);
        }
        // A dead or shut-down socket fails here, before any read.
        self.tcp_send(h, &[])?;
        let mut done = 0usize;
        while (done as u64) < len {
            let left = len - done as u64;
            let at = offset + done as u64;
            let (room, queued) = {
                let c = self.tcp_conn(h)?;
                (c.send_room(), c.send_queue())
            };
            if left >= FILE_CHUNK as u64 && room >= FILE_CHUNK {
                let mut buf = self.files.take();
                let n = match read_full(file, fill(&mut buf), at) {
                    Ok(n) => n,
                    Err(e) => {
                        self.files.give_back(buf);
                        return some_or(done, e);
                    }
                };
                if n < FILE_CHUNK {
                    // The file ended early: queue what there is (copied), then stop short.
                    let k = self.copy_in(h, buf, n);
                    done += k;
                    return some_or(done, FileError::ShortFile { at: at + n as u64 });
                }
                self.files.lend(&buf);
                let whole =
                    ExtBuf::shared(buf, 0, FILE_CHUNK).expect("a chunk holds FILE_CHUNK bytes");
                match self.tcp_send_zc(h, whole) {
                    Ok(_token) => done += FILE_CHUNK,
                    Err(e) => return some_or(done, e.into()),
                }
            } else if room > 0 && (left < FILE_CHUNK as u64 || room + queued < FILE_CHUNK) {
                // A tail, or a send buffer that can never hold a chunk: copy what fits.
                let want = left.min(room.min(FILE_CHUNK) as u64) as usize;
                let mut buf = self.files.take();
                let n = match read_full(file, &mut fill(&mut buf)[..want], at) {
                    Ok(n) => n,
                    Err(e) => {
                        self.files.give_back(buf);
                        return some_or(done, e);
                    }
                };
                let k = self.copy_in(h, buf, n);
                done += k;
                if n < want {
                    return some_or(done, FileError::ShortFile { at: at + n as u64 });
                }
                if k < n {
                    break;
                }
            } else {
                break;
            }
        }
        some_or(done, FileError::Socket(SocketError::WouldBlock))
    }

    /// Copies the first `n` bytes of `buf` into the send ring and returns the buffer to the
    /// pool; how many bytes were taken.
    fn copy_in(&mut self, h: TcpHandle, buf: Arc<Chunk>, n: usize) -> usize {
        let k = if n > 0 {
            self.tcp_send(h, &(*buf).as_ref()[..n]).unwrap_or(0)
        } else {
            0
        };
        self.files.give_back(buf);
        k
    }

    /// Writes up to `max` received bytes of connection `h` to `file` at `offset` straight from
    /// the receive buffer (one `pwritev(2)` of the one or two slices they occupy) and returns
    /// how many. `Ok(0)` with `max > 0` is end of stream; `WouldBlock`: nothing has arrived.
    /// Bytes are consumed only after they are written, so a failed write loses nothing.
    pub fn recv_to_file(
        &mut self,
        h: TcpHandle,
        file: &File,
        offset: u64,
        max: usize,
    ) -> Result<usize, FileError> {
        check_range(offset, max as u64)?;
        let (a, b) = self.tcp_peek(h, max)?;
        let n = a.len() + b.len();
        if n == 0 {
            if max == 0 || self.tcp_at_eof(h) {
                return Ok(0);
            }
            return Err(self.tcp_error(h).unwrap_or(SocketError::WouldBlock).into());
        }
        flowstack_sys::file::pwritev_all(file, &[a, b], offset)?;
        self.tcp_consume(h, n)?;
        Ok(n)
    }

    /// File chunks allocated by this engine so far (the pool's warm-up; constant once warm).
    pub fn file_chunks_allocated(&self) -> u64 {
        self.files.allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_start_on_a_page_whatever_the_allocator_returns() {
        // Allocations of assorted sizes in between shift where the allocator places the
        // next block; every chunk still starts on a page and holds FILE_CHUNK bytes.
        let mut keep = Vec::new();
        for i in 0..8 {
            keep.push(vec![0u8; 17 + i * 1000]);
            let mut c = Chunk::new();
            assert_eq!(c.as_ref().as_ptr() as usize % CHUNK_ALIGN, 0);
            assert_eq!(c.as_ref().len(), FILE_CHUNK);
            c.bytes_mut()[FILE_CHUNK - 1] = 7;
            assert_eq!(c.as_ref()[FILE_CHUNK - 1], 7);
        }
    }

    #[test]
    fn a_released_chunk_is_reused_with_its_bytes_untouched() {
        let mut pool = FilePool::default();
        let mut a = pool.take();
        fill(&mut a)[..3].copy_from_slice(b"abc");
        pool.lend(&a);
        let lent = a.clone();
        // Still lent: the pool allocates another.
        let b = pool.take();
        assert_eq!(pool.allocated, 2);
        pool.give_back(b);
        drop((a, lent));
        // Released: reused as it was (not re-zeroed), no allocation.
        let mut c = pool.take();
        let d = pool.take();
        assert_eq!(pool.allocated, 2);
        let bytes = [&(*c).as_ref()[..3], &(*d).as_ref()[..3]];
        assert!(bytes.contains(&&b"abc"[..]), "{bytes:?}");
        assert!(Arc::get_mut(&mut c).is_some());
    }

    #[test]
    fn a_chunk_is_not_reused_while_a_gathered_frame_references_it() {
        let mut pool = FilePool::default();
        let mut a = pool.take();
        fill(&mut a)[..2].copy_from_slice(b"ok");
        pool.lend(&a);
        // The connection let go (all acknowledged), but a frame in flight still holds it.
        let owner: flowstack_link::SharedBytes = a.clone();
        let frame = flowstack_link::TxPayload::new(owner, 0, 2).unwrap();
        drop(a);
        let b = pool.take();
        assert_eq!(pool.allocated, 2, "reused under a frame in flight");
        assert_eq!(frame.bytes(), b"ok");
        pool.give_back(b);
        drop(frame);
        // Received: the chunk is free again.
        let _c = pool.take();
        let _d = pool.take();
        assert_eq!(pool.allocated, 2);
    }
}
