//! Small safe wrappers over the system calls the drivers share.
//!
//! What is not specific to network interfaces lives in `flowstack-sys` and is re-exported
//! here under its old paths: CPU affinity, `TCP_QUICKACK`, waiting for a readable descriptor.
//! What stays is driver business (only the TAP and AF_PACKET drivers use it): `struct ifreq`,
//! an interface's MTU and index, and completing a partial checksum.
#![allow(unsafe_code)]

pub use flowstack_sys::affinity::{cpu_count, pin_to_cpu, unpin};
pub use flowstack_sys::poll::wait_readable;
pub use flowstack_sys::socket::tcp_quickack;
use std::io;

/// `struct ifreq` with the fields the drivers use (name, then a short or an int).
#[repr(C)]
pub(crate) struct IfReq {
    pub name: [libc::c_char; libc::IFNAMSIZ],
    pub data: [u8; 24],
}

impl IfReq {
    pub fn new(name: &str) -> io::Result<Self> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name '{name}' must be 1..15 bytes"),
            ));
        }
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        for (d, s) in r.name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        Ok(r)
    }
    pub fn set_short(&mut self, v: i16) {
        self.data[..2].copy_from_slice(&v.to_ne_bytes());
    }
    pub fn int(&self) -> i32 {
        i32::from_ne_bytes(self.data[..4].try_into().unwrap())
    }
}

/// Converts a `-1` return into the last OS error.
pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The MTU of interface `name` (SIOCGIFMTU).
pub fn interface_mtu(name: &str) -> io::Result<usize> {
    let mut req = IfReq::new(name)?;
    // SAFETY: plain socket(2) call; the returned fd is owned and closed below.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: SIOCGIFMTU reads the name and writes an int into `req`, which is a valid,
    // properly sized `struct ifreq`.
    let r = unsafe { libc::ioctl(s, libc::SIOCGIFMTU as _, &mut req) };
    // SAFETY: `s` is a descriptor we own.
    unsafe { libc::close(s) };
    cvt(r)?;
    Ok(req.int() as usize)
}

/// The index of interface `name`.
pub fn interface_index(name: &str) -> io::Result<i32> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad interface name"))?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i as i32)
}

/// The driver of interface `name` (`ETHTOOL_GDRVINFO`), e.g. "veth"; `None` if the kernel
/// does not say.
pub fn interface_driver(name: &str) -> Option<String> {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GDRVINFO: u32 = 3;
    // struct ethtool_drvinfo: cmd, then driver[32], version, fw_version, ... (196 bytes).
    let mut info = [0u8; 196];
    info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    let mut req = IfReq::new(name).ok()?;
    req.data[..8].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    // SAFETY: plain socket(2) call; the returned fd is owned and closed below.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })
        .ok()?;
    // SAFETY: SIOCETHTOOL reads the name and the pointer in `req` (ifr_data), which points to
    // `info`, a writable ethtool_drvinfo of the full size, alive for the call.
    let r = unsafe { libc::ioctl(s, SIOCETHTOOL as _, &mut req) };
    // SAFETY: `s` is a descriptor we own.
    unsafe { libc::close(s) };
    cvt(r).ok()?;
    let d = &info[4..36];
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    Some(String::from_utf8_lossy(&d[..end]).into_owned())
}

/// True if an interface with index `ifindex` still exists (it goes away when deleted, or
/// with its namespace).
pub fn interface_exists(ifindex: u32) -> bool {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname may write.
    !unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) }.is_null()
}

/// True if the TCP/UDP checksum field of IPv4 frame `frame` holds exactly the folded
/// pseudo-header sum: what a local sender using checksum offload leaves for the device to
/// complete (CHECKSUM_PARTIAL). A link that carries no checksum status (AF_XDP) uses this
/// to recognise such frames; a fully checksummed frame has this value with odds 2^-16, and
/// completing a correct checksum leaves it unchanged.
pub(crate) fn looks_partial(frame: &[u8]) -> bool {
    if frame.len() < 34 || frame[12..14] != [0x08, 0x00] {
        return false;
    }
    let ip = &frame[14..];
    let ihl = ((ip[0] & 0xf) as usize) * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    // Fragments carry no complete L4 header to check.
    let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff;
    if ihl < 20 || total < ihl || 14 + total > frame.len() || frag != 0 {
        return false;
    }
    let off = match ip[9] {
        6 => 16,
        17 => 6,
        _ => return false,
    };
    let l4 = 14 + ihl;
    if total - ihl < off + 2 {
        return false;
    }
    let field = u16::from_be_bytes([frame[l4 + off], frame[l4 + off + 1]]);
    let src = flowstack_wire::Ipv4Address(ip[12..16].try_into().unwrap());
    let dst = flowstack_wire::Ipv4Address(ip[16..20].try_into().unwrap());
    field == flowstack_wire::checksum::pseudo_header(src, dst, ip[9], (total - ihl) as u32)
}

/// Completes the TCP/UDP checksum of an IPv4 frame whose checksum field holds only the
/// pseudo-header sum (CHECKSUM_PARTIAL).
pub fn complete_checksum(frame: &mut [u8]) -> bool {
    if frame.len() < 34 || frame[12..14] != [0x08, 0x00] {
        return false;
    }
    let ip = &frame[14..];
    let ihl = ((ip[0] & 0xf) as usize) * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ihl < 20 || total < ihl || 14 + total > frame.len() {
        return false;
    }
    let off = match ip[9] {
        6 => 16,
        17 => 6,
        _ => return false,
    };
    let src = flowstack_wire::Ipv4Address(ip[12..16].try_into().unwrap());
    let dst = flowstack_wire::Ipv4Address(ip[16..20].try_into().unwrap());
    let proto = ip[9];
    let l4 = 14 + ihl;
    let len = total - ihl;
    if len < off + 2 {
        return false;
    }
    frame[l4 + off..l4 + off + 2].copy_from_slice(&[0, 0]);
    let mut acc = flowstack_wire::checksum::Accumulator::new();
    acc.add_sum(flowstack_wire::checksum::pseudo_header(
        src, dst, proto, len as u32,
    ));
    acc.add(&frame[l4..l4 + len]);
    let mut c = acc.finish();
    if proto == 17 && c == 0 {
        c = 0xffff;
    }
    frame[l4 + off..l4 + off + 2].copy_from_slice(&c.to_be_bytes());
    true
}
