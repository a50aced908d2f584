//! `sendfile(2)` on a flowstack socket: the daemon reads the file, never this process.
//!
//! The file's descriptor goes to the daemon over the registration stream (`Attach{File}`,
//! SCM_RIGHTS) and stays attached to the socket while a transfer is under way (a blocking
//! `sendfile` made of several tries, or a non-blocking one the program repeats on the same
//! file); each try is one `TcpSendFile` record with an explicit offset, answered with the
//! bytes the daemon queued. The attachment is dropped (`FileRelease`) once a call has queued
//! everything it asked for, reached the end of the file or failed, and with the socket.
//!
//! The daemon's copy shares the open file description with the caller's descriptor, so it
//! never uses the file position: the caller (the shim) advances its own `*offset` or file
//! position by the count returned.

use super::*;
use flowstack_api::record::MAX_SPAN;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};

/// Most bytes one call sends, as Linux caps `sendfile(2)`'s count (`MAX_RW_COUNT`).
pub const MAX_SENDFILE: usize = 0x7fff_f000;

/// A private duplicate of the input file after the checks `sendfile(2)` makes, and its
/// identity (device, inode).
fn checked_file(file: BorrowedFd<'_>) -> Result<(File, (u64, u64)), Errno> {
    let f = File::from(file.try_clone_to_owned().map_err(|_| Errno::EBADF)?);
    // Not open for reading: EBADF (a zero-length read checks the mode and reads nothing).
    if let Err(e) = f.read_at(&mut [], 0) {
        return Err(match e.raw_os_error() {
            Some(9) => Errno::EBADF,
            _ => Errno::EINVAL,
        });
    }
    let m = f.metadata().map_err(|_| Errno::EBADF)?;
    if !m.is_file() {
        // A directory, a socket, a pipe: the daemon sends regular files only.
        return Err(Errno::EINVAL);
    }
    Ok((f, (m.dev(), m.ino())))
}

impl Posix {
    /// `sendfile(2)` from a regular file with an explicit `offset` (the caller updates its
    /// offset or file position by the result): bytes queued, `Ok(0)` if the file ends at
    /// `offset`, a short count if it ends (or is truncated) before `offset + len`, `EAGAIN`
    /// when the send buffer is full and `nonblock` (the placeholder is then unwritable until
    /// there is room for the next chunk). Blocking, it returns once all `len` bytes are
    /// queued, the file ended, or an error or `timeout` (`SO_SNDTIMEO`) stopped it (a partial
    /// count if anything was queued, else `EAGAIN` for the timeout). `len` is capped at
    /// [`MAX_SENDFILE`]. `EBADF`: `file` is not open for reading; `EINVAL`: not a regular
    /// file, or `offset + len` is no file offset.
    pub fn send_file(
        &self,
        id: SockId,
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        nonblock: bool,
        timeout: Option<Duration>,
    ) -> Result<usize, Errno> {
        let (f, ident) = checked_file(file)?;
        let len = len.min(MAX_SENDFILE);
        if offset
            .checked_add(len as u64)
            .is_none_or(|e| e > i64::MAX as u64)
        {
            return Err(Errno::EINVAL);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut done = 0usize;
        let r = loop {
            if done == len {
                break Ok(());
            }
            let a = {
                let mut g = self.lock()?;
                match self.try_send_file(&mut g, id, &f, ident, offset + done as u64, len - done) {
                    Ok(0) => break Ok(()), // end of file
                    Ok(n) => {
                        done += n;
                        if nonblock {
                            break Ok(());
                        }
                        continue;
                    }
                    Err(Errno::EAGAIN) if nonblock => break Err(Errno::EAGAIN),
                    Err(Errno::EAGAIN) => g.sock(id)?.a.try_clone().map_err(|_| Errno(24))?,
                    Err(e) => break Err(e),
                }
            };
            if let Err(e) = wait_on(&a, false, true, deadline) {
                break Err(if e == Errno::ECONNRESET {
                    Errno::EPIPE
                } else {
                    e
                });
            }
        };
        match r {
            Ok(()) => Ok(done),
            Err(_) if done > 0 => Ok(done),
            Err(e) => Err(e),
        }
    }

    /// One try: attaches the file if the socket does not have it yet, queues what fits.
    fn try_send_file(
        &self,
        g: &mut Guard<'_>,
        id: SockId,
        f: &File,
        ident: (u64, u64),
        offset: u64,
        len: usize,
    ) -> Result<usize, Errno> {
        let ps = g.sock(id)?;
        match ps.state {
            State::Connected | State::Connecting => {}
            State::Failed => return Err(Errno::EPIPE),
            _ => return Err(Errno::ENOTCONN),
        }
        let attached = ps.file == Some(ident);
        let c = g.client.as_mut().expect("registered");
        c.pump();
        if let Some(e) = c.socks.get(&id.0).and_then(|s| s.error) {
            return Err(e.into());
        }
        if c.dead {
            return Err(Errno::EPIPE);
        }
        if c.socks.get(&id.0).is_some_and(|s| s.pipe_switched()) {
            return piped_send_file(g, id, f, offset, len);
        }
        if !attached {
            attach_fds(c, id.0, AttachOp::File, &[f.as_fd()]).map_err(pipe)?;
            g.sock(id)?.file = Some(ident);
        }
        let want = (len as u64).min(MAX_SPAN);
        let c = g.client.as_mut().expect("registered");
        let r = sync(
            c,
            Command::TcpSendFile {
                handle: id.0,
                offset,
                len: want,
            },
        );
        match r {
            Err(Errno::EAGAIN) => {
                make_unwritable(g, id).map_err(pipe)?;
                Err(Errno::EAGAIN)
            }
            // Part of it: the rest follows on this attachment.
            Ok(n) if n > 0 && n < len as u64 => Ok(n as usize),
            r => {
                // Done (all asked for, end of file, or an error): let the file go.
                g.sock(id)?.file = None;
                let c = g.client.as_mut().expect("registered");
                let _ = c.post(Mode::Async, Command::FileRelease { handle: id.0 });
                r.map(|n| n as usize).map_err(pipe)
            }
        }
    }
}

/// One try on a fused connection: its bytes go through the pipe, in order with the
/// program's other sends, so the file is read here (one chunk) and sent like them.
fn piped_send_file(
    g: &mut Guard<'_>,
    id: SockId,
    f: &File,
    offset: u64,
    len: usize,
) -> Result<usize, Errno> {
    if g.sock(id)?.file.take().is_some() {
        let c = g.client.as_mut().expect("registered");
        let _ = c.post(Mode::Async, Command::FileRelease { handle: id.0 });
    }
    let mut buf = vec![0u8; len.min(256 << 10)];
    let n = f
        .read_at(&mut buf, offset)
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(5)))?;
    if n == 0 {
        return Ok(0);
    }
    let c = g.client.as_mut().expect("registered");
    match crate::Sockets::tcp_send(c, tcp(id), &buf[..n]) {
        Ok(k) => Ok(k),
        Err(SocketError::WouldBlock) => {
            make_unwritable(g, id).map_err(pipe)?;
            Err(Errno::EAGAIN)
        }
        Err(SocketError::ConnectionReset) if c.dead => Err(Errno::EPIPE),
        Err(e) => Err(pipe(e.into())),
    }
}

/// A dead daemon reads as a broken pipe for a sender, as in `send`.
fn pipe(e: Errno) -> Errno {
    if e == Errno::ECONNRESET {
        Errno::EPIPE
    } else {
        e
    }
}
