//! `sendfile(2)` to a flowstack socket, three ways:
//!
//! - **Small regular files** (at most [`SMALL_FILE`] bytes left from the offset): read here
//!   with `pread` into a buffer on the stack and sent like a `write` (the bytes go into the
//!   transmit area, no round trip to the daemon). A web server's typical page is a few hundred
//!   bytes: handing the daemon the file descriptor (`Attach{File}`, SCM_RIGHTS) and asking it
//!   to read the range (`TcpSendFile`, a synchronous call) costs two round trips where the copy
//!   costs a few hundred nanoseconds (README, `flowstack run`, measurements).
//! - **Larger regular files**: the daemon reads the file itself (`Backend::send_file`), from
//!   explicit offsets; this module moves `*off`, or the file position when `off` is null (the
//!   daemon shares the open file description and never seeks).
//! - **Anything else readable** (a pipe, a character device), and every file with
//!   `FLOWSTACK_SENDFILE=copy`: read into a 64 KiB buffer and sent (the copy path).
//!
//! `FLOWSTACK_SENDFILE=daemon` sends every regular file through the daemon, small ones too
//! (for comparisons and tests). Blocking sockets send everything unless the file ends, an
//! error, a signal or SO_SNDTIMEO stops them (then the partial count); non-blocking ones
//! send what fits and say so, as Linux's `sendfile(2)` does.

use crate::backend::{Backend, Errno};
use crate::ops::{blocking, nonblocking, send, sigpipe};
use crate::real;
use crate::state::{SendfileMode, State};
use crate::table::Entry;

/// Linux caps one `sendfile(2)` at `MAX_RW_COUNT` bytes.
const MAX_SENDFILE: usize = 0x7fff_f000;

/// Files with at most this many bytes left are read here and sent as a write (module docs).
/// Measured with wrk against nginx under flowstack (README, `flowstack run`): the copy serves
/// 1.9–10.8× the requests per second of the daemon's path for files of 64 KiB down to 1 KiB,
/// the daemon's path 1.6× the copy's at 256 KiB (medians of 3).
pub const SMALL_FILE: usize = 64 * 1024;

/// The stack buffer small files are read through (in several reads above it).
const STACK_CHUNK: usize = 16 * 1024;

/// The copy path's buffer for inputs that are not small regular files.
const COPY_CHUNK: usize = 64 * 1024;

/// `sendfile(2)` to the flowstack socket `fd` from `in_fd` (module docs).
pub fn sendfile(
    b: &dyn Backend,
    st: &State,
    fd: i32,
    e: &Entry,
    in_fd: i32,
    off: Option<&mut i64>,
    count: usize,
) -> Result<usize, Errno> {
    // SAFETY: fstat fills the zeroed stat buffer on the stack.
    let mut sb: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `in_fd` is only a number to the kernel.
    if unsafe { libc::fstat(in_fd, &mut sb) } < 0 {
        return Err(real::errno());
    }
    let kind = sb.st_mode & libc::S_IFMT;
    if kind == libc::S_IFDIR {
        return Err(libc::EINVAL);
    }
    let count = count.min(MAX_SENDFILE);
    let regular = kind == libc::S_IFREG;
    let mode = st.cfg.sendfile;
    if regular && mode == SendfileMode::Auto {
        let at = position(in_fd, off.as_deref());
        let left = (sb.st_size as i64).saturating_sub(at.max(0)).max(0) as usize;
        if at >= 0 && left.min(count) <= SMALL_FILE {
            // The first pread checks the mode (EBADF for a file not open for reading, as
            // sendfile(2)); one short of a full buffer is the end of the file.
            let mut buf = [0u8; STACK_CHUNK];
            return copy(b, st, fd, e, in_fd, off, count, &mut buf, true);
        }
    }
    // SAFETY: F_GETFL on a descriptor number; no memory is passed.
    let fl = unsafe { real::fcntl(in_fd, libc::F_GETFL, 0) };
    if fl < 0 || fl & libc::O_ACCMODE == libc::O_WRONLY {
        return Err(libc::EBADF); // sendfile(2): in_fd not open for reading
    }
    if !regular || mode == SendfileMode::Copy {
        let mut buf = vec![0u8; count.clamp(1, COPY_CHUNK)];
        return copy(b, st, fd, e, in_fd, off, count, &mut buf, regular);
    }
    through_daemon(b, st, fd, e, in_fd, off, count)
}

/// Where `sendfile(2)` reads from: the explicit offset, or the file's own position (-1 if
/// it has none, e.g. a pipe).
fn position(in_fd: i32, off: Option<&i64>) -> i64 {
    match off {
        Some(o) => *o,
        // SAFETY: lseek on a descriptor number.
        None => unsafe { libc::lseek(in_fd, 0, libc::SEEK_CUR) },
    }
}

/// The daemon reads the file: tries of `Backend::send_file` from explicit offsets.
fn through_daemon(
    b: &dyn Backend,
    st: &State,
    fd: i32,
    e: &Entry,
    in_fd: i32,
    off: Option<&mut i64>,
    count: usize,
) -> Result<usize, Errno> {
    let start = position(in_fd, off.as_deref());
    if start < 0 {
        return Err(libc::EINVAL);
    }
    let (_, timeo) = st.table.timeouts(fd);
    let mut total = 0usize;
    while total < count {
        let at = start as u64 + total as u64;
        let r = blocking(fd, e, 0, libc::POLLOUT, timeo, || {
            b.send_file(e.id, in_fd, at, count - total)
        });
        match r {
            Ok(0) => break, // end of file
            Ok(n) => total += n,
            Err(_) if total > 0 => break,
            Err(err) => return sigpipe(Err(err), 0),
        }
        if nonblocking(fd, e, 0) {
            break;
        }
    }
    let end = start + total as i64;
    match off {
        Some(o) => *o = end,
        None => {
            // SAFETY: lseek on a descriptor number: the file position advances by the count.
            unsafe { libc::lseek(in_fd, end, libc::SEEK_SET) };
        }
    }
    Ok(total)
}

/// Sends `count` bytes of `in_fd` (from `*off`, or its file position) through the
/// placeholder: read into `buf` and send. `regular`: a read shorter than asked is the end of
/// the file (no second read to find it).
#[allow(clippy::too_many_arguments)]
fn copy(
    b: &dyn Backend,
    st: &State,
    fd: i32,
    e: &Entry,
    in_fd: i32,
    off: Option<&mut i64>,
    count: usize,
    buf: &mut [u8],
    regular: bool,
) -> Result<usize, Errno> {
    let mut pos = off.as_ref().map(|o| **o);
    let mut total = 0usize;
    // A zero count still reads (nothing) once: the mode check sendfile(2) makes.
    let mut first = true;
    while total < count || first {
        first = false;
        let want = buf.len().min(count - total);
        // SAFETY: `buf` has `want` writable bytes.
        let n = unsafe {
            match pos {
                Some(p) => real::pread(in_fd, buf.as_mut_ptr().cast(), want, p),
                None => real::read(in_fd, buf.as_mut_ptr().cast(), want),
            }
        };
        if n < 0 {
            if total == 0 {
                return Err(real::errno());
            }
            break;
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        let flags = if total > 0 { libc::MSG_DONTWAIT } else { 0 };
        let r = send(b, st, fd, e, &[&buf[..n]], flags | libc::MSG_NOSIGNAL, None);
        let s = match r {
            Ok(s) => s,
            Err(err) => {
                if pos.is_none() {
                    // SAFETY: rewinds the file position by the bytes read but not sent.
                    unsafe { libc::lseek(in_fd, -(n as i64), libc::SEEK_CUR) };
                }
                if total == 0 {
                    return sigpipe(Err(err), 0);
                }
                break;
            }
        };
        total += s;
        if let Some(p) = pos.as_mut() {
            *p += s as i64;
        } else if s < n {
            // SAFETY: as above, for the unsent tail.
            unsafe { libc::lseek(in_fd, -((n - s) as i64), libc::SEEK_CUR) };
        }
        if s < n || (regular && n < want) {
            break;
        }
    }
    if let (Some(o), Some(p)) = (off, pos) {
        *o = p;
    }
    Ok(total)
}
