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
//!
//! # Records, and peers that wake directly
//! Everything written into the channel is a 4-byte record (a pipe write of at most
//! `PIPE_BUF` bytes is atomic, so records never interleave): [`DAEMON_RECORD`] from the
//! daemon, or a socket handle of the application from a *peer* — the other end of a fused
//! connection (`flowstack_sys::pipe`), which the daemon gave a write end of its own
//! ([`DaemonEnd::peer_writer`], a new open file description again) so that it wakes the
//! reader of an empty pipe itself, with no daemon between them ([`signal_peer`]).
//! [`drain_records`] hands the handles to the application; a record that does not decode
//! (a peer that wrote something else) is reported as unknown, and the application then
//! looks at every fused socket. A peer's write end keeps the read end from hanging up when
//! the daemon dies: an application that gave one out also checks the daemon's liveness on
//! a timer while it sleeps.

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

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

/// The daemon's record ("look at your event ring").
pub const DAEMON_RECORD: u32 = u32::MAX;

/// Application side: [`drain`], handing each peer record to `peer` (`Some(handle)`, or
/// `None` for bytes that do not decode as one).
pub fn drain_records(
    mine: BorrowedFd<'_>,
    mut peer: impl FnMut(Option<u32>),
) -> io::Result<Drained> {
    let mut n = 0;
    let mut buf = [0u8; 512];
    let mut carry = 0usize; // bytes of a record split across two reads
    loop {
        match rustix::io::read(mine, &mut buf[carry..]) {
            Ok(0) => {
                if carry > 0 {
                    peer(None);
                }
                return Ok(Drained::Closed);
            }
            Ok(k) => {
                n += k;
                let have = carry + k;
                let whole = have - have % 4;
                for r in buf[..whole].chunks_exact(4) {
                    match u32::from_le_bytes(r.try_into().expect("4 bytes")) {
                        DAEMON_RECORD => {}
                        h => peer(Some(h)),
                    }
                }
                let room = buf.len() - carry;
                buf.copy_within(whole..have, 0);
                carry = have - whole;
                if k < room {
                    // A short read emptied it.
                    if carry > 0 {
                        peer(None);
                    }
                    return Ok(Drained::Read(n));
                }
            }
            Err(Errno::AGAIN) => {
                if carry > 0 {
                    peer(None);
                }
                return Ok(Drained::Read(n));
            }
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether this process ignores `SIGPIPE` (its disposition is `SIG_IGN`), as told by
/// whoever tracks the disposition ([`set_sigpipe_ignored`]; the preload shim does, from
/// its start and through its `sigaction`/`signal`). False until told: the safe answer.
static SIGPIPE_IGNORED: AtomicBool = AtomicBool::new(false);

/// Tells [`signal_peer`] whether `SIGPIPE` is ignored in this process, so that its write
/// needs no signal mask around it. Say false *before* a disposition that is not `SIG_IGN`
/// is installed and true only after `SIG_IGN` is.
pub fn set_sigpipe_ignored(ignored: bool) {
    SIGPIPE_IGNORED.store(ignored, Ordering::SeqCst);
}

/// The daemon's side of the sleep protocol (the application's header words `sleepers` and
/// `woken`, `flowstack_api::region::at::{APP_SLEEPERS, APP_WOKEN}`), after it published
/// events (its publish fenced after storing the ring's `head`): whether to write a record
/// into the channel now. `loud`: events other than send credit, which wake any sleeper;
/// credit wakes only those that wait for send space (the high half of `sleepers`).
///
/// One write per sleep: the daemon writes only when it turns `woken` from 0 to 1, and the
/// application sets it back to 0 only after it read the channel dry ([`drained`]). So while
/// `woken` is 1 a record written since the last clear is still in the channel (or being
/// written), and every sleeper — level-triggered on the channel — wakes for it; events
/// published meanwhile are seen by the ring check that follows every wake-up and precedes
/// every sleep. Before this, each turn that published events for a process not yet awake
/// wrote again (1.75 writes per `ab` connection, each a system call that may wake a
/// sleeper). Modelled with loom (`ring/loom_models.rs`).
pub fn should_signal(
    sleepers: &crate::sync::AtomicU32,
    woken: &crate::sync::AtomicU32,
    loud: bool,
) -> bool {
    use crate::sync::Ordering::SeqCst;
    let v = sleepers.load(SeqCst);
    let want = if loud { v != 0 } else { v >> 16 != 0 };
    want && woken.swap(1, SeqCst) == 0
}

/// The application's side of [`should_signal`]: it read its channel dry (after the read,
/// never before: a record written between a clear and the read would be taken while
/// `woken` stays 1, and the next sleeper would wait for a write that never comes).
pub fn drained(woken: &crate::sync::AtomicU32) {
    // A swap, not a store: a read-modify-write, ordered with the daemon's swaps in the
    // word's one order (and an `xchg` either way on x86, as a SeqCst store is).
    woken.swap(0, crate::sync::Ordering::SeqCst);
}

/// What [`set_sigpipe_ignored`] last said.
pub fn sigpipe_ignored() -> bool {
    SIGPIPE_IGNORED.load(Ordering::SeqCst)
}

/// A peer's wake-up of socket `handle` of the application whose channel `end` writes into
/// (a write end from [`DaemonEnd::peer_writer`]); false if it did not go (full, closed:
/// ask the daemon instead). Never raises `SIGPIPE`: when the process ignores it
/// ([`set_sigpipe_ignored`]) the kernel drops it and the write is one system call (servers
/// ignore it: nginx, redis, wrk, ab); else the signal is blocked for the write and one it
/// raised is taken back (unless the thread had it blocked already, when it joins the one
/// that may be pending) — three system calls.
#[allow(unsafe_code)]
pub fn signal_peer(end: BorrowedFd<'_>, handle: u32) -> bool {
    let rec = handle.to_le_bytes();
    if SIGPIPE_IGNORED.load(Ordering::SeqCst) {
        // An ignored SIGPIPE is discarded when raised (signal(7)): EPIPE is the only trace.
        return rustix::io::write(end, &rec) == Ok(4);
    }
    // SAFETY: plain system calls on a sigset_t on the stack, initialised by sigemptyset
    // before use, and on a 4-byte buffer that lives across the call; the descriptor is
    // borrowed, so it stays open for the call.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
            return false;
        }
        let r = libc::write(end.as_raw_fd(), rec.as_ptr().cast(), 4);
        let err = if r < 0 { *libc::__errno_location() } else { 0 };
        if err == libc::EPIPE && libc::sigismember(&old, libc::SIGPIPE) == 0 {
            // Not blocked before: nothing of the program's could be pending; ours is taken.
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r == 4
    }
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

    /// A write end of the same pipe for a peer application ([`signal_peer`]): a new open
    /// file description (non-blocking, close-on-exec), so what the peer does to its flags
    /// stays its own. `None` for a unix socket end (no peer wake-ups through it).
    pub fn peer_writer(&self) -> Option<OwnedFd> {
        let DaemonEnd::Pipe(fd) = self else {
            return None;
        };
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::open(
            path.as_str(),
            OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .ok()
    }

    /// Writes one record ([`DAEMON_RECORD`]) without blocking. `Ok(false)` if it is full (a
    /// record is then surely waiting) or the application's end is closed.
    ///
    /// A pipe without a reader would raise `SIGPIPE`: the daemon ignores it (Rust's runtime
    /// sets it to ignored before `main`), so the write answers `EPIPE`.
    pub fn signal(&self) -> io::Result<bool> {
        let r = match self {
            DaemonEnd::Pipe(fd) => rustix::io::write(fd, &DAEMON_RECORD.to_le_bytes()),
            DaemonEnd::Unix(fd) => rustix::net::send(
                fd,
                &DAEMON_RECORD.to_le_bytes(),
                rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
            ),
        };
        match r {
            Ok(n) => Ok(n == 4),
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
        assert_eq!(drain(r.as_fd()).unwrap(), Drained::Read(8));
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

    // Plain atomics: under `--cfg loom` the protocol takes loom's, checked by the loom model.
    #[cfg(not(loom))]
    #[test]
    fn the_daemon_writes_once_per_sleep_until_the_channel_is_read_dry() {
        use std::sync::atomic::AtomicU32;
        let (sleepers, woken) = (AtomicU32::new(0), AtomicU32::new(0));
        assert!(!should_signal(&sleepers, &woken, true), "nobody asleep");
        sleepers.store(1, Ordering::SeqCst);
        assert!(
            !should_signal(&sleepers, &woken, false),
            "credit wakes only writers"
        );
        assert!(should_signal(&sleepers, &woken, true));
        assert!(
            !should_signal(&sleepers, &woken, true),
            "written once for this sleep"
        );
        drained(&woken);
        assert!(
            should_signal(&sleepers, &woken, true),
            "again after the read"
        );
        drained(&woken);
        sleepers.store(1 << 16 | 1, Ordering::SeqCst);
        assert!(
            should_signal(&sleepers, &woken, false),
            "a writer waits for credit"
        );
    }

    #[test]
    fn with_sigpipe_ignored_a_peer_wake_up_is_a_plain_write_and_a_gone_reader_is_false() {
        // The test harness ignores SIGPIPE (Rust's runtime), so the kernel drops it.
        set_sigpipe_ignored(true);
        let (r, w) = pipe().unwrap();
        let d = DaemonEnd::accept(w).unwrap();
        let p = d.peer_writer().expect("a pipe end gives peer writers");
        assert!(signal_peer(p.as_fd(), 5));
        let mut got = Vec::new();
        assert_eq!(
            drain_records(r.as_fd(), |h| got.push(h)).unwrap(),
            Drained::Read(4)
        );
        assert_eq!(got, vec![Some(5)]);
        drop(r);
        assert!(!signal_peer(p.as_fd(), 6), "no reader: EPIPE, not sent");
        set_sigpipe_ignored(false);
        assert!(!signal_peer(p.as_fd(), 6), "the masked path says the same");
    }

    #[test]
    fn peers_wake_with_records_through_descriptions_of_their_own() {
        let (r, w) = pipe().unwrap();
        let d = DaemonEnd::accept(w).unwrap();
        let p = d.peer_writer().expect("a pipe end gives peer writers");
        assert!(signal_peer(p.as_fd(), 7));
        assert!(d.signal().unwrap());
        assert!(signal_peer(p.as_fd(), 9));
        let mut got = Vec::new();
        assert_eq!(
            drain_records(r.as_fd(), |h| got.push(h)).unwrap(),
            Drained::Read(12)
        );
        assert_eq!(
            got,
            [Some(7), Some(9)],
            "the daemon's record is not a peer's"
        );
        // A peer that writes something else: unknown, never a wrong handle taken as news.
        rustix::io::write(&p, b"xyz").unwrap();
        got.clear();
        drain_records(r.as_fd(), |h| got.push(h)).unwrap();
        assert_eq!(got, [None]);
        // The peer's flags are its own: clearing O_NONBLOCK leaves the daemon's alone.
        rustix::fs::fcntl_setfl(&p, OFlags::empty()).unwrap();
        let DaemonEnd::Pipe(own) = &d else { panic!() };
        assert!(rustix::fs::fcntl_getfl(own)
            .unwrap()
            .contains(OFlags::NONBLOCK));
        // With the reader gone: false, and no SIGPIPE (it would end this test process).
        rustix::fs::fcntl_setfl(&p, OFlags::NONBLOCK).unwrap();
        drop(r);
        assert!(!signal_peer(p.as_fd(), 7));
        // Hundreds of records split across reads keep their alignment.
        let (r, w) = pipe().unwrap();
        let d = DaemonEnd::accept(w).unwrap();
        let p = d.peer_writer().unwrap();
        for h in 0..1000 {
            assert!(signal_peer(p.as_fd(), h));
        }
        got.clear();
        drain_records(r.as_fd(), |h| got.push(h)).unwrap();
        assert_eq!(got, (0..1000).map(Some).collect::<Vec<_>>());
        let (_mine, theirs) = socket_pair().unwrap();
        assert!(DaemonEnd::accept(theirs).unwrap().peer_writer().is_none());
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
        assert_eq!(drain(mine.as_fd()).unwrap(), Drained::Read(4));
        drop(d);
        assert_eq!(drain(mine.as_fd()).unwrap(), Drained::Closed);
    }
}
