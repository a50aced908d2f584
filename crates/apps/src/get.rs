//! An HTTP/1.1 client: one GET, the body (Content-Length, chunked, or up to end of stream)
//! written to any `Write` as it arrives.
//!
//! [`HttpGet`] is an [`App`]: it connects, sends the request, parses the response head with
//! `httparse`, streams the body out, closes and lingers briefly so the FIN leaves. It gives
//! up when no progress was made for the spec's timeout. Every failure is a [`GetError`]
//! whose message says at which point the exchange broke.
//!
//! With [`HttpGet::body_file`] the body goes to a file instead, by positioned writes; a
//! Content-Length or to-end-of-stream body is written straight from the socket's receive
//! buffer ([`Sockets::recv_to_file`]), never copied through the client.

use flowstack_api::app::{App, Progress};
use flowstack_api::{FileError, SocketError, Sockets, TcpHandle};
use flowstack_wire::{Duration, Instant, Ipv4Address};
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddrV4;
use std::os::unix::fs::FileExt;

/// Largest response head accepted.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Longest chunk-size line accepted (size and extensions).
const MAX_CHUNK_LINE: usize = 64 * 1024;
/// Most header lines a response may carry.
const MAX_HEADERS: usize = 128;
/// Bytes read per socket call.
const CHUNK: usize = 256 * 1024;

/// A parsed `http://` URL (flowstack has no resolver: the host is an IPv4 address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// Server address.
    pub host: Ipv4Address,
    /// Server port (80 if the URL names none).
    pub port: u16,
    /// Path and query, `/` if the URL has none.
    pub path: String,
}

impl Url {
    /// Parses `http://A.B.C.D[:PORT][/PATH]`.
    pub fn parse(u: &str) -> Result<Url, String> {
        let rest = u
            .strip_prefix("http://")
            .ok_or_else(|| format!("'{u}': only http:// URLs are supported"))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| format!("'{u}': bad port"))?),
            None => (hostport, 80),
        };
        let host = host.parse::<Ipv4Address>().map_err(|_| {
            format!("'{u}': host must be an IPv4 address (flowstack has no resolver)")
        })?;
        if port == 0 {
            return Err(format!("'{u}': port 0"));
        }
        Ok(Url {
            host,
            port,
            path: path.to_string(),
        })
    }

    /// The server's socket address.
    pub fn remote(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.host.into(), self.port)
    }
}

/// A GET request: its target and header lines, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Request target (path and query).
    pub target: String,
    /// Header lines, sent in this order.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// What `flowstack get` sends for `url`: Host, `User-Agent: flowstack`, `Accept: */*`,
    /// `Connection: close`.
    pub fn for_url(url: &Url) -> Self {
        Self {
            target: url.path.clone(),
            headers: vec![
                ("Host".into(), format!("{}:{}", url.host, url.port)),
                ("User-Agent".into(), "flowstack".into()),
                ("Accept".into(), "*/*".into()),
                ("Connection".into(), "close".into()),
            ],
        }
    }

    /// The request as it goes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut s = format!("GET {} HTTP/1.1\r\n", self.target);
        for (k, v) in &self.headers {
            s.push_str(&format!("{k}: {v}\r\n"));
        }
        s.push_str("\r\n");
        s.into_bytes()
    }
}

/// One GET: where, what, how patient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetSpec {
    /// The server.
    pub remote: SocketAddrV4,
    /// The request.
    pub request: Request,
    /// Give up after this long without progress (connecting, sending, receiving).
    pub timeout: Duration,
    /// After the body, wait at most this long for the connection to finish closing (so the
    /// FIN leaves before the process exits); zero finishes at once.
    pub linger: Duration,
}

impl GetSpec {
    /// `flowstack get`'s exchange for `url`: [`Request::for_url`], 200 ms linger.
    pub fn for_url(url: &Url, timeout: Duration) -> Self {
        Self {
            remote: url.remote(),
            request: Request::for_url(url),
            timeout,
            linger: Duration::from_millis(200),
        }
    }
}

/// The response's status line and the headers that frame its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// HTTP minor version (1.0 or 1.1).
    pub minor_version: u8,
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: String,
    /// Content-Length, if given.
    pub content_length: Option<u64>,
    /// `Transfer-Encoding: chunked` (takes precedence over Content-Length).
    pub chunked: bool,
}

impl ResponseHead {
    /// `HTTP/1.1 200 OK`.
    pub fn status_line(&self) -> String {
        format!(
            "HTTP/1.{} {} {}",
            self.minor_version, self.status, self.reason
        )
    }
}

/// Why a GET failed.
#[derive(Debug)]
pub enum GetError {
    /// Connecting or sending the request failed.
    Socket(SocketError),
    /// Receiving the head or a chunk's framing failed (`TimedOut`: no data in time).
    Recv(SocketError),
    /// The connection closed before the response was complete.
    Closed,
    /// The head did not fit in [`MAX_RESPONSE_HEAD`].
    HeadTooLarge,
    /// The status line could not be parsed.
    StatusLine(String),
    /// A header line could not be parsed.
    Header(String),
    /// Content-Length was not a number.
    ContentLength(String),
    /// A chunk-size line could not be parsed.
    ChunkSize(String),
    /// The connection closed in the middle of a Content-Length body.
    ClosedInBody {
        /// Body bytes received.
        got: u64,
        /// Content-Length.
        len: u64,
    },
    /// Receiving a Content-Length body failed.
    InBody {
        /// Body bytes received.
        got: u64,
        /// Content-Length.
        len: u64,
        /// Why.
        error: SocketError,
    },
    /// Writing the body out failed.
    Write(io::Error),
}

impl fmt::Display for GetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GetError::Socket(e) => write!(f, "{e}"),
            GetError::Recv(SocketError::TimedOut) => f.write_str("timed out waiting for data"),
            GetError::Recv(e) => write!(f, "{e}"),
            GetError::Closed => f.write_str("connection closed before the response was complete"),
            GetError::HeadTooLarge => f.write_str("response header larger than 64 KiB"),
            GetError::StatusLine(l) => write!(f, "malformed status line '{l}'"),
            GetError::Header(why) => write!(f, "malformed response header: {why}"),
            GetError::ContentLength(v) => write!(f, "bad Content-Length '{v}'"),
            GetError::ChunkSize(l) => write!(f, "bad chunk size '{l}'"),
            GetError::ClosedInBody { got, len } => {
                write!(f, "connection closed after {got} of {len} body bytes")
            }
            GetError::InBody { got, len, error } => {
                write!(f, "after {got} of {len} body bytes: {error}")
            }
            GetError::Write(e) => write!(f, "writing output: {e}"),
        }
    }
}

impl std::error::Error for GetError {}

/// How the body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// Exactly this many bytes.
    Length(u64),
    /// Chunks: waiting for a size line.
    ChunkSize,
    /// Chunks: this many data bytes of the current chunk left.
    ChunkData(u64),
    /// Chunks: the CRLF after a chunk's data.
    ChunkEnd,
    /// Up to end of stream.
    ToEof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connect,
    Send,
    Head,
    Body(Body),
    /// The body is complete: close.
    Complete,
    /// Closed; waiting (until `until`) for the connection to finish closing.
    Linger {
        until: Instant,
    },
    Done,
}

/// Observer of body progress: (body bytes so far, Content-Length if known).
type OnProgress<'a> = Box<dyn FnMut(u64, Option<u64>) + 'a>;

/// One HTTP GET as an [`App`]; the body goes to `W`.
pub struct HttpGet<'a, W: Write> {
    spec: GetSpec,
    out: W,
    phase: Phase,
    h: Option<TcpHandle>,
    request: Vec<u8>,
    sent: usize,
    /// Received bytes not yet used (head, chunk framing).
    pending: Vec<u8>,
    tmp: Vec<u8>,
    head: Option<ResponseHead>,
    got: u64,
    deadline: Option<Instant>,
    result: Option<Result<(), GetError>>,
    on_progress: Option<OnProgress<'a>>,
    /// Where the body goes instead of `out`, if set.
    file: Option<File>,
}

impl<'a, W: Write> HttpGet<'a, W> {
    /// A GET for `spec`, writing the body to `out`. Nothing happens before the first poll.
    pub fn new(spec: GetSpec, out: W) -> Self {
        let request = spec.request.to_bytes();
        Self {
            spec,
            out,
            phase: Phase::Connect,
            h: None,
            request,
            sent: 0,
            pending: Vec::new(),
            tmp: vec![0; CHUNK],
            head: None,
            got: 0,
            deadline: None,
            result: None,
            on_progress: None,
            file: None,
        }
    }

    /// Writes the body into `file` from offset 0 (positioned writes) instead of `out`: a
    /// Content-Length or to-end-of-stream body straight from the receive buffer
    /// ([`Sockets::recv_to_file`]: the engine writes the borrowed slices with `pwritev`).
    pub fn body_file(mut self, file: File) -> Self {
        self.file = Some(file);
        self
    }

    /// Calls `f(body bytes so far, Content-Length)` whenever body bytes were written.
    pub fn on_progress(mut self, f: impl FnMut(u64, Option<u64>) + 'a) -> Self {
        self.on_progress = Some(Box::new(f));
        self
    }

    /// The response head, once parsed.
    pub fn head(&self) -> Option<&ResponseHead> {
        self.head.as_ref()
    }

    /// Body bytes written so far.
    pub fn body_bytes(&self) -> u64 {
        self.got
    }

    /// True once the exchange has ended (body complete or failed).
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// How the exchange ended: `None` while it runs.
    pub fn result(&self) -> Option<&Result<(), GetError>> {
        self.result.as_ref()
    }

    /// Ends the exchange from outside (the drive loop's link went down, say): the error is
    /// reported as a socket call failing with `error` at the current point would be.
    pub fn abandon(&mut self, error: SocketError) {
        if self.result.is_none() {
            let e = self.recv_error(error);
            self.result = Some(Err(e));
        }
        self.phase = Phase::Done;
    }

    /// The writer, and how the exchange ended (`None` if it has not).
    pub fn into_parts(self) -> (W, Option<Result<(), GetError>>) {
        (self.out, self.result)
    }

    /// The error a failed receive means at the current phase.
    fn recv_error(&self, e: SocketError) -> GetError {
        match self.phase {
            Phase::Connect | Phase::Send => GetError::Socket(e),
            Phase::Body(Body::Length(len)) => GetError::InBody {
                got: self.got,
                len,
                error: e,
            },
            Phase::Body(Body::ToEof) => GetError::Socket(e),
            _ => GetError::Recv(e),
        }
    }

    fn fail<S: Sockets + ?Sized>(&mut self, s: &mut S, e: GetError) -> Progress {
        tracing::debug!(error = %e, "get failed");
        if let Some(h) = self.h.take() {
            let _ = s.tcp_close(h);
        }
        self.result = Some(Err(e));
        self.phase = Phase::Done;
        Progress::Done
    }

    fn write(&mut self, data: &[u8]) -> Result<(), GetError> {
        match &self.file {
            Some(f) => f.write_all_at(data, self.got),
            None => self.out.write_all(data),
        }
        .map_err(GetError::Write)?;
        self.wrote(data.len());
        Ok(())
    }

    /// Counts `n` body bytes written and tells the observer.
    fn wrote(&mut self, n: usize) {
        self.got += n as u64;
        if let Some(f) = &mut self.on_progress {
            f(self.got, self.head.as_ref().and_then(|h| h.content_length));
        }
    }

    /// Reads once into `pending`. `Ok(true)` if bytes came, `Ok(false)` if none yet.
    fn fill<S: Sockets + ?Sized>(&mut self, s: &mut S, h: TcpHandle) -> Result<bool, GetError> {
        match s.tcp_recv(h, &mut self.tmp) {
            Ok(0) => Err(GetError::Closed),
            Ok(n) => {
                self.pending.extend_from_slice(&self.tmp[..n]);
                Ok(true)
            }
            Err(SocketError::WouldBlock) => Ok(false),
            Err(e) => Err(GetError::Recv(e)),
        }
    }

    /// Parses the head out of `pending`, if it is all there.
    fn parse_head(&mut self) -> Result<Option<ResponseHead>, GetError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(&self.pending) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if self.pending.len() > MAX_RESPONSE_HEAD => {
                return Err(GetError::HeadTooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(
                e @ (httparse::Error::HeaderName
                | httparse::Error::HeaderValue
                | httparse::Error::TooManyHeaders),
            ) => return Err(GetError::Header(e.to_string())),
            Err(_) => {
                let line = self.pending.split(|&b| b == b'\n').next().unwrap_or(&[]);
                let line = String::from_utf8_lossy(line).trim_end().to_string();
                return Err(GetError::StatusLine(line));
            }
        };
        let mut head = ResponseHead {
            minor_version: resp.version.unwrap_or(1),
            status: resp.code.unwrap_or(0),
            reason: resp.reason.unwrap_or("").to_string(),
            content_length: None,
            chunked: false,
        };
        for h in resp.headers.iter() {
            let v = String::from_utf8_lossy(h.value.trim_ascii());
            if h.name.eq_ignore_ascii_case("content-length") {
                let len = v.parse::<u64>();
                head.content_length = Some(len.map_err(|_| GetError::ContentLength(v.into()))?);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding")
                && v.eq_ignore_ascii_case("chunked")
            {
                head.chunked = true;
            }
        }
        self.pending.drain(..n);
        Ok(Some(head))
    }

    /// Writes as much of the current chunk as `pending` holds.
    fn chunk_data(&mut self, left: u64) -> Result<u64, GetError> {
        let n = (self.pending.len() as u64).min(left) as usize;
        let data = std::mem::take(&mut self.pending);
        let r = self.write(&data[..n]);
        self.pending = data;
        self.pending.drain(..n);
        r.map(|_| left - n as u64)
    }

    /// One step of the chunked body from `pending`: the next phase, or `None` if more bytes
    /// are needed.
    fn chunked_step(&mut self, b: Body) -> Result<Option<Phase>, GetError> {
        Ok(match b {
            Body::ChunkSize => match httparse::parse_chunk_size(&self.pending) {
                Ok(httparse::Status::Complete((n, 0))) => {
                    // RFC 9112 §7.1: the last chunk; trailers, if any, are not read.
                    self.pending.drain(..n);
                    Some(Phase::Complete)
                }
                Ok(httparse::Status::Complete((n, size))) => {
                    self.pending.drain(..n);
                    Some(Phase::Body(Body::ChunkData(size)))
                }
                Ok(httparse::Status::Partial) if self.pending.len() <= MAX_CHUNK_LINE => None,
                _ => {
                    let line = self.pending.split(|&b| b == b'\r').next().unwrap_or(&[]);
                    let line = &line[..line.len().min(64)];
                    return Err(GetError::ChunkSize(
                        String::from_utf8_lossy(line).into_owned(),
                    ));
                }
            },
            Body::ChunkData(left) if !self.pending.is_empty() => match self.chunk_data(left)? {
                0 => Some(Phase::Body(Body::ChunkEnd)),
                left => Some(Phase::Body(Body::ChunkData(left))),
            },
            Body::ChunkEnd if self.pending.len() >= 2 => {
                self.pending.drain(..2);
                Some(Phase::Body(Body::ChunkSize))
            }
            _ => None,
        })
    }

    /// Reads a Content-Length or to-end-of-stream body straight from the socket.
    /// `Ok(Some(true))` when complete, `Ok(Some(false))` when bytes moved, `Ok(None)` if
    /// none were waiting.
    fn stream_step<S: Sockets + ?Sized>(
        &mut self,
        s: &mut S,
        h: TcpHandle,
        b: Body,
    ) -> Result<Option<bool>, GetError> {
        if let Body::Length(len) = b {
            if self.got >= len {
                return Ok(Some(true));
            }
        }
        if let Some(f) = self.file.take() {
            let r = self.stream_to_file(s, h, b, &f);
            self.file = Some(f);
            return r;
        }
        let mut tmp = std::mem::take(&mut self.tmp);
        let r = match (s.tcp_recv(h, &mut tmp), b) {
            (Ok(0), Body::Length(len)) => Err(GetError::ClosedInBody { got: self.got, len }),
            (Ok(0), _) => Ok(Some(true)),
            (Ok(k), Body::Length(len)) => {
                let k = (k as u64).min(len - self.got) as usize;
                self.write(&tmp[..k]).map(|_| Some(self.got >= len))
            }
            (Ok(k), _) => self.write(&tmp[..k]).map(|_| Some(false)),
            (Err(SocketError::WouldBlock), _) => Ok(None),
            (Err(e), _) => Err(self.recv_error(e)),
        };
        self.tmp = tmp;
        r
    }

    /// [`HttpGet::stream_step`] into the body file, straight from the receive buffer.
    fn stream_to_file<S: Sockets + ?Sized>(
        &mut self,
        s: &mut S,
        h: TcpHandle,
        b: Body,
        f: &File,
    ) -> Result<Option<bool>, GetError> {
        // Never past the body: what follows is not ours.
        let max = match b {
            Body::Length(len) => (len - self.got).min(CHUNK as u64) as usize,
            _ => CHUNK,
        };
        match (s.recv_to_file(h, f, self.got, max), b) {
            (Ok(0), Body::Length(len)) => Err(GetError::ClosedInBody { got: self.got, len }),
            (Ok(0), _) => Ok(Some(true)),
            (Ok(k), b) => {
                self.wrote(k);
                Ok(Some(matches!(b, Body::Length(len) if self.got >= len)))
            }
            (Err(FileError::Socket(SocketError::WouldBlock)), _) => Ok(None),
            (Err(FileError::Socket(e)), _) => Err(self.recv_error(e)),
            (Err(e), _) => Err(GetError::Write(io::Error::from_raw_os_error(e.errno()))),
        }
    }

    /// Advances as far as the socket allows; `Ok(true)` if anything moved.
    fn advance<S: Sockets + ?Sized>(&mut self, now: Instant, s: &mut S) -> Result<bool, GetError> {
        let mut moved = false;
        loop {
            let h = match (self.phase, self.h) {
                (Phase::Connect, None) => {
                    let h = s.tcp_connect(self.spec.remote).map_err(GetError::Socket)?;
                    self.h = Some(h);
                    h
                }
                (Phase::Done, _) => return Ok(moved),
                (_, Some(h)) => h,
                (_, None) => return Ok(moved),
            };
            let next = match self.phase {
                Phase::Connect => {
                    if let Some(e) = s.tcp_error(h) {
                        return Err(GetError::Socket(e));
                    }
                    if !s.tcp_is_open(h) {
                        return Ok(moved);
                    }
                    tracing::debug!(remote = %self.spec.remote, "connected");
                    Phase::Send
                }
                Phase::Send => {
                    while self.sent < self.request.len() {
                        match s.tcp_send(h, &self.request[self.sent..]) {
                            Ok(n) => self.sent += n,
                            Err(SocketError::WouldBlock) => return Ok(moved),
                            Err(e) => return Err(GetError::Socket(e)),
                        }
                    }
                    Phase::Head
                }
                Phase::Head => match self.parse_head()? {
                    Some(head) => {
                        tracing::debug!(status = head.status, length = ?head.content_length, chunked = head.chunked, "response");
                        let body = if head.chunked {
                            Body::ChunkSize
                        } else if let Some(len) = head.content_length {
                            Body::Length(len)
                        } else {
                            Body::ToEof
                        };
                        self.head = Some(head);
                        // Body bytes that came with the head.
                        let early = std::mem::take(&mut self.pending);
                        match body {
                            Body::Length(len) => {
                                let n = (early.len() as u64).min(len) as usize;
                                self.write(&early[..n])?;
                            }
                            Body::ToEof => self.write(&early)?,
                            _ => self.pending = early,
                        }
                        Phase::Body(body)
                    }
                    None if self.fill(s, h)? => Phase::Head,
                    None => return Ok(moved),
                },
                Phase::Body(b @ (Body::Length(_) | Body::ToEof)) => {
                    match self.stream_step(s, h, b)? {
                        Some(true) => Phase::Complete,
                        Some(false) => Phase::Body(b),
                        None => return Ok(moved),
                    }
                }
                Phase::Body(b) => match self.chunked_step(b)? {
                    Some(p) => p,
                    None if self.fill(s, h)? => Phase::Body(b),
                    None => return Ok(moved),
                },
                Phase::Complete => {
                    let _ = s.tcp_close(h);
                    self.result = Some(Ok(()));
                    Phase::Linger {
                        until: now + self.spec.linger,
                    }
                }
                Phase::Linger { until } => {
                    if now >= until || s.tcp_connections() == 0 {
                        self.h = None;
                        Phase::Done
                    } else {
                        return Ok(moved);
                    }
                }
                Phase::Done => return Ok(moved),
            };
            moved = true;
            self.phase = next;
        }
    }
}

impl<W: Write, S: Sockets + ?Sized> App<S> for HttpGet<'_, W> {
    fn poll(&mut self, now: Instant, s: &mut S) -> Progress {
        if self.phase == Phase::Done {
            return Progress::Done;
        }
        let deadline = *self.deadline.get_or_insert(now + self.spec.timeout);
        match self.advance(now, s) {
            Err(e) => return self.fail(s, e),
            Ok(_) if self.phase == Phase::Done => return Progress::Done,
            Ok(true) => {
                self.deadline = Some(now + self.spec.timeout);
                return Progress::Busy;
            }
            Ok(false) => {}
        }
        if now >= deadline && !matches!(self.phase, Phase::Linger { .. }) {
            let e = self.recv_error(SocketError::TimedOut);
            return self.fail(s, e);
        }
        Progress::Idle
    }

    fn poll_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Done => None,
            Phase::Linger { until } => Some(until),
            _ => self.deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            Url::parse("http://10.0.0.1:8080/a/b").unwrap(),
            Url {
                host: Ipv4Address::new(10, 0, 0, 1),
                port: 8080,
                path: "/a/b".into()
            }
        );
        assert_eq!(Url::parse("http://10.0.0.1").unwrap().path, "/");
        assert!(Url::parse("https://10.0.0.1/").is_err());
        assert!(Url::parse("http://example.com/").is_err());
        assert!(Url::parse("http://10.0.0.1:0/").is_err());
    }

    #[test]
    fn the_request_carries_its_headers_in_order() {
        let url = Url::parse("http://10.7.0.1:8000/f.bin").unwrap();
        let r = Request::for_url(&url).to_bytes();
        assert_eq!(
            r,
            b"GET /f.bin HTTP/1.1\r\nHost: 10.7.0.1:8000\r\nUser-Agent: flowstack\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn errors_say_where_the_exchange_broke() {
        assert_eq!(
            GetError::Socket(SocketError::ConnectionRefused).to_string(),
            "connection refused"
        );
        assert_eq!(
            GetError::Recv(SocketError::TimedOut).to_string(),
            "timed out waiting for data"
        );
        assert_eq!(
            GetError::InBody {
                got: 5,
                len: 9,
                error: SocketError::TimedOut
            }
            .to_string(),
            "after 5 of 9 body bytes: connection timed out"
        );
    }
}
