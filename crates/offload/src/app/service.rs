//! Moving bytes and state between the engines and the applications' areas each turn: urgent
//! delivery into receive areas, application bytes into the engines, events and tokens.

use super::*;

/// What an accept found: the engine and the connection.
type Accepted = Result<(usize, TcpHandle), SocketError>;

/// Moves data and state between the engines and the applications; true if anything
/// happened. New connections for waiting sync accepts are handed out here too.
///
/// Looks at the sockets marked since the last turn, or at every socket when `sweep` (see
/// `marks` for what marks a socket and why sweeps remain).
pub(crate) fn service(sh: &mut Shared, apps: &mut [App], sweep: bool) -> bool {
    for a in apps.iter_mut() {
        a.read_rx_freed();
        // News read here or during the engines' poll (`rxdirect::deliver`).
        if std::mem::take(&mut a.room_news) {
            for gid in a.area_wait.drain(..) {
                sh.mark(gid);
            }
        }
    }
    sh.collect_changes();
    let mut busy = reuse::dispatch(sh);
    busy |= super::fuse::service(sh, apps);
    let fuse_after = sh.fuse_after;
    let mut fuse_asks: Vec<u32> = Vec::new();
    for (app, handle) in sh.unheld.drain(..) {
        if let Some(a) = apps.iter_mut().find(|a| a.id == app) {
            a.post(super::attach::unheld(handle));
            busy = true;
        }
    }
    let mut accepts: Vec<(u64, u32, u32, Accepted)> = Vec::new();
    let mut done: Vec<u32> = Vec::new();
    // One event buffer for every connection of the turn (allocated once per turn at most).
    let mut evs = std::mem::take(&mut sh.evs);
    let mut list = std::mem::take(&mut sh.dirty_spare);
    list.clear();
    if sweep {
        sh.counters.sweeps += 1;
        list.extend(sh.socks.keys().copied());
        sh.dirty.clear(); // every socket is looked at below, and its mark cleared
    } else {
        std::mem::swap(&mut list, &mut sh.dirty);
    }
    let Shared {
        lo,
        socks,
        ph_actions,
        counters,
        dirty,
        by_slot,
        ..
    } = sh;
    for &gid in &list {
        let Some(g) = socks.get_mut(&gid) else {
            continue; // released since it was marked
        };
        let marked = std::mem::replace(&mut g.dirty, false);
        let mut did = false;
        // Listeners, UDP sockets and closing connections are looked at every turn.
        let mut sticky = false;
        match &mut g.kind {
            Kind::Listener {
                hs, waiting, queue, ..
            } => {
                sticky = true;
                while !waiting.is_empty() {
                    match try_accept(lo, hs, queue) {
                        Some(r) => {
                            let (app, id, l) = waiting.pop_front().expect("waiting");
                            accepts.push((app, id, l, r));
                            did = true;
                        }
                        None => break,
                    }
                }
                if let Some(ph) = &g.ph {
                    if !ph.token_out && readable_now(lo, &g.kind) {
                        ph_actions.push((gid, true, false));
                        did = true;
                    }
                }
            }
            Kind::Conn(c) if g.closing => {
                sticky = true;
                let out = service_conn(lo, 0, c, &mut Vec::new(), None, true);
                did |= out.busy;
                let e = &mut lo.engines[c.eng];
                if c.queued_here() == 0 || e.tcp_error(c.h).is_some() {
                    let _ = e.tcp_close(c.h);
                    done.push(gid);
                }
            }
            Kind::Conn(c) => {
                marks::note_slot(by_slot, c.eng, c.h, gid);
                let holder = g
                    .holder
                    .and_then(|(app, h)| apps.iter().position(|a| a.id == app).map(|i| (i, h)));
                // A sender that is not the holder gets its credit and errors itself.
                let sender = c
                    .sender
                    .filter(|&s| Some(s) != g.holder)
                    .and_then(|(app, h)| apps.iter().position(|a| a.id == app).map(|i| (i, h)));
                let own = sender.is_none();
                evs.clear();
                let out = match holder {
                    Some((i, handle)) => {
                        let a = &mut apps[i];
                        let out = service_conn(lo, handle, c, &mut evs, Some(&mut *a), own);
                        a.credit_wake |= out.credit_wake && own;
                        if out.area_full && !a.area_wait.contains(&gid) {
                            a.area_wait.push(gid);
                        }
                        out
                    }
                    None => service_conn(lo, 0, c, &mut evs, None, own),
                };
                if let Some((j, h)) = sender {
                    let s = &mut apps[j];
                    if out.credit > 0 {
                        s.post(writable(h, out.credit));
                        s.credit_wake |= out.credit_wake;
                    }
                    if let Some(result) = out.failed {
                        s.post(closed(h, result));
                    }
                }
                did |= out.busy;
                if c.fuse.is_none() && c.rx_total >= c.fuse_next.max(fuse_after) {
                    fuse_asks.push(gid);
                }
                if let Some((i, _)) = holder {
                    for e in evs.drain(..) {
                        // A completion for a sync connect goes to the app that waited.
                        apps[i].post(e);
                    }
                }
                if g.ph.is_some() && (out.readable || out.writable) {
                    ph_actions.push((gid, out.readable, out.writable));
                }
            }
            Kind::Udp(d) => {
                sticky = true;
                let holder = g
                    .holder
                    .and_then(|(app, h)| apps.iter().position(|a| a.id == app).map(|i| (i, h)));
                if let Some((i, handle)) = holder {
                    evs.clear();
                    let a = &mut apps[i];
                    if super::udp::service_dgram(
                        lo,
                        handle,
                        d,
                        &mut evs,
                        a,
                        &mut counters.udp_peer_filtered,
                    ) {
                        did = true;
                        for e in evs.drain(..) {
                            a.post(e);
                        }
                        if g.ph.is_some() {
                            ph_actions.push((gid, true, false));
                        }
                    }
                }
            }
            Kind::Fresh { .. } | Kind::Failed(_) => {}
        }
        if sweep && !marked && !sticky && did {
            counters.sweep_found += 1;
        }
        if sticky {
            g.dirty = true;
            dirty.push(gid);
        }
        busy |= did;
    }
    list.clear();
    sh.dirty_spare = list;
    sh.evs = evs;
    for gid in done {
        sh.socks.remove(&gid);
    }
    for gid in fuse_asks {
        super::fuse::try_fuse(sh, apps, gid);
    }
    for (app, id, listener, r) in accepts {
        busy = true;
        let Some(a) = apps.iter_mut().find(|a| a.id == app) else {
            // Its application left: the connection is closed.
            if let Ok((i, c)) = r {
                let _ = sh.lo.engines[i].tcp_close(c);
            }
            continue;
        };
        match r {
            Ok((i, c)) => {
                let h = a.adopt_accepted(sh, i, c);
                a.post(accepted(sh, id, listener, i, c, h));
                first_data(sh, a, h);
                if let Some(&gid) = a.handles.get(&listener) {
                    super::notify::handed(sh, gid); // waiting accepts are sync ones
                }
            }
            Err(e) => a.post(EventRecord::completion(id, listener, Err(e))),
        }
    }
    busy
}

/// The completion of accept `id` on `listener`: the new connection's handle, and its peer
/// in `offset` (the address in bits 16..48, the port below, as `GetAddr` answers), so the
/// application learns both in one event rather than asking for the peer (a round trip per
/// connection). Older applications ignore `offset` in completions.
pub(super) fn accepted(
    sh: &Shared,
    id: u32,
    listener: u32,
    eng: usize,
    c: TcpHandle,
    h: u32,
) -> EventRecord {
    let mut ev = EventRecord::completion(id, listener, Ok(h as u64));
    if let Ok(k) = sh.lo.engines[eng].tcp_conn(c) {
        let t = k.tuple();
        let ip: Ipv4Addr = t.remote_ip.into();
        ev.offset = (u32::from(ip) as u64) << 16 | t.remote_port as u64;
    }
    ev
}

/// Right behind accept `h`'s completion: the connection's first bytes (and its end, if it
/// came too) in the same batch of events, so the application woken by the accept finds
/// them instead of sleeping again for its first recv. With the request posted behind the
/// client's connect (`service_conn`, `Client::connect_send`) they usually came with the
/// handshake.
pub(super) fn first_data(sh: &mut Shared, a: &mut App, h: u32) {
    let Some(&gid) = a.handles.get(&h) else {
        return;
    };
    let Shared {
        lo,
        socks,
        evs,
        ph_actions,
        ..
    } = sh;
    let Some(g) = socks.get_mut(&gid) else {
        return;
    };
    let Kind::Conn(c) = &mut g.kind else {
        return;
    };
    evs.clear();
    let out = service_conn(lo, h, c, evs, Some(&mut *a), true);
    a.credit_wake |= out.credit_wake;
    for e in evs.drain(..) {
        a.post(e);
    }
    if g.ph.is_some() && (out.readable || out.writable) {
        ph_actions.push((gid, out.readable, out.writable));
    }
}

pub(super) fn try_accept(
    lo: &mut Loopback,
    hs: &[(usize, TcpHandle)],
    queue: &mut VecDeque<(usize, TcpHandle)>,
) -> Option<Result<(usize, TcpHandle), SocketError>> {
    // A reuseport group's member: what the group handed it (`reuse`).
    if let Some(c) = queue.pop_front() {
        return Some(Ok(c));
    }
    for &(i, l) in hs {
        match lo.engines[i].tcp_accept(l) {
            Ok(c) => return Some(Ok((i, c))),
            Err(SocketError::WouldBlock) => {}
            Err(e) => return Some(Err(e)),
        }
    }
    None
}

pub(super) fn release_kind(lo: &mut Loopback, k: Kind, died: bool) {
    match k {
        Kind::Udp(d) => {
            let _ = lo.engines[d.eng].udp_close(d.h);
        }
        Kind::Listener { hs, queue, .. } => {
            for (i, h) in hs {
                let _ = lo.engines[i].tcp_close(h);
            }
            // A reuseport member's own connections, never accepted: reset, as the kernel
            // does a closed listener's queue (the group's others keep theirs).
            for (i, c) in queue {
                let _ = lo.engines[i].tcp_abort(c);
                let _ = lo.engines[i].tcp_close(c);
            }
        }
        Kind::Conn(mut c) => {
            // Spans still waiting go out as the queued bytes do.
            super::txzc::spill(&mut c);
            let e = &mut lo.engines[c.eng];
            let unread =
                c.outstanding > 0 || e.tcp_conn(c.h).map(|k| k.recv_queue() > 0).unwrap_or(false);
            if unread || (died && !c.pending_tx.is_empty()) {
                // RFC 2525 §2.17 / Linux: closing with unread data resets the connection.
                let _ = e.tcp_abort(c.h);
            } else if !c.pending_tx.is_empty() {
                // Bytes still queued in the daemon are sent as the engine takes them;
                // whatever it cannot take at once is lost with a reset (first slice).
                let (a, b) = c.pending_tx.as_slices();
                let mut ok = true;
                for part in [a, b] {
                    if !part.is_empty()
                        && e.tcp_send(c.h, part)
                            .map(|n| n < part.len())
                            .unwrap_or(true)
                    {
                        ok = false;
                    }
                }
                if !ok {
                    let _ = e.tcp_abort(c.h);
                }
            }
            let _ = e.tcp_close(c.h);
        }
        Kind::Fresh { .. } | Kind::Failed(_) => {}
    }
}

#[derive(Default)]
struct ConnOut {
    busy: bool,
    /// A readable event was posted (data, end, error).
    readable: bool,
    /// Send space returned, or the connect ended.
    writable: bool,
    /// The credit returned crossed the wake threshold (`credit_wakes`).
    credit_wake: bool,
    /// Delivery stopped because the holder's receive area is full (resumed when it frees
    /// room: `App::area_wait`).
    area_full: bool,
    /// Send credit for a sender that is not the holder (`own` false).
    credit: u64,
    /// The connection failed (`-errno`): for a sender that is not the holder.
    failed: Option<i64>,
}

/// One connection's turn. `app` is its holder (None: nobody holds it now — bytes still go
/// out, received bytes wait in the engine). `own`: the holder (or the next one) gets the
/// send credit; else it is left in `ConnOut::credit` for the sender.
fn service_conn(
    lo: &mut Loopback,
    handle: u32,
    c: &mut Conn,
    evs: &mut Vec<EventRecord>,
    app: Option<&mut App>,
    own: bool,
) -> ConnOut {
    let mut out = ConnOut::default();
    let e = &mut lo.engines[c.eng];
    if c.closed_told {
        return out;
    }
    let open = e.tcp_conn(c.h).map(|k| k.is_open()).unwrap_or(false);
    if let Some(err) = e.tcp_error(c.h) {
        if !own && c.sender.take().is_some() {
            out.failed = Some(-(err.errno() as i64));
            out.busy = true;
            out.writable = true;
        }
        if app.is_none() {
            return out; // told to whoever attaches next (readable_now sees it then)
        }
        if let Some((a, id)) = c.connect_id.take() {
            if app.as_ref().is_some_and(|x| x.id == a) {
                evs.push(EventRecord::completion(id, handle, Err(err)));
            }
        }
        evs.push(closed(handle, -(err.errno() as i64)));
        c.closed_told = true;
        out.busy = true;
        out.readable = true;
        out.writable = true;
        return out;
    }
    if open && !c.open_told && app.is_some() {
        c.open_told = true;
        out.busy = true;
        out.writable = true;
        match c.connect_id.take() {
            Some((_, id)) => evs.push(EventRecord::completion(id, handle, Ok(handle as u64))),
            None => evs.push(writable(handle, 0)),
        }
        // Credit for bytes the engine took during the handshake, told after the open.
        let early = std::mem::take(&mut c.early_credit);
        if early > 0 {
            c.uncredited = c.uncredited.saturating_sub(early);
            evs.push(writable(handle, early));
        }
    }
    // Application bytes into the engine, unless its application is over its memory limit
    // (memory.rs: no credit returns, so its sends stall). Bytes posted behind a connect go
    // to the engine during the handshake — RFC 9293 §3.10.2, SEND in SYN-SENT: "queue the
    // data for transmission after entering ESTABLISHED" — so they leave with (or right
    // behind) the handshake's last ACK rather than a turn later. Their credit waits for the
    // open (an application must not see a connecting socket as writable).
    let stalled = app.as_ref().is_some_and(|a| a.mem_limited);
    let mut taken = std::mem::take(&mut c.direct_taken);
    if !c.pending_tx.is_empty() && !stalled {
        taken += push_pending(e, c);
    }
    if !c.zc.is_empty() && !stalled {
        taken += super::txzc::push_spans(e, c);
    }
    if c.open_told && own {
        if app.is_none() {
            // Nobody holds it (given up before a fork): the credit is told to the next
            // holder, not lost.
            out.busy |= taken > 0;
            c.unheld_credit += std::mem::take(&mut taken);
        } else {
            taken += std::mem::take(&mut c.unheld_credit);
        }
    }
    if taken > 0 {
        out.busy = true;
        if c.open_told {
            out.writable = true;
            let before = c.uncredited;
            c.uncredited = before.saturating_sub(taken);
            out.credit_wake = credit_wakes(before, c.uncredited);
            if own {
                evs.push(writable(handle, taken));
            } else {
                out.credit = taken;
            }
        } else {
            c.early_credit += taken;
        }
    }
    // A file send that found no room: writable once the send buffer takes its next chunk.
    if c.open_told && c.file_want.is_some() && super::file::file_room(e, c) {
        c.file_want = None;
        out.busy = true;
        out.writable = true;
        evs.push(writable(handle, 0));
    }
    if c.shutdown_pending && c.queued_here() == 0 && c.open_told {
        c.shutdown_pending = false;
        let _ = e.tcp_shutdown(c.h);
        out.busy = true;
    }
    let Some(app) = app else {
        // Nobody to deliver to: the engine's buffer alone bounds the window.
        let _ = e.tcp_set_read_limit(c.h, usize::MAX);
        return out;
    };
    // Bytes the engine's poll wrote into the area itself (`rxdirect`): `Data` was posted.
    if std::mem::take(&mut c.direct_rx) {
        out.busy = true;
        out.readable = true;
    }
    // Urgent delivery: received bytes straight into the application's receive area.
    while !c.eof_told {
        let (pos, room, area_full) = rx_room(app, c);
        if room == 0 {
            out.area_full = area_full;
            break;
        }
        // Straight from the engine's receive ring into the application's area (one copy; the
        // bytes are consumed only once written).
        let n = match e.tcp_peek(c.h, room as usize) {
            Ok((a, b)) if !a.is_empty() => {
                let at = LAYOUT.rx_off + pos as usize;
                let _ = app.region.write_at(at, a);
                if !b.is_empty() {
                    let _ = app.region.write_at(at + a.len(), b);
                }
                a.len() + b.len()
            }
            Ok(_) if e.tcp_at_eof(c.h) => {
                evs.push(closed(handle, 0));
                c.eof_told = true;
                out.busy = true;
                out.readable = true;
                return out;
            }
            Ok(_) | Err(_) => break,
        };
        let _ = e.tcp_consume(c.h, n);
        evs.push(rx_written(app, c, handle, pos, n as u64));
        out.busy = true;
        out.readable = true;
    }
    // The window offered is the holder's remaining credit: the peer sends what fits in the
    // area at once, so the engine's poll writes it there directly (`rxdirect`) instead of
    // into the engine's buffer and then, here, into the area (two copies).
    let _ = e.tcp_set_read_limit(c.h, SOCK_RCVBUF.saturating_sub(c.outstanding) as usize);
    out
}

/// Where connection `c`'s next received bytes go in `app`'s receive area and how many fit
/// there at once: `(position, room, area full)`. The room is the least of the area's free
/// space, the connection's receive credit (`SOCK_RCVBUF` outstanding) and the bytes left
/// before the area wraps.
pub(super) fn rx_room(app: &App, c: &Conn) -> (u64, u64, bool) {
    let area_free = RX_SIZE as u64 - (app.rx_head - app.rx_freed);
    let pos = app.rx_head % RX_SIZE as u64;
    let room = SOCK_RCVBUF
        .saturating_sub(c.outstanding)
        .min(area_free)
        .min(RX_SIZE as u64 - pos);
    (pos, room, area_free == 0)
}

/// Accounts `n` bytes written for `c` at `pos` of `app`'s receive area (its head, the
/// connection's outstanding credit); the `Data` event that tells the application.
pub(super) fn rx_written(
    app: &mut App,
    c: &mut Conn,
    handle: u32,
    pos: u64,
    n: u64,
) -> EventRecord {
    app.rx_head += n;
    c.outstanding += n;
    c.rx_total += n;
    EventRecord {
        kind: EventKind::Data,
        id: 0,
        handle,
        result: n as i64,
        offset: pos,
        len: n,
    }
}

/// Moves the daemon's queued bytes into the engine's send buffer; returns how many it took.
fn push_pending(e: &mut flowstack_stack::Engine, c: &mut Conn) -> u64 {
    let mut taken = 0u64;
    while !c.pending_tx.is_empty() {
        let (a, _) = c.pending_tx.as_slices();
        match e.tcp_send(c.h, a) {
            Ok(0) | Err(SocketError::WouldBlock) => break,
            Ok(n) => {
                c.pending_tx.drain(..n);
                taken += n as u64;
            }
            Err(_) => break, // reported by the error check next turn
        }
    }
    taken
}

/// The connection ended: `result` is 0 (end of stream) or `-errno`.
fn closed(handle: u32, result: i64) -> EventRecord {
    EventRecord {
        kind: EventKind::Closed,
        id: 0,
        handle,
        result,
        offset: 0,
        len: 0,
    }
}

pub(super) fn writable(handle: u32, len: u64) -> EventRecord {
    EventRecord {
        kind: EventKind::Writable,
        id: 0,
        handle,
        result: 0,
        offset: 0,
        len,
    }
}

/// Whether returning send credit that takes a connection's uncredited bytes from `before`
/// to `after` wakes an application waiting for send space: only when they fall to half the
/// send buffer or below, or to zero — not at every turn that returns a little (hysteresis,
/// as the kernel's `sk_stream_write_space` waits for a third of the buffer). The client
/// waits for space only with a full send buffer (`SOCK_SNDBUF` unflushed) or a full
/// transmit area; from a full buffer the count must cross the half on its way down, and
/// every wait ends at the latest when all its bytes are taken (zero), so no wait is lost.
pub(crate) fn credit_wakes(before: u64, after: u64) -> bool {
    let half = SOCK_SNDBUF / 2;
    after < before && ((after <= half && before > half) || after == 0)
}

#[cfg(test)]
mod tests {
    use super::credit_wakes;

    /// Send credit wakes a waiting sender when its unflushed bytes fall to half the send
    /// buffer (crossing it) or to zero, not at every small return.
    #[test]
    fn credit_wakes_at_the_half_and_at_zero_only() {
        use flowstack_api::region::SOCK_SNDBUF as B;
        assert!(!credit_wakes(B, B - 4096), "a little back: no wake");
        assert!(!credit_wakes(B - 4096, B / 2 + 1));
        assert!(credit_wakes(B / 2 + 1, B / 2), "crossing the half");
        assert!(credit_wakes(B, 0));
        assert!(
            !credit_wakes(B / 2, B / 4),
            "already below: the next wake is at zero"
        );
        assert!(credit_wakes(B / 4, 0), "drained");
        assert!(!credit_wakes(0, 0));
        assert!(!credit_wakes(B / 2, B / 2));
    }
}
