//! Waiting for a descriptor to become readable.

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
    let ms = timeout.as_millis().min(i32::MAX as u128) as i64;
    let ms = ms.max(if timeout.is_zero() { 0 } else { 1 });
    let ts = Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    };
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    match poll(&mut fds, Some(&ts)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Waits up to `timeout` for any of `fds` to become readable (or hang up); returns, per
/// descriptor, whether it is. Millisecond granularity as in [`wait_readable`]; `None` waits
/// with no timeout. An interrupted wait returns all `false`.
pub fn wait_any(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let ts = timeout.map(|t| {
        let ms = t.as_millis().min(i32::MAX as u128) as i64;
        let ms = ms.max(if t.is_zero() { 0 } else { 1 });
        Timespec {
            tv_sec: ms / 1000,
            tv_nsec: (ms % 1000) * 1_000_000,
        }
    });
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
