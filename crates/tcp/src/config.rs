//! Per-socket TCP configuration: every limit and timer is named here and can be changed.

use crate::cc::CcAlgorithm;
use flowstack_wire::Duration;

/// TCP settings for one connection (listeners pass theirs to accepted connections).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TcpConfig {
    /// Send buffer size in bytes.
    pub send_buffer: usize,
    /// Receive buffer size in bytes (the largest window advertised).
    pub recv_buffer: usize,
    /// MSS we announce (clamped to what the link carries).
    pub mss: u16,
    /// Disable Nagle's algorithm (TCP_NODELAY).
    pub nodelay: bool,
    /// Delay ACKs (RFC 1122 §4.2.3.2); off = ACK every segment.
    pub delayed_ack: bool,
    /// Delayed-ACK timer.
    pub delayed_ack_timeout: Duration,
    /// Segments acknowledged immediately at the start of a connection (quick-ACK mode).
    pub quickack_segments: u32,
    /// Congestion control algorithm.
    pub cc: CcAlgorithm,
    /// Initial retransmission timeout (RFC 6298 §2.1: 1 s).
    pub rto_initial: Duration,
    /// Lower bound on the RTO (RFC 6298 says 1 s; Linux uses 200 ms).
    pub rto_min: Duration,
    /// Upper bound on the RTO (RFC 6298 allows ≥ 60 s).
    pub rto_max: Duration,
    /// Consecutive retransmission timeouts of one segment before the connection is aborted
    /// with "timed out" (Linux tcp_retries2 = 15).
    pub max_retries: u32,
    /// SYN (or SYN-ACK) retransmissions before giving up (Linux tcp_syn_retries = 6).
    pub syn_retries: u32,
    /// TIME_WAIT duration (2·MSL).
    pub time_wait: Duration,
    /// Idle limit in FIN_WAIT_2 (Linux tcp_fin_timeout).
    pub fin_wait2_timeout: Duration,
    /// Idle limit in CLOSE_WAIT when the application never closes.
    pub close_wait_timeout: Duration,
    /// Keepalive: idle time before the first probe, interval, probes; `None` = off.
    pub keepalive: Option<Keepalive>,
    /// Offer window scaling (RFC 7323).
    pub window_scaling: bool,
    /// Offer timestamps (RFC 7323).
    pub timestamps: bool,
    /// Offer SACK (RFC 2018).
    pub sack: bool,
    /// Most challenge ACKs per second per connection (RFC 5961 §7).
    pub challenge_ack_limit: u32,
    /// Most out-of-order ranges held for reassembly; beyond this, new ranges are dropped.
    pub max_ofo_ranges: usize,
    /// Largest segment handed to the device when it segments itself (TSO); MSS when not.
    pub max_tso_segment: usize,
    /// Longest time a peer may keep its window closed while we have data to send and it
    /// keeps answering our probes; then the connection is aborted (as Linux bounds it with
    /// TCP_USER_TIMEOUT). `None` = unbounded.
    pub zero_window_timeout: Option<Duration>,
    /// User timeout (RFC 5482, Linux TCP_USER_TIMEOUT): how long sent data may stay
    /// unacknowledged before the connection is aborted; `None` = the retransmission limit
    /// decides.
    pub user_timeout: Option<Duration>,
    /// Black-hole detection (RFC 4821 §7.7, Linux `tcp_mtu_probing=1`): lower the MSS after
    /// repeated timeouts of full-sized segments.
    pub mtu_probing: bool,
    /// RFC 4821 packetization-layer path MTU discovery: probing for a larger MSS with
    /// single larger segments (Linux `tcp_mtu_probing`: 1 probes after a black hole, 2
    /// always).
    pub plpmtud: Plpmtud,
    /// How long a finished search holds before it starts again from the largest size the
    /// peer and our interface allow, so a path that grew is found (Linux
    /// `tcp_probe_interval` = 600 s).
    pub plpmtud_interval: Duration,
    /// How long a path MTU lowered by ICMP "fragmentation needed" holds before the MSS is
    /// raised back to what the peer and our interface allow (RFC 1191 §6.3; Linux
    /// `ip_rt_mtu_expires` = 600 s). `None` = never raised.
    pub pmtu_expires: Option<Duration>,
    /// How losses are detected with SACK: RACK-TLP (RFC 8985, time-based, with tail loss
    /// probes) or duplicate-ACK counting (RFC 6675 / RFC 5681).
    pub loss_detection: LossDetection,
}

/// Loss detection algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossDetection {
    /// RFC 8985 RACK-TLP (used when SACK is negotiated; duplicate ACKs otherwise).
    Rack,
    /// RFC 6675 SACK scoreboard / RFC 5681 duplicate ACKs, with RFC 5827 early retransmit.
    DupAck,
}

/// When RFC 4821 probing searches for a larger MSS (see [`TcpConfig::plpmtud`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plpmtud {
    /// Never: an MSS lowered by black-hole detection stays low.
    Off,
    /// Once black-hole detection (`mtu_probing`) has lowered the MSS: search between that
    /// size and what the peer and our interface allow (Linux `tcp_mtu_probing=1`).
    AfterBlackHole,
    /// From the start: every connection begins at 1024 bytes (Linux `tcp_base_mss`) and
    /// probes upwards (Linux `tcp_mtu_probing=2`).
    Always,
}

/// Keepalive parameters (RFC 1122 §4.2.3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe.
    pub idle: Duration,
    /// Time between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is declared dead.
    pub probes: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(7200),
            interval: Duration::from_secs(75),
            probes: 9,
        }
    }
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            send_buffer: 1 << 20,
            recv_buffer: 1 << 20,
            mss: 1460,
            nodelay: false,
            delayed_ack: true,
            delayed_ack_timeout: Duration::from_millis(40),
            quickack_segments: 16,
            cc: CcAlgorithm::Cubic,
            rto_initial: Duration::from_secs(1),
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(120),
            max_retries: 15,
            syn_retries: 6,
            time_wait: Duration::from_secs(60),
            fin_wait2_timeout: Duration::from_secs(60),
            close_wait_timeout: Duration::from_secs(600),
            keepalive: None,
            window_scaling: true,
            timestamps: true,
            sack: true,
            challenge_ack_limit: 10,
            max_ofo_ranges: 64,
            max_tso_segment: 0,
            mtu_probing: true,
            plpmtud: Plpmtud::AfterBlackHole,
            plpmtud_interval: Duration::from_secs(600),
            pmtu_expires: Some(Duration::from_secs(600)),
            user_timeout: None,
            zero_window_timeout: Some(Duration::from_secs(600)),
            loss_detection: LossDetection::Rack,
        }
    }
}
