//! Socket addresses between C and Rust, and the decisions of which path a socket takes.
//!
//! Pure logic (no system calls) so that it is unit-tested: what `socket()`, `bind()`,
//! `connect()` and `sendto()` decide from family, type and address.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

/// Why a socket is (or moved) on the kernel instead of flowstack. Names appear in the
/// summary of `flowstack run -v` and in `flowstack stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// AF_UNIX.
    Unix,
    /// AF_NETLINK.
    Netlink,
    /// Another family (AF_PACKET, …).
    OtherFamily,
    /// SOCK_RAW, SOCK_SEQPACKET or a protocol other than TCP/UDP.
    OtherType,
    /// An IPv6 address that is not v4-mapped (flowstack has no IPv6 yet).
    Ipv6,
    /// IPV6_V6ONLY on an AF_INET6 socket: it can only carry IPv6.
    V6Only,
    /// A destination no flowstack interface or listener serves.
    NotCarried,
    /// The daemon cannot be reached (or this build has no daemon API).
    NoDaemon,
    /// The daemon refused the socket (e.g. its limit, or no UDP yet).
    Refused,
    /// The placeholder's descriptor number is beyond the shim's table.
    FdTooHigh,
    /// `FLOWSTACK_DISABLE=1`.
    Disabled,
    /// A connection from an ordinary client, taken from the kernel side of a listener.
    KernelListener,
}

impl Reason {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Unix => "unix",
            Reason::Netlink => "netlink",
            Reason::OtherFamily => "other-family",
            Reason::OtherType => "other-type",
            Reason::Ipv6 => "ipv6",
            Reason::V6Only => "v6only",
            Reason::NotCarried => "not-carried",
            Reason::NoDaemon => "no-daemon",
            Reason::Refused => "daemon-refused",
            Reason::FdTooHigh => "fd-too-high",
            Reason::Disabled => "disabled",
            Reason::KernelListener => "kernel-listener",
        }
    }
}

/// What `socket(domain, type, protocol)` may become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// AF_INET6 (its IPv4 side goes through flowstack).
    pub inet6: bool,
    /// SOCK_DGRAM (else SOCK_STREAM).
    pub dgram: bool,
    /// SOCK_NONBLOCK was given.
    pub nonblock: bool,
    /// SOCK_CLOEXEC was given.
    pub cloexec: bool,
}

/// Decides `socket()`: a flowstack candidate, or the kernel and why.
pub fn socket_kind(domain: i32, ty: i32, protocol: i32) -> Result<Kind, Reason> {
    let inet6 = match domain {
        libc::AF_INET => false,
        libc::AF_INET6 => true,
        libc::AF_UNIX => return Err(Reason::Unix),
        libc::AF_NETLINK => return Err(Reason::Netlink),
        _ => return Err(Reason::OtherFamily),
    };
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    let dgram = match (base, protocol) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => false,
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => true,
        _ => return Err(Reason::OtherType),
    };
    Ok(Kind {
        inet6,
        dgram,
        nonblock: ty & libc::SOCK_NONBLOCK != 0,
        cloexec: ty & libc::SOCK_CLOEXEC != 0,
    })
}

/// An address given by the application, as far as the shim cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addr {
    /// IPv4, or IPv4 written v4-mapped on an AF_INET6 socket.
    V4(SocketAddrV4),
    /// The IPv6 wildcard `::` (bind: both families unless IPV6_V6ONLY).
    V6Any(u16),
    /// A native IPv6 address.
    V6(SocketAddrV6),
    /// AF_UNSPEC (connect: dissolve the association).
    Unspec,
}

/// Reads the address the application passed (`ptr`, `len`) to a socket of family `inet6`.
/// Errors are the kernel's: `EINVAL` for a short length, `EAFNOSUPPORT` for a family the
/// socket cannot take, `EFAULT` for a null pointer.
pub fn read_addr(bytes: Option<&[u8]>, inet6: bool) -> Result<Addr, i32> {
    let b = bytes.ok_or(libc::EFAULT)?;
    if b.len() < 2 {
        return Err(libc::EINVAL);
    }
    let family = u16::from_ne_bytes([b[0], b[1]]) as i32;
    let port = |b: &[u8]| u16::from_be_bytes([b[2], b[3]]);
    match family {
        libc::AF_UNSPEC => Ok(Addr::Unspec),
        libc::AF_INET => {
            if b.len() < 16 {
                return Err(libc::EINVAL);
            }
            if inet6 {
                // Linux: an AF_INET6 socket takes no AF_INET address.
                return Err(libc::EAFNOSUPPORT);
            }
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Ok(Addr::V4(SocketAddrV4::new(ip, port(b))))
        }
        libc::AF_INET6 => {
            if !inet6 {
                return Err(libc::EAFNOSUPPORT);
            }
            if b.len() < 24 {
                return Err(libc::EINVAL);
            }
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[8..24]);
            let ip = Ipv6Addr::from(o);
            if let Some(v4) = ip.to_ipv4_mapped() {
                return Ok(Addr::V4(SocketAddrV4::new(v4, port(b))));
            }
            if ip.is_unspecified() {
                return Ok(Addr::V6Any(port(b)));
            }
            let flow = u32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
            let scope = if b.len() >= 28 {
                u32::from_ne_bytes([b[24], b[25], b[26], b[27]])
            } else {
                0
            };
            Ok(Addr::V6(SocketAddrV6::new(ip, port(b), flow, scope)))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// The bytes of `a` as a `sockaddr_in` (AF_INET socket) or v4-mapped `sockaddr_in6`.
pub fn write_addr(a: SocketAddrV4, inet6: bool) -> ([u8; 28], usize) {
    let mut out = [0u8; 28];
    let port = a.port().to_be_bytes();
    if inet6 {
        out[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        out[2..4].copy_from_slice(&port);
        let ip = if a.ip().is_unspecified() {
            Ipv6Addr::UNSPECIFIED
        } else {
            a.ip().to_ipv6_mapped()
        };
        out[8..24].copy_from_slice(&ip.octets());
        (out, 28)
    } else {
        out[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        out[2..4].copy_from_slice(&port);
        out[4..8].copy_from_slice(&a.ip().octets());
        (out, 16)
    }
}

/// Where `bind()` goes.
pub fn bind_route(addr: Addr, v6only: bool) -> Result<SocketAddrV4, Reason> {
    match addr {
        Addr::V4(a) if v6only => {
            // A v4-mapped address on a V6ONLY socket: the kernel refuses it; let it say so.
            let _ = a;
            Err(Reason::V6Only)
        }
        Addr::V4(a) => Ok(a),
        Addr::V6Any(_) if v6only => Err(Reason::V6Only),
        Addr::V6Any(p) => Ok(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, p)),
        Addr::V6(_) | Addr::Unspec => Err(Reason::Ipv6),
    }
}

/// Where `connect()` / `sendto()` go: flowstack if the daemon carries the IPv4 destination.
pub fn connect_route(
    addr: Addr,
    v6only: bool,
    carries: impl FnOnce(SocketAddrV4) -> bool,
) -> Result<SocketAddrV4, Reason> {
    match addr {
        Addr::V4(_) if v6only => Err(Reason::V6Only),
        Addr::V4(a) if carries(a) => Ok(a),
        Addr::V4(_) => Err(Reason::NotCarried),
        // Linux connects `::` to the loopback ::1: native IPv6.
        Addr::V6Any(_) | Addr::V6(_) => Err(Reason::Ipv6),
        Addr::Unspec => Err(Reason::NotCarried),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sin(ip: [u8; 4], port: u16) -> Vec<u8> {
        write_addr(SocketAddrV4::new(Ipv4Addr::from(ip), port), false).0[..16].to_vec()
    }

    fn sin6(ip: Ipv6Addr, port: u16) -> Vec<u8> {
        let mut b = vec![0u8; 28];
        b[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[8..24].copy_from_slice(&ip.octets());
        b
    }

    #[test]
    fn socket_decisions() {
        let k = socket_kind(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0).unwrap();
        assert!(!k.inet6 && !k.dgram && k.nonblock && !k.cloexec);
        let k = socket_kind(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 17).unwrap();
        assert!(k.inet6 && k.dgram && k.cloexec);
        assert_eq!(
            socket_kind(libc::AF_UNIX, libc::SOCK_STREAM, 0),
            Err(Reason::Unix)
        );
        assert_eq!(
            socket_kind(libc::AF_NETLINK, libc::SOCK_RAW, 0),
            Err(Reason::Netlink)
        );
        assert_eq!(
            socket_kind(libc::AF_PACKET, libc::SOCK_RAW, 0),
            Err(Reason::OtherFamily)
        );
        assert_eq!(
            socket_kind(libc::AF_INET, libc::SOCK_RAW, 1),
            Err(Reason::OtherType)
        );
        assert_eq!(
            socket_kind(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP),
            Err(Reason::OtherType)
        );
        assert_eq!(
            socket_kind(libc::AF_INET, libc::SOCK_SEQPACKET, 0),
            Err(Reason::OtherType)
        );
    }

    #[test]
    fn ipv4_round_trip_and_v4_mapped_form() {
        let a = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 8080);
        let (b, n) = write_addr(a, false);
        assert_eq!(n, 16);
        assert_eq!(read_addr(Some(&b[..n]), false), Ok(Addr::V4(a)));
        let (b, n) = write_addr(a, true);
        assert_eq!(n, 28);
        assert_eq!(&b[8..24], &a.ip().to_ipv6_mapped().octets());
        assert_eq!(read_addr(Some(&b[..n]), true), Ok(Addr::V4(a)));
        // The IPv4 wildcard on an AF_INET6 socket reads back as `::`.
        let (b, _) = write_addr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 80), true);
        assert_eq!(read_addr(Some(&b), true), Ok(Addr::V6Any(80)));
    }

    #[test]
    fn kernel_errors_for_bad_addresses() {
        assert_eq!(read_addr(None, false), Err(libc::EFAULT));
        assert_eq!(read_addr(Some(&[2]), false), Err(libc::EINVAL));
        let v4 = sin([1, 2, 3, 4], 1);
        assert_eq!(read_addr(Some(&v4[..15]), false), Err(libc::EINVAL));
        assert_eq!(read_addr(Some(&v4), true), Err(libc::EAFNOSUPPORT));
        let v6 = sin6(Ipv6Addr::LOCALHOST, 1);
        assert_eq!(read_addr(Some(&v6), false), Err(libc::EAFNOSUPPORT));
        assert_eq!(read_addr(Some(&v6[..23]), true), Err(libc::EINVAL));
        let mut unix = vec![0u8; 110];
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(read_addr(Some(&unix), false), Err(libc::EAFNOSUPPORT));
    }

    #[test]
    fn dual_stack_wildcard_binds_ipv4_unless_v6only() {
        let any = read_addr(Some(&sin6(Ipv6Addr::UNSPECIFIED, 5201)), true).unwrap();
        assert_eq!(any, Addr::V6Any(5201));
        assert_eq!(
            bind_route(any, false),
            Ok(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5201))
        );
        assert_eq!(bind_route(any, true), Err(Reason::V6Only));
        let lo6 = read_addr(Some(&sin6(Ipv6Addr::LOCALHOST, 1)), true).unwrap();
        assert_eq!(bind_route(lo6, false), Err(Reason::Ipv6));
        let mapped = sin6(Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped(), 9);
        let mapped = read_addr(Some(&mapped), true).unwrap();
        assert_eq!(
            bind_route(mapped, false),
            Ok(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9))
        );
    }

    #[test]
    fn connect_goes_to_flowstack_only_where_it_carries() {
        let lo = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 6379);
        let dns = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 53), 53);
        let carries = |a: SocketAddrV4| a.port() == 6379;
        assert_eq!(connect_route(Addr::V4(lo), false, carries), Ok(lo));
        assert_eq!(
            connect_route(Addr::V4(dns), false, carries),
            Err(Reason::NotCarried)
        );
        assert_eq!(
            connect_route(Addr::V4(lo), true, carries),
            Err(Reason::V6Only)
        );
        assert_eq!(
            connect_route(Addr::V6Any(1), false, carries),
            Err(Reason::Ipv6)
        );
    }
}
