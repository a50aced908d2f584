//! One engine thread: the daemon's loop for the applications assigned to it (lib.rs module
//! docs), with its own loopback engine, sockets, doorbell eventfd and sleep.
//!
//! Engine 0 also runs the control part ([`Control`]): registrations and stats queries. With
//! several engines, the others get their applications and stats requests through a
//! [`Ctl`] channel, each message followed by a ring of their doorbell; frames between
//! engines go through the loopback's mesh rings (loopback.rs).

use crate::app::{self, App, Shared};
use crate::registry::{Control, Registry};
use crate::{IDLE_CHECK, LAST_CLOSE_CHECK};
use flowstack_runtime::xring::Doorbell;
use flowstack_runtime::Clock;
use flowstack_sys::eventfd::EventFd;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest sleep of an engine with a real link: the link is looked at this often (a frame
/// arriving on an idle daemon waits at most this long).
pub const LINK_SLICE: Duration = Duration::from_millis(1);

/// A message from the control part to another engine thread.
pub(crate) enum Ctl {
    /// Serve this newly registered application.
    Adopt(Box<App>),
    /// Answer with this engine's part of `flowstack stats`, as it is now.
    Stats(std::sync::mpsc::Sender<crate::stats::Stats>),
}

/// One engine thread's state.
pub(crate) struct EngineLoop {
    pub me: usize,
    pub sh: Shared,
    pub apps: Vec<App>,
    /// The doorbell eventfd its applications (and the other engines) ring.
    pub bell: Arc<EventFd>,
    /// The mesh doorbells (several engines): announcing sleep on ours makes the other
    /// engines ring `bell` when they send us frames.
    pub bells: Option<Arc<[Doorbell]>>,
    /// Applications and stats requests from the control part (engines other than 0).
    pub inbox: Option<Receiver<Ctl>>,
    pub spin: Duration,
    pub registry: Arc<Registry>,
}

impl EngineLoop {
    /// Runs until `stop` is set; `ctl` is the control part (engine 0 only).
    pub fn run(mut self, mut ctl: Option<Control>, stop: &AtomicBool) -> io::Result<()> {
        let clock = Clock::start();
        let mut last_check = Instant::now();
        let mut last_close_check = Instant::now();
        // When the current run of empty turns began (the spin before sleeping).
        let mut idle_since: Option<Instant> = None;
        // Turns taken, for the periodic sweep; whether one swept since the last busy turn.
        let mut turns: u64 = 0;
        let mut swept = false;
        // When the last sweep and the last full memory count ran; whether the last sleep
        // skipped its sweep (then it was short, and a sweep follows it).
        let mut last_sweep = Instant::now();
        let mut last_account = Instant::now();
        let mut owed = false;
        while !stop.load(Ordering::SeqCst) {
            let mut busy = false;
            // One clock read per turn: the engine's time, the periodic checks and the spin
            // all use it (a turn takes microseconds; the clock was 4–7% of the daemon's
            // samples under wrk when each of them read it).
            let t = Instant::now();
            let now = clock.at(t);
            turns = turns.wrapping_add(1);
            // A sweep (every socket looked at, app/marks.rs) every SWEEP_EVERY turns, and as
            // the first empty turn's follow-up, so nothing marked late waits for a sleep.
            let before_sleep = idle_since.is_some() && !swept;
            let want = turns.is_multiple_of(app::SWEEP_EVERY) || before_sleep;
            let sweep_gap = app::gap(app::SWEEP_GAP, self.sh.socks.len());
            let sweep = want && t.saturating_duration_since(last_sweep) >= sweep_gap;
            if before_sleep {
                owed = !sweep;
            }
            if sweep {
                last_sweep = t;
                owed = false;
            }
            swept |= want;
            if let Some(c) = ctl.as_mut() {
                busy |= c.turn(&mut self.sh, &mut self.apps, t);
            }
            if let Some(inbox) = &self.inbox {
                while let Ok(m) = inbox.try_recv() {
                    busy = true;
                    match m {
                        Ctl::Adopt(a) => self.apps.push(*a),
                        Ctl::Stats(to) => {
                            let _ = to.send(app::snapshot(&self.sh, &self.apps));
                        }
                    }
                }
            }
            let (sh, apps) = (&mut self.sh, &mut self.apps);
            for a in apps.iter_mut() {
                busy |= a.drain_commands(sh) > 0;
            }
            sh.lo.set_now(now);
            busy |= sh.poll_engines(apps, now);
            let all = t.saturating_duration_since(last_account)
                >= app::gap(app::ACCOUNT_GAP, sh.socks.len());
            if all {
                last_account = t;
            }
            app::account(sh, apps, all);
            busy |= app::service(sh, apps, sweep);
            for a in apps.iter_mut() {
                busy |= a.tx_turn(sh);
                busy |= a.flush_events();
            }
            // Tokens and filler after the events that explain them are published.
            busy |= sh.placeholder_actions();
            // Output the socket calls above produced.
            busy |= sh.poll_engines(apps, now);
            if t.saturating_duration_since(last_check) >= IDLE_CHECK {
                last_check = t;
                reap(apps, sh, &self.registry, true);
            }
            if busy && t.saturating_duration_since(last_close_check) >= LAST_CLOSE_CHECK {
                last_close_check = t;
                busy |= last_closes(sh, apps)?;
            }
            self.sh.counters.turns += 1;
            if busy {
                idle_since = None;
                swept = false;
                continue;
            }
            self.sh.counters.idle_turns += 1;
            if !swept {
                // One sweeping turn before the spin and the sleep.
                idle_since.get_or_insert(t);
                continue;
            }
            // Spin (bounded) before sleeping: a command posted within `spin` is taken without
            // a doorbell (the applications see `daemon_sleeping` clear and make no call).
            let since = *idle_since.get_or_insert(t);
            if t.saturating_duration_since(since) < self.spin {
                std::hint::spin_loop();
                continue;
            }
            idle_since = None;
            let registering = self.sleep(&clock, ctl.as_mut(), owed)?;
            if std::mem::take(&mut owed) {
                swept = false; // the skipped sweep comes before the next sleep
            }
            if let Some(c) = ctl.as_mut() {
                c.woke(registering, Instant::now());
            }
        }
        if let Some(c) = ctl.as_mut() {
            c.stop_peers();
        }
        for mut a in self.apps.drain(..) {
            self.registry.leave(a.pid);
            a.release_all(&mut self.sh);
        }
        self.sh.lo.poll(clock.now());
        Ok(())
    }

    /// Sleep: announce it (in every application's header and on the mesh doorbell), look once
    /// more, then `poll(2)` until something arrives or the engine's next deadline. Returns
    /// true if the registration socket was found readable (a registration waits).
    fn sleep(&mut self, clock: &Clock, ctl: Option<&mut Control>, owed: bool) -> io::Result<bool> {
        let (sh, apps) = (&mut self.sh, &mut self.apps);
        for a in apps.iter() {
            a.set_sleeping(true);
        }
        let wait = sh
            .lo
            .poll_at()
            .map(|t| t.saturating_since(clock.now()))
            .map(|d| Duration::from_nanos(d.as_nanos().min(u64::MAX as u128) as u64))
            .unwrap_or(IDLE_CHECK)
            .min(if owed {
                app::gap(app::SWEEP_GAP, sh.socks.len())
            } else {
                IDLE_CHECK
            })
            .min(if sh.lo.link_needs_slices() {
                // A link without a descriptor to sleep on (the shm wire, several AF_XDP
                // sockets in one device): look at it every slice.
                LINK_SLICE
            } else {
                IDLE_CHECK
            });
        let mut out: io::Result<Option<(Vec<bool>, bool)>> = Ok(None);
        let base = usize::from(ctl.is_some()) + 1;
        {
            let sh: &Shared = sh;
            let apps: &[App] = apps;
            let poll = || -> io::Result<(Vec<bool>, bool)> {
                let mut fds = Vec::new();
                if let Some(c) = &ctl {
                    fds.push(c.listener_fd());
                }
                fds.push(self.bell.as_fd());
                fds.extend(apps.iter().map(|a| a.stream.as_fd()));
                fds.extend(
                    apps.iter()
                        .filter_map(|a| a.pidfd.as_ref().map(|p| p.as_fd())),
                );
                fds.extend(sh.kernel_listeners());
                if let Some(c) = &ctl {
                    fds.extend(c.pending_fds());
                }
                // Readable when frames wait on the link (only woken on; after every index
                // the loop below reads).
                fds.extend(sh.lo.link_fd());
                // Last, and readable while a placeholder's last copy is gone.
                fds.push(sh.hups.fd());
                let (r, _) = flowstack_sys::placeholder::poll_sets(&fds, &[], Some(wait))?;
                let closed = r.last().copied().unwrap_or(false);
                Ok((r, closed))
            };
            let now = clock.now();
            let pending = || {
                apps.iter().any(|a| a.pending()) || sh.lo.mesh_pending() || sh.lo.link_pending(now)
            };
            // With a steered link, announce the sleep on the steering mesh too: an engine that
            // passes us a frame then rings our doorbell eventfd.
            let steer = sh.lo.link_doorbell();
            let mut sleep = || match steer {
                Some(d) => {
                    d.sleep(pending, || out = poll().map(Some));
                }
                None => out = poll().map(Some),
            };
            match &self.bells {
                Some(b) => {
                    b[self.me].sleep(pending, sleep);
                }
                None => {
                    fence(Ordering::SeqCst);
                    if !pending() {
                        sleep();
                    }
                }
            }
        }
        for a in apps.iter() {
            a.set_sleeping(false);
        }
        let Some((ready, closed)) = out? else {
            return Ok(false);
        };
        // Read the doorbell only when `poll` said it rang: a wake-up by anything else would
        // pay a `read` that answers `EAGAIN` (a rung bell not read here keeps the next
        // `poll` from sleeping, and is read then).
        sh.counters.sleeps += 1;
        if ready[base - 1] {
            sh.counters.bell_wakes += 1;
            let _ = self.bell.take();
        }
        let registering = base == 2 && ready[0];
        let pidfds = apps.iter().filter(|a| a.pidfd.is_some()).count();
        if ready
            .iter()
            .skip(base)
            .take(apps.len() + pidfds)
            .any(|&r| r)
        {
            reap(apps, sh, &self.registry, false);
        }
        if closed {
            last_closes(sh, apps)?;
        }
        Ok(registering)
    }
}

/// Closes every socket whose placeholder's last copy is gone; true if any.
///
/// Whatever an application posted before closing its last copy (sends, consumed bytes) is
/// in its ring by then: every ring is drained first, so the close comes after it.
fn last_closes(sh: &mut Shared, apps: &mut [App]) -> io::Result<bool> {
    let (said, loose) = sh.hung_up()?;
    for fd in loose {
        if !apps.iter_mut().any(|a| a.unwatch_loose(sh, fd)) {
            sh.counters.loose_hangups += 1;
        }
    }
    if said.is_empty() {
        return Ok(false);
    }
    // Checked on the descriptors themselves before anything is closed (ids and descriptors
    // kept in pairs, so the answers line up with the ids whatever is filtered).
    let (gids, ds): (Vec<u32>, Vec<_>) = said
        .iter()
        .filter_map(|&g| Some((g, sh.socks.get(&g)?.ph.as_ref()?.d.as_fd())))
        .unzip();
    let (_, h) = flowstack_sys::placeholder::poll_sets(&[], &ds, Some(Duration::ZERO))?;
    let gone: Vec<u32> = gids
        .into_iter()
        .zip(h)
        .filter_map(|(g, x)| x.then_some(g))
        .collect();
    if gone.is_empty() {
        return Ok(false);
    }
    for a in apps.iter_mut() {
        for _ in 0..64 {
            if a.drain_commands(sh) == 0 {
                break;
            }
        }
    }
    for &g in &gone {
        sh.counters.last_closes += 1;
        sh.release(g, false);
    }
    Ok(!gone.is_empty())
}

/// Drops applications that hung up, died or broke their rings.
fn reap(apps: &mut Vec<App>, sh: &mut Shared, registry: &Registry, check_pids: bool) {
    let mut i = 0;
    while i < apps.len() {
        let a = &apps[i];
        let exited = match &a.pidfd {
            Some(p) => flowstack_sys::poll::wait_readable(p, Duration::ZERO).unwrap_or(false),
            None => check_pids && !flowstack_sys::process::is_alive(a.pid),
        };
        let gone = a.broken || hung_up(&a.stream) || exited;
        if gone {
            let mut a = apps.swap_remove(i);
            if !a.broken {
                // What it posted before leaving still counts (consumed bytes above all: a
                // socket closed with nothing unread ends with FIN, not RST).
                for _ in 0..64 {
                    if a.drain_commands(sh) == 0 {
                        break;
                    }
                }
            }
            a.release_all(sh);
            registry.leave(a.pid);
        } else {
            i += 1;
        }
    }
}

fn hung_up(s: &UnixStream) -> bool {
    // Peek only: the stream also carries the descriptors of `Attach` records.
    flowstack_sys::placeholder::peer_closed(s.as_fd())
}
