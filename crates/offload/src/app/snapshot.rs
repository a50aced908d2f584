//! The `flowstack stats` snapshot: ss-like socket rows and counters of the daemon and its engines.

use super::*;

fn ss_state(s: flowstack_stack::State) -> &'static str {
    use flowstack_stack::State as S;
    match s {
        S::SynSent => "SYN-SENT",
        S::SynReceived => "SYN-RECV",
        S::Established => "ESTAB",
        S::FinWait1 => "FIN-WAIT-1",
        S::FinWait2 => "FIN-WAIT-2",
        S::CloseWait => "CLOSE-WAIT",
        S::Closing => "CLOSING",
        S::LastAck => "LAST-ACK",
        S::TimeWait => "TIME-WAIT",
        S::Closed => "CLOSED",
    }
}

/// Linux's `TCP_*` state number (`tcpi_state`).
fn linux_state(s: flowstack_stack::State) -> u8 {
    use flowstack_stack::State as S;
    match s {
        S::Established => 1,
        S::SynSent => 2,
        S::SynReceived => 3,
        S::FinWait1 => 4,
        S::FinWait2 => 5,
        S::TimeWait => 6,
        S::Closed => 7,
        S::CloseWait => 8,
        S::LastAck => 9,
        S::Closing => 11,
    }
}

/// A duration in whole µs, rounded up (a measured loopback RTT below 1 µs reads 1, not
/// "unmeasured"), saturating.
fn micros(d: std::time::Duration) -> u32 {
    d.as_nanos().div_ceil(1000).min(u32::MAX as u128) as u32
}

/// A connection's TCP_INFO in Linux's units, for `getsockopt(TCP_INFO)` (`Command::TcpInfo`)
/// and `flowstack stats` alike: times in µs, the congestion window, slow-start threshold
/// and data in flight in segments of the send MSS (rounded up, as data in flight is whole
/// segments), the threshold [`INFINITE_SSTHRESH`] before the first loss.
///
/// [`INFINITE_SSTHRESH`]: flowstack_api::tcpinfo::INFINITE_SSTHRESH
pub(super) fn linux_tcp_info(i: &flowstack_stack::TcpInfo) -> flowstack_api::tcpinfo::TcpInfo {
    use flowstack_api::tcpinfo::INFINITE_SSTHRESH;
    let mss = i.snd_mss.max(1);
    let segs = |bytes: usize| bytes.div_ceil(mss).min(u32::MAX as usize) as u32;
    flowstack_api::tcpinfo::TcpInfo {
        state: linux_state(i.state),
        retransmits: i.backoff.min(u8::MAX as u32) as u8,
        snd_mss: i.snd_mss.min(u16::MAX as usize) as u16,
        pmtu: i.pmtu.min(u16::MAX as usize) as u16,
        // At least 1 µs once measured, as Linux (`tcp_rtt_estimator`: srtt is never 0).
        rtt: i.srtt.map_or(0, |d| micros(d).max(1)),
        rttvar: micros(i.rttvar),
        rto: micros(i.rto),
        unacked: segs(i.unacked),
        snd_cwnd: segs(i.cwnd),
        snd_ssthresh: match i.ssthresh {
            usize::MAX => INFINITE_SSTHRESH,
            b => segs(b).min(INFINITE_SSTHRESH),
        },
        total_retrans: i.stats.retransmits.min(u32::MAX as u64) as u32,
        bytes_acked: i.stats.bytes_acked,
        bytes_received: i.stats.bytes_received,
    }
}

/// One engine's part of `flowstack stats` (the control part merges them, [`crate::stats::Stats::merge`]).
pub(crate) fn snapshot(sh: &Shared, apps: &[App]) -> crate::stats::Stats {
    use crate::stats::{AppRow, SockRow, Stats, SCHEMA};
    let pid_of = |app: u64| apps.iter().find(|a| a.id == app).map(|a| a.pid);
    let mut sockets: Vec<SockRow> = sh
        .socks
        .iter()
        .map(|(&id, g)| {
            let mut pids: Vec<u32> = g.owners.iter().filter_map(|o| pid_of(o.0)).collect();
            pids.sort_unstable();
            pids.dedup();
            let mut row = SockRow {
                id,
                proto: "tcp".into(),
                state: "UNCONN".into(),
                local: "*:*".into(),
                peer: "*:*".into(),
                send_q: 0,
                recv_q: 0,
                rtt_us: None,
                cwnd: None,
                pids,
                path: "flowstack".into(),
                placeholder: g.ph.is_some(),
                engine: sh.me,
            };
            match &g.kind {
                Kind::Fresh {
                    ty: SockType::Dgram,
                    ..
                } => row.proto = "udp".into(),
                Kind::Udp(d) => {
                    row.proto = "udp".into();
                    row.local = d.local.to_string();
                    if let Some(p) = d.peer {
                        row.state = "ESTAB".into();
                        row.peer = p.to_string();
                    }
                    row.recv_q = d.outstanding;
                }
                Kind::Fresh { bound, .. } => {
                    if let Some(b) = bound {
                        row.local = b.to_string();
                    }
                }
                Kind::Listener { port, .. } => {
                    row.state = "LISTEN".into();
                    row.local = format!("*:{port}");
                }
                Kind::Failed(_) => row.state = "FAILED".into(),
                Kind::Conn(c) => {
                    if let Ok(k) = sh.lo.engines[c.eng].tcp_conn(c.h) {
                        let t = k.tuple();
                        row.state = if g.closing {
                            "CLOSING".into()
                        } else {
                            ss_state(k.state()).into()
                        };
                        row.local = SocketAddrV4::new(t.local_ip.into(), t.local_port).to_string();
                        row.peer = SocketAddrV4::new(t.remote_ip.into(), t.remote_port).to_string();
                        row.send_q = (c.queued_here() + k.send_queue()) as u64;
                        row.recv_q = c.outstanding + k.recv_queue() as u64;
                        let i = k.info();
                        let li = linux_tcp_info(&i);
                        row.rtt_us = i.srtt.map(|_| li.rtt as u64);
                        row.cwnd = Some(i.cwnd as u64);
                    } else {
                        row.state = "CLOSED".into();
                    }
                }
            }
            row
        })
        .collect();
    sockets.sort_by_key(|r| r.id);
    let apps_rows = apps
        .iter()
        .map(|a| AppRow {
            id: a.id,
            pid: a.pid,
            uid: a.uid,
            sockets: a.handles.len(),
            commands: a.stats.commands,
            bad_records: a.stats.bad_records,
            engine: sh.me,
            memory: a.memory,
        })
        .collect();
    let mut counters = std::collections::BTreeMap::new();
    let mut total = flowstack_api::counters::Counters::default();
    for e in &sh.lo.engines {
        total.merge(&e.counters());
    }
    for &c in flowstack_api::counters::Counter::ALL {
        counters.insert(c.name().to_string(), total.get(c));
    }
    let d = &sh.counters;
    let steer = sh.lo.steer_counters();
    for (k, v) in [
        ("FlowstackdApps", apps.len() as u64),
        ("FlowstackdAppsRegistered", d.apps_registered),
        ("FlowstackdAppsRefused", d.apps_refused),
        ("FlowstackdBadRecords", d.bad_records),
        ("FlowstackdLimitsHit", d.limits_hit),
        ("FlowstackdLastCloses", d.last_closes),
        ("FlowstackdPlaceholderBatches", d.pool_batches),
        ("FlowstackdPlaceholdersPooled", d.pool_pairs),
        ("FlowstackdPlaceholdersRecycled", d.pool_recycled),
        ("FlowstackdPlaceholderRepools", d.pool_repools),
        (
            "FlowstackdPlaceholdersWaiting",
            apps.iter().map(|a| a.pool_len() as u64).sum(),
        ),
        (
            "FlowstackdPlaceholdersKept",
            apps.iter().map(|a| a.recycled_len() as u64).sum(),
        ),
        ("FlowstackdSendFileBytes", d.sendfile_bytes),
        ("FlowstackdSendFileCalls", d.sendfile_calls),
        ("FlowstackdCrossEngineAttach", d.cross_engine_attach),
        ("FlowstackdHoldsMoved", d.holds_moved),
        ("FlowstackdHoldsReleased", d.holds_released),
        ("FlowstackdPipesFused", d.pipes_fused),
        ("FlowstackdPipesRefused", d.pipes_refused),
        ("FlowstackdPipesOpened", d.pipes_opened),
        ("FlowstackdPipeKicks", d.pipe_kicks),
        ("FlowstackdAppMemLimited", d.app_mem_limited),
        ("FlowstackdUdpPeerFiltered", d.udp_peer_filtered),
        ("FlowstackdServiceSweeps", d.sweeps),
        ("FlowstackdSleeps", d.sleeps),
        ("FlowstackdDoorbellWakes", d.bell_wakes),
        (
            "FlowstackdAppWakes",
            d.app_wakes + apps.iter().map(|a| a.wake.signals).sum::<u64>(),
        ),
        ("FlowstackdLooseHangups", d.loose_hangups),
        ("FlowstackdTurns", d.turns),
        ("FlowstackdIdleTurns", d.idle_turns),
        ("FlowstackdServiceUnmarked", d.sweep_found),
        ("FlowstackdTxZcBytes", d.tx_zc_bytes),
        ("FlowstackdRxDirectBytes", d.rx_direct_bytes),
        ("FlowstackdTxRehomedBytes", d.tx_rehomed_bytes),
        ("FlowstackdLinkSteered", steer.forwarded),
        (
            "FlowstackdLinkSteerDrops",
            steer.ring_full + steer.too_large,
        ),
        ("FlowstackdMeshFrames", sh.lo.mesh_counters().1),
        ("FlowstackdMeshDrops", sh.lo.mesh_counters().0),
        ("FlowstackdFallbackNotCarried", d.fallbacks[1]),
        ("FlowstackdFallbackUnsupported", d.fallbacks[2]),
        ("FlowstackdFallbackNoDaemon", d.fallbacks[3]),
        ("FlowstackdFallbackIpv6", d.fallbacks[4]),
        ("FlowstackdFallbackOther", d.fallbacks[5]),
    ]
    .into_iter()
    .chain(table_gauges(sh, apps))
    {
        counters.insert(k.to_string(), v);
    }
    Stats {
        schema: SCHEMA,
        sockets,
        apps: apps_rows,
        counters,
    }
}

/// The sizes of the daemon's per-socket tables, as gauges (`FlowstackdTable…`): what a
/// daemon at rest returns to (tests/churn.rs). The port table is daemon-wide, so only
/// engine 0 reports it (the parts are summed).
fn table_gauges(sh: &Shared, apps: &[App]) -> [(&'static str, u64); 6] {
    let e = &sh.lo.engines;
    [
        ("FlowstackdTableSockets", sh.socks.len() as u64),
        ("FlowstackdTableIdents", sh.by_ident.len() as u64),
        (
            "FlowstackdTableHandles",
            apps.iter().map(|a| a.handles.len() as u64).sum(),
        ),
        (
            "FlowstackdTablePorts",
            if sh.me == 0 {
                sh.ports.entries() as u64
            } else {
                0
            },
        ),
        (
            "FlowstackdTcpConnections",
            e.iter().map(|e| e.tcp_connections() as u64).sum(),
        ),
        (
            "FlowstackdTcpAccountedBytes",
            e.iter().map(|e| e.tcp_accounted_bytes() as u64).sum(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::linux_tcp_info;
    use flowstack_api::tcpinfo::INFINITE_SSTHRESH;
    use flowstack_stack::{ConnStats, State, TcpInfo};
    use std::time::Duration;

    fn info() -> TcpInfo {
        TcpInfo {
            state: State::Established,
            srtt: Some(Duration::from_nanos(250_400)),
            rttvar: Duration::from_micros(80),
            rto: Duration::from_millis(200),
            snd_mss: 1460,
            pmtu: 1500,
            mtu_search: None,
            cwnd: 14_600,
            ssthresh: usize::MAX,
            snd_wnd: 65_535,
            unacked: 1461,
            send_queue: 4000,
            recv_queue: 0,
            backoff: 2,
            options: (true, true, 7, 7),
            soft_error: None,
            stats: ConnStats {
                retransmits: 5,
                bytes_acked: 123_456,
                bytes_received: 789,
                ..ConnStats::default()
            },
        }
    }

    #[test]
    fn tcp_info_in_linuxs_units() {
        let l = linux_tcp_info(&info());
        assert_eq!(l.state, 1);
        assert_eq!(
            (l.rtt, l.rttvar, l.rto),
            (251, 80, 200_000),
            "µs, rounded up"
        );
        assert_eq!((l.snd_mss, l.pmtu), (1460, 1500));
        assert_eq!(l.snd_cwnd, 10, "14600 bytes of 1460");
        assert_eq!(l.unacked, 2, "1461 bytes in flight are two segments");
        assert_eq!(l.snd_ssthresh, INFINITE_SSTHRESH, "before the first loss");
        assert_eq!((l.retransmits, l.total_retrans), (2, 5));
        assert_eq!((l.bytes_acked, l.bytes_received), (123_456, 789));
    }

    #[test]
    fn after_a_loss_and_before_a_sample() {
        let mut i = info();
        i.ssthresh = 7300;
        i.srtt = None;
        i.state = State::CloseWait;
        let l = linux_tcp_info(&i);
        assert_eq!(l.snd_ssthresh, 5);
        assert_eq!(l.rtt, 0, "not measured");
        assert_eq!(l.state, 8);
        // A sub-µs loopback sample still reads as measured, as Linux (srtt ≥ 1).
        i.srtt = Some(Duration::ZERO);
        assert_eq!(linux_tcp_info(&i).rtt, 1);
    }
}
