//! The control plane the applications share: the port namespace (bind, listen, ephemeral
//! ports), addresses, and the readiness tokens and filler of the placeholders.

use super::*;

/// Drops `app`'s name `handle` for `gid`; `close` (native close, or the application left):
/// a socket without a placeholder is closed with it.
pub(super) fn detach(sh: &mut Shared, gid: u32, app: u64, handle: u32, close: bool) {
    let Some(g) = sh.socks.get_mut(&gid) else {
        return;
    };
    g.owners.retain(|&o| o != (app, handle));
    if g.holder == Some((app, handle)) {
        g.holder = None;
    }
    if g.ph.is_none() && (close || g.owners.is_empty()) {
        sh.release(gid, false);
    }
}

pub(super) fn set_failed(sh: &mut Shared, gid: u32, e: SocketError) {
    if let Some(mut g) = sh.socks.remove(&gid) {
        sh.unhold(gid, &mut g);
        sh.socks.insert(gid, g);
    }
    if let Some(g) = sh.socks.get_mut(&gid) {
        g.kind = Kind::Failed(e);
        if g.ph.is_some() {
            sh.ph_actions.push((gid, true, true));
        }
    }
}

/// `bind(2)` on the daemon's interfaces: any 127/8 address, the link's address or 0.0.0.0;
/// port 0 picks an ephemeral one. Conflicts per address, with `SO_REUSEADDR` and
/// `SO_REUSEPORT` as Linux ([`crate::ports`]).
pub(super) fn bind(
    sh: &mut Shared,
    gid: u32,
    local: SocketAddrV4,
    opts: crate::ports::BindOpts,
) -> Result<u16, SocketError> {
    if !(local.ip().is_unspecified() || sh.lo.is_local(local.ip())) {
        return Err(SocketError::AddrNotAvailable);
    }
    match sh.socks.get(&gid).map(|g| &g.kind) {
        Some(Kind::Fresh { bound: None, .. }) => {}
        Some(Kind::Fresh { .. }) => return Err(SocketError::InvalidArgument),
        Some(_) => return Err(SocketError::InvalidArgument),
        None => return Err(SocketError::InvalidHandle),
    }
    let port = local.port();
    let holders = if port != 0 {
        sh.ports.holders(port)
    } else {
        Vec::new()
    };
    let me = sh.me;
    for (_, old) in holders.into_iter().filter(|&(e, _)| e == me) {
        // The program closed its listener and binds the port again at once (iperf3 -s
        // between tests): its last close, if every placeholder copy is gone, is taken
        // now rather than at the next periodic check, which the bind would beat.
        let closed = sh.socks.get(&old).is_some_and(|g| {
            !matches!(g.kind, Kind::Conn(_))
                && g.ph.as_ref().is_some_and(|ph| {
                    placeholder::poll_sets(&[], &[ph.d.as_fd()], Some(std::time::Duration::ZERO))
                        .is_ok_and(|(_, h)| h.first() == Some(&true))
                })
        });
        if closed {
            sh.counters.last_closes += 1;
            sh.release(old, false);
        }
    }
    let port = sh.ports.bind(sh.me, gid, *local.ip(), port, opts)?;
    if let Some(g) = sh.socks.get_mut(&gid) {
        g.hold = Some(Hold::Bound(port));
        if let Kind::Fresh { bound, .. } = &mut g.kind {
            *bound = Some(SocketAddrV4::new(*local.ip(), port));
        }
    }
    Ok(port)
}

pub(super) fn listen(sh: &mut Shared, gid: u32, backlog: u32) -> Result<u16, SocketError> {
    let (ip, port) = match sh.socks.get(&gid).map(|g| &g.kind) {
        Some(Kind::Fresh {
            ty: SockType::Stream,
            bound,
        }) => (
            bound.map_or(Ipv4Addr::UNSPECIFIED, |b| *b.ip()),
            bound.map(|b| b.port()),
        ),
        // listen(2) on a listener only changes the backlog.
        Some(Kind::Listener { port, .. }) => return Ok(*port),
        Some(Kind::Failed(e)) => return Err(*e),
        Some(_) => return Err(SocketError::InvalidState),
        None => return Err(SocketError::InvalidHandle),
    };
    let port = match port {
        Some(p) => p,
        None => {
            let opts = crate::ports::BindOpts::default();
            let p = sh.ports.bind(sh.me, gid, Ipv4Addr::UNSPECIFIED, 0, opts)?;
            if let Some(g) = sh.socks.get_mut(&gid) {
                g.hold = Some(Hold::Bound(p));
            }
            p
        }
    };
    let backlog = (backlog as usize).clamp(1, 4096);
    // SO_REUSEPORT: the group of this address and port listens for it (`reuse`).
    let group = sh.ports.reuse_port(port, gid).map(|addr| (addr, port));
    let hs = match group {
        Some(key) => super::reuse::join(sh, gid, key, ip, backlog).map(|_| Vec::new())?,
        None => sh.lo.listen(ip, port, backlog)?,
    };
    // Another listener on an overlapping address (outside a reuseport group) refuses it;
    // the socket stays bound, as Linux leaves it.
    if let Err(e) = sh.ports.set_listening(port, gid) {
        match group {
            Some(key) => super::reuse::leave(sh, gid, key),
            None => {
                for (i, h) in hs {
                    let _ = sh.lo.engines[i].tcp_close(h);
                }
            }
        }
        return Err(e);
    }
    if let Some(g) = sh.socks.get_mut(&gid) {
        g.kind = Kind::Listener {
            ip,
            port,
            hs,
            waiting: VecDeque::new(),
            kernel: None,
            queue: VecDeque::new(),
            backlog,
        };
    }
    Ok(port)
}

pub(super) fn addr_of(sh: &Shared, gid: u32, peer: bool) -> Result<SocketAddrV4, SocketError> {
    let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
    match sh.socks.get(&gid).map(|g| &g.kind) {
        Some(Kind::Conn(c)) => {
            let t = sh.lo.engines[c.eng].tcp_conn(c.h)?.tuple();
            Ok(if peer {
                SocketAddrV4::new(t.remote_ip.into(), t.remote_port)
            } else {
                SocketAddrV4::new(t.local_ip.into(), t.local_port)
            })
        }
        _ if peer => Err(SocketError::NotConnected),
        Some(Kind::Listener { ip, port, .. }) => Ok(SocketAddrV4::new(*ip, *port)),
        Some(Kind::Fresh { bound, .. }) => Ok(bound.unwrap_or(any)),
        Some(Kind::Failed(_)) => Ok(any),
        Some(Kind::Udp(d)) => Ok(d.local), // answered by `udp::addr_of` first
        None => Err(SocketError::InvalidHandle),
    }
}

/// Readable from the daemon's view (see the module docs).
pub(super) fn readable_now(lo: &Loopback, k: &Kind) -> bool {
    match k {
        Kind::Conn(c) => {
            c.outstanding > 0
                || c.eof_told
                || c.closed_told
                || c.fuse.as_ref().is_some_and(|f| f.readable_arm())
        }
        Kind::Listener {
            hs, kernel, queue, ..
        } => {
            !queue.is_empty()
                || hs.iter().any(|&(i, h)| {
                    lo.engines[i]
                        .tcp_poll(h)
                        .map(|r| r.readable)
                        .unwrap_or(false)
                })
                || kernel.as_ref().is_some_and(|k| {
                    flowstack_sys::poll::wait_readable(k, std::time::Duration::ZERO)
                        .unwrap_or(false)
                })
        }
        Kind::Failed(_) => true,
        Kind::Fresh { .. } => false,
        Kind::Udp(d) => d.outstanding > 0,
    }
}

pub(super) fn token_cleared(sh: &mut Shared, gid: u32) {
    let Some(g) = sh.socks.get_mut(&gid) else {
        return;
    };
    let again = readable_now(&sh.lo, &g.kind);
    if let Some(ph) = &mut g.ph {
        ph.token_out = false;
        // A connection handed to an accept asked ahead after the token the application
        // just took was written: it may not have seen it yet (`notify::handed`).
        if again || ph.handed {
            sh.ph_actions.push((gid, true, false));
        }
    }
}

pub(super) fn want_writable(sh: &mut Shared, gid: u32, area_room: bool) {
    let Some(g) = sh.socks.get_mut(&gid) else {
        return;
    };
    let now = match &g.kind {
        Kind::Conn(c) => {
            let e = &sh.lo.engines[c.eng];
            let file_ok = c.file_want.is_none() || super::file::file_room(e, c);
            let room = match &c.fuse {
                // Bytes go on the pipe: its room, not the send buffer's.
                Some(f) if f.switched => f.writable_arm(),
                _ => (c.queued_here() as u64) < SOCK_SNDBUF && area_room,
            };
            (c.open_told && room && file_ok)
                || c.closed_told
                || sh.lo.engines[c.eng].tcp_error(c.h).is_some()
        }
        _ => true,
    };
    if let Some(ph) = &mut g.ph {
        ph.want_writable = true;
        if now {
            sh.ph_actions.push((gid, false, true));
        }
    }
}
