//! [`Client`] as a [`Sockets`] implementation: the calls the stack's own applications make,
//! each a command on the ring (async, or sync through [`Client::complete`]) or a read of the
//! socket's shared areas.

use super::*;
use layout::SOCK_SNDBUF;

impl Sockets for Client {
    fn tcp_listen(&mut self, port: u16, backlog: usize) -> Result<TcpHandle, SocketError> {
        if port == 0 {
            return Err(SocketError::InvalidArgument);
        }
        let h = self.alloc_handle();
        self.socks.insert(
            h,
            Sock {
                listener: true,
                ..Sock::default()
            },
        );
        let backlog = backlog.min(u32::MAX as usize) as u32;
        self.post(Mode::Async, Command::TcpListen { port, backlog })?;
        Ok(TcpHandle::from_raw(h as usize))
    }

    fn tcp_accept(&mut self, listener: TcpHandle) -> Result<TcpHandle, SocketError> {
        let l = Self::raw(listener)?;
        self.pump();
        let s = self.sock_mut(listener)?;
        if let Some(h) = s.accepted.pop_front() {
            return Ok(TcpHandle::from_raw(h as usize));
        }
        if let Some(e) = s.error {
            return Err(e);
        }
        // Ask without waiting for a connection: the daemon answers at once.
        let id = self.post(Mode::Async, Command::TcpAccept { listener: l })?;
        self.waiting.insert(id);
        let (_, h) = self.complete(id, Duration::from_secs(5))?;
        Ok(TcpHandle::from_raw(h as u32 as usize))
    }

    fn tcp_connect(&mut self, remote: SocketAddrV4) -> Result<TcpHandle, SocketError> {
        let h = self.alloc_handle();
        self.socks.insert(h, Sock::default());
        self.post(Mode::Async, Command::TcpConnect { remote })?;
        Ok(TcpHandle::from_raw(h as usize))
    }

    fn tcp_send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, SocketError> {
        let raw = Self::raw(h)?;
        self.pump();
        let area_free = self.tx_room();
        let s = self.sock_mut(h)?;
        if let Some(e) = s.error {
            return Err(e);
        }
        if s.listener {
            return Err(SocketError::InvalidState);
        }
        if let Some(r) = self.pipe_send(raw, data) {
            return r;
        }
        let s = self.sock_mut(h)?;
        let n = (data.len() as u64)
            .min(SOCK_SNDBUF.saturating_sub(s.unflushed))
            .min(area_free) as usize;
        if n == 0 {
            self.area_blocked = area_free == 0 && !data.is_empty();
            return if data.is_empty() {
                Ok(0)
            } else {
                Err(SocketError::WouldBlock)
            };
        }
        s.unflushed += n as u64;
        // At most two spans: up to the end of the area, then from its start.
        let mut done = 0;
        while done < n {
            let pos = self.tx_head % self.tx_size;
            let chunk = ((self.tx_size - pos) as usize).min(n - done);
            let _ = self
                .region
                .write_at(self.tx_off + pos as usize, &data[done..done + chunk]);
            self.tx_head += chunk as u64;
            let cmd = Command::TcpSend {
                handle: raw,
                offset: pos,
                len: chunk as u64,
            };
            self.post(Mode::Async, cmd)?;
            done += chunk;
        }
        Ok(n)
    }

    fn tcp_send_zc(&mut self, h: TcpHandle, buf: Arc<[u8]>) -> Result<u64, SocketError> {
        // The bytes are copied into the transmit area, so the buffer is free at once.
        let s = self.sock(h)?;
        if buf.len() as u64 > SOCK_SNDBUF.saturating_sub(s.unflushed) {
            return Err(SocketError::WouldBlock);
        }
        let deadline = Duration::from_secs(5);
        self.send_all(h, &buf, deadline)?;
        let (_, next) = self.zc_tokens.entry(h.index() as u32).or_default();
        let t = *next;
        *next += 1;
        Ok(t)
    }

    fn tcp_zc_completion(&mut self, h: TcpHandle) -> Option<u64> {
        let (reported, next) = self.zc_tokens.get_mut(&(h.index() as u32))?;
        (*reported < *next).then(|| {
            *reported += 1;
            *reported - 1
        })
    }

    fn tcp_recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, SocketError> {
        let raw = Self::raw(h)?;
        self.pump();
        let s = self.sock_mut(h)?;
        if s.unread() > 0 {
            let n = self.read_unread(raw, buf, false);
            let s = self.sock_mut(h)?;
            s.unreported += n as u64;
            self.report_consumed(raw, false);
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // Nothing came out of a fused socket's pipe: it failed (its error is set).
        }
        let s = self.sock_mut(h)?;
        // Read by copying: its next bytes may stay in the area until read (`held`).
        s.direct = true;
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(e) = s.error {
            return Err(e);
        }
        if s.eof {
            return Ok(0);
        }
        if self.dead {
            return Err(SocketError::ConnectionReset);
        }
        Err(SocketError::WouldBlock)
    }

    fn tcp_peek(&self, h: TcpHandle, max: usize) -> Result<(&[u8], &[u8]), SocketError> {
        let s = self.sock(h)?;
        let (a, b) = s.rx.as_slices();
        let a = &a[..a.len().min(max)];
        let b = &b[..b.len().min(max - a.len())];
        Ok((a, b))
    }

    fn tcp_consume(&mut self, h: TcpHandle, n: usize) -> Result<(), SocketError> {
        let raw = Self::raw(h)?;
        self.sock(h)?;
        // Read in place from now on: every byte into the queue `tcp_peek` borrows from.
        self.evict_sock(raw, false);
        let s = self.sock_mut(h)?;
        if !s.peeking && s.pipe.is_some() {
            self.pulls.push(raw);
        }
        let s = self.sock_mut(h)?;
        s.peeking = true;
        let n = n.min(s.rx.len());
        s.rx.drain(..n);
        s.unreported += n as u64;
        self.report_consumed(raw, false);
        Ok(())
    }

    fn tcp_at_eof(&self, h: TcpHandle) -> bool {
        self.sock(h)
            .map(|s| s.eof && s.unread() == 0 && s.error.is_none())
            .unwrap_or(false)
    }

    fn tcp_shutdown(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        let raw = Self::raw(h)?;
        self.sock(h)?;
        self.post(Mode::Async, Command::TcpShutdown { handle: raw })
            .map(|_| ())
    }

    fn tcp_close(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        let raw = Self::raw(h)?;
        let s = self.socks.remove(&raw).ok_or(SocketError::InvalidHandle)?;
        // Its bytes still in the receive area are released with it.
        self.evict_sock(raw, false);
        self.zc_tokens.remove(&raw);
        self.drop_unclaimed(&s);
        self.post(Mode::Async, Command::TcpClose { handle: raw })
            .map(|_| ())
    }

    fn tcp_abort(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        let raw = Self::raw(h)?;
        self.sock(h)?;
        self.post(Mode::Async, Command::TcpAbort { handle: raw })
            .map(|_| ())
    }

    fn tcp_poll(&self, h: TcpHandle) -> Result<Readiness, SocketError> {
        let s = self.sock(h)?;
        Ok(Readiness {
            readable: s.unread() > 0 || s.eof || s.error.is_some() || !s.accepted.is_empty(),
            writable: !s.listener
                && s.error.is_none()
                && s.pipe_writable()
                    .unwrap_or(s.open && s.unflushed < SOCK_SNDBUF),
            error: s.error,
        })
    }

    fn tcp_is_open(&self, h: TcpHandle) -> bool {
        self.sock(h)
            .map(|s| s.open && !s.eof && s.error.is_none())
            .unwrap_or(false)
    }

    fn tcp_send_queue(&self, h: TcpHandle) -> Result<usize, SocketError> {
        Ok(self.sock(h)?.unflushed as usize)
    }

    fn tcp_set_nodelay(&mut self, h: TcpHandle, on: bool) -> Result<(), SocketError> {
        let raw = Self::raw(h)?;
        if let Some(e) = self.sock(h)?.error {
            return Err(e);
        }
        self.post(Mode::Async, Command::TcpSetNodelay { handle: raw, on })
            .map(|_| ())
    }

    fn tcp_error(&self, h: TcpHandle) -> Option<SocketError> {
        self.sock(h).ok().and_then(|s| s.error)
    }

    fn tcp_connections(&self) -> usize {
        self.socks.values().filter(|s| !s.listener).count()
    }

    // UDP over the daemon is not in the first slice.
    fn udp_bind(&mut self, _port: u16) -> Result<UdpHandle, SocketError> {
        Err(SocketError::InvalidState)
    }
    fn udp_local_port(&mut self, _h: UdpHandle) -> Result<u16, SocketError> {
        Err(SocketError::InvalidHandle)
    }
    fn udp_send_to(
        &mut self,
        _h: UdpHandle,
        _dst: SocketAddrV4,
        _data: &[u8],
    ) -> Result<(), SocketError> {
        Err(SocketError::InvalidHandle)
    }
    fn udp_recv_from(
        &mut self,
        _h: UdpHandle,
        _buf: &mut [u8],
    ) -> Result<(usize, SocketAddrV4), SocketError> {
        Err(SocketError::InvalidHandle)
    }
    fn udp_close(&mut self, _h: UdpHandle) -> Result<(), SocketError> {
        Err(SocketError::InvalidHandle)
    }
}
