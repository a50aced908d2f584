//! Passing file descriptors between processes over a unix stream socket (`SCM_RIGHTS`): how
//! an application receives the memfd of its rings and the eventfds of its doorbells.
//!
//! Descriptors ride along with at least one byte of ordinary data, which the receiver gets
//! in the same call as the descriptors.

use rustix::io::{IoSlice, IoSliceMut};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 16;

/// Sends `data` (at least one byte) with `fds` attached; returns how many bytes of `data`
/// were sent (the descriptors go with the first of them, all or none).
pub fn send_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    send_fds_with(sock, data, fds, SendFlags::NOSIGNAL)
}

/// [`send_fds`] that never blocks (`MSG_DONTWAIT`): a peer that does not read its socket
/// gets `WouldBlock` instead of stalling the sender.
pub fn try_send_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    send_fds_with(sock, data, fds, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
}

fn send_fds_with(
    sock: &UnixStream,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
    flags: SendFlags,
) -> io::Result<usize> {
    if data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "descriptors need at least one byte of data to ride on",
        ));
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("at most {MAX_FDS} descriptors per message"),
        ));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("control buffer too small"));
    }
    loop {
        match sendmsg(sock, &[IoSlice::new(data)], &mut control, flags) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives into `buf` and appends the descriptors that came with the data to `fds` (opened
/// close-on-exec); returns the number of bytes received (0: the peer closed).
///
/// If the sender attached more than [`MAX_FDS`] descriptors the kernel drops the excess; that
/// is reported as an error (the ones that did arrive are closed), not silently lost.
pub fn recv_fds(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        match recvmsg(
            sock,
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(m) => break m,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut got = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            got.extend(received);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        // `got` is dropped here: the descriptors that fit are closed.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more than {MAX_FDS} descriptors in one message: excess dropped"),
        ));
    }
    fds.extend(got);
    Ok(msg.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SharedRegion;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_memfd_crosses_and_reads_back() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = std::fs::File::from(
            rustix::fs::memfd_create("fdpass", rustix::fs::MemfdFlags::CLOEXEC).unwrap(),
        );
        f.write_all(b"through SCM_RIGHTS").unwrap();
        assert_eq!(send_fds(&a, b"M", &[f.as_fd()]).unwrap(), 1);
        drop(f); // the receiver's copy keeps the file alive

        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        assert_eq!(recv_fds(&b, &mut buf, &mut fds).unwrap(), 1);
        assert_eq!(&buf[..1], b"M");
        assert_eq!(fds.len(), 1);
        let mut g = std::fs::File::from(fds.pop().unwrap());
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "through SCM_RIGHTS");
    }

    #[test]
    fn a_shared_region_crosses_and_maps_the_same_pages() {
        let (a, b) = UnixStream::pair().unwrap();
        let r = SharedRegion::create("fdpass-region", 8192).unwrap();
        let word = r.atomic_u32(4096).unwrap();
        word.store(0xfeed, std::sync::atomic::Ordering::SeqCst);
        send_fds(&a, b"R", &[r.fd()]).unwrap();
        let mut buf = [0u8; 1];
        let mut fds = Vec::new();
        recv_fds(&b, &mut buf, &mut fds).unwrap();
        let peer = SharedRegion::from_fd(fds.pop().unwrap()).unwrap();
        assert_eq!(peer.len(), 8192);
        let w2 = peer.atomic_u32(4096).unwrap();
        assert_eq!(w2.load(std::sync::atomic::Ordering::SeqCst), 0xfeed);
        w2.store(7, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(word.load(std::sync::atomic::Ordering::SeqCst), 7);
    }

    #[test]
    fn several_descriptors_and_plain_data() {
        let (a, b) = UnixStream::pair().unwrap();
        let e1 = crate::eventfd::EventFd::new().unwrap();
        let e2 = crate::eventfd::EventFd::new().unwrap();
        send_fds(&a, b"two", &[e1.as_fd(), e2.as_fd()]).unwrap();
        send_fds(&a, b"none", &[]).unwrap();
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"two");
        assert_eq!(fds.len(), 2);
        // The received eventfd is the same counter.
        let r1 = crate::eventfd::EventFd::from_fd(fds.remove(0));
        e1.signal().unwrap();
        assert_eq!(r1.take().unwrap(), 1);
        let n = recv_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"none");
        assert_eq!(fds.len(), 1, "no descriptors came with the plain data");
    }

    #[test]
    fn misuse_is_an_error() {
        let (a, _b) = UnixStream::pair().unwrap();
        let e = crate::eventfd::EventFd::new().unwrap();
        assert!(send_fds(&a, b"", &[e.as_fd()]).is_err());
        let many = vec![e.as_fd(); MAX_FDS + 1];
        assert!(send_fds(&a, b"x", &many).is_err());
    }

    #[test]
    fn peer_closed_reads_zero() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let mut fds = Vec::new();
        assert_eq!(recv_fds(&b, &mut [0u8; 4], &mut fds).unwrap(), 0);
        assert!(fds.is_empty());
    }
}
