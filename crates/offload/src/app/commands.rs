//! Executing an application's command records: each decoded, validated record does what it
//! names (listen, connect, send, consume, attach, ...), and the socket it names is marked for
//! the next turn (`marks`).

use super::*;

impl App {
    pub(super) fn execute(&mut self, sh: &mut Shared, rec: CommandRecord) {
        // The socket a command names is looked at by the next turn, as is one it creates.
        let named = marks::named(&rec.cmd).and_then(|h| self.handles.get(&h).copied());
        let created = self.next_local;
        self.run(sh, rec);
        let after = marks::named(&rec.cmd).and_then(|h| self.handles.get(&h).copied());
        for gid in named.into_iter().chain(after) {
            sh.mark(gid);
        }
        if self.next_local != created {
            if let Some(&gid) = self.handles.get(&created) {
                sh.mark(gid);
            }
        }
    }

    fn run(&mut self, sh: &mut Shared, rec: CommandRecord) {
        let CommandRecord { id, mode, cmd } = rec;
        match cmd {
            Command::TcpListen { port, backlog } => {
                let h = self.next_local;
                self.next_local += 1;
                if self.at_limit(sh) {
                    return self.complete(id, mode, h, Err(SocketError::LimitReached));
                }
                let gid = self.new_sock(
                    sh,
                    h,
                    Kind::Fresh {
                        ty: SockType::Stream,
                        bound: None,
                    },
                );
                let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
                let r = bind(sh, gid, any, BindOpts::new(0, self.uid))
                    .and_then(|_| listen(sh, gid, backlog));
                if let Err(e) = r {
                    set_failed(sh, gid, e);
                }
                self.complete(id, mode, h, r.map(|_| h as u64));
            }
            Command::TcpConnect { remote } => {
                let h = self.next_local;
                self.next_local += 1;
                if self.at_limit(sh) {
                    return self.complete(id, mode, h, Err(SocketError::LimitReached));
                }
                let gid = self.new_sock(
                    sh,
                    h,
                    Kind::Fresh {
                        ty: SockType::Stream,
                        bound: None,
                    },
                );
                self.connect(sh, id, mode, h, gid, remote);
            }
            Command::Connect { handle, remote } => match self.gid(handle) {
                Ok(gid) if udp::is_dgram(sh, gid) => {
                    let r = udp::connect(sh, gid, remote);
                    self.complete(id, mode, handle, r);
                }
                Ok(gid) => self.connect(sh, id, mode, handle, gid, remote),
                Err(e) => self.complete(id, mode, handle, Err(e)),
            },
            Command::Bind {
                handle,
                local,
                flags,
            } => {
                let opts = BindOpts::new(flags, self.uid);
                let r = self.gid(handle).and_then(|g| match udp::is_dgram(sh, g) {
                    true => udp::bind(sh, g, local),
                    false => bind(sh, g, local, opts),
                });
                self.complete(id, mode, handle, r.map(|p| p as u64));
            }
            Command::Listen { handle, backlog } => {
                let r = self.gid(handle).and_then(|g| listen(sh, g, backlog));
                self.complete(id, mode, handle, r.map(|p| p as u64));
            }
            Command::TcpAccept { listener } => self.accept(sh, id, mode, listener),
            Command::TcpSend {
                handle,
                offset,
                len,
            } => {
                // The client writes spans in order; whatever it names, the area it frees is
                // counted by what we took, so a lying client only garbles its own bytes.
                let Ok((off, len)) = check_span(offset, len, TX_SIZE) else {
                    self.stats.bad_records += 1;
                    sh.counters.bad_records += 1;
                    return;
                };
                let pos = self.tx_freed;
                self.tx_freed += len as u64;
                let area = LAYOUT.tx_off + off;
                let gid = self.gid(handle);
                let g = gid.unwrap_or(0);
                let r = match gid.map(|g| sh.socks.get_mut(&g).map(|g| &mut g.kind)) {
                    Ok(Some(Kind::Conn(c))) if c.closed_told => Err(SocketError::BrokenPipe),
                    Ok(Some(Kind::Conn(c)))
                        if c.pending_tx.is_empty()
                            && !self.mem_limited
                            && self.txzc.takes(len, !c.zc.is_empty()) =>
                    {
                        // A bulk span with nothing copied before it: sent from the transmit
                        // area itself (`txzc`), pinned there until done with; what the
                        // engine does not take now waits here as a span.
                        let e = &mut sh.lo.engines[c.eng];
                        c.direct_taken += self.txzc.send(&self.region, e, g, c, area, pos, len);
                        sh.counters.tx_zc_bytes += len as u64;
                        c.uncredited += len as u64;
                        c.sender = Some((self.id, handle));
                        overrun(&mut sh.lo, &mut sh.counters, c)
                    }
                    Ok(Some(Kind::Conn(c))) => {
                        // Bytes that cannot wait as a span go behind the spans waiting:
                        // those are copied first (`txzc::spill`).
                        txzc::spill(c);
                        // Nothing queued before them: copied from the transmit area straight
                        // into the engine's send buffer (its credit is told by the
                        // connection's next turn), the rest queued here.
                        let mut from = 0;
                        if c.pending_tx.is_empty() && !self.mem_limited {
                            let e = &mut sh.lo.engines[c.eng];
                            let region = &self.region;
                            from = e
                                .tcp_send_with(c.h, len, |dst, at| {
                                    // Checked span: the read does not fail. If it did, the
                                    // send buffer's memory may be a reused ring's (another
                                    // connection's bytes): zeros go out instead.
                                    if region.read_at(area + at, dst).is_none() {
                                        dst.fill(0);
                                    }
                                })
                                .unwrap_or(0);
                            c.direct_taken += from as u64;
                        }
                        if from < len {
                            let mut scratch = std::mem::take(&mut self.tx_scratch);
                            if scratch.len() < len - from {
                                // Grown once, never cleared: every byte used is read first.
                                scratch.resize(len - from, 0);
                            }
                            let rest = &mut scratch[..len - from];
                            let _ = self.region.read_at(area + from, rest);
                            c.pending_tx.extend(&*rest);
                            self.tx_scratch = scratch;
                        }
                        c.uncredited += len as u64;
                        c.sender = Some((self.id, handle));
                        overrun(&mut sh.lo, &mut sh.counters, c)
                    }
                    Ok(Some(Kind::Failed(e))) => Err(*e),
                    Ok(Some(_)) => Err(SocketError::NotConnected),
                    _ => Err(SocketError::InvalidHandle),
                };
                // Every byte of the span is read or pinned (or belongs to no connection): the
                // client may write over what is not pinned.
                self.publish_tx_freed();
                self.complete(id, mode, handle, r);
            }
            Command::TcpConsume { handle, len } => {
                // Only the holder's consumption counts: bytes a previous holder reads from
                // its own area were taken off the count when the socket moved (`hold`).
                let g = self.gid(handle).ok().and_then(|g| sh.socks.get_mut(&g));
                match g {
                    Some(g) if g.holder != Some((self.id, handle)) => {}
                    Some(GSock {
                        kind: Kind::Conn(c),
                        ..
                    }) => c.outstanding = c.outstanding.saturating_sub(len),
                    Some(g) => udp::consumed(&mut g.kind, len),
                    None => {}
                }
                self.complete(id, mode, handle, Ok(0));
            }
            Command::TcpShutdown { handle } => {
                let r = match self.sock_kind(&mut sh.socks, handle) {
                    Some(Kind::Conn(c)) => {
                        c.shutdown_pending = true;
                        Ok(0)
                    }
                    Some(_) => Err(SocketError::NotConnected),
                    None => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::Forget {
                handle,
                recycle: true,
            } => {
                self.files.remove(&handle);
                let r = self.forget_recycle(sh, handle);
                self.complete(id, mode, handle, r);
            }
            Command::TcpClose { handle } | Command::Forget { handle, .. } => {
                self.files.remove(&handle);
                let r = match self.handles.remove(&handle) {
                    Some(gid) => {
                        detach(
                            sh,
                            gid,
                            self.id,
                            handle,
                            !matches!(cmd, Command::Forget { .. }),
                        );
                        Ok(0)
                    }
                    None => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::TcpAbort { handle } => {
                let r = match self.sock_kind(&mut sh.socks, handle) {
                    Some(Kind::Conn(c)) => {
                        c.pending_tx.clear();
                        c.zc = txzc::ConnSpans::default();
                        sh.lo.engines[c.eng].tcp_abort(c.h).map(|_| 0)
                    }
                    _ => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::TcpSetNodelay { handle, on } => {
                let r = match self.sock_kind(&mut sh.socks, handle) {
                    Some(Kind::Conn(c)) => sh.lo.engines[c.eng].tcp_set_nodelay(c.h, on).map(|_| 0),
                    Some(Kind::Failed(e)) => Err(*e),
                    // Kept for the connection to come (as setsockopt before connect).
                    Some(_) => Ok(0),
                    None => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::TcpSendFile {
                handle,
                offset,
                len,
            } => {
                let r = self.send_file(sh, handle, offset, len);
                self.complete(id, mode, handle, r);
            }
            Command::FileRelease { handle } => {
                let r = match self.files.remove(&handle) {
                    Some(_) => Ok(0),
                    None => Err(SocketError::InvalidHandle),
                };
                self.complete(id, mode, handle, r);
            }
            Command::UdpSendTo {
                handle,
                dst,
                offset,
                len,
            } => {
                let Some((scratch, len)) = self.take_dgram_span(sh, offset, len) else {
                    return;
                };
                let r = match self.gid(handle) {
                    Ok(g) if udp::is_dgram(sh, g) => udp::send(sh, g, dst, &scratch[..len]),
                    Ok(_) => Err(SocketError::InvalidState),
                    Err(e) => Err(e),
                };
                self.tx_scratch = scratch;
                self.complete(id, mode, handle, r);
            }
            Command::UdpCarries { remote } => {
                let yes = udp::carries(sh, remote);
                self.complete(id, mode, 0, Ok(yes as u64));
            }
            Command::UdpBind { .. } => self.complete(id, mode, 0, Err(SocketError::InvalidState)),
            Command::UdpClose { handle } => {
                self.complete(id, mode, handle, Err(SocketError::InvalidHandle))
            }
            Command::Attach { handle, op, ty } => {
                let r = self.attach(sh, handle, op, ty);
                if r.is_err() {
                    sh.counters.bad_records += 1;
                }
                self.complete(id, mode, handle, r);
            }
            Command::TokenCleared { handle, .. } => {
                if let Ok(gid) = self.gid(handle) {
                    token_cleared(sh, gid);
                }
            }
            Command::WantWritable { handle } => {
                if let Ok(gid) = self.gid(handle) {
                    // A send that found no area room waits for it, not for credit.
                    let full = self.tx_area_full();
                    if full {
                        self.txzc.wait_for_room(gid, handle);
                    }
                    want_writable(sh, gid, !full);
                }
            }
            Command::SetNotify { handle, quiet } => {
                notify::set_notify(sh, self.gid(handle), self.id, quiet)
            }
            Command::Carries { remote } => {
                // Our own listeners on the loopback, and anything the real link reaches.
                let yes = (is_loopback(remote.ip())
                    && sh.ports.listening(*remote.ip(), remote.port()))
                    || sh.lo.via_link(remote.ip());
                self.complete(id, mode, 0, Ok(yes as u64));
            }
            Command::GetAddr { handle, peer } => {
                let r = self.gid(handle).and_then(|g| {
                    let k = sh.socks.get(&g).map(|g| &g.kind);
                    k.and_then(|k| udp::addr_of(k, peer))
                        .unwrap_or_else(|| addr_of(sh, g, peer))
                });
                let r = r.map(|a| (u32::from(*a.ip()) as u64) << 16 | a.port() as u64);
                self.complete(id, mode, handle, r);
            }
            Command::TcpInfo { handle, part } => {
                let r = self
                    .gid(handle)
                    .and_then(|g| match sh.socks.get(&g).map(|g| &g.kind) {
                        Some(Kind::Conn(c)) => sh.lo.engines[c.eng].tcp_info(c.h),
                        _ => Err(SocketError::InvalidState),
                    });
                let r = r.map(|i| snapshot::linux_tcp_info(&i).part(part).unwrap_or(0));
                self.complete(id, mode, handle, r);
            }
            Command::Hold { handle, how } => {
                let r = self.hold(sh, handle, how);
                self.complete(id, mode, handle, r);
            }
            Command::Pipe { handle, op } => match self.gid(handle) {
                Ok(gid) => super::fuse::on_command(sh, gid, op),
                Err(e) => self.complete(id, mode, handle, Err(e)),
            },
            Command::Report { kind, .. } => {
                if let Some(c) = sh.counters.fallbacks.get_mut(kind as usize) {
                    *c += 1;
                }
            }
        }
    }
}
