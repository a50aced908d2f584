//! Zero-copy file send for applications (`sendfile(2)` through the daemon).
//!
//! The application passes the file's descriptor over its registration stream
//! (`Attach{File}`, SCM_RIGHTS) and then asks for ranges of it with `TcpSendFile`. The daemon
//! sends them with the engine's [`Engine::send_file`](flowstack_stack::Engine::send_file):
//! `pread` into pooled chunks that become the segments, so the bytes never pass through the
//! application's memory or its transmit area.
//!
//! - **Explicit offsets only.** The daemon's copy of the descriptor shares the open file
//!   description (and so the file position) with the application's: it never reads with
//!   `read(2)` or seeks; the application advances its own position.
//! - **Validated.** The descriptor must be a regular file open for reading (else `EINVAL` /
//!   `EBADF`, as `sendfile(2)` answers), the handle a socket of this application; ranges are
//!   checked by the codec (at most `MAX_SPAN`, end within `off_t`). A file truncated during
//!   the send ends it short (the engine's `ShortFile`, answered as 0 bytes: end of file);
//!   the file is never mapped, so no `SIGBUS` can reach the daemon.
//! - **Ordered after bytes already posted.** Bytes of earlier `send`s still queued in the
//!   daemon go first: while any wait, a file send takes nothing (`EAGAIN`).
//! - **Readiness.** A file send that took less than asked remembers how much it wanted; the
//!   holder gets a `Writable` event (and its placeholder is emptied if it asked with
//!   `WantWritable`) once the engine's send buffer has room for the next chunk of it.

use super::*;
use flowstack_api::FileError;
use flowstack_stack::{Engine, FILE_CHUNK};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Most files one application may have attached at once (one per connection in a
/// `sendfile` call; each is a descriptor of the daemon's).
pub const MAX_FILES_PER_APP: usize = 256;

/// Whether a file send waiting on `c` can make progress now: the engine's send buffer takes
/// a chunk of what it wanted (or everything is acknowledged), or the connection failed.
pub(super) fn file_room(e: &Engine, c: &Conn) -> bool {
    let Some(want) = c.file_want else {
        return true;
    };
    if c.queued_here() > 0 {
        return false;
    }
    match e.tcp_conn(c.h) {
        Ok(k) => {
            let need = (want as usize).clamp(1, FILE_CHUNK);
            k.send_room() >= need || k.send_queue() == 0
        }
        Err(_) => true,
    }
}

impl App {
    /// `Attach{File}`: checks the descriptor and attaches it to `handle`.
    pub(super) fn attach_file(&mut self, handle: u32, fd: OwnedFd) -> Result<u64, SocketError> {
        self.gid(handle)?;
        let file = File::from(fd);
        // sendfile(2): an input not open for reading is EBADF (a zero-length read checks the
        // mode and reads nothing) ...
        if let Err(e) = file.read_at(&mut [], 0) {
            return Err(match e.raw_os_error() {
                Some(9) => SocketError::InvalidHandle, // EBADF
                _ => SocketError::InvalidArgument,
            });
        }
        // ... and one that is not a regular file (a directory, a socket) is EINVAL here:
        // only regular files are sent from the daemon (pipes stay on the shim's copy path).
        match file.metadata() {
            Ok(m) if m.is_file() => {}
            _ => return Err(SocketError::InvalidArgument),
        }
        if !self.files.contains_key(&handle) && self.files.len() >= MAX_FILES_PER_APP {
            return Err(SocketError::LimitReached);
        }
        self.files.insert(handle, file);
        Ok(0)
    }

    /// `TcpSendFile`: queues what the connection's send buffer takes of the range.
    pub(super) fn send_file(
        &mut self,
        sh: &mut Shared,
        handle: u32,
        offset: u64,
        len: u64,
    ) -> Result<u64, SocketError> {
        let gid = self.gid(handle)?;
        let file = self.files.get(&handle).ok_or(SocketError::InvalidHandle)?;
        let c = match sh.socks.get_mut(&gid).map(|g| &mut g.kind) {
            Some(Kind::Conn(c)) => c,
            Some(Kind::Failed(e)) => return Err(*e),
            Some(_) => return Err(SocketError::NotConnected),
            None => return Err(SocketError::InvalidHandle),
        };
        if c.closed_told || c.shutdown_pending {
            return Err(SocketError::BrokenPipe);
        }
        if len == 0 {
            return Ok(0);
        }
        if !c.open_told || c.queued_here() > 0 {
            // Connecting, or earlier sends still queued here: they go first.
            c.file_want = Some(len);
            return Err(SocketError::WouldBlock);
        }
        let e = &mut sh.lo.engines[c.eng];
        match e.send_file(c.h, file, offset, len) {
            Ok(n) => {
                sh.counters.sendfile_bytes += n as u64;
                sh.counters.sendfile_calls += 1;
                if (n as u64) < len {
                    c.file_want = Some(len - n as u64);
                }
                Ok(n as u64)
            }
            // The file ends at `offset` (shorter than asked, or truncated meanwhile).
            Err(FileError::ShortFile { .. }) => Ok(0),
            Err(FileError::Socket(SocketError::WouldBlock)) => {
                c.file_want = Some(len);
                Err(SocketError::WouldBlock)
            }
            Err(FileError::Socket(err)) => Err(err),
            Err(FileError::BadRange) => Err(SocketError::InvalidArgument),
            Err(FileError::Io(errno)) => Err(SocketError::from_errno(errno)),
        }
    }
}
