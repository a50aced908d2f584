//! Architectures as configurations: where the stack runs and what crossing into it costs
//! ([`Arch`], parsed from names such as `kernel`, `percore`, `offload:2@0.5`,
//! `daemon-wake:c/4`). [`crate::model`] turns one into resources and scripts.

use serde::{Deserialize, Serialize};

/// How the application reaches the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// A system call per socket operation.
    Syscall,
    /// A call into a library in the application's process.
    Library,
    /// A command posted to (or an event taken from) a shared-memory ring.
    Ring,
}

/// How a receiving side learns that packets or messages arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Notify {
    /// An interrupt per packet.
    InterruptPerPacket,
    /// The stack polls its queue (a loop turn).
    Poll,
}

/// How a blocked application is handed data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Handoff {
    /// It sleeps and is woken (on another core: plus the cross-core latency).
    Wakeup,
    /// Its loop polls (one loop turn, no wake-up).
    Poll,
    /// It sleeps on a futex between calls and the stack core wakes it (flowstackd with
    /// applications that do not spin): the stack core's wake-up call is part of its work per
    /// event, the wake-up crosses cores and waits for the application's core
    /// (`app_wake_ns`), and the application pays `app_wait_ns` for the wait (going to sleep,
    /// being switched back in).
    Futex,
}

/// An architecture: where the stack runs and what crossing into it costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Arch {
    /// Its name.
    pub name: String,
    /// Whose stack costs: the kernel's (true) or flowstack's.
    pub kernel_stack: bool,
    /// How the application calls the stack.
    pub api: Api,
    /// Whether payload is copied between application and stack buffers.
    pub copy: bool,
    /// How received packets are noticed on the host.
    pub notify: Notify,
    /// How the application is handed received data.
    pub handoff: Handoff,
    /// Offload: this many stack cores (0: the stack runs on the host cores).
    pub engines: usize,
    /// Offload: the stack cores' clock relative to the calibration's.
    pub engine_ratio: f64,
    /// Whether connections serialise on a lock shared by all cores (the kernel's listen
    /// socket and accept queue).
    pub shared_conn_lock: bool,
    /// Whether flows are steered so that a flow's packets are received on its
    /// application's core (RSS with per-core listeners); otherwise the receive core is the
    /// hash of the flow, independent of where the application thread runs.
    pub flow_affinity: bool,
    /// Whether the stack cores are host cores shared with other processes (an offload
    /// daemon's), so that they get the run's host share like the application cores; a NIC
    /// processor is not shared.
    #[serde(default)]
    pub engines_on_host: bool,
}

impl Arch {
    /// The named architectures: `kernel`, `library`, `percore`, `offload`, `offload:E`
    /// (E stack cores), `offload:E@R` (at R times the host clock, e.g. `offload:1@0.2` for a
    /// 500 MHz NIC processor under a 2.5 GHz host) — a NIC that interrupts the host once per
    /// message and wakes a blocked reader (seed 001) — and `daemon[:E[@R]]`, the same on
    /// dedicated host cores whose event rings a busy application polls (flowstackd), and
    /// `daemon-wake[:E[@R]]`, flowstackd whose applications sleep between calls and are
    /// woken by the stack core (what `bench --peer offload` runs).
    /// `offload:c/K` and `daemon:c/K` name `cores / K` stack cores (at least one) of a
    /// machine of `cores` host cores.
    pub fn parse_for(s: &str, cores: usize) -> Result<Arch, String> {
        let (kind, rest) = match s.split_once(":c/") {
            Some((k @ ("offload" | "daemon" | "daemon-wake"), rest)) => (k, Some(rest)),
            _ => ("", None),
        };
        if let Some(rest) = rest {
            let (k, r) = rest.split_once('@').unwrap_or((rest, ""));
            let k: usize = k
                .parse()
                .ok()
                .filter(|&k| k >= 1)
                .ok_or_else(|| format!("bad divisor in {s:?}"))?;
            let e = (cores / k).max(1);
            let mut a = Arch::parse(&if r.is_empty() {
                format!("{kind}:{e}")
            } else {
                format!("{kind}:{e}@{r}")
            })?;
            a.name = s.to_string();
            return Ok(a);
        }
        Arch::parse(s)
    }

    /// Parses one named architecture (see [`Arch::parse_for`] for the list).
    pub fn parse(s: &str) -> Result<Arch, String> {
        let base = |name: &str| Arch {
            name: name.to_string(),
            kernel_stack: false,
            api: Api::Library,
            copy: false,
            notify: Notify::Poll,
            handoff: Handoff::Poll,
            engines: 0,
            engine_ratio: 1.0,
            shared_conn_lock: false,
            flow_affinity: true,
            engines_on_host: false,
        };
        let (head, tail) = s.split_once(':').unwrap_or((s, ""));
        let a = match head {
            "kernel" => Arch {
                kernel_stack: true,
                api: Api::Syscall,
                copy: true,
                notify: Notify::InterruptPerPacket,
                handoff: Handoff::Wakeup,
                shared_conn_lock: true,
                flow_affinity: false,
                ..base("kernel")
            },
            "library" => Arch {
                api: Api::Library,
                copy: true,
                notify: Notify::InterruptPerPacket,
                handoff: Handoff::Wakeup,
                flow_affinity: false,
                ..base("library")
            },
            "percore" => base("percore"),
            "offload" | "daemon" | "daemon-wake" => {
                let (e, r) = tail.split_once('@').unwrap_or((tail, ""));
                let engines = if e.is_empty() {
                    1
                } else {
                    e.parse::<usize>()
                        .ok()
                        .filter(|&n| (1..=256).contains(&n))
                        .ok_or_else(|| format!("bad engine count in {s:?} (1..=256)"))?
                };
                let ratio = if r.is_empty() {
                    1.0
                } else {
                    r.parse::<f64>()
                        .ok()
                        .filter(|&x| x > 0.0 && x <= 100.0)
                        .ok_or_else(|| format!("bad clock ratio in {s:?} (0 < R <= 100)"))?
                };
                Arch {
                    api: Api::Ring,
                    copy: true,
                    notify: Notify::Poll,
                    handoff: match head {
                        "daemon" => Handoff::Poll,
                        "daemon-wake" => Handoff::Futex,
                        _ => Handoff::Wakeup,
                    },
                    engines,
                    engine_ratio: ratio,
                    engines_on_host: head != "offload",
                    ..base(s)
                }
            }
            _ => {
                return Err(format!(
                    "unknown architecture {s:?} (kernel, library, percore, offload[:E[@R]], daemon[:E[@R]], daemon-wake[:E[@R]])"
                ))
            }
        };
        if !matches!(head, "offload" | "daemon" | "daemon-wake") && !tail.is_empty() {
            return Err(format!(
                "only offload, daemon and daemon-wake take :E@R, not {s:?}"
            ));
        }
        Ok(a)
    }
}
