//! Negotiated options — RFC 7323 timestamps and window scaling, RFC 2018 SACK — and the
//! options every segment carries. The negotiation itself is in `handshake`.

use super::Connection;
use crate::config::TcpConfig;
use crate::MAX_WSCALE;
use flowstack_wire::tcp::TcpRepr;
use flowstack_wire::{Instant, SeqNum};

/// What the handshake agreed on.
pub(crate) struct Options {
    /// Timestamps in use (RFC 7323 §3).
    pub(crate) ts: bool,
    /// TS.Recent: the timestamp to echo (RFC 7323 §4.3).
    pub(crate) ts_recent: u32,
    /// Per-connection offset of our timestamp clock (RFC 7323 §5.4).
    pub(crate) ts_offset: u32,
    /// SACK in use (RFC 2018).
    pub(crate) sack: bool,
    /// Shift of the peer's window field (RFC 7323 §2).
    pub(crate) snd_wscale: u8,
    /// Shift of the window field we send.
    pub(crate) rcv_wscale: u8,
    /// Options of the SYN we answer (what the SYN-ACK may offer back).
    pub(crate) peer_syn_ws: Option<u8>,
}

/// The smallest window-scale shift that lets `buf` bytes be advertised.
pub(crate) fn wscale_for(buf: usize) -> u8 {
    let mut s = 0;
    while s < MAX_WSCALE && (buf >> s) > 65535 {
        s += 1;
    }
    s
}

impl Options {
    pub(crate) fn new(cfg: &TcpConfig, iss: SeqNum) -> Self {
        Self {
            ts: false,
            ts_recent: 0,
            ts_offset: iss.0.rotate_left(13),
            sack: false,
            snd_wscale: 0,
            rcv_wscale: if cfg.window_scaling {
                wscale_for(cfg.recv_buffer)
            } else {
                0
            },
            peer_syn_ws: None,
        }
    }

    /// Our timestamp clock: milliseconds plus a per-connection offset (RFC 7323 §5.4).
    pub(crate) fn ts_now(&self, now: Instant) -> u32 {
        (now.as_millis() as u32).wrapping_add(self.ts_offset)
    }

    /// RFC 7323 §5.3 PAWS: whether the timestamp `val` is older than TS.Recent.
    pub(crate) fn ts_is_old(&self, val: u32) -> bool {
        (val.wrapping_sub(self.ts_recent) as i32) < 0
    }
}

impl Connection {
    /// Adds the options of a segment other than SYN: timestamps, and SACK blocks while
    /// out-of-order data is held or a duplicate is to be reported (D-SACK).
    pub(super) fn with_options(&self, now: Instant, r: &mut TcpRepr) {
        if self.opt.ts {
            r.options.timestamp = Some((self.opt.ts_now(now), self.opt.ts_recent));
        }
        if self.opt.sack && self.rcv.has_sack_info() {
            self.rcv.sack_option(&mut r.options);
        }
    }
}
