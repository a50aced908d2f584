//! The drive loop: one engine, one device, its applications, the wall clock.
//!
//! The engine stays sans-IO; `Host` is the loop around it. Every blocking call polls the
//! engine, and between polls sleeps in the device (`poll(2)` on a TAP or packet socket) until
//! the engine's next deadline, so an idle host does not spin.

use crate::Clock;
use flowstack_api::app::{App, Progress};
use flowstack_link::Device;
use flowstack_stack::{Engine, SocketError, TcpHandle};
use flowstack_wire::{Duration, Instant};
use std::net::SocketAddrV4;

/// Longest single sleep, so that callers' own conditions are re-checked regularly.
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// An engine bound to a device and the wall clock.
pub struct Host<D: Device> {
    /// The engine.
    pub engine: Engine,
    /// The device it runs on.
    pub dev: D,
    clock: Clock,
}

impl<D: Device> Host<D> {
    /// Binds `engine` to `dev`; the engine's clock starts now.
    pub fn new(engine: Engine, dev: D) -> Self {
        Self {
            engine,
            dev,
            clock: Clock::start(),
        }
    }

    /// The current time on the engine's clock.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The clock this host runs on (to convert wall-clock moments to engine time).
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// One engine turn. Returns true if frames moved.
    pub fn turn(&mut self) -> bool {
        let now = self.now();
        self.engine.poll(now, &mut self.dev)
    }

    /// Sleeps until a frame may have arrived or the next deadline, at most `max`.
    pub fn idle(&mut self, max: Duration) {
        self.idle_until(None, max)
    }

    /// [`Host::idle`], also waking at `also` (an application's own deadline).
    pub fn idle_until(&mut self, also: Option<Instant>, max: Duration) {
        let now = self.now();
        let next = [self.engine.poll_at(), self.dev.poll_at(), also]
            .into_iter()
            .flatten()
            .min();
        let wait = match next {
            Some(t) => t.saturating_since(now),
            None => max,
        };
        let wait = wait.min(max).min(MAX_SLEEP);
        if !wait.is_zero() {
            self.dev.wait(wait);
        }
    }

    /// Runs `app` over this host's engine until it is [`Progress::Done`], `stop` says so, or
    /// the link goes down; returns the app's last progress. The loop: one engine turn, one
    /// app turn (both at the same `now`), and a sleep until the next frame or deadline
    /// whenever neither moved.
    pub fn run<A: App<Engine> + ?Sized>(
        &mut self,
        app: &mut A,
        mut stop: impl FnMut() -> bool,
    ) -> Progress {
        loop {
            let moved = self.turn();
            let now = self.now();
            self.engine.set_now(now);
            let p = app.poll(now, &mut self.engine);
            if p == Progress::Done || stop() || self.dev.link_down() {
                // Flush what the last turn queued.
                self.turn();
                return p;
            }
            if !moved && p == Progress::Idle {
                self.idle_until(app.poll_at(), MAX_SLEEP);
            }
        }
    }

    /// Runs the engine until `f` returns `Some`, or fails with `TimedOut` after `timeout`.
    pub fn block<T>(
        &mut self,
        timeout: Duration,
        mut f: impl FnMut(&mut Engine, Instant) -> Option<Result<T, SocketError>>,
    ) -> Result<T, SocketError> {
        let start = std::time::Instant::now();
        loop {
            let moved = self.turn();
            let now = self.now();
            self.engine.set_now(now);
            if let Some(r) = f(&mut self.engine, now) {
                // Flush whatever the call queued before returning.
                self.turn();
                return r;
            }
            if start.elapsed() >= timeout {
                return Err(SocketError::TimedOut);
            }
            if self.dev.link_down() {
                return Err(SocketError::LinkDown);
            }
            if !moved {
                self.idle(timeout.saturating_sub(start.elapsed()));
            }
        }
    }

    /// Connects and waits for the handshake.
    pub fn connect(
        &mut self,
        remote: SocketAddrV4,
        timeout: Duration,
    ) -> Result<TcpHandle, SocketError> {
        let now = self.now();
        self.engine.set_now(now);
        let h = self.engine.tcp_connect(remote)?;
        self.block(timeout, |e, _| {
            if let Some(err) = e.tcp_error(h) {
                return Some(Err(err));
            }
            e.tcp_conn(h).ok()?.is_open().then_some(Ok(h))
        })
        .inspect_err(|_| {
            let now = self.now();
            self.engine.set_now(now);
            let _ = self.engine.tcp_close(h);
        })
    }

    /// Waits for a connection on a listener.
    pub fn accept(
        &mut self,
        listener: TcpHandle,
        timeout: Duration,
    ) -> Result<TcpHandle, SocketError> {
        self.block(timeout, |e, _| match e.tcp_accept(listener) {
            Err(SocketError::WouldBlock) => None,
            r => Some(r),
        })
    }

    /// Sends all of `data`.
    pub fn send_all(
        &mut self,
        h: TcpHandle,
        mut data: &[u8],
        timeout: Duration,
    ) -> Result<(), SocketError> {
        self.block(timeout, |e, _| {
            while !data.is_empty() {
                match e.tcp_send(h, data) {
                    Ok(n) => data = &data[n..],
                    Err(SocketError::WouldBlock) => return None,
                    Err(err) => return Some(Err(err)),
                }
            }
            Some(Ok(()))
        })
    }

    /// Receives at least one byte (or end of stream, `Ok(0)`).
    pub fn recv(
        &mut self,
        h: TcpHandle,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, SocketError> {
        self.block(timeout, |e, _| match e.tcp_recv(h, buf) {
            Err(SocketError::WouldBlock) => None,
            r => Some(r),
        })
    }

    /// Waits until every byte queued on `h` has been acknowledged.
    pub fn drain(&mut self, h: TcpHandle, timeout: Duration) -> Result<(), SocketError> {
        self.block(timeout, |e, _| {
            if let Some(err) = e.tcp_error(h) {
                return Some(Err(err));
            }
            (e.tcp_conn(h).ok()?.send_queue() == 0).then_some(Ok(()))
        })
    }
}
