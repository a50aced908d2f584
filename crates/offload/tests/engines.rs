//! A daemon with several engine threads (`DaemonConfig::engines`): applications on
//! different engines talk through the mesh between them; ports, stats and faults stay
//! daemon-wide. In-process applications are spread over the engines with
//! `DaemonConfig::spread` (they share one pid); child processes show the default
//! assignment (a child goes to its parent's engine). Every wait is bounded.

use flowstack_api::{SocketError, Sockets};
use flowstack_client::Client;
use flowstack_offload::stats::{query, Stats};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

mod common;
use common::{daemon, echo_server, echo_through, listen, lo, recv_exact, T};

/// The engine serving the application of `pid` (the first one of that pid).
fn engine_of_pid(s: &Stats, pid: u32) -> usize {
    s.apps
        .iter()
        .find(|a| a.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} not registered: {:?}", s.apps))
        .engine
}

fn engine_of_app(s: &Stats, app: &Client) -> usize {
    s.apps
        .iter()
        .find(|a| a.id == app.app_id())
        .expect("registered")
        .engine
}

#[test]
fn two_engines_exchange_bytes_both_ways_and_stats_show_both_ends() {
    let d = daemon("pair", 2, true);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let s = query(&d.path).unwrap();
    let (es, ec) = (engine_of_app(&s, &srv), engine_of_app(&s, &cli));
    assert_ne!(es, ec, "spread over two engines: {:?}", s.apps);
    assert_eq!(s.counters["FlowstackdEngines"], 2);
    let l = listen(&mut srv, 9100).unwrap();
    let server = echo_server(srv, l);
    let c = cli.connect_to(lo(9100), T).unwrap();
    // Small messages first (each side sleeps between them: wake-ups across engines),
    // then 1 MiB, every byte checked both ways.
    for i in 0..200usize {
        cli.send_all(c, &[i as u8], T).unwrap();
        assert_eq!(recv_exact(&mut cli, c, 1), [i as u8]);
    }
    echo_through(&mut cli, c, 1 << 20, false);
    // Right after the exchange, both ends are in the snapshot, each on its engine.
    let s = query(&d.path).unwrap();
    let server_end = s
        .sockets
        .iter()
        .find(|r| r.state == "ESTAB" && r.local == "127.0.0.1:9100");
    let client_end = s
        .sockets
        .iter()
        .find(|r| r.state == "ESTAB" && r.peer == "127.0.0.1:9100");
    let (se, ce) = (
        server_end.unwrap_or_else(|| panic!("{}", s.table())),
        client_end.unwrap_or_else(|| panic!("{}", s.table())),
    );
    assert_eq!((se.engine, ce.engine), (es, ec), "{}", s.table());
    assert_eq!(se.peer, ce.local);
    assert!(s.counters["FlowstackdMeshFrames"] > 0);
    assert!(s.table().contains("eng"));
    cli.tcp_shutdown(c).unwrap();
    let mut b = [0u8; 4];
    assert_eq!(cli.recv(c, &mut b, T), Ok(0));
    assert_eq!(server.join().unwrap(), 200 + (1 << 20));
    d.stop().unwrap();
}

#[test]
fn bind_conflicts_are_daemon_wide_and_a_freed_port_is_bindable_at_once_elsewhere() {
    let d = daemon("bind", 2, true);
    let mut a = Client::connect(&d.path).unwrap();
    let mut b = Client::connect(&d.path).unwrap();
    let s = query(&d.path).unwrap();
    assert_ne!(engine_of_app(&s, &a), engine_of_app(&s, &b));
    // Back and forth: each close's completion comes after the port is free everywhere.
    for round in 0..20 {
        let (x, y) = if round % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let l = listen(x, 9200).unwrap();
        assert_eq!(
            listen(y, 9200),
            Err(SocketError::AddrInUse),
            "round {round}"
        );
        x.close(l, T).unwrap();
        let l = listen(y, 9200).unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        y.close(l, T).unwrap();
    }
    // The ports of connections opened on both engines never collide.
    let l = listen(&mut a, 9201).unwrap();
    let mut conns = Vec::new();
    for _ in 0..20 {
        conns.push(a.connect_to(lo(9201), T).unwrap());
        conns.push(b.connect_to(lo(9201), T).unwrap());
        conns.push(a.accept(l, T).unwrap());
        conns.push(a.accept(l, T).unwrap());
    }
    let s = query(&d.path).unwrap();
    let mut ports: Vec<&str> = s
        .sockets
        .iter()
        .filter(|r| r.state == "ESTAB" && r.peer == "127.0.0.1:9201")
        .map(|r| r.local.as_str())
        .collect();
    assert_eq!(ports.len(), 40, "{}", s.table());
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 40, "{}", s.table());
    d.stop().unwrap();
}

#[test]
fn a_listener_accepts_clients_of_every_engine() {
    let d = daemon("every", 3, true);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut clients: Vec<Client> = (0..3).map(|_| Client::connect(&d.path).unwrap()).collect();
    let s = query(&d.path).unwrap();
    let mut engines: Vec<usize> = clients.iter().map(|c| engine_of_app(&s, c)).collect();
    engines.sort();
    assert_eq!(engines, vec![0, 1, 2], "{:?}", s.apps);
    let l = listen(&mut srv, 9300).unwrap();
    for (i, cl) in clients.iter_mut().enumerate() {
        let c = cl.connect_to(lo(9300), T).unwrap();
        cl.send_all(c, format!("client {i}").as_bytes(), T).unwrap();
        let a = srv.accept(l, T).unwrap();
        assert_eq!(recv_exact(&mut srv, a, 8), format!("client {i}").as_bytes());
        srv.send_all(a, format!("server {i}").as_bytes(), T)
            .unwrap();
        assert_eq!(recv_exact(cl, c, 8), format!("server {i}").as_bytes());
    }
    d.stop().unwrap();
}

/// Child half of the process tests (runs only when asked): registers, optionally listens
/// and connects as told, says "ready", and waits for its stdin to close.
#[test]
#[ignore]
fn child_app() {
    let Ok(path) = std::env::var("FLOWSTACK_TEST_CHILD_SOCKET") else {
        return;
    };
    let mut app = Client::connect(path).unwrap();
    let mut keep = Vec::new();
    if let Some(p) = std::env::var("FLOWSTACK_TEST_CHILD_LISTEN")
        .ok()
        .and_then(|p| p.parse().ok())
    {
        keep.push(listen(&mut app, p).unwrap());
    }
    if let Some(p) = std::env::var("FLOWSTACK_TEST_CHILD_CONNECT")
        .ok()
        .and_then(|p| p.parse().ok())
    {
        let c = app.connect_to(lo(p), T).unwrap();
        app.send_all(c, b"hi", T).unwrap();
        keep.push(c);
    }
    println!("\nready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// Starts `child_app` against `path` and waits for its "ready".
/// (Its output is drained by a thread, so it never blocks on a full pipe.) The caller waits
/// for the child it gets back.
#[allow(clippy::zombie_processes)]
fn spawn_child(path: &Path, env: &[(&str, String)]) -> (Child, u32) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", "child_app", "--nocapture"])
        .env("FLOWSTACK_TEST_CHILD_SOCKET", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child ended before it was ready");
        if let Some(pid) = line.trim().strip_prefix("ready ") {
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            return (child, pid.parse().unwrap());
        }
    }
}

#[test]
fn a_child_process_registers_on_its_parents_engine() {
    // Default assignment: round robin, except for a registered process's children.
    let d = daemon("family", 2, false);
    let _parent = Client::connect(&d.path).unwrap();
    let (mut child, pid) = spawn_child(&d.path, &[]);
    let s = query(&d.path).unwrap();
    let me = engine_of_pid(&s, std::process::id());
    assert_eq!(engine_of_pid(&s, pid), me, "{:?}", s.apps);
    // Round robin would have put this second registration on the other engine.
    assert_eq!(me, 0);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    d.stop().unwrap();
}

#[test]
fn sigkill_of_an_app_on_engine_1_frees_its_ports_while_engine_0_carries_on() {
    let d = daemon("kill", 2, true);
    let mut srv = Client::connect(&d.path).unwrap(); // engine 0
    let l = listen(&mut srv, 9500).unwrap();
    let (mut child, pid) = spawn_child(
        &d.path,
        &[
            ("FLOWSTACK_TEST_CHILD_LISTEN", "9501".into()),
            ("FLOWSTACK_TEST_CHILD_CONNECT", "9500".into()),
        ],
    );
    let mut other = Client::connect(&d.path).unwrap(); // engine 0 again (third)
    let s = query(&d.path).unwrap();
    assert_eq!(engine_of_pid(&s, pid), 1, "{:?}", s.apps);
    assert_eq!(engine_of_app(&s, &other), 0);
    let from_child = srv.accept(l, T).unwrap();
    assert_eq!(recv_exact(&mut srv, from_child, 2), b"hi");
    let c = other.connect_to(lo(9500), T).unwrap();
    let from_other = srv.accept(l, T).unwrap();
    assert_eq!(listen(&mut other, 9501), Err(SocketError::AddrInUse));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The killed application's connection ends, its listener's port comes free.
    let mut b = [0u8; 4];
    let r = srv.recv(from_child, &mut b, T);
    assert!(
        matches!(r, Ok(0) | Err(SocketError::ConnectionReset)),
        "peer of a killed app: {r:?}"
    );
    let start = Instant::now();
    let l2 = loop {
        match listen(&mut other, 9501) {
            Ok(l2) => break l2,
            Err(SocketError::AddrInUse) if start.elapsed() < T => {}
            Err(e) => panic!("port of the killed app: {e:?}"),
        }
    };
    // Engine 0's traffic went on.
    for i in 0..50u8 {
        other.send_all(c, &[i; 100], T).unwrap();
        assert_eq!(recv_exact(&mut srv, from_other, 100), [i; 100]);
        srv.send_all(from_other, &[i], T).unwrap();
        assert_eq!(recv_exact(&mut other, c, 1), [i]);
    }
    let s = query(&d.path).unwrap();
    assert!(s.apps.iter().all(|a| a.pid != pid), "{:?}", s.apps);
    other.close(l2, T).unwrap();
    d.stop().unwrap();
}

#[test]
fn a_socket_of_another_engine_is_not_adopted_and_the_refusal_is_counted() {
    use flowstack_client::posix::{Errno, Posix, Type};
    use std::os::fd::AsFd;
    let d = daemon("adopt", 2, true);
    let p0 = Posix::attach(&d.path).unwrap(); // engine 0
    let p1 = Posix::attach(&d.path).unwrap(); // engine 1
    let p2 = Posix::attach(&d.path).unwrap(); // engine 0 again
    let (a, id) = p0.socket(Type::Stream).unwrap();
    let port = p0.bind(id, lo(0)).unwrap();
    assert_eq!(p0.listen(id, 4, None).unwrap(), port);
    // As if the descriptor had been passed to an unrelated process served by engine 1.
    assert_eq!(p1.adopt(a.as_fd()), Err(Errno::EINVAL));
    // A process of the same engine adopts it (a forked child's case).
    assert!(p2.adopt(a.as_fd()).unwrap().is_some());
    let s = query(&d.path).unwrap();
    assert_eq!(
        s.counters["FlowstackdCrossEngineAttach"],
        1,
        "{}",
        s.table()
    );
    d.stop().unwrap();
}
