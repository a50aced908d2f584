//! What a bench run is asked to do: plain data, no argument parser (the CLI turns its
//! arguments into a [`BenchSpec`]).

use flowstack_prof::report::{BenchLink, BenchOptions, Peer, Workload};
use serde::{Deserialize, Serialize};

/// Which stacks to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerSel {
    /// flowstack only.
    Flowstack,
    /// The Linux kernel over loopback only.
    Kernel,
    /// smoltcp over an in-process link, next to flowstack over the in-process pipe with the
    /// same settings (software checksums, MTU 1500): stream only.
    Smoltcp,
    /// flowstack and the kernel, compared.
    Both,
}

impl PeerSel {
    /// The peers measured, in order (flowstack first: the speedup compares it with the other).
    pub fn peers(self) -> &'static [Peer] {
        match self {
            PeerSel::Flowstack => &[Peer::Flowstack],
            PeerSel::Kernel => &[Peer::Kernel],
            PeerSel::Smoltcp => &[Peer::Flowstack, Peer::Smoltcp],
            PeerSel::Both => &[Peer::Flowstack, Peer::Kernel],
        }
    }
}

/// Where the kernel peer's client and server run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// The scheduler decides.
    Free,
    /// Client on core 0, server on core 1 (like flowstack's engines).
    Split,
    /// Both on core 0.
    Same,
}

/// Options shared by the client and the server of a run (the ablation switches).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOpts {
    /// Bytes per write (stream) or per request and response (rr, crr); `None`: the
    /// workload's default.
    pub msg_size: Option<usize>,
    /// Copy into and out of the socket buffers instead of lending and borrowing buffers.
    pub no_zero_copy: bool,
    /// Segment in software to the MTU instead of handing 64 KiB segments down.
    pub no_tso: bool,
    /// Acknowledge every segment at once.
    pub no_delayed_ack: bool,
    /// Compute and verify checksums in software on the shm wire.
    pub no_checksum_offload: bool,
    /// Socket send and receive buffer size (the largest window).
    pub window: Option<usize>,
    /// Where the kernel peer runs.
    pub kernel_placement: Placement,
}

impl Default for RunOpts {
    fn default() -> Self {
        Self {
            msg_size: None,
            no_zero_copy: false,
            no_tso: false,
            no_delayed_ack: false,
            no_checksum_offload: false,
            window: None,
            kernel_placement: Placement::Free,
        }
    }
}

impl RunOpts {
    /// The message size for `w`.
    pub fn msg_size(&self, w: Workload) -> usize {
        self.msg_size.unwrap_or(w.default_msg_size())
    }

    /// The options as the report states them (which optimisations were on).
    pub fn report(&self) -> BenchOptions {
        BenchOptions {
            zero_copy: !self.no_zero_copy,
            tso: !self.no_tso,
            delayed_ack: !self.no_delayed_ack,
            checksum_offload: !self.no_checksum_offload,
            window: self.window,
        }
    }
}

/// One `flowstack bench` invocation.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// stream, rr or crr.
    pub workload: Workload,
    /// Which stacks.
    pub peer: PeerSel,
    /// How flowstack's two engines are joined.
    pub link: BenchLink,
    /// Seconds per run.
    pub duration: f64,
    /// Parallel connections.
    pub conns: usize,
    /// Runs per peer.
    pub runs: usize,
    /// Ablations and sizes.
    pub opts: RunOpts,
    /// `--cores N`: per-core shards for both peers (see [`crate::cores`]); `None`: the
    /// classic run (flowstack over `link`, the kernel's server in its own process).
    pub cores: Option<usize>,
}

/// Most cores `--cores` accepts.
pub const MAX_CORES: usize = 64;

impl BenchSpec {
    /// Checks the ranges and applies the smoltcp peer's ground rules (one process, the
    /// in-process link, MTU-sized segments, software checksums: smoltcp has neither
    /// segmentation nor checksum offload here). `Err` is a one-line reason (misuse).
    pub fn validated(mut self) -> Result<Self, String> {
        if !(0.1..=3600.0).contains(&self.duration)
            || self.conns == 0
            || self.conns > 10_000
            || self.runs == 0
            || self.runs > 100
        {
            return Err(
                "bench needs 0.1 <= --duration <= 3600, 1 <= --conns <= 10000, 1 <= --runs <= 100"
                    .into(),
            );
        }
        if let Some(n) = self.cores {
            if !(1..=MAX_CORES).contains(&n) {
                return Err(format!("--cores must be 1..={MAX_CORES}"));
            }
            if self.peer == PeerSel::Smoltcp {
                return Err("the smoltcp reference peer runs on one core only (no --cores)".into());
            }
            // Every core runs at least one connection.
            self.conns = self.conns.max(n);
            self.link = BenchLink::Pipe;
        }
        let msg = self.msg_size();
        if msg == 0 || msg > 1 << 20 {
            return Err("--msg-size must be 1..1048576".into());
        }
        if self.peer == PeerSel::Smoltcp {
            if self.workload != Workload::Stream {
                return Err("the smoltcp reference peer runs the stream workload only".into());
            }
            self.link = BenchLink::Pipe;
            self.opts.no_tso = true;
            self.opts.no_checksum_offload = true;
        }
        Ok(self)
    }

    /// The message size of this run.
    pub fn msg_size(&self) -> usize {
        self.opts.msg_size(self.workload)
    }
}

/// What the `__bench-server` process is told (one JSON argument, written and read by this
/// crate only).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerSpec {
    /// The workload it serves.
    pub workload: Workload,
    /// The run's options.
    pub opts: RunOpts,
    /// A flowstack engine on the shm wire with this inherited descriptor, or (`None`) a
    /// kernel socket that prints its port on stdout.
    pub shm_fd: Option<i32>,
}

impl ServerSpec {
    /// The argument passed to the server process.
    pub fn to_arg(&self) -> String {
        serde_json::to_string(self).expect("plain data")
    }

    /// Reads [`ServerSpec::to_arg`]'s output.
    pub fn from_arg(s: &str) -> Result<Self, String> {
        serde_json::from_str(s).map_err(|e| format!("bad server spec: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(w: Workload, peer: PeerSel) -> BenchSpec {
        BenchSpec {
            workload: w,
            peer,
            link: BenchLink::Shm,
            duration: 1.0,
            conns: 1,
            runs: 1,
            opts: RunOpts::default(),
            cores: None,
        }
    }

    #[test]
    fn misuse_is_refused_and_smoltcp_gets_its_ground_rules() {
        assert!(spec(Workload::Rr, PeerSel::Smoltcp).validated().is_err());
        let mut s = spec(Workload::Rr, PeerSel::Both);
        s.duration = 0.0;
        assert!(s.validated().is_err());
        let mut s = spec(Workload::Rr, PeerSel::Both);
        s.opts.msg_size = Some(0);
        assert!(s.validated().is_err());
        let s = spec(Workload::Stream, PeerSel::Smoltcp)
            .validated()
            .unwrap();
        assert_eq!(s.link, BenchLink::Pipe);
        assert!(s.opts.no_tso && s.opts.no_checksum_offload);
        assert_eq!(s.msg_size(), 65536);
        let mut s = spec(Workload::Crr, PeerSel::Both);
        s.cores = Some(0);
        assert!(s.validated().is_err());
        let mut s = spec(Workload::Stream, PeerSel::Smoltcp);
        s.cores = Some(2);
        assert!(s.validated().is_err());
        let mut s = spec(Workload::Crr, PeerSel::Both);
        s.cores = Some(2);
        let s = s.validated().unwrap();
        assert_eq!((s.conns, s.link), (2, BenchLink::Pipe));
    }

    #[test]
    fn the_server_spec_survives_the_command_line() {
        let s = ServerSpec {
            workload: Workload::Crr,
            opts: RunOpts {
                window: Some(1 << 16),
                kernel_placement: Placement::Split,
                ..Default::default()
            },
            shm_fd: Some(7),
        };
        let back = ServerSpec::from_arg(&s.to_arg()).unwrap();
        assert_eq!(back.workload, Workload::Crr);
        assert_eq!(back.opts, s.opts);
        assert_eq!(back.shm_fd, Some(7));
        assert!(ServerSpec::from_arg("{").is_err());
    }
}
