//! Placeholder pairs handed to the daemon in batches (`Attach{Pool}`, record version 6).
//!
//! Each flowstack socket needs a placeholder pair (the module docs of `posix`). Passing each
//! pair on its own cost the application a `sendmsg` and the daemon a `recvmsg` per socket,
//! on top of the pair itself: with ab against nginx, four of a short connection's system
//! calls. Instead, when its pool is empty, the process makes [`POOL_BATCH`] pairs and sends
//! them (D then A of each) in one message; the daemon keeps them in order
//! (`App::fill_pool`), and a new socket or accepted connection takes the oldest with an
//! `Attach{NewPooled}` / `Attach{PlacePooled}` that carries no descriptor: the two sides take
//! from the front of their pools in ring order, under the client's lock, so they stay in
//! step (the daemon takes its front even when it then refuses the call).
//!
//! What the program sees is unchanged: its descriptor is a duplicate of the pooled A at the
//! lowest free number ([`placeholder::dup_for_program`]), with the flags it asked for; the
//! pooled A itself is the library's copy, which every socket had anyway. The pooled A's are
//! close-on-exec (gone at `exec`) and a forked child closes its copies when it forgets its
//! parent's client; the daemon never sees them as sockets (no last-close polling, no socket
//! limit) and closes its D's with the application. The price: up to `POOL_BATCH` pooled
//! A's hold descriptor numbers the kernel would have given to the program's next files
//! (see README, "Unmodified programs"). Pooling is off unless `FLOWSTACK_PLACEHOLDER_POOL=1`
//! (see [`enabled`]): without it, a pair per socket, as before.

use super::*;
use flowstack_api::record::POOL_BATCH;

/// A new socket's placeholder.
pub(super) struct NewPlaceholder {
    /// The program's descriptor (A, or a duplicate of it), with the flags asked for.
    pub prog: OwnedFd,
    /// The library's own copy of A.
    pub mine: OwnedFd,
    /// D, to send with the attach; `None` for a pooled pair (the daemon has it).
    pub d: Option<OwnedFd>,
}

/// Whether pooling is on (`FLOWSTACK_PLACEHOLDER_POOL=1`; default off; read once). Off by
/// default: with it on, an iperf3 server under `flowstack run` was seen, about once in 30-90
/// runs on a daemon that had served nginx+ab first, to sleep for good in the blocking read of
/// a connection accepted on a pooled pair with the bytes waiting in the daemon (never seen
/// in 180 runs with it off); not yet understood.
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FLOWSTACK_PLACEHOLDER_POOL").is_some_and(|v| v == "1"))
}

/// A placeholder for a new socket: the oldest pooled pair (refilling the pool first when it
/// is empty), or a pair of its own if pooling is off or the refill failed.
pub(super) fn take(c: &mut Client, fl: FdFlags) -> Result<NewPlaceholder, Errno> {
    if c.pooled.is_empty() && enabled() {
        // A failed refill leaves the pool empty: this socket gets a pair of its own.
        let _ = refill(c);
    }
    if let Some(a) = c.pooled.pop_front() {
        return match placeholder::dup_for_program(a.as_fd(), fl.cloexec, fl.nonblock) {
            Ok(prog) => Ok(NewPlaceholder {
                prog,
                mine: a,
                d: None,
            }),
            Err(_) => {
                c.pooled.push_front(a); // not taken: the daemon's pool still has it first
                Err(Errno(24))
            }
        };
    }
    let (a, d) = placeholder::pair_with(fl.cloexec, fl.nonblock).map_err(|_| Errno(24))?;
    let mine = a.try_clone().map_err(|_| Errno(24))?;
    Ok(NewPlaceholder {
        prog: a,
        mine,
        d: Some(d),
    })
}

/// Posts the attach of `p` for handle `h`: `New`/`Place` with its pair, or the pooled op.
/// On failure a pooled A goes back to the front of the pool (the daemon took nothing).
pub(super) fn post(
    c: &mut Client,
    h: u32,
    place: bool,
    ty: SockType,
    p: NewPlaceholder,
) -> Result<(u32, OwnedFd, OwnedFd), Errno> {
    let r = match &p.d {
        Some(d) => {
            let op = if place {
                AttachOp::Place
            } else {
                AttachOp::New
            };
            post_attach(c, h, op, ty, &[d.as_fd(), p.prog.as_fd()])
        }
        None => {
            let op = if place {
                AttachOp::PlacePooled
            } else {
                AttachOp::NewPooled
            };
            post_attach(c, h, op, ty, &[])
        }
    };
    match r {
        Ok(id) => Ok((id, p.prog, p.mine)),
        Err(e) => {
            if p.d.is_none() {
                c.pooled.push_front(p.mine);
            }
            Err(e)
        }
    }
}

/// Makes [`POOL_BATCH`] pairs and hands them to the daemon in one message; its answer is not
/// waited for (a refusal — only for a record no honest client writes — makes the pooled
/// sockets' attaches fail, so their first calls report it).
fn refill(c: &mut Client) -> Result<(), Errno> {
    let mut pairs = Vec::with_capacity(POOL_BATCH as usize);
    for _ in 0..POOL_BATCH {
        pairs.push(placeholder::pair().map_err(|_| Errno(24))?);
    }
    let fds: Vec<BorrowedFd<'_>> = pairs
        .iter()
        .flat_map(|(a, d)| [d.as_fd(), a.as_fd()])
        .collect();
    let id = post_attach(c, POOL_BATCH, AttachOp::Pool, SockType::Stream, &fds)?;
    c.waiting.remove(&id);
    // Our D's close here: the daemon holds its copies.
    c.pooled.extend(pairs.into_iter().map(|(a, _)| a));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_fits_one_message() {
        use flowstack_api::record::{AttachOp, POOL_BATCH, POOL_MAX};
        assert!(2 * POOL_BATCH as usize <= flowstack_sys::fdpass::MAX_FDS);
        assert_eq!(AttachOp::Pool.fds(), 2 * POOL_BATCH as usize);
        assert!(POOL_MAX >= POOL_BATCH as usize);
    }
}
