//! The daemon-wide UDP port namespace (separate from TCP's, as in the kernel: TCP port 53 and
//! UDP port 53 are two ports), shared by every engine thread.
//!
//! UDP sockets live on the loopback engine (127.0.0.0/8) of their engine thread, which keeps
//! one socket per port, so a port is held by at most one socket daemon-wide: a second bind
//! of a port (any 127/8 address or 0.0.0.0) is `EADDRINUSE`, with or without
//! `SO_REUSEADDR`/`SO_REUSEPORT` (Linux would let sockets that both set one of them share
//! it; not carried yet, see README "Unmodified programs").
//!
//! As for TCP ([`crate::ports`]): the map is behind a mutex taken only on the control path
//! (bind, close, a carries question); where a datagram goes is one atomic byte per port
//! ([`UdpPorts::route`]), read for every UDP frame an engine transmits on the loopback.

use flowstack_api::SocketError;
use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// Port → (engine, socket id), and the next ephemeral port to try.
type Map = (HashMap<u16, (usize, u32)>, u16);

/// The UDP port namespace.
pub struct UdpPorts {
    map: Mutex<Map>,
    route: Box<[AtomicU8]>,
    range: RangeInclusive<u16>,
}

impl std::fmt::Debug for UdpPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpPorts")
            .field("range", &self.range)
            .finish()
    }
}

impl UdpPorts {
    /// A namespace whose ephemeral ports (`bind(0)`, the first `sendto` of an unbound
    /// socket) come from `range`.
    pub fn new(range: RangeInclusive<u16>) -> Self {
        Self {
            map: Mutex::new((HashMap::new(), *range.start())),
            route: (0..=u16::MAX as usize).map(|_| AtomicU8::new(0)).collect(),
            range,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        // Every update is one insert or remove plus the route byte: usable after a panic.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Binds socket `gid` of `engine` to `port` (0: an ephemeral one); returns the port.
    pub fn bind(&self, engine: usize, gid: u32, port: u16) -> Result<u16, SocketError> {
        let mut m = self.lock();
        let port = if port == 0 {
            let (a, b) = (*self.range.start(), *self.range.end());
            let span = (b - a) as u32 + 1;
            let mut p = m.1.clamp(a, b);
            let mut found = None;
            for _ in 0..span {
                let next = if p == b { a } else { p + 1 };
                if !m.0.contains_key(&p) {
                    found = Some(p);
                    m.1 = next;
                    break;
                }
                p = next;
            }
            found.ok_or(SocketError::AddrInUse)?
        } else {
            port
        };
        if m.0.contains_key(&port) {
            return Err(SocketError::AddrInUse);
        }
        m.0.insert(port, (engine, gid));
        self.route[port as usize].store(engine as u8 + 1, Ordering::Release);
        Ok(port)
    }

    /// Releases `port` if socket `gid` holds it.
    pub fn release(&self, gid: u32, port: u16) {
        let mut m = self.lock();
        if m.0.get(&port).is_some_and(|&(_, g)| g == gid) {
            m.0.remove(&port);
            self.route[port as usize].store(0, Ordering::Release);
        }
    }

    /// True if a UDP socket holds `port` (datagrams to it on the loopback are carried).
    pub fn bound(&self, port: u16) -> bool {
        self.lock().0.contains_key(&port)
    }

    /// The engine whose socket holds `port`, if any (lock-free: the per-frame path).
    #[inline]
    pub fn route(&self, port: u16) -> Option<usize> {
        match self.route[port as usize].load(Ordering::Acquire) {
            0 => None,
            v => Some(v as usize - 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_socket_per_port_and_ephemeral_ports_skip_held_ones() {
        let t = UdpPorts::new(40000..=40002);
        assert_eq!(t.bind(0, 1, 40000), Ok(40000));
        assert_eq!(t.bind(1, 2, 40000), Err(SocketError::AddrInUse));
        assert_eq!(t.route(40000), Some(0));
        assert_eq!(t.bind(1, 3, 0), Ok(40001));
        assert_eq!(t.route(40001), Some(1));
        assert_eq!(t.bind(0, 4, 0), Ok(40002));
        assert_eq!(t.bind(0, 5, 0), Err(SocketError::AddrInUse));
        t.release(99, 40000); // not its holder: kept
        assert!(t.bound(40000));
        t.release(1, 40000);
        assert!(!t.bound(40000));
        assert_eq!(t.route(40000), None);
        assert_eq!(t.bind(0, 5, 0), Ok(40000));
    }
}
