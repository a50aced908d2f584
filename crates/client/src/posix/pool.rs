//! Placeholder pairs handed to the daemon in batches (`Attach{Pool}`, record version 6) and
//! reused when their socket closes (`Forget { recycle }`, `Attach{Repool}`, version 7).
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
//! **Recycling.** Making a pair and, at the socket's end, closing both ends (the daemon's
//! close of D frees the kernel's socket, inode and dentry) were the largest system-call
//! costs left per short connection. So when the program closes its last descriptor of a
//! connection that no other process can hold, this process keeps its copy of A and asks the
//! daemon to keep D ([`recycle`]): `Forget { recycle }`, answered but not waited for. A
//! recycled A waits in `Client::recycling` until the daemon's answer says D is kept and
//! whether a token was ever written into it (then A is emptied: after the answer the daemon
//! writes nothing more for the old socket); [`take`] then moves the answered ones to the
//! end of the pool with one `Attach{Repool}` — both sides append in ring order, so the pools
//! stay in step. A connection may be recycled only if nothing else can hold or watch A:
//! created or accepted here (not adopted), never in a kernel epoll set (its registration
//! stays on A's open file description while this process holds A: [`Posix::watch`] said
//! no, or the shim's nested-set fallback, [`Posix::pin`]), not alive at a `fork`/`exec`/`posix_spawn` ([`Posix::settle`]), never
//! sent with `SCM_RIGHTS` ([`Posix::pin`]); and the daemon keeps D only if no other
//! application named the socket. (A `poll`/`select` or a blocking call's wait on A leaves
//! nothing behind; a token it asked for is emptied before reuse, and filler A wrote into D
//! — a full send buffer, a connect in progress — is emptied by the daemon when it keeps
//! D.)
//!
//! What the program sees is unchanged: its descriptor is a duplicate of the pooled A at the
//! lowest free number ([`placeholder::dup_for_program`]), with the flags it asked for; the
//! pooled A itself is the library's copy, which every socket had anyway. The pooled A's are
//! close-on-exec (gone at `exec`) and a forked child closes its copies when it forgets its
//! parent's client; the daemon never sees them as sockets (no last-close polling, no socket
//! limit) and closes its D's with the application. The pooled and recycled A's (at most [`POOL_MAX`])
//! are the library's own descriptors, moved above the program's numbers as they join the
//! pool (`flowstack_sys::ownfd`; see README, "Unmodified programs"). Pooling is on unless
//! `FLOWSTACK_PLACEHOLDER_POOL=0` (see [`enabled`]): with it off, a pair per socket.

use super::*;
use flowstack_api::record::{POOL_BATCH, POOL_MAX};

/// A new socket's placeholder.
pub(super) struct NewPlaceholder {
    /// The program's descriptor (A, or a duplicate of it), with the flags asked for.
    pub prog: OwnedFd,
    /// The library's own copy of A (above the program's numbers, `ownfd`).
    pub mine: Own<OwnedFd>,
    /// D, to send with the attach; `None` for a pooled pair (the daemon has it).
    pub d: Option<OwnedFd>,
}

/// Whether pooling (and recycling) is on (unless `FLOWSTACK_PLACEHOLDER_POOL=0`; read once).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FLOWSTACK_PLACEHOLDER_POOL").is_none_or(|v| v != "0"))
}

/// A placeholder for a new socket: the oldest pooled pair (the answered recycled ones
/// joining first when the pool is empty or [`POOL_BATCH`] of them wait, then refilling the
/// pool if it is still empty), or a pair of its own if pooling is off or the refill failed.
///
/// Recycled pairs go back in batches: one `Attach{Repool}` per [`POOL_BATCH`] closed
/// sockets rather than one per socket (`ab` against nginx: each process posted one per
/// connection, about an eighth of its commands).
pub(super) fn take(c: &mut Client, fl: FdFlags) -> Result<NewPlaceholder, Errno> {
    if !c.recycling.is_empty() && (c.pooled.is_empty() || c.recycling.len() >= POOL_BATCH as usize)
    {
        repool(c);
    }
    if c.pooled.is_empty() && enabled() {
        // A failed refill leaves the pool empty: this socket gets a pair of its own.
        let _ = refill(c);
    }
    if let Some((a, maybe_nb)) = c.pooled.pop_front() {
        return match placeholder::dup_for_program(a.as_fd(), fl.cloexec, fl.nonblock, maybe_nb) {
            Ok(prog) => Ok(NewPlaceholder {
                prog,
                mine: a,
                d: None,
            }),
            Err(_) => {
                c.pooled.push_front((a, maybe_nb)); // not taken: the daemon's pool has it first
                Err(Errno(24))
            }
        };
    }
    let (a, d) = placeholder::pair_with(fl.cloexec, fl.nonblock).map_err(|_| Errno(24))?;
    let mine = Own::dup(a.as_fd()).map_err(|_| Errno(24))?;
    Ok(NewPlaceholder {
        prog: a,
        mine,
        d: Some(d),
    })
}

/// Whether a closing socket's pair may be kept: pooling on and room left (the daemon allows
/// twice [`POOL_MAX`], so this side's count, which can only run ahead of the daemon's, never
/// makes it refuse a `Repool`).
pub(super) fn may_recycle(c: &Client) -> bool {
    enabled() && !c.dead && c.pooled.len() + c.recycling.len() < POOL_MAX
}

/// The program closed its last descriptor of socket `h`, which nothing else can hold (see
/// the module docs): posts `Forget { recycle }` and keeps `a`, this process's copy of A,
/// until the answer. `Err` (not posted, the daemon is gone): `a` is closed here.
pub(super) fn recycle(c: &mut Client, h: u32, a: Own<OwnedFd>) -> Result<(), Errno> {
    let id = c.post(
        Mode::Sync,
        Command::Forget {
            handle: h,
            recycle: true,
        },
    )?;
    c.recycling.push_back((id, a));
    Ok(())
}

/// Moves the recycled A's the daemon answered, oldest first, to the end of the pool, and
/// tells the daemon with one `Attach{Repool}` to do the same with their D's. An A the
/// daemon did not keep is closed; one that may hold a token is emptied first (the daemon
/// writes nothing for the old socket after its answer). Stops at the first unanswered one
/// (the order is the daemon's), or at one that cannot be emptied (it stays; recycling then
/// stops at [`POOL_MAX`] and batches take over).
fn repool(c: &mut Client) {
    c.pump();
    let mut n = 0u32;
    while let Some((id, _)) = c.recycling.front() {
        let Some((_, r)) = c.done.remove(id) else {
            break;
        };
        let kept = match r {
            Ok(1) => true,
            Ok(3) => {
                let a = &c.recycling.front().expect("just seen").1;
                if !matches!(placeholder::drain(a.as_fd()), Ok(true)) {
                    // Put the answer back: the pair stays first, waiting.
                    c.done.insert(*id, (0, r));
                    break;
                }
                true
            }
            _ => false,
        };
        let (_, a) = c.recycling.pop_front().expect("just seen");
        if kept {
            c.pooled.push_back((a, true));
            n += 1;
        }
    }
    if n > 0 {
        // Async: refused only if the two sides disagree, which no honest client makes.
        let _ = c.post(
            Mode::Async,
            Command::Attach {
                handle: n,
                op: AttachOp::Repool,
                ty: SockType::Stream,
            },
        );
    }
}

/// Posts the attach of `p` for handle `h`: `New`/`Place` with its pair, or the pooled op.
/// On failure a pooled A goes back to the front of the pool (the daemon took nothing).
pub(super) fn post(
    c: &mut Client,
    h: u32,
    place: bool,
    ty: SockType,
    p: NewPlaceholder,
) -> Result<(u32, OwnedFd, Own<OwnedFd>), Errno> {
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
                // It may have been a recycled one: let the next taker set its flags.
                c.pooled.push_front((p.mine, true));
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
    c.pooled
        .extend(pairs.into_iter().map(|(a, _)| (Own::lift(a), false)));
    Ok(())
}

impl Posix {
    /// This process dropped its last descriptor number for the socket: forget it here (the
    /// daemon closes the socket when the last copy anywhere is closed), or, for a connection
    /// nothing else can hold, close it in the daemon and keep its pair ([`recycle`]).
    pub fn forget(&self, id: SockId) -> Result<(), Errno> {
        let mut g = self.lock()?;
        let ps = g.socks.remove(&id.0).ok_or(Errno::EBADF)?;
        let c = g.client.as_mut().expect("registered");
        if let Some(call) = ps.attach {
            // Its answer is nobody's now (the daemon takes the Forget after the Attach).
            c.waiting.remove(&call);
            c.done.remove(&call);
        }
        c.socks.remove(&id.0);
        // Its bytes still in the receive area are released with it.
        c.evict_sock(id.0, false);
        let recyclable = !ps.shared && !ps.dgram && ps.state != State::Listening;
        if recyclable && may_recycle(c) {
            return recycle(c, id.0, ps.a);
        }
        c.post(
            Mode::Async,
            Command::Forget {
                handle: id.0,
                recycle: false,
            },
        )
        .map_err(Errno::from)?;
        Ok(())
    }

    /// A of socket `id` may now be held or watched outside this library (sent with
    /// `SCM_RIGHTS`, put in a kernel epoll set by the shim): it is never recycled.
    pub fn pin(&self, id: SockId) {
        if let Ok(mut g) = self.lock() {
            if let Some(s) = g.socks.get_mut(&id.0) {
                s.shared = true;
            }
        }
    }
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
