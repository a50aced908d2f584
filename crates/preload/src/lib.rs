//! `libflowstack_preload.so`: unmodified programs on flowstack.
//!
//! Loaded with `LD_PRELOAD` (see `flowstack run`), the library defines the C library's socket
//! calls. IPv4 TCP/UDP sockets, and the IPv4 side of AF_INET6 sockets, go to the offload
//! daemon through `flowstack_client::posix`; everything else (AF_UNIX, native IPv6, netlink,
//! raw, destinations the daemon does not carry) stays on the kernel, and every such decision
//! is counted and, with `FLOWSTACK_REPORT=PATH`, written down.
//!
//! Each flowstack socket's descriptor is a placeholder — one end of a socketpair whose other
//! end the daemon holds — so descriptor numbers come from the kernel, the kernel's poll,
//! select and epoll work on mixed sets, and the last close anywhere (dup, fork, exec, fd
//! passing) is seen by the daemon.
//!
//! Environment: `FLOWSTACK_SOCKET` (the daemon), `FLOWSTACK_FALLBACK=kernel|error`,
//! `FLOWSTACK_KERNEL_LISTEN=0`, `FLOWSTACK_DISABLE=1`, `FLOWSTACK_REPORT=PATH`,
//! `FLOWSTACK_SENDFILE=copy|daemon`;
//! `FLOWSTACK_FDS` is set by the shim itself across exec.
//!
//! Modules: `real` (the C library's definitions), `table` (descriptor table), `addr`
//! (addresses and path decisions), `backend` (what the daemon API provides), `ops`
//! (operations on placeholders), `sendfile` (sendfile(2)'s three paths), `shim` (the `extern "C"` entry points), `state`
//! (configuration, reference counts, reports, signal dispositions), `inherit` (exec).
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#![cfg_attr(test, allow(dead_code))]

pub mod addr;
pub mod backend;
mod epoll;
pub mod inherit;
mod interest;
mod ops;
mod poll;
pub mod real;
mod sendfile;
mod shim;
pub mod sig;
pub mod state;
pub mod table;
pub mod tcpinfo;

/// Runs when the library is loaded: learns whether SIGPIPE is ignored and adopts placeholders
/// inherited across exec.
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(sig::learn_sigpipe);
    let _ = std::panic::catch_unwind(inherit::adopt_inherited);
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
