//! ICMP echo from a [`Host`], as ping(8) does it: one request per interval, each waited for
//! up to a timeout, with the round-trip times kept for the summary.
//!
//! ICMP echo is an engine call, not a socket call, so this runs on the host's engine rather
//! than as an [`App`](flowstack_api::App) over `Sockets`.

use crate::Host;
use flowstack_link::Device;
use flowstack_stack::SocketError;
use flowstack_wire::{Duration, Ipv4Address};

/// What to ping and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingSpec {
    /// Who to ping.
    pub dst: Ipv4Address,
    /// Requests to send.
    pub count: u16,
    /// Time between requests.
    pub interval: Duration,
    /// How long to wait for each reply.
    pub timeout: Duration,
    /// Payload bytes (at least 8: the send time is carried in the first 8).
    pub size: usize,
    /// ICMP identifier of this pinger.
    pub ident: u16,
}

/// One request's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PingEvent {
    /// The reply came.
    Reply {
        /// Sequence number.
        seq: u16,
        /// Who answered.
        from: Ipv4Address,
        /// ICMP bytes of the reply (payload and the 8-byte header).
        bytes: usize,
        /// TTL of the reply.
        ttl: u8,
        /// Round-trip time.
        rtt: Duration,
    },
    /// No reply within the timeout.
    Timeout {
        /// Sequence number.
        seq: u16,
    },
}

/// The run's totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PingSummary {
    /// Requests sent.
    pub sent: u16,
    /// Round-trip times of the replies, in order.
    pub rtts: Vec<Duration>,
}

impl PingSummary {
    /// Replies received.
    pub fn received(&self) -> usize {
        self.rtts.len()
    }

    /// Percent of requests unanswered.
    pub fn loss_percent(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * (self.sent as f64 - self.received() as f64) / self.sent as f64
        }
    }

    /// min/avg/max/mdev of the round-trip times in milliseconds, if any reply came.
    pub fn rtt_stats_ms(&self) -> Option<[f64; 4]> {
        if self.rtts.is_empty() {
            return None;
        }
        let ms: Vec<f64> = self.rtts.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let n = ms.len() as f64;
        let min = ms.iter().cloned().fold(f64::MAX, f64::min);
        let max = ms.iter().cloned().fold(0.0, f64::max);
        let avg = ms.iter().sum::<f64>() / n;
        let mdev = (ms.iter().map(|r| (r - avg).powi(2)).sum::<f64>() / n).sqrt();
        Some([min, avg, max, mdev])
    }
}

/// Pings `spec.dst` from `host`, reporting each request's fate to `on` as it is known;
/// stops early when `stop` says so. Fails only if a request cannot be sent.
pub fn ping<D: Device>(
    host: &mut Host<D>,
    spec: &PingSpec,
    stop: impl Fn() -> bool,
    mut on: impl FnMut(&PingEvent),
) -> Result<PingSummary, SocketError> {
    let mut summary = PingSummary::default();
    let mut payload = vec![0u8; spec.size.max(8)];
    for (i, b) in payload.iter_mut().enumerate().skip(8) {
        *b = i as u8;
    }
    for seq in 1..=spec.count {
        if stop() {
            break;
        }
        let t0 = host.now();
        payload[..8].copy_from_slice(&t0.as_nanos().to_be_bytes());
        host.engine.ping_send(spec.dst, spec.ident, seq, &payload)?;
        summary.sent += 1;
        let reply = host.block(spec.timeout, |e, _| {
            while let Some(r) = e.ping_recv() {
                if r.ident == spec.ident && r.seq_no == seq && r.from == spec.dst {
                    return Some(Ok(r));
                }
            }
            None
        });
        match reply {
            Ok(r) => {
                let rtt = r.at.saturating_since(t0);
                summary.rtts.push(rtt);
                on(&PingEvent::Reply {
                    seq,
                    from: r.from,
                    bytes: r.len + 8,
                    ttl: r.ttl,
                    rtt,
                });
            }
            Err(_) => on(&PingEvent::Timeout { seq }),
        }
        if seq < spec.count {
            let until = t0 + spec.interval;
            let _ = host.block(until.saturating_since(host.now()), |_, now| {
                (now >= until || stop()).then_some(Ok(()))
            });
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_reads_like_pings() {
        let s = PingSummary {
            sent: 4,
            rtts: vec![Duration::from_millis(1), Duration::from_millis(3)],
        };
        assert_eq!(s.received(), 2);
        assert_eq!(s.loss_percent(), 50.0);
        let [min, avg, max, mdev] = s.rtt_stats_ms().unwrap();
        assert_eq!((min, avg, max, mdev), (1.0, 2.0, 3.0, 1.0));
        assert_eq!(PingSummary::default().rtt_stats_ms(), None);
        assert_eq!(PingSummary::default().loss_percent(), 0.0);
    }
}
