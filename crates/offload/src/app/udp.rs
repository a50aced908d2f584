//! UDP sockets of the POSIX layer (`Attach{New}` with [`SockType::Dgram`]).
//!
//! A datagram socket lives on its engine thread's loopback engine (127.0.0.0/8) and holds
//! its port in the daemon-wide UDP namespace ([`crate::udp_ports`]), separate from TCP's.
//! - **bind** (`Command::Bind`): any 127/8 address or 0.0.0.0; port 0 picks an ephemeral
//!   one. An unbound socket is bound to an ephemeral port by its first `UdpSendTo` or
//!   `Connect` (as Linux's autobind, `inet_autobind`).
//! - **connect** (`Command::Connect`): sets the default peer (completion at once; no packet);
//!   0.0.0.0:0 dissolves it (`AF_UNSPEC`). A connected socket receives only its peer's
//!   datagrams (others are dropped and counted, `FlowstackdUdpPeerFiltered`), as
//!   `__udp4_lib_lookup` only matches a connected socket for its peer (RFC 1122 §4.1.3.4
//!   leaves it to the implementation); ICMP errors (port unreachable) are reported to a
//!   connected socket only, as Linux without `IP_RECVERR`.
//! - **send** (`Command::UdpSendTo`): a span of the transmit area, one datagram.
//! - **receive**: each turn, datagrams go from the engine's queue straight into the
//!   holder's receive area (one copy) with a `Datagram` event (its source in `result`; the
//!   span may wrap around the area's end), while the socket's delivered-and-unread charge
//!   stays within [`UDP_RCVBUF`]; the rest waits in the engine's queue, which drops and
//!   counts (`UdpRcvbufErrors`) when full. The application reports each datagram it reads
//!   (`TcpConsume` with [`dgram_charge`]).
//!
//! The placeholder's token follows the same rules as a connection's: readable while
//! delivered datagrams are unread.

use super::*;
pub(super) use flowstack_api::region::MAX_DGRAM;
use flowstack_api::region::{dgram_charge, UDP_RCVBUF};
use flowstack_stack::UdpHandle;

/// A bound UDP socket.
#[derive(Debug)]
pub(crate) struct Dgram {
    pub eng: usize,
    pub h: UdpHandle,
    /// The address it was bound to (0.0.0.0: any), and its port.
    pub local: SocketAddrV4,
    /// The default peer (`connect`).
    pub peer: Option<SocketAddrV4>,
    /// Charge of the datagrams delivered to the holder and not yet read.
    pub outstanding: u64,
}

/// The loopback engine of this engine thread (UDP lives there).
const LO: usize = 0;

fn is_dgram_fresh(sh: &Shared, gid: u32) -> bool {
    matches!(
        sh.socks.get(&gid).map(|g| &g.kind),
        Some(Kind::Fresh {
            ty: SockType::Dgram,
            ..
        })
    )
}

/// True if `gid` is a datagram socket (bound or not): its commands go here.
pub(super) fn is_dgram(sh: &Shared, gid: u32) -> bool {
    is_dgram_fresh(sh, gid) || matches!(sh.socks.get(&gid).map(|g| &g.kind), Some(Kind::Udp(_)))
}

/// `bind(2)` of a datagram socket; returns the port.
pub(super) fn bind(sh: &mut Shared, gid: u32, local: SocketAddrV4) -> Result<u16, SocketError> {
    if !(local.ip().is_unspecified() || is_loopback(local.ip())) {
        // UDP is carried on the daemon's loopback only (first slice).
        return Err(SocketError::AddrNotAvailable);
    }
    if !is_dgram_fresh(sh, gid) {
        return Err(SocketError::InvalidArgument); // bound already
    }
    let port = sh.ports.udp.bind(sh.me, gid, local.port())?;
    let h = match sh.lo.engines[LO].udp_bind(port) {
        Ok(h) => h,
        Err(e) => {
            sh.ports.udp.release(gid, port);
            return Err(e);
        }
    };
    if let Some(g) = sh.socks.get_mut(&gid) {
        g.hold = Some(Hold::Udp(port));
        g.kind = Kind::Udp(Dgram {
            eng: LO,
            h,
            local: SocketAddrV4::new(*local.ip(), port),
            peer: None,
            outstanding: 0,
        });
    }
    Ok(port)
}

/// Autobind: an unbound socket gets an ephemeral port on 0.0.0.0.
fn autobind(sh: &mut Shared, gid: u32) -> Result<(), SocketError> {
    if is_dgram_fresh(sh, gid) {
        bind(sh, gid, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
    }
    Ok(())
}

/// `connect(2)`: the default peer (0.0.0.0:0: none, `AF_UNSPEC`).
pub(super) fn connect(sh: &mut Shared, gid: u32, remote: SocketAddrV4) -> Result<u64, SocketError> {
    let unspec = remote.ip().is_unspecified() && remote.port() == 0;
    if !unspec {
        if remote.port() == 0 {
            return Err(SocketError::InvalidArgument);
        }
        autobind(sh, gid)?;
    }
    match sh.socks.get_mut(&gid).map(|g| &mut g.kind) {
        Some(Kind::Udp(d)) => {
            d.peer = (!unspec).then_some(remote);
            Ok(0)
        }
        Some(_) => Ok(0), // AF_UNSPEC on an unbound socket: nothing to dissolve
        None => Err(SocketError::InvalidHandle),
    }
}

/// Sends `data` as one datagram to `dst` (0.0.0.0:0: the default peer).
pub(super) fn send(
    sh: &mut Shared,
    gid: u32,
    dst: SocketAddrV4,
    data: &[u8],
) -> Result<u64, SocketError> {
    if data.len() > MAX_DGRAM {
        return Err(SocketError::MessageTooLong);
    }
    autobind(sh, gid)?;
    let Some(Kind::Udp(d)) = sh.socks.get(&gid).map(|g| &g.kind) else {
        return Err(SocketError::InvalidHandle);
    };
    let dst = if dst.ip().is_unspecified() && dst.port() == 0 {
        d.peer.ok_or(SocketError::NotConnected)?
    } else {
        dst
    };
    sh.lo.engines[d.eng].udp_send_to(d.h, dst, data).map(|_| 0)
}

/// Would a datagram to `remote` be carried? A loopback port a flowstack UDP socket holds.
pub(super) fn carries(sh: &Shared, remote: SocketAddrV4) -> bool {
    is_loopback(remote.ip()) && sh.ports.udp.bound(remote.port())
}

/// getsockname/getpeername of a bound datagram socket (None: not one).
pub(super) fn addr_of(k: &Kind, peer: bool) -> Option<Result<SocketAddrV4, SocketError>> {
    match k {
        Kind::Udp(d) if peer => Some(d.peer.ok_or(SocketError::NotConnected)),
        Kind::Udp(d) => Some(Ok(d.local)),
        Kind::Fresh {
            ty: SockType::Dgram,
            ..
        } if peer => Some(Err(SocketError::NotConnected)),
        _ => None,
    }
}

/// The holder read datagrams worth `charge` (`TcpConsume`).
pub(super) fn consumed(k: &mut Kind, charge: u64) {
    if let Kind::Udp(d) = k {
        d.outstanding = d.outstanding.saturating_sub(charge);
    }
}

/// One turn of a datagram socket: its queued datagrams into `app`'s receive area (see the
/// module docs). Returns whether anything was delivered (the socket became readable).
pub(super) fn service_dgram(
    lo: &mut Loopback,
    handle: u32,
    d: &mut Dgram,
    evs: &mut Vec<EventRecord>,
    app: &mut App,
    filtered: &mut u64,
) -> bool {
    let e = &mut lo.engines[d.eng];
    let mut any = false;
    loop {
        let area_free = RX_SIZE as u64 - (app.rx_head - app.rx_freed);
        let pos = app.rx_head % RX_SIZE as u64;
        let (peer, outstanding) = (d.peer, d.outstanding);
        let mut got = None;
        let r = e.udp_take_with(d.h, |src, data| {
            if peer.is_some_and(|p| p != src) {
                got = Some((src, usize::MAX)); // not its peer: dropped
                return true;
            }
            let n = data.len() as u64;
            if n > area_free || (outstanding > 0 && outstanding + dgram_charge(n) > UDP_RCVBUF) {
                return false; // waits in the engine's queue
            }
            let at = pos as usize;
            let first = data.len().min(RX_SIZE - at);
            let _ = app.region.write_at(LAYOUT.rx_off + at, &data[..first]);
            if first < data.len() {
                let _ = app.region.write_at(LAYOUT.rx_off, &data[first..]);
            }
            got = Some((src, data.len()));
            true
        });
        match (r, got) {
            (Ok(true), Some((_, usize::MAX))) => *filtered += 1,
            (Ok(true), Some((src, n))) => {
                app.rx_head += n as u64;
                d.outstanding += dgram_charge(n as u64);
                evs.push(EventRecord {
                    kind: EventKind::Datagram,
                    id: 0,
                    handle,
                    result: ((u32::from(*src.ip()) as i64) << 16) | src.port() as i64,
                    offset: pos,
                    len: n as u64,
                });
                any = true;
            }
            (Err(SocketError::WouldBlock), _) | (Ok(_), _) => break,
            (Err(err), _) => {
                // ICMP (port unreachable): told to a connected socket only.
                if d.peer.is_some() {
                    evs.push(EventRecord::completion(0, handle, Err(err)));
                    any = true;
                }
            }
        }
    }
    any
}

impl App {
    /// Reads one datagram's span `offset..offset+len` of the transmit area (at most 65507
    /// bytes; it may wrap around the area's end, as a datagram is never split in two
    /// records) into the scratch buffer (taken: give it back to `tx_scratch`) and frees it;
    /// None (counted) if the span is outside the area. The client writes spans in order;
    /// whatever it names, the area it frees is counted by what we took, so a lying client
    /// only garbles its own bytes. (A stream's `TcpSend` reads its span in place.)
    pub(super) fn take_dgram_span(
        &mut self,
        sh: &mut Shared,
        offset: u64,
        len: u64,
    ) -> Option<(Vec<u8>, usize)> {
        if offset >= TX_SIZE as u64 || len > udp::MAX_DGRAM as u64 {
            self.stats.bad_records += 1;
            sh.counters.bad_records += 1;
            return None;
        }
        let (off, len) = (offset as usize, len as usize);
        self.tx_freed += len as u64;
        let mut scratch = std::mem::take(&mut self.tx_scratch);
        if scratch.len() < len {
            // Grown once, never cleared: every byte used is read over first.
            scratch.resize(len, 0);
        }
        let first = len.min(TX_SIZE - off);
        let _ = self
            .region
            .read_at(LAYOUT.tx_off + off, &mut scratch[..first]);
        let _ = self.region.read_at(LAYOUT.tx_off, &mut scratch[first..len]);
        self.publish_tx_freed();
        Some((scratch, len))
    }
}
