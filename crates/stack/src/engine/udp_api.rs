//! UDP socket calls (`udp_*`). They take no clock: see the time contract on [`Engine`].

use super::{ephemeral_port, Engine};
use crate::counters::Counter;
use crate::udp::UdpHandle;
use crate::SocketError;
use flowstack_wire::ipv4::{self, IpProtocol};
use flowstack_wire::udp::{self as wudp, UdpRepr};
use flowstack_wire::Ipv4Address;
use std::net::SocketAddrV4;

impl Engine {
    /// Binds a UDP socket to `port` (0 picks an ephemeral port).
    pub fn udp_bind(&mut self, port: u16) -> Result<UdpHandle, SocketError> {
        let port = if port == 0 {
            let udp = &self.udp;
            ephemeral_port(&mut self.next_port, self.cfg.ephemeral, |p| udp.is_bound(p))?
        } else {
            port
        };
        self.udp.bind(port)
    }

    /// The local port of a UDP socket.
    pub fn udp_local_port(&mut self, h: UdpHandle) -> Result<u16, SocketError> {
        self.udp.local_port(h)
    }

    /// Sends one datagram. Larger than the MTU → fragmented; larger than 65507 bytes →
    /// `MessageTooLong`.
    pub fn udp_send_to(
        &mut self,
        h: UdpHandle,
        dst: SocketAddrV4,
        data: &[u8],
    ) -> Result<(), SocketError> {
        let sport = self.udp.local_port(h)?;
        if data.len() > 65535 - ipv4::HEADER_LEN - wudp::HEADER_LEN {
            return Err(SocketError::MessageTooLong);
        }
        if dst.port() == 0 {
            return Err(SocketError::InvalidArgument);
        }
        let src = self.ip();
        let dip: Ipv4Address = (*dst.ip()).into();
        let repr = UdpRepr {
            src_port: sport,
            dst_port: dst.port(),
        };
        let csum = self.iface.checksum();
        let len = wudp::HEADER_LEN + data.len();
        let now = self.now;
        self.iface
            .send_ip(now, dip, IpProtocol::Udp, len, false, &mut |b| {
                b[wudp::HEADER_LEN..].copy_from_slice(data);
                repr.emit_header(b, src, dip, data.len(), csum);
            })?;
        self.iface.counters_mut().inc(Counter::UdpOutDatagrams);
        Ok(())
    }

    /// Receives one datagram into `buf`. Never truncates: if `buf` is too small the call fails
    /// with `BufferTooSmall` and the datagram stays queued.
    pub fn udp_recv_from(
        &mut self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<(usize, SocketAddrV4), SocketError> {
        self.udp.recv(h, buf)
    }

    /// Shows the next datagram (source, payload) to `take`, which returns whether to
    /// dequeue it (one copy, by the caller, straight from the queue). A pending error
    /// (ICMP) comes first; `WouldBlock` when none is queued.
    pub fn udp_take_with(
        &mut self,
        h: UdpHandle,
        take: impl FnOnce(SocketAddrV4, &[u8]) -> bool,
    ) -> Result<bool, SocketError> {
        self.udp.take_with(h, take)
    }

    /// True if a datagram (or an error) is waiting.
    pub fn udp_readable(&mut self, h: UdpHandle) -> bool {
        self.udp.readable(h)
    }

    /// Closes a UDP socket, freeing its port.
    pub fn udp_close(&mut self, h: UdpHandle) -> Result<(), SocketError> {
        self.udp.close(h)
    }
}
