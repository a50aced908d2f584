//! Destinations the daemon said it carries, remembered per process so that a program making
//! one connection per request (ab) does not ask each time (`Command::Carries`, a round trip
//! to the daemon before every `connect`).
//!
//! Only the answer "yes" is kept: a "no" (a destination nobody serves through flowstack yet)
//! may turn into a "yes" when a server starts, and must not send its clients to the kernel
//! for good. A "yes" turns into a "no" when the flowstack listener goes away; the first
//! connect after that is refused (`ECONNREFUSED`, as the kernel answers a port nobody listens
//! on) and forgets the destination, so the next one asks again.

use std::collections::HashSet;
use std::net::SocketAddrV4;

/// Most destinations remembered; past that the set starts over (a program that connects to
/// this many different flowstack servers asks again, nothing worse).
pub const MAX_CARRIED: usize = 256;

/// The set of destinations known to be carried.
#[derive(Debug, Default)]
pub struct Carried {
    set: HashSet<SocketAddrV4>,
}

impl Carried {
    /// Whether `a` was answered "carried" and not refused since.
    pub fn knows(&self, a: SocketAddrV4) -> bool {
        self.set.contains(&a)
    }

    /// The daemon answered "carried" for `a`.
    pub fn learn(&mut self, a: SocketAddrV4) {
        if self.set.len() >= MAX_CARRIED {
            self.set.clear();
        }
        self.set.insert(a);
    }

    /// A flowstack connect to `a` was refused: ask again next time.
    pub fn forget(&mut self, a: SocketAddrV4) {
        self.set.remove(&a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn remembers_until_refused_and_stays_bounded() {
        let a = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 80);
        let mut c = Carried::default();
        assert!(!c.knows(a));
        c.learn(a);
        assert!(c.knows(a));
        c.forget(a);
        assert!(!c.knows(a));
        for p in 0..(MAX_CARRIED as u16 + 10) {
            c.learn(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1000 + p));
        }
        assert!(c.set.len() <= MAX_CARRIED);
    }
}
