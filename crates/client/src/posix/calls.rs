//! The daemon calls the POSIX layer makes — sync calls, `Attach` records with their
//! descriptors (posted, answered now or later), addresses — and the placeholder's filler
//! and sleeps.

use super::*;

pub(super) fn sync(c: &mut Client, cmd: Command) -> Result<u64, Errno> {
    let id = c.post(Mode::Sync, cmd).map_err(Errno::from)?;
    finish(c, id)
}

/// Waits for the completion of sync call `id` posted earlier.
pub(super) fn finish(c: &mut Client, id: u32) -> Result<u64, Errno> {
    c.complete(id, sync_timeout())
        .map(|(_, v)| v)
        .map_err(Errno::from)
}

/// Sends `fds` on the registration stream (one byte, the op) and posts the `Attach` record
/// (sync mode) without waiting: returns the call's id for [`finish`]. The daemon reads the
/// descriptors when it takes the record, so both arrive in order. No descriptors (the pooled
/// ops, see `pool`): no message on the stream either.
pub(super) fn post_attach(
    c: &mut Client,
    h: u32,
    op: AttachOp,
    ty: SockType,
    fds: &[BorrowedFd<'_>],
) -> Result<u32, Errno> {
    if c.dead {
        return Err(Errno::ECONNRESET);
    }
    if !fds.is_empty() {
        flowstack_sys::fdpass::send_fds(&c.stream, &[op.code()], fds)
            .map_err(|_| Errno::ECONNRESET)?;
    }
    c.post(Mode::Sync, Command::Attach { handle: h, op, ty })
        .map_err(Errno::from)
}

/// Sends `fds` and the `Attach` record, and waits for its completion.
pub(super) fn attach_fds(
    c: &mut Client,
    h: u32,
    op: AttachOp,
    fds: &[BorrowedFd<'_>],
) -> Result<u64, Errno> {
    let id = post_attach(c, h, op, SockType::Stream, fds)?;
    finish(c, id)
}

pub(super) fn get_addr(c: &mut Client, h: u32, peer: bool) -> Result<SocketAddrV4, Errno> {
    sync(c, Command::GetAddr { handle: h, peer }).map(addr_of_value)
}

/// A `GetAddr` answer: the address in bits 16..48, the port below.
pub(super) fn addr_of_value(v: u64) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from((v >> 16) as u32), (v & 0xffff) as u16)
}

/// Fills A (unwritable) and asks the daemon to empty it when send space returns.
pub(super) fn make_unwritable(g: &mut Inner, id: SockId) -> Result<(), Errno> {
    placeholder::fill(g.sock_as_is(id)?.a.as_fd()).map_err(|_| Errno::ECONNRESET)?;
    let c = g.client.as_mut().expect("registered");
    if let Some(s) = c.socks.get_mut(&id.0) {
        s.blocked = true; // unwritable in the fast path's view too, until `Posix::unblock`
    }
    c.post(Mode::Async, Command::WantWritable { handle: id.0 })
        .map(|_| ())
        .map_err(Errno::from)
}

/// Sleeps on A (readable and/or writable) until the deadline (`EAGAIN` when it passed, as
/// `SO_RCVTIMEO` does), in slices so a dead daemon is noticed.
pub(super) fn wait_on(
    a: &OwnedFd,
    read: bool,
    write: bool,
    deadline: Option<Instant>,
) -> Result<(), Errno> {
    let slice = match deadline {
        Some(d) => {
            let now = Instant::now();
            if now >= d {
                return Err(Errno::EAGAIN);
            }
            (d - now).min(LIVENESS_CHECK)
        }
        None => LIVENESS_CHECK,
    };
    let (_, _, hup) =
        placeholder::wait_a(a.as_fd(), read, write, slice).map_err(|_| Errno::EBADF)?;
    if hup {
        // D closed: only the daemon's death closes it while we hold A.
        return Err(Errno::ECONNRESET);
    }
    Ok(())
}
