//! `SO_REUSEPORT` groups: several listeners — of one or several applications of one
//! effective uid, e.g. nginx workers with `reuseport` — on one address and port
//! ([`crate::ports`] decides who may join), sharing its connections.
//!
//! The engines listen once per group (an engine has one listener per port); the daemon
//! hands each connection the engines complete to one member, chosen by a hash of its
//! 4-tuple as Linux's `reuseport_select_sock` does (`reciprocal_scale(hash, n)`, here with
//! the Toeplitz hash of RSS and the Microsoft key: deterministic, no secret). A member's
//! connections wait in its own queue (`Kind::Listener::queue`) until it accepts them; a
//! member that leaves takes (resets) only its own queue, the others keep theirs, and the
//! engines' listeners close with the last member. Members' queues hold at most their
//! backlog: while the member a connection hashes to is full, the rest wait in the engine's
//! accept queue (bounded by its backlog), as a full listener's do.

use super::*;
use flowstack_wire::rss::{toeplitz, MICROSOFT_KEY};

/// A reuseport group: the engines' listeners and the member listeners.
#[derive(Debug)]
pub(crate) struct Group {
    /// (engine, listener) on each engine that listens for the group.
    hs: Vec<(usize, TcpHandle)>,
    /// The member listeners (socket ids) in the order they joined.
    members: Vec<u32>,
}

/// Groups by (address in the port table, port).
pub(crate) type Groups = HashMap<(Ipv4Addr, u16), Group>;

/// Listens for `gid` as a member of the group of `key`: joins it if it exists, else starts
/// it with the engines' listeners on `ip` (`Loopback::listen`).
pub(super) fn join(
    sh: &mut Shared,
    gid: u32,
    key: (Ipv4Addr, u16),
    ip: Ipv4Addr,
    backlog: usize,
) -> Result<(), SocketError> {
    if let Some(g) = sh.groups.get_mut(&key) {
        g.members.push(gid);
        return Ok(());
    }
    let hs = sh.lo.listen(ip, key.1, backlog)?;
    sh.groups.insert(
        key,
        Group {
            hs,
            members: vec![gid],
        },
    );
    Ok(())
}

/// Member `gid` leaves the group of `key` (its own queue is the caller's); the last one
/// closes the engines' listeners. Nothing if it is not a member.
pub(super) fn leave(sh: &mut Shared, gid: u32, key: (Ipv4Addr, u16)) {
    let Some(g) = sh.groups.get_mut(&key) else {
        return;
    };
    g.members.retain(|&m| m != gid);
    if g.members.is_empty() {
        let g = sh.groups.remove(&key).expect("present");
        for (i, h) in g.hs {
            let _ = sh.lo.engines[i].tcp_close(h);
        }
    }
}

/// The member a connection from `remote` to `local` goes to among `n`: Linux's
/// `reciprocal_scale(hash, n)` of the flow's hash.
pub(crate) fn pick(remote: SocketAddrV4, local: SocketAddrV4, n: usize) -> usize {
    let mut input = [0u8; 12];
    input[..4].copy_from_slice(&remote.ip().octets());
    input[4..8].copy_from_slice(&local.ip().octets());
    input[8..10].copy_from_slice(&remote.port().to_be_bytes());
    input[10..].copy_from_slice(&local.port().to_be_bytes());
    let h = toeplitz(&MICROSOFT_KEY, &input);
    ((h as u64 * n as u64) >> 32) as usize
}

/// Moves the connections the engines completed for every group into its members' queues;
/// true if any moved.
pub(crate) fn dispatch(sh: &mut Shared) -> bool {
    let Shared {
        groups, lo, socks, ..
    } = sh;
    let mut moved = false;
    for g in groups.values() {
        let n = g.members.len();
        'engines: for &(i, l) in &g.hs {
            loop {
                // Room in every member (the next connection's member is not known before
                // it is taken from the engine).
                let full = g
                    .members
                    .iter()
                    .any(|m| match socks.get(m).map(|s| &s.kind) {
                        Some(Kind::Listener { queue, backlog, .. }) => queue.len() >= *backlog,
                        _ => false,
                    });
                if full || n == 0 {
                    break 'engines;
                }
                let Ok(c) = lo.engines[i].tcp_accept(l) else {
                    break;
                };
                let m = match lo.engines[i].tcp_conn(c).map(|k| k.tuple()) {
                    Ok(t) => {
                        let remote = SocketAddrV4::new(t.remote_ip.into(), t.remote_port);
                        let local = SocketAddrV4::new(t.local_ip.into(), t.local_port);
                        g.members[pick(remote, local, n)]
                    }
                    Err(_) => g.members[0],
                };
                if let Some(Kind::Listener { queue, .. }) = socks.get_mut(&m).map(|s| &mut s.kind) {
                    queue.push_back((i, c));
                    moved = true;
                } else {
                    let _ = lo.engines[i].tcp_abort(c);
                }
            }
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::pick;
    use std::net::{Ipv4Addr, SocketAddrV4};

    /// The same flow always goes to the same member; flows spread over all of them.
    #[test]
    fn pick_is_deterministic_and_spreads() {
        let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 80);
        for n in 1..=4 {
            let mut seen = vec![0; n];
            for p in 40000..40256 {
                let remote = SocketAddrV4::new(Ipv4Addr::LOCALHOST, p);
                let m = pick(remote, local, n);
                assert!(m < n);
                assert_eq!(m, pick(remote, local, n));
                seen[m] += 1;
            }
            assert!(seen.iter().all(|&c| c > 256 / n / 2), "{n}: {seen:?}");
        }
    }
}
