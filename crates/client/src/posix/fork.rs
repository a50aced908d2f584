//! Settling before `fork`, `exec` and the spawn family (`Posix::settle`), and holding the
//! process-wide lock across a `fork` ([`Posix::settle_for_fork`]).

use super::*;

/// The POSIX layer's lock, held across a `fork` by the shim ([`Posix::settle_for_fork`]).
/// Dropped in the parent and in the child right after `fork` returns; the parent then drops
/// its copy of the carry (`hold`), which the child keeps.
pub struct ForkHold<'a>(Guard<'a>);

impl Drop for ForkHold<'_> {
    fn drop(&mut self) {
        if self.0.pid == std::process::id() {
            self.0.carry = HashMap::new();
        }
    }
}

impl Posix {
    /// Takes the daemon's answers to every `Attach` posted and not answered yet (see
    /// [`Posix::socket`]; for accepts' `Place`s, whose answers are dropped, one sync call
    /// behind them); call before `fork` or `exec`, after which another process may adopt
    /// these placeholders, which needs the daemon to know them first. Also writes the filler
    /// non-blocking connects left out (another process may wait on A in the kernel).
    pub fn settle(&self) {
        let Ok(mut g) = self.lock() else { return };
        settle(&mut g);
    }

    /// [`Posix::settle`], keeping the lock until the result is dropped: the shim holds it
    /// across `fork`, so no other thread is half-way through making one of the library's
    /// descriptors while the child is copied. (The wake-up pipe's write end exists in this
    /// process between `pipe2` and `Attach{Wake}`; a child copied then kept it, and this
    /// process then could not see the daemon's death through the pipe.) Also gives up the
    /// connections either process may read next, and carries their unread bytes into the
    /// child (`hold`).
    pub fn settle_for_fork(&self) -> Option<ForkHold<'_>> {
        let mut g = self.lock().ok()?;
        settle(&mut g);
        super::hold::before_fork(&mut g);
        Some(ForkHold(g))
    }
}

fn settle(g: &mut Inner) {
    // The child or new image holds every A now: none is recycled (`pool`).
    g.socks.values_mut().for_each(|s| s.shared = true);
    let pending: Vec<u32> = g
        .socks
        .iter()
        .filter(|(_, s)| s.attach.is_some())
        .map(|(&h, _)| h)
        .collect();
    for h in pending {
        let _ = g.sock(SockId(h));
    }
    if std::mem::take(&mut g.placed) {
        // Any sync call answered means the accepts' `Place`s before it were taken.
        let c = g.client.as_mut().expect("registered");
        let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
        let _ = sync(c, Command::Carries { remote: any });
    }
    // Another process may wait on these placeholders in the kernel.
    let later: Vec<u32> = g
        .socks
        .iter()
        .filter(|(_, s)| s.fill_later)
        .map(|(&h, _)| h)
        .collect();
    for h in later {
        let _ = fast::fill_now(g, SockId(h));
    }
}
