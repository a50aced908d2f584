//! The HTTP/1.1 service: one request at a time per connection (pipelined requests wait in
//! the input buffer), heads parsed by `httparse`, file bodies streamed as the send buffer
//! drains.

use super::files::FileCache;
use super::FileBody;
use super::{flush_out, read_in, Conn, Totals, MAX_REQUEST_HEAD};
use flowstack_api::{FileError, SocketError, Sockets};

/// Most header lines a request may carry (Apache's default limit is 100).
const MAX_HEADERS: usize = 128;

/// Advances one HTTP connection. Returns true if bytes moved.
pub(super) fn step<S: Sockets + ?Sized>(
    s: &mut S,
    c: &mut Conn,
    files: &mut FileCache,
    buf: &mut [u8],
    t: &mut Totals,
) -> bool {
    let mut moved = flush_out(s, c, t);
    moved |= stream_body(s, c, t);
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
            let code = answer(c, files, &head);
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

/// Queues the file body as the send buffer drains, straight from the file
/// ([`Sockets::send_file`]: zero-copy chunks on the engine). Returns true if bytes moved.
fn stream_body<S: Sockets + ?Sized>(s: &mut S, c: &mut Conn, t: &mut Totals) -> bool {
    // Acknowledged zero-copy chunks report tokens; nothing here waits for them.
    while s.tcp_zc_completion(c.h).is_some() {}
    let mut moved = false;
    while c.out.is_empty() && !c.done {
        let Some(b) = c.file.as_mut() else {
            break;
        };
        if b.left == 0 {
            c.file = None;
            break;
        }
        match s.send_file(c.h, &b.file, b.offset, b.left) {
            Ok(n) => {
                b.offset += n as u64;
                b.left -= n as u64;
                t.bytes_out += n as u64;
                moved = true;
            }
            Err(FileError::Socket(SocketError::WouldBlock)) => break,
            Err(e) => {
                // The file shrank under us (or the socket failed): the promised length
                // cannot be met; close.
                tracing::debug!(conn = c.h.index(), error = %e, "body cut short");
                c.done = true;
                break;
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
    /// The `Range` header's value, if one came.
    range: Option<String>,
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
    let mut range = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("range") {
            range = Some(String::from_utf8_lossy(h.value).into_owned());
        }
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
        range,
    };
    Ok(httparse::Status::Complete((head, n)))
}

/// Queues the answer to one request; returns its status code.
fn answer(c: &mut Conn, files: &mut FileCache, head: &Head) -> u16 {
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
    let f = match files.get(target) {
        Ok(f) => f,
        Err(400) => {
            simple(c, 400, "Bad Request", "bad path\n", close);
            return 400;
        }
        Err(_) => return not_found(c),
    };
    let len = f.len;
    let conn = if close {
        "Connection: close\r\n"
    } else {
        "Connection: keep-alive\r\n"
    };
    let ctype = f.ctype;
    let (code, offset, body_len) = match head.range.as_deref().map(|r| byte_range(r, len)) {
        None | Some(RangeAnswer::Ignore) => {
            c.out.extend_from_slice(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nAccept-Ranges: bytes\r\nContent-Length: {len}\r\nServer: flowstack\r\n{conn}\r\n"
                )
                .as_bytes(),
            );
            (200, 0, len)
        }
        Some(RangeAnswer::Partial { first, last }) => {
            let n = last - first + 1;
            c.out.extend_from_slice(
                format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Type: {ctype}\r\nAccept-Ranges: bytes\r\nContent-Length: {n}\r\nContent-Range: bytes {first}-{last}/{len}\r\nServer: flowstack\r\n{conn}\r\n"
                )
                .as_bytes(),
            );
            (206, first, n)
        }
        Some(RangeAnswer::Unsatisfiable) => {
            // RFC 9110 §15.5.17: 416 with the current length.
            c.out.extend_from_slice(
                format!(
                    "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nServer: flowstack\r\n{conn}\r\n"
                )
                .as_bytes(),
            );
            c.close_after = close;
            return 416;
        }
    };
    if method == "GET" && body_len > 0 {
        match (&f.bytes, &f.file) {
            // A small file goes out with its head, in one send.
            (Some(b), _) => c
                .out
                .extend_from_slice(&b[offset as usize..(offset + body_len) as usize]),
            (None, Some(file)) => {
                c.file = Some(FileBody {
                    file: file.clone(),
                    offset,
                    left: body_len,
                })
            }
            (None, None) => {}
        }
    }
    c.close_after = close;
    code
}

/// What to do with a `Range` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RangeAnswer {
    /// Send the whole file (200): a header we do not understand or serve (several ranges,
    /// another unit, bad syntax) is ignored, as RFC 9110 §14.2 allows.
    Ignore,
    /// 206 with bytes `first..=last`.
    Partial { first: u64, last: u64 },
    /// 416: no byte of the range lies in the file.
    Unsatisfiable,
}

/// RFC 9110 §14.1.2: `bytes=FIRST-LAST`, `bytes=FIRST-` or `bytes=-SUFFIX`, one range, for a
/// file of `len` bytes. A LAST past the end is cut to the end; a FIRST at or past the end, or
/// an empty suffix, cannot be satisfied.
fn byte_range(value: &str, len: u64) -> RangeAnswer {
    let Some(spec) = value
        .trim()
        .strip_prefix("bytes=")
        .or_else(|| value.trim().strip_prefix("BYTES="))
    else {
        return RangeAnswer::Ignore;
    };
    let spec = spec.trim();
    if spec.contains(',') {
        return RangeAnswer::Ignore;
    }
    let Some((a, b)) = spec.split_once('-') else {
        return RangeAnswer::Ignore;
    };
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (a.is_empty(), num(a), num(b)) {
        // Suffix: the last SUFFIX bytes.
        (true, _, Some(n)) => {
            if n == 0 || len == 0 {
                RangeAnswer::Unsatisfiable
            } else {
                RangeAnswer::Partial {
                    first: len - n.min(len),
                    last: len - 1,
                }
            }
        }
        (false, Some(first), last) if b.is_empty() || last.is_some() => {
            if last.is_some_and(|l| l < first) {
                return RangeAnswer::Ignore;
            }
            if first >= len {
                return RangeAnswer::Unsatisfiable;
            }
            RangeAnswer::Partial {
                first,
                last: last.unwrap_or(u64::MAX).min(len - 1),
            }
        }
        _ => RangeAnswer::Ignore,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_follow_rfc_9110() {
        use RangeAnswer::*;
        let p = |first, last| Partial { first, last };
        assert_eq!(byte_range("bytes=0-0", 10), p(0, 0));
        assert_eq!(byte_range("bytes=2-5", 10), p(2, 5));
        assert_eq!(byte_range("bytes=2-", 10), p(2, 9));
        assert_eq!(byte_range("bytes=2-100", 10), p(2, 9));
        assert_eq!(byte_range("bytes=-3", 10), p(7, 9));
        assert_eq!(byte_range("bytes=-30", 10), p(0, 9));
        assert_eq!(byte_range(" bytes= 4 - 6 ", 10), p(4, 6));
        assert_eq!(byte_range("bytes=10-", 10), Unsatisfiable);
        assert_eq!(byte_range("bytes=10-20", 10), Unsatisfiable);
        assert_eq!(byte_range("bytes=-0", 10), Unsatisfiable);
        assert_eq!(byte_range("bytes=0-", 0), Unsatisfiable);
        assert_eq!(byte_range("bytes=5-2", 10), Ignore);
        assert_eq!(byte_range("bytes=0-1,3-4", 10), Ignore);
        assert_eq!(byte_range("items=0-1", 10), Ignore);
        assert_eq!(byte_range("bytes=x-1", 10), Ignore);
        assert_eq!(byte_range("bytes=1", 10), Ignore);
        assert_eq!(byte_range("bytes=+1-2", 10), Ignore);
        assert_eq!(
            byte_range("bytes=5368709119-", 5 << 30),
            p(5368709119, (5 << 30) - 1)
        );
    }
}
