//! The engine as a [`Sockets`] implementation: applications written against the trait (the
//! `apps` crate, the bench workloads) drive an in-process engine through it, and will drive
//! the offload client through the same calls.

use crate::{Engine, FileError, Readiness, SocketError, Sockets, TcpHandle, UdpHandle};
use std::fs::File;
use std::net::SocketAddrV4;
use std::sync::Arc;

impl Sockets for Engine {
    fn tcp_listen(&mut self, port: u16, backlog: usize) -> Result<TcpHandle, SocketError> {
        Engine::tcp_listen(self, port, backlog)
    }
    fn tcp_accept(&mut self, listener: TcpHandle) -> Result<TcpHandle, SocketError> {
        Engine::tcp_accept(self, listener)
    }
    fn tcp_connect(&mut self, remote: SocketAddrV4) -> Result<TcpHandle, SocketError> {
        Engine::tcp_connect(self, remote)
    }
    fn tcp_send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, SocketError> {
        Engine::tcp_send(self, h, data)
    }
    fn tcp_send_zc(&mut self, h: TcpHandle, buf: Arc<[u8]>) -> Result<u64, SocketError> {
        Engine::tcp_send_zc(self, h, buf)
    }
    fn tcp_zc_completion(&mut self, h: TcpHandle) -> Option<u64> {
        Engine::tcp_zc_completion(self, h)
    }
    fn tcp_recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, SocketError> {
        Engine::tcp_recv(self, h, buf)
    }
    fn tcp_peek(&self, h: TcpHandle, max: usize) -> Result<(&[u8], &[u8]), SocketError> {
        Engine::tcp_peek(self, h, max)
    }
    fn tcp_consume(&mut self, h: TcpHandle, n: usize) -> Result<(), SocketError> {
        Engine::tcp_consume(self, h, n)
    }
    fn tcp_at_eof(&self, h: TcpHandle) -> bool {
        Engine::tcp_at_eof(self, h)
    }
    fn tcp_shutdown(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        Engine::tcp_shutdown(self, h)
    }
    fn tcp_close(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        Engine::tcp_close(self, h)
    }
    fn tcp_abort(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        Engine::tcp_abort(self, h)
    }
    fn tcp_poll(&self, h: TcpHandle) -> Result<Readiness, SocketError> {
        Engine::tcp_poll(self, h)
    }
    fn tcp_is_open(&self, h: TcpHandle) -> bool {
        self.tcp_conn(h).is_ok_and(|c| c.is_open())
    }
    fn tcp_send_queue(&self, h: TcpHandle) -> Result<usize, SocketError> {
        Ok(self.tcp_conn(h)?.send_queue())
    }
    fn tcp_set_nodelay(&mut self, h: TcpHandle, on: bool) -> Result<(), SocketError> {
        Engine::tcp_set_nodelay(self, h, on)
    }
    fn tcp_error(&self, h: TcpHandle) -> Option<SocketError> {
        Engine::tcp_error(self, h)
    }
    fn tcp_connections(&self) -> usize {
        Engine::tcp_connections(self)
    }
    fn send_file(
        &mut self,
        h: TcpHandle,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<usize, FileError> {
        Engine::send_file(self, h, file, offset, len)
    }
    fn recv_to_file(
        &mut self,
        h: TcpHandle,
        file: &File,
        offset: u64,
        max: usize,
    ) -> Result<usize, FileError> {
        Engine::recv_to_file(self, h, file, offset, max)
    }
    fn udp_bind(&mut self, port: u16) -> Result<UdpHandle, SocketError> {
        Engine::udp_bind(self, port)
    }
    fn udp_local_port(&mut self, h: UdpHandle) -> Result<u16, SocketError> {
        Engine::udp_local_port(self, h)
    }
    fn udp_send_to(
        &mut self,
        h: UdpHandle,
        dst: SocketAddrV4,
        data: &[u8],
    ) -> Result<(), SocketError> {
        Engine::udp_send_to(self, h, dst, data)
    }
    fn udp_recv_from(
        &mut self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<(usize, SocketAddrV4), SocketError> {
        Engine::udp_recv_from(self, h, buf)
    }
    fn udp_close(&mut self, h: UdpHandle) -> Result<(), SocketError> {
        Engine::udp_close(self, h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, IfaceConfig};
    use flowstack_link::DeviceCaps;

    fn open_conn_state<S: Sockets>(s: &S, h: TcpHandle) -> bool {
        s.tcp_is_open(h)
    }

    #[test]
    fn handles_the_engine_never_issued_are_errors_through_the_trait() {
        let ip = "10.0.0.1/24".parse().unwrap();
        let mut e = Engine::new(
            EngineConfig::new(IfaceConfig::new(
                flowstack_wire::EthernetAddress([2, 0, 0, 0, 0, 1]),
                ip,
            )),
            DeviceCaps::ETHERNET,
        );
        let bogus = TcpHandle::from_raw(12345);
        let s: &mut dyn Sockets = &mut e;
        assert_eq!(s.tcp_send(bogus, b"x"), Err(SocketError::InvalidHandle));
        assert_eq!(s.tcp_close(bogus), Err(SocketError::InvalidHandle));
        assert_eq!(s.tcp_send_queue(bogus), Err(SocketError::InvalidHandle));
        assert!(!open_conn_state(&e, bogus));
    }
}
