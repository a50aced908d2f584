//! The smoltcp reference peer for `stream`: two smoltcp interfaces over an in-process link
//! (frames pooled, as flowstack's pipe does), one sending, one receiving.

use flowstack_apps::workload::ClientResult;
use flowstack_runtime::Clock;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, Ipv4Address};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

#[derive(Default)]
struct Shared {
    queues: [VecDeque<Vec<u8>>; 2],
    pool: Vec<Vec<u8>>,
}

struct Wire {
    shared: Rc<RefCell<Shared>>,
    side: usize,
}

struct Rx {
    frame: Vec<u8>,
    shared: Rc<RefCell<Shared>>,
}

struct Tx {
    shared: Rc<RefCell<Shared>>,
    to: usize,
}

impl RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let r = f(&self.frame);
        self.shared.borrow_mut().pool.push(self.frame);
        r
    }
}

impl TxToken for Tx {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = self.shared.borrow_mut().pool.pop().unwrap_or_default();
        buf.clear();
        buf.resize(len, 0);
        let r = f(&mut buf);
        self.shared.borrow_mut().queues[self.to].push_back(buf);
        r
    }
}

impl Device for Wire {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx;

    fn receive(&mut self, _t: SInstant) -> Option<(Rx, Tx)> {
        let frame = self.shared.borrow_mut().queues[self.side].pop_front()?;
        Some((
            Rx {
                frame,
                shared: self.shared.clone(),
            },
            Tx {
                shared: self.shared.clone(),
                to: 1 - self.side,
            },
        ))
    }

    fn transmit(&mut self, _t: SInstant) -> Option<Tx> {
        Some(Tx {
            shared: self.shared.clone(),
            to: 1 - self.side,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = 1514;
        c
    }
}

fn iface(dev: &mut Wire, last: u8, now: SInstant) -> Interface {
    let hw = HardwareAddress::Ethernet(EthernetAddress([2, 0, 0, 0, 0, last]));
    let mut cfg = Config::new(hw);
    cfg.random_seed = last as u64;
    let mut i = Interface::new(cfg, dev, now);
    i.update_ip_addrs(|a| {
        let _ = a.push(IpCidr::new(IpAddress::v4(10, 0, 0, last), 24));
    });
    i
}

/// Runs a one-way stream for `duration` with `buffer`-byte socket buffers.
pub fn run(duration: Duration, msg: usize, buffer: usize) -> Result<ClientResult, String> {
    let shared = Rc::new(RefCell::new(Shared::default()));
    let mut da = Wire {
        shared: shared.clone(),
        side: 0,
    };
    let mut db = Wire { shared, side: 1 };
    let clock = Clock::start();
    let now = || SInstant::from_micros(clock.now().as_micros() as i64);
    let mut ia = iface(&mut da, 1, now());
    let mut ib = iface(&mut db, 2, now());
    let sock = || {
        tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; buffer]),
            tcp::SocketBuffer::new(vec![0; buffer]),
        )
    };
    let mut sa = SocketSet::new(vec![]);
    let mut sb = SocketSet::new(vec![]);
    let ca = sa.add(sock());
    let cb = sb.add(sock());
    sb.get_mut::<tcp::Socket>(cb)
        .listen(5001)
        .map_err(|e| format!("smoltcp listen: {e}"))?;
    sa.get_mut::<tcp::Socket>(ca)
        .connect(ia.context(), (Ipv4Address::new(10, 0, 0, 2), 5001), 49152)
        .map_err(|e| format!("smoltcp connect: {e}"))?;
    let data = vec![0x17u8; msg];
    let mut received = 0u64;
    let mut intervals = vec![];
    let start = clock.now();
    let mut last_tick = start;
    let mut interval_bytes = 0u64;
    while clock.now().saturating_since(start) < duration {
        let t = now();
        ia.poll(t, &mut da, &mut sa);
        ib.poll(t, &mut db, &mut sb);
        let c = sa.get_mut::<tcp::Socket>(ca);
        while c.can_send() {
            match c.send_slice(&data) {
                Ok(0) | Err(_) => break,
                Ok(n) => interval_bytes += n as u64,
            }
        }
        let s = sb.get_mut::<tcp::Socket>(cb);
        while s.can_recv() {
            match s.recv(|b| (b.len(), b.len())) {
                Ok(0) | Err(_) => break,
                Ok(n) => received += n as u64,
            }
        }
        let tick = clock.now();
        if tick.saturating_since(last_tick) >= Duration::from_secs(1) {
            intervals.push(interval_bytes);
            interval_bytes = 0;
            last_tick = tick;
        }
    }
    Ok(ClientResult {
        bytes: received,
        secs: clock.now().saturating_since(start).as_secs_f64(),
        intervals,
        ..Default::default()
    })
}
