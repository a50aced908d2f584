//! The placeholder pair of an offloaded socket (the process-shared socket model of
//! `flowstack_client::posix`).
//!
//! For each socket the application creates a unix stream socket pair (A, D). A is the file
//! descriptor the program sees; D goes to the daemon. The pair carries no data, only state the
//! kernel's own `poll`/`select`/`epoll` can see:
//! - **readable**: the daemon writes one token byte into D ([`put_token`]) when the socket
//!   becomes readable; the application reads the tokens back from A ([`take_tokens`]) when its
//!   own view of the socket is unreadable again;
//! - **writable**: A is writable except while the application has filled A's (small) send
//!   buffer ([`fill`]) because the offloaded socket's send buffer is full; the daemon empties
//!   D ([`drain`]) when send space returns;
//! - **last close**: when every copy of A anywhere is closed, D reads end-of-file and polls
//!   `POLLRDHUP` ([`poll_sets`]).
//!
//! A's identity across processes is its inode ([`identity`]).

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{recv, send, sockopt, RecvFlags, SendFlags};
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A's send buffer once [`fill`] has been used on it: small, so one filler write makes A
/// unwritable.
pub const A_SNDBUF: usize = 4096;

/// Creates a placeholder pair: (A for the program, D for the daemon). Both close-on-exec
/// (the shim clears it on A when the program asks). A keeps the kernel's default send
/// buffer until the first [`fill`] shrinks it: most sockets are never filled, and a
/// `setsockopt` per socket was one of the system calls each short connection paid.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, d) = UnixStream::pair()?;
    Ok((a.into(), d.into()))
}

/// [`pair`] with the descriptor flags the program asked for (`SOCK_CLOEXEC`,
/// `SOCK_NONBLOCK` of `socket`/`accept4`) set at creation, so none needs a `fcntl` after.
/// Both ends get them; D is sent to the daemon and closed by the caller right away, and the
/// daemon's I/O on D never blocks, so only A's flags matter (`O_NONBLOCK` belongs to the
/// open file description: every dup of A shares it, as the program expects).
pub fn pair_with(cloexec: bool, nonblock: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    let mut fl = SocketFlags::empty();
    if cloexec {
        fl |= SocketFlags::CLOEXEC;
    }
    if nonblock {
        fl |= SocketFlags::NONBLOCK;
    }
    Ok(socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        fl,
        None,
    )?)
}

/// The program's descriptor for a placeholder A the library keeps (a pooled one): a
/// duplicate at the lowest free number, as the kernel numbers a new socket, close-on-exec
/// if asked; `O_NONBLOCK` is set on the shared open file description if asked, and cleared
/// if not asked and `maybe_nonblock` (a recycled A may keep its last socket's flag; a fresh
/// pooled A is blocking).
pub fn dup_for_program(
    a: BorrowedFd<'_>,
    cloexec: bool,
    nonblock: bool,
    maybe_nonblock: bool,
) -> io::Result<OwnedFd> {
    let p = if cloexec {
        rustix::io::fcntl_dupfd_cloexec(a, 0)?
    } else {
        rustix::io::dup(a)?
    };
    if nonblock {
        rustix::fs::fcntl_setfl(&p, rustix::fs::OFlags::NONBLOCK)?;
    } else if maybe_nonblock {
        rustix::fs::fcntl_setfl(&p, rustix::fs::OFlags::empty())?;
    }
    Ok(p)
}

/// The identity of a placeholder across processes: (device, inode) of the socket.
pub fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// True if `fd` is a unix stream socket (a candidate placeholder).
pub fn is_unix_stream(fd: BorrowedFd<'_>) -> bool {
    let unix = matches!(
        rustix::net::getsockname(fd),
        Ok(a) if a.address_family() == rustix::net::AddressFamily::UNIX
    );
    unix && matches!(
        sockopt::socket_type(fd),
        Ok(rustix::net::SocketType::STREAM)
    )
}

/// Daemon side: writes one token byte into D. `Ok(false)` if D's buffer is full (a token is
/// then surely pending) or the peer is gone.
pub fn put_token(d: BorrowedFd<'_>) -> io::Result<bool> {
    match send(d, b"r", SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
        Ok(n) => Ok(n == 1),
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::PIPE) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What reading A found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// This many token bytes were read (possibly none).
    Read(usize),
    /// D is closed: the daemon is gone.
    Closed,
}

/// Application side: reads every token waiting on A without blocking.
///
/// A read that returns less than the buffer emptied A (a unix stream `recv` takes everything
/// queued up to the buffer's size), so the usual case is one system call, not a second one
/// that answers `EAGAIN`. A hang-up right behind the tokens is then seen by the next call.
pub fn take_tokens(a: BorrowedFd<'_>) -> io::Result<Tokens> {
    let mut n = 0;
    let mut buf = [0u8; 64];
    loop {
        match recv(a, &mut buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Ok(Tokens::Closed),
            Ok((k, _)) if k < buf.len() => return Ok(Tokens::Read(n + k)),
            Ok((k, _)) => n += k,
            Err(rustix::io::Errno::AGAIN) => return Ok(Tokens::Read(n)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Application side: writes filler into A until it is unwritable; returns the bytes written.
///
/// A daemon that is emptying D at the same time (send space came back while we filled) can
/// keep A from ever filling: after a bounded number of writes A is left writable, which is
/// the truth — the caller's next wait finds it writable and its next send goes through. (This
/// used to be an error, which the POSIX layer turned into `EPIPE` on a healthy connection:
/// iperf3's "unable to write to stream socket: Broken pipe".)
///
/// One write of [`FILL_CHUNK`] bytes (more than A's send buffer holds) usually does it: a
/// non-blocking stream write that stops short has filled the buffer, so no second write is
/// needed to see `EAGAIN` (a connect used to cost eight writes here). A's first fill finds
/// the kernel's default send buffer (see [`pair`]): its first write goes through whole, A's
/// send buffer is then shrunk to [`A_SNDBUF`] — below what is queued, so A is unwritable —
/// and the next write answers `EAGAIN`. The buffer stays small for later fills (also in
/// other processes holding a copy: it belongs to the socket).
pub fn fill(a: BorrowedFd<'_>) -> io::Result<usize> {
    static JUNK: [u8; FILL_CHUNK] = [0; FILL_CHUNK];
    let mut n = 0;
    let mut shrunk = false;
    for _ in 0..FILL_WRITES {
        match send(a, &JUNK, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(k) if k < JUNK.len() => return Ok(n + k),
            Ok(k) if !shrunk => {
                shrunk = true;
                n += k;
                sockopt::set_socket_send_buffer_size(a, A_SNDBUF)?;
            }
            Ok(k) => n += k,
            Err(rustix::io::Errno::AGAIN) => return Ok(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

/// Most filler writes [`fill`] makes ([`FILL_CHUNK`] bytes each: more than a socket pair
/// holds unless the other end is being emptied meanwhile).
pub const FILL_WRITES: usize = 64;

/// Bytes of one filler write: more than A's send buffer (`SO_SNDBUF` 4096, doubled by the
/// kernel) takes.
pub const FILL_CHUNK: usize = 16 * 1024;

/// Daemon side: empties D (filler the application wrote), so A becomes writable. Returns
/// false if the peer closed (every A is gone).
pub fn drain(d: BorrowedFd<'_>) -> io::Result<bool> {
    let mut buf = [0u8; 4096];
    loop {
        match recv(d, &mut buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Ok(false),
            // A short read emptied D (see `take_tokens`).
            Ok((k, _)) if k < buf.len() => return Ok(true),
            Ok(_) => {}
            Err(rustix::io::Errno::AGAIN) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// True if the peer of stream socket `fd` closed (end of file, or an error), looking without
/// taking anything: bytes and descriptors waiting to be read stay there.
pub fn peer_closed(fd: BorrowedFd<'_>) -> bool {
    let mut b = [0u8; 1];
    loop {
        match recv(fd, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok((0, _)) => return true,
            Ok(_) => return false,
            Err(rustix::io::Errno::AGAIN) => return false,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return true,
        }
    }
}

/// Peeks at up to `buf.len()` waiting bytes without taking them: `Some(n)` bytes seen
/// (`Some(0)`: the peer closed), `None` if nothing waits yet.
pub fn peek_len(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Option<usize> {
    loop {
        match recv(fd, &mut *buf, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok((n, _)) => return Some(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return None,
        }
    }
}

/// Daemon side: the D descriptors watched for last close, as one epoll descriptor.
///
/// Each D is registered once (level-triggered `EPOLLRDHUP`, keyed by the daemon's socket
/// id) and removed when the daemon lets its placeholder go. The daemon's sleep polls
/// [`HupSet::fd`] next to its other descriptors, and [`HupSet::ready`] lists the hung-up
/// ones: one system call each, whatever the number of sockets. (A [`poll_sets`] over every
/// D cost O(sockets) per sleep: under `ab` the daemon slept about once per connection with
/// dozens of placeholders open, and a host with ten thousand idle connections would poll
/// ten thousand descriptors each time.)
pub struct HupSet {
    ep: OwnedFd,
}

/// Most hung-up descriptors one [`HupSet::ready`] reports; the rest stay ready (level
/// triggered) for the next call.
pub const HUP_BATCH: usize = 64;

impl HupSet {
    /// An empty set (one epoll descriptor, close-on-exec).
    pub fn new() -> io::Result<Self> {
        use rustix::event::epoll;
        Ok(Self {
            ep: epoll::create(epoll::CreateFlags::CLOEXEC)?,
        })
    }

    /// Watches `d` for its peer's last close, reported as `key`.
    pub fn add(&self, d: BorrowedFd<'_>, key: u32) -> io::Result<()> {
        use rustix::event::epoll;
        Ok(epoll::add(
            &self.ep,
            d,
            epoll::EventData::new_u64(u64::from(key)),
            epoll::EventFlags::RDHUP,
        )?)
    }

    /// Stops watching `d` (not watched: nothing happens). Closing `d`'s last copy removes
    /// it as well.
    pub fn remove(&self, d: BorrowedFd<'_>) {
        let _ = rustix::event::epoll::delete(&self.ep, d);
    }

    /// The descriptor to poll: readable while a watched D has hung up.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.ep.as_fd()
    }

    /// Appends the keys of watched descriptors whose peer closed (at most [`HUP_BATCH`]);
    /// never blocks.
    pub fn ready(&self, out: &mut Vec<u32>) -> io::Result<()> {
        use rustix::event::epoll::{self, EventFlags};
        use std::mem::MaybeUninit;
        let mut buf = [MaybeUninit::<epoll::Event>::uninit(); HUP_BATCH];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let got: &[epoll::Event] = match epoll::wait(&self.ep, &mut buf, Some(&zero)) {
            Ok((got, _)) => got,
            Err(rustix::io::Errno::INTR) => &[],
            Err(e) => return Err(e.into()),
        };
        let gone = EventFlags::RDHUP | EventFlags::HUP | EventFlags::ERR;
        out.extend(
            got.iter()
                .filter(|e| {
                    let flags = e.flags; // copied out: the event is packed
                    flags.intersects(gone)
                })
                .map(|e| {
                    let data = e.data;
                    data.u64() as u32
                }),
        );
        Ok(())
    }
}

/// Waits up to `timeout` (`None`: forever; millisecond granularity, at least 1 ms unless
/// zero) until one of `readable` becomes readable (or hangs up) or one of `hangup` reports
/// `POLLRDHUP`/`POLLHUP` (its peer closed; filler waiting to be read does not count).
/// Returns the flags of both sets; an interrupted wait returns all false.
pub fn poll_sets(
    readable: &[BorrowedFd<'_>],
    hangup: &[BorrowedFd<'_>],
    timeout: Option<Duration>,
) -> io::Result<(Vec<bool>, Vec<bool>)> {
    let ts = timeout.map(|t| {
        let ms = (t.as_millis().min(i32::MAX as u128) as i64).max(if t.is_zero() { 0 } else { 1 });
        Timespec {
            tv_sec: ms / 1000,
            tv_nsec: (ms % 1000) * 1_000_000,
        }
    });
    let mut pfds: Vec<PollFd<'_>> = readable
        .iter()
        .map(|f| PollFd::new(f, PollFlags::IN))
        .chain(hangup.iter().map(|f| PollFd::new(f, PollFlags::RDHUP)))
        .collect();
    match poll(&mut pfds, ts.as_ref()) {
        Ok(_) => {
            let r = pfds[..readable.len()]
                .iter()
                .map(|p| {
                    p.revents().intersects(
                        PollFlags::IN | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL,
                    )
                })
                .collect();
            let h = pfds[readable.len()..]
                .iter()
                .map(|p| {
                    p.revents().intersects(
                        PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL,
                    )
                })
                .collect();
            Ok((r, h))
        }
        Err(rustix::io::Errno::INTR) => {
            Ok((vec![false; readable.len()], vec![false; hangup.len()]))
        }
        Err(e) => Err(e.into()),
    }
}

/// Application side: waits up to `timeout` for A to become readable (`POLLIN`) and/or
/// writable (`POLLOUT`); returns (readable, writable, hung up).
pub fn wait_a(
    a: BorrowedFd<'_>,
    read: bool,
    write: bool,
    timeout: Duration,
) -> io::Result<(bool, bool, bool)> {
    let mut ev = PollFlags::empty();
    if read {
        ev |= PollFlags::IN;
    }
    if write {
        ev |= PollFlags::OUT;
    }
    let ms = (timeout.as_millis().min(i32::MAX as u128) as i64).max(if timeout.is_zero() {
        0
    } else {
        1
    });
    let ts = Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    };
    let mut p = [PollFd::new(&a, ev)];
    match poll(&mut p, Some(&ts)) {
        Ok(_) => {
            let r = p[0].revents();
            Ok((
                r.contains(PollFlags::IN),
                r.contains(PollFlags::OUT),
                r.intersects(PollFlags::HUP | PollFlags::ERR),
            ))
        }
        Err(rustix::io::Errno::INTR) => Ok((false, false, false)),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn tokens_fill_drain_and_last_close() {
        let (a, d) = pair().unwrap();
        let z = Some(Duration::ZERO);
        // Nothing to read on A; A writable.
        assert_eq!(
            wait_a(a.as_fd(), true, true, Duration::ZERO).unwrap(),
            (false, true, false)
        );
        assert!(put_token(d.as_fd()).unwrap());
        assert!(wait_a(a.as_fd(), true, false, Duration::ZERO).unwrap().0);
        assert_eq!(take_tokens(a.as_fd()).unwrap(), Tokens::Read(1));
        assert!(!wait_a(a.as_fd(), true, false, Duration::ZERO).unwrap().0);
        // Filled: A unwritable until D is drained; filler does not look like a hang-up.
        assert!(fill(a.as_fd()).unwrap() > 0);
        assert!(!wait_a(a.as_fd(), false, true, Duration::ZERO).unwrap().1);
        assert_eq!(poll_sets(&[], &[d.as_fd()], z).unwrap().1, vec![false]);
        assert!(drain(d.as_fd()).unwrap());
        assert!(wait_a(a.as_fd(), false, true, Duration::ZERO).unwrap().1);
        // Same inode seen through a dup; last close seen on D only after every copy is gone.
        let a2 = a.try_clone().unwrap();
        assert_eq!(identity(a.as_fd()).unwrap(), identity(a2.as_fd()).unwrap());
        assert!(is_unix_stream(a.as_fd()));
        drop(a);
        assert_eq!(poll_sets(&[], &[d.as_fd()], z).unwrap().1, vec![false]);
        drop(a2);
        assert_eq!(poll_sets(&[], &[d.as_fd()], z).unwrap().1, vec![true]);
        assert!(!drain(d.as_fd()).unwrap());
    }

    /// The watch set reports exactly the D's whose every A copy is gone, by key, as long as
    /// they stay hung up (level-triggered); its descriptor polls readable then and only then;
    /// tokens and filler are no hang-up; a removed or closed D is reported no more.
    #[test]
    fn hup_set_reports_last_closes_by_key() {
        let set = HupSet::new().unwrap();
        let z = Some(Duration::ZERO);
        let readable = |set: &HupSet| poll_sets(&[set.fd()], &[], z).unwrap().0[0];
        let ready = |set: &HupSet| {
            let mut v = Vec::new();
            set.ready(&mut v).unwrap();
            v.sort_unstable();
            v
        };
        let (a1, d1) = pair().unwrap();
        let (a2, d2) = pair().unwrap();
        let (a3, d3) = pair().unwrap();
        set.add(d1.as_fd(), 11).unwrap();
        set.add(d2.as_fd(), 22).unwrap();
        set.add(d3.as_fd(), 33).unwrap();
        assert!(set.add(d1.as_fd(), 11).is_err(), "watched twice");
        assert!(put_token(d1.as_fd()).unwrap());
        assert!(fill(a2.as_fd()).unwrap() > 0);
        assert!(ready(&set).is_empty());
        assert!(!readable(&set));
        let a1b = a1.try_clone().unwrap();
        drop(a1);
        assert!(ready(&set).is_empty(), "a copy of A is left");
        drop(a1b);
        drop(a2);
        assert!(readable(&set));
        assert_eq!(ready(&set), vec![11, 22]);
        assert_eq!(ready(&set), vec![11, 22], "level-triggered: still hung up");
        set.remove(d1.as_fd());
        set.remove(d1.as_fd()); // not watched: nothing happens
        drop(d2);
        assert!(ready(&set).is_empty());
        assert!(!readable(&set));
        drop(a3);
        assert_eq!(ready(&set), vec![33]);
        drop(d3);
        assert!(!readable(&set));
    }

    /// A fresh pair costs no `setsockopt`: A keeps the default send buffer until its first
    /// fill shrinks it; every fill (first, after a drain, through a dup) leaves A unwritable
    /// with a bounded amount queued.
    #[test]
    fn send_buffer_is_shrunk_by_the_first_fill_only() {
        let (a, d) = pair().unwrap();
        let small = 2 * A_SNDBUF; // as the kernel reports it (doubled)
        let before = sockopt::socket_send_buffer_size(&a).unwrap();
        assert!(before > small, "untouched at creation: {before}");
        let n = fill(a.as_fd()).unwrap();
        assert!((1..=2 * FILL_CHUNK).contains(&n), "first fill wrote {n}");
        assert_eq!(sockopt::socket_send_buffer_size(&a).unwrap(), small);
        assert!(!wait_a(a.as_fd(), false, true, Duration::ZERO).unwrap().1);
        assert!(drain(d.as_fd()).unwrap());
        assert!(wait_a(a.as_fd(), false, true, Duration::ZERO).unwrap().1);
        let a2 = a.try_clone().unwrap();
        let n = fill(a2.as_fd()).unwrap();
        assert!((1..=FILL_CHUNK).contains(&n), "later fill wrote {n}");
        assert!(!wait_a(a.as_fd(), false, true, Duration::ZERO).unwrap().1);
    }

    #[test]
    fn pair_with_sets_the_asked_flags_on_a() {
        use rustix::fs::{fcntl_getfl, OFlags};
        use rustix::io::{fcntl_getfd, FdFlags};
        for (cloexec, nonblock) in [(true, false), (false, true), (false, false), (true, true)] {
            let (a, d) = pair_with(cloexec, nonblock).unwrap();
            let fd = fcntl_getfd(&a).unwrap();
            assert_eq!(fd.contains(FdFlags::CLOEXEC), cloexec);
            assert_eq!(
                fcntl_getfl(&a).unwrap().contains(OFlags::NONBLOCK),
                nonblock
            );
            // Still a working pair.
            assert!(put_token(d.as_fd()).unwrap());
            assert_eq!(take_tokens(a.as_fd()).unwrap(), Tokens::Read(1));
        }
    }

    #[test]
    fn take_tokens_reads_more_than_one_buffer_and_stops_at_a_short_read() {
        let (a, d) = pair().unwrap();
        for _ in 0..100 {
            assert!(put_token(d.as_fd()).unwrap());
        }
        assert_eq!(take_tokens(a.as_fd()).unwrap(), Tokens::Read(100));
        assert_eq!(take_tokens(a.as_fd()).unwrap(), Tokens::Read(0));
        // Tokens then a hang-up: the tokens now, the hang-up on the next call.
        assert!(put_token(d.as_fd()).unwrap());
        drop(d);
        assert_eq!(take_tokens(a.as_fd()).unwrap(), Tokens::Read(1));
        assert_eq!(take_tokens(a.as_fd()).unwrap(), Tokens::Closed);
    }
}
