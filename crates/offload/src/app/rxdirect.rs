//! Received bytes straight from a frame into the application's receive area.
//!
//! The copy path puts every received byte twice through memory in the daemon: the engine
//! copies a segment's payload into the connection's receive buffer, and the connection's
//! next turn (`service::service_conn`) copies it from there into the holder's receive area.
//! Under iperf3 those two copies were 30% and 36% of the daemon's samples. When a segment
//! arrives in order (the engine's header-prediction path), the bytes still in the buffer
//! and then the segment's payload are offered here during the engine's poll
//! (`Engine::poll_to`, `Connection::on_segment_to`), and as much as the holder's area has
//! room for is written into it: what is taken of the payload never enters the buffer (one
//! copy).
//!
//! What the connection's turn would have done is done here, in the same order: the bytes
//! go at the area's head, `Data` is posted to the holder, and the connection is marked so
//! its turn reports it readable (placeholder token, wake-up). What does not fit, a
//! connection whose end or error was reported, one held by nobody, take the copy path, and
//! the receive window still closes when the application stops reading (the area's room
//! runs out, the buffer fills).

use super::*;
use flowstack_wire::Instant;

/// Takes the leading bytes of `data` that the holder's receive area has room for, received
/// in order on connection `h` of engine `eng`; returns how many (see the module's docs).
#[allow(clippy::too_many_arguments)]
pub(super) fn deliver(
    socks: &mut IdMap<u32, GSock>,
    apps: &mut [App],
    by_slot: &[Vec<u32>],
    dirty: &mut Vec<u32>,
    counters: &mut DaemonCounters,
    eng: usize,
    h: TcpHandle,
    data: &[u8],
) -> usize {
    let Some(&gid) = by_slot.get(eng).and_then(|v| v.get(h.index())) else {
        return 0;
    };
    let Some(g) = socks.get_mut(&gid) else {
        return 0;
    };
    if g.closing {
        return 0;
    }
    let Some((app_id, handle)) = g.holder else {
        return 0;
    };
    let Kind::Conn(c) = &mut g.kind else {
        return 0;
    };
    // The slot map may be stale: the socket must still be this connection.
    if c.eng != eng || c.h != h || !c.open_told || c.eof_told || c.closed_told {
        return 0;
    }
    let Some(app) = apps.iter_mut().find(|a| a.id == app_id) else {
        return 0;
    };
    // The room the connection's turn would use (`service::rx_room`); what the application
    // released since the turn began is looked at when that is short.
    let (mut pos, mut room, _) = service::rx_room(app, c);
    if room < data.len() as u64 && app.read_rx_freed() {
        (pos, room, _) = service::rx_room(app, c);
    }
    let n = (data.len() as u64).min(room);
    if n == 0 {
        return 0;
    }
    let at = LAYOUT.rx_off + pos as usize;
    if app.region.write_at(at, &data[..n as usize]).is_none() {
        return 0;
    }
    c.direct_rx = true;
    let data_event = service::rx_written(app, c, handle, pos, n);
    app.post(data_event);
    counters.rx_direct_bytes += n;
    if !g.dirty {
        g.dirty = true;
        dirty.push(gid);
    }
    n as usize
}

impl Shared {
    /// Polls every engine, receiving in-order data straight into the applications' areas
    /// where it can ([`deliver`]).
    pub(crate) fn poll_engines(&mut self, apps: &mut [App], now: Instant) -> bool {
        let Shared {
            lo,
            socks,
            by_slot,
            dirty,
            counters,
            ..
        } = self;
        lo.poll_to(now, &mut |eng, h, data| {
            deliver(socks, apps, by_slot, dirty, counters, eng, h, data)
        })
    }
}
