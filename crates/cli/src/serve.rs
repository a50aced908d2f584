//! `flowstack serve`: servers on a flowstack instance — static HTTP files, echo, sink.
//!
//! One event loop: poll the engine, accept, advance every connection as far as its buffers
//! allow, sleep in the device when nothing moved. SIGINT/SIGTERM end it with a summary.

use crate::net::{open_or_exit, print_counters, stop_flag, AddrArgs, LinkArgs};
use clap::{Args, Subcommand};
use flowstack_stack::{Counter, Engine, SocketError, TcpHandle};
use flowstack_wire::Duration;
use std::fs::File;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

/// Options of `flowstack serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    link: LinkArgs,
    #[command(flatten)]
    addr: AddrArgs,
    /// Listen backlog.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    backlog: usize,
    #[command(subcommand)]
    app: App,
}

#[derive(Subcommand, Debug)]
enum App {
    /// HTTP/1.1 static files: GET and HEAD, keep-alive, streamed bodies.
    Http {
        /// Directory to serve.
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// TCP port.
        #[arg(long, default_value_t = 80)]
        port: u16,
    },
    /// Sends back every byte received.
    Echo {
        /// TCP port.
        #[arg(long, default_value_t = 7)]
        port: u16,
    },
    /// Discards every byte received and reports throughput.
    Sink {
        /// TCP port.
        #[arg(long, default_value_t = 5001)]
        port: u16,
    },
}

/// Per-connection state of the HTTP server.
struct HttpConn {
    h: TcpHandle,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    out_off: usize,
    file: Option<(File, u64)>,
    close_after: bool,
    done: bool,
}

/// Limits of the HTTP server.
const MAX_REQUEST_HEAD: usize = 16 * 1024;
const CHUNK: usize = 256 * 1024;

#[derive(Default)]
struct Totals {
    conns: u64,
    requests: u64,
    bytes_in: u64,
    bytes_out: u64,
}

pub fn run(a: ServeArgs) -> ExitCode {
    let mut host = match open_or_exit(&a.link, &a.addr) {
        Ok(h) => h,
        Err(code) => return code,
    };
    let port = match &a.app {
        App::Http { root, port } => {
            if !root.is_dir() {
                eprintln!("flowstack: --root {} is not a directory", root.display());
                return ExitCode::from(2);
            }
            *port
        }
        App::Echo { port } | App::Sink { port } => *port,
    };
    let l = match host.engine.tcp_listen(port, a.backlog) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("flowstack: listen on port {port}: {e}");
            return ExitCode::from(1);
        }
    };
    let root = match &a.app {
        App::Http { root, .. } => root.canonicalize().ok(),
        _ => None,
    };
    eprintln!(
        "flowstack: serving {} on {}:{} ({}); Ctrl-C stops",
        match a.app {
            App::Http { .. } => "http",
            App::Echo { .. } => "echo",
            App::Sink { .. } => "sink",
        },
        a.addr.ip.addr,
        port,
        a.link
            .tap
            .as_deref()
            .map(|t| format!("tap {t}"))
            .or(a.link.packet.as_deref().map(|p| format!("packet {p}")))
            .unwrap_or_else(|| "shm wire".into())
    );
    let stop = stop_flag();
    let start = std::time::Instant::now();
    let mut conns: Vec<HttpConn> = Vec::new();
    let mut t = Totals::default();
    let mut buf = vec![0u8; CHUNK];
    while !stop.load(Ordering::Relaxed) && !host.dev.link_down() {
        let mut moved = host.turn();
        let e = &mut host.engine;
        while let Ok(h) = e.tcp_accept(l) {
            t.conns += 1;
            let _ = e.tcp_set_nodelay(h, true);
            conns.push(HttpConn {
                h,
                inbuf: Vec::new(),
                out: Vec::new(),
                out_off: 0,
                file: None,
                close_after: false,
                done: false,
            });
            moved = true;
        }
        for c in conns.iter_mut() {
            moved |= match (&a.app, &root) {
                (App::Http { .. }, Some(root)) => http_step(e, c, root, &mut buf, &mut t),
                (App::Echo { .. }, _) => echo_step(e, c, &mut buf, &mut t),
                _ => sink_step(e, c, &mut buf, &mut t),
            };
            if c.done {
                let _ = e.tcp_close(c.h);
            }
        }
        conns.retain(|c| !c.done);
        if !moved {
            host.idle(Duration::from_millis(50));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let e = &host.engine;
    println!("flowstack serve summary ({secs:.1} s):");
    println!(
        "  connections {}  requests {}  bytes in {}  bytes out {}  retransmissions {}",
        t.conns,
        t.requests,
        t.bytes_in,
        t.bytes_out,
        e.counters().get(Counter::TcpRetransSegs)
    );
    if matches!(a.app, App::Sink { .. }) && secs > 0.0 {
        println!(
            "  sink throughput {:.1} Mbit/s",
            t.bytes_in as f64 * 8.0 / secs / 1e6
        );
    }
    println!("  counters (drops by reason and events):");
    print_counters(e, &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// Queues as much of `c.out` as the send buffer takes. Returns true if bytes moved.
fn flush_out(e: &mut Engine, c: &mut HttpConn, t: &mut Totals) -> bool {
    let mut moved = false;
    while c.out_off < c.out.len() {
        match e.tcp_send(c.h, &c.out[c.out_off..]) {
            Ok(n) => {
                c.out_off += n;
                t.bytes_out += n as u64;
                moved = true;
            }
            Err(SocketError::WouldBlock) => break,
            Err(_) => {
                c.done = true;
                break;
            }
        }
    }
    if c.out_off == c.out.len() {
        c.out.clear();
        c.out_off = 0;
    }
    moved
}

/// Reads whatever arrived into `c.inbuf`. Returns (moved, end of stream).
fn read_in(e: &mut Engine, c: &mut HttpConn, buf: &mut [u8], t: &mut Totals) -> (bool, bool) {
    let mut moved = false;
    loop {
        match e.tcp_recv(c.h, buf) {
            Ok(0) => return (moved, true),
            Ok(n) => {
                t.bytes_in += n as u64;
                c.inbuf.extend_from_slice(&buf[..n]);
                moved = true;
                if c.inbuf.len() > MAX_REQUEST_HEAD * 4 {
                    return (moved, false);
                }
            }
            Err(SocketError::WouldBlock) => return (moved, false),
            Err(_) => return (moved, true),
        }
    }
}

fn echo_step(e: &mut Engine, c: &mut HttpConn, buf: &mut [u8], t: &mut Totals) -> bool {
    let mut moved = flush_out(e, c, t);
    if c.out.is_empty() {
        let (m, eof) = read_in(e, c, buf, t);
        moved |= m;
        std::mem::swap(&mut c.out, &mut c.inbuf);
        moved |= flush_out(e, c, t);
        if eof && c.out.is_empty() {
            c.done = true;
        }
    }
    moved
}

fn sink_step(e: &mut Engine, c: &mut HttpConn, buf: &mut [u8], t: &mut Totals) -> bool {
    let (moved, eof) = read_in(e, c, buf, t);
    c.inbuf.clear();
    c.done |= eof;
    moved
}

fn http_step(
    e: &mut Engine,
    c: &mut HttpConn,
    root: &Path,
    buf: &mut [u8],
    t: &mut Totals,
) -> bool {
    let mut moved = flush_out(e, c, t);
    // Stream the file body as the send buffer drains.
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
                moved |= flush_out(e, c, t);
            }
        }
    }
    if !c.out.is_empty() || c.file.is_some() || c.done {
        return moved;
    }
    if c.close_after {
        c.done = true;
        return true;
    }
    let (m, eof) = read_in(e, c, buf, t);
    moved |= m;
    if let Some(end) = c.inbuf.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&c.inbuf[..end]).to_string();
        c.inbuf.drain(..end + 4);
        t.requests += 1;
        respond(c, root, &head);
        moved |= flush_out(e, c, t);
    } else if c.inbuf.len() > MAX_REQUEST_HEAD {
        simple(c, 400, "Bad Request", "request header too large\n", true);
        moved |= flush_out(e, c, t);
    } else if eof {
        c.done = true;
    }
    moved
}

fn simple(c: &mut HttpConn, code: u16, reason: &str, body: &str, close: bool) {
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

/// Maps a request path to a file under `root`, refusing anything that escapes it.
pub fn resolve(root: &Path, target: &str) -> Result<PathBuf, u16> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return Err(400);
    }
    let decoded = percent_decode(path).ok_or(400u16)?;
    let mut out = root.to_path_buf();
    for comp in Path::new(&decoded).components() {
        match comp {
            Component::RootDir => {}
            Component::Normal(p) => out.push(p),
            // "..", "." or a prefix: refuse rather than interpret.
            _ => return Err(400),
        }
    }
    if out.is_dir() {
        out.push("index.html");
    }
    // Symlinks could still point outside: compare canonical paths.
    let canon = out.canonicalize().map_err(|_| 404u16)?;
    if !canon.starts_with(root) {
        return Err(404);
    }
    Ok(canon)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    (!s.contains('\0')).then_some(s)
}

fn content_type(p: &Path) -> &'static str {
    match p.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html",
        "txt" => "text/plain",
        "css" => "text/css",
        "js" => "application/javascript",
        "json" => "application/json",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "svg" => "image/svg+xml",
        _ => "application/octet-stream",
    }
}

fn respond(c: &mut HttpConn, root: &Path, head: &str) {
    let mut lines = head.split("\r\n");
    let req = lines.next().unwrap_or("");
    let parts: Vec<&str> = req.split(' ').collect();
    if parts.len() != 3 || !parts[2].starts_with("HTTP/1.") {
        return simple(c, 400, "Bad Request", "malformed request line\n", true);
    }
    let (method, target, version) = (parts[0], parts[1], parts[2]);
    let mut close = version == "HTTP/1.0";
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("connection") {
                let v = v.trim();
                if v.eq_ignore_ascii_case("close") {
                    close = true;
                } else if v.eq_ignore_ascii_case("keep-alive") {
                    close = false;
                }
            }
        } else {
            return simple(c, 400, "Bad Request", "malformed header\n", true);
        }
    }
    if method != "GET" && method != "HEAD" {
        c.out.extend_from_slice(b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\nServer: flowstack\r\n\r\n");
        c.close_after |= close;
        return;
    }
    let path = match resolve(root, target) {
        Ok(p) => p,
        Err(400) => return simple(c, 400, "Bad Request", "bad path\n", close),
        Err(_) => return simple(c, 404, "Not Found", "not found\n", close),
    };
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(_) => return simple(c, 404, "Not Found", "not found\n", close),
    };
    let len = match file.metadata() {
        Ok(m) if m.is_file() => m.len(),
        _ => return simple(c, 404, "Not Found", "not found\n", close),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_escape_the_root_are_refused() {
        let dir = std::env::temp_dir().join(format!("fs-serve-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/a.txt"), b"x").unwrap();
        let root = dir.canonicalize().unwrap();
        assert!(resolve(&root, "/sub/a.txt").is_ok());
        assert!(resolve(&root, "/sub/%61.txt").is_ok());
        assert_eq!(resolve(&root, "/../etc/passwd"), Err(400));
        assert_eq!(resolve(&root, "/sub/%2e%2e/%2e%2e/etc/passwd"), Err(400));
        assert_eq!(resolve(&root, "/nope"), Err(404));
        assert_eq!(resolve(&root, "relative"), Err(400));
        assert_eq!(resolve(&root, "/a%00b"), Err(400));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
