//! Stale tokens in `poll`/`select`: a placeholder the kernel reports readable while this
//! process's view says a read would block is not reported (its token is taken back), and
//! the call sleeps on for what is left of its timeout — iperf3 -R's control connection
//! stalled in a blocking read after such a `select`.
//!
//! A fake daemon API stands in for `flowstack_client::posix`: each socket's placeholder is
//! a real unix socket pair (the test writes the "daemon's" tokens into the other end), and
//! `confirm_readable` answers from a flag the test sets — the view.

use super::*;
use crate::backend::{Accepted, Backend, Errno, FastReady, FdFlags};
use crate::table::{Entry, SockId};
use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The view: per socket, its placeholder (A) and whether a read would find data; and the
/// sends made through it (socket, length), each taking at most `send_room` bytes (0: all).
#[derive(Default)]
pub(crate) struct Fake {
    socks: Mutex<HashMap<SockId, (RawFd, bool)>>,
    pub(crate) sends: Mutex<Vec<(SockId, usize)>>,
    pub(crate) send_room: std::sync::atomic::AtomicUsize,
}

/// The fake, installed as this test process's backend (the `ops` tests use it too).
pub(crate) fn fake() -> &'static Fake {
    static F: OnceLock<Fake> = OnceLock::new();
    let f = F.get_or_init(Fake::default);
    // The process's shim state answers with the fake (every test here shares it).
    let _ = state::state().set_backend(f);
    f
}

/// A placeholder pair registered as socket `id` (A in the shim's table), with a token in A
/// and the view saying `view_readable`. Returns (A, D).
fn sock(view_readable: bool) -> (UnixStream, UnixStream, SockId) {
    static NEXT: AtomicU32 = AtomicU32::new(1000);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let (a, d) = UnixStream::pair().expect("pair");
    a.set_nonblocking(true).expect("nonblocking");
    std::io::Write::write_all(&mut &d, b"r").expect("token");
    let f = fake();
    f.socks
        .lock()
        .unwrap()
        .insert(id, (a.as_raw_fd(), view_readable));
    assert!(state::state()
        .table
        .set(a.as_raw_fd(), Entry::new(id, false, false, false)));
    (a, d, id)
}

fn set_view(id: SockId, readable: bool) {
    fake()
        .socks
        .lock()
        .unwrap()
        .get_mut(&id)
        .expect("registered")
        .1 = readable;
}

fn has_token(a: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: a.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

impl Backend for Fake {
    fn confirm_readable(&self, id: SockId) -> bool {
        let (a, view) = self.socks.lock().unwrap()[&id];
        if !view {
            // As `Posix::confirm_readable`: a stale token is taken back.
            let mut buf = [0u8; 16];
            // SAFETY: reads into a stack buffer from a descriptor the test keeps open.
            unsafe { libc::recv(a, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        }
        view
    }
    fn ready_many(
        &self,
        ids: &[SockId],
        _: &[bool],
        _: bool,
        out: &mut Vec<Option<FastReady>>,
    ) -> Result<u64, Errno> {
        // Nothing computed here: the kernel's answer is judged by `confirm_readable`.
        out.clear();
        out.extend(ids.iter().map(|_| None));
        Ok(0)
    }
    fn socket(&self, _: bool, _: FdFlags) -> Result<(OwnedFd, SockId), Errno> {
        unreachable!()
    }
    fn adopt(&self, _: i32) -> Option<SockId> {
        None
    }
    fn carries(&self, _: SocketAddrV4) -> bool {
        unreachable!()
    }
    fn bind(&self, _: SockId, _: SocketAddrV4) -> Result<(), Errno> {
        unreachable!()
    }
    fn listen(&self, _: SockId, _: i32, _: Option<OwnedFd>) -> Result<(), Errno> {
        unreachable!()
    }
    fn accept(&self, _: SockId, _: FdFlags) -> Result<Accepted, Errno> {
        unreachable!()
    }
    fn connect(&self, _: SockId, _: SocketAddrV4) -> Result<(), Errno> {
        unreachable!()
    }
    fn sendto(
        &self,
        id: SockId,
        data: &[u8],
        _: i32,
        _: Option<SocketAddrV4>,
    ) -> Result<usize, Errno> {
        let room = self.send_room.load(Ordering::Relaxed);
        let n = if room == 0 {
            data.len()
        } else {
            data.len().min(room)
        };
        self.sends.lock().unwrap().push((id, n));
        Ok(n)
    }
    fn recvfrom(
        &self,
        _: SockId,
        _: &mut [u8],
        _: i32,
    ) -> Result<(usize, Option<SocketAddrV4>), Errno> {
        unreachable!()
    }
    fn shutdown(&self, _: SockId, _: i32) -> Result<(), Errno> {
        unreachable!()
    }
    fn local_addr(&self, _: SockId) -> Result<SocketAddrV4, Errno> {
        unreachable!()
    }
    fn peer_addr(&self, _: SockId) -> Result<SocketAddrV4, Errno> {
        unreachable!()
    }
    fn take_error(&self, _: SockId) -> Errno {
        unreachable!()
    }
    fn set_option(&self, _: SockId, _: i32, _: i32, _: &[u8]) -> Result<(), Errno> {
        unreachable!()
    }
    fn get_option(&self, _: SockId, _: i32, _: i32, _: &mut [u8]) -> Result<usize, Errno> {
        unreachable!()
    }
    fn send_file(&self, _: SockId, _: i32, _: u64, _: usize) -> Result<usize, Errno> {
        unreachable!()
    }
    fn readable_bytes(&self, _: SockId) -> usize {
        unreachable!()
    }
    fn unsent_bytes(&self, _: SockId) -> usize {
        unreachable!()
    }
    fn forget(&self, _: SockId) {}
    fn after_fork(&self) {}
    fn report(&self, _: crate::addr::Reason, _: Option<SocketAddrV4>) {}
}

fn pfd(a: &UnixStream) -> libc::pollfd {
    libc::pollfd {
        fd: a.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }
}

#[test]
fn poll_does_not_report_a_stale_token_and_takes_it_back() {
    let (stale, _d1, _) = sock(false);
    let (live, _d2, _) = sock(true);
    let mut fds = [pfd(&stale), pfd(&live)];
    // SAFETY: two valid pollfds.
    let n = unsafe { poll(fds.as_mut_ptr(), 2, 2000) };
    assert_eq!(n, 1, "only the socket whose view is readable");
    assert_eq!(fds[0].revents, 0, "the stale token is not reported");
    assert_ne!(fds[1].revents & libc::POLLIN, 0);
    assert!(!has_token(&stale), "the stale token was taken back");
    assert!(has_token(&live), "a real one stays until read");
}

#[test]
fn poll_with_only_a_stale_token_times_out() {
    let (stale, _d, _) = sock(false);
    let mut fds = [pfd(&stale)];
    // SAFETY: one valid pollfd.
    let n = unsafe { poll(fds.as_mut_ptr(), 1, 30) };
    assert_eq!((n, fds[0].revents), (0, 0), "nothing to read: the timeout");
}

#[test]
fn poll_sleeps_on_after_a_stale_token_until_real_data() {
    let (stale, d, id) = sock(false);
    let d = Arc::new(d);
    let t = {
        let d = Arc::clone(&d);
        std::thread::spawn(move || {
            // The daemon delivers later: the view becomes readable, then a token.
            std::thread::sleep(std::time::Duration::from_millis(50));
            set_view(id, true);
            std::io::Write::write_all(&mut &*d, b"r").expect("token");
        })
    };
    let mut fds = [pfd(&stale)];
    // SAFETY: one valid pollfd.
    let n = unsafe { poll(fds.as_mut_ptr(), 1, 10_000) };
    t.join().unwrap();
    assert_eq!(n, 1, "woken by the real token after skipping the stale one");
    assert_ne!(fds[0].revents & libc::POLLIN, 0);
}

#[test]
fn select_does_not_report_a_stale_token() {
    let (stale, _d1, _) = sock(false);
    let (live, _d2, _) = sock(true);
    let (s, l) = (stale.as_raw_fd(), live.as_raw_fd());
    // SAFETY: fd_set manipulated with the libc macros; descriptors below FD_SETSIZE.
    unsafe {
        let mut r: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(s, &mut r);
        libc::FD_SET(l, &mut r);
        let mut tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        let n = select(
            s.max(l) + 1,
            &mut r,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut tv,
        );
        assert_eq!(n, 1);
        assert!(!libc::FD_ISSET(s, &r), "the stale token is not reported");
        assert!(libc::FD_ISSET(l, &r));
    }
    assert!(!has_token(&stale));
}

#[test]
fn select_with_only_a_stale_token_times_out_with_the_time_used() {
    let (stale, _d, _) = sock(false);
    let s = stale.as_raw_fd();
    // SAFETY: as above.
    unsafe {
        let mut r: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(s, &mut r);
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 30_000,
        };
        let n = select(
            s + 1,
            &mut r,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut tv,
        );
        assert_eq!(n, 0);
        assert!(!libc::FD_ISSET(s, &r));
        assert_eq!(
            (tv.tv_sec, tv.tv_usec),
            (0, 0),
            "Linux leaves the time not slept: none"
        );
    }
}
