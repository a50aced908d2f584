//! `flowstack stats`: what a running daemon carries, as `ss` and `nstat` show it.
//!
//! A query is its own connection to the daemon's unix socket: the client writes
//! [`STATS_REQUEST`] (an application writes `flowstack_api::region::REGISTER` instead) and
//! the daemon answers with one JSON document ([`Stats`]) and closes. [`query`] is the client
//! side; [`Stats::table`] renders it for people.
//!
//! With several engines (`--cores`, `--engines`) the control part asks every engine thread
//! for its part when the query comes and merges them ([`Stats::merge`]): each row and each
//! application carries its `engine`, and the snapshot is each engine's state at the query.
//!
//! Counters: every engine counter (nstat names, summed over the engines) and the daemon's
//! own, named in the same style: `FlowstackdApps` (registered now), `FlowstackdAppsRegistered`,
//! `FlowstackdAppsRefused`, `FlowstackdBadRecords`, `FlowstackdLimitsHit`,
//! `FlowstackdLastCloses`, `FlowstackdEngines`, `FlowstackdCrossEngineAttach` (attaches of
//! a socket living on another engine, refused with `EINVAL`), `FlowstackdUdpPeerFiltered`
//! (datagrams to a connected UDP socket from another source, dropped),
//! `FlowstackdAppMemLimited`
//! (applications that went over `--max-app-memory`, and sockets refused for it),
//! `FlowstackdLinkSteered` and `FlowstackdLinkSteerDrops` (frames of the link an engine's
//! queue received for another engine and passed to it, dropped at a full ring), `FlowstackdMeshFrames` and
//! `FlowstackdMeshDrops` (frames sent to other engines, dropped at a full ring),
//! `FlowstackdPlaceholderBatches` and `FlowstackdPlaceholdersPooled` (placeholder pairs
//! handed over ahead in batches, `Attach{Pool}`), `FlowstackdPlaceholdersRecycled` (pairs
//! kept for reuse when their socket's last descriptor closed, `Forget { recycle }`), `FlowstackdSendFileBytes` and `FlowstackdSendFileCalls` (bytes
//! and calls of applications' `sendfile` sent from their files by the daemon), and the fallbacks shims reported (`Command::Report`):
//! `FlowstackdFallbackNotCarried`, `…Unsupported`, `…NoDaemon`, `…Ipv6`, `…Other`.
//! Gauges in the same map: `FlowstackdPlaceholdersWaiting` (pooled pairs not taken yet),
//! `FlowstackdPlaceholdersKept` (recycled pairs not back in the pool yet),
//! `FlowstackdTableSockets`, `FlowstackdTableHandles`,
//! `FlowstackdTableIdents`, `FlowstackdTablePorts` (the sizes of the daemon's per-socket
//! tables: what a daemon at rest returns to), `FlowstackdTcpConnections` (the engines'
//! connections in any state, TIME-WAIT included) and `FlowstackdTcpAccountedBytes` (what
//! their socket tables account for, `Engine::tcp_accounted_bytes`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Duration;

pub use flowstack_api::region::{REGISTER, STATS_REQUEST};

/// Version of the [`Stats`] schema.
pub const SCHEMA: u32 = 1;

/// One socket, as a row of `ss`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SockRow {
    /// The daemon's socket id.
    pub id: u32,
    /// `tcp`.
    pub proto: String,
    /// `LISTEN`, `ESTAB`, `SYN-SENT`, … (`UNCONN` for a socket not yet listening or
    /// connected, `FAILED`, `CLOSING` while queued bytes are flushed after the last close).
    pub state: String,
    /// Local address.
    pub local: String,
    /// Peer address (`*:*` when none).
    pub peer: String,
    /// Bytes queued to send (daemon + engine).
    pub send_q: u64,
    /// Bytes received and not read by the application (delivered + in the engine).
    pub recv_q: u64,
    /// Smoothed RTT, µs.
    pub rtt_us: Option<u64>,
    /// Congestion window, bytes.
    pub cwnd: Option<u64>,
    /// Pids of the applications that may name it.
    pub pids: Vec<u32>,
    /// Always `flowstack` (kernel fallbacks are counted, not listed).
    pub path: String,
    /// It has a placeholder (POSIX/shim socket).
    pub placeholder: bool,
    /// The engine thread it lives on (`--cores`/`--engines`; 0 with one engine).
    #[serde(default)]
    pub engine: usize,
}

/// One registered application.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppRow {
    /// The daemon's id for it.
    pub id: u64,
    /// Process id (SO_PEERCRED).
    pub pid: u32,
    /// User id (SO_PEERCRED).
    pub uid: u32,
    /// Sockets it names.
    pub sockets: usize,
    /// Command records accepted.
    pub commands: u64,
    /// Command records rejected.
    pub bad_records: u64,
    /// The engine thread serving it.
    #[serde(default)]
    pub engine: usize,
    /// Bytes its sockets hold queued in the daemon, as last counted (0 while they could not
    /// reach `--max-app-memory` together, when they are not counted).
    #[serde(default)]
    pub memory: u64,
}

/// A daemon's answer to a stats query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// [`SCHEMA`].
    pub schema: u32,
    /// Sockets, by id.
    pub sockets: Vec<SockRow>,
    /// Registered applications.
    pub apps: Vec<AppRow>,
    /// nstat-style counters (engines and daemon).
    pub counters: BTreeMap<String, u64>,
}

/// Asks the daemon on `path` for its [`Stats`].
pub fn query(path: impl AsRef<Path>) -> io::Result<Stats> {
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(STATS_REQUEST)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    serde_json::from_slice(&out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl Stats {
    /// Adds another engine's part: its rows, and its counters to these.
    pub fn merge(&mut self, o: Stats) {
        self.sockets.extend(o.sockets);
        self.apps.extend(o.apps);
        for (k, v) in o.counters {
            *self.counters.entry(k).or_insert(0) += v;
        }
        self.sockets.sort_by_key(|r| (r.engine, r.id));
        self.apps.sort_by_key(|a| a.id);
    }

    /// Pretty JSON (the `--json` output; [`query`] reads the same schema back).
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// `ss`-like socket table, then the non-zero counters (`nstat`).
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{:<5} {:<9} {:>8} {:>8} {:<22} {:<22} {:>8} {:>8} {:>3} {:<10} path",
            "Proto", "State", "Recv-Q", "Send-Q", "Local", "Peer", "rtt_us", "cwnd", "eng", "pids"
        );
        for r in &self.sockets {
            let pids: Vec<String> = r.pids.iter().map(|p| p.to_string()).collect();
            let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                o,
                "{:<5} {:<9} {:>8} {:>8} {:<22} {:<22} {:>8} {:>8} {:>3} {:<10} {}",
                r.proto,
                r.state,
                r.recv_q,
                r.send_q,
                r.local,
                r.peer,
                opt(r.rtt_us),
                opt(r.cwnd),
                r.engine,
                if pids.is_empty() {
                    "-".into()
                } else {
                    pids.join(",")
                },
                r.path
            );
        }
        let _ = writeln!(
            o,
            "\n{:<6} {:<8} {:>8} {:>10} {:>8} {:>6}",
            "App", "Pid", "Sockets", "Commands", "BadRecs", "Engine"
        );
        for a in &self.apps {
            let _ = writeln!(
                o,
                "{:<6} {:<8} {:>8} {:>10} {:>8} {:>6}",
                a.id, a.pid, a.sockets, a.commands, a.bad_records, a.engine
            );
        }
        let _ = writeln!(o);
        for (k, v) in &self.counters {
            if *v != 0 {
                let _ = writeln!(o, "{k:<40} {v}");
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips_and_the_table_names_everything() {
        let s = Stats {
            schema: SCHEMA,
            sockets: vec![SockRow {
                id: 3,
                proto: "tcp".into(),
                state: "ESTAB".into(),
                local: "127.0.0.1:80".into(),
                peer: "127.0.0.1:40000".into(),
                send_q: 10,
                recv_q: 20,
                rtt_us: Some(30),
                cwnd: None,
                pids: vec![7, 8],
                path: "flowstack".into(),
                placeholder: true,
                engine: 1,
            }],
            apps: vec![AppRow {
                id: 1,
                pid: 7,
                uid: 0,
                sockets: 1,
                commands: 5,
                bad_records: 0,
                engine: 1,
                memory: 0,
            }],
            counters: [("TcpActiveOpens".to_string(), 4)].into_iter().collect(),
        };
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Stats>(&j).unwrap(), s);
        let t = s.table();
        for w in [
            "ESTAB",
            "127.0.0.1:40000",
            "7,8",
            "flowstack",
            "TcpActiveOpens",
        ] {
            assert!(t.contains(w), "{w} missing from\n{t}");
        }
    }
}
