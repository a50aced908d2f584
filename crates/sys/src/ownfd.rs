//! The library's own descriptors, kept out of the program's way (for the preload shim).
//!
//! A process under the preload shim holds descriptors the program never opened: the
//! registration socket, the doorbell eventfd, the wake-up pipe, a copy of every placeholder
//! (and the pooled ones), a scratch kernel socket. Opened at the lowest free number, as the
//! kernel numbers a new file, they took the numbers the program's next files would have
//! had, and a program could hit them without knowing: `os.dup2(x, 3)` in python replaced
//! the registration socket, and the process then took the daemon for dead.
//!
//! So the library's descriptors live in [`Own`]: moved at creation to the lowest free
//! number at or above a floor ([`floor`]: `FLOWSTACK_FD_FLOOR`, else half the soft
//! `RLIMIT_NOFILE`, between 16 and 1024 — well above the numbers a program with a few files
//! uses, and never so high that the kernel's descriptor table grows much), close-on-exec,
//! and noted in a process-wide bitmap ([`is_own`]) until dropped. The shim answers a
//! program's `close` of one with `EBADF` (the program never opened it), leaves them out of
//! `close_range`/`closefrom` ([`own_in`]), and before a `dup2`/`dup3` onto one moves the
//! library's descriptor to another number ([`Own::relocate`]), so the program gets the
//! number it asked for and the library keeps its file. With no free number above the floor
//! (the limit lowered, or all taken), a descriptor stays where it was opened, still noted.
//!
//! Numbers below [`TRACKED`] are noted; a process with more descriptors than that (the
//! kernel's default `nr_open`) has its higher own descriptors unprotected.

use std::io;
use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Descriptor numbers the bitmap covers.
pub const TRACKED: usize = 1 << 20;

/// The highest default floor (see the module docs).
pub const FLOOR_MAX: RawFd = 1024;

/// One bit per descriptor number below [`TRACKED`] (128 KiB, zero pages until touched).
static OWN: [AtomicU64; TRACKED / 64] = [const { AtomicU64::new(0) }; TRACKED / 64];

/// The floor, once read (-1: not yet).
static FLOOR: AtomicI32 = AtomicI32::new(-1);

/// The number the library's descriptors are moved to or above: `FLOWSTACK_FD_FLOOR` if set
/// to a number of at least 3, else half the soft `RLIMIT_NOFILE` between 16 and
/// [`FLOOR_MAX`]. Read once per process.
pub fn floor() -> RawFd {
    let f = FLOOR.load(Ordering::Relaxed);
    if f >= 0 {
        return f;
    }
    let f = std::env::var("FLOWSTACK_FD_FLOOR")
        .ok()
        .and_then(|v| v.trim().parse::<RawFd>().ok())
        .filter(|&v| v >= 3)
        .unwrap_or_else(|| {
            let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .unwrap_or(FLOOR_MAX as u64 * 2);
            (soft / 2).clamp(16, FLOOR_MAX as u64) as RawFd
        });
    FLOOR.store(f, Ordering::Relaxed);
    f
}

fn slot(fd: RawFd) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < TRACKED)?;
    Some((&OWN[i / 64], 1u64 << (i % 64)))
}

/// Notes `fd` as the library's own, for a descriptor kept by number rather than in an
/// [`Own`] (the shim's copies of its kernel listeners). Every note needs an [`unnote`]
/// before the descriptor is closed.
pub fn note(fd: RawFd) {
    if let Some((w, bit)) = slot(fd) {
        w.fetch_or(bit, Ordering::Release);
    }
}

/// Un-notes `fd` (see [`note`]).
pub fn unnote(fd: RawFd) {
    if let Some((w, bit)) = slot(fd) {
        w.fetch_and(!bit, Ordering::Release);
    }
}

/// True if `fd` is one of the library's own descriptors (an [`Own`] alive in this process).
pub fn is_own(fd: RawFd) -> bool {
    slot(fd).is_some_and(|(w, bit)| w.load(Ordering::Acquire) & bit != 0)
}

/// The library's own descriptors numbered `lo..=hi`, lowest first.
pub fn own_in(lo: u32, hi: u32) -> impl Iterator<Item = RawFd> {
    let hi = hi.min(TRACKED as u32 - 1);
    let words = if lo > hi {
        0..0
    } else {
        (lo as usize / 64)..(hi as usize / 64 + 1)
    };
    words.flat_map(move |w| {
        let mut bits = OWN[w].load(Ordering::Acquire);
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let b = bits.trailing_zeros();
            bits &= bits - 1;
            Some((w * 64) as RawFd + b as RawFd)
        })
        .filter(move |&fd| fd as u32 >= lo && fd as u32 <= hi)
    })
}

/// A close-on-exec duplicate of `fd` at the lowest free number at or above the floor, or at
/// the lowest free number if none is free there (not noted).
pub fn dup_above(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    match rustix::io::fcntl_dupfd_cloexec(fd, floor()) {
        Ok(d) => Ok(d),
        Err(_) => Ok(rustix::io::fcntl_dupfd_cloexec(fd, 0)?),
    }
}

/// A close-on-exec duplicate of `fd` above the floor, noted and kept by number (see
/// [`note`]; the caller un-notes it before closing it): the shim's copies of its kernel
/// listeners, which its descriptor table names by number.
pub fn dup_noted(fd: BorrowedFd<'_>) -> io::Result<RawFd> {
    let d = std::os::fd::IntoRawFd::into_raw_fd(dup_above(fd)?);
    note(d);
    Ok(d)
}

/// One of the library's own descriptors (see the module docs): `T` is the typed file over it
/// (`OwnedFd`, a `UnixStream`, an `EventFd`). Noted in [`is_own`] while alive; dropping it
/// un-notes the number, then closes the file.
#[derive(Debug)]
pub struct Own<T: AsFd> {
    fd: RawFd,
    inner: T,
}

impl<T: AsFd + From<OwnedFd>> Own<T> {
    fn noted(fd: OwnedFd) -> Self {
        let raw = fd.as_raw_fd();
        note(raw);
        Self {
            fd: raw,
            inner: T::from(fd),
        }
    }

    /// Takes `fd` as the library's own: moved above the floor (a close-on-exec duplicate
    /// there; the original number is closed) unless it is there already or no number there
    /// is free.
    pub fn lift(fd: OwnedFd) -> Self {
        if fd.as_raw_fd() >= floor() {
            return Self::noted(fd);
        }
        match rustix::io::fcntl_dupfd_cloexec(&fd, floor()) {
            Ok(d) => Self::noted(d), // `fd` closes here
            Err(_) => Self::noted(fd),
        }
    }

    /// A close-on-exec duplicate of `fd` (above the floor) as the library's own.
    pub fn dup(fd: BorrowedFd<'_>) -> io::Result<Self> {
        Ok(Self::noted(dup_above(fd)?))
    }

    /// Moves the file to another number (above the floor) and closes this one: the program
    /// is about to take it with `dup2`. `Err` (no number free): left where it is.
    pub fn relocate(&mut self) -> io::Result<()> {
        let moved = Self::noted(dup_above(self.inner.as_fd())?);
        drop(std::mem::replace(self, moved));
        Ok(())
    }
}

impl<T: AsFd> Own<T> {
    /// The descriptor's number.
    pub fn raw(&self) -> RawFd {
        self.fd
    }
}

impl<T: AsFd> Drop for Own<T> {
    fn drop(&mut self) {
        // Un-noted before `inner` closes (fields drop after this), so the close is not
        // taken for a program's close of a library descriptor.
        unnote(self.fd);
    }
}

impl<T: AsFd> Deref for Own<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsFd> AsFd for Own<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl<T: AsFd> AsRawFd for Own<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// What descriptor `fd` names ("socket:[inode]"), if it is open.
    fn target(fd: RawFd) -> Option<std::path::PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
    }

    /// Whether `fd` still names the object `was` named. Other tests run in
    /// threads of this process and may reuse a closed number at once, so
    /// "is the number open" would be racy; "does it still name our socket"
    /// is not (no other test holds it).
    fn still_names(fd: RawFd, was: &std::path::Path) -> bool {
        target(fd).as_deref() == Some(was)
    }

    /// The tests below note and un-note numbers in the process-wide bitmap; one at a time,
    /// or a number one test closed could be lifted and noted by another before the first
    /// looks at it.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn lifted_descriptors_sit_above_the_floor_are_noted_and_un_noted_before_close() {
        let _one = serial();
        let (a, b) = UnixStream::pair().unwrap();
        let low = a.as_raw_fd();
        let sock = target(low).unwrap();
        let own: Own<UnixStream> = Own::lift(a.into());
        let n = own.raw();
        assert!(n >= floor(), "{n} below the floor {}", floor());
        assert!(is_own(n) && !is_own(low));
        assert!(!still_names(low, &sock), "the original number is closed");
        assert!(still_names(n, &sock));
        assert!(own_in(0, u32::MAX).any(|f| f == n));
        // Still the same socket: what the peer writes arrives.
        std::io::Write::write_all(&mut &b, b"x").unwrap();
        let mut buf = [0u8; 1];
        std::io::Read::read_exact(&mut &*own, &mut buf).unwrap();
        drop(own);
        assert!(!is_own(n) && !still_names(n, &sock));
    }

    #[test]
    fn relocate_frees_the_number_and_keeps_the_file() {
        let _one = serial();
        let (a, b) = UnixStream::pair().unwrap();
        let mut own: Own<OwnedFd> = Own::dup(a.as_fd()).unwrap();
        drop(a);
        let before = own.raw();
        let sock = target(before).unwrap();
        own.relocate().unwrap();
        let after = own.raw();
        assert_ne!(before, after);
        assert!(!is_own(before) && is_own(after));
        assert!(!still_names(before, &sock) && still_names(after, &sock));
        std::io::Write::write_all(&mut &b, b"y").unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(rustix::io::read(&*own, &mut buf).unwrap(), 1);
        assert_eq!(&buf, b"y");
    }

    #[test]
    fn own_in_respects_the_bounds() {
        let _one = serial();
        let (a, _b) = UnixStream::pair().unwrap();
        let own: Own<OwnedFd> = Own::dup(a.as_fd()).unwrap();
        let n = own.raw() as u32;
        assert!(own_in(n, n).eq([n as RawFd]));
        assert!(!own_in(n + 1, u32::MAX).any(|f| f == n as RawFd));
        assert!(!own_in(0, n - 1).any(|f| f == n as RawFd));
        assert_eq!(own_in(5, 4).count(), 0);
        assert!(!is_own(-1));
    }
}
