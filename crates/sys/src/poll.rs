//! Waiting for a descriptor (or the first of several) to become readable.

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

/// Waits up to `timeout` for `fd` to become readable; returns whether it is (an error or
/// hang-up counts as readable: the next read reports it).
///
/// The timeout has millisecond granularity, rounded down, but a non-zero timeout waits at
/// least 1 ms (as the drivers' `poll(2)` always did), so a sub-millisecond timeout cannot
/// turn a wait into a busy loop.
pub fn wait_readable(fd: &impl AsFd, timeout: Duration) -> io::Result<bool> {
    wait_any_readable(&[fd.as_fd()], timeout)
}

/// Waits up to `timeout` until any of `fds` becomes readable (e.g. a device's descriptor and
/// an eventfd that other threads signal); returns whether one is. Same rules as
/// [`wait_readable`]; one to 8 descriptors (none or more is an `InvalidInput` error).
pub fn wait_any_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<bool> {
    const MAX: usize = 8;
    if fds.is_empty() || fds.len() > MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("wait_any_readable takes 1 to {MAX} descriptors"),
        ));
    }
    let ts = timespec(timeout);
    let mut set: [PollFd<'_>; MAX] = std::array::from_fn(|i| {
        PollFd::from_borrowed_fd(*fds.get(i).unwrap_or(&fds[0]), PollFlags::IN)
    });
    match poll(&mut set[..fds.len()], Some(&ts)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Waits up to `timeout` for any of `fds` to become readable (or hang up); returns, per
/// descriptor, whether it is. Millisecond granularity as in [`wait_readable`]; `None` waits
/// with no timeout. An interrupted wait returns all `false`.
pub fn wait_any(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let ts = timeout.map(timespec);
    let mut pfds: Vec<PollFd<'_>> = fds.iter().map(|f| PollFd::new(f, PollFlags::IN)).collect();
    match poll(&mut pfds, ts.as_ref()) {
        Ok(_) => Ok(pfds
            .iter()
            .map(|p| {
                let r = p.revents();
                r.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL)
            })
            .collect()),
        Err(rustix::io::Errno::INTR) => Ok(vec![false; fds.len()]),
        Err(e) => Err(e.into()),
    }
}

/// A poll timeout in whole milliseconds, rounded down, but at least 1 ms unless zero (so a
/// sub-millisecond wait never becomes a busy loop).
fn timespec(timeout: Duration) -> Timespec {
    let ms = timeout.as_millis().min(i32::MAX as u128) as i64;
    let ms = ms.max(if timeout.is_zero() { 0 } else { 1 });
    Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn readable_after_a_write_not_before() {
        let (mut a, b) = UnixStream::pair().unwrap();
        assert!(!wait_readable(&b, Duration::ZERO).unwrap());
        let t = std::time::Instant::now();
        assert!(!wait_readable(&b, Duration::from_micros(10)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(1), "at least 1 ms");
        a.write_all(b"x").unwrap();
        assert!(wait_readable(&b, Duration::from_secs(5)).unwrap());
    }

    #[test]
    fn any_of_several_wakes_the_wait() {
        let (_a, b) = UnixStream::pair().unwrap();
        let (mut c, d) = UnixStream::pair().unwrap();
        let fds = [b.as_fd(), d.as_fd()];
        assert!(!wait_any_readable(&fds, Duration::ZERO).unwrap());
        c.write_all(b"x").unwrap();
        assert!(wait_any_readable(&fds, Duration::from_secs(5)).unwrap());
        let many = [b.as_fd(); 9];
        assert!(wait_any_readable(&many, Duration::ZERO).is_err());
        assert!(wait_any_readable(&[], Duration::ZERO).is_err());
    }

    #[test]
    fn wait_any_reports_which_one() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (_c, d) = UnixStream::pair().unwrap();
        let fds = [b.as_fd(), d.as_fd()];
        let got = wait_any(&fds, Some(Duration::ZERO)).unwrap();
        assert_eq!(got, vec![false, false]);
        a.write_all(b"x").unwrap();
        let got = wait_any(&fds, Some(Duration::from_secs(5))).unwrap();
        assert_eq!(got, vec![true, false]);
    }
}
