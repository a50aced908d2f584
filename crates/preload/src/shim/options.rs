//! Options and names: `setsockopt`, `getsockopt`, `getsockname`, `getpeername`, `shutdown`.

use super::*;

const SOL_SOCKET: c_int = libc::SOL_SOCKET;

unsafe fn timeval_ms(v: *const c_void, l: socklen_t) -> Result<u32, Errno> {
    if (l as usize) < std::mem::size_of::<libc::timeval>() {
        return Err(libc::EINVAL);
    }
    if v.is_null() {
        return Err(libc::EFAULT);
    }
    let tv = (v as *const libc::timeval).read_unaligned();
    if tv.tv_sec < 0 || !(0..1_000_000).contains(&tv.tv_usec) {
        return Err(libc::EDOM);
    }
    let ms = (tv.tv_sec as u64) * 1000 + (tv.tv_usec as u64).div_ceil(1000);
    Ok(ms.min(u32::MAX as u64) as u32)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    l: socklen_t,
) -> c_int {
    let Some((st, b, e)) = placeholder(fd) else {
        return real::setsockopt(fd, level, name, v, l);
    };
    run(|| {
        let int = || -> Result<c_int, Errno> {
            if (l as usize) < 4 {
                return Err(libc::EINVAL);
            }
            if v.is_null() {
                return Err(libc::EFAULT);
            }
            Ok((v as *const c_int).read_unaligned())
        };
        match (level, name) {
            (SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) => {
                let ms = timeval_ms(v, l)?;
                let (r, s) = st.table.timeouts(fd);
                let (r, s) = if name == libc::SO_RCVTIMEO {
                    (ms, s)
                } else {
                    (r, ms)
                };
                st.table.set_timeouts(fd, r, s);
                return Ok(0);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) if e.inet6 => {
                let on = int()? != 0;
                st.table.update(fd, |x| x.v6only = on);
                return Ok(0);
            }
            (libc::IPPROTO_IPV6, _) if !e.inet6 => return Err(libc::ENOPROTOOPT),
            _ => {}
        }
        let bit = match (level, name) {
            (SOL_SOCKET, libc::SO_REUSEADDR) => opt::REUSEADDR,
            (SOL_SOCKET, libc::SO_REUSEPORT) => opt::REUSEPORT,
            (SOL_SOCKET, libc::SO_KEEPALIVE) => opt::KEEPALIVE,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => opt::NODELAY,
            _ => 0,
        };
        let val = buf(v, l as size_t)?;
        b.set_option(e.id, level, name, val)?;
        if bit != 0 {
            let on = int()? != 0;
            st.table
                .update(fd, |x| if on { x.opts |= bit } else { x.opts &= !bit });
        }
        Ok(0)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    l: *mut socklen_t,
) -> c_int {
    let Some((st, b, e)) = placeholder(fd) else {
        return real::getsockopt(fd, level, name, v, l);
    };
    run(|| {
        if l.is_null() || v.is_null() {
            return Err(libc::EFAULT);
        }
        let answer = match (level, name) {
            (SOL_SOCKET, libc::SO_ERROR) => Some(b.take_error(e.id)),
            (SOL_SOCKET, libc::SO_TYPE) => Some(if e.dgram {
                libc::SOCK_DGRAM
            } else {
                libc::SOCK_STREAM
            }),
            (SOL_SOCKET, libc::SO_DOMAIN) => Some(if e.inet6 {
                libc::AF_INET6
            } else {
                libc::AF_INET
            }),
            (SOL_SOCKET, libc::SO_PROTOCOL) => Some(if e.dgram {
                libc::IPPROTO_UDP
            } else {
                libc::IPPROTO_TCP
            }),
            (SOL_SOCKET, libc::SO_ACCEPTCONN) => Some(e.listening as c_int),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) if e.inet6 => Some(e.v6only as c_int),
            _ => None,
        };
        if let Some(x) = answer {
            return put_int(x, v, l);
        }
        if level == SOL_SOCKET && (name == libc::SO_RCVTIMEO || name == libc::SO_SNDTIMEO) {
            let (r, s) = st.table.timeouts(fd);
            let ms = if name == libc::SO_RCVTIMEO { r } else { s };
            let tv = libc::timeval {
                tv_sec: (ms / 1000) as _,
                tv_usec: ((ms % 1000) * 1000) as _,
            };
            let n = (*l as usize).min(std::mem::size_of::<libc::timeval>());
            std::ptr::copy_nonoverlapping((&tv as *const libc::timeval).cast::<u8>(), v.cast(), n);
            *l = n as socklen_t;
            return Ok(0);
        }
        let out = buf_mut(v, *l as size_t)?;
        let n = b.get_option(e.id, level, name, out)?;
        *l = n as socklen_t;
        Ok(0)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int {
    match placeholder(fd) {
        None => real::getsockname(fd, a, l),
        Some((_, b, e)) => run(|| {
            if a.is_null() || l.is_null() {
                return Err(libc::EFAULT);
            }
            put_sockaddr(b.local_addr(e.id)?, e.inet6, a, l);
            Ok(0)
        }),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int {
    match placeholder(fd) {
        None => real::getpeername(fd, a, l),
        Some((_, b, e)) => run(|| {
            if a.is_null() || l.is_null() {
                return Err(libc::EFAULT);
            }
            put_sockaddr(b.peer_addr(e.id)?, e.inet6, a, l);
            Ok(0)
        }),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    match placeholder(fd) {
        None => real::shutdown(fd, how),
        Some((_, b, e)) => run(|| b.shutdown(e.id, how).map(|_| 0)),
    }
}
