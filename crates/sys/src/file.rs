//! Positional gathered writes: received data, which lies in a ring as one or two borrowed
//! slices (or in several buffers), goes to a file in one system call and no copy.

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
    fn bad_descriptor_is_an_error() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(pwritev(&a, &[b"x"], 0).is_err());
    }
}
