//! eventfd: a kernel counter to signal and wait on, across threads or (passed with
//! [`fdpass`](crate::fdpass)) processes, that `poll`/`epoll` can watch next to sockets.

use rustix::event::{eventfd, EventfdFlags};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking, close-on-exec eventfd in counter mode.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl From<OwnedFd> for EventFd {
    fn from(fd: OwnedFd) -> Self {
        Self::from_fd(fd)
    }
}

impl EventFd {
    /// Creates one with the counter at zero.
    pub fn new() -> io::Result<Self> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Self { fd })
    }

    /// Wraps a descriptor received from elsewhere (e.g. over [`fdpass`](crate::fdpass)). It
    /// should be a non-blocking eventfd: a read on a blocking one with the counter at zero
    /// would block in [`EventFd::take`].
    pub fn from_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// Adds one to the counter, waking a waiter. A counter at its maximum stays there (the
    /// waiter is woken either way).
    pub fn signal(&self) -> io::Result<()> {
        match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes the counter (resetting it to zero); 0 if nothing was signalled.
    pub fn take(&self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        match rustix::io::read(&self.fd, &mut b) {
            Ok(8) => Ok(u64::from_ne_bytes(b)),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "short eventfd read",
            )),
            Err(rustix::io::Errno::AGAIN) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits up to `timeout` for a signal and takes the counter; 0 on timeout.
    pub fn wait(&self, timeout: Duration) -> io::Result<u64> {
        let n = self.take()?;
        if n > 0 || timeout.is_zero() {
            return Ok(n);
        }
        crate::poll::wait_readable(&self.fd, timeout)?;
        self.take()
    }

    /// The descriptor, to watch with `poll`/`epoll` or to pass to another process.
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Gives up the descriptor.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn signals_add_up_and_take_resets() {
        let e = EventFd::new().unwrap();
        assert_eq!(e.take().unwrap(), 0);
        e.signal().unwrap();
        e.signal().unwrap();
        assert_eq!(e.take().unwrap(), 2);
        assert_eq!(e.take().unwrap(), 0);
    }

    #[test]
    fn wait_times_out_with_zero() {
        let e = EventFd::new().unwrap();
        let t = std::time::Instant::now();
        assert_eq!(e.wait(Duration::from_millis(10)).unwrap(), 0);
        assert!(t.elapsed() >= Duration::from_millis(10));
    }

    #[test]
    fn signal_from_another_thread_ends_a_wait() {
        let e = Arc::new(EventFd::new().unwrap());
        let e2 = e.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            e2.signal().unwrap();
        });
        let mut got = 0;
        let start = std::time::Instant::now();
        while got == 0 && start.elapsed() < Duration::from_secs(10) {
            got = e.wait(Duration::from_secs(10)).unwrap();
        }
        assert_eq!(got, 1);
        t.join().unwrap();
    }

    #[test]
    fn raw_fd_is_pollable() {
        let e = EventFd::new().unwrap();
        assert!(!crate::poll::wait_readable(&e, Duration::ZERO).unwrap());
        e.signal().unwrap();
        assert!(crate::poll::wait_readable(&e, Duration::ZERO).unwrap());
    }
}
