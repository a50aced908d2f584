//! `Attach` records: placeholders of process-shared sockets (app/mod.rs module docs), files
//! for `sendfile`, kernel listeners.

use super::*;

impl App {
    /// Takes the descriptors of an `Attach` from the registration stream.
    pub(super) fn attach(
        &mut self,
        sh: &mut Shared,
        handle: u32,
        op: AttachOp,
        ty: SockType,
    ) -> Result<u64, SocketError> {
        if op == AttachOp::Repool {
            let r = self.repool(handle as usize);
            if r.is_ok() {
                sh.counters.pool_repools += 1;
            }
            return r;
        }
        // A pooled op takes the oldest pooled pair first, whatever follows, so the two sides'
        // pools stay in step; it comes with no message on the stream.
        let pooled = match op {
            AttachOp::NewPooled | AttachOp::PlacePooled => {
                Some(self.pool.pop_front().ok_or(SocketError::InvalidArgument)?)
            }
            _ => None,
        };
        let mut fds = Vec::new();
        if pooled.is_none() {
            let mut byte = [0u8; 1];
            let n = flowstack_sys::fdpass::recv_fds(&self.stream, &mut byte, &mut fds)
                .map_err(|_| SocketError::InvalidArgument)?;
            let want = match op {
                // `handle` pairs: the count is the application's word, checked here.
                AttachOp::Pool if (1..=POOL_BATCH).contains(&handle) => 2 * handle as usize,
                AttachOp::Pool => usize::MAX,
                _ => op.fds(),
            };
            if n != 1 || byte[0] != op.code() || fds.len() != want {
                return Err(SocketError::InvalidArgument);
            }
        }
        if op == AttachOp::Pool {
            return self.fill_pool(sh, fds);
        }
        if op == AttachOp::File {
            let f = fds.pop().expect("one descriptor");
            return self.attach_file(handle, f);
        }
        if op == AttachOp::Wake {
            return notify::attach_wake(self, fds.pop().expect("one descriptor"));
        }
        if matches!(op, AttachOp::New | AttachOp::NewPooled | AttachOp::Adopt) && self.at_limit(sh)
        {
            return Err(SocketError::LimitReached);
        }
        let fresh_handle = |app: &App| {
            if app.handles.contains_key(&handle) || handle == 0 {
                Err(SocketError::InvalidArgument)
            } else {
                Ok(())
            }
        };
        match op {
            AttachOp::New | AttachOp::Place | AttachOp::NewPooled | AttachOp::PlacePooled => {
                let (ident, d, watched) = match pooled {
                    Some(p) => p,
                    None => {
                        let a = fds.pop().expect("two descriptors");
                        let d = fds.pop().expect("two descriptors");
                        (pair_ident(a)?, d, false)
                    }
                };
                if sh.by_ident.contains_key(&ident) || sh.ports.ident_engine(ident).is_some() {
                    return Err(SocketError::InvalidArgument);
                }
                let mut ph = Placeholder {
                    d,
                    watched,
                    ident,
                    token_out: false,
                    seq: 0,
                    want_writable: false,
                    quiet_for: None,
                    handed: false,
                    tokens: false,
                };
                let new = matches!(op, AttachOp::New | AttachOp::NewPooled);
                let gid = if new {
                    fresh_handle(self)?;
                    self.new_sock(sh, handle, Kind::Fresh { ty, bound: None })
                } else {
                    let gid = self.gid(handle)?;
                    match sh.socks.get(&gid) {
                        Some(g) if g.ph.is_none() => gid,
                        _ => return Err(SocketError::InvalidArgument),
                    }
                };
                if sh.ph_owner_set(&mut ph, gid).is_err() {
                    // Its last close could not be seen (epoll's watch limit, no memory).
                    if new {
                        self.handles.remove(&handle);
                        sh.release(gid, false);
                    }
                    return Err(SocketError::LimitReached);
                }
                sh.by_ident.insert(ident, gid);
                sh.ports.claim_ident(ident, sh.me);
                let g = sh.socks.get_mut(&gid).expect("just found");
                g.ph = Some(ph);
                // No token for an accepted connection whose first bytes came with the
                // accept: the application does not wait for this answer and may have read
                // them already (its `TcpConsume` follows in the ring), and a token then
                // would say readable with nothing to read (a select-driven program — iperf3
                // — then blocks in read for good). Every wait on A in the kernel asks for
                // tokens first (`Posix::tokens_on`) and looks at its view, which has those
                // bytes, so nothing is missed.
                if new && readable_now(&sh.lo, &g.kind) {
                    sh.ph_actions.push((gid, true, false));
                }
                Ok(handle as u64)
            }
            AttachOp::Adopt => {
                fresh_handle(self)?;
                let a = fds.pop().expect("one descriptor");
                let ident =
                    placeholder::identity(a.as_fd()).map_err(|_| SocketError::InvalidArgument)?;
                let Some(&gid) = sh.by_ident.get(&ident) else {
                    // A socket of another engine (passed to an unrelated process): its
                    // bytes and events cannot move here (README, limits).
                    return Err(match sh.ports.ident_engine(ident) {
                        Some(e) if e != sh.me => {
                            sh.counters.cross_engine_attach += 1;
                            SocketError::InvalidState
                        }
                        _ => SocketError::InvalidHandle,
                    });
                };
                let g = sh.socks.get_mut(&gid).ok_or(SocketError::InvalidHandle)?;
                self.handles.insert(handle, gid);
                g.owners.push((self.id, handle));
                // The holder stays: this application receives once it asks (`hold`).
                let kind = match &g.kind {
                    Kind::Fresh {
                        ty: SockType::Dgram,
                        ..
                    }
                    | Kind::Udp(_) => 6,
                    Kind::Fresh { .. } => 1,
                    Kind::Listener { .. } => 2,
                    Kind::Conn(_) => 3,
                    Kind::Failed(_) => 5,
                };
                super::fuse::tell_adopter(sh, self, gid, handle);
                Ok((kind as u64) << 32 | handle as u64)
            }
            // Taken above.
            AttachOp::File | AttachOp::Wake | AttachOp::Pool | AttachOp::Repool => {
                Err(SocketError::InvalidArgument)
            }
            AttachOp::KernelListener => {
                let k = fds.pop().expect("one descriptor");
                let gid = self.gid(handle)?;
                match sh.socks.get_mut(&gid).map(|g| &mut g.kind) {
                    Some(Kind::Listener { kernel, .. }) => {
                        *kernel = Some(k);
                        sh.note_kernel_listener(gid);
                        Ok(0)
                    }
                    _ => Err(SocketError::InvalidState),
                }
            }
        }
    }
}

impl App {
    /// `Hold`: which application receives socket `handle` (its bytes, end of stream,
    /// errors and send credit; module docs of `app`). `Take` moves it here; `Release` leaves it to nobody if it is here — received bytes then
    /// wait in the engine, the window as its buffer allows, until someone takes it. The
    /// application that loses it is told `Unheld`. Answers 1 if this application holds
    /// the socket afterwards.
    pub(super) fn hold(
        &mut self,
        sh: &mut Shared,
        handle: u32,
        how: HoldHow,
    ) -> Result<u64, SocketError> {
        let gid = self.gid(handle)?;
        let me = (self.id, handle);
        let g = sh.socks.get_mut(&gid).ok_or(SocketError::InvalidHandle)?;
        match how {
            HoldHow::Release => {
                if g.holder == Some(me) {
                    g.holder = None;
                    sh.counters.holds_released += 1;
                    // Also wakes this application's threads sleeping on its wake-up
                    // channel, so a wait on the socket takes it again. (The POSIX layer
                    // gives up no socket that may be waited on in the kernel.)
                    self.post(unheld(handle));
                }
                Ok(0)
            }
            _ if g.holder == Some(me) => Ok(1),
            HoldHow::Take => {
                let old = g.holder.replace(me);
                // What the previous holder has in its area is its own to read.
                match &mut g.kind {
                    Kind::Conn(c) => c.outstanding = 0,
                    Kind::Udp(d) => d.outstanding = 0,
                    _ => {}
                }
                sh.counters.holds_moved += 1;
                match old {
                    Some((app, h)) if app == self.id => self.post(unheld(h)),
                    Some(other) => sh.unheld.push(other),
                    None => {}
                }
                notify::on_new_holder(sh, gid, self.id);
                super::fuse::tell_holder(sh, self, gid, handle);
                Ok(1)
            }
        }
    }

    /// `Attach{Pool}`: D then A of each pair; keeps (A's identity, D) in order, or none of
    /// them if any pair is refused (not a socket pair, a known identity) or the pool would
    /// pass [`POOL_MAX`]. A pooled pair is no socket yet: it is not polled for its last
    /// close, not counted against the socket limit, and its D is closed with the
    /// application (a forked child's copies of the pooled A's change nothing here).
    fn fill_pool(&mut self, sh: &mut Shared, fds: Vec<OwnedFd>) -> Result<u64, SocketError> {
        if self.pool.len() + fds.len() / 2 > POOL_MAX {
            return Err(SocketError::InvalidArgument);
        }
        let before = self.pool.len();
        let mut it = fds.into_iter();
        while let (Some(d), Some(a)) = (it.next(), it.next()) {
            let ok = pair_ident(a).ok().filter(|ident| {
                !sh.by_ident.contains_key(ident)
                    && sh.ports.ident_engine(*ident).is_none()
                    && !self.pool.iter().any(|(i, _, _)| i == ident)
            });
            match ok {
                Some(ident) => self.pool.push_back((ident, d, false)),
                None => {
                    self.pool.truncate(before);
                    return Err(SocketError::InvalidArgument);
                }
            }
        }
        sh.counters.pool_batches += 1;
        sh.counters.pool_pairs += (self.pool.len() - before) as u64;
        Ok(0)
    }

    /// Stops watching the pooled or kept D numbered `fd` (its A is closed everywhere: it
    /// would keep the watch set readable); true if this application holds it. Taken for a
    /// socket later, it is watched again (and that socket's last close is seen at once).
    pub(crate) fn unwatch_loose(&mut self, sh: &Shared, fd: i32) -> bool {
        for p in self.pool.iter_mut().chain(self.recycled.iter_mut()) {
            if std::os::fd::AsRawFd::as_raw_fd(&p.1) == fd {
                if p.2 {
                    sh.hups.remove(p.1.as_fd());
                    p.2 = false;
                }
                return true;
            }
        }
        false
    }

    /// Placeholder pairs pooled and not taken yet (`FlowstackdPlaceholdersWaiting`).
    pub(crate) fn pool_len(&self) -> usize {
        self.pool.len()
    }

    /// Recycled pairs not back in the pool yet (`FlowstackdPlaceholdersKept`).
    pub(crate) fn recycled_len(&self) -> usize {
        self.recycled.len()
    }

    /// `Forget { handle, recycle: true }`: the application's last descriptor is gone and it
    /// says no other process has one. If this application alone names the socket (no other
    /// one adopted it) and it is a TCP connection or a socket never connected, the socket is
    /// closed now as at its last close (`Shared::release`: queued bytes still go out, then
    /// FIN), and its pair is kept for the application's next sockets (1, or 3 if a token was
    /// ever written into D: A may hold it; filler in D is emptied here); otherwise this is a
    /// plain `Forget` (0; the pair lives until its last close). Listeners and datagram
    /// sockets are never kept.
    pub(super) fn forget_recycle(
        &mut self,
        sh: &mut Shared,
        handle: u32,
    ) -> Result<u64, SocketError> {
        let gid = self
            .handles
            .remove(&handle)
            .ok_or(SocketError::InvalidHandle)?;
        let room = self.pool.len() + self.recycled.len() < 2 * POOL_MAX;
        let kept = match sh.socks.get_mut(&gid) {
            Some(g)
                if room
                    && g.owners.as_slice() == [(self.id, handle)]
                    && matches!(
                        g.kind,
                        Kind::Conn(_)
                            | Kind::Fresh {
                                ty: SockType::Stream,
                                ..
                            }
                            | Kind::Failed(_)
                    ) =>
            {
                g.ph.take()
            }
            _ => None,
        };
        if let Some(ph) = &kept {
            sh.ph_owner_clear(ph);
            sh.by_ident.remove(&ph.ident);
            sh.ports.forget_ident(ph.ident);
        }
        // No placeholder left (kept) and no owner: released at once; else as any Forget.
        detach(sh, gid, self.id, handle, false);
        Ok(match kept {
            Some(ph) => {
                if ph.want_writable {
                    // Filler the application wrote into D (send buffer full, connect in
                    // progress) is still there: emptied before reuse.
                    let _ = placeholder::drain(ph.d.as_fd());
                }
                sh.counters.pool_recycled += 1;
                let dirty = ph.tokens;
                self.recycled.push_back((ph.ident, ph.d, ph.watched));
                if dirty {
                    3
                } else {
                    1
                }
            }
            None => 0,
        })
    }

    /// `Attach{Repool}`: the `n` oldest recycled pairs to the end of the pool.
    fn repool(&mut self, n: usize) -> Result<u64, SocketError> {
        if n == 0 || n > self.recycled.len() || self.pool.len() + n > 2 * POOL_MAX {
            return Err(SocketError::InvalidArgument);
        }
        let moved = self.recycled.drain(..n);
        self.pool.extend(moved);
        Ok(0)
    }
}

/// The event telling an application it no longer holds socket `handle`.
pub(super) fn unheld(handle: u32) -> EventRecord {
    EventRecord {
        kind: EventKind::Unheld,
        id: 0,
        handle,
        result: 0,
        offset: 0,
        len: 0,
    }
}

/// A placeholder's identity from the copy of A the application sent (closed here).
fn pair_ident(a: OwnedFd) -> Result<(u64, u64), SocketError> {
    placeholder::identity(a.as_fd()).map_err(|_| SocketError::InvalidArgument)
}
