//! Connections opened for an application: `Connect` (through the loopback's engines, or a
//! failure told at once) and `TcpAccept` (answered now, or held until one comes), and the
//! handle an accepted connection gets.

use super::*;

impl App {
    pub(super) fn connect(
        &mut self,
        sh: &mut Shared,
        id: u32,
        mode: Mode,
        handle: u32,
        gid: u32,
        remote: SocketAddrV4,
    ) {
        let r = match sh.socks.get(&gid).map(|g| &g.kind) {
            Some(Kind::Fresh {
                ty: SockType::Stream,
                bound,
            }) => {
                let port = bound.map(|b| b.port()).unwrap_or(0);
                sh.lo.engine_for(&remote, 0).and_then(|i| {
                    let e = &mut sh.lo.engines[i];
                    let c = if port == 0 {
                        e.tcp_connect(remote)
                    } else {
                        e.tcp_connect_from(port, remote, e.tcp_defaults())
                    };
                    c.map(|c| (i, c))
                })
            }
            Some(Kind::Conn(c)) if c.open_told => Err(SocketError::InvalidState),
            Some(Kind::Conn(_)) => Err(SocketError::WouldBlock),
            Some(Kind::Failed(e)) => Err(*e),
            Some(_) => Err(SocketError::InvalidState),
            None => Err(SocketError::InvalidHandle),
        };
        match r {
            Ok((i, c)) => {
                let wait = (mode == Mode::Sync).then_some((self.id, id));
                if let Some(g) = sh.socks.get_mut(&gid) {
                    g.kind = Kind::Conn(Conn::new(i, c, wait, false));
                }
                // Async: the handshake is reported by a Writable event, a failure by Closed.
            }
            Err(e) => {
                if matches!(
                    sh.socks.get(&gid).map(|g| &g.kind),
                    Some(Kind::Fresh { .. })
                ) {
                    set_failed(sh, gid, e);
                }
                self.complete(id, mode, handle, Err(e));
            }
        }
    }

    pub(super) fn accept(&mut self, sh: &mut Shared, id: u32, mode: Mode, listener: u32) {
        let gid = match self.gid(listener) {
            Ok(g) => g,
            Err(e) => return self.post(EventRecord::completion(id, listener, Err(e))),
        };
        if self.at_limit(sh) {
            return self.post(EventRecord::completion(
                id,
                listener,
                Err(SocketError::LimitReached),
            ));
        }
        reuse::dispatch(sh);
        let r = match sh.socks.get_mut(&gid).map(|g| &mut g.kind) {
            Some(Kind::Listener { hs, queue, .. }) => try_accept(&mut sh.lo, hs, queue),
            Some(Kind::Failed(e)) => Some(Err(*e)),
            Some(_) => Some(Err(SocketError::InvalidArgument)),
            None => Some(Err(SocketError::InvalidHandle)),
        };
        match r {
            Some(Ok((i, c))) => {
                let h = self.adopt_accepted(sh, i, c);
                self.post(service::accepted(sh, id, listener, i, c, h));
                service::first_data(sh, self, h);
                if mode == Mode::Sync {
                    notify::handed(sh, gid);
                }
            }
            Some(Err(e)) => self.post(EventRecord::completion(id, listener, Err(e))),
            None if mode == Mode::Sync => {
                if let Some(Kind::Listener { waiting, .. }) =
                    sh.socks.get_mut(&gid).map(|g| &mut g.kind)
                {
                    waiting.push_back((self.id, id, listener));
                }
            }
            None => self.post(EventRecord::completion(
                id,
                listener,
                Err(SocketError::WouldBlock),
            )),
        }
    }

    pub(super) fn adopt_accepted(&mut self, sh: &mut Shared, eng: usize, h: TcpHandle) -> u32 {
        let handles = &self.handles;
        let handle = accepted_handle(self.next_accepted, |h| handles.contains_key(&h));
        self.next_accepted = handle + 1;
        let port = sh.lo.engines[eng].tcp_conn(h).map(|k| k.tuple().local_port);
        let gid = self.new_sock(sh, handle, Kind::Conn(Conn::new(eng, h, None, true)));
        if let (Ok(p), Some(g)) = (port, sh.socks.get_mut(&gid)) {
            // (Held only if the port is this engine's.)
            // Its listener's port stays routed here while it lives (ports.rs).
            if sh.ports.hold_accepted(sh.me, p) {
                g.hold = Some(Hold::Accepted(p));
            }
        }
        handle
    }
}
