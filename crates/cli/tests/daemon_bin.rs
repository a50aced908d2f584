//! The `flowstackd` binary: the same flags and errors as `flowstack daemon`, and a daemon
//! that dies under a waiting application makes the call fail at once, never hang.

use flowstack_api::{SocketError, Sockets};
use flowstack_client::Client;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const FLOWSTACKD: &str = env!("CARGO_BIN_EXE_flowstackd");
const T: Duration = Duration::from_secs(20);

fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowstackd-bin-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("d.sock")
}

/// Misuse exits 2 with one line that starts with `flowstackd:`, as `flowstack daemon` does.
#[test]
fn misuse_exits_2_with_one_line() {
    for args in [
        &["--ip", "10.79.9.1/24"][..],
        &["--engines", "0"][..],
        &["--max-app-memory", "lots"][..],
        &["--cores", "0", "--engines", "2"][..],
        &["--socket-mode", "8"][..],
        &["--socket-mode", "1777"][..],
        &["--bogus"][..],
    ] {
        let out = Command::new(FLOWSTACKD).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("flowstackd: "), "{args:?}: {err}");
    }
}

/// A device that cannot be opened is a failure (1), not misuse: the link flags reach the
/// same code as `flowstack daemon`'s.
#[test]
fn a_missing_device_exits_1() {
    let out = Command::new(FLOWSTACKD)
        .args(["--socket"])
        .arg(sock_path("nodev"))
        .args(["--packet", "fsd-no-such-if0", "--ip", "10.79.9.1/24"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("flowstackd: "), "{err}");
}

/// Another user (nobody, as a server's workers run) reaches the daemon through its socket by
/// default (mode 0666); `--socket-mode 600` keeps it to the daemon's user.
#[test]
fn another_user_connects_unless_the_socket_mode_forbids_it() {
    if !common::have_root() {
        return;
    }
    for (mode, reachable) in [(None, true), (Some("600"), false)] {
        let path = sock_path(&format!("mode-{}", mode.unwrap_or("default")));
        let mut cmd = Command::new(FLOWSTACKD);
        cmd.arg("--socket").arg(&path);
        if let Some(m) = mode {
            cmd.args(["--socket-mode", m]);
        }
        let mut d = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !path.exists() {
            assert!(
                start.elapsed() < T,
                "the daemon never bound {}",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        use std::os::unix::fs::PermissionsExt;
        let bits = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(bits, if reachable { 0o666 } else { 0o600 });
        // `flowstack stats` connects to the socket as nobody.
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_flowstack"))
            .arg("stats")
            .arg("--socket")
            .arg(&path)
            .output()
            .unwrap();
        let _ = d.kill();
        let _ = d.wait();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), reachable, "mode {mode:?}: {err}");
    }
}

#[test]
fn daemon_death_unblocks_a_waiting_recv_one_engine() {
    daemon_death_unblocks_a_waiting_recv_within_a_second(1)
}

#[test]
fn daemon_death_unblocks_a_waiting_recv_two_engines() {
    daemon_death_unblocks_a_waiting_recv_within_a_second(2)
}

fn lo(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

fn daemon_death_unblocks_a_waiting_recv_within_a_second(engines: usize) {
    let path = sock_path(&format!("death-{engines}"));
    let mut d = Command::new(FLOWSTACKD)
        .arg("--socket")
        .arg(&path)
        .args(["--engines", &engines.to_string(), "--max-app-memory", "64M"])
        .args(if engines > 1 { &["--spread"][..] } else { &[] })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut app = loop {
        match Client::connect(&path) {
            Ok(a) => break a,
            Err(_) if start.elapsed() < T => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    };
    let l = app.tcp_listen(7400, 8).unwrap();
    let c = app.connect_to(lo(7400), T).unwrap();
    let s = app.accept(l, T).unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        d.kill().unwrap();
        let at = Instant::now();
        d.wait().unwrap();
        at
    });
    let mut b = [0u8; 8];
    let r = app.recv(s, &mut b, Duration::from_secs(30));
    let returned = Instant::now();
    let killed = killer.join().unwrap();
    assert_eq!(r, Err(SocketError::ConnectionReset));
    assert!(returned.duration_since(killed) < Duration::from_secs(1));
    assert!(!app.daemon_alive());
    assert_eq!(app.tcp_send(c, b"x"), Err(SocketError::ConnectionReset));
}
