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
        let mut byte = [0u8; 1];
        let mut fds = Vec::new();
        let n = flowstack_sys::fdpass::recv_fds(&self.stream, &mut byte, &mut fds)
            .map_err(|_| SocketError::InvalidArgument)?;
        if n != 1 || byte[0] != op.code() || fds.len() != op.fds() {
            return Err(SocketError::InvalidArgument);
        }
        if op == AttachOp::File {
            let f = fds.pop().expect("one descriptor");
            return self.attach_file(handle, f);
        }
        if op == AttachOp::Wake {
            return notify::attach_wake(self, fds.pop().expect("one descriptor"));
        }
        if matches!(op, AttachOp::New | AttachOp::Adopt) && self.at_limit(sh) {
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
            AttachOp::New | AttachOp::Place => {
                let a = fds.pop().expect("two descriptors");
                let d = fds.pop().expect("two descriptors");
                let ident =
                    placeholder::identity(a.as_fd()).map_err(|_| SocketError::InvalidArgument)?;
                drop(a);
                if sh.by_ident.contains_key(&ident) || sh.ports.ident_engine(ident).is_some() {
                    return Err(SocketError::InvalidArgument);
                }
                let ph = Placeholder {
                    d,
                    ident,
                    token_out: false,
                    seq: 0,
                    want_writable: false,
                    quiet_for: None,
                    handed: false,
                };
                let gid = if op == AttachOp::New {
                    fresh_handle(self)?;
                    self.new_sock(sh, handle, Kind::Fresh { ty, bound: None })
                } else {
                    let gid = self.gid(handle)?;
                    match sh.socks.get(&gid) {
                        Some(g) if g.ph.is_none() => gid,
                        _ => return Err(SocketError::InvalidArgument),
                    }
                };
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
                if op == AttachOp::New && readable_now(&sh.lo, &g.kind) {
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
                let kind = match &mut g.kind {
                    // Datagram sockets, bound or not: their bytes come here from now on.
                    Kind::Fresh {
                        ty: SockType::Dgram,
                        ..
                    } => 6,
                    Kind::Udp(d) => {
                        d.outstanding = 0;
                        6
                    }
                    Kind::Fresh { .. } => 1,
                    Kind::Listener { .. } => 2,
                    Kind::Conn(c) => {
                        // Its bytes and events come here from now on.
                        c.outstanding = 0;
                        3
                    }
                    Kind::Failed(_) => 5,
                };
                g.holder = Some((self.id, handle));
                notify::on_new_holder(sh, gid);
                Ok((kind as u64) << 32 | handle as u64)
            }
            AttachOp::File | AttachOp::Wake => Err(SocketError::InvalidArgument), // taken above
            AttachOp::KernelListener => {
                let k = fds.pop().expect("one descriptor");
                let gid = self.gid(handle)?;
                match sh.socks.get_mut(&gid).map(|g| &mut g.kind) {
                    Some(Kind::Listener { kernel, .. }) => {
                        *kernel = Some(k);
                        Ok(0)
                    }
                    _ => Err(SocketError::InvalidState),
                }
            }
        }
    }
}
