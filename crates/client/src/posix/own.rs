//! The library's own descriptors out of the program's way when the program takes their
//! number (`flowstack_sys::ownfd`).

use super::*;

impl Posix {
    /// Moves the library's descriptor numbered `fd` (the registration socket, the doorbell,
    /// the wake-up channel, a socket's or a pooled copy of a placeholder) to another
    /// number: the program is about to `dup2` onto `fd`. False if none of them has that
    /// number here, or it could not be moved (no number free: the program's `dup2` then
    /// replaces it, as before this existed).
    pub fn move_own(&self, fd: RawFd) -> bool {
        let Ok(mut g) = self.lock() else {
            return false;
        };
        let g = &mut *g;
        if let Some(w) = g.wake.as_mut().filter(|w| w.raw() == fd) {
            return w.relocate().is_ok();
        }
        if let Some(s) = g.socks.values_mut().find(|s| s.a.raw() == fd) {
            return s.a.relocate().is_ok();
        }
        let Some(c) = g.client.as_mut() else {
            return false;
        };
        if c.stream.raw() == fd {
            return c.stream.relocate().is_ok();
        }
        if c.bell.raw() == fd {
            return c.bell.relocate().is_ok();
        }
        if let Some((a, _)) = c.pooled.iter_mut().find(|(a, _)| a.raw() == fd) {
            return a.relocate().is_ok();
        }
        if let Some((_, a)) = c.recycling.iter_mut().find(|(_, a)| a.raw() == fd) {
            return a.relocate().is_ok();
        }
        false
    }
}
