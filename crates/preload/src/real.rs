//! The functions the shim interposes, as the C library defines them.
//!
//! Each is looked up once with `dlsym(RTLD_NEXT, name)` and cached. `dlsym` may itself call
//! functions we interpose (it allocates and may report errors); a call that arrives on a
//! thread that is in the middle of a lookup goes straight to the kernel with a raw system
//! call, so resolution never recurses. Functions that are not one system call (fork, the exec
//! and spawn family, sigaction) have no raw form; they are never called from inside `dlsym`.
//!
//! Never call `libc::read` and friends from this crate: inside the shim those names bind to
//! the shim's own definitions. Use this module.
#![allow(clippy::missing_safety_doc)]

use libc::{c_char, c_int, c_long, c_uint, c_void, size_t, ssize_t};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// The address of the next definition of `name` (NUL-terminated), or 0 while this thread is
/// already resolving (a recursive call) or when the C library has none.
fn resolve(slot: &AtomicUsize, name: &'static str) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    if RESOLVING.with(|r| r.replace(true)) {
        return 0;
    }
    // SAFETY: `name` is a NUL-terminated literal (the macro appends "\0"); RTLD_NEXT asks
    // for the definition after this library's, i.e. the C library's.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    RESOLVING.with(|r| r.set(false));
    if f != 0 {
        slot.store(f, Ordering::Release);
    }
    f
}

/// A raw system call: the kernel's `-errno` becomes `-1` with `errno` set.
pub unsafe fn sys(n: c_long, a: [usize; 6]) -> c_long {
    let r = raw_syscall(n as usize, a);
    if (r as isize) < 0 && (r as isize) > -4096 {
        set_errno(-(r as isize) as c_int);
        -1
    } else {
        r as c_long
    }
}

#[cfg(target_arch = "x86_64")]
unsafe fn raw_syscall(n: usize, a: [usize; 6]) -> usize {
    let r: usize;
    // SAFETY: the x86-64 Linux system call convention: number in rax, arguments in rdi, rsi,
    // rdx, r10, r8, r9; rcx and r11 are clobbered by the instruction.
    core::arch::asm!("syscall",
        inlateout("rax") n => r,
        in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
        in("r10") a[3], in("r8") a[4], in("r9") a[5],
        lateout("rcx") _, lateout("r11") _,
        options(nostack));
    r
}

#[cfg(target_arch = "aarch64")]
unsafe fn raw_syscall(n: usize, a: [usize; 6]) -> usize {
    let r: usize;
    // SAFETY: the arm64 Linux system call convention: number in x8, arguments in x0..x5,
    // result in x0.
    core::arch::asm!("svc 0",
        in("x8") n,
        inlateout("x0") a[0] => r, in("x1") a[1], in("x2") a[2],
        in("x3") a[3], in("x4") a[4], in("x5") a[5],
        options(nostack));
    r
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's `errno`.
pub fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

fn no_raw<T: From<i8>>() -> T {
    set_errno(libc::ENOSYS);
    T::from(-1)
}

macro_rules! real {
    ($( $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty = $raw:expr ; )*) => {$(
        #[allow(dead_code)]
        pub unsafe fn $name($($a: $t),*) -> $r {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let p = resolve(&SLOT, concat!(stringify!($name), "\0"));
            if p == 0 {
                return $raw;
            }
            // SAFETY: `p` is the C library's definition of this very symbol, whose C
            // signature is the one written here.
            let f: unsafe extern "C" fn($($t),*) -> $r = core::mem::transmute(p);
            f($($a),*)
        }
    )*};
}

use libc::{
    iovec, mmsghdr, msghdr, pid_t, posix_spawn_file_actions_t, posix_spawnattr_t, sockaddr,
    socklen_t,
};

real! {
    socket(d: c_int, t: c_int, p: c_int) -> c_int =
        sys(libc::SYS_socket, [d as _, t as _, p as _, 0, 0, 0]) as c_int;
    bind(fd: c_int, a: *const sockaddr, l: socklen_t) -> c_int =
        sys(libc::SYS_bind, [fd as _, a as _, l as _, 0, 0, 0]) as c_int;
    listen(fd: c_int, b: c_int) -> c_int =
        sys(libc::SYS_listen, [fd as _, b as _, 0, 0, 0, 0]) as c_int;
    accept(fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int =
        sys(libc::SYS_accept, [fd as _, a as _, l as _, 0, 0, 0]) as c_int;
    accept4(fd: c_int, a: *mut sockaddr, l: *mut socklen_t, f: c_int) -> c_int =
        sys(libc::SYS_accept4, [fd as _, a as _, l as _, f as _, 0, 0]) as c_int;
    connect(fd: c_int, a: *const sockaddr, l: socklen_t) -> c_int =
        sys(libc::SYS_connect, [fd as _, a as _, l as _, 0, 0, 0]) as c_int;
    read(fd: c_int, b: *mut c_void, n: size_t) -> ssize_t =
        sys(libc::SYS_read, [fd as _, b as _, n, 0, 0, 0]) as ssize_t;
    write(fd: c_int, b: *const c_void, n: size_t) -> ssize_t =
        sys(libc::SYS_write, [fd as _, b as _, n, 0, 0, 0]) as ssize_t;
    readv(fd: c_int, v: *const iovec, n: c_int) -> ssize_t =
        sys(libc::SYS_readv, [fd as _, v as _, n as _, 0, 0, 0]) as ssize_t;
    writev(fd: c_int, v: *const iovec, n: c_int) -> ssize_t =
        sys(libc::SYS_writev, [fd as _, v as _, n as _, 0, 0, 0]) as ssize_t;
    recv(fd: c_int, b: *mut c_void, n: size_t, f: c_int) -> ssize_t =
        sys(libc::SYS_recvfrom, [fd as _, b as _, n, f as _, 0, 0]) as ssize_t;
    recvfrom(fd: c_int, b: *mut c_void, n: size_t, f: c_int, a: *mut sockaddr,
             l: *mut socklen_t) -> ssize_t =
        sys(libc::SYS_recvfrom, [fd as _, b as _, n, f as _, a as _, l as _]) as ssize_t;
    recvmsg(fd: c_int, m: *mut msghdr, f: c_int) -> ssize_t =
        sys(libc::SYS_recvmsg, [fd as _, m as _, f as _, 0, 0, 0]) as ssize_t;
    recvmmsg(fd: c_int, m: *mut mmsghdr, n: c_uint, f: c_int, t: *mut libc::timespec) -> c_int =
        sys(libc::SYS_recvmmsg, [fd as _, m as _, n as _, f as _, t as _, 0]) as c_int;
    send(fd: c_int, b: *const c_void, n: size_t, f: c_int) -> ssize_t =
        sys(libc::SYS_sendto, [fd as _, b as _, n, f as _, 0, 0]) as ssize_t;
    sendto(fd: c_int, b: *const c_void, n: size_t, f: c_int, a: *const sockaddr,
           l: socklen_t) -> ssize_t =
        sys(libc::SYS_sendto, [fd as _, b as _, n, f as _, a as _, l as _]) as ssize_t;
    sendmsg(fd: c_int, m: *const msghdr, f: c_int) -> ssize_t =
        sys(libc::SYS_sendmsg, [fd as _, m as _, f as _, 0, 0, 0]) as ssize_t;
    sendmmsg(fd: c_int, m: *mut mmsghdr, n: c_uint, f: c_int) -> c_int =
        sys(libc::SYS_sendmmsg, [fd as _, m as _, n as _, f as _, 0, 0]) as c_int;
    sendfile(o: c_int, i: c_int, off: *mut libc::off_t, n: size_t) -> ssize_t =
        sys(libc::SYS_sendfile, [o as _, i as _, off as _, n, 0, 0]) as ssize_t;
    pread(fd: c_int, b: *mut c_void, n: size_t, off: libc::off_t) -> ssize_t =
        sys(libc::SYS_pread64, [fd as _, b as _, n, off as _, 0, 0]) as ssize_t;
    close(fd: c_int) -> c_int = sys(libc::SYS_close, [fd as _, 0, 0, 0, 0, 0]) as c_int;
    shutdown(fd: c_int, h: c_int) -> c_int =
        sys(libc::SYS_shutdown, [fd as _, h as _, 0, 0, 0, 0]) as c_int;
    dup(fd: c_int) -> c_int = sys(libc::SYS_dup, [fd as _, 0, 0, 0, 0, 0]) as c_int;
    dup3(o: c_int, n: c_int, f: c_int) -> c_int =
        sys(libc::SYS_dup3, [o as _, n as _, f as _, 0, 0, 0]) as c_int;
    fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int =
        sys(libc::SYS_fcntl, [fd as _, cmd as _, arg, 0, 0, 0]) as c_int;
    ioctl(fd: c_int, req: libc::c_ulong, arg: usize) -> c_int =
        sys(libc::SYS_ioctl, [fd as _, req as _, arg, 0, 0, 0]) as c_int;
    getsockopt(fd: c_int, lv: c_int, nm: c_int, v: *mut c_void, l: *mut socklen_t) -> c_int =
        sys(libc::SYS_getsockopt, [fd as _, lv as _, nm as _, v as _, l as _, 0]) as c_int;
    setsockopt(fd: c_int, lv: c_int, nm: c_int, v: *const c_void, l: socklen_t) -> c_int =
        sys(libc::SYS_setsockopt, [fd as _, lv as _, nm as _, v as _, l as _, 0]) as c_int;
    getsockname(fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int =
        sys(libc::SYS_getsockname, [fd as _, a as _, l as _, 0, 0, 0]) as c_int;
    getpeername(fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int =
        sys(libc::SYS_getpeername, [fd as _, a as _, l as _, 0, 0, 0]) as c_int;
    poll(f: *mut libc::pollfd, n: libc::nfds_t, t: c_int) -> c_int =
        sys(libc::SYS_poll, [f as _, n as _, t as _, 0, 0, 0]) as c_int;
    ppoll(f: *mut libc::pollfd, n: libc::nfds_t, t: *const libc::timespec,
          m: *const libc::sigset_t) -> c_int =
        sys(libc::SYS_ppoll, [f as _, n as _, t as _, m as _, 8, 0]) as c_int;
    select(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set,
           t: *mut libc::timeval) -> c_int =
        sys(libc::SYS_select, [n as _, r as _, w as _, e as _, t as _, 0]) as c_int;
    pselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set,
            t: *const libc::timespec, m: *const libc::sigset_t) -> c_int = no_raw();
    epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int =
        sys(libc::SYS_epoll_ctl, [ep as _, op as _, fd as _, ev as _, 0, 0]) as c_int;
    epoll_wait(ep: c_int, ev: *mut libc::epoll_event, n: c_int, t: c_int) -> c_int =
        sys(libc::SYS_epoll_pwait, [ep as _, ev as _, n as _, t as _, 0, 8]) as c_int;
    epoll_pwait(ep: c_int, ev: *mut libc::epoll_event, n: c_int, t: c_int,
                m: *const libc::sigset_t) -> c_int =
        sys(libc::SYS_epoll_pwait, [ep as _, ev as _, n as _, t as _, m as _, 8]) as c_int;
    epoll_pwait2(ep: c_int, ev: *mut libc::epoll_event, n: c_int, t: *const libc::timespec,
                 m: *const libc::sigset_t) -> c_int =
        sys(441, [ep as _, ev as _, n as _, t as _, m as _, 8]) as c_int;
    close_range(a: c_uint, b: c_uint, f: c_int) -> c_int =
        sys(libc::SYS_close_range, [a as _, b as _, f as _, 0, 0, 0]) as c_int;
    fork() -> pid_t = no_raw();
    sigaction(s: c_int, a: *const libc::sigaction, o: *mut libc::sigaction) -> c_int = no_raw();
    signal(s: c_int, h: libc::sighandler_t) -> libc::sighandler_t = libc::SIG_ERR;
    execve(p: *const c_char, a: *const *const c_char, e: *const *const c_char) -> c_int =
        sys(libc::SYS_execve, [p as _, a as _, e as _, 0, 0, 0]) as c_int;
    execvpe(p: *const c_char, a: *const *const c_char, e: *const *const c_char) -> c_int =
        no_raw();
    fexecve(fd: c_int, a: *const *const c_char, e: *const *const c_char) -> c_int = no_raw();
    posix_spawn(pid: *mut pid_t, p: *const c_char, fa: *const posix_spawn_file_actions_t,
                at: *const posix_spawnattr_t, a: *const *mut c_char,
                e: *const *mut c_char) -> c_int = libc::ENOSYS;
    posix_spawnp(pid: *mut pid_t, p: *const c_char, fa: *const posix_spawn_file_actions_t,
                 at: *const posix_spawnattr_t, a: *const *mut c_char,
                 e: *const *mut c_char) -> c_int = libc::ENOSYS;
    system(c: *const c_char) -> c_int = -1;
    popen(c: *const c_char, m: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
}

/// `syscall(2)` with all six arguments, for numbers the shim does not route.
pub unsafe fn syscall6(n: c_long, a: [usize; 6]) -> c_long {
    sys(n, a)
}
