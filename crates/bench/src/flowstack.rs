//! The flowstack peer: client and server engines in two processes joined by the shm wire
//! (the server is this same executable run as `__bench-server`), or both in one process over
//! the in-process pipe. Either way each engine is driven by [`Host`], the runtime's drive
//! loop, and the workloads are the `apps` crate's.

use crate::spec::{BenchSpec, RunOpts, ServerSpec};
use crate::{pin, SERVER_SUBCOMMAND};
use flowstack_api::App;
use flowstack_apps::workload::{Client, ClientResult, Server, PORT};
use flowstack_link::pipe::pipe;
use flowstack_link::shm::{ShmOptions, ShmWire};
use flowstack_link::{Device, DeviceCaps};
use flowstack_runtime::{Clock, Host};
use flowstack_stack::{Engine, EngineConfig, IfaceConfig};
use flowstack_wire::{ChecksumCaps, Duration, Ipv4Address, Ipv4Cidr};
use std::net::SocketAddrV4;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

/// The client engine's address.
pub const CLIENT_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
/// The server engine's address.
pub const SERVER_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

/// An engine for one end of a run, configured by the ablation switches.
pub fn engine(ip: Ipv4Address, caps: DeviceCaps, o: &RunOpts) -> Engine {
    Engine::new(engine_config(ip, o), caps)
}

/// The configuration of [`engine`].
pub fn engine_config(ip: Ipv4Address, o: &RunOpts) -> EngineConfig {
    let mac = flowstack_runtime::link::default_mac(ip);
    let mut cfg = EngineConfig::new(IfaceConfig::new(mac, Ipv4Cidr::new(ip, 24)));
    cfg.tcp.defaults.delayed_ack = !o.no_delayed_ack;
    if let Some(w) = o.window {
        cfg.tcp.defaults.send_buffer = w;
        cfg.tcp.defaults.recv_buffer = w;
    }
    cfg.tcp.max_connections = 65536;
    cfg
}

fn shm_options(o: &RunOpts) -> ShmOptions {
    ShmOptions {
        checksum_offload: !o.no_checksum_offload,
        large_segments: !o.no_tso,
        ..Default::default()
    }
}

fn client(spec: &BenchSpec) -> Client {
    client_of(spec, spec.conns)
}

/// A client of `spec`'s workload running `conns` connections.
pub fn client_of(spec: &BenchSpec, conns: usize) -> Client {
    Client::new(
        spec.workload,
        spec.msg_size(),
        SocketAddrV4::new(SERVER_IP.into(), PORT),
        conns,
        Duration::from_secs_f64(spec.duration),
        !spec.opts.no_zero_copy,
    )
}

/// How long a run may overrun its duration before it is given up.
const GRACE: Duration = Duration::from_secs(30);

/// The server process's flowstack side: attaches to the inherited shm wire and serves until
/// `stop` is set or the client's process goes away.
pub fn serve_shm(spec: &ServerSpec, fd: i32, stop: &AtomicBool) -> Result<(), String> {
    pin(1);
    let wire =
        ShmWire::attach(fd, shm_options(&spec.opts)).map_err(|e| format!("shm attach: {e}"))?;
    let e = engine(SERVER_IP, wire.caps(), &spec.opts);
    let mut host = Host::new(e, wire);
    let mut server = Server::new(
        &mut host.engine,
        spec.workload,
        spec.opts.msg_size(spec.workload),
        !spec.opts.no_zero_copy,
    )
    .map_err(|e| e.to_string())?;
    host.run(&mut server, || stop.load(Ordering::Relaxed));
    Ok(())
}

/// One run over the shm wire: spawns the server process, runs the client here.
pub fn run_shm(spec: &BenchSpec) -> Result<ClientResult, String> {
    let wire = ShmWire::create(shm_options(&spec.opts)).map_err(|e| format!("shm: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let server = ServerSpec {
        workload: spec.workload,
        opts: spec.opts.clone(),
        shm_fd: Some(wire.raw_fd()),
    };
    let mut child = Command::new(exe)
        .arg(SERVER_SUBCOMMAND)
        .arg("--spec")
        .arg(server.to_arg())
        .spawn()
        .map_err(|e| format!("spawn server: {e}"))?;
    pin(0);
    let e = engine(CLIENT_IP, wire.caps(), &spec.opts);
    let mut host = Host::new(e, wire);
    let mut client = client(spec);
    // Give the server a moment to listen: connect attempts retry anyway (RST → error), so wait
    // for its engine to answer ARP first.
    let _ = host.block(Duration::from_secs(5), |e, _| {
        let _ = e.ping_send(SERVER_IP, 1, 1, b"up?");
        e.ping_recv().map(|_| Ok(()))
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(spec.duration) + GRACE;
    host.run(&mut client, || std::time::Instant::now() >= deadline);
    if !client.finished() && host.dev.link_down() {
        client.result.error = Some("server process died".into());
    }
    // Let the last segments (FINs) go out, then stop the server.
    for _ in 0..100 {
        host.turn();
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    if client.result.error.is_none() && !client.finished() {
        return Err("run did not finish in time".into());
    }
    Ok(client.result)
}

/// One run with both engines in this process over the in-process pipe, turned alternately
/// at one time read per turn of both (no sleeping: the pipe has no wake-up).
///
/// Not [`Host`]: each host reads its own clock, and at sub-microsecond transactions the extra
/// time reads showed (rr p50 0.76 → 1.18 µs over the pipe). Not `netsim::Net` either: its
/// devices are wrapped in fault injection, which copies every frame even with no fault set.
/// The time is the runtime's [`Clock`].
pub fn run_pipe(spec: &BenchSpec) -> Result<ClientResult, String> {
    let o = &spec.opts;
    let caps = pipe_caps(o);
    let (mut da, mut db) = pipe(caps, 1 << 16);
    let mut ea = engine(CLIENT_IP, caps, o);
    let mut eb = engine(SERVER_IP, caps, o);
    let mut server = Server::new(&mut eb, spec.workload, spec.msg_size(), !o.no_zero_copy)
        .map_err(|e| e.to_string())?;
    let mut client = client(spec);
    let clock = Clock::start();
    let run_for = std::time::Duration::from_secs_f64(spec.duration) + GRACE;
    turn_pair(
        &clock,
        (&mut ea, &mut da),
        (&mut eb, &mut db),
        &mut client,
        &mut server,
        run_for,
    )?;
    Ok(client.result)
}

/// Turns a client engine and a server engine joined by in-process devices, with their apps,
/// at one clock read per turn of both, until the client is done; fails if that takes longer
/// than `run_for`.
pub(crate) fn turn_pair<A: Device + ?Sized, B: Device + ?Sized>(
    clock: &Clock,
    (ea, da): (&mut Engine, &mut A),
    (eb, db): (&mut Engine, &mut B),
    client: &mut Client,
    server: &mut Server,
    run_for: std::time::Duration,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + run_for;
    while !client.finished() && std::time::Instant::now() < deadline {
        let now = clock.now();
        ea.poll(now, da);
        client.poll(now, ea);
        eb.poll(now, db);
        server.poll(now, eb);
    }
    if !client.finished() {
        return Err("run did not finish in time".into());
    }
    Ok(())
}

/// The in-process pipe's capabilities under the ablation switches.
pub fn pipe_caps(o: &RunOpts) -> DeviceCaps {
    DeviceCaps {
        checksum: if o.no_checksum_offload {
            ChecksumCaps::SOFTWARE
        } else {
            ChecksumCaps::OFFLOADED
        },
        max_tx_datagram: if o.no_tso { 1500 } else { 65535 },
        ..DeviceCaps::ETHERNET
    }
}
