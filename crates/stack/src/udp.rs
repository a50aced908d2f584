//! UDP sockets: a port table and bounded per-socket receive queues.

use crate::SocketError;
use flowstack_wire::Ipv4Address;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;

/// UDP limits.
#[derive(Debug, Clone, Copy)]
pub struct UdpConfig {
    /// Most open UDP sockets.
    pub max_sockets: usize,
    /// Bytes of payload a socket's receive queue holds before new datagrams are dropped.
    pub rcvbuf: usize,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self {
            max_sockets: 1024,
            rcvbuf: 256 * 1024,
        }
    }
}

pub use flowstack_api::UdpHandle;

#[derive(Debug, Default)]
struct UdpSock {
    port: u16,
    queue: VecDeque<(SocketAddrV4, Vec<u8>)>,
    queued_bytes: usize,
    /// Error reported by ICMP (e.g. port unreachable), returned once by the next call.
    error: Option<SocketError>,
}

/// The UDP socket table.
#[derive(Debug)]
pub(crate) struct UdpTable {
    cfg: UdpConfig,
    socks: Vec<Option<UdpSock>>,
    /// Bound port → slot in `socks`.
    ports: HashMap<u16, usize>,
    /// Spent datagram buffers, reused for the next deliveries.
    pool: Vec<Vec<u8>>,
}

/// Result of delivering a datagram.
pub(crate) enum Delivery {
    Delivered,
    NoPort,
    QueueFull,
}

impl UdpTable {
    pub fn new(cfg: UdpConfig) -> Self {
        Self {
            cfg,
            socks: Vec::new(),
            ports: HashMap::new(),
            pool: Vec::new(),
        }
    }

    pub fn bind(&mut self, port: u16) -> Result<UdpHandle, SocketError> {
        if self.ports.contains_key(&port) {
            return Err(SocketError::AddrInUse);
        }
        if self.ports.len() >= self.cfg.max_sockets {
            return Err(SocketError::LimitReached);
        }
        let sock = UdpSock {
            port,
            ..Default::default()
        };
        let idx = match self.socks.iter().position(Option::is_none) {
            Some(i) => {
                self.socks[i] = Some(sock);
                i
            }
            None => {
                self.socks.push(Some(sock));
                self.socks.len() - 1
            }
        };
        self.ports.insert(port, idx);
        Ok(UdpHandle::from_raw(idx))
    }

    fn get(&mut self, h: UdpHandle) -> Result<&mut UdpSock, SocketError> {
        self.socks
            .get_mut(h.index())
            .and_then(Option::as_mut)
            .ok_or(SocketError::InvalidHandle)
    }

    /// True if a socket is bound to `port`.
    #[inline]
    pub fn is_bound(&self, port: u16) -> bool {
        self.ports.contains_key(&port)
    }

    /// The port a socket is bound to.
    pub fn local_port(&mut self, h: UdpHandle) -> Result<u16, SocketError> {
        Ok(self.get(h)?.port)
    }

    /// True if a datagram (or an error) is waiting; false for a handle that is not open.
    pub fn readable(&mut self, h: UdpHandle) -> bool {
        self.get(h)
            .map(|s| !s.queue.is_empty() || s.error.is_some())
            .unwrap_or(false)
    }

    /// Records an error (reported by ICMP) on the socket bound to `port`, if any; its next
    /// receive returns it once.
    pub fn report_error(&mut self, port: u16, e: SocketError) {
        if let Some(&idx) = self.ports.get(&port) {
            if let Some(s) = self.socks[idx].as_mut() {
                s.error = Some(e);
            }
        }
    }

    pub fn close(&mut self, h: UdpHandle) -> Result<(), SocketError> {
        let s = self
            .socks
            .get_mut(h.index())
            .and_then(Option::take)
            .ok_or(SocketError::InvalidHandle)?;
        self.ports.remove(&s.port);
        self.pool.extend(s.queue.into_iter().map(|(_, b)| b));
        Ok(())
    }

    pub fn deliver(&mut self, src: Ipv4Address, sport: u16, dport: u16, data: &[u8]) -> Delivery {
        let Some(&idx) = self.ports.get(&dport) else {
            return Delivery::NoPort;
        };
        let rcvbuf = self.cfg.rcvbuf;
        let mut buf = self.pool.pop().unwrap_or_default();
        let s = self.socks[idx].as_mut().expect("port maps to open socket");
        if s.queued_bytes + data.len() > rcvbuf {
            self.pool.push(buf);
            return Delivery::QueueFull;
        }
        buf.clear();
        buf.extend_from_slice(data);
        s.queued_bytes += data.len();
        s.queue
            .push_back((SocketAddrV4::new(src.into(), sport), buf));
        Delivery::Delivered
    }

    /// Shows the next datagram to `take`; it is dequeued only if `take` returns true.
    /// `Ok(false)`: left queued (or none: `WouldBlock`). A pending error comes first.
    pub fn take_with(
        &mut self,
        h: UdpHandle,
        take: impl FnOnce(SocketAddrV4, &[u8]) -> bool,
    ) -> Result<bool, SocketError> {
        let s = self.get(h)?;
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        let Some((from, data)) = s.queue.front() else {
            return Err(SocketError::WouldBlock);
        };
        if !take(*from, data) {
            return Ok(false);
        }
        let (_, buf) = s.queue.pop_front().expect("front exists");
        s.queued_bytes -= buf.len();
        self.pool.push(buf);
        Ok(true)
    }

    pub fn recv(
        &mut self,
        h: UdpHandle,
        out: &mut [u8],
    ) -> Result<(usize, SocketAddrV4), SocketError> {
        let s = self.get(h)?;
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        let Some((from, data)) = s.queue.front() else {
            return Err(SocketError::WouldBlock);
        };
        // Never truncate silently: a short buffer gets an error and the datagram stays queued.
        if data.len() > out.len() {
            return Err(SocketError::BufferTooSmall { needed: data.len() });
        }
        let (n, from) = (data.len(), *from);
        out[..n].copy_from_slice(data);
        let (_, buf) = s.queue.pop_front().expect("front exists");
        s.queued_bytes -= n;
        self.pool.push(buf);
        Ok((n, from))
    }
}
