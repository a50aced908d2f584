//! The TCP part of `flowstack demo`: a verified bulk transfer and one HTTP/1.1 exchange.

use flowstack_stack::netsim::{bulk_transfer, Net, TransferReport, B_IP};
use flowstack_stack::SocketError;
use flowstack_wire::Duration;
use sha2::{Digest, Sha256};
use std::net::SocketAddrV4;

/// Result of the bulk transfer with both ends' digests.
pub struct Bulk {
    pub report: TransferReport,
    pub sent_sha: String,
    pub recv_sha: String,
    pub wall: std::time::Duration,
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

/// One HTTP/1.1 GET from A to a tiny server on B; returns (status line, body).
pub fn http(net: &mut Net) -> Result<(String, String), String> {
    let e = |e: SocketError| e.to_string();
    let l = net.b.tcp_listen(80, 8).map_err(e)?;
    net.stamp();
    let c = net
        .a
        .tcp_connect(SocketAddrV4::new(B_IP.into(), 80))
        .map_err(e)?;
    let request =
        format!("GET /hello HTTP/1.1\r\nHost: {B_IP}\r\nUser-Agent: flowstack-demo\r\n\r\n");
    let body = "hello from flowstack over its own TCP\n";
    let mut sent_req = false;
    let mut server = None;
    let mut req_buf = Vec::new();
    let mut answered = false;
    let mut resp = Vec::new();
    let mut buf = [0u8; 4096];
    let mut failure = None;
    let done = net.run_until(Duration::from_secs(30), |n| {
        if !sent_req && n.a.tcp_conn(c).map(|k| k.is_open()).unwrap_or(false) {
            sent_req = n.a.tcp_send(c, request.as_bytes()).is_ok();
        }
        if server.is_none() {
            server = n.b.tcp_accept(l).ok();
        }
        if let (Some(s), false) = (server, answered) {
            while let Ok(k) = n.b.tcp_recv(s, &mut buf) {
                if k == 0 {
                    break;
                }
                req_buf.extend_from_slice(&buf[..k]);
            }
            if req_buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let ok = req_buf.starts_with(b"GET /hello HTTP/1.1\r\n");
                let (status, text) = if ok {
                    ("200 OK", body)
                } else {
                    ("400 Bad Request", "bad request\n")
                };
                let r = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: text/plain\r\nServer: flowstack\r\n\r\n{text}",
                    text.len()
                );
                answered = n.b.tcp_send(s, r.as_bytes()).is_ok();
            }
        }
        loop {
            match n.a.tcp_recv(c, &mut buf) {
                Ok(0) | Err(SocketError::WouldBlock) => break,
                Ok(k) => resp.extend_from_slice(&buf[..k]),
                Err(err) => {
                    failure = Some(err);
                    return true;
                }
            }
        }
        complete_response(&resp)
    });
    if let Some(f) = failure {
        return Err(f.to_string());
    }
    if !done {
        return Err("HTTP exchange did not complete".into());
    }
    net.stamp();
    let _ = net.a.tcp_close(c);
    if let Some(s) = server {
        let _ = net.b.tcp_close(s);
    }
    let _ = net.b.tcp_close(l);
    net.run_until(Duration::from_millis(200), |_| false);
    let text = String::from_utf8_lossy(&resp).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

/// True once the response head and its Content-Length body have arrived.
fn complete_response(resp: &[u8]) -> bool {
    let Some(pos) = resp.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&resp[..pos]);
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    resp.len() >= pos + 4 + len
}
