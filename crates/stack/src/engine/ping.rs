//! ICMP echo: [`Engine::ping_send`] and the queue of replies [`Engine::ping_recv`] drains.

use super::Engine;
use crate::counters::Counter;
use crate::SocketError;
use flowstack_wire::icmpv4::Icmpv4Repr;
use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
use flowstack_wire::{Instant, Ipv4Address};

/// An echo reply received for [`Engine::ping_send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingReply {
    /// Who answered.
    pub from: Ipv4Address,
    /// Identifier.
    pub ident: u16,
    /// Sequence number.
    pub seq_no: u16,
    /// Payload length.
    pub len: usize,
    /// TTL of the reply.
    pub ttl: u8,
    /// First bytes of the payload (senders put a timestamp there).
    pub head: [u8; 16],
    /// When it arrived.
    pub at: Instant,
}

impl Engine {
    /// Sends an echo request.
    pub fn ping_send(
        &mut self,
        dst: Ipv4Address,
        ident: u16,
        seq_no: u16,
        data: &[u8],
    ) -> Result<(), SocketError> {
        let req = Icmpv4Repr::EchoRequest {
            ident,
            seq_no,
            data,
        };
        let csum = self.iface.checksum();
        let len = req.buffer_len();
        let now = self.now;
        self.iface
            .send_ip(now, dst, IpProtocol::Icmp, len, false, &mut |b| {
                req.emit(b, csum)
            })?;
        let c = self.iface.counters_mut();
        c.inc(Counter::IcmpOutMsgs);
        c.inc(Counter::IcmpOutEchos);
        Ok(())
    }

    /// Takes the oldest echo reply received.
    pub fn ping_recv(&mut self) -> Option<PingReply> {
        self.pings.pop_front()
    }

    /// Queues an echo reply from the receive path for [`Engine::ping_recv`]; when the queue
    /// is full the oldest reply makes room.
    pub(super) fn echo_reply_received(
        &mut self,
        now: Instant,
        ip: &Ipv4Repr,
        ident: u16,
        seq_no: u16,
        data: &[u8],
    ) {
        if self.pings.len() >= self.cfg.ping_queue {
            self.pings.pop_front();
        }
        let mut head = [0u8; 16];
        let n = data.len().min(16);
        head[..n].copy_from_slice(&data[..n]);
        self.pings.push_back(PingReply {
            from: ip.src,
            ident,
            seq_no,
            len: data.len(),
            ttl: ip.ttl,
            head,
            at: now,
        });
    }
}
