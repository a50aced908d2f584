//! Named counters for every layer, in one namespace shared by the link, IP, ICMP, UDP and TCP
//! layers and by every process that reports them: one for every drop reason and every notable
//! event, with nstat-style names
//! (`IpInHdrErrors`, `TcpExtTCPChallengeACK`, …). Names without a Linux equivalent use the
//! same style with an `Ext` infix or an `Eth`/`Arp` prefix.

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident),* $(,)?) => {
        /// A counter's identity; its `Debug` name is the nstat-style name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum Counter {
            $($(#[doc = $doc])* $name,)*
        }

        impl Counter {
            /// How many counters there are.
            pub const COUNT: usize = [$(stringify!($name)),*].len();
            /// Every counter, in display order.
            pub const ALL: &'static [Counter] = &[$(Counter::$name,)*];
            /// The nstat-style name.
            pub fn name(self) -> &'static str {
                match self {
                    $(Counter::$name => stringify!($name),)*
                }
            }
        }
    };
}

counters! {
    /// Frames shorter than an Ethernet header.
    EthInRunts,
    /// Frames addressed to another host's MAC.
    EthInOtherHost,
    /// Frames with an EtherType we do not handle.
    EthInUnknownProtos,
    /// Frames dropped at transmit because the device queue was full.
    EthOutDrops,
    /// ARP requests received for our address.
    ArpInRequests,
    /// ARP replies received and used.
    ArpInReplies,
    /// Malformed or unsupported ARP packets.
    ArpInErrors,
    /// Replies for addresses we never asked about (no entry created, RFC 826 merge rule).
    ArpInUnsolicited,
    /// ARP requests sent.
    ArpOutRequests,
    /// ARP replies sent.
    ArpOutReplies,
    /// Packets dropped because the per-address or global resolution queue was full.
    ArpQueueDrops,
    /// Packets dropped because resolution timed out.
    ArpResolveFailed,
    /// Datagrams received from the link.
    IpInReceives,
    /// Bad version, IHL, header length, TTL or source.
    IpInHdrErrors,
    /// Total length beyond the received frame.
    IpExtInTruncatedPkts,
    /// Header checksum failures.
    IpExtInCsumErrors,
    /// Datagrams not addressed to us.
    IpInAddrErrors,
    /// Datagrams for a protocol we do not handle.
    IpInUnknownProtos,
    /// Datagrams delivered to ICMP/UDP/TCP.
    IpInDelivers,
    /// Datagrams handed to the link (or to ARP resolution).
    IpOutRequests,
    /// No route to the destination.
    IpOutNoRoutes,
    /// Fragments received.
    IpReasmReqds,
    /// Datagrams reassembled.
    IpReasmOKs,
    /// Reassembly failures (memory cap, bad fragment).
    IpReasmFails,
    /// Datagrams discarded for overlapping fragments.
    IpExtReasmOverlaps,
    /// Datagrams whose fragments did not all arrive in time.
    IpReasmTimeout,
    /// Datagrams fragmented on output.
    IpFragOKs,
    /// Fragments created.
    IpFragCreates,
    /// Datagrams too large with DF set.
    IpFragFails,
    /// ICMP messages received.
    IcmpInMsgs,
    /// Malformed ICMP messages.
    IcmpInErrors,
    /// ICMP checksum failures.
    IcmpInCsumErrors,
    /// ICMP types we ignore.
    IcmpExtInIgnored,
    /// Echo requests received.
    IcmpInEchos,
    /// Echo replies received.
    IcmpInEchoReps,
    /// Destination-unreachable messages received.
    IcmpInDestUnreachs,
    /// Time-exceeded messages received.
    IcmpInTimeExcds,
    /// ICMP messages sent.
    IcmpOutMsgs,
    /// Echo replies sent.
    IcmpOutEchoReps,
    /// Echo requests sent.
    IcmpOutEchos,
    /// Destination-unreachable messages sent.
    IcmpOutDestUnreachs,
    /// ICMP errors suppressed by the rate limit.
    IcmpExtOutRateLimited,
    /// UDP datagrams delivered to sockets.
    UdpInDatagrams,
    /// UDP datagrams for a port with no socket.
    UdpNoPorts,
    /// Malformed UDP datagrams.
    UdpInErrors,
    /// UDP checksum failures.
    UdpInCsumErrors,
    /// Datagrams dropped because the socket's receive queue was full.
    UdpRcvbufErrors,
    /// UDP datagrams sent.
    UdpOutDatagrams,
    /// TCP segments received.
    TcpInSegs,
    /// TCP segments sent.
    TcpOutSegs,
    /// TCP segments retransmitted.
    TcpRetransSegs,
    /// Malformed TCP segments.
    TcpInErrs,
    /// TCP checksum failures.
    TcpInCsumErrors,
    /// RSTs sent.
    TcpOutRsts,
    /// Active opens (SYN sent).
    TcpActiveOpens,
    /// Passive opens (SYN received and accepted).
    TcpPassiveOpens,
    /// Opens that failed.
    TcpAttemptFails,
    /// Connections reset from ESTABLISHED or CLOSE_WAIT.
    TcpEstabResets,
    /// Segments for no connection and no listener.
    TcpExtTCPNoSocket,
    /// Challenge ACKs sent (RFC 5961).
    TcpExtTCPChallengeACK,
    /// Challenge ACKs suppressed by the per-connection rate limit.
    TcpExtTCPChallengeACKLimited,
    /// Segments dropped by the sequence acceptability test.
    TcpExtTCPOutOfWindow,
    /// ACKs for data never sent, dropped (RFC 5961 §5).
    TcpExtTCPACKSkippedInvalid,
    /// Segments dropped by PAWS (RFC 7323 §5).
    TcpExtPAWSEstab,
    /// SYN cookies sent.
    TcpExtSyncookiesSent,
    /// Valid SYN cookies received.
    TcpExtSyncookiesRecv,
    /// Invalid SYN cookies received.
    TcpExtSyncookiesFailed,
    /// SYNs dropped because the accept queue was full.
    TcpExtListenOverflows,
    /// SYNs dropped at a listener for any reason.
    TcpExtListenDrops,
    /// Header-prediction hits for in-order data.
    TcpExtTCPHPHits,
    /// Header-prediction hits for pure ACKs.
    TcpExtTCPHPAcks,
    /// Pure ACKs taking the slow path.
    TcpExtTCPPureAcks,
    /// Segments queued out of order.
    TcpExtTCPOFOQueue,
    /// Out-of-order segments dropped (memory limit).
    TcpExtTCPOFODrop,
    /// Segments dropped because the receive buffer was full.
    TcpExtTCPRcvQDrop,
    /// Retransmission timeouts.
    TcpExtTCPTimeouts,
    /// Fast retransmits.
    TcpExtTCPFastRetrans,
    /// Retransmissions triggered by SACK-based loss recovery.
    TcpExtTCPSackRecovery,
    /// Retransmissions found lost (SACKs for data sent after them came back first).
    TcpExtTCPLostRetransmit,
    /// Delayed ACKs sent by the timer.
    TcpExtDelayedACKs,
    /// Connections aborted after too many retransmissions.
    TcpExtTCPAbortOnTimeout,
    /// Keepalive probes sent.
    TcpExtTCPKeepAlive,
    /// Zero-window probes sent.
    TcpExtTCPWinProbe,
    /// Connections that entered TIME_WAIT.
    TcpExtTW,
    /// New SYNs that reopened a 4-tuple held in TIME_WAIT (RFC 1122 §4.2.2.13, RFC 6191).
    TcpExtTWReused,
    /// Segments with malformed options (dropped, connection unharmed).
    TcpExtTCPBadOptions,
    /// Connections refused because the connection table was full.
    TcpExtTCPConnLimit,
    /// TIME-WAIT entries dropped early to make room for a new connection in a full table
    /// (Linux: "time wait bucket table overflow").
    TcpExtTCPTimeWaitOverflow,
    // ---- hardening (issue 19) ----
    /// Datagrams with a loose or strict source-route option, dropped (as Linux by default).
    IpExtInSrcRouteDrops,
    /// Datagrams from a martian source (0/8 but 0.0.0.0, 127/8, 240/4, our own address).
    IpExtInMartianSrc,
    /// Exact duplicate fragments ignored.
    IpExtReasmDuplicates,
    /// Fragments refused, or incomplete datagrams evicted, because reassembly memory or the
    /// limit on incomplete datagrams was exhausted.
    IpExtReasmNoMemory,
    /// ICMP redirects received (ignored: a host keeps its routes, as Linux's
    /// `accept_redirects=0`).
    IcmpInRedirects,
    /// ARP entries evicted to make room because the cache was full (an ARP flood).
    ArpExtCacheFull,
    /// TCP segments to a broadcast or multicast address, dropped.
    TcpExtTCPBroadcastDrop,
    /// Land segments (source = destination address and port), dropped.
    TcpExtTCPLandDrop,
    /// Segments to a listener that were neither SYN, RST nor a SYN-cookie ACK, dropped.
    TcpExtTCPListenBadFlags,
    /// SYN+FIN to a listener or SYN-SENT connection, dropped.
    TcpExtTCPSynFinDrop,
    /// ICMP errors whose quoted sequence number is not in flight (RFC 5927 §4.1).
    TcpExtOutOfWindowIcmps,
    /// ICMP errors for TCP that matched no connection.
    TcpExtTCPIcmpNoSocket,
    /// Path MTU lowered by ICMP fragmentation-needed (RFC 1191).
    TcpExtTCPPMTUReduced,
    /// Fragmentation-needed messages ignored (MTU not below the current one).
    TcpExtTCPPMTUIgnored,
    /// MSS lowered after repeated timeouts of full-sized segments (black-hole detection,
    /// RFC 4821 §7.7; Linux `tcp_mtu_probing=1`).
    TcpExtTCPMTUPBlackhole,
    /// RFC 4821 probes (one segment larger than the MSS) acknowledged: the MSS was raised
    /// to the probe's size (Linux `TCPMTUPSuccess`).
    TcpExtTCPMTUPSuccess,
    /// RFC 4821 probes lost alone: the path cannot carry that size; no congestion response
    /// (Linux `TCPMTUPFail`).
    TcpExtTCPMTUPFail,
    /// ICMP unreachable errors recorded as soft errors on a connection (RFC 1122 §4.2.3.9).
    TcpExtTCPIcmpSoftErrors,
    /// SACK blocks ignored: outside the send window or below SND.UNA.
    TcpExtTCPSACKDiscard,
    /// Peer MSS below the floor, raised to it (Linux TCP_MIN_SND_MSS = 48).
    TcpExtTCPMSSClamped,
    /// Peer window-scale shift above 14, used as 14 (RFC 7323 §2.3).
    TcpExtTCPWscaleClamped,
    /// Connections aborted after the peer held the window at zero too long.
    TcpExtTCPAbortOnZeroWindow,
    /// Urgent pointers pointing beyond the segment's data (ignored).
    TcpExtTCPUrgBeyondData,
    /// Retransmission timeouts found spurious (RFC 3522 Eifel detection) and undone.
    TcpExtTCPSpuriousRTOs,
    /// Segments with SYN+RST or SYN+FIN on a synchronized connection (answered with a
    /// challenge ACK).
    TcpExtTCPBadSynFlags,
    // ---- RACK-TLP (issue 19) ----
    /// Tail loss probes sent (RFC 8985 §7).
    TcpExtTCPLossProbes,
    /// Losses repaired through a tail loss probe instead of a retransmission timeout.
    TcpExtTCPLossProbeRecovery,
    /// Segments marked lost by RACK's time-based detection (RFC 8985 §6.2).
    TcpExtTCPRackLoss,
    // ---- D-SACK and path MTU increase (issue 19) ----
    /// D-SACK blocks sent (RFC 2883 §4) reporting a duplicate below RCV.NXT.
    TcpExtTCPDSACKOldSent,
    /// D-SACK blocks sent reporting a duplicate of out-of-order data held.
    TcpExtTCPDSACKOfoSent,
    /// D-SACK blocks received (RFC 2883 §5: a first SACK block below the cumulative ACK or
    /// inside the second block).
    TcpExtTCPDSACKRecv,
    /// D-SACKs that reported one of our retransmissions as needless: the original arrived
    /// (RFC 3708 spurious retransmission detection).
    TcpExtTCPSpuriousRetrans,
    /// D-SACKs that matched none of the current recovery episode's retransmissions (a
    /// network duplicate, forged, or late for an earlier episode): ignored.
    TcpExtTCPDSACKIgnored,
    /// Congestion responses undone because every retransmission of the recovery episode was
    /// reported needless by D-SACK (RFC 3708 §3, as Linux's TCPDSACKUndo).
    TcpExtTCPDSACKUndo,
    /// Path MTU estimates raised back after their expiry (RFC 1191 §6.3).
    TcpExtTCPPMTURaised,
    /// Raised path MTU estimates lowered again before a segment of the larger size was
    /// acknowledged: the path still cannot carry it.
    TcpExtTCPPMTURaiseFailed,
    // ---- send_file from mapped windows (issue 17) ----
    /// Connections reset because the file under one of their mapped `send_file` windows was
    /// truncated (its bytes may have been read as zeros).
    TcpExtFileMapResets,
    /// Frames discarded before transmission because they were built while a mapped
    /// `send_file` window's file was truncated (they could carry zeros for file bytes).
    EthExtFileMapDrops,
}

/// The engine's counters.
#[derive(Debug, Clone)]
pub struct Counters {
    values: [u64; Counter::COUNT],
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            values: [0; Counter::COUNT],
        }
    }
}

impl Counters {
    /// Adds one.
    #[inline]
    pub fn inc(&mut self, c: Counter) {
        self.values[c as usize] += 1;
    }
    /// Adds `n`.
    #[inline]
    pub fn add(&mut self, c: Counter, n: u64) {
        self.values[c as usize] += n;
    }
    /// The current value.
    #[inline]
    pub fn get(&self, c: Counter) -> u64 {
        self.values[c as usize]
    }
    /// Adds every counter of `other` into this one.
    pub fn merge(&mut self, other: &Counters) {
        for (a, b) in self.values.iter_mut().zip(&other.values) {
            *a += b;
        }
    }
    /// Looks a counter up by its nstat-style name.
    pub fn by_name(&self, name: &str) -> Option<u64> {
        Counter::ALL
            .iter()
            .find(|c| c.name() == name)
            .map(|&c| self.get(c))
    }
    /// Every nonzero counter with its name.
    pub fn nonzero(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Counter::ALL
            .iter()
            .map(|&c| (c.name(), self.get(c)))
            .filter(|&(_, v)| v != 0)
    }
}
