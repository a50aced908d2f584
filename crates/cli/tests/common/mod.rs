//! Helpers shared by the root-only test files: root check, commands, network namespaces.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// True as root; otherwise says why the test is skipped (and fails under CI, which runs as
/// root, so a skipped interop test can never pass there silently).
pub fn have_root() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        if std::env::var_os("CI").is_some() {
            panic!("interop tests need root in CI");
        }
        eprintln!("skipped: interop tests need root (network namespaces, TAP)");
    }
    root
}

/// Every layer of seed 000's experiment, as `flowstack profile --json` names them.
pub const PROFILE_LAYERS: [&str; 12] = [
    "AppCopyIn",
    "TcpOutput",
    "TcpEmit",
    "IpOutput",
    "EthOutput",
    "DevTx",
    "DevRx",
    "EthIpInput",
    "TcpInput",
    "BufRelease",
    "SockAppend",
    "AppCopyOut",
];

/// Runs a command to completion; a command that cannot start fails the test.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Runs a command that must succeed (its stderr is the failure message); its output.
pub fn ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A network namespace private to this test process, removed on drop with everything
/// running in it: its children are killed, then any other process left in it.
pub struct Netns {
    pub name: String,
    pub children: Vec<Child>,
}

impl Netns {
    /// A fresh namespace `{prefix}{pid}-{n}` with `lo` up.
    pub fn new(prefix: &str) -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "{prefix}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let _ = run(Command::new("ip").args(["netns", "del", &name]));
        let out = run(Command::new("ip").args(["netns", "add", &name]));
        assert!(out.status.success(), "ip netns add {name}: {out:?}");
        let ns = Netns {
            name,
            children: Vec::new(),
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `prog` to run inside the namespace.
    pub fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, prog]);
        c
    }

    /// `ip ARGS` inside the namespace; a failure fails the test.
    pub fn ip(&self, args: &[&str]) {
        let out = run(self.cmd("ip").args(args));
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts `c` (no stdin; stdout and stderr to `log`); its index in `children`.
    pub fn spawn(&mut self, mut c: Command, log: &Path) -> usize {
        let f = std::fs::File::create(log).unwrap();
        c.stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        self.children.push(c.spawn().unwrap());
        self.children.len() - 1
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Ok(o) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
