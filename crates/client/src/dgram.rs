//! Datagrams delivered into the receive area (`EventKind::Datagram`, UDP sockets of the
//! POSIX layer): each is copied at once into its socket's queue (`Sock::rx`, its length and
//! source in `Sock::dgrams`) and its span released, so datagrams keep their boundaries.

use super::*;
use flowstack_api::region::MAX_DGRAM;
use std::net::SocketAddrV4;

impl Client {
    /// A `Datagram` event. Its span may wrap around the area's end; a span or source the
    /// daemon could not have written marks the daemon as broken (as a bad `Data` span).
    pub(crate) fn on_datagram(&mut self, e: &EventRecord) {
        let (off, len) = (e.offset, e.len);
        if off >= self.rx_size || len > MAX_DGRAM as u64 || !(0..1 << 48).contains(&e.result) {
            self.dead = true;
            return;
        }
        let (off, len) = (off as usize, len as usize);
        let src = SocketAddrV4::new(
            std::net::Ipv4Addr::from((e.result >> 16) as u32),
            (e.result & 0xffff) as u16,
        );
        if let Some(s) = self.socks.get_mut(&e.handle) {
            let first = len.min(self.rx_size as usize - off);
            held::append_from(&self.region, self.rx_off + off, first, &mut s.rx);
            held::append_from(&self.region, self.rx_off, len - first, &mut s.rx);
            s.dgrams.push_back((src, len));
            s.rgen = s.rgen.wrapping_add(1);
        }
        self.release_copied(e.handle, off, len);
    }
}

impl Client {
    /// Writes one datagram into the transmit area (its span may wrap around the end) and
    /// posts it for `dst` (0.0.0.0:0: the socket's peer). `WouldBlock` while the area has
    /// no room for it (the daemon frees it as it takes the records).
    pub(crate) fn udp_post(
        &mut self,
        raw: u32,
        data: &[u8],
        dst: SocketAddrV4,
    ) -> Result<(), SocketError> {
        if (data.len() as u64) > self.tx_room() {
            return Err(SocketError::WouldBlock);
        }
        let pos = self.tx_head % self.tx_size;
        let first = data.len().min((self.tx_size - pos) as usize);
        let _ = self
            .region
            .write_at(self.tx_off + pos as usize, &data[..first]);
        let _ = self.region.write_at(self.tx_off, &data[first..]);
        self.tx_head += data.len() as u64;
        let cmd = Command::UdpSendTo {
            handle: raw,
            dst,
            offset: pos,
            len: data.len() as u64,
        };
        self.post(Mode::Async, cmd).map(|_| ())
    }
}
