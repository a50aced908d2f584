//! TCP socket calls (`tcp_*`). They take no clock: see the time contract on [`Engine`].

use super::{ephemeral_port, Engine, Steering};
use crate::tcp_socket::{self, TcpHandle};
use crate::{Readiness, SocketError};
use flowstack_tcp::sendq::{ExtBuf, SharedOwner};
use flowstack_tcp::{Connection, FourTuple, State, TcpConfig, TcpError};
use flowstack_wire::ipv4;
use flowstack_wire::rss::{queue_of, Toeplitz};
use flowstack_wire::tcp as wtcp;
use flowstack_wire::Ipv4Address;
use std::net::SocketAddrV4;

impl Engine {
    /// The engine's default TCP configuration for new sockets (`EngineConfig::tcp.defaults`).
    pub fn tcp_defaults(&self) -> TcpConfig {
        self.tcp.defaults()
    }

    /// Listens on `port` with the engine's default TCP configuration.
    pub fn tcp_listen(&mut self, port: u16, backlog: usize) -> Result<TcpHandle, SocketError> {
        let cfg = self.tcp.defaults();
        self.tcp_listen_with(port, backlog, cfg)
    }

    /// Listens on `port`; accepted connections use `cfg`.
    pub fn tcp_listen_with(
        &mut self,
        port: u16,
        backlog: usize,
        mut cfg: TcpConfig,
    ) -> Result<TcpHandle, SocketError> {
        self.fit_to_device(&mut cfg);
        self.tcp.listen(port, backlog, cfg)
    }

    /// Clamps the MSS to the link and enables segmentation offload when the device takes
    /// TCP segments larger than its MTU. A device that segments cuts at the link's MSS, so
    /// offload is only for sockets that announce the link's full MSS (and TCP uses it only
    /// while the effective send MSS is that large, see `Connection::mss`).
    fn fit_to_device(&self, cfg: &mut TcpConfig) {
        let link_mss = (self.iface.max_payload() - wtcp::HEADER_LEN) as u16;
        cfg.mss = cfg.mss.min(link_mss);
        let caps = self.iface.caps();
        cfg.max_tso_segment = if caps.max_tx_datagram > caps.mtu && cfg.mss == link_mss {
            caps.max_tx_datagram - ipv4::HEADER_LEN - wtcp::HEADER_LEN
        } else {
            0
        };
    }

    /// Takes an established connection from a listener's accept queue.
    pub fn tcp_accept(&mut self, listener: TcpHandle) -> Result<TcpHandle, SocketError> {
        self.tcp.accept(listener)
    }

    /// Appends the connections that may have news for their application since the last call:
    /// every one whose received or acknowledged bytes, state or error changed (a superset:
    /// each connection a poll dispatched — for a segment, a timer or an application call).
    /// An owner that asks after every poll can look at these instead of at every connection.
    pub fn tcp_take_changed(&mut self, out: &mut Vec<TcpHandle>) {
        self.tcp.take_changed(out);
    }

    /// Opens a connection to `remote` (non-blocking: poll until writable or failed).
    pub fn tcp_connect(&mut self, remote: SocketAddrV4) -> Result<TcpHandle, SocketError> {
        let cfg = self.tcp.defaults();
        self.tcp_connect_with(remote, cfg)
    }

    /// Opens a connection with a per-socket configuration.
    pub fn tcp_connect_with(
        &mut self,
        remote: SocketAddrV4,
        cfg: TcpConfig,
    ) -> Result<TcpHandle, SocketError> {
        self.tcp_connect_from(0, remote, cfg)
    }

    /// Opens a connection from a chosen local port (0 picks an ephemeral one); used for
    /// simultaneous open and by applications that bind before connecting.
    pub fn tcp_connect_from(
        &mut self,
        local_port: u16,
        remote: SocketAddrV4,
        mut cfg: TcpConfig,
    ) -> Result<TcpHandle, SocketError> {
        let rip: Ipv4Address = (*remote.ip()).into();
        if remote.port() == 0 || self.iface.is_broadcast(rip) || rip.is_multicast() {
            return Err(SocketError::InvalidArgument);
        }
        self.fit_to_device(&mut cfg);
        let local_ip = self.ip();
        let mut tuple = FourTuple {
            local_ip,
            local_port,
            remote_ip: rip,
            remote_port: remote.port(),
        };
        if local_port == 0 {
            let (tcp, rss, steering) = (&self.tcp, self.rss.as_deref(), self.cfg.steering);
            tuple.local_port = ephemeral_port(&mut self.next_port, self.cfg.ephemeral, |p| {
                let t = FourTuple {
                    local_port: p,
                    ..tuple
                };
                // Never two live connections (TIME-WAIT included) on one 4-tuple; and behind
                // a steered multi-queue link, only ports whose replies come back to us.
                tcp.tuple_in_use(&t) || !steers_to_us(rss, steering, &t)
            })?;
        }
        self.tcp.connect(self.now, tuple, cfg)
    }

    /// Queues bytes to send; returns how many were taken.
    pub fn tcp_send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, SocketError> {
        self.tcp_send_with(h, data.len(), |dst, at| {
            dst.copy_from_slice(&data[at..at + dst.len()])
        })
    }

    /// As [`Engine::tcp_send`] for up to `n` bytes that `fill(dst, at)` writes straight into
    /// the send buffer (bytes `at..at + dst.len()` of the `n`, at most two calls, in order):
    /// the offload daemon copies an application's bytes from its shared memory so, once.
    pub fn tcp_send_with(
        &mut self,
        h: TcpHandle,
        n: usize,
        fill: impl FnMut(&mut [u8], usize),
    ) -> Result<usize, SocketError> {
        // The whole socket call (lookup and copy) is the "application → socket" layer.
        let _p = flowstack_prof::enter(flowstack_prof::Layer::AppCopyIn);
        let c = self.tcp.conn_mut(h)?;
        let r = match c.send_with(n, fill) {
            Ok(0) if n > 0 => Err(SocketError::WouldBlock),
            Ok(n) => Ok(n),
            Err(TcpError::Aborted) if c.error().is_none() => Err(SocketError::BrokenPipe),
            Err(e) => Err(tcp_socket::map_err(e)),
        };
        if matches!(r, Ok(n) if n > 0) {
            self.tcp.touch(h);
        }
        r
    }

    /// Zero-copy send: queues an application-owned buffer without copying it (it must fit
    /// whole, else `WouldBlock`). Returns a token that [`Engine::tcp_zc_completion`] reports
    /// once the peer has acknowledged every byte; until then the buffer stays referenced.
    ///
    /// `buf` is a heap buffer (`Arc<[u8]>`) or an [`ExtBuf::Shared`] range of any owner of
    /// bytes (`send_file`'s mapped file windows); the queue drops its reference once the
    /// bytes are acknowledged (or the connection is released).
    pub fn tcp_send_zc(
        &mut self,
        h: TcpHandle,
        buf: impl Into<ExtBuf>,
    ) -> Result<u64, SocketError> {
        let _p = flowstack_prof::enter(flowstack_prof::Layer::AppCopyIn);
        let c = self.tcp.conn_mut(h)?;
        let r = match c.send_zc(buf) {
            Ok(Some(t)) => Ok(t),
            Ok(None) => Err(SocketError::WouldBlock),
            Err(TcpError::Aborted) if c.error().is_none() => Err(SocketError::BrokenPipe),
            Err(e) => Err(tcp_socket::map_err(e)),
        };
        if r.is_ok() {
            self.tcp.touch(h);
        }
        r
    }

    /// The token of a zero-copy send whose bytes are all acknowledged, if any (oldest
    /// first). Optional: the buffer is released when acknowledged whether or not its token
    /// is taken, and a token not taken costs the connection nothing (a count, not a list),
    /// so it never keeps the connection's memory from being released at rest.
    pub fn tcp_zc_completion(&mut self, h: TcpHandle) -> Option<u64> {
        self.tcp.conn_mut(h).ok()?.take_zc_completion()
    }

    /// Gives back the memory `owner` lent to zero-copy sends on `h` before it is
    /// acknowledged: their unacknowledged bytes are copied to the heap (an allocation: for a
    /// lender under pressure only) and the queue's references to `owner` are dropped.
    /// Returns the bytes copied (0 if nothing of `owner` is queued).
    pub fn tcp_zc_rehome(
        &mut self,
        h: TcpHandle,
        owner: &SharedOwner,
    ) -> Result<usize, SocketError> {
        Ok(self.tcp.conn_mut(h)?.rehome_zc(owner))
    }

    /// Reads received bytes; `Ok(0)` means the peer closed (end of stream).
    pub fn tcp_recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, SocketError> {
        let _p = flowstack_prof::enter(flowstack_prof::Layer::AppCopyOut);
        let c = self.tcp.conn_mut(h)?;
        match c.recv(buf) {
            Ok(n) => {
                // Reading frees window: a window update may be due.
                self.tcp.touch(h);
                Ok(n)
            }
            Err(Some(e)) => Err(tcp_socket::map_err(e)),
            Err(None) if c.state() == State::Closed => Err(SocketError::NotConnected),
            Err(None) => Err(SocketError::WouldBlock),
        }
    }

    /// Zero-copy receive: borrows up to `max` readable bytes in place (at most two slices,
    /// the receive ring may wrap). Call [`Engine::tcp_consume`] with how many were used.
    pub fn tcp_peek(&self, h: TcpHandle, max: usize) -> Result<(&[u8], &[u8]), SocketError> {
        let c = self.tcp.conn(h)?;
        if c.recv_queue() == 0 {
            if let Some(e) = c.error() {
                return Err(tcp_socket::map_err(e));
            }
        }
        Ok(c.peek_recv(max))
    }

    /// Marks `n` peeked bytes as read (frees receive window).
    pub fn tcp_consume(&mut self, h: TcpHandle, n: usize) -> Result<(), SocketError> {
        let _p = flowstack_prof::enter(flowstack_prof::Layer::AppCopyOut);
        self.tcp.conn_mut(h)?.consume(n);
        self.tcp.touch(h);
        Ok(())
    }

    /// Limits the receive window to what the reader beyond the buffer can take
    /// ([`Connection::set_read_limit`]); a window it opens is announced.
    pub fn tcp_set_read_limit(&mut self, h: TcpHandle, limit: usize) -> Result<(), SocketError> {
        if self.tcp.conn_mut(h)?.set_read_limit(limit) {
            self.tcp.touch(h);
        }
        Ok(())
    }

    /// True once the peer's FIN has been received and every byte before it read.
    pub fn tcp_at_eof(&self, h: TcpHandle) -> bool {
        self.tcp
            .conn(h)
            .map(|c| c.recv_queue() == 0 && c.is_readable() && c.error().is_none())
            .unwrap_or(false)
    }

    /// Closes the sending side (FIN); reading continues.
    pub fn tcp_shutdown(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        self.tcp.conn_mut(h)?.shutdown_write();
        self.tcp.touch(h);
        Ok(())
    }

    /// Releases the handle; the connection closes gracefully in the background.
    pub fn tcp_close(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        self.tcp.close(self.now, h)
    }

    /// Resets the connection (RST) and releases nothing: close the handle afterwards.
    pub fn tcp_abort(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        let now = self.now;
        self.tcp.conn_mut(h)?.abort(now);
        self.tcp.touch(h);
        Ok(())
    }

    /// The connection with 4-tuple `t` (local address and port first), if the application
    /// owns one: how the offload daemon finds a loopback connection's other end.
    pub fn tcp_find(&self, t: &FourTuple) -> Option<TcpHandle> {
        self.tcp.find(t)
    }

    /// The connection behind a handle (state, statistics, readiness).
    pub fn tcp_conn(&self, h: TcpHandle) -> Result<&Connection, SocketError> {
        self.tcp.conn(h)
    }

    /// Mutable access for per-socket options (no-delay, keepalive).
    /// The connection is queued for the next dispatch, as anything may change.
    pub fn tcp_conn_mut(&mut self, h: TcpHandle) -> Result<&mut Connection, SocketError> {
        self.tcp.conn(h)?;
        self.tcp.touch(h);
        self.tcp.conn_mut(h)
    }

    /// Readiness of a TCP socket: what a `poll(2)` on it would report.
    pub fn tcp_poll(&self, h: TcpHandle) -> Result<Readiness, SocketError> {
        if let Ok(n) = self.tcp.accept_queue_len(h) {
            return Ok(Readiness {
                readable: n > 0,
                writable: false,
                error: None,
            });
        }
        let c = self.tcp.conn(h)?;
        Ok(Readiness {
            readable: c.is_readable(),
            writable: c.is_writable(),
            error: c.error().map(tcp_socket::map_err),
        })
    }

    /// Sets TCP_NODELAY (disables Nagle) on a connection.
    pub fn tcp_set_nodelay(&mut self, h: TcpHandle, on: bool) -> Result<(), SocketError> {
        self.tcp.conn_mut(h)?.set_nodelay(on);
        self.tcp.touch(h);
        Ok(())
    }

    /// Turns keepalive on (with its timers) or off.
    pub fn tcp_set_keepalive(
        &mut self,
        h: TcpHandle,
        k: Option<flowstack_tcp::Keepalive>,
    ) -> Result<(), SocketError> {
        let now = self.now;
        self.tcp.conn_mut(h)?.set_keepalive(k, now);
        self.tcp.touch(h);
        Ok(())
    }

    /// TCP_INFO of a connection: RTT, RTO, MSS, windows, queues, retransmissions.
    pub fn tcp_info(&self, h: TcpHandle) -> Result<flowstack_tcp::TcpInfo, SocketError> {
        Ok(self.tcp.conn(h)?.info())
    }

    /// Sets the user timeout (RFC 5482, TCP_USER_TIMEOUT) of a connection.
    pub fn tcp_set_user_timeout(
        &mut self,
        h: TcpHandle,
        t: Option<flowstack_wire::Duration>,
    ) -> Result<(), SocketError> {
        self.tcp.conn_mut(h)?.set_user_timeout(t);
        Ok(())
    }

    /// Releases the handle with SO_LINGER semantics: `Duration::ZERO` resets the connection
    /// at once; otherwise it closes gracefully and is reset if the close has not completed
    /// within `linger` (the call itself never blocks).
    pub fn tcp_close_linger(
        &mut self,
        h: TcpHandle,
        linger: flowstack_wire::Duration,
    ) -> Result<(), SocketError> {
        let now = self.now;
        self.tcp.conn_mut(h)?.close_linger(now, linger);
        self.tcp.touch(h);
        self.tcp.release(h)
    }

    /// The error that ended a connection, as a socket error.
    pub fn tcp_error(&self, h: TcpHandle) -> Option<SocketError> {
        self.tcp.conn(h).ok()?.error().map(tcp_socket::map_err)
    }

    /// Connections in any state.
    pub fn tcp_connections(&self) -> usize {
        self.tcp.connections()
    }

    /// Entries in the TCP timer heap, stale ones included (at most about two per connection
    /// plus 64: stale entries are dropped once they outnumber the connections).
    pub fn tcp_timer_entries(&self) -> usize {
        self.tcp.timer_entries()
    }

    /// Bytes of memory the TCP socket table accounts for: table slots, connections with the
    /// heap they hold (buffers, reassembly, SACK and RACK lists), listeners, demux maps and
    /// timer structures (see `bench conns`).
    pub fn tcp_accounted_bytes(&self) -> usize {
        self.tcp.accounted_bytes()
    }

    /// Every connection (for `ss`-like listings).
    pub fn tcp_iter(&self) -> impl Iterator<Item = &Connection> {
        self.tcp.iter()
    }
}

/// True when the peer's packets of 4-tuple `t` will be steered to this engine's queue (always,
/// for a lone engine). The hash input is the received direction — remote address, local
/// address, remote port, local port — though with the symmetric key either direction gives
/// the same hash.
fn steers_to_us(rss: Option<&Toeplitz>, steering: Option<Steering>, t: &FourTuple) -> bool {
    match (rss, steering) {
        (Some(h), Some(s)) => {
            let hash = h.hash_v4(t.remote_ip, t.local_ip, t.remote_port, t.local_port);
            queue_of(hash, s.queues) == s.queue
        }
        _ => true,
    }
}
