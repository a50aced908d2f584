//! The applications of `flowstack-apps` over two engines of the deterministic simulation:
//! HTTP server and client byte-exact (also over a lossy, reordering link), the server's error
//! answers and its survival of hostile requests, echo and sink, the client's failures, and
//! the UDP echo probe.

use flowstack_api::app::{App, Progress};
use flowstack_api::{SocketError, Sockets, TcpHandle};
use flowstack_apps::demo::{UdpEcho, UdpProbe};
use flowstack_apps::get::{GetError, GetSpec, HttpGet, Request, Url};
use flowstack_apps::serve::{ServeError, ServeSpec, Server, Service};
use flowstack_link::impair::ImpairSpec;
use flowstack_runtime::sim::run_apps;
use flowstack_stack::netsim::{Net, NetConfig, B_IP};
use flowstack_wire::{Duration, Instant};
use std::net::SocketAddrV4;
use std::path::PathBuf;

fn pair(impair: &str, seed: u64) -> Net {
    let cfg = NetConfig {
        impair: impair.parse::<ImpairSpec>().unwrap(),
        seed,
        ..Default::default()
    };
    Net::new(cfg, None).unwrap()
}

/// A directory with `big.bin` (pseudo-random), `index.html` and `sub/a.txt`.
fn www(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fs-apps-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("sub")).unwrap();
    let mut x: u32 = 0x9e37_79b9;
    let big: Vec<u8> = (0..(1 << 20) + 123)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    std::fs::write(d.join("big.bin"), big).unwrap();
    std::fs::write(d.join("index.html"), b"<h1>flowstack</h1>\n").unwrap();
    std::fs::write(d.join("sub/a.txt"), b"a\n").unwrap();
    d
}

fn http_server(net: &mut Net, root: &std::path::Path) -> Server {
    let spec = ServeSpec {
        service: Service::Http {
            root: root.to_path_buf(),
        },
        port: 80,
        backlog: 16,
    };
    Server::listen(&mut net.b, spec).unwrap()
}

fn get_url(path: &str) -> GetSpec {
    let url = Url::parse(&format!("http://{B_IP}{path}")).unwrap();
    GetSpec::for_url(&url, Duration::from_secs(30))
}

/// Runs a GET against whatever B runs; returns (status, body, result).
fn fetch<B: App<flowstack_stack::Engine>>(
    net: &mut Net,
    server: &mut B,
    spec: GetSpec,
) -> (Option<u16>, Vec<u8>, Result<(), GetError>) {
    let mut get = HttpGet::new(spec, Vec::new());
    assert!(
        run_apps(net, Duration::from_secs(600), &mut get, server),
        "the exchange ends"
    );
    let status = get.head().map(|h| h.status);
    let (body, r) = get.into_parts();
    (status, body, r.expect("a finished exchange has a result"))
}

#[test]
fn get_downloads_a_file_byte_exact_from_the_server() {
    let root = www("plain");
    for (impair, seed) in [("", 1), ("loss=0.02,reorder=0.02,dup=0.01", 5)] {
        let mut net = pair(impair, seed);
        let mut server = http_server(&mut net, &root);
        let (status, body, r) = fetch(&mut net, &mut server, get_url("/big.bin"));
        r.unwrap();
        assert_eq!(status, Some(200));
        assert!(
            body == std::fs::read(root.join("big.bin")).unwrap(),
            "{impair}"
        );
        let t = server.totals();
        assert_eq!((t.conns, t.requests), (1, 1));
        // The client asked to close: the server closes its side too.
        run_apps(&mut net, Duration::from_secs(5), &mut Idle, &mut server);
        assert_eq!(server.open_connections(), 0);
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn the_progress_observer_sees_every_body_byte() {
    let root = www("progress");
    let mut net = pair("", 1);
    let mut server = http_server(&mut net, &root);
    let mut seen = (0, None);
    let mut get = HttpGet::new(get_url("/big.bin"), std::io::sink())
        .on_progress(|got, len| seen = (got, len));
    assert!(run_apps(
        &mut net,
        Duration::from_secs(60),
        &mut get,
        &mut server
    ));
    drop(get);
    let len = (1 << 20) + 123;
    assert_eq!(seen, (len, Some(len)));
    std::fs::remove_dir_all(&root).unwrap();
}

/// A client that sends `request` and reads until the server closes.
struct Raw {
    remote: SocketAddrV4,
    request: Vec<u8>,
    h: Option<TcpHandle>,
    sent: usize,
    got: Vec<u8>,
    half_close: bool,
    done: bool,
}

impl Raw {
    fn new(request: &[u8]) -> Self {
        Self {
            remote: SocketAddrV4::new(B_IP.into(), 80),
            request: request.to_vec(),
            h: None,
            sent: 0,
            got: Vec::new(),
            half_close: false,
            done: false,
        }
    }
}

impl<S: Sockets + ?Sized> App<S> for Raw {
    fn poll(&mut self, _now: Instant, s: &mut S) -> Progress {
        if self.done {
            return Progress::Done;
        }
        let h = *self
            .h
            .get_or_insert_with(|| s.tcp_connect(self.remote).unwrap());
        if !s.tcp_is_open(h) && self.sent == 0 {
            return Progress::Idle;
        }
        while self.sent < self.request.len() {
            match s.tcp_send(h, &self.request[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(_) => break,
            }
        }
        if self.sent == self.request.len() && self.half_close {
            let _ = s.tcp_shutdown(h);
            self.half_close = false;
        }
        let mut buf = [0u8; 4096];
        loop {
            match s.tcp_recv(h, &mut buf) {
                Ok(0) | Err(SocketError::NotConnected | SocketError::ConnectionReset) => {
                    let _ = s.tcp_close(h);
                    self.done = true;
                    return Progress::Done;
                }
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(_) => return Progress::Idle,
            }
        }
    }
}

/// Does nothing (to run one side alone).
struct Idle;

impl<S: Sockets + ?Sized> App<S> for Idle {
    fn poll(&mut self, _now: Instant, _s: &mut S) -> Progress {
        Progress::Idle
    }
}

fn exchange(net: &mut Net, server: &mut Server, request: &[u8]) -> String {
    let mut raw = Raw::new(request);
    assert!(run_apps(net, Duration::from_secs(60), &mut raw, server));
    String::from_utf8_lossy(&raw.got).into_owned()
}

#[test]
fn the_server_answers_errors_keeps_alive_and_closes_when_asked() {
    let root = www("errors");
    let mut net = pair("", 1);
    let mut server = http_server(&mut net, &root);
    let cases: [(&[u8], &str); 8] = [
        (
            b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 404 Not Found\r\n",
        ),
        (
            b"GET /../etc/passwd HTTP/1.1\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\n",
        ),
        (
            b"POST / HTTP/1.0\r\n\r\n",
            "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\n",
        ),
        (
            b"GET / HTTP/1.1\r\nbad header line\r\n\r\n",
            "malformed header\n",
        ),
        (b"GET / HTTP/2.0\r\n\r\n", "malformed request line\n"),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            "HTTP/1.1 400 Bad Request\r\n",
        ),
        (
            b"GET /sub/ HTTP/1.1\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 404",
        ),
        (
            b"HEAD /sub/a.txt HTTP/1.0\r\n\r\n",
            "Content-Length: 2\r\nServer: flowstack\r\nConnection: close\r\n\r\n",
        ),
    ];
    for (req, want) in cases {
        let got = exchange(&mut net, &mut server, req);
        assert!(
            got.contains(want),
            "{:?} -> {got:?}",
            String::from_utf8_lossy(req)
        );
    }
    // A head that never ends is refused once it passes the limit.
    let mut long = b"GET / HTTP/1.1\r\n".to_vec();
    for _ in 0..20 {
        long.extend_from_slice(b"X-Filler: ");
        long.extend_from_slice(&[b'x'; 1000]);
        long.extend_from_slice(b"\r\n");
    }
    let got = exchange(&mut net, &mut server, &long);
    assert!(got.contains("request header too large"), "{got}");
    // So is one with more header lines than the server keeps.
    let mut many = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..200 {
        many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
    }
    let got = exchange(&mut net, &mut server, &many);
    assert!(got.contains("too many header lines"), "{got}");
    // Two pipelined requests on one kept-alive connection, the second closing it.
    let two =
        b"GET /sub/a.txt HTTP/1.1\r\n\r\nGET /index.html HTTP/1.1\r\nConnection: close\r\n\r\n";
    let got = exchange(&mut net, &mut server, two);
    assert!(got.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nAccept-Ranges: bytes\r\nContent-Length: 2\r\nServer: flowstack\r\nConnection: keep-alive\r\n\r\na\nHTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"), "{got}");
    assert!(
        got.ends_with("Connection: close\r\n\r\n<h1>flowstack</h1>\n"),
        "{got}"
    );
    // And it still serves.
    let (status, body, r) = fetch(&mut net, &mut server, get_url("/"));
    r.unwrap();
    assert_eq!(
        (status, body),
        (Some(200), b"<h1>flowstack</h1>\n".to_vec())
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_root_that_is_not_a_directory_is_refused() {
    let mut net = pair("", 1);
    let spec = ServeSpec {
        service: Service::Http {
            root: "/nonexistent-flowstack-root".into(),
        },
        port: 80,
        backlog: 4,
    };
    assert!(matches!(
        Server::listen(&mut net.b, spec),
        Err(ServeError::NotADirectory(_))
    ));
}

#[test]
fn echo_sends_everything_back_and_sink_counts_it() {
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    for (service, port_echoes) in [(Service::Echo, true), (Service::Sink, false)] {
        let mut net = pair("loss=0.01,reorder=0.01", 3);
        let spec = ServeSpec {
            service,
            port: 80,
            backlog: 4,
        };
        let mut server = Server::listen(&mut net.b, spec).unwrap();
        let mut raw = Raw::new(&data);
        raw.half_close = true;
        assert!(run_apps(
            &mut net,
            Duration::from_secs(120),
            &mut raw,
            &mut server
        ));
        if port_echoes {
            assert!(raw.got == data, "echoed bytes differ");
        } else {
            assert!(raw.got.is_empty());
        }
        assert_eq!(server.totals().bytes_in, data.len() as u64);
    }
}

/// Answers the first request with `response`, then closes.
struct Canned {
    listener: TcpHandle,
    conn: Option<TcpHandle>,
    request: Vec<u8>,
    response: Vec<u8>,
    sent: usize,
}

impl Canned {
    fn listen(net: &mut Net, response: &[u8]) -> Self {
        Self {
            listener: net.b.tcp_listen(80, 4).unwrap(),
            conn: None,
            request: Vec::new(),
            response: response.to_vec(),
            sent: 0,
        }
    }
}

impl<S: Sockets + ?Sized> App<S> for Canned {
    fn poll(&mut self, _now: Instant, s: &mut S) -> Progress {
        if self.conn.is_none() {
            self.conn = s.tcp_accept(self.listener).ok();
        }
        let Some(c) = self.conn else {
            return Progress::Idle;
        };
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.tcp_recv(c, &mut buf) {
            if n == 0 {
                break;
            }
            self.request.extend_from_slice(&buf[..n]);
        }
        // Answer once the request is in (closing with unread data would reset).
        if !self.request.windows(4).any(|w| w == b"\r\n\r\n") {
            return Progress::Idle;
        }
        while self.sent < self.response.len() {
            match s.tcp_send(c, &self.response[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(_) => return Progress::Idle,
            }
        }
        let _ = s.tcp_close(c);
        self.conn = None;
        self.sent = 0;
        self.response.clear();
        Progress::Busy
    }
}

fn fetch_canned(response: &[u8]) -> (Option<u16>, Vec<u8>, Result<(), GetError>) {
    let mut net = pair("", 1);
    let mut server = Canned::listen(&mut net, response);
    fetch(&mut net, &mut server, get_url("/x"))
}

#[test]
fn get_decodes_chunked_and_to_end_of_stream_bodies() {
    let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let mut want = Vec::new();
    for i in 0..50usize {
        let part = format!("{i:05},").repeat(i + 1);
        chunked.extend_from_slice(format!("{:x};ext=1\r\n{part}\r\n", part.len()).as_bytes());
        want.extend_from_slice(part.as_bytes());
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, body, r) = fetch_canned(&chunked);
    r.unwrap();
    assert_eq!((status, body), (Some(200), want));

    let (status, body, r) = fetch_canned(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nuntil the end");
    r.unwrap();
    assert_eq!((status, body), (Some(200), b"until the end".to_vec()));

    // Bytes past Content-Length are not body.
    let (_, body, r) = fetch_canned(b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nabcdef");
    r.unwrap();
    assert_eq!(body, b"abc");
}

#[test]
fn get_failures_say_where_the_exchange_broke() {
    let cases: [(&[u8], &str); 5] = [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            "connection closed after 3 of 10 body bytes",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Len",
            "connection closed before the response was complete",
        ),
        (
            b"SSH-2.0-OpenSSH\r\n\r\n",
            "malformed status line 'SSH-2.0-OpenSSH'",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n",
            "bad Content-Length 'lots'",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "bad chunk size 'zz'",
        ),
    ];
    for (resp, want) in cases {
        let (_, _, r) = fetch_canned(resp);
        assert_eq!(r.unwrap_err().to_string(), want);
    }
    // Nobody listens: refused at once.
    let mut net = pair("", 1);
    let (_, _, r) = fetch(&mut net, &mut Idle, get_url("/"));
    assert_eq!(r.unwrap_err().to_string(), "connection refused");
    // The server accepts but never answers: the client gives up after its timeout.
    let mut net = pair("", 1);
    let _l = net.b.tcp_listen(80, 4).unwrap();
    let mut spec = get_url("/");
    spec.timeout = Duration::from_secs(2);
    let start = net.now;
    let (_, _, r) = fetch(&mut net, &mut Idle, spec);
    assert_eq!(r.unwrap_err().to_string(), "timed out waiting for data");
    let waited = net.now.saturating_since(start);
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[test]
fn the_request_is_what_the_spec_says() {
    let spec = GetSpec {
        remote: SocketAddrV4::new(B_IP.into(), 80),
        request: Request {
            target: "/hello".into(),
            headers: vec![("Host".into(), "h".into())],
        },
        timeout: Duration::from_secs(5),
        linger: Duration::ZERO,
    };
    assert_eq!(
        spec.request.to_bytes(),
        b"GET /hello HTTP/1.1\r\nHost: h\r\n\r\n"
    );
}

#[test]
fn the_udp_probe_counts_echoes_and_losses() {
    for (impair, seed) in [("", 1), ("loss=0.1", 4)] {
        let mut net = pair(impair, seed);
        let dst = SocketAddrV4::new(B_IP.into(), 7);
        let sizes = UdpProbe::demo_sizes();
        let mut probe =
            UdpProbe::bind(&mut net.a, dst, sizes.clone(), Duration::from_millis(200)).unwrap();
        let mut echo = UdpEcho::bind(&mut net.b, 7).unwrap();
        assert!(run_apps(
            &mut net,
            Duration::from_secs(60),
            &mut probe,
            &mut echo
        ));
        let o = probe.outcome();
        assert_eq!(o.sent, sizes.len());
        assert_eq!(o.bytes, sizes.iter().sum::<usize>());
        assert_eq!(o.corrupt, 0);
        if impair.is_empty() {
            assert_eq!((o.echoed, o.lost()), (sizes.len(), 0));
            assert_eq!(echo.echoed(), sizes.len() as u64);
        } else {
            assert!(o.lost() > 0 && o.echoed > 0, "{o:?}");
        }
    }
}

#[test]
fn hostile_requests_never_stop_the_server() {
    let root = www("hostile");
    let mut net = pair("", 1);
    let mut server = http_server(&mut net, &root);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let seeds: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /sub/a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        b"HEAD /%2e%2e/x HTTP/1.1\r\n\r\n",
        b"",
    ];
    for round in 0..60 {
        // Mutate a valid request, or send noise.
        let mut req = seeds[round % seeds.len()].to_vec();
        if req.is_empty() {
            req = (0..(next() % 300 + 1)).map(|_| next() as u8).collect();
        } else {
            for _ in 0..(next() % 4 + 1) {
                let i = (next() as usize) % req.len();
                req[i] = next() as u8;
            }
        }
        // Half-close so a request that is merely incomplete ends too.
        let mut raw = Raw::new(&req);
        raw.half_close = true;
        assert!(
            run_apps(&mut net, Duration::from_secs(60), &mut raw, &mut server),
            "round {round}: {req:?}"
        );
        let got = String::from_utf8_lossy(&raw.got);
        assert!(
            got.is_empty() || got.starts_with("HTTP/1.1 "),
            "round {round}: {got}"
        );
    }
    let (status, _, r) = fetch(&mut net, &mut server, get_url("/sub/a.txt"));
    r.unwrap();
    assert_eq!(status, Some(200));
    run_apps(&mut net, Duration::from_secs(5), &mut Idle, &mut server);
    assert_eq!(server.open_connections(), 0, "every connection ended");
    std::fs::remove_dir_all(&root).unwrap();
}
