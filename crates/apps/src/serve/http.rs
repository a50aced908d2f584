//! The HTTP/1.1 service: one request at a time per connection (pipelined requests wait in
//! the input buffer), heads parsed by `httparse`, file bodies streamed as the send buffer
//! drains.

use super::files::{content_type, resolve};
use super::{flush_out, read_in, Conn, Totals, MAX_REQUEST_HEAD};
use flowstack_api::Sockets;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Most header lines a request may carry (Apache's default limit is 100).
const MAX_HEADERS: usize = 128;

/// Advances one HTTP connection. Returns true if bytes moved.
pub(super) fn step<S: Sockets + ?Sized>(
    s: &mut S,
    c: &mut Conn,
    root: &Path,
    buf: &mut [u8],
    t: &mut Totals,
) -> bool {
    let mut moved = flush_out(s, c, t);
    moved |= stream_body(s, c, buf, t);
    if !c.out.is_empty() || c.file.is_some() || c.done {
        return moved;
    }
    if c.close_after {
        c.done = true;
        return true;
    }
    let (m, eof) = read_in(s, c, buf, t);
    moved |= m;
    match parse(&c.inbuf) {
        Ok(httparse::Status::Complete((head, n))) => {
            t.requests += 1;
            c.inbuf.drain(..n);
            let code = answer(c, root, &head);
            tracing::debug!(
                conn = c.h.index(),
                method = head.method,
                target = head.target,
                code,
                "request"
            );
            moved |= flush_out(s, c, t);
        }
        Ok(httparse::Status::Partial) if c.inbuf.len() > MAX_REQUEST_HEAD => {
            simple(c, 400, "Bad Request", "request header too large\n", true);
            moved |= flush_out(s, c, t);
        }
        Ok(httparse::Status::Partial) => c.done |= eof,
        Err(e) => {
            t.requests += 1;
            tracing::debug!(conn = c.h.index(), error = %e, "malformed request");
            let why = match e {
                httparse::Error::TooManyHeaders => "too many header lines\n",
                httparse::Error::HeaderName | httparse::Error::HeaderValue => "malformed header\n",
                _ => "malformed request line\n",
            };
            simple(c, 400, "Bad Request", why, true);
            moved |= flush_out(s, c, t);
        }
    }
    moved
}

/// Moves the file body into the send buffer as it drains. Returns true if bytes moved.
fn stream_body<S: Sockets + ?Sized>(
    s: &mut S,
    c: &mut Conn,
    buf: &mut [u8],
    t: &mut Totals,
) -> bool {
    let mut moved = false;
    while c.out.is_empty() && !c.done {
        let Some((f, left)) = c.file.as_mut() else {
            break;
        };
        if *left == 0 {
            c.file = None;
            break;
        }
        let want = (*left).min(buf.len() as u64) as usize;
        match f.read(&mut buf[..want]) {
            Ok(0) | Err(_) => {
                // The file shrank under us: the promised length cannot be met; close.
                c.done = true;
                break;
            }
            Ok(n) => {
                *left -= n as u64;
                c.out.extend_from_slice(&buf[..n]);
                moved |= flush_out(s, c, t);
            }
        }
    }
    moved
}

/// Queues a short text answer; with `close`, the connection closes after it.
fn simple(c: &mut Conn, code: u16, reason: &str, body: &str, close: bool) {
    c.out.extend_from_slice(
        format!(
            "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nServer: flowstack\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        )
        .as_bytes(),
    );
    c.close_after |= close;
}

/// What the service needs of a request head.
struct Head {
    method: String,
    target: String,
    /// Close after answering: HTTP/1.0 closes unless it says keep-alive, HTTP/1.1 keeps
    /// the connection unless it says close (RFC 9112 §9.3).
    close: bool,
}

/// Parses a request head from the start of `buf`: the head and its length once complete.
fn parse(buf: &[u8]) -> Result<httparse::Status<(Head, usize)>, httparse::Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let n = match req.parse(buf)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(httparse::Status::Partial),
    };
    let mut close = req.version == Some(0);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("connection") {
            let v = h.value.trim_ascii();
            if v.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if v.eq_ignore_ascii_case(b"keep-alive") {
                close = false;
            }
        }
    }
    let head = Head {
        // A complete parse has both.
        method: req.method.unwrap_or_default().to_string(),
        target: req.path.unwrap_or_default().to_string(),
        close,
    };
    Ok(httparse::Status::Complete((head, n)))
}

/// Queues the answer to one request; returns its status code.
fn answer(c: &mut Conn, root: &Path, head: &Head) -> u16 {
    let (method, target, close) = (head.method.as_str(), head.target.as_str(), head.close);
    if method != "GET" && method != "HEAD" {
        c.out.extend_from_slice(b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\nServer: flowstack\r\n\r\n");
        c.close_after |= close;
        return 405;
    }
    let not_found = |c: &mut Conn| {
        simple(c, 404, "Not Found", "not found\n", close);
        404
    };
    let path = match resolve(root, target) {
        Ok(p) => p,
        Err(400) => {
            simple(c, 400, "Bad Request", "bad path\n", close);
            return 400;
        }
        Err(_) => return not_found(c),
    };
    let Ok(file) = File::open(&path) else {
        return not_found(c);
    };
    let len = match file.metadata() {
        Ok(m) if m.is_file() => m.len(),
        _ => return not_found(c),
    };
    c.out.extend_from_slice(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {len}\r\nServer: flowstack\r\n{}\r\n",
            content_type(&path),
            if close { "Connection: close\r\n" } else { "Connection: keep-alive\r\n" }
        )
        .as_bytes(),
    );
    if method == "GET" {
        c.file = Some((file, len));
    }
    c.close_after = close;
    200
}
