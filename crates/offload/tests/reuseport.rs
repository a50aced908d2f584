//! `SO_REUSEPORT` across applications (nginx's `reuseport`: each worker its own listener on
//! one port), through the POSIX layer the shim uses: the flag reaches the daemon's bind, a
//! group of one uid shares the port and its connections, a bind without the flag or by
//! another uid gets `EADDRINUSE`, and a member leaving resets only its own queue.
//! Private socket paths, bounded waits.

use flowstack_api::{SocketError, TcpHandle};
use flowstack_client::posix::{Errno, Opt, Posix, RecvFlags, SockId, Type};
use flowstack_client::Client;
use flowstack_offload::{Daemon, DaemonConfig, DaemonHandle};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);
/// Connections per test.
const N: usize = 24;

fn daemon(name: &str) -> DaemonHandle {
    let dir = std::env::temp_dir().join(format!("flowstack-dctl-rp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        ..DaemonConfig::default()
    })
    .unwrap()
}

fn lo(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

/// A socket of `app` with `SO_REUSEPORT` (if `flag`) bound to 127.0.0.1:`port`.
fn bound(app: &Posix, port: u16, flag: bool) -> Result<(OwnedFd, SockId), Errno> {
    let (a, id) = app.socket(Type::Stream).unwrap();
    if flag {
        app.set_option(id, Opt::ReusePort, 1).unwrap();
    }
    app.bind(id, lo(port))?;
    Ok((a, id))
}

fn listener(app: &Posix, port: u16) -> (OwnedFd, SockId) {
    let (a, id) = bound(app, port, true).unwrap();
    assert_eq!(app.listen(id, 64, None).unwrap(), port);
    (a, id)
}

/// `N` connections from a native client, each with its index as first byte.
fn connect_all(cli: &mut Client, port: u16) -> Vec<TcpHandle> {
    (0..N)
        .map(|i| cli.connect_send(lo(port), &[i as u8], T).unwrap().0)
        .collect()
}

/// Accepts on `app`'s listener until `stop`, echoing each connection's first byte back;
/// returns the indexes it served.
fn serve(app: Posix, l: SockId, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let block = RecvFlags::BLOCK;
        let mut got = Vec::new();
        let mut keep = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            match app.accept(l, false, Some(Duration::from_millis(20))) {
                Ok((a, id, _, _)) => {
                    let mut b = [0u8; 1];
                    assert_eq!(app.recv(id, &mut b, block, Some(T)).unwrap(), 1);
                    assert_eq!(app.send(id, &b, false, Some(T)).unwrap(), 1);
                    got.push(b[0]);
                    keep.push(a);
                }
                Err(e) => assert!(e == Errno::EAGAIN || e.0 == 110, "accept: {e:?}"),
            }
        }
        got
    })
}

/// Waits for every connection's echo (`Ok(index)`) or its end (`Err`: reset or closed).
fn outcomes(cli: &mut Client, cs: &[TcpHandle]) -> Vec<Result<u8, SocketError>> {
    cs.iter()
        .map(|&c| {
            let mut b = [0u8; 1];
            match cli.recv(c, &mut b, T) {
                Ok(1) => Ok(b[0]),
                Ok(_) => Err(SocketError::NotConnected),
                Err(e) => Err(e),
            }
        })
        .collect()
}

#[test]
fn a_reuseport_group_of_two_applications_shares_the_port() {
    let d = daemon("share");
    let (a, b) = (
        Posix::attach(&d.path).unwrap(),
        Posix::attach(&d.path).unwrap(),
    );
    let port = 7720;
    let (_la, la) = listener(&a, port);
    let (_lb, lb) = listener(&b, port);
    // Without the flag, the port is taken (on 127.0.0.1 and on 0.0.0.0).
    let c = Posix::attach(&d.path).unwrap();
    assert_eq!(bound(&c, port, false).err(), Some(Errno::EADDRINUSE));
    let (_x, any) = c.socket(Type::Stream).unwrap();
    let any_port = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
    assert_eq!(c.bind(any, any_port), Err(Errno::EADDRINUSE));
    // Connections land on both listeners; every one is served once.
    let stop = Arc::new(AtomicBool::new(false));
    let sa = serve(a, la, stop.clone());
    let sb = serve(b, lb, stop.clone());
    let mut cli = Client::connect(&d.path).unwrap();
    let cs = connect_all(&mut cli, port);
    let out = outcomes(&mut cli, &cs);
    stop.store(true, Ordering::SeqCst);
    let (ga, gb) = (sa.join().unwrap(), sb.join().unwrap());
    for (i, o) in out.iter().enumerate() {
        assert_eq!(*o, Ok(i as u8), "connection {i}");
    }
    assert!(!ga.is_empty() && !gb.is_empty(), "a: {ga:?}, b: {gb:?}");
    let mut all: Vec<u8> = ga.iter().chain(&gb).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..N as u8).collect::<Vec<_>>());
    drop(cli);
    d.stop().unwrap();
}

/// A member leaving resets the connections handed to it and not accepted; those queued on
/// the other member are untouched, and new connections all go to the one left.
#[test]
fn a_member_leaving_keeps_the_others_queue() {
    let d = daemon("leave");
    let (a, b) = (
        Posix::attach(&d.path).unwrap(),
        Posix::attach(&d.path).unwrap(),
    );
    let port = 7721;
    let (fa, la) = listener(&a, port);
    let (_fb, lb) = listener(&b, port);
    let mut cli = Client::connect(&d.path).unwrap();
    let cs = connect_all(&mut cli, port);
    // A's listener is readable: connections were handed to it.
    let fd = std::os::fd::AsFd::as_fd(&fa);
    assert!(
        flowstack_sys::placeholder::wait_a(fd, true, false, T)
            .unwrap()
            .0
    );
    // A closes its listener (last close of its descriptor) without accepting.
    a.forget(la).unwrap();
    drop(fa);
    let stop = Arc::new(AtomicBool::new(false));
    let sb = serve(b, lb, stop.clone());
    let out = outcomes(&mut cli, &cs);
    // New connections: all to B.
    let more = connect_all(&mut cli, port);
    let out2 = outcomes(&mut cli, &more);
    stop.store(true, Ordering::SeqCst);
    let gb = sb.join().unwrap();
    let served = out.iter().filter(|o| o.is_ok()).count();
    let reset = out.iter().filter(|o| o.is_err()).count();
    assert!(reset > 0, "A's queued connections end: {out:?}");
    assert!(served > 0, "B's queue survives A: {out:?}");
    for (i, o) in out.iter().enumerate() {
        if let Err(e) = o {
            assert!(
                matches!(e, SocketError::ConnectionReset | SocketError::NotConnected),
                "connection {i}: {e:?}"
            );
        } else {
            assert_eq!(*o, Ok(i as u8));
        }
    }
    for (i, o) in out2.iter().enumerate() {
        assert_eq!(*o, Ok(i as u8), "new connection {i} after A left");
    }
    assert_eq!(gb.len(), served + N);
    drop(cli);
    d.stop().unwrap();
}

/// The child of [`another_uid_cannot_join`]: run as another uid, it must get
/// `EADDRINUSE` for the group's port even with the flag.
#[test]
#[ignore]
fn other_uid_child() {
    let path = PathBuf::from(std::env::var("DCTL_REUSEPORT_DAEMON").expect("run by the parent"));
    let port: u16 = std::env::var("DCTL_REUSEPORT_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let app = Posix::attach(&path).unwrap();
    assert_eq!(bound(&app, port, true).err(), Some(Errno::EADDRINUSE));
    // The same uid's rule does not stop it elsewhere: another port binds.
    assert!(bound(&app, port + 1, true).is_ok());
}

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

/// socket(7): a group's sockets share one effective uid. As root, this test's own binary
/// runs [`other_uid_child`] as `nobody` (65534) against the group's port.
#[test]
fn another_uid_cannot_join() {
    if uid() != 0 {
        eprintln!("not root: the port table's unit test covers the uid rule");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let d = daemon("uid");
    let dir = d.path.parent().unwrap().to_path_buf();
    for p in [dir.as_path(), d.path.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let a = Posix::attach(&d.path).unwrap();
    let port = 7722;
    let (_la, _l) = listener(&a, port);
    let st = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "other_uid_child",
            "--ignored",
            "--test-threads=1",
        ])
        .env("DCTL_REUSEPORT_DAEMON", &d.path)
        .env("DCTL_REUSEPORT_PORT", port.to_string())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&st.stdout).to_string() + &String::from_utf8_lossy(&st.stderr);
    assert!(st.status.success(), "child as uid 65534 failed:\n{log}");
    assert!(log.contains("1 passed"), "{log}");
    // The same uid joins.
    let b = Posix::attach(&d.path).unwrap();
    let _ = listener(&b, port);
    d.stop().unwrap();
}
