//! The jobs of `flowstack demo`, on the two engines of a [`Net`]: ping, a UDP echo, a
//! verified TCP bulk transfer, one HTTP/1.1 exchange. Each returns what happened; the CLI
//! prints it.

use crate::sim::run_apps;
use flowstack_apps::demo::{HelloServer, UdpEcho, UdpOutcome, UdpProbe};
use flowstack_apps::get::{GetSpec, HttpGet, Request};
use flowstack_stack::netsim::{bulk_transfer, Net, TransferReport, B_IP};
use flowstack_stack::SocketError;
use flowstack_wire::Duration;
use sha2::{Digest, Sha256};
use std::net::SocketAddrV4;

/// What the pings did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingOutcome {
    /// Requests sent.
    pub sent: u16,
    /// Round-trip times (virtual) of the answered ones.
    pub rtts: Vec<Duration>,
}

/// Pings B from A `count` times, waiting up to a second (virtual) for each reply.
pub fn ping(net: &mut Net, count: u16) -> PingOutcome {
    let mut rtts = Vec::new();
    for seq in 1..=count {
        let sent_at = net.now;
        if net
            .a
            .ping_send(B_IP, 0x4653, seq, b"flowstack ping!!")
            .is_err()
        {
            continue;
        }
        let mut got = None;
        net.run_until(Duration::from_secs(1), |n| {
            while let Some(r) = n.a.ping_recv() {
                if r.seq_no == seq {
                    got = Some(r.at);
                }
            }
            got.is_some()
        });
        if let Some(at) = got {
            rtts.push(at.saturating_since(sent_at));
        }
    }
    PingOutcome { sent: count, rtts }
}

/// Sends [`UdpProbe::demo_sizes`] datagrams from A to an echo server on B (port 7), each
/// waited for up to 200 ms (virtual).
pub fn udp_echo(net: &mut Net) -> Result<UdpOutcome, SocketError> {
    let dst = SocketAddrV4::new(B_IP.into(), 7);
    let mut probe = UdpProbe::bind(
        &mut net.a,
        dst,
        UdpProbe::demo_sizes(),
        Duration::from_millis(200),
    )?;
    let mut echo = UdpEcho::bind(&mut net.b, 7)?;
    run_apps(net, Duration::from_secs(3600), &mut probe, &mut echo);
    Ok(probe.outcome())
}

/// The bulk transfer with both ends' digests.
#[derive(Debug, Clone)]
pub struct Bulk {
    /// What the transfer did.
    pub report: TransferReport,
    /// sha256 of what A sent, in hex.
    pub sent_sha: String,
    /// sha256 of what B received, in hex.
    pub recv_sha: String,
    /// Wall-clock time the transfer took.
    pub wall: std::time::Duration,
}

impl Bulk {
    /// Every byte arrived, in order, and the digests agree.
    pub fn verified(&self) -> bool {
        let r = &self.report;
        r.complete && r.mismatch_at.is_none() && self.sent_sha == self.recv_sha
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Sends `bytes` from A to B over TCP, hashing on both ends.
pub fn bulk(net: &mut Net, bytes: u64) -> Result<Bulk, SocketError> {
    let mut tx = Sha256::new();
    let mut rx = Sha256::new();
    let wall = std::time::Instant::now();
    let report = bulk_transfer(
        net,
        bytes,
        Duration::from_secs(3600),
        |c| tx.update(c),
        |c| rx.update(c),
    )?;
    Ok(Bulk {
        report,
        sent_sha: hex(&tx.finalize()),
        recv_sha: hex(&rx.finalize()),
        wall: wall.elapsed(),
    })
}

/// One HTTP/1.1 GET of `/hello` from A to a [`HelloServer`] on B (port 80), within 30 s
/// (virtual); returns the status line and the body. Both sides close afterwards.
pub fn http(net: &mut Net) -> Result<(String, String), String> {
    let mut server = HelloServer::listen(&mut net.b, 80).map_err(|e| e.to_string())?;
    let spec = GetSpec {
        remote: SocketAddrV4::new(B_IP.into(), 80),
        request: Request {
            target: "/hello".into(),
            headers: vec![
                ("Host".into(), B_IP.to_string()),
                ("User-Agent".into(), "flowstack-demo".into()),
            ],
        },
        timeout: Duration::from_secs(30),
        linger: Duration::ZERO,
    };
    let mut client = HttpGet::new(spec, Vec::new());
    run_apps(net, Duration::from_secs(30), &mut client, &mut server);
    let head = client.head().cloned();
    let (body, result) = client.into_parts();
    result
        .ok_or("HTTP exchange did not complete")?
        .map_err(|e| e.to_string())?;
    net.stamp();
    server.close(&mut net.b);
    net.run_until(Duration::from_millis(200), |_| false);
    let status = head.map(|h| h.status_line()).unwrap_or_default();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
