//! The workloads as scripts over a flow's [`Builder`]: rr, crr, stream and file.

use super::builder::{Builder, Side};
use super::{Handoff, Notify, Scenario, Workload};
use crate::arch::Api;
use crate::des::{Arrivals, Cat};

pub(super) fn script(b: &mut Builder, sc: &Scenario) -> (Arrivals, u64) {
    let s = sc.size;
    let closed = |outstanding| Arrivals::Closed {
        outstanding,
        think_ns: 0.0,
    };
    let arrivals = |outstanding| match sc.load {
        Some(l) => Arrivals::Open {
            per_s: l / sc.conns as f64,
        },
        None => closed(outstanding),
    };
    match sc.workload {
        Workload::Rr if b.drive_loop() => {
            b.drive_loop_rr(s, sc.app_ns);
            (closed(1), 2 * s as u64)
        }
        Workload::Rr => {
            b.message(Side::Client, Side::Server, s, true);
            b.app_work(sc.app_ns);
            b.message(Side::Server, Side::Client, s, true);
            (arrivals(1), 2 * s as u64)
        }
        Workload::Crr if b.arch.handoff == Handoff::Futex && b.p.engine.is_some() => {
            crr_daemon_wake(b, s, sc.app_ns);
            (arrivals(1), 2 * s as u64)
        }
        Workload::Crr => {
            // Client: socket + connect (a local port); SYN, SYN-ACK, ACK.
            b.api(Side::Client);
            b.api(Side::Client);
            b.take_port();
            b.control(Side::Client, Side::Server);
            b.control(Side::Server, Side::Client);
            b.control(Side::Client, Side::Server);
            b.conn_work();
            // The server's accept is woken.
            let rx = b.rx_stack(Side::Client, Side::Server);
            b.handoff(rx, Side::Server);
            b.api(Side::Server);
            b.message(Side::Client, Side::Server, s, false);
            b.app_work(sc.app_ns);
            b.message(Side::Server, Side::Client, s, true);
            // close() on both ends: FIN, FIN, last ACK; the server is woken by the FIN.
            b.api(Side::Client);
            b.control(Side::Client, Side::Server);
            let rx = b.rx_stack(Side::Client, Side::Server);
            b.handoff(rx, Side::Server);
            b.api(Side::Server);
            b.api(Side::Server);
            b.control(Side::Server, Side::Client);
            b.control(Side::Client, Side::Server);
            (arrivals(1), 2 * s as u64)
        }
        Workload::Stream => {
            // One write per transaction, a window of writes in flight; a pure ACK per
            // `segments_per_ack` segments; the receiver's reads and wake-ups amortised over
            // 64 KiB (it reads what has arrived, up to its buffer). A window of 1 MiB (the
            // default socket buffers) in flight.
            let window = (1usize << 20).div_ceil(s).clamp(1, 64);
            // Writes queue behind unacknowledged data and leave in full segments (TSO or
            // the loopback MTU): a write smaller than a segment is held while data is
            // unacknowledged (RFC 9293 §3.7.4, Nagle) and the next ones join it. So the
            // per-segment costs are per `max_segment` bytes, not per write — charged per
            // write, 16 KiB writes cost 1.24x (flowstack) and 1.35x (kernel) 64 KiB's per
            // byte, where the bench measures 0.95–1.05x and 1.05–1.25x (2026-11-26).
            let max_seg = b.stack.max_segment.max(1) as f64;
            let segs = if window > 1 {
                s as f64 / max_seg
            } else {
                b.segments(s) as f64
            };
            // The receiver's reads and wake-ups per 64 KiB, whatever the write size: a
            // write larger than 64 KiB is read in as many (capped at one per write, 128 KiB
            // writes paid half the wake-ups per byte of 64 KiB ones, and the kernel's copy
            // per byte fitted at 128 KiB predicted 64 KiB writes 14 % slower than 128 KiB
            // ones, where the bench measures them at the same rate within its noise).
            let per_64k = s as f64 / 65536.0;
            let h = b.cal.host.clone();
            let st = b.stack.clone();
            let c_copy = b.arch.copy && b.p.engine.is_none();
            // Sender.
            b.api(Side::Client);
            let a = b.app(Side::Client);
            if c_copy {
                b.on(a, s as f64 * h.copy_per_byte_ns, Cat::Copy);
            }
            // Per 64 KiB moved: the applications' sleeps on a daemon (`daemon-wake`).
            let sleeps = h.offload_stream_waits;
            if b.p.engine.is_some() && !b.remote {
                b.bus(Side::Client, s, true);
                // The daemon's wake-ups of its sleeping applications (as often as they
                // sleep, measured) and the reader's consume command per 64 KiB.
                b.wake_op(per_64k * (sleeps.sender + sleeps.receiver));
                if b.arch.handoff == Handoff::Futex {
                    let e = b.p.engine;
                    b.on(e, per_64k * h.ring_ns, Cat::Api);
                }
                // A sleeping sender ahead of its stack core finds its credit used up and
                // waits for send space: flowstackd wakes it for credit only when it said it
                // waits (`wants_writable`; credit for a reader is published quietly). How
                // often is measured (`host.offload_stream_waits`).
                if b.arch.handoff == Handoff::Futex {
                    b.detach(a, per_64k * sleeps.sender * h.app_wait_ns, Cat::Wakeup);
                }
            }
            let txs = b.tx_stack(Side::Client);
            let again = 1.0 / (1.0 - b.error_rate.clamp(0.0, 0.99));
            let (send_pb, recv_pb) = b.stack_per_byte();
            // Per write: the stack's work per send call (`write_ns`), whatever its size.
            b.on(
                txs,
                (segs * st.send_fixed_ns + s as f64 * send_pb) * again + st.write_ns,
                Cat::Stack,
            );
            let pkts = b.packets(s);
            b.medium(s, pkts);
            let rxs = b.rx_stack(Side::Client, Side::Server);
            if b.remote && b.arch.notify == Notify::InterruptPerPacket && b.p.engine.is_none() {
                b.on(rxs, pkts as f64 * h.interrupt_ns * again, Cat::Interrupt);
            }
            b.on(
                rxs,
                (segs * st.recv_fixed_ns + s as f64 * recv_pb) * again,
                Cat::Stack,
            );
            let acks = segs / st.segments_per_ack.max(1.0);
            b.on(rxs, acks * st.ctrl_send_ns, Cat::Stack);
            b.on(txs, acks * st.ctrl_recv_ns, Cat::Stack);
            let srv = b.app(Side::Server);
            b.who = Side::Server;
            if b.p.engine.is_some() {
                b.bus(Side::Server, s, false);
                if b.arch.handoff == Handoff::Wakeup {
                    b.on(srv, per_64k * h.interrupt_ns, Cat::Interrupt);
                }
            }
            match b.arch.handoff {
                Handoff::Poll => b.on(srv, per_64k * h.poll_turn_ns, Cat::Poll),
                Handoff::Wakeup => b.on(srv, per_64k * h.wakeup_ns, Cat::Wakeup),
                // A reader that finds nothing sleeps until the daemon writes more (it
                // reads whatever has arrived, up to its 64 KiB buffer).
                Handoff::Futex => {
                    b.detach(srv, per_64k * sleeps.receiver * h.app_wait_ns, Cat::Wakeup)
                }
            }
            let api = match b.arch.api {
                Api::Syscall => h.syscall_ns,
                Api::Library => h.lib_call_ns,
                Api::Ring => h.ring_ns,
            };
            b.on(srv, per_64k * api, Cat::Api);
            if c_copy {
                b.on(srv, s as f64 * h.copy_per_byte_ns, Cat::Copy);
            }
            (arrivals(window), s as u64)
        }
        Workload::File => {
            b.message(Side::Client, Side::Server, 100, true);
            if b.arch.copy {
                let f = b.cal.host.file_per_byte_ns * s as f64;
                b.app_work(0.0);
                let srv = Some(b.p.s_app);
                b.on(srv, f, Cat::Copy);
            }
            b.app_work(sc.app_ns);
            b.message(Side::Server, Side::Client, s, true);
            (arrivals(1), s as u64)
        }
    }
}

/// crr on flowstackd whose applications sleep between calls (`daemon-wake`, as
/// `bench crr --peer offload` runs it: both applications on one core, the stack core on
/// another). Which calls sleep is [`CrrWaits`](crate::calib::CrrWaits): those on the
/// client's path (connect, the request reaching the server, the answer, the client's close)
/// each add a wake-up's latency; the server's accept, FIN and close are woken beside the
/// client (their CPU competes for the shared core, off the path). The handshake, the
/// segments and the connection's work all run on the stack core.
fn crr_daemon_wake(b: &mut Builder, s: usize, app_ns: f64) {
    let w = b.cal.host.offload_crr_waits;
    // socket + connect: two ring posts; the stack core runs the handshake on its loopback.
    b.api(Side::Client);
    b.api(Side::Client);
    b.control(Side::Client, Side::Server);
    b.control(Side::Server, Side::Client);
    b.control(Side::Client, Side::Server);
    b.conn_work();
    // The stack core completes connect and the server's pending accept together.
    if w.connect {
        b.wait(Side::Client, true);
    }
    if w.accept {
        b.wait(Side::Server, false);
    }
    b.api(Side::Server);
    // The request; the server's recv may find it not yet carried and sleep.
    b.message(Side::Client, Side::Server, s, w.request);
    b.app_work(app_ns);
    b.message(Side::Server, Side::Client, s, w.answer);
    // The client's close: FIN; the server is woken by it and closes too, beside the
    // client's own wait for its close's completion.
    b.api(Side::Client);
    b.control(Side::Client, Side::Server);
    if w.fin {
        b.wait(Side::Server, false);
    }
    b.api(Side::Server);
    if w.server_close {
        b.wait(Side::Server, false);
    }
    if w.client_close {
        b.wait(Side::Client, true);
    }
    b.observe_here();
    // The server's FIN and the last ACK, after the client's close returned.
    b.control(Side::Server, Side::Client);
    b.control(Side::Client, Side::Server);
}
