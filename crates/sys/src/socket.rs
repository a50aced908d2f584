//! Options on kernel sockets that the tools set (the benchmark's kernel peer, the profiler's rig).

use std::io;
use std::os::fd::AsFd;

/// Makes a kernel TCP socket acknowledge the segments it receives next at once
/// (`TCP_QUICKACK`; the kernel falls back to delayed ACKs after a while, so call it again
/// before each segment that must be acknowledged without delay).
pub fn tcp_quickack(sock: &impl AsFd) -> io::Result<()> {
    rustix::net::sockopt::set_tcp_quickack(sock, true)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_on_a_tcp_socket_fails_on_a_unix_one() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        tcp_quickack(&s).unwrap();
        let (u, _) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(tcp_quickack(&u).is_err());
    }
}
