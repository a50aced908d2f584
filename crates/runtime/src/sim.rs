//! Applications on the deterministic simulation: one [`App`] on each engine of a
//! [`Net`], in virtual time.
//!
//! [`Net::run_until`] drives the engines and jumps the clock to the next engine or link
//! deadline when nothing moves; [`run_apps`] adds the applications' own deadlines
//! ([`App::poll_at`]) so the clock never jumps past one, and stops when the first
//! application is done.

use flowstack_api::app::{App, Progress};
use flowstack_stack::netsim::Net;
use flowstack_stack::Engine;
use flowstack_wire::{Duration, Instant};

/// Runs `a` on host A and `b` on host B (each turn: A's app, then B's, both at the
/// simulation's `now`) until `a` is [`Progress::Done`] or virtual time passes `limit`.
/// Returns whether `a` finished.
pub fn run_apps<A, B>(net: &mut Net, limit: Duration, a: &mut A, b: &mut B) -> bool
where
    A: App<Engine> + ?Sized,
    B: App<Engine> + ?Sized,
{
    let end = net.now + limit;
    // The next application deadline still ahead of `now` (one already passed has had its
    // turn), or the end of the run.
    let wake = |a: &A, b: &B, now: Instant| -> Instant {
        [a.poll_at(), b.poll_at()]
            .into_iter()
            .flatten()
            .filter(|&t| t > now)
            .fold(end, Instant::min)
    };
    loop {
        let until = wake(a, b, net.now);
        let mut done = false;
        net.run_until(until.saturating_since(net.now), |n| {
            done = a.poll(n.now, &mut n.a) == Progress::Done;
            b.poll(n.now, &mut n.b);
            // A deadline moved: go round, so the clock stops at the new one.
            done || wake(a, b, n.now) != until
        });
        if done {
            return true;
        }
        if net.now >= end {
            return false;
        }
    }
}
