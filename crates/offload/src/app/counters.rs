//! Daemon-wide counters (`flowstack stats`), one set per engine thread, merged for a query.

use flowstack_api::record::REPORT_KINDS;

/// Daemon-wide counters (`flowstack stats`).
#[derive(Debug, Default, Clone)]
pub struct DaemonCounters {
    /// Applications registered since start.
    pub apps_registered: u64,
    /// Registrations refused (too many applications, bad credentials).
    pub apps_refused: u64,
    /// Command records rejected, all applications.
    pub bad_records: u64,
    /// Calls refused by a limit (sockets, memory, send-buffer overrun).
    pub limits_hit: u64,
    /// Sockets closed because their last placeholder copy was closed.
    pub last_closes: u64,
    /// Fallbacks to the kernel reported by shims, by [`flowstack_api::record::ReportKind`]
    /// code (index 0 unused).
    pub fallbacks: [u64; REPORT_KINDS as usize + 1],
    /// Bytes queued from applications' files by `TcpSendFile` (never through their memory).
    pub sendfile_bytes: u64,
    /// `TcpSendFile` calls that queued at least one byte.
    pub sendfile_calls: u64,
    /// Attaches refused because the socket lives on another engine (`EINVAL`).
    pub cross_engine_attach: u64,
    /// Applications that went over `--max-app-memory` (their sends stalled), and sockets
    /// refused because of it (`FlowstackdAppMemLimited`).
    pub app_mem_limited: u64,
    /// Datagrams to a connected UDP socket from another source than its peer, dropped
    /// (`FlowstackdUdpPeerFiltered`).
    pub udp_peer_filtered: u64,
    /// Sweeping turns (`service`: every [`SWEEP_EVERY`](super::SWEEP_EVERY)th turn and the
    /// last one before idling look at every socket).
    pub sweeps: u64,
    /// Sleeps entered: announced to the applications and a `poll` made
    /// (`FlowstackdSleeps`; under load most return at once).
    pub sleeps: u64,
    /// Sleeps the doorbell ended: an application rang it (`FlowstackdDoorbellWakes`).
    pub bell_wakes: u64,
    /// Watched placeholder descriptors reported hung up that no socket, pool or kept pair
    /// holds (`FlowstackdLooseHangups`; expected 0).
    pub loose_hangups: u64,
    /// Engine-loop turns, and those that found nothing to do (`FlowstackdTurns`,
    /// `FlowstackdIdleTurns`).
    pub turns: u64,
    /// See `turns`.
    pub idle_turns: u64,
    /// Sockets a sweep found with something to do that no mark had named: a missed mark,
    /// served late rather than lost (`FlowstackdServiceUnmarked`; 0 when every change marks
    /// its socket).
    pub sweep_found: u64,
    /// Bytes of `TcpSend`s queued straight from transmit areas, without a copy (`txzc`).
    pub tx_zc_bytes: u64,
    /// Bytes of such sends copied back out of a transmit area under pressure (`txzc`).
    pub tx_rehomed_bytes: u64,
    /// Received bytes written straight from a frame into an application's area, not
    /// through the connection's receive buffer (`rxdirect`; `FlowstackdRxDirectBytes`).
    pub rx_direct_bytes: u64,
    /// `Attach{Pool}` batches taken (`FlowstackdPlaceholderBatches`).
    pub pool_batches: u64,
    /// Placeholder pairs in them (`FlowstackdPlaceholdersPooled`).
    pub pool_pairs: u64,
    /// Placeholder pairs kept by `Forget { recycle }` for reuse (`FlowstackdPlaceholdersRecycled`).
    pub pool_recycled: u64,
    /// Wake-up channel writes of applications that left (`FlowstackdAppWakes` adds the live
    /// ones').
    pub app_wakes: u64,
    /// `Attach{Repool}` records taken: recycled pairs moved back to a pool, a batch each
    /// (`FlowstackdPlaceholderRepools`).
    pub pool_repools: u64,
    /// Sockets shared by processes that changed holder by `Hold` (`FlowstackdHoldsMoved`).
    pub holds_moved: u64,
    /// Holders that gave a socket up, before a fork (`FlowstackdHoldsReleased`).
    pub holds_released: u64,
    /// Loopback connections fused: their bytes go app to app through a pipe
    /// (`fuse`; `FlowstackdPipesFused`).
    pub pipes_fused: u64,
    /// Connections that could not be fused when asked (no pipe memory, the descriptor not
    /// sent; `FlowstackdPipesRefused`).
    pub pipes_refused: u64,
    /// Pipe directions opened to their reader (`FlowstackdPipesOpened`).
    pub pipes_opened: u64,
    /// Wake-ups asked through a pipe (`FlowstackdPipeKicks`).
    pub pipe_kicks: u64,
}

impl DaemonCounters {
    /// Adds another engine's counters.
    pub fn merge(&mut self, o: &DaemonCounters) {
        self.apps_registered += o.apps_registered;
        self.apps_refused += o.apps_refused;
        self.bad_records += o.bad_records;
        self.limits_hit += o.limits_hit;
        self.last_closes += o.last_closes;
        for (a, b) in self.fallbacks.iter_mut().zip(o.fallbacks.iter()) {
            *a += b;
        }
        self.sendfile_bytes += o.sendfile_bytes;
        self.sendfile_calls += o.sendfile_calls;
        self.cross_engine_attach += o.cross_engine_attach;
        self.app_mem_limited += o.app_mem_limited;
        self.udp_peer_filtered += o.udp_peer_filtered;
        self.sweeps += o.sweeps;
        self.sleeps += o.sleeps;
        self.bell_wakes += o.bell_wakes;
        self.loose_hangups += o.loose_hangups;
        self.turns += o.turns;
        self.idle_turns += o.idle_turns;
        self.sweep_found += o.sweep_found;
        self.tx_zc_bytes += o.tx_zc_bytes;
        self.tx_rehomed_bytes += o.tx_rehomed_bytes;
        self.rx_direct_bytes += o.rx_direct_bytes;
        self.pool_batches += o.pool_batches;
        self.pool_pairs += o.pool_pairs;
        self.pool_recycled += o.pool_recycled;
        self.pool_repools += o.pool_repools;
        self.app_wakes += o.app_wakes;
        self.holds_moved += o.holds_moved;
        self.holds_released += o.holds_released;
        self.pipes_fused += o.pipes_fused;
        self.pipes_refused += o.pipes_refused;
        self.pipes_opened += o.pipes_opened;
        self.pipe_kicks += o.pipe_kicks;
    }
}
