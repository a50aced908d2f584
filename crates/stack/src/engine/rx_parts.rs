//! Receiving a frame in two parts (`Device::recv_batch_parts`): headers, then a payload that
//! lies elsewhere — a zero-copy send's memory that an in-process link passed by reference
//! (scatter-gather transmit). The payload is copied once, by TCP into the receive buffer.
//!
//! Only one shape takes the short path: an unfragmented IPv4 TCP segment whose headers are
//! exactly the first part and whose payload is exactly the second, on a link where the TCP
//! checksum is not verified (a checksum would read the payload anyway). Every other frame is
//! made whole and received as usual, so every check and drop counter of `input.rs` applies.

use super::{Deliver, Engine};
use crate::counters::Counter;
use flowstack_link::RxMeta;
use flowstack_wire::ethernet::{self, EthernetRepr};
use flowstack_wire::ipv4::{self, IpProtocol, Ipv4Repr};
use flowstack_wire::tcp::{self as wtcp, TcpRepr};
use flowstack_wire::{EtherType, Instant};

impl Engine {
    /// Processes one received frame given as `head` followed by `tail` (empty for a whole
    /// frame), with what its device knows of it ([`Engine::receive_meta`]).
    pub fn receive_parts(&mut self, now: Instant, head: &[u8], tail: &[u8], meta: RxMeta) {
        self.receive_parts_to(now, head, tail, meta, &mut |_, _| 0)
    }

    /// [`Engine::receive_parts`], offering a two-part segment's in-order payload to
    /// `deliver` (see [`Engine::poll_to`]).
    pub fn receive_parts_to(
        &mut self,
        now: Instant,
        head: &[u8],
        tail: &[u8],
        meta: RxMeta,
        deliver: &mut Deliver,
    ) {
        if tail.is_empty() {
            return self.receive_meta(now, head, meta);
        }
        self.rx_l4_csum_ok = meta.l4_csum_ok;
        let done = self.receive_split_tcp(now, head, tail, deliver);
        self.rx_l4_csum_ok = false;
        if !done {
            let mut flat = std::mem::take(&mut self.rx_flat);
            flat.clear();
            flat.extend_from_slice(head);
            flat.extend_from_slice(tail);
            self.receive_meta(now, &flat, meta);
            self.rx_flat = flat;
        }
    }

    /// The short path; false (nothing done, nothing counted) if the frame has another shape
    /// or fails a check — the whole-frame path then checks and counts it.
    fn receive_split_tcp(
        &mut self,
        now: Instant,
        head: &[u8],
        tail: &[u8],
        deliver: &mut Deliver,
    ) -> bool {
        let csum = self.l4_checksum();
        if csum.verify_rx {
            return false;
        }
        let Ok(f) = ethernet::Frame::new_checked(head) else {
            return false;
        };
        let eth = EthernetRepr::parse(&f).expect("checked frame parses");
        if eth.ethertype != EtherType::Ipv4 || eth.dst != self.iface.mac() {
            return false;
        }
        // What `ipv4::Packet::new_checked` checks of a whole frame, for the two parts: the
        // header lies in `head`, and the total length is exactly both parts (no padding).
        let ip = f.payload();
        if ip.len() < ipv4::HEADER_LEN || ip[0] >> 4 != 4 {
            return false;
        }
        let ihl = (ip[0] & 0xf) as usize * 4;
        let pkt = ipv4::Packet::new_unchecked(ip);
        if ihl < ipv4::HEADER_LEN || ihl > ip.len() || pkt.total_len() != ip.len() + tail.len() {
            return false;
        }
        let Ok(repr) = Ipv4Repr::parse(&pkt, self.iface.checksum()) else {
            return false;
        };
        if repr.is_fragment() || repr.protocol != IpProtocol::Tcp {
            return false;
        }
        // The TCP header (with options) is the rest of `head`, exactly.
        let Ok(tcp) = wtcp::Packet::new_checked(&ip[ihl..]) else {
            return false;
        };
        if tcp.header_len() != ip.len() - ihl {
            return false;
        }
        let Ok(seg) = TcpRepr::parse(&tcp, repr.src, repr.dst, csum) else {
            return false;
        };
        // Accepted in shape: from here as `receive` → `ip_input` → `tcp_input` would.
        self.set_now(now);
        let _p = flowstack_prof::enter(flowstack_prof::Layer::EthIpInput);
        self.iface.counters_mut().inc(Counter::IpInReceives);
        if !self.ip_admit(&repr) {
            return true;
        }
        self.iface.counters_mut().inc(Counter::IpInDelivers);
        let _t = flowstack_prof::enter(flowstack_prof::Layer::TcpInput);
        self.iface.counters_mut().inc(Counter::TcpInSegs);
        let seg = TcpRepr {
            payload: tail,
            ..seg
        };
        self.tcp
            .input_to(now, &mut self.iface, &repr, &seg, deliver);
        true
    }
}
