//! An in-process learning Ethernet switch connecting several devices.
//!
//! Each port learns the source MACs it sees; unicast to a learned MAC goes to that port only,
//! everything else floods to all other ports.

use crate::{Device, DeviceCaps, Instant, TxBatch};
use flowstack_wire::ethernet::Frame;
use flowstack_wire::EthernetAddress;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

#[derive(Debug)]
struct Core {
    queues: Vec<VecDeque<Vec<u8>>>,
    table: HashMap<EthernetAddress, usize>,
    pool: Vec<Vec<u8>>,
    capacity: usize,
    drops: u64,
    caps: DeviceCaps,
}

/// The switch; create ports with [`Switch::port`].
#[derive(Debug, Clone)]
pub struct Switch {
    core: Rc<RefCell<Core>>,
}

/// A port of a [`Switch`], usable as a device.
#[derive(Debug, Clone)]
pub struct SwitchPort {
    core: Rc<RefCell<Core>>,
    index: usize,
}

impl Switch {
    /// A switch whose ports have `caps` and queue at most `capacity` frames each.
    pub fn new(caps: DeviceCaps, capacity: usize) -> Self {
        Self {
            core: Rc::new(RefCell::new(Core {
                queues: Vec::new(),
                table: HashMap::new(),
                pool: Vec::new(),
                capacity,
                drops: 0,
                caps,
            })),
        }
    }
    /// Adds a port.
    pub fn port(&self) -> SwitchPort {
        let mut c = self.core.borrow_mut();
        c.queues.push(VecDeque::new());
        SwitchPort {
            core: self.core.clone(),
            index: c.queues.len() - 1,
        }
    }
    /// Frames dropped because an output queue was full.
    pub fn drops(&self) -> u64 {
        self.core.borrow().drops
    }
}

impl Core {
    fn enqueue(&mut self, port: usize, f: &[u8]) {
        if self.queues[port].len() >= self.capacity {
            self.drops += 1;
            return;
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(f);
        self.queues[port].push_back(buf);
    }
}

impl Device for SwitchPort {
    fn caps(&self) -> DeviceCaps {
        self.core.borrow().caps
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(f) = self.core.borrow_mut().queues[self.index].pop_front() else {
                break;
            };
            sink(&f);
            self.core.borrow_mut().pool.push(f);
            n += 1;
        }
        n
    }

    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let mut c = self.core.borrow_mut();
        let mut n = 0;
        for f in batch.iter() {
            let Ok(frame) = Frame::new_checked(f) else {
                c.drops += 1;
                continue;
            };
            if frame.src().is_unicast() {
                c.table.insert(frame.src(), self.index);
            }
            let dst = frame.dst();
            match c.table.get(&dst).copied() {
                Some(p) if !dst.is_multicast() => {
                    if p != self.index {
                        c.enqueue(p, f);
                    }
                }
                _ => {
                    for p in 0..c.queues.len() {
                        if p != self.index {
                            c.enqueue(p, f);
                        }
                    }
                }
            }
            n += 1;
        }
        n
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        !self.core.borrow().queues[self.index].is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstack_wire::ethernet::{EthernetRepr, HEADER_LEN};
    use flowstack_wire::EtherType;

    fn frame(batch: &mut TxBatch, src: u8, dst: EthernetAddress) {
        let b = batch.push(HEADER_LEN + 10);
        EthernetRepr {
            src: EthernetAddress([2, 0, 0, 0, 0, src]),
            dst,
            ethertype: EtherType::Ipv4,
        }
        .emit(b);
    }

    #[test]
    fn floods_unknown_then_forwards_learned() {
        let sw = Switch::new(DeviceCaps::ETHERNET, 16);
        let mut p = [sw.port(), sw.port(), sw.port()];
        let mut b = TxBatch::new();
        frame(&mut b, 1, EthernetAddress([2, 0, 0, 0, 0, 2]));
        p[0].send_batch(Instant::ZERO, &b);
        // Unknown destination: flooded to 1 and 2.
        assert!(p[1].rx_pending(Instant::ZERO) && p[2].rx_pending(Instant::ZERO));
        p[1].recv_batch(Instant::ZERO, 9, &mut |_| {});
        p[2].recv_batch(Instant::ZERO, 9, &mut |_| {});
        // Port 1 answers port 0's MAC, which was learned: only port 0 receives.
        b.clear();
        frame(&mut b, 2, EthernetAddress([2, 0, 0, 0, 0, 1]));
        p[1].send_batch(Instant::ZERO, &b);
        assert!(p[0].rx_pending(Instant::ZERO));
        assert!(!p[2].rx_pending(Instant::ZERO));
    }
}
