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

/// The credentials of the process at the other end of a unix socket (`SO_PEERCRED`), as
/// the kernel recorded them when the connection was made: `(pid, uid, gid)`.
pub fn peer_cred(sock: &impl AsFd) -> io::Result<(u32, u32, u32)> {
    let c = rustix::net::sockopt::socket_peercred(sock)?;
    Ok((
        c.pid.as_raw_nonzero().get() as u32,
        c.uid.as_raw(),
        c.gid.as_raw(),
    ))
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

    #[test]
    fn peer_cred_names_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (pid, uid, _) = peer_cred(&a).unwrap();
        assert_eq!(pid, std::process::id());
        assert_eq!(uid, rustix::process::getuid().as_raw());
    }
}
