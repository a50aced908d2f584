//! The few `bpf(2)` commands the AF_XDP driver needs, and its XDP program.
//!
//! The program is built in, not loaded from an object file: it redirects every frame that
//! arrives on a queue of the interface to the AF_XDP socket registered for that queue in an
//! `XSKMAP`, and lets the frame through to the kernel (`XDP_PASS`) when no socket is
//! registered there. Five instructions:
//!
//! ```text
//! r2 = *(u32 *)(r1 + 16)        ; ctx->rx_queue_index
//! r1 = map_fd XSKMAP            ; 64-bit immediate, two slots
//! r3 = XDP_PASS                 ; bpf_redirect_map's flags: its result when the slot is empty
//! call bpf_redirect_map
//! exit
//! ```
//!
//! The program is attached through a BPF link (`BPF_LINK_CREATE`), so it is detached by the
//! kernel when the last descriptor of the link closes (the process exits or the driver drops
//! it): nothing is left on the interface.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;
/// `BPF_F_XDP_HAS_FRAGS`: the program handles frames spread over several buffers, so the
/// kernel may hand it (and redirect to an AF_XDP socket bound with `XDP_USE_SG`) frames
/// larger than one page.
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;

/// How the XDP program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`): frames reach the program before an skb exists.
    Driver,
    /// Generic (`XDP_FLAGS_SKB_MODE`): after the skb is built; works on every interface.
    Generic,
}

impl XdpMode {
    fn flags(self) -> u32 {
        match self {
            XdpMode::Driver => 1 << 2,
            XdpMode::Generic => 1 << 1,
        }
    }
}

/// `union bpf_attr`, as bytes: every command uses a prefix of it, the rest must be zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Attr([0; 128])
    }
    fn u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` of the size passed; every pointer it
    // holds (set by the callers) points to memory that lives for this call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, 128u32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: `fd` is a descriptor the bpf syscall just returned; nobody else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// An `XSKMAP` with `entries` slots (one per queue).
pub fn xskmap_create(entries: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, BPF_MAP_TYPE_XSKMAP)
        .u32(4, 4)
        .u32(8, 4)
        .u32(12, entries);
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

/// Puts socket `xsk` in slot `queue` of `map`.
pub fn xskmap_set(map: &OwnedFd, queue: u32, xsk: &impl AsRawFd) -> io::Result<()> {
    let key = queue;
    let value = xsk.as_raw_fd() as u32;
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, &key as *const u32 as u64)
        .u64(16, &value as *const u32 as u64)
        .u64(24, 0);
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
}

/// One `struct bpf_insn`.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = code;
    b[1] = (src << 4) | (dst & 0xf);
    b[2..4].copy_from_slice(&off.to_ne_bytes());
    b[4..8].copy_from_slice(&imm.to_ne_bytes());
    b
}

/// The redirect program's instructions for map `map_fd` (see the module documentation).
pub fn redirect_program(map_fd: i32) -> [[u8; 8]; 6] {
    [
        insn(0x61, 2, 1, 16, 0),                     // r2 = *(u32 *)(r1 + 16)
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd), // r1 = map (low half)
        insn(0, 0, 0, 0, 0),                         //      (high half)
        insn(0xb7, 3, 0, 0, XDP_PASS),               // r3 = XDP_PASS
        insn(0x85, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),  // call bpf_redirect_map
        insn(0x95, 0, 0, 0, 0),                      // exit
    ]
}

/// Loads the redirect program for `map`; with `frags`, flagged as handling multi-buffer
/// frames (`BPF_F_XDP_HAS_FRAGS`; the program never reads past the context, so it does). On
/// failure the error carries the verifier's log.
pub fn load_redirect(map: &OwnedFd, frags: bool) -> io::Result<OwnedFd> {
    let prog = redirect_program(map.as_raw_fd());
    let license = b"Dual MIT/GPL\0";
    let mut log = vec![0u8; 4096];
    let mut a = Attr::new();
    a.u32(0, BPF_PROG_TYPE_XDP)
        .u32(4, prog.len() as u32)
        .u64(8, prog.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .u32(24, 1)
        .u32(28, log.len() as u32)
        .u64(32, log.as_mut_ptr() as u64)
        .u32(44, if frags { BPF_F_XDP_HAS_FRAGS } else { 0 })
        .u32(68, BPF_XDP);
    a.0[48..56].copy_from_slice(b"fs_xsk\0\0");
    bpf(BPF_PROG_LOAD, &mut a).map(owned).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        let text = text.trim();
        if text.is_empty() {
            e
        } else {
            io::Error::new(e.kind(), format!("{e}; verifier: {text}"))
        }
    })
}

/// Attaches `prog` to interface `ifindex` through a BPF link; the program stays attached as
/// long as the returned descriptor is open.
pub fn attach_xdp(prog: &OwnedFd, ifindex: u32, mode: XdpMode) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, prog.as_raw_fd() as u32)
        .u32(4, ifindex)
        .u32(8, BPF_XDP)
        .u32(12, mode.flags());
    bpf(BPF_LINK_CREATE, &mut a).map(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_encodes_registers_offsets_and_the_helper() {
        let p = redirect_program(7);
        assert_eq!(p[0], [0x61, 0x12, 16, 0, 0, 0, 0, 0]);
        assert_eq!(p[1][..2], [0x18, 0x11]);
        assert_eq!(i32::from_ne_bytes(p[1][4..8].try_into().unwrap()), 7);
        assert_eq!(p[2], [0; 8]);
        assert_eq!(i32::from_ne_bytes(p[3][4..8].try_into().unwrap()), XDP_PASS);
        assert_eq!(i32::from_ne_bytes(p[4][4..8].try_into().unwrap()), 51);
        assert_eq!(p[5][0], 0x95);
    }
}
