//! Byte-exact transfers between two processes over the shm wire, with and without impairment,
//! and a peer process that dies: the survivor gets an error, not a hang.

use flowstack_link::impair::Impaired;
use flowstack_link::shm::{ShmOptions, ShmWire};
use flowstack_link::Device;
use flowstack_runtime::Host;
use flowstack_stack::{Engine, EngineConfig, IfaceConfig, SocketError};
use flowstack_wire::{Duration, EthernetAddress, Ipv4Address, Ipv4Cidr};
use std::net::SocketAddrV4;
use std::process::{Child, Command, Stdio};

const FLOWSTACK: &str = env!("CARGO_BIN_EXE_flowstack");

/// Each test runs two polling engines (client here, server in a child process); on a
/// 2-core machine three such pairs at once starve each other, so the tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}
const SERVER: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

/// Starts `flowstack serve --shm-fd N ... echo --port 7` in a child process.
fn spawn_echo(wire: &ShmWire, impair: Option<&str>) -> Child {
    let mut c = Command::new(FLOWSTACK);
    c.args([
        "serve",
        "--shm-fd",
        &wire.raw_fd().to_string(),
        "--ip",
        "10.0.0.2/24",
    ]);
    if let Some(i) = impair {
        c.args(["--impair", i, "--seed", "5"]);
    }
    c.args(["echo", "--port", "7"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c.spawn().unwrap()
}

fn client<D: Device>(dev: D) -> Host<D> {
    let caps = dev.caps();
    let cfg = EngineConfig::new(IfaceConfig::new(
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        Ipv4Cidr::new(Ipv4Address::new(10, 0, 0, 1), 24),
    ));
    Host::new(Engine::new(cfg, caps), dev)
}

/// Sends `len` bytes of a position-dependent pattern and checks the echo byte for byte.
fn echo_exact<D: Device>(host: &mut Host<D>, len: usize) {
    let t = Duration::from_secs(60);
    let h = host
        .connect(SocketAddrV4::new(SERVER.into(), 7), t)
        .expect("connect");
    let data: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut sent = 0;
    let mut got = Vec::with_capacity(len);
    let mut buf = vec![0u8; 1 << 16];
    let r = host.block(t, |e, _| {
        while sent < len {
            match e.tcp_send(h, &data[sent..]) {
                Ok(n) => sent += n,
                Err(SocketError::WouldBlock) => break,
                Err(err) => return Some(Err(err)),
            }
        }
        loop {
            match e.tcp_recv(h, &mut buf) {
                Ok(0) => return Some(Err(SocketError::ConnectionReset)),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(SocketError::WouldBlock) => break,
                Err(err) => return Some(Err(err)),
            }
        }
        (got.len() >= len).then_some(Ok(()))
    });
    assert_eq!(r, Ok(()));
    assert!(got == data, "echoed bytes differ");
}

#[test]
fn byte_exact_echo_between_two_processes() {
    let _turn = turn();
    let wire = ShmWire::create(ShmOptions::default()).unwrap();
    let mut child = spawn_echo(&wire, None);
    let mut host = client(wire);
    echo_exact(&mut host, 16 << 20);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn byte_exact_echo_between_two_processes_under_impairment() {
    let _turn = turn();
    let wire = ShmWire::create(ShmOptions::default()).unwrap();
    let spec = "loss=0.02,reorder=0.02,dup=0.01";
    let mut child = spawn_echo(&wire, Some(spec));
    // Seed 12 drops the fifth frame the client sends, so a loss is certain.
    let mut host = client(Impaired::new(wire, spec.parse().unwrap(), 12));
    echo_exact(&mut host, 4 << 20);
    // The impairment dropped at least that frame, and the echo still matched.
    assert!(host.dev.stats().dropped > 0);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn peer_process_death_is_an_error_not_a_hang() {
    let _turn = turn();
    let wire = ShmWire::create(ShmOptions::default()).unwrap();
    let mut child = spawn_echo(&wire, None);
    let mut host = client(wire);
    let t = Duration::from_secs(30);
    let h = host
        .connect(SocketAddrV4::new(SERVER.into(), 7), t)
        .expect("connect");
    child.kill().unwrap();
    child.wait().unwrap();
    let start = std::time::Instant::now();
    host.send_all(h, b"anyone there?", t).unwrap();
    let mut buf = [0u8; 64];
    let r = host.recv(h, &mut buf, t);
    assert_eq!(r, Err(SocketError::LinkDown));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "noticed promptly"
    );
}
