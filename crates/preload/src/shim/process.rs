//! Entry points around processes, signals and raw `syscall()`: fork/vfork, the exec family and
//! posix_spawn (keeping the shim's environment), sigaction/signal (handlers wrapped: crate::sig), and
//! `syscall(SYS_socket…)` routed to the wrappers.

use super::*;

// ---- processes -----------------------------------------------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fork() -> pid_t {
    around_fork(|| real::fork())
}

/// A fork made by `make` (libc's, or a raw system call): settled first, and the library's
/// lock held across it, so no other thread is half-way through making one of the library's
/// descriptors (the wake-up pipe) as the child is copied; released in both processes as it
/// returns. The child then knows it is one.
unsafe fn around_fork(make: impl FnOnce() -> pid_t) -> pid_t {
    let hold = if is_inside() {
        None
    } else {
        state::get()
            .and_then(|s| s.connected())
            .and_then(|b| inside(|| b.settle_for_fork()))
    };
    let pid = make();
    drop(hold);
    if pid == 0 {
        crate::epoll::after_fork();
    }
    if pid == 0 && state::get().is_some_and(|s| s.connected().is_some()) {
        state::mark_forked();
    }
    pid
}

/// Before fork or exec: the daemon answers every placeholder this process posted, so
/// another process (the child, the new image) can adopt it.
fn settle() {
    if is_inside() {
        return; // the shim's own work (it holds the client lock, or is exec_env below)
    }
    if let Some(b) = state::get().and_then(|s| s.connected()) {
        inside(|| b.settle());
    }
}

/// vfork as fork: the shim's wrapper frame cannot be shared with a child that returns from
/// it, and fork semantics are a valid vfork.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn vfork() -> pid_t {
    fork()
}

/// The environment an exec'd program gets: the caller's, plus the shim's own variables if
/// it dropped them, plus `FLOWSTACK_FDS` naming the placeholders that survive exec.
unsafe fn exec_env(envp: *const *const c_char) -> (Vec<std::ffi::CString>, Vec<*const c_char>) {
    let mut own: Vec<std::ffi::CString> = Vec::new();
    let mut given: Vec<*const c_char> = Vec::new();
    let envp = if envp.is_null() {
        extern "C" {
            static environ: *const *const c_char;
        }
        environ
    } else {
        envp
    };
    let mut i = 0;
    while !envp.is_null() && !(*envp.add(i)).is_null() {
        let p = *envp.add(i);
        let s = std::ffi::CStr::from_ptr(p).to_bytes();
        if !s.starts_with(b"FLOWSTACK_FDS=") {
            given.push(p);
        }
        i += 1;
    }
    let st = state::state();
    for kv in &st.cfg.keep_env {
        let k = kv.as_bytes().split(|&c| c == b'=').next().unwrap_or(b"");
        let present = given.iter().any(|&p| {
            let s = std::ffi::CStr::from_ptr(p).to_bytes();
            s.len() > k.len() && s.starts_with(k) && s[k.len()] == b'='
        });
        if !present {
            own.push(kv.clone());
        }
    }
    let fds: Vec<String> = st
        .table
        .in_range(0, MAX_FDS as u32)
        .filter(|(fd, _)| real::fcntl(*fd, libc::F_GETFD, 0) == 0)
        .map(|(fd, e)| format!("{fd}:{}", crate::inherit::encode(&e)))
        .collect();
    if !fds.is_empty() {
        if let Ok(c) = std::ffi::CString::new(format!("FLOWSTACK_FDS={}", fds.join(","))) {
            own.push(c);
        }
    }
    let mut all = given;
    all.extend(own.iter().map(|c| c.as_ptr()));
    all.push(std::ptr::null());
    (own, all)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execve(
    p: *const c_char,
    a: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    settle();
    let (_keep, env) = inside(|| exec_env(envp));
    real::execve(p, a, env.as_ptr())
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execv(p: *const c_char, a: *const *const c_char) -> c_int {
    execve(p, a, std::ptr::null())
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvpe(
    p: *const c_char,
    a: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    settle();
    let (_keep, env) = inside(|| exec_env(envp));
    real::execvpe(p, a, env.as_ptr())
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvp(p: *const c_char, a: *const *const c_char) -> c_int {
    execvpe(p, a, std::ptr::null())
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    a: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    settle();
    let (_keep, env) = inside(|| exec_env(envp));
    real::fexecve(fd, a, env.as_ptr())
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    p: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    a: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    settle();
    let (_keep, env) = inside(|| exec_env(envp.cast()));
    real::posix_spawn(pid, p, fa, at, a, env.as_ptr().cast())
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    p: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    a: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    settle();
    let (_keep, env) = inside(|| exec_env(envp.cast()));
    real::posix_spawnp(pid, p, fa, at, a, env.as_ptr().cast())
}

/// glibc's `system` and `popen` start their child with its internal spawn, which the
/// wrappers above never see: the sockets alive now are settled here (answered, and never
/// recycled: the child may hold a copy of a placeholder made without `SOCK_CLOEXEC`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    if !cmd.is_null() {
        settle();
    }
    real::system(cmd)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    settle();
    real::popen(cmd, mode)
}

// ---- signals -------------------------------------------------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    crate::sig::sigaction(sig, act, old)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    crate::sig::signal(sig, h)
}

// ---- syscall() -----------------------------------------------------------------------------

/// `syscall(2)`: socket calls made by number go through the shim; `io_uring_setup` answers
/// `ENOSYS` so that programs fall back to calls the shim sees. Variadic in C; on x86-64 and
/// arm64 the six fixed parameters are where the arguments arrive.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a1: usize,
    a2: usize,
    a3: usize,
    a4: usize,
    a5: usize,
    a6: usize,
) -> c_long {
    let (i, p) = (a1 as c_int, a2 as *mut c_void);
    match n {
        // A process copied by a raw system call is a fork like libc's (the child's sockets
        // are adopted, not driven through the parent's rings); `vfork` is one too, as the
        // wrapper above makes it.
        #[cfg(target_arch = "x86_64")]
        libc::SYS_fork | libc::SYS_vfork => fork() as c_long,
        // `clone` without a stack of its own and without sharing memory or the thread group
        // is a fork with flags (glibc's own fork is `clone(CLONE_CHILD_SETTID |
        // CLONE_CHILD_CLEARTID | SIGCHLD, 0, …)`); threads and `CLONE_VM` children go by.
        libc::SYS_clone if a2 == 0 && a1 as c_int & (libc::CLONE_VM | libc::CLONE_THREAD) == 0 => {
            around_fork(|| real::syscall6(n, [a1, a2, a3, a4, a5, a6]) as pid_t) as c_long
        }
        // `clone3` takes its arguments in a structure the shim does not read: callers fall
        // back to `clone` (as glibc does on kernels before 5.3), which it understands.
        libc::SYS_clone3 => {
            real::set_errno(libc::ENOSYS);
            -1
        }
        libc::SYS_io_uring_setup => {
            real::set_errno(libc::ENOSYS);
            -1
        }
        libc::SYS_socket => socket(i, a2 as c_int, a3 as c_int) as c_long,
        libc::SYS_bind => bind(i, p.cast(), a3 as socklen_t) as c_long,
        libc::SYS_listen => listen(i, a2 as c_int) as c_long,
        libc::SYS_accept => accept(i, p.cast(), a3 as *mut socklen_t) as c_long,
        libc::SYS_accept4 => accept4(i, p.cast(), a3 as *mut socklen_t, a4 as c_int) as c_long,
        libc::SYS_connect => connect(i, p.cast(), a3 as socklen_t) as c_long,
        libc::SYS_read => read(i, p, a3) as c_long,
        libc::SYS_write => write(i, p, a3) as c_long,
        libc::SYS_readv => readv(i, p.cast(), a3 as c_int) as c_long,
        libc::SYS_writev => writev(i, p.cast(), a3 as c_int) as c_long,
        libc::SYS_recvfrom => recvfrom(i, p, a3, a4 as c_int, a5 as *mut _, a6 as *mut _) as c_long,
        libc::SYS_sendto => sendto(i, p, a3, a4 as c_int, a5 as *const _, a6 as _) as c_long,
        libc::SYS_recvmsg => recvmsg(i, p.cast(), a3 as c_int) as c_long,
        libc::SYS_sendmsg => sendmsg(i, p.cast(), a3 as c_int) as c_long,
        libc::SYS_shutdown => shutdown(i, a2 as c_int) as c_long,
        libc::SYS_close => close(i) as c_long,
        libc::SYS_dup => dup(i) as c_long,
        libc::SYS_dup3 => dup3(i, a2 as c_int, a3 as c_int) as c_long,
        libc::SYS_close_range => close_range(a1 as c_uint, a2 as c_uint, a3 as c_int) as c_long,
        libc::SYS_getsockname => getsockname(i, p.cast(), a3 as *mut _) as c_long,
        libc::SYS_getpeername => getpeername(i, p.cast(), a3 as *mut _) as c_long,
        libc::SYS_setsockopt => {
            setsockopt(i, a2 as c_int, a3 as c_int, a4 as *const _, a5 as _) as c_long
        }
        libc::SYS_getsockopt => {
            getsockopt(i, a2 as c_int, a3 as c_int, a4 as *mut _, a5 as *mut _) as c_long
        }
        libc::SYS_sendfile => sendfile(i, a2 as c_int, a3 as *mut _, a4) as c_long,
        // Readiness: flowstack connections in an epoll set are not in the kernel's set, and
        // quiet sockets have no tokens (crate::epoll, crate::poll).
        libc::SYS_epoll_ctl => {
            crate::epoll::epoll_ctl(i, a2 as c_int, a3 as c_int, a4 as *mut _) as c_long
        }
        libc::SYS_epoll_pwait => {
            crate::epoll::epoll_pwait(i, p.cast(), a3 as c_int, a4 as c_int, a5 as *const _)
                as c_long
        }
        libc::SYS_epoll_pwait2 => {
            crate::epoll::epoll_pwait2(i, p.cast(), a3 as c_int, a4 as *const _, a5 as *const _)
                as c_long
        }
        #[cfg(target_arch = "x86_64")]
        libc::SYS_epoll_wait => {
            crate::epoll::epoll_wait(i, p.cast(), a3 as c_int, a4 as c_int) as c_long
        }
        #[cfg(target_arch = "x86_64")]
        libc::SYS_poll => crate::poll::poll(a1 as *mut _, a2 as _, a3 as c_int) as c_long,
        libc::SYS_ppoll => {
            crate::poll::ppoll(a1 as *mut _, a2 as _, a3 as *const _, a4 as *const _) as c_long
        }
        _ => real::syscall6(n, [a1, a2, a3, a4, a5, a6]),
    }
}
