//! A flow's script, step by step: where each step of a message, a control segment or a
//! connection's set-up runs and what it costs under an architecture ([`Builder`]).

use super::{Arch, Handoff, Notify};
use crate::arch::Api;
use crate::calib::{daemon_copies, Calibration, StackCosts};
use crate::des::{Cat, Step};

/// Places a script step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Client,
    Server,
}

/// The resources one flow touches.
#[derive(Debug, Clone, Copy)]
pub(super) struct Places {
    /// The client's application core (`None`: remote, not simulated).
    pub(super) c_app: Option<usize>,
    /// The client's receive core.
    pub(super) c_rx: Option<usize>,
    /// The server's application core.
    pub(super) s_app: usize,
    /// The server's receive core.
    pub(super) s_rx: usize,
    /// The flow's stack core (offload).
    pub(super) engine: Option<usize>,
    pub(super) link: Option<usize>,
    pub(super) bus: Option<usize>,
    pub(super) lock: Option<usize>,
    /// The local ports the client's `connect()` takes ([`Des::pool`]), where they limit.
    pub(super) ports: Option<usize>,
}

pub(super) struct Builder<'a> {
    pub(super) cal: &'a Calibration,
    pub(super) arch: &'a Arch,
    pub(super) stack: &'a StackCosts,
    pub(super) p: Places,
    pub(super) steps: Vec<Step>,
    pub(super) remote: bool,
    pub(super) error_rate: f64,
    /// The step before which the client observes the response (`None`: at the end).
    pub(super) observe_at: Option<usize>,
    /// The flow's index (its threads are `2 k` for the client, `2 k + 1` for the server).
    pub(super) flow: u32,
    /// Whose thread the next host steps run in.
    pub(super) who: Side,
}

impl Builder<'_> {
    /// The thread of `self.who` on a core with a scheduler: a simulated application thread
    /// (a remote client's work, and interrupts on its behalf, are no thread here).
    pub(super) fn thread(&self) -> Option<u32> {
        self.app(self.who)?;
        Some(2 * self.flow + u32::from(self.who == Side::Server))
    }

    pub(super) fn on(&mut self, res: Option<usize>, ns: f64, cat: Cat) {
        if ns > 0.0 {
            if let Some(r) = res {
                self.steps.push(Step {
                    res: Some(r),
                    ns,
                    cat,
                    lock: None,
                    detached: false,
                    thread: self.thread(),
                });
            }
        }
    }

    pub(super) fn delay(&mut self, ns: f64) {
        if ns > 0.0 {
            self.steps.push(Step {
                res: None,
                ns,
                cat: Cat::Wire,
                lock: None,
                detached: false,
                thread: self.thread(),
            });
        }
    }

    /// Work on `res` the transaction does not wait for.
    pub(super) fn detach(&mut self, res: Option<usize>, ns: f64, cat: Cat) {
        if let (Some(r), true) = (res, ns > 0.0) {
            self.steps.push(Step {
                res: Some(r),
                ns,
                cat,
                lock: None,
                detached: true,
                thread: self.thread(),
            });
        }
    }

    /// After a woken application's first call: the CPU of its blocking wait (going to
    /// sleep, the switches), which it spends off the transaction's path — while the stack
    /// core works on what it posted, and after it took the event (`daemon-wake` only).
    pub(super) fn after_wake(&mut self, side: Side) {
        self.who = side;
        if self.arch.handoff == Handoff::Futex && self.p.engine.is_some() {
            let a = self.app(side);
            self.detach(a, self.cal.host.app_wait_ns, Cat::Wakeup);
        }
    }

    pub(super) fn app(&self, side: Side) -> Option<usize> {
        match side {
            Side::Client => self.p.c_app,
            Side::Server => Some(self.p.s_app),
        }
    }

    pub(super) fn rx(&self, side: Side) -> Option<usize> {
        match side {
            Side::Client => self.p.c_rx,
            Side::Server => Some(self.p.s_rx),
        }
    }

    /// Where `side`'s stack runs when it sends.
    pub(super) fn tx_stack(&self, side: Side) -> Option<usize> {
        match self.p.engine {
            Some(e) => match side {
                Side::Server => Some(e),
                // Remote clients cost nothing here.
                Side::Client => (!self.remote).then_some(e),
            },
            None => self.app(side),
        }
    }

    /// Where `to`'s stack receives what `from` sent.
    pub(super) fn rx_stack(&self, from: Side, to: Side) -> Option<usize> {
        if let Some(e) = self.p.engine {
            return (to == Side::Server || !self.remote).then_some(e);
        }
        if self.remote {
            self.rx(to)
        } else {
            // Loopback: the receive processing runs on the sender's core (softirq on the
            // sending CPU; a flowstack per-core pipe is turned by that core's loop).
            self.app(from)
        }
    }

    /// One application call into the stack on `side`.
    pub(super) fn api(&mut self, side: Side) {
        self.who = side;
        let h = self.cal.host.clone();
        let (ns, cat) = match self.arch.api {
            Api::Syscall => (h.syscall_ns, Cat::Api),
            Api::Library => (h.lib_call_ns, Cat::Api),
            Api::Ring => (h.ring_ns, Cat::Api),
        };
        let r = self.app(side);
        self.on(r, ns, cat);
        if self.arch.api == Api::Ring && (side == Side::Server || !self.remote) {
            // The stack core reads the command (or posts the event) and dispatches it: a
            // ring record, `ring_ns`, as the application's post. Waking an application
            // that sleeps is charged where the daemon makes one (`wake_op`): flowstackd
            // writes a wake-up only when the application said it sleeps (`notify.rs`), so
            // a stream's writes make none. (Charged on `daemon-wake`, the configuration it
            // was fitted on; a polling daemon or a NIC are charged none, as before.)
            let e = self.p.engine;
            if self.arch.handoff == Handoff::Futex {
                self.on(e, h.ring_ns, Cat::Api);
            }
        }
    }

    pub(super) fn packets(&self, bytes: usize) -> usize {
        let seg = self.stack.max_segment.max(1);
        let mtu = if self.remote { self.cal.link.mtu } else { seg };
        let per_seg = seg.min(mtu.max(64));
        bytes.div_ceil(per_seg).max(1)
    }

    pub(super) fn segments(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.stack.max_segment.max(1)).max(1)
    }

    /// Carries `bytes` in `pkts` packets across the medium between the two sides.
    pub(super) fn medium(&mut self, bytes: usize, pkts: usize) {
        if self.remote {
            let l = &self.cal.link;
            let wire = (bytes + pkts * l.header_bytes) as f64 * 8.0 / l.gbps;
            let link = self.p.link;
            self.on(link, wire, Cat::Wire);
            self.delay(l.latency_ns);
        }
    }

    /// Moves `bytes` over the bus between a host core and a stack core (`sending`: from
    /// `side`'s application to the stack, else to it): the host's copy (or programmed I/O)
    /// and, on a daemon's stack core, the copies flowstackd makes of them
    /// ([`daemon_copies`]: each `host.daemon_per_byte_ns`; a NIC's DMA costs its core
    /// nothing).
    pub(super) fn bus(&mut self, side: Side, bytes: usize, sending: bool) {
        self.who = side;
        let b = &self.cal.bus;
        let host = self.app(side);
        let pio = bytes as f64 * b.host_per_byte_ns;
        self.on(host, pio, Cat::Copy);
        if self.arch.engines_on_host {
            let e = self.p.engine;
            let copies = daemon_copies(bytes, sending);
            self.on(
                e,
                copies * bytes as f64 * self.cal.host.daemon_per_byte_ns,
                Cat::Copy,
            );
        }
        let b = &self.cal.bus;
        let bus = self.p.bus;
        self.on(bus, bytes as f64 * 8.0 / b.gbps, Cat::Wire);
        self.delay(b.latency_ns);
    }

    /// Hands received data from the core that received it (`from_core`) to `to`'s
    /// application.
    pub(super) fn handoff(&mut self, from_core: Option<usize>, to: Side) {
        self.who = to;
        let target = self.app(to);
        let h = &self.cal.host;
        match self.arch.handoff {
            Handoff::Poll => self.on(target, h.poll_turn_ns, Cat::Poll),
            Handoff::Wakeup => {
                if from_core.is_some() && target.is_some() && from_core != target {
                    self.delay(h.cross_core_ns);
                }
                self.on(target, h.wakeup_ns, Cat::Wakeup);
            }
            Handoff::Futex => self.futex_wake(to),
        }
    }

    /// The per-byte work of the stack's send and receive paths (the profile's: the
    /// payload's copies into and out of the stack and its checksums). A daemon's stack
    /// core moves a byte only by the copies [`daemon_copies`] counts, charged in
    /// [`Builder::bus`]: 0 here.
    pub(super) fn stack_per_byte(&self) -> (f64, f64) {
        if self.arch.engines_on_host && self.p.engine.is_some() {
            (0.0, 0.0)
        } else {
            (self.stack.send_per_byte_ns, self.stack.recv_per_byte_ns)
        }
    }

    /// The stack core wakes a sleeping application: its work to do so (the wake-up's
    /// system call and the event that caused it, `host.stack_op_ns`, fitted to the offload
    /// rr run), `n` times (`daemon-wake` only).
    pub(super) fn wake_op(&mut self, n: f64) {
        if self.arch.handoff == Handoff::Futex {
            let e = self.p.engine;
            self.on(e, n * self.cal.host.stack_op_ns, Cat::Api);
        }
    }

    /// A blocking ring call on a daemon whose applications sleep (`daemon-wake` only; other
    /// architectures' costs for such calls are in their connection work): the stack core
    /// posts the completion (or event) and wakes the caller. `on_path`: the transaction
    /// waits for the wake-up's latency; otherwise the application is woken beside the
    /// transaction's path (another application's wake-up at the same time) and only its
    /// wait's CPU, on its core, is charged.
    pub(super) fn wait(&mut self, side: Side, on_path: bool) {
        if self.arch.handoff == Handoff::Futex && self.p.engine.is_some() {
            self.wake_op(1.0);
            if on_path {
                self.futex_wake(side);
            }
            self.after_wake(side);
        }
    }

    /// The stack core wakes `to`'s sleeping application on another core: the wake-up's
    /// latency (its CPU is [`Builder::after_wake`]'s).
    pub(super) fn futex_wake(&mut self, to: Side) {
        if self.app(to).is_some() {
            self.delay(self.cal.host.app_wake());
        }
    }

    /// Marks the point at which the client observes the transaction's end (steps after it
    /// still run before its next transaction starts).
    pub(super) fn observe_here(&mut self) {
        self.observe_at = Some(self.steps.len());
    }

    /// One message of `s` bytes from `from` to `to` (`wake`: the receiver was blocked
    /// waiting for it).
    pub(super) fn message(&mut self, from: Side, to: Side, s: usize, wake: bool) {
        let h = self.cal.host.clone();
        let st = self.stack.clone();
        let segs = self.segments(s);
        let pkts = self.packets(s);
        // Inflation by corrupted packets: each is sent and received again (seed 001 eq. 5).
        let again = 1.0 / (1.0 - self.error_rate.clamp(0.0, 0.99));
        // Sender (the loopback receive processing too: it runs in the sender's call).
        self.api(from);
        let a = self.app(from);
        if self.arch.copy && self.p.engine.is_none() {
            self.on(a, s as f64 * h.copy_per_byte_ns, Cat::Copy);
        }
        if self.p.engine.is_some() && (from == Side::Server || !self.remote) {
            self.bus(from, s, true);
        }
        let (send_pb, recv_pb) = self.stack_per_byte();
        let txs = self.tx_stack(from);
        let send = segs as f64 * st.send_fixed_ns + s as f64 * send_pb;
        self.on(txs, send * again, Cat::Stack);
        // Medium.
        self.medium(s, pkts);
        // Receiver.
        let rxs = self.rx_stack(from, to);
        if self.remote && self.arch.notify == Notify::InterruptPerPacket && self.p.engine.is_none()
        {
            self.on(rxs, pkts as f64 * h.interrupt_ns * again, Cat::Interrupt);
        }
        if self.arch.notify == Notify::Poll && self.p.engine.is_none() && rxs != a {
            self.on(rxs, h.poll_turn_ns, Cat::Poll);
        }
        let recv = segs as f64 * st.recv_fixed_ns + s as f64 * recv_pb;
        self.on(rxs, recv * again, Cat::Stack);
        let b = self.app(to);
        if self.p.engine.is_some() {
            if to == Side::Server || !self.remote {
                self.bus(to, s, false);
                // One notification per message (not per packet): an interrupt on a NIC,
                // a ring event the application's wait picks up on a daemon.
                match self.arch.handoff {
                    // A NIC interrupts the host once per message; a blocked reader is woken.
                    Handoff::Wakeup => {
                        self.on(b, h.interrupt_ns, Cat::Interrupt);
                        if wake {
                            self.on(b, h.wakeup_ns, Cat::Wakeup);
                        }
                    }
                    // A daemon's event ring, polled by the busy application.
                    Handoff::Poll => self.on(b, h.poll_turn_ns, Cat::Poll),
                    // A daemon wakes the application sleeping for the message.
                    Handoff::Futex => {
                        if wake {
                            self.wake_op(1.0);
                            self.futex_wake(to);
                        }
                    }
                }
            }
            self.api(to);
            if wake {
                self.after_wake(to);
            }
        } else {
            if wake {
                self.handoff(rxs, to);
            }
            self.api(to);
            if self.arch.copy {
                self.on(b, s as f64 * h.copy_per_byte_ns, Cat::Copy);
            }
        }
    }

    /// Whether both sides run in flowstack's bench drive loop (`bench --cores N`): one
    /// thread per core turning the client engine, the client app, the server engine and the
    /// server app, with one clock read per turn.
    pub(super) fn drive_loop(&self) -> bool {
        !self.remote
            && self.p.engine.is_none()
            && self.arch.handoff == Handoff::Poll
            && self.p.c_app == Some(self.p.s_app)
    }

    /// One rr transaction in the drive loop: four turns. (1) The client app sends, stamped
    /// with the turn's clock read; (2) the client engine transmits, the server engine
    /// receives, the server app answers; (3) the server engine transmits; (4) the client
    /// engine receives and the client app sees the answer — stamped with turn 4's clock
    /// read, taken *before* that turn's work, so the response time is turns 1–3 — and the
    /// next request waits for turn 5 (the client steps each connection once per turn). The
    /// cycle (and so the rate) is all four turns.
    pub(super) fn drive_loop_rr(&mut self, s: usize, app_ns: f64) {
        let st = self.stack.clone();
        let turn = self.cal.host.poll_turn_ns;
        let segs = self.segments(s) as f64;
        let send = segs * st.send_fixed_ns + s as f64 * st.send_per_byte_ns;
        let recv = segs * st.recv_fixed_ns + s as f64 * st.recv_per_byte_ns;
        let (c, srv) = (self.p.c_app, Some(self.p.s_app));
        self.on(c, turn, Cat::Poll);
        self.on(c, turn, Cat::Poll);
        self.on(c, send, Cat::Stack);
        self.on(srv, recv, Cat::Stack);
        self.app_work(app_ns);
        self.on(srv, turn, Cat::Poll);
        self.on(srv, send, Cat::Stack);
        self.observe_at = Some(self.steps.len());
        self.on(c, turn, Cat::Poll);
        self.on(c, recv, Cat::Stack);
    }

    /// A control segment (SYN, FIN, pure ACK) from `from` to `to`.
    pub(super) fn control(&mut self, from: Side, to: Side) {
        let st = self.stack.clone();
        let h = self.cal.host.clone();
        self.who = from;
        let txs = self.tx_stack(from);
        self.on(txs, st.ctrl_send_ns, Cat::Stack);
        self.medium(0, 1);
        let rxs = self.rx_stack(from, to);
        if self.remote && self.arch.notify == Notify::InterruptPerPacket && self.p.engine.is_none()
        {
            self.on(rxs, h.interrupt_ns, Cat::Interrupt);
        }
        self.on(rxs, st.ctrl_recv_ns, Cat::Stack);
    }

    /// The client's `connect()` takes a local port: it waits when every port is still in
    /// TIME-WAIT ([`HostCosts::connect_ports`](crate::calib::HostCosts::connect_ports)).
    pub(super) fn take_port(&mut self) {
        if let Some(p) = self.p.ports {
            self.who = Side::Client;
            self.steps.push(Step {
                res: Some(p),
                ns: 0.0,
                cat: Cat::Wire,
                lock: None,
                detached: false,
                thread: None,
            });
        }
    }

    pub(super) fn app_work(&mut self, ns: f64) {
        self.who = Side::Server;
        let s = Some(self.p.s_app);
        self.on(s, ns, Cat::App);
    }

    /// The connection's set-up and tear-down work beyond its segments.
    pub(super) fn conn_work(&mut self) {
        let st = self.stack.clone();
        let h = self.cal.host.clone();
        // Both halves run in the client's connect (the server's in its loopback receive).
        self.who = Side::Client;
        let c = self.tx_stack(Side::Client);
        self.on(c, st.conn_ns / 2.0, Cat::Stack);
        let s = self.rx_stack(Side::Client, Side::Server);
        if self.arch.shared_conn_lock && self.p.lock.is_some() {
            // The server side's connection work runs under the lock all cores share (its
            // time is counted as host CPU: some core holds the lock meanwhile).
            let hold = h.shared_conn_ns.min(st.conn_ns / 2.0);
            self.on(s, st.conn_ns / 2.0 - hold, Cat::Stack);
            if let Some(core) = s {
                self.steps.push(Step {
                    res: Some(core),
                    ns: hold + h.bounce_ns,
                    cat: Cat::Lock,
                    lock: self.p.lock,
                    detached: false,
                    thread: self.thread(),
                });
            }
        } else {
            self.on(s, st.conn_ns / 2.0, Cat::Stack);
        }
    }
}
