//! The applications of `flowstack demo`: a UDP echo server and the client that checks it, and
//! a one-page HTTP server (its client is [`HttpGet`](crate::get::HttpGet)).

use flowstack_api::app::{App, Progress};
use flowstack_api::{SocketError, Sockets, TcpHandle, UdpHandle};
use flowstack_wire::{Duration, Instant};
use std::net::SocketAddrV4;

/// Largest datagram the UDP applications handle.
const MAX_DATAGRAM: usize = 65536;

/// Echoes every datagram back to its sender.
#[derive(Debug)]
pub struct UdpEcho {
    h: UdpHandle,
    buf: Vec<u8>,
    echoed: u64,
}

impl UdpEcho {
    /// Binds the echo port.
    pub fn bind<S: Sockets + ?Sized>(s: &mut S, port: u16) -> Result<Self, SocketError> {
        Ok(Self {
            h: s.udp_bind(port)?,
            buf: vec![0; MAX_DATAGRAM],
            echoed: 0,
        })
    }

    /// Datagrams sent back so far.
    pub fn echoed(&self) -> u64 {
        self.echoed
    }
}

impl<S: Sockets + ?Sized> App<S> for UdpEcho {
    fn poll(&mut self, _now: Instant, s: &mut S) -> Progress {
        let mut p = Progress::Idle;
        while let Ok((l, from)) = s.udp_recv_from(self.h, &mut self.buf) {
            let _ = s.udp_send_to(self.h, from, &self.buf[..l]);
            self.echoed += 1;
            p = Progress::Busy;
        }
        p
    }
}

/// What a [`UdpProbe`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpOutcome {
    /// Datagrams sent.
    pub sent: usize,
    /// Datagrams that came back intact.
    pub echoed: usize,
    /// Datagrams that came back altered.
    pub corrupt: usize,
    /// Bytes sent.
    pub bytes: usize,
}

impl UdpOutcome {
    /// Datagrams that never came back.
    pub fn lost(&self) -> usize {
        self.sent - self.echoed - self.corrupt
    }
}

/// Sends datagrams of the given sizes to an echo server, one at a time, and checks each echo
/// byte for byte; a datagram not back within `wait` is lost.
///
/// The first four bytes of each datagram carry its index, so a late duplicate of an earlier
/// echo (the link may duplicate and reorder) is recognised and skipped.
#[derive(Debug)]
pub struct UdpProbe {
    h: UdpHandle,
    dst: SocketAddrV4,
    sizes: Vec<usize>,
    wait: Duration,
    next: usize,
    /// The datagram waiting for its echo, and until when.
    current: Option<(Vec<u8>, Instant)>,
    outcome: UdpOutcome,
    buf: Vec<u8>,
}

impl UdpProbe {
    /// The demo's probe: 40 datagrams of 4 to 9000 bytes (the larger ones fragmented).
    pub fn demo_sizes() -> Vec<usize> {
        (0..40)
            .map(|i| [4, 100, 512, 1472, 3000, 9000][i % 6])
            .collect()
    }

    /// Binds an ephemeral port for probing `dst`. Sizes below 4 are sent as 4 bytes.
    pub fn bind<S: Sockets + ?Sized>(
        s: &mut S,
        dst: SocketAddrV4,
        sizes: Vec<usize>,
        wait: Duration,
    ) -> Result<Self, SocketError> {
        Ok(Self {
            h: s.udp_bind(0)?,
            dst,
            sizes,
            wait,
            next: 0,
            current: None,
            outcome: UdpOutcome::default(),
            buf: vec![0; MAX_DATAGRAM],
        })
    }

    /// What happened so far.
    pub fn outcome(&self) -> UdpOutcome {
        self.outcome
    }

    /// The `i`th datagram: its index, then a pattern.
    fn message(i: usize, len: usize) -> Vec<u8> {
        let mut msg: Vec<u8> = (0..len.max(4)).map(|j| (i * 31 + j) as u8).collect();
        msg[..4].copy_from_slice(&(i as u32).to_be_bytes());
        msg
    }
}

impl<S: Sockets + ?Sized> App<S> for UdpProbe {
    fn poll(&mut self, now: Instant, s: &mut S) -> Progress {
        loop {
            if let Some((msg, until)) = &self.current {
                // The last copy of this datagram's echo is the one judged.
                let mut back: Option<Vec<u8>> = None;
                while let Ok((l, _)) = s.udp_recv_from(self.h, &mut self.buf) {
                    if l >= 4 && self.buf[..4] == msg[..4] {
                        back = Some(self.buf[..l].to_vec());
                    }
                }
                match back {
                    Some(b) if b == *msg => self.outcome.echoed += 1,
                    Some(_) => self.outcome.corrupt += 1,
                    None if now < *until => return Progress::Idle,
                    None => {}
                }
                self.current = None;
            }
            let Some(&len) = self.sizes.get(self.next) else {
                return Progress::Done;
            };
            let msg = Self::message(self.next, len);
            self.next += 1;
            if s.udp_send_to(self.h, self.dst, &msg).is_err() {
                continue;
            }
            self.outcome.sent += 1;
            self.outcome.bytes += msg.len();
            self.current = Some((msg, now + self.wait));
        }
    }

    fn poll_at(&self) -> Option<Instant> {
        self.current.as_ref().map(|(_, until)| *until)
    }
}

/// The page [`HelloServer`] serves at `/hello`.
pub const HELLO_BODY: &str = "hello from flowstack over its own TCP\n";

/// A one-connection HTTP server: answers the first request on the first connection with
/// [`HELLO_BODY`] (`GET /hello`) or 400, then waits to be closed.
#[derive(Debug)]
pub struct HelloServer {
    listener: TcpHandle,
    conn: Option<TcpHandle>,
    request: Vec<u8>,
    answered: bool,
    buf: Vec<u8>,
}

impl HelloServer {
    /// Listens on `port`.
    pub fn listen<S: Sockets + ?Sized>(s: &mut S, port: u16) -> Result<Self, SocketError> {
        Ok(Self {
            listener: s.tcp_listen(port, 8)?,
            conn: None,
            request: Vec::new(),
            answered: false,
            buf: vec![0; 4096],
        })
    }

    /// True once the answer is queued.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// Closes the connection and the listener.
    pub fn close<S: Sockets + ?Sized>(&mut self, s: &mut S) {
        if let Some(c) = self.conn.take() {
            let _ = s.tcp_close(c);
        }
        let _ = s.tcp_close(self.listener);
    }

    fn answer(&self) -> Option<String> {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        let ok = match req.parse(&self.request) {
            Ok(httparse::Status::Partial) => return None,
            Ok(httparse::Status::Complete(_)) => {
                req.method == Some("GET") && req.path == Some("/hello") && req.version == Some(1)
            }
            Err(_) => false,
        };
        let (status, text) = if ok {
            ("200 OK", HELLO_BODY)
        } else {
            ("400 Bad Request", "bad request\n")
        };
        Some(format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: text/plain\r\nServer: flowstack\r\n\r\n{text}",
            text.len()
        ))
    }
}

impl<S: Sockets + ?Sized> App<S> for HelloServer {
    fn poll(&mut self, _now: Instant, s: &mut S) -> Progress {
        if self.conn.is_none() {
            self.conn = s.tcp_accept(self.listener).ok();
        }
        let (Some(c), false) = (self.conn, self.answered) else {
            return Progress::Idle;
        };
        while let Ok(k) = s.tcp_recv(c, &mut self.buf) {
            if k == 0 {
                break;
            }
            self.request.extend_from_slice(&self.buf[..k]);
        }
        match self.answer() {
            Some(r) => {
                self.answered = s.tcp_send(c, r.as_bytes()).is_ok();
                Progress::Busy
            }
            None => Progress::Idle,
        }
    }
}
