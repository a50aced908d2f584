//! An application's wake-up channel: the descriptor the daemon writes a byte into when an
//! application that sleeps in the kernel (its `epoll_wait`/`poll`) may have events.
//!
//! It is a pipe. The application keeps the read end (non-blocking; it sleeps on it among
//! its own descriptors) and hands the write end to the daemon, which then holds the only
//! write end, so the read end hangs up when the daemon dies.
//!
//! Why a pipe: a one-byte write and read cost a third of a unix stream socket's `send` and
//! `recv` (no socket buffer allocated per byte; measured 0.4–0.5 µs against 1.1–1.3 µs per
//! signal and drain on this machine's kernel), and the daemon signals once per sleeping
//! application per burst of events. An `eventfd` would be about as cheap but cannot be made
//! safe: its open file description is shared with the application, which could clear
//! `O_NONBLOCK` and fill the counter, so that the daemon's next write blocks forever.
//!
//! The same holds for a pipe's write end as received: the application may keep a
//! duplicate and change its flags. So the daemon never writes through the description it
//! received: [`DaemonEnd::accept`] opens the pipe again through `/proc/self/fd/N` (a pipe
//! opened that way is a new open file description, as a named FIFO's `open` is), non-blocking
//! and close-on-exec, checks that it is the same pipe, and drops the received one. What a
//! hostile application can still do to its own pipe — fill it, keep a write end so that it
//! misses the daemon's death — only hurts itself: a full pipe is already readable, and the
//! daemon's write answers `EAGAIN` at worst.
//!
//! A unix stream socket (one end of a pair; the daemon writes with `MSG_DONTWAIT`) is still
//! accepted, for a daemon without `/proc` ([`DaemonEnd::accept`] refuses the pipe there and
//! the application falls back to a pair).

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// Application side: a new wake-up pipe, `(read end, write end)`, both close-on-exec; the
/// read end is non-blocking (the write end is sent to the daemon and closed at once).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pipe::{pipe_with, PipeFlags};
    Ok(pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?)
}

/// Application side: the fallback, a unix stream pair `(ours, the daemon's)`, ours
/// non-blocking, both close-on-exec.
pub fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    crate::placeholder::pair_with(true, true)
}

/// What draining the application's end found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// This many bytes were read (possibly none).
    Read(usize),
    /// The daemon's end is closed (and nothing is left to read): the daemon is gone.
    Closed,
}

/// Application side: reads every byte waiting on its (non-blocking) end, a pipe's read end
/// or a socket. A read shorter than the buffer emptied it, so the usual case is one call.
pub fn drain(mine: BorrowedFd<'_>) -> io::Result<Drained> {
    let mut n = 0;
    let mut buf = [0u8; 64];
    loop {
        match rustix::io::read(mine, &mut buf) {
            Ok(0) => return Ok(Drained::Closed),
            Ok(k) if k < buf.len() => return Ok(Drained::Read(n + k)),
            Ok(k) => n += k,
            Err(Errno::AGAIN) => return Ok(Drained::Read(n)),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The daemon's end of an application's wake-up channel.
#[derive(Debug)]
pub enum DaemonEnd {
    /// A pipe's write end, opened by the daemon itself (its own open file description).
    Pipe(OwnedFd),
    /// One end of a unix stream socket pair.
    Unix(OwnedFd),
}

impl DaemonEnd {
    /// Takes the descriptor an application handed over: a unix stream socket, or the write
    /// end of a pipe, which is opened again as the daemon's own description (see the module
    /// docs). Anything else — another kind of file, a pipe's read end, a pipe that cannot
    /// be opened again — is `InvalidInput`.
    pub fn accept(fd: OwnedFd) -> io::Result<DaemonEnd> {
        if crate::placeholder::is_unix_stream(fd.as_fd()) {
            return Ok(DaemonEnd::Unix(fd));
        }
        let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Fifo {
            return Err(invalid());
        }
        let fl = rustix::fs::fcntl_getfl(&fd)?;
        if fl & OFlags::RWMODE != OFlags::WRONLY {
            return Err(invalid());
        }
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let own = rustix::fs::open(
            path.as_str(),
            OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(|_| invalid())?;
        let again = rustix::fs::fstat(&own)?;
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
            return Err(invalid());
        }
        Ok(DaemonEnd::Pipe(own))
    }

    /// Writes one byte without blocking. `Ok(false)` if it is full (a byte is then surely
    /// waiting) or the application's end is closed.
    ///
    /// A pipe without a reader would raise `SIGPIPE`: the daemon ignores it (Rust's runtime
    /// sets it to ignored before `main`), so the write answers `EPIPE`.
    pub fn signal(&self) -> io::Result<bool> {
        let r = match self {
            DaemonEnd::Pipe(fd) => rustix::io::write(fd, b"w"),
            DaemonEnd::Unix(fd) => rustix::net::send(
                fd,
                b"w",
                rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
            ),
        };
        match r {
            Ok(n) => Ok(n == 1),
            Err(Errno::AGAIN | Errno::PIPE) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_signals_through_the_daemons_own_description_and_hangs_up_at_its_close() {
        let (r, w) = pipe().unwrap();
        let d = DaemonEnd::accept(w).unwrap();
        let DaemonEnd::Pipe(own) = &d else {
            panic!("a pipe is taken as a pipe")
        };
        assert!(rustix::fs::fcntl_getfl(own)
            .unwrap()
            .contains(OFlags::NONBLOCK));
        assert_eq!(drain(r.as_fd()).unwrap(), Drained::Read(0));
        assert!(d.signal().unwrap());
        assert!(d.signal().unwrap());
        assert_eq!(drain(r.as_fd()).unwrap(), Drained::Read(2));
        drop(d);
        assert_eq!(drain(r.as_fd()).unwrap(), Drained::Closed);
    }

    #[test]
    fn a_blocking_duplicate_kept_by_the_application_cannot_make_the_daemon_block() {
        let (r, w) = pipe().unwrap();
        let kept = rustix::io::dup(&w).unwrap();
        rustix::fs::fcntl_setfl(&kept, OFlags::empty()).unwrap(); // clears O_NONBLOCK
        let d = DaemonEnd::accept(w).unwrap();
        // Fill the pipe from the application's copy (non-blocking for this loop only).
        rustix::fs::fcntl_setfl(&kept, OFlags::NONBLOCK).unwrap();
        let junk = [0u8; 4096];
        while rustix::io::write(&kept, &junk).is_ok() {}
        rustix::fs::fcntl_setfl(&kept, OFlags::empty()).unwrap();
        assert!(!d.signal().unwrap(), "full: EAGAIN, not a blocked daemon");
        drop(r);
        assert!(!d.signal().unwrap(), "no reader: EPIPE is not an error");
    }

    #[test]
    fn other_descriptors_are_refused() {
        let (r, _w) = pipe().unwrap();
        assert!(DaemonEnd::accept(r).is_err(), "a read end");
        let f = rustix::fs::open("/dev/null", OFlags::WRONLY, Mode::empty()).unwrap();
        assert!(DaemonEnd::accept(f).is_err(), "a device");
        let (mine, theirs) = socket_pair().unwrap();
        let d = DaemonEnd::accept(theirs).unwrap();
        assert!(matches!(d, DaemonEnd::Unix(_)));
        assert!(d.signal().unwrap());
        assert_eq!(drain(mine.as_fd()).unwrap(), Drained::Read(1));
        drop(d);
        assert_eq!(drain(mine.as_fd()).unwrap(), Drained::Closed);
    }
}
