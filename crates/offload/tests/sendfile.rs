//! `Posix::send_file` over a daemon: the file's descriptor goes to the daemon, which reads
//! the file itself (never through the application's memory). Byte-exact transfers, the
//! non-blocking and error semantics of `sendfile(2)`, a file truncated mid-send, and the
//! daemon's counters. Every wait is bounded.

use flowstack_client::posix::{Errno, Posix, RecvFlags, SockId, Type};
use flowstack_offload::{Daemon, DaemonConfig, DaemonHandle};
use flowstack_sys::placeholder::wait_a;
use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(20));
const POLL: Duration = Duration::from_secs(10);
const BLOCK: RecvFlags = RecvFlags::BLOCK;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `FLOWSTACK_TEST_ENGINES=N` runs these tests on a daemon of N engine threads (the
/// applications of this process, and its forked children, all on one of them).
fn engines() -> usize {
    std::env::var("FLOWSTACK_TEST_ENGINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn daemon(name: &str) -> (DaemonHandle, Dir) {
    let dir = std::env::temp_dir().join(format!("flowstack-sf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        engines: engines(),
        ..DaemonConfig::default()
    })
    .unwrap();
    (d, Dir(dir))
}

fn lo(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

struct Pair {
    server: Posix,
    client: Posix,
    sa: OwnedFd,
    sid: SockId,
    _ca: OwnedFd,
    cid: SockId,
}

/// Two registrations ("processes"): the server's accepted socket sends, the client reads.
fn connected(path: &Path) -> Pair {
    let server = Posix::attach(path).unwrap();
    let client = Posix::attach(path).unwrap();
    let (_la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 16, None).unwrap();
    let (ca, cid) = client.socket(Type::Stream).unwrap();
    client.connect(cid, lo(port), false, T).unwrap();
    let (sa, sid, _, _) = server.accept(lid, false, T).unwrap();
    Pair {
        server,
        client,
        sa,
        sid,
        _ca: ca,
        cid,
    }
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 11) ^ (i >> 19)) as u8
}

fn write_file(path: &Path, len: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..len).map(pattern).collect();
    File::create(path).unwrap().write_all(&data).unwrap();
    data
}

/// Reads exactly `n` bytes (or until end of stream).
fn recv_n(p: &Posix, id: SockId, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    let mut buf = vec![0u8; 256 * 1024];
    while out.len() < n {
        let want = (n - out.len()).min(buf.len());
        let k = p.recv(id, &mut buf[..want], BLOCK, T).unwrap();
        if k == 0 {
            break;
        }
        out.extend_from_slice(&buf[..k]);
    }
    out
}

fn counter(path: &Path, name: &str) -> u64 {
    flowstack_offload::stats::query(path).unwrap().counters[name]
}

#[test]
fn files_of_every_size_arrive_byte_exact_and_are_counted() {
    let (d, dir) = daemon("sizes");
    let p = connected(&d.path);
    let mut expect_total = 0u64;
    for (i, &len) in [0usize, 1, 4095, 4097, (3 << 20) + 7].iter().enumerate() {
        let path = dir.0.join(format!("f{i}"));
        let data = write_file(&path, len);
        let f = File::open(&path).unwrap();
        // Blocking: everything in one call (the receiver reads meanwhile).
        let got = std::thread::scope(|s| {
            let r = s.spawn(|| recv_n(&p.client, p.cid, len));
            let n = p
                .server
                .send_file(p.sid, f.as_fd(), 0, len, false, T)
                .unwrap();
            assert_eq!(n, len, "size {len}");
            r.join().unwrap()
        });
        assert!(got == data, "size {len}: bytes differ");
        expect_total += len as u64;
        // Past the end of the file: a short count; at the end: 0 (as sendfile(2)).
        if len > 0 {
            let n = p
                .server
                .send_file(p.sid, f.as_fd(), len as u64 - 1, 100, false, T)
                .unwrap();
            assert_eq!(n, 1);
            assert_eq!(recv_n(&p.client, p.cid, 1), &data[len - 1..]);
            expect_total += 1;
        }
        let at_end = p
            .server
            .send_file(p.sid, f.as_fd(), len as u64, 10, false, T);
        assert_eq!(at_end, Ok(0));
    }
    // An explicit offset in the middle of a file.
    let path = dir.0.join("mid");
    let data = write_file(&path, 1 << 20);
    let f = File::open(&path).unwrap();
    let n = p
        .server
        .send_file(p.sid, f.as_fd(), 12_345, 100_000, false, T)
        .unwrap();
    assert_eq!(n, 100_000);
    assert!(recv_n(&p.client, p.cid, n) == data[12_345..112_345]);
    expect_total += n as u64;
    // The daemon read the file: its counter has every byte; our file position never moved.
    assert_eq!(counter(&d.path, "FlowstackdSendFileBytes"), expect_total);
    assert!(counter(&d.path, "FlowstackdSendFileCalls") >= 6);
    use std::io::Seek;
    assert_eq!((&f).stream_position().unwrap(), 0);
}

#[test]
fn a_nonblocking_socket_takes_a_short_count_then_eagain_until_there_is_room() {
    let (d, dir) = daemon("nonblock");
    let p = connected(&d.path);
    let len = 32 << 20;
    let path = dir.0.join("big");
    let data = write_file(&path, len);
    let f = File::open(&path).unwrap();
    // The receiver does not read: the send buffers fill.
    let mut sent = 0usize;
    loop {
        match p
            .server
            .send_file(p.sid, f.as_fd(), sent as u64, len - sent, true, None)
        {
            Ok(n) => {
                assert!(n > 0 && n < len - sent, "a short count, not {n}");
                sent += n;
            }
            Err(e) => {
                assert_eq!(e, Errno::EAGAIN);
                break;
            }
        }
        assert!(sent < len, "the send buffer never filled");
    }
    assert!(sent > 0);
    // No room: the placeholder is unwritable, as a full kernel socket.
    assert!(!wait_a(p.sa.as_fd(), false, true, Duration::ZERO).unwrap().1);
    let mut got = recv_n(&p.client, p.cid, sent);
    assert!(got == data[..sent]);
    // Room again: writable; the rest goes out (reading as we go).
    assert!(wait_a(p.sa.as_fd(), false, true, POLL).unwrap().1);
    let rest = len - sent;
    std::thread::scope(|s| {
        let r = s.spawn(|| recv_n(&p.client, p.cid, rest));
        while sent < len {
            match p
                .server
                .send_file(p.sid, f.as_fd(), sent as u64, len - sent, true, None)
            {
                Ok(n) => sent += n,
                Err(Errno::EAGAIN) => {
                    assert!(wait_a(p.sa.as_fd(), false, true, POLL).unwrap().1);
                }
                Err(e) => panic!("{e}"),
            }
        }
        got.extend(r.join().unwrap());
    });
    assert!(got == data, "bytes differ");
}

#[test]
fn inputs_sendfile_refuses_get_its_errnos() {
    let (d, dir) = daemon("errors");
    let p = connected(&d.path);
    let path = dir.0.join("w");
    write_file(&path, 100);
    // Not open for reading: EBADF.
    let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    assert_eq!(
        p.server.send_file(p.sid, w.as_fd(), 0, 10, false, T),
        Err(Errno::EBADF)
    );
    // A directory: EINVAL.
    let dirf = File::open(&dir.0).unwrap();
    assert_eq!(
        p.server.send_file(p.sid, dirf.as_fd(), 0, 10, false, T),
        Err(Errno::EINVAL)
    );
    // A pipe: EINVAL here (the shim sends those with its copy path).
    let (r, _w) = std::io::pipe().unwrap();
    assert_eq!(
        p.server.send_file(p.sid, r.as_fd(), 0, 10, false, T),
        Err(Errno::EINVAL)
    );
    // An offset whose end is no file offset: EINVAL.
    let f = File::open(&path).unwrap();
    assert_eq!(
        p.server
            .send_file(p.sid, f.as_fd(), i64::MAX as u64, 10, false, T),
        Err(Errno::EINVAL)
    );
    // A listener is no connection.
    let (_la, lid) = p.server.socket(Type::Stream).unwrap();
    p.server.bind(lid, lo(0)).unwrap();
    p.server.listen(lid, 4, None).unwrap();
    assert_eq!(
        p.server.send_file(lid, f.as_fd(), 0, 10, false, T),
        Err(Errno::ENOTCONN)
    );
    // Nothing was sent, and the socket still works.
    assert_eq!(counter(&d.path, "FlowstackdSendFileBytes"), 0);
    assert_eq!(
        p.server.send_file(p.sid, f.as_fd(), 0, 100, false, T),
        Ok(100)
    );
    assert_eq!(recv_n(&p.client, p.cid, 100).len(), 100);
}

#[test]
fn a_file_truncated_mid_send_ends_short_and_the_daemon_serves_on() {
    let (d, dir) = daemon("truncate");
    let p = connected(&d.path);
    let len = 16 << 20;
    let path = dir.0.join("t");
    let data = write_file(&path, len);
    let f = File::open(&path).unwrap();
    // Fill the send buffers (the receiver does not read yet).
    let mut sent = 0usize;
    while let Ok(n) = p
        .server
        .send_file(p.sid, f.as_fd(), sent as u64, len - sent, true, None)
    {
        sent += n;
    }
    assert!(sent > 0 && sent < len);
    // The file shrinks to a little more than what was queued.
    let cut = sent + 1000;
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut as u64)
        .unwrap();
    // The rest: blocking, it ends short at the new end of file.
    let got = std::thread::scope(|s| {
        let r = s.spawn(|| recv_n(&p.client, p.cid, cut));
        let n = p
            .server
            .send_file(p.sid, f.as_fd(), sent as u64, len - sent, false, T)
            .unwrap();
        assert_eq!(n, 1000, "short: only the bytes before the new end");
        r.join().unwrap()
    });
    assert!(got == data[..cut], "the stream is the file's prefix");
    p.server
        .shutdown(p.sid, flowstack_client::posix::Shutdown::Write)
        .unwrap();
    let mut one = [0u8; 1];
    assert_eq!(p.client.recv(p.cid, &mut one, BLOCK, T), Ok(0));
    // The daemon lives on and serves another application's file.
    let q = connected(&d.path);
    let path2 = dir.0.join("t2");
    let data2 = write_file(&path2, 100_000);
    let f2 = File::open(&path2).unwrap();
    let n = q
        .server
        .send_file(q.sid, f2.as_fd(), 0, 100_000, false, T)
        .unwrap();
    assert_eq!(n, 100_000);
    assert!(recv_n(&q.client, q.cid, n) == data2);
    assert_eq!(
        counter(&d.path, "FlowstackdSendFileBytes"),
        (cut + 100_000) as u64
    );
}
