//! Files: positional gathered writes (received data, which lies in a ring as one or two
//! borrowed slices, goes to a file in one system call and no copy), the kernel's `sendfile(2)`
//! (the baseline `flowstack bench file` compares with), read-ahead advice, and the calling
//! thread's CPU time (what a transfer cost its sender).

use rustix::io::IoSlice;
use std::io;
use std::os::fd::AsFd;

/// Slices passed to one `pwritev(2)` call; longer lists take several calls (the kernel's
/// `IOV_MAX` is 1024; this keeps the `iovec` array on the stack).
const IOV_CHUNK: usize = 64;

/// Writes `bufs`, in order, at `offset` of `fd` with `pwritev(2)`; returns the number of bytes
/// written, which may be fewer than asked (as `pwritev` may). Does not move the file position.
pub fn pwritev(fd: &impl AsFd, bufs: &[&[u8]], offset: u64) -> io::Result<usize> {
    let n = bufs.len().min(IOV_CHUNK);
    let iov: [IoSlice<'_>; IOV_CHUNK] =
        std::array::from_fn(|i| IoSlice::new(bufs.get(i).copied().unwrap_or(&[])));
    Ok(rustix::io::pwritev(fd, &iov[..n], offset)?)
}

/// Writes all of `bufs` at `offset`, repeating [`pwritev`] after short writes and
/// interruptions.
pub fn pwritev_all(fd: &impl AsFd, mut bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
    // `first` is what is left of bufs[0] after a short write.
    let mut first: &[u8] = bufs.first().copied().unwrap_or(&[]);
    while !bufs.is_empty() {
        if first.is_empty() {
            bufs = &bufs[1..];
            first = bufs.first().copied().unwrap_or(&[]);
            continue;
        }
        let n = bufs.len().min(IOV_CHUNK);
        let iov: [IoSlice<'_>; IOV_CHUNK] = std::array::from_fn(|i| {
            IoSlice::new(match i {
                0 => first,
                i if i < n => bufs[i],
                _ => &[],
            })
        });
        let mut done = match rustix::io::pwritev(fd, &iov[..n], offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(w) => w,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        offset += done as u64;
        // Skip what was written: whole slices, then part of the next.
        while done > 0 {
            if done >= first.len() {
                done -= first.len();
                bufs = &bufs[1..];
                first = bufs.first().copied().unwrap_or(&[]);
            } else {
                first = &first[done..];
                done = 0;
            }
        }
    }
    Ok(())
}

/// The kernel's `sendfile(2)` from `file` at `offset` to the socket (or file) `out`, up to
/// `count` bytes; returns the bytes sent (0 at end of file). Retries on EINTR.
pub fn sendfile(out: &impl AsFd, file: &impl AsFd, offset: u64, count: usize) -> io::Result<usize> {
    let mut off = offset;
    loop {
        match rustix::fs::sendfile(out, file, Some(&mut off), count) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// Tells the kernel `file` will be read sequentially (a larger read-ahead window).
pub fn advise_sequential(file: &impl AsFd) -> io::Result<()> {
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::Sequential)?;
    Ok(())
}

/// CPU time the calling thread has used (user + system), in nanoseconds.
///
/// Through libc, not rustix: rustix parses the vDSO itself, which crashes under valgrind
/// (rustix issue #1559), and `bench file`'s `file_once` example is meant for callgrind.
#[allow(unsafe_code)]
pub fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the duration of the call;
    // CLOCK_THREAD_CPUTIME_ID is always supported on Linux, and on failure `t` stays zero.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn file_contents(fd: &impl AsFd) -> Vec<u8> {
        let mut f = std::fs::File::from(fd.as_fd().try_clone_to_owned().unwrap());
        let mut v = Vec::new();
        std::io::Seek::rewind(&mut f).unwrap();
        f.read_to_end(&mut v).unwrap();
        v
    }

    fn memfd() -> std::os::fd::OwnedFd {
        rustix::fs::memfd_create("pwritev-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap()
    }

    #[test]
    fn gathers_slices_at_an_offset() {
        let fd = memfd();
        assert_eq!(pwritev(&fd, &[b"hello ", b"", b"world"], 3).unwrap(), 11);
        assert_eq!(file_contents(&fd), b"\0\0\0hello world");
    }

    #[test]
    fn all_of_a_long_list() {
        let fd = memfd();
        let parts: Vec<Vec<u8>> = (0..200u32)
            .map(|i| vec![i as u8; (i % 7) as usize])
            .collect();
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        pwritev_all(&fd, &slices, 0).unwrap();
        assert_eq!(file_contents(&fd), parts.concat());
    }

    #[test]
    fn sendfile_copies_a_range_and_stops_at_the_end() {
        let src = memfd();
        pwritev_all(&src, &[b"0123456789"], 0).unwrap();
        advise_sequential(&src).unwrap();
        let dst = memfd();
        assert_eq!(sendfile(&dst, &src, 3, 4).unwrap(), 4);
        assert_eq!(sendfile(&dst, &src, 8, 100).unwrap(), 2);
        assert_eq!(sendfile(&dst, &src, 10, 100).unwrap(), 0);
        assert_eq!(file_contents(&dst), b"345689");
    }

    #[test]
    fn thread_cpu_time_advances_with_work() {
        let t0 = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() < t0 + 2_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(thread_cpu_ns() >= t0 + 2_000_000 && x > 0);
    }

    #[test]
    fn bad_descriptor_is_an_error() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(pwritev(&a, &[b"x"], 0).is_err());
    }
}
