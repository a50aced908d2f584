//! Servers: static HTTP/1.1 files, echo and sink, behind one listener.
//!
//! A [`Server`] listens on one port, accepts every waiting connection on each turn and
//! advances each as far as its buffers allow: the HTTP service streams files (never loaded
//! whole, except small ones kept in its [`FileCache`]) as the send buffer drains, echo sends
//! back what it reads, sink discards it.
//! Nothing blocks; the drive loop sleeps when a turn moved nothing.

mod files;
mod http;

pub use files::{
    content_type, resolve, CachedFile, FileCache, FILE_CACHE_ENTRIES, FILE_CACHE_VALID, SMALL_FILE,
};

use flowstack_api::app::{App, Progress};
use flowstack_api::{SocketError, Sockets, TcpHandle};
use flowstack_wire::Instant;
use std::fmt;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

/// Largest request head the HTTP service waits for; a longer incomplete head is answered
/// with 400.
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// Bytes read per socket call.
const CHUNK: usize = 256 * 1024;

/// What a [`Server`] does with its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Service {
    /// HTTP/1.1 GET and HEAD of the files under `root`: keep-alive, Content-Length, streamed
    /// bodies, 400/404/405, paths escaping the root refused.
    Http {
        /// Directory served.
        root: PathBuf,
    },
    /// Sends back every byte received.
    Echo,
    /// Discards every byte received.
    Sink,
}

impl Service {
    /// `http`, `echo` or `sink`.
    pub fn name(&self) -> &'static str {
        match self {
            Service::Http { .. } => "http",
            Service::Echo => "echo",
            Service::Sink => "sink",
        }
    }
}

/// What to serve and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeSpec {
    /// The service.
    pub service: Service,
    /// TCP port to listen on.
    pub port: u16,
    /// Established connections waiting for accept.
    pub backlog: usize,
}

/// Why a server could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeError {
    /// The HTTP root is not a directory (or cannot be resolved).
    NotADirectory(PathBuf),
    /// The port could not be listened on.
    Listen {
        /// The port.
        port: u16,
        /// Why.
        error: SocketError,
    },
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::NotADirectory(p) => write!(f, "{} is not a directory", p.display()),
            ServeError::Listen { port, error } => write!(f, "listen on port {port}: {error}"),
        }
    }
}

impl std::error::Error for ServeError {}

/// What a server has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Connections accepted.
    pub conns: u64,
    /// HTTP requests answered (including 4xx answers to malformed requests).
    pub requests: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes queued for sending.
    pub bytes_out: u64,
}

/// One connection's state (the fields each service uses).
#[derive(Debug)]
struct Conn {
    h: TcpHandle,
    /// Received bytes not yet used.
    inbuf: Vec<u8>,
    /// Bytes to send; `out[out_off..]` is still unsent.
    out: Vec<u8>,
    out_off: usize,
    /// HTTP: the body being sent, straight from the file ([`Sockets::send_file`]).
    file: Option<FileBody>,
    /// HTTP: close once the current response is out.
    close_after: bool,
    /// Finished: close and forget.
    done: bool,
}

/// A file body (or a range of one) being sent.
#[derive(Debug)]
struct FileBody {
    file: Arc<File>,
    /// Next file offset to send.
    offset: u64,
    /// Bytes of the body left.
    left: u64,
}

impl Conn {
    fn new(h: TcpHandle) -> Self {
        Self {
            h,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_off: 0,
            file: None,
            close_after: false,
            done: false,
        }
    }
}

/// A listener and its connections, run by any drive loop as an [`App`].
#[derive(Debug)]
pub struct Server {
    listener: TcpHandle,
    port: u16,
    service: Service,
    conns: Vec<Conn>,
    totals: Totals,
    buf: Vec<u8>,
    /// HTTP: the open files answered from.
    files: Option<FileCache>,
}

impl Server {
    /// Listens for `spec`. An HTTP root must be a directory; it is served by its canonical
    /// path, against which every request's path is checked.
    pub fn listen<S: Sockets + ?Sized>(
        sockets: &mut S,
        spec: ServeSpec,
    ) -> Result<Self, ServeError> {
        let service = match spec.service {
            Service::Http { root } => {
                let canon = root
                    .canonicalize()
                    .ok()
                    .filter(|p| p.is_dir())
                    .ok_or(ServeError::NotADirectory(root))?;
                Service::Http { root: canon }
            }
            s => s,
        };
        let listener = sockets
            .tcp_listen(spec.port, spec.backlog)
            .map_err(|error| ServeError::Listen {
                port: spec.port,
                error,
            })?;
        Ok(Self {
            listener,
            port: spec.port,
            conns: Vec::new(),
            totals: Totals::default(),
            buf: vec![0; CHUNK],
            files: match &service {
                Service::Http { root } => Some(FileCache::new(
                    root.clone(),
                    FILE_CACHE_ENTRIES,
                    FILE_CACHE_VALID,
                )),
                _ => None,
            },
            service,
        })
    }

    /// What the server has done so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The service (an HTTP root is its canonical path).
    pub fn service(&self) -> &Service {
        &self.service
    }

    /// The port listened on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// HTTP: the file cache (see [`FileCache`]).
    pub fn file_cache(&self) -> Option<&FileCache> {
        self.files.as_ref()
    }

    /// HTTP: replaces the file cache's bounds (`capacity` 0: open the file on every request).
    pub fn set_file_cache(&mut self, capacity: usize, valid: std::time::Duration) {
        if let Service::Http { root } = &self.service {
            self.files = Some(FileCache::new(root.clone(), capacity, valid));
        }
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    /// Closes the listener and every connection (gracefully, in the background).
    pub fn close<S: Sockets + ?Sized>(&mut self, sockets: &mut S) {
        for c in self.conns.drain(..) {
            let _ = sockets.tcp_close(c.h);
        }
        let _ = sockets.tcp_close(self.listener);
    }
}

impl<S: Sockets + ?Sized> App<S> for Server {
    fn poll(&mut self, _now: Instant, s: &mut S) -> Progress {
        let mut moved = false;
        while let Ok(h) = s.tcp_accept(self.listener) {
            self.totals.conns += 1;
            let _ = s.tcp_set_nodelay(h, true);
            tracing::debug!(conn = h.index(), port = self.port, "connection accepted");
            self.conns.push(Conn::new(h));
            moved = true;
        }
        let Self {
            service,
            conns,
            totals,
            buf,
            files,
            ..
        } = self;
        for c in conns.iter_mut() {
            moved |= match (&*service, files.as_mut()) {
                (Service::Http { .. }, Some(files)) => http::step(s, c, files, buf, totals),
                (Service::Echo, _) => echo_step(s, c, buf, totals),
                _ => sink_step(s, c, buf, totals),
            };
            if c.done {
                tracing::debug!(conn = c.h.index(), "connection closed");
                let _ = s.tcp_close(c.h);
            }
        }
        conns.retain(|c| !c.done);
        if moved {
            Progress::Busy
        } else {
            Progress::Idle
        }
    }
}

/// Queues as much of `c.out` as the send buffer takes. Returns true if bytes moved.
fn flush_out<S: Sockets + ?Sized>(s: &mut S, c: &mut Conn, t: &mut Totals) -> bool {
    let mut moved = false;
    while c.out_off < c.out.len() {
        match s.tcp_send(c.h, &c.out[c.out_off..]) {
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

/// Reads whatever arrived into `c.inbuf` (stopping once it holds four request heads' worth).
/// Returns (moved, end of stream or error).
fn read_in<S: Sockets + ?Sized>(
    s: &mut S,
    c: &mut Conn,
    buf: &mut [u8],
    t: &mut Totals,
) -> (bool, bool) {
    let mut moved = false;
    loop {
        match s.tcp_recv(c.h, buf) {
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

fn echo_step<S: Sockets + ?Sized>(s: &mut S, c: &mut Conn, buf: &mut [u8], t: &mut Totals) -> bool {
    let mut moved = flush_out(s, c, t);
    if c.out.is_empty() {
        let (m, eof) = read_in(s, c, buf, t);
        moved |= m;
        std::mem::swap(&mut c.out, &mut c.inbuf);
        moved |= flush_out(s, c, t);
        if eof && c.out.is_empty() {
            c.done = true;
        }
    }
    moved
}

fn sink_step<S: Sockets + ?Sized>(s: &mut S, c: &mut Conn, buf: &mut [u8], t: &mut Totals) -> bool {
    let (moved, eof) = read_in(s, c, buf, t);
    c.inbuf.clear();
    c.done |= eof;
    moved
}
