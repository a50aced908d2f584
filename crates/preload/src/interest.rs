//! The flowstack connections of one epoll set watched by the shim (`epoll`), and the scan
//! that answers `epoll_wait` from them in O(ready), not O(watched).
//!
//! A scan looks at (1) the interests it is told to look at *again* — level-triggered ones it
//! reported ready last time (still ready until the program reads or writes: the kernel puts
//! them back on its ready list after each report, epoll(7)), ready ones that did not fit in
//! the caller's array, and ones added or modified since — and (2) the interests of the
//! sockets that may have changed since its last look (`Backend::changed`: the event ring's
//! handles and the program's own calls). Everything else is idle: an idle keep-alive
//! connection costs nothing per wait. When the change log cannot say (the first scan, more
//! than `flowstack_client`'s log capacity of changes since the last look, a dead daemon),
//! the scan looks at every interest once.
//!
//! The rules per interest are the kernel's: level-triggered reports while ready;
//! edge-triggered (`EPOLLET`) reports when an event came for the socket since its last
//! report (its event counts moved); `EPOLLONESHOT` disables the interest after one report
//! until `EPOLL_CTL_MOD`; `EPOLLERR`/`EPOLLHUP` are always reported.

use crate::backend::{Backend, Cursor, Errno, FastReady};
use crate::table::SockId;
use flowstack_api::ids::IdMap;
use libc::{c_int, epoll_event};

pub const EPOLLONESHOT: u32 = 1 << 30;
pub const EPOLLET: u32 = 1 << 31;

#[derive(Debug, Clone, Copy)]
pub struct Interest {
    pub fd: c_int,
    pub id: SockId,
    pub events: u32,
    pub data: u64,
    /// Reported once with `EPOLLONESHOT`: silent until `MOD`.
    pub off: bool,
    /// Event counts at the last report (edge-triggered).
    pub seen: Option<(u32, u32)>,
    /// The placeholder is in the kernel's set for `EPOLLOUT` (edge), see `epoll::arm_out`.
    pub out_armed: bool,
    /// Wants `EPOLLOUT` and was not writable at its last look (counted in `waiting_out`).
    wait_out: bool,
    /// The scan that last queued it (no interest is looked at twice in a scan).
    stamp: u32,
}

impl Interest {
    pub fn new(fd: c_int, id: SockId, e: epoll_event) -> Self {
        Self {
            fd,
            id,
            events: e.events,
            data: e.u64,
            off: false,
            seen: None,
            out_armed: false,
            wait_out: false,
            stamp: 0,
        }
    }
}

/// One set's interests, by descriptor, with what the next scan must look at.
#[derive(Debug, Default)]
pub struct Interests {
    by_fd: IdMap<c_int, Interest>,
    /// The descriptors of each socket's interests (a socket added under several numbers).
    by_id: IdMap<SockId, Vec<c_int>>,
    /// Where the last scan left the change log.
    cur: Cursor,
    /// Look at these next time (see the module docs).
    again: Vec<c_int>,
    /// Interests waiting for send space (`wait_out`).
    waiting_out: usize,
    pass: u32,
    // Scratch, reused between scans.
    queue: Vec<c_int>,
    changed: Vec<SockId>,
    ids: Vec<SockId>,
    /// Per id: the interest asks for input.
    reads: Vec<bool>,
    ready: Vec<Option<FastReady>>,
}

/// What a scan found.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scan {
    /// Entries written.
    pub n: usize,
    /// The pump count to sleep on.
    pub gen: u64,
    /// Some interest waits for send space.
    pub want_w: bool,
}

impl Interests {
    pub fn get(&self, fd: c_int) -> Option<&Interest> {
        self.by_fd.get(&fd)
    }

    /// Adds `x` (its descriptor is not in the set); looked at by the next scan.
    pub fn add(&mut self, x: Interest) {
        self.by_id.entry(x.id).or_default().push(x.fd);
        self.by_fd.insert(x.fd, x);
        self.again.push(x.fd);
    }

    /// `EPOLL_CTL_MOD` of `fd`: new events and data, armed again; looked at by the next scan.
    pub fn modify(&mut self, fd: c_int, e: epoll_event) {
        if let Some(x) = self.by_fd.get_mut(&fd) {
            x.events = e.events;
            x.data = e.u64;
            x.off = false;
            x.seen = None;
            self.again.push(fd);
        }
    }

    pub fn remove(&mut self, fd: c_int) -> Option<Interest> {
        let x = self.by_fd.remove(&fd)?;
        if let Some(v) = self.by_id.get_mut(&x.id) {
            v.retain(|&f| f != fd);
            if v.is_empty() {
                self.by_id.remove(&x.id);
            }
        }
        if x.wait_out {
            self.waiting_out -= 1;
        }
        Some(x)
    }

    /// Every interest of socket `id` out (its last descriptor was closed).
    pub fn remove_sock(&mut self, id: SockId) {
        for fd in self.by_id.get(&id).cloned().unwrap_or_default() {
            self.remove(fd);
        }
    }

    /// All interests out, for the kernel's set.
    pub fn take_all(&mut self) -> Vec<Interest> {
        let v = self.by_fd.drain().map(|(_, x)| x).collect();
        *self = Self::default();
        v
    }

    /// Writes the ready interests into `out`, then the listeners' ids are looked at by the
    /// caller from `extra`'s answers: `extra` ids are asked of the backend after the
    /// interests' and their answers are left in [`Interests::extra_ready`]. `arm` is called
    /// for an interest blocked on send space whose placeholder is not watched yet.
    pub fn scan(
        &mut self,
        b: &dyn Backend,
        extra: impl Iterator<Item = SockId>,
        out: &mut [epoll_event],
        mut arm: impl FnMut(&mut Interest),
    ) -> Result<Scan, Errno> {
        self.pass = self.pass.wrapping_add(1);
        let pass = self.pass;
        let mut changed = std::mem::take(&mut self.changed);
        changed.clear();
        let (known, gen) = b.changed(&mut self.cur, &mut changed)?;
        let mut queue = std::mem::take(&mut self.queue);
        queue.clear();
        let put = |x: &mut Interest, q: &mut Vec<c_int>| {
            if x.stamp != pass {
                x.stamp = pass;
                q.push(x.fd);
            }
        };
        if known {
            for fd in self.again.drain(..) {
                if let Some(x) = self.by_fd.get_mut(&fd) {
                    put(x, &mut queue);
                }
            }
            for id in &changed {
                for fd in self.by_id.get(id).map(Vec::as_slice).unwrap_or_default() {
                    if let Some(x) = self.by_fd.get_mut(fd) {
                        put(x, &mut queue);
                    }
                }
            }
        } else {
            self.again.clear();
            for x in self.by_fd.values_mut() {
                put(x, &mut queue);
            }
        }
        self.changed = changed;
        self.ids.clear();
        self.ids.extend(queue.iter().map(|fd| self.by_fd[fd].id));
        self.reads.clear();
        let input = (libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLRDHUP) as u32;
        self.reads
            .extend(queue.iter().map(|fd| self.by_fd[fd].events & input != 0));
        let n_fast = self.ids.len();
        self.ids.extend(extra);
        self.reads.resize(self.ids.len(), true);
        let gen = if self.ids.is_empty() {
            self.ready.clear(); // nothing to look at: no second lock
            gen
        } else {
            let g2 = b.ready_many(&self.ids, &self.reads, true, &mut self.ready)?;
            if known {
                gen
            } else {
                g2
            }
        };
        let mut n = 0;
        for (i, &fd) in queue.iter().enumerate() {
            let x = self.by_fd.get_mut(&fd).expect("queued from the map");
            if n == out.len() {
                // No room: looked at again next time (the kernel keeps them on its list).
                self.again.push(fd);
                continue;
            }
            let Some(f) = self.ready.get(i).copied().flatten() else {
                set_wait_out(x, false, &mut self.waiting_out);
                continue;
            };
            let (ev, wait_out) = events_of(x, &f);
            set_wait_out(x, wait_out && !x.off, &mut self.waiting_out);
            if x.off {
                continue;
            }
            if wait_out && f.blocked && !x.out_armed {
                arm(x);
            }
            if ev == 0 || (x.events & EPOLLET != 0 && x.seen == Some((f.rgen, f.wgen))) {
                continue;
            }
            x.seen = Some((f.rgen, f.wgen));
            if x.events & EPOLLONESHOT != 0 {
                x.off = true;
                set_wait_out(x, false, &mut self.waiting_out);
            } else if x.events & EPOLLET == 0 {
                self.again.push(fd); // level-triggered: still ready until shown otherwise
            }
            out[n] = epoll_event {
                events: ev,
                u64: x.data,
            };
            n += 1;
        }
        self.queue = queue;
        self.ready.drain(..n_fast);
        Ok(Scan {
            n,
            gen,
            want_w: self.waiting_out > 0,
        })
    }

    /// The backend's answers for the `extra` ids of the last [`Interests::scan`], in order.
    pub fn extra_ready(&self) -> &[Option<FastReady>] {
        &self.ready
    }
}

fn set_wait_out(x: &mut Interest, v: bool, count: &mut usize) {
    if x.wait_out != v {
        x.wait_out = v;
        if v {
            *count += 1;
        } else {
            *count -= 1;
        }
    }
}

/// The events `x` is ready for, and whether it waits for send space.
fn events_of(x: &Interest, f: &FastReady) -> (u32, bool) {
    let want = x.events;
    let mut ev = 0u32;
    let mut wait_out = false;
    if want & libc::EPOLLIN as u32 != 0 && f.r.readable {
        ev |= libc::EPOLLIN as u32;
    }
    if want & libc::EPOLLOUT as u32 != 0 {
        if f.r.writable {
            ev |= libc::EPOLLOUT as u32;
        } else {
            wait_out = true;
        }
    }
    if want & libc::EPOLLRDHUP as u32 != 0 && f.rdhup {
        ev |= libc::EPOLLRDHUP as u32;
    }
    if f.r.error.is_some() {
        ev |= libc::EPOLLERR as u32;
    }
    if f.r.hup {
        ev |= libc::EPOLLHUP as u32;
    }
    (ev, wait_out)
}
