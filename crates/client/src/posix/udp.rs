//! UDP (`SOCK_DGRAM`) sockets of the POSIX layer.
//!
//! A datagram socket has a placeholder like a stream socket (so poll/select/epoll, fork,
//! exec, dup and last close behave the same) and stays in state `Fresh` here; the daemon
//! binds it (`Command::Bind`, or at its first send or connect: an ephemeral port), keeps its
//! default peer (`Command::Connect`, 0.0.0.0:0 dissolves it) and delivers each datagram
//! with its source (`EventKind::Datagram`), which the client keeps whole (`Sock::dgrams`).
//! - `send_to`: one datagram per call, `EMSGSIZE` above 65507 bytes, `EDESTADDRREQ` without
//!   a destination on an unconnected socket; never partial.
//! - `recv_from`: the next datagram; a short buffer gets its first bytes and the rest is
//!   discarded (the returned length is the datagram's, so the caller can report
//!   `MSG_TRUNC`); `peek` leaves it queued.
//! - `FIONREAD` ([`Posix::readable_bytes`]): the next datagram's size.
//! - Readiness: readable while a datagram (or a connected socket's ICMP error) waits,
//!   always writable. The shim's epoll watches datagram sockets in the kernel's set (their
//!   tokens), not from the view.

use super::*;
use flowstack_api::region::{dgram_charge, MAX_DGRAM, UDP_RCVBUF};

/// `EMSGSIZE`.
const EMSGSIZE: Errno = Errno(90);
/// `EDESTADDRREQ`.
const EDESTADDRREQ: Errno = Errno(89);

impl Posix {
    /// True if `id` is a datagram socket.
    pub fn is_dgram(&self, id: SockId) -> Result<bool, Errno> {
        Ok(self.lock()?.sock_as_is(id)?.dgram)
    }

    /// Would a datagram from socket `id` to `addr` be carried (a flowstack UDP socket holds
    /// that loopback port)? The daemon is asked once per destination change of the socket:
    /// a socket sending to the same destination again (a client to its server, a server
    /// answering the same client) costs no round trip. If that destination's flowstack
    /// socket closed meanwhile, its datagrams are lost as they would be to a closed kernel
    /// port (only a kernel socket opened on that port since would have heard them).
    pub fn carries_dgram(&self, id: SockId, addr: SocketAddrV4) -> Result<bool, Errno> {
        let mut g = self.lock()?;
        if g.sock_as_is(id)?.carried_dst == Some(addr) {
            return Ok(true);
        }
        let c = g.client.as_mut().expect("registered");
        let yes = sync(c, Command::UdpCarries { remote: addr })? == 1;
        g.sock_as_is(id)?.carried_dst = yes.then_some(addr);
        Ok(yes)
    }

    /// `connect(2)` of a datagram socket: sets its default peer (0.0.0.0:0, `AF_UNSPEC`:
    /// none); binds it first if it is not bound.
    pub(super) fn udp_connect(&self, id: SockId, addr: SocketAddrV4) -> Result<(), Errno> {
        let mut g = self.lock()?;
        g.sock(id)?;
        let c = g.client.as_mut().expect("registered");
        let remote = addr;
        sync(
            c,
            Command::Connect {
                handle: id.0,
                remote,
            },
        )?;
        let unspec = addr.ip().is_unspecified() && addr.port() == 0;
        g.sock(id)?.remote = (!unspec).then_some(addr);
        Ok(())
    }

    /// `send(2)`/`sendto(2)`: `dst`, else the connected peer. Streams: [`Posix::send`]
    /// (the destination is ignored, as Linux does for TCP).
    pub fn send_to(
        &self,
        id: SockId,
        data: &[u8],
        dst: Option<SocketAddrV4>,
        nonblock: bool,
        timeout: Option<Duration>,
    ) -> Result<usize, Errno> {
        if !self.is_dgram(id)? {
            return self.send(id, data, nonblock, timeout);
        }
        if data.len() > MAX_DGRAM {
            return Err(EMSGSIZE);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            {
                let mut g = self.lock()?;
                let ps = g.sock(id)?;
                let dst = match dst.or(ps.remote) {
                    Some(d) if d.port() == 0 => return Err(Errno::EINVAL),
                    Some(d) => d,
                    None => return Err(EDESTADDRREQ),
                };
                let c = g.client.as_mut().expect("registered");
                c.pump();
                if c.dead {
                    return Err(Errno::EPIPE);
                }
                // An error the daemon reported (ICMP to a connected socket, a refused
                // send) is returned once, as Linux's next send does.
                if let Some(e) = c.socks.get_mut(&id.0).and_then(|s| s.error.take()) {
                    return Err(e.into());
                }
                match c.udp_post(id.0, data, dst) {
                    Ok(()) => return Ok(data.len()),
                    Err(SocketError::WouldBlock) if nonblock => return Err(Errno::EAGAIN),
                    Err(SocketError::WouldBlock) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            // The transmit area is full: the daemon empties it as it takes the records (no
            // event says so), so look again shortly, until the deadline.
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Errno::EAGAIN);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// `recv(2)`/`recvfrom(2)`: for a datagram socket, the datagram's full length (only
    /// what fits in `buf` is copied; the rest is discarded unless `peek`) and its source;
    /// for a stream, [`Posix::recv`] and no source.
    pub fn recv_from(
        &self,
        id: SockId,
        buf: &mut [u8],
        flags: RecvFlags,
        timeout: Option<Duration>,
    ) -> Result<(usize, Option<SocketAddrV4>), Errno> {
        if !self.is_dgram(id)? {
            return self.recv(id, buf, flags, timeout).map(|n| (n, None));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let a = {
                let mut g = self.lock()?;
                g.sock(id)?;
                let c = g.client.as_mut().expect("registered");
                c.pump();
                super::hold::take(c, id.0);
                let s = c.socks.get_mut(&id.0).ok_or(Errno::EBADF)?;
                if let Some(&(src, len)) = s.dgrams.front() {
                    let k = len.min(buf.len());
                    crate::copy_front(&s.rx, &mut buf[..k]);
                    if !flags.peek {
                        s.rx.drain(..len);
                        s.dgrams.pop_front();
                        s.unreported += dgram_charge(len as u64);
                        let many = s.unreported >= UDP_RCVBUF / 4;
                        let drained = s.dgrams.is_empty() && s.error.is_none();
                        c.report_consumed(id.0, many);
                        if drained && !c.dead {
                            // Not readable any more: take the token back now (as `recv`).
                            let _ = clear_tokens(&mut g, id);
                        }
                    }
                    return Ok((len, Some(src)));
                }
                if let Some(e) = s.error.take() {
                    return Err(e.into());
                }
                if c.dead {
                    return Err(Errno::ECONNRESET);
                }
                clear_tokens(&mut g, id)?;
                if flags.nonblock {
                    return Err(Errno::EAGAIN);
                }
                g.sock(id)?.a.try_clone().map_err(|_| Errno(24))?
            };
            wait_on(&a, true, false, deadline)?;
        }
    }
}
