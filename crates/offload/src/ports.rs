//! The daemon-wide TCP port namespace of every address the daemon owns (127.0.0.0/8 and the
//! link's), shared by every engine thread (and the placeholder identities, so an attach
//! knows which engine holds the socket).
//!
//! # Who may bind an address and port (as Linux's `inet_csk_bind_conflict`)
//! A port holds a list of bindings, each an (address, socket) with the socket's
//! `SO_REUSEADDR`, `SO_REUSEPORT` and effective uid ([`BindOpts`]). Addresses are 0.0.0.0
//! (every address), the loopback (any 127/8 address is one address here: the loopback
//! engine's listener on a port takes the whole prefix, as Linux's `lo` owns it) or the
//! link's. Two bindings of a port conflict (`EADDRINUSE`) when their addresses overlap
//! (equal, or either is 0.0.0.0) unless
//! - both set `SO_REUSEPORT` and have the same effective uid — socket(7): "all of the
//!   sockets (including the first socket) set this option ... and ... the same effective
//!   UID" — a *reuseport group*, whose listeners share the port's connections
//!   (`app/reuse.rs`); or
//! - both set `SO_REUSEADDR` and the one bound first does not listen (socket(7): "unless
//!   there is an active listening socket bound to the address"); a listen then still
//!   conflicts with another listener on an overlapping address
//!   ([`PortTable::set_listening`]).
//!
//! So 127.0.0.1:80 and the link's 10.x:80 coexist, 0.0.0.0:80 conflicts with both.
//! `bind(0)` picks a port nobody holds on any address, so its 4-tuples never meet another
//! socket's.
//!
//! Two views of one table:
//! - **Who may bind** ([`PortTable::bind`], [`PortTable::release`], …): a map behind a mutex,
//!   taken only on the control path of a socket (bind, listen, an ephemeral port for
//!   connect, accept, close) — never per frame. Conflicts (`EADDRINUSE`) and ephemeral ports
//!   are therefore daemon-wide: two engines never hand out the same port.
//! - **Where a frame goes** ([`PortTable::route`]): one atomic byte per port, the engine that
//!   owns it plus one (0: nobody). Engines read it for every TCP frame they transmit on the
//!   loopback, without a lock; it is written only under the mutex, in the same critical
//!   section as the map.
//!
//! # Who owns a port
//! - A port bound (or listening) is owned by the binder's engine; the connections accepted
//!   on it live there too and hold it: a listener closed while connections it accepted live
//!   on leaves the port to them, another engine's bind is refused until they are gone (as
//!   Linux refuses it without `SO_REUSEADDR`), the same engine may bind it again.
//! - With several engines, the ports of `connect` without `bind` come from a fixed slice of
//!   [`CONNECT_PORTS`] per engine ([`PortTable::connect_slice`]): the engine's own allocator
//!   picks them (4-tuple and TIME-WAIT aware, no lock per connect), their route is fixed, and
//!   no other engine may bind them (`EADDRINUSE`). `bind(0)` and `listen` without `bind`
//!   then draw from the rest of the ephemeral range ([`EPHEMERAL_SHARED`]), so the two kinds
//!   never collide. With one engine nothing is sliced (the behaviour of a one-engine daemon
//!   is unchanged).
//! - A released port keeps its last route until another engine binds it: the connections of
//!   a closed socket that are still closing (FIN exchange, TIME-WAIT) keep receiving their
//!   segments, and a SYN to the closed port still gets its RST from an engine without a
//!   listener there.
//!
//! Release is synchronous: when [`PortTable::release`] returns, the port is free for every
//! engine — the caller posts the close's completion only afterwards, so an application told
//! "closed" can have another process bind the port at once, on any engine.

use flowstack_api::SocketError;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// Most engines a daemon runs (the route table stores engine + 1 in a byte).
pub const MAX_ENGINES: usize = 64;
/// With several engines: the ports of `connect` without `bind`, sliced between the engines.
pub const CONNECT_PORTS: RangeInclusive<u16> = 49152..=65535;
/// With several engines: the ports of `bind(0)` and of `listen` without `bind`.
pub const EPHEMERAL_SHARED: RangeInclusive<u16> = 32768..=49151;

/// How a socket binds: its `SO_REUSEADDR`, `SO_REUSEPORT` and effective uid (its
/// application's, from `SO_PEERCRED`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BindOpts {
    /// `SO_REUSEADDR`.
    pub reuse_addr: bool,
    /// `SO_REUSEPORT`.
    pub reuse_port: bool,
    /// Effective uid of the binding process.
    pub uid: u32,
}

impl BindOpts {
    /// From `Command::Bind`'s `flags` and the application's uid.
    pub fn new(flags: u8, uid: u32) -> Self {
        use flowstack_api::record::{BIND_REUSEADDR, BIND_REUSEPORT};
        Self {
            reuse_addr: flags & BIND_REUSEADDR != 0,
            reuse_port: flags & BIND_REUSEPORT != 0,
            uid,
        }
    }
}

/// The address a binding holds in the table: 0.0.0.0, the loopback (every 127/8 address
/// is 127.0.0.1 here, see the module docs) or a link address.
pub fn table_addr(ip: Ipv4Addr) -> Ipv4Addr {
    if ip.octets()[0] == 127 {
        Ipv4Addr::LOCALHOST
    } else {
        ip
    }
}

fn overlap(a: Ipv4Addr, b: Ipv4Addr) -> bool {
    a == b || a.is_unspecified() || b.is_unspecified()
}

#[derive(Debug)]
struct Binding {
    addr: Ipv4Addr,
    gid: u32,
    opts: BindOpts,
    /// It listens (connections to it are "carried").
    listening: bool,
}

impl Binding {
    /// Both in one reuseport group (socket(7): both set it, same effective uid).
    fn shares_port(&self, o: &BindOpts) -> bool {
        self.opts.reuse_port && o.reuse_port && self.opts.uid == o.uid
    }
}

#[derive(Debug, Default)]
struct Entry {
    engine: usize,
    /// The sockets bound to the port on `engine`.
    binds: Vec<Binding>,
    /// Connections accepted on the port that still live on `engine`.
    accepted: u32,
}

#[derive(Debug, Default)]
struct Map {
    ports: HashMap<u16, Entry>,
    next: u16,
}

/// The port namespace (see the module docs).
pub struct PortTable {
    map: Mutex<Map>,
    /// Placeholder identity (device, inode) → the engine of its socket: an attach on another
    /// engine is refused (and counted) instead of looking like an unknown descriptor.
    idents: Mutex<HashMap<(u64, u64), usize>>,
    route: Box<[AtomicU8]>,
    range: RangeInclusive<u16>,
    engines: usize,
    /// The UDP namespace (separate from TCP's).
    pub udp: crate::udp_ports::UdpPorts,
}

impl std::fmt::Debug for PortTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortTable")
            .field("range", &self.range)
            .finish()
    }
}

impl PortTable {
    /// The table of a daemon with `engines` engines; with one, `bind(0)` draws from `range`
    /// (with several, from [`EPHEMERAL_SHARED`]).
    pub fn new(range: RangeInclusive<u16>, engines: usize) -> Self {
        let engines = engines.clamp(1, MAX_ENGINES);
        let range = if engines > 1 { EPHEMERAL_SHARED } else { range };
        let t = Self {
            map: Mutex::new(Map {
                ports: HashMap::new(),
                next: *range.start(),
            }),
            idents: Mutex::new(HashMap::new()),
            route: (0..=u16::MAX as usize).map(|_| AtomicU8::new(0)).collect(),
            range: range.clone(),
            engines,
            udp: crate::udp_ports::UdpPorts::new(range),
        };
        if engines > 1 {
            for e in 0..engines {
                let (a, b) = t.connect_slice(e);
                for p in a..=b {
                    t.set_route(p, Some(e));
                }
            }
        }
        t
    }

    /// The ports engine `engine` connects from (first, last), with several engines.
    pub fn connect_slice(&self, engine: usize) -> (u16, u16) {
        let (first, last) = (
            *CONNECT_PORTS.start() as usize,
            *CONNECT_PORTS.end() as usize,
        );
        let per = (last - first + 1) / self.engines;
        let a = first + engine * per;
        let b = if engine + 1 == self.engines {
            last
        } else {
            a + per - 1
        };
        (a as u16, b as u16)
    }

    /// The engine whose connect slice holds `port` (several engines only).
    fn slice_owner(&self, port: u16) -> Option<usize> {
        if self.engines == 1 || !CONNECT_PORTS.contains(&port) {
            return None;
        }
        (0..self.engines).find(|&e| {
            let (a, b) = self.connect_slice(e);
            (a..=b).contains(&port)
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        // A panic elsewhere cannot leave the map half-written (every update is one insert or
        // remove plus the route byte), so a poisoned lock is still usable.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_route(&self, port: u16, engine: Option<usize>) {
        let v = engine.map_or(0, |e| e as u8 + 1);
        self.route[port as usize].store(v, Ordering::Release);
    }

    /// The engine that owns `port`, if any (lock-free: the per-frame path).
    #[inline]
    pub fn route(&self, port: u16) -> Option<usize> {
        match self.route[port as usize].load(Ordering::Acquire) {
            0 => None,
            v => Some(v as usize - 1),
        }
    }

    /// The sockets (engine, id) bound to `port`, on any address.
    pub fn holders(&self, port: u16) -> Vec<(usize, u32)> {
        let m = self.lock();
        m.ports
            .get(&port)
            .map(|e| e.binds.iter().map(|b| (e.engine, b.gid)).collect())
            .unwrap_or_default()
    }

    /// True if a listener holds `port` on an address that covers `ip` (connections to it
    /// are carried by the daemon).
    pub fn listening(&self, ip: Ipv4Addr, port: u16) -> bool {
        let ip = table_addr(ip);
        self.lock().ports.get(&port).is_some_and(|e| {
            e.binds
                .iter()
                .any(|b| b.listening && (b.addr == ip || b.addr.is_unspecified()))
        })
    }

    /// Binds socket `gid` of `engine` to `ip`:`port` (port 0: an ephemeral one, free on
    /// every address); returns the port. `EADDRINUSE` on a conflict (module docs), or when
    /// another engine holds the port (its route is one byte per port).
    pub fn bind(
        &self,
        engine: usize,
        gid: u32,
        ip: Ipv4Addr,
        port: u16,
        opts: BindOpts,
    ) -> Result<u16, SocketError> {
        let mut m = self.lock();
        let port = match port {
            0 => self.ephemeral(&mut m)?,
            p => p,
        };
        if self.slice_owner(port).is_some_and(|o| o != engine) {
            return Err(SocketError::AddrInUse); // another engine connects from it
        }
        let addr = table_addr(ip);
        let b = Binding {
            addr,
            gid,
            opts,
            listening: false,
        };
        match m.ports.get_mut(&port) {
            None => {
                m.ports.insert(
                    port,
                    Entry {
                        engine,
                        binds: vec![b],
                        accepted: 0,
                    },
                );
                self.set_route(port, Some(engine));
            }
            // Only accepted connections left, or bindings that allow this one, on the same
            // engine (routes stay right).
            Some(e) if e.engine == engine => {
                let clash = e.binds.iter().any(|o| {
                    overlap(o.addr, addr)
                        && !o.shares_port(&opts)
                        && !(opts.reuse_addr && o.opts.reuse_addr && !o.listening)
                });
                if clash {
                    return Err(SocketError::AddrInUse);
                }
                e.binds.push(b);
            }
            Some(_) => return Err(SocketError::AddrInUse),
        }
        Ok(port)
    }

    /// Ports in the table (bound, listening, or held by accepted connections).
    pub fn entries(&self) -> usize {
        self.lock().ports.len()
    }

    fn ephemeral(&self, m: &mut Map) -> Result<u16, SocketError> {
        let (first, last) = (*self.range.start(), *self.range.end());
        let span = (last - first) as u32 + 1;
        for _ in 0..span {
            let p = m.next;
            m.next = if p >= last || p < first { first } else { p + 1 };
            if (first..=last).contains(&p) && !m.ports.contains_key(&p) {
                return Ok(p);
            }
        }
        Err(SocketError::AddrInUse)
    }

    /// Socket `gid` bound to `port` starts listening: `EADDRINUSE` if another socket
    /// listens on an overlapping address outside its reuseport group (two `SO_REUSEADDR`
    /// sockets may share a bind, not a listen).
    pub fn set_listening(&self, port: u16, gid: u32) -> Result<(), SocketError> {
        let mut m = self.lock();
        let Some(e) = m.ports.get_mut(&port) else {
            return Ok(());
        };
        let Some(me) = e.binds.iter().position(|b| b.gid == gid) else {
            return Ok(());
        };
        let (addr, opts) = (e.binds[me].addr, e.binds[me].opts);
        let clash =
            e.binds.iter().enumerate().any(|(i, o)| {
                i != me && o.listening && overlap(o.addr, addr) && !o.shares_port(&opts)
            });
        if clash {
            return Err(SocketError::AddrInUse);
        }
        e.binds[me].listening = true;
        Ok(())
    }

    /// The socket `gid` bound to `port` set `SO_REUSEPORT` (its listen joins or starts a
    /// reuseport group); its address in the table.
    pub fn reuse_port(&self, port: u16, gid: u32) -> Option<Ipv4Addr> {
        let m = self.lock();
        let b = m.ports.get(&port)?.binds.iter().find(|b| b.gid == gid)?;
        b.opts.reuse_port.then_some(b.addr)
    }

    /// A connection was accepted on `port` of `engine` (held until
    /// [`PortTable::release_accepted`]); false if the port is not `engine`'s.
    pub fn hold_accepted(&self, engine: usize, port: u16) -> bool {
        match self.lock().ports.get_mut(&port) {
            Some(e) if e.engine == engine => {
                e.accepted += 1;
                true
            }
            _ => false,
        }
    }

    /// Records that the placeholder `ident` names a socket of `engine`; false if it already
    /// names one (anywhere).
    pub fn claim_ident(&self, ident: (u64, u64), engine: usize) -> bool {
        let mut m = self.idents.lock().unwrap_or_else(|p| p.into_inner());
        match m.entry(ident) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(engine);
                true
            }
        }
    }

    /// The engine whose socket the placeholder `ident` names.
    pub fn ident_engine(&self, ident: (u64, u64)) -> Option<usize> {
        let m = self.idents.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&ident).copied()
    }

    /// The placeholder `ident` names nothing any more.
    pub fn forget_ident(&self, ident: (u64, u64)) {
        let mut m = self.idents.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(&ident);
    }

    /// Releases the binding of socket `gid` of `engine` to `port` (nothing if it is not the
    /// holder). When this returns, every engine may bind the port (unless connections
    /// accepted on it still live).
    pub fn release(&self, engine: usize, gid: u32, port: u16) {
        let mut m = self.lock();
        let Some(e) = m.ports.get_mut(&port) else {
            return;
        };
        if e.engine != engine {
            return;
        }
        e.binds.retain(|b| b.gid != gid);
        if e.accepted == 0 && e.binds.is_empty() {
            m.ports.remove(&port); // the route stays (see the module docs)
        }
    }

    /// A connection accepted on `port` of `engine` is gone.
    pub fn release_accepted(&self, engine: usize, port: u16) {
        let mut m = self.lock();
        let Some(e) = m.ports.get_mut(&port) else {
            return;
        };
        if e.engine != engine || e.accepted == 0 {
            return;
        }
        e.accepted -= 1;
        if e.accepted == 0 && e.binds.is_empty() {
            m.ports.remove(&port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANY: Ipv4Addr = Ipv4Addr::UNSPECIFIED;
    const NONE: BindOpts = BindOpts {
        reuse_addr: false,
        reuse_port: false,
        uid: 1000,
    };

    #[test]
    fn conflicts_are_daemon_wide_and_release_is_immediate() {
        let t = PortTable::new(40000..=40002, 2);
        assert_eq!(t.route(80), None);
        assert_eq!(t.bind(0, 1, ANY, 80, NONE), Ok(80));
        assert_eq!(t.route(80), Some(0));
        assert_eq!(t.bind(1, 7, ANY, 80, NONE), Err(SocketError::AddrInUse));
        t.release(1, 7, 80); // not the holder: nothing
        assert_eq!(t.bind(1, 7, ANY, 80, NONE), Err(SocketError::AddrInUse));
        t.release(0, 1, 80);
        assert_eq!(t.route(80), Some(0), "a released port keeps its route");
        assert_eq!(t.bind(1, 7, ANY, 80, NONE), Ok(80));
        assert_eq!(t.route(80), Some(1));
    }

    #[test]
    fn ephemeral_ports_never_collide_and_run_out_cleanly() {
        let t = PortTable::new(40000..=40002, 1);
        let mut got: Vec<u16> = (0..3)
            .map(|i| t.bind(0, i as u32, ANY, 0, NONE).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, vec![40000, 40001, 40002]);
        assert_eq!(t.bind(0, 9, ANY, 0, NONE), Err(SocketError::AddrInUse));
        // Several engines: bind(0) stays out of the connect slices, which are disjoint,
        // cover CONNECT_PORTS, are routed to their engine and bound only by it.
        let t = PortTable::new(40000..=40002, 3);
        for i in 0..100 {
            let p = t.bind(i % 3, i as u32, ANY, 0, NONE).unwrap();
            assert!(EPHEMERAL_SHARED.contains(&p), "{p}");
        }
        let s: Vec<_> = (0..3).map(|e| t.connect_slice(e)).collect();
        assert_eq!(s[0].0, *CONNECT_PORTS.start());
        assert_eq!(s[2].1, *CONNECT_PORTS.end());
        assert_eq!(s[0].1 + 1, s[1].0);
        assert_eq!(s[1].1 + 1, s[2].0);
        assert_eq!(t.route(s[1].0), Some(1));
        assert_eq!(
            t.bind(0, 1000, ANY, s[1].0, NONE),
            Err(SocketError::AddrInUse)
        );
        assert_eq!(t.bind(1, 1000, ANY, s[1].0, NONE), Ok(s[1].0));
    }

    #[test]
    fn accepted_connections_keep_the_route_of_a_closed_listener() {
        let t = PortTable::new(40000..=40002, 2);
        t.bind(0, 1, ANY, 80, NONE).unwrap();
        t.set_listening(80, 1).unwrap();
        assert!(t.listening(Ipv4Addr::LOCALHOST, 80));
        assert!(t.hold_accepted(0, 80));
        assert!(!t.hold_accepted(1, 80));
        t.release(0, 1, 80);
        assert!(!t.listening(Ipv4Addr::LOCALHOST, 80));
        assert_eq!(t.route(80), Some(0), "the accepted connection still lives");
        assert_eq!(t.bind(1, 2, ANY, 80, NONE), Err(SocketError::AddrInUse));
        assert_eq!(
            t.bind(0, 3, ANY, 80, NONE),
            Ok(80),
            "same engine: free to bind again"
        );
        t.release(0, 3, 80);
        t.release_accepted(0, 80);
        assert_eq!(t.bind(1, 2, ANY, 80, NONE), Ok(80));
        assert_eq!(t.route(80), Some(1));
    }

    const RP: BindOpts = BindOpts {
        reuse_addr: false,
        reuse_port: true,
        uid: 1000,
    };
    const LO: Ipv4Addr = Ipv4Addr::LOCALHOST;
    const LINK: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    /// socket(7) SO_REUSEPORT: every socket sets it and has the same effective uid.
    #[test]
    fn reuseport_groups_need_the_flag_on_all_and_one_uid() {
        let t = PortTable::new(40000..=40002, 1);
        assert_eq!(t.bind(0, 1, ANY, 80, RP), Ok(80));
        assert_eq!(t.set_listening(80, 1), Ok(()));
        assert_eq!(t.bind(0, 2, ANY, 80, RP), Ok(80));
        assert_eq!(t.set_listening(80, 2), Ok(()));
        assert_eq!(t.reuse_port(80, 2), Some(ANY));
        // Without the flag, or another uid, or a flagged socket after an unflagged one.
        assert_eq!(t.bind(0, 3, ANY, 80, NONE), Err(SocketError::AddrInUse));
        let other = BindOpts { uid: 1001, ..RP };
        assert_eq!(t.bind(0, 4, ANY, 80, other), Err(SocketError::AddrInUse));
        assert_eq!(t.bind(0, 5, LO, 81, NONE), Ok(81));
        assert_eq!(t.bind(0, 6, LO, 81, RP), Err(SocketError::AddrInUse));
        assert_eq!(t.reuse_port(81, 5), None);
        // Members leave one by one; the port is free once the last is gone.
        t.release(0, 1, 80);
        assert!(t.listening(LO, 80));
        assert_eq!(t.bind(0, 3, ANY, 80, NONE), Err(SocketError::AddrInUse));
        t.release(0, 2, 80);
        assert!(!t.listening(LO, 80));
        assert_eq!(t.bind(0, 3, ANY, 80, NONE), Ok(80));
        assert_eq!(t.entries(), 2);
    }

    /// One namespace for every address: specific addresses coexist, 0.0.0.0 overlaps all,
    /// SO_REUSEADDR shares a bind but not a listen.
    #[test]
    fn ports_are_per_address_with_wildcard_rules() {
        let t = PortTable::new(40000..=40002, 1);
        assert_eq!(t.bind(0, 1, LO, 80, NONE), Ok(80));
        assert_eq!(t.bind(0, 2, LINK, 80, NONE), Ok(80));
        // Any 127/8 address is the loopback's one address here.
        assert_eq!(
            t.bind(0, 3, Ipv4Addr::new(127, 0, 0, 2), 80, NONE),
            Err(SocketError::AddrInUse)
        );
        assert_eq!(t.bind(0, 4, ANY, 80, NONE), Err(SocketError::AddrInUse));
        t.set_listening(80, 2).unwrap();
        assert!(t.listening(LINK, 80));
        assert!(!t.listening(LO, 80), "127.0.0.1:80 is bound, not listening");
        assert!(!t.listening(Ipv4Addr::new(10, 0, 0, 3), 80));
        // 0.0.0.0 first: every specific address conflicts.
        assert_eq!(t.bind(0, 5, ANY, 81, NONE), Ok(81));
        assert_eq!(t.bind(0, 6, LINK, 81, NONE), Err(SocketError::AddrInUse));
        // SO_REUSEADDR on both: a second bind while the first does not listen; then only
        // one of them may listen.
        let ra = BindOpts {
            reuse_addr: true,
            ..NONE
        };
        assert_eq!(t.bind(0, 7, LO, 82, ra), Ok(82));
        assert_eq!(t.bind(0, 8, ANY, 82, ra), Ok(82));
        assert_eq!(t.set_listening(82, 7), Ok(()));
        assert_eq!(t.set_listening(82, 8), Err(SocketError::AddrInUse));
        assert_eq!(t.bind(0, 9, LO, 82, ra), Err(SocketError::AddrInUse));
        assert_eq!(t.holders(82), vec![(0, 7), (0, 8)]);
        // bind(0) takes a port nobody holds on any address.
        let p = t.bind(0, 10, LINK, 0, NONE).unwrap();
        assert!((40000..=40002).contains(&p));
        assert_eq!(
            t.bind(0, 11, LO, p, NONE),
            Ok(p),
            "another address, same port"
        );
        let q = t.bind(0, 12, LO, 0, NONE).unwrap();
        assert_ne!(p, q);
    }
}
