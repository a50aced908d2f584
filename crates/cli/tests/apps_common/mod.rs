//! What the tests of unmodified programs under `flowstack run` share (apps.rs,
//! apps_sendfile.rs, apps_small.rs): the binary and the shim, a per-test world (temporary directory, own
//! daemon, shim report), bounded waits, children killed with their process group.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn flowstack_bin() -> &'static str {
    env!("CARGO_BIN_EXE_flowstack")
}

/// The shim next to the `flowstack` binary, built (same profile) if missing or older than
/// its sources.
pub fn preload() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let dir = Path::new(flowstack_bin()).parent().unwrap().to_path_buf();
        let so = dir.join("libflowstack_preload.so");
        let newest = |d: &Path| {
            std::fs::read_dir(d)
                .unwrap()
                .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
                .max()
                .unwrap()
        };
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let newest_src = newest(&root.join("../preload/src"))
            .max(newest(&root.join("../client/src")))
            .max(newest(&root.join("../client/src/posix")));
        let fresh = so
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= newest_src);
        if !fresh {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut c = Command::new(cargo);
            c.args(["build", "-q", "-p", "flowstack-preload"]);
            if dir.ends_with("release") {
                c.arg("--release");
            }
            assert!(
                c.status().expect("cargo build").success(),
                "shim build failed"
            );
        }
        assert!(so.is_file(), "{} missing after the build", so.display());
        so
    })
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

pub fn have(prog: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: {prog} is not installed (CI installs it)");
    }
    ok
}

/// A child killed (and reaped) when dropped, with its process group (nginx's workers).
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A test's world: a temporary directory, its own daemon, a report file.
pub struct World {
    pub dir: PathBuf,
    pub sock: PathBuf,
    pub report: PathBuf,
    pub daemon: Option<Proc>,
}

impl World {
    pub fn new(name: &str) -> World {
        Self::with_daemon_args(name, &[])
    }

    /// A world whose daemon gets the extra arguments `args` (e.g. `--fuse-pipe 0`).
    pub fn with_daemon_args(name: &str, args: &[&str]) -> World {
        let dir =
            std::env::temp_dir().join(format!("flowstack-apps-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("fs.sock");
        let daemon = Command::new(flowstack_bin())
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let w = World {
            report: dir.join("report"),
            dir,
            sock,
            daemon: Some(Proc(daemon)),
        };
        wait_until(Duration::from_secs(10), "the daemon's socket", || {
            std::os::unix::net::UnixStream::connect(&w.sock).is_ok()
        });
        preload();
        w
    }

    /// Runs `python3 ARGS…` under `flowstack run` with the extra environment `env`, within
    /// `limit`, and asserts it exited 0. Its stdout and stderr, or `None` when the shim has
    /// no daemon API (the path is then not checked).
    pub fn python(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
        limit: Duration,
    ) -> Option<(String, String)> {
        let mut argv = vec!["python3"];
        argv.extend_from_slice(args);
        let mut c = self.run(&argv);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = output_within(&mut c, limit, "python3");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {said}{err}");
        if self.shim_without_daemon_api(err.as_bytes()) {
            return None;
        }
        Some((said, err))
    }

    /// Kills this world's daemon with SIGKILL and reaps it.
    pub fn kill_daemon(&mut self) {
        let mut d = self.daemon.take().expect("the daemon runs");
        d.0.kill().unwrap();
        let _ = d.0.wait();
    }

    /// `flowstack run --socket S -- argv…` with the shim's report going to our file.
    pub fn run(&self, argv: &[&str]) -> Command {
        let mut c = Command::new(flowstack_bin());
        c.arg("run")
            .arg("--socket")
            .arg(&self.sock)
            .arg("--")
            .args(argv)
            .env("FLOWSTACK_PRELOAD", preload())
            .env("FLOWSTACK_REPORT", &self.report)
            .current_dir(&self.dir);
        c
    }

    pub fn spawn(&self, argv: &[&str], what: &str) -> Proc {
        use std::os::unix::process::CommandExt;
        let err = std::fs::File::create(self.dir.join(format!("{what}.err"))).unwrap();
        let out = std::fs::File::create(self.dir.join(format!("{what}.out"))).unwrap();
        let c = self
            .run(argv)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap();
        Proc(c)
    }

    /// Runs to completion within `limit` (killed otherwise, and the test fails).
    pub fn output(&self, argv: &[&str], limit: Duration) -> Output {
        let mut c = self.run(argv);
        output_within(&mut c, limit, argv[0])
    }

    /// A counter of the daemon, from `flowstack stats --json`.
    pub fn counter(&self, name: &str) -> u64 {
        let mut c = Command::new(flowstack_bin());
        c.args(["stats", "--json", "--socket"]).arg(&self.sock);
        let out = output_within(&mut c, Duration::from_secs(20), "flowstack stats");
        assert!(out.status.success(), "flowstack stats failed");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
        v["counters"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {name} in {v}"))
    }

    /// The daemon's turns looked only at marked sockets and no sweep found one with work
    /// that no mark had named (a missed mark: news served late). Call after a workload.
    pub fn assert_every_change_marked(&self) {
        assert!(self.counter("FlowstackdServiceSweeps") > 0, "no sweep ran");
        assert_eq!(
            self.counter("FlowstackdServiceUnmarked"),
            0,
            "a sweep found a socket with work no mark had named"
        );
    }

    pub fn report(&self) -> String {
        std::fs::read_to_string(&self.report).unwrap_or_default()
    }

    /// True when the shim says it was built without the daemon API (path checks skipped).
    pub fn shim_without_daemon_api(&self, stderr: &[u8]) -> bool {
        let s = String::from_utf8_lossy(stderr);
        let no = s.contains("has no daemon API");
        if no {
            eprintln!("path not checked: the shim has no daemon API yet (kernel fallback)");
        }
        no
    }

    /// Asserts that process `comm` had at least `n` sockets through flowstack and none moved
    /// or fell back for lack of a daemon.
    pub fn assert_flowstack(&self, comm: &str, n: usize) {
        let r = self.report();
        let mine: Vec<&str> = r
            .lines()
            .filter(|l| l.split('\t').nth(1) == Some(comm))
            .collect();
        let fs = mine.iter().filter(|l| l.contains("\tflowstack\t")).count();
        assert!(
            fs >= n,
            "{comm}: {fs} sockets through flowstack, want {n}; report:\n{r}"
        );
        assert!(
            !mine
                .iter()
                .any(|l| l.ends_with("no-daemon") || l.ends_with("daemon-refused")),
            "{comm} fell back to the kernel:\n{r}"
        );
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.daemon.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A world for a python3 script test, with `script` written to `file` in its directory;
/// `None` (the reason printed) when python3 is not installed.
pub fn python_world(name: &str, file: &str, script: &str) -> Option<World> {
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return None;
    }
    let w = World::new(name);
    std::fs::write(w.dir.join(file), script).unwrap();
    Some(w)
}

pub fn output_within(c: &mut Command, limit: Duration, what: &str) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    }
}

pub fn wait_until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A port free on the kernel at `ip` now (the daemon's ports are its own).
pub fn free_port(ip: Ipv4Addr) -> u16 {
    TcpListener::bind(SocketAddrV4::new(ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something accepts TCP connections at `ip:port` (a server under flowstack
/// also listens in the kernel by default, which is what this probes).
pub fn wait_listening(ip: Ipv4Addr, port: u16) {
    wait_until(Duration::from_secs(20), "the server to listen", || {
        TcpStream::connect_timeout(&SocketAddrV4::new(ip, port).into(), Duration::from_secs(1))
            .is_ok()
    });
}

/// A python receiver (`recv.py PORT OUT [GO]`): waits for `go` to exist (if given), then reads until end of stream; prints
/// the count and sha256 of what it got, and writes it to `out`.
pub const RECEIVER: &str = r#"
import hashlib, os, socket, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
go = sys.argv[3] if len(sys.argv) > 3 else None
s = socket.create_connection(("127.0.0.1", port), timeout=60)
if go:
    end = time.time() + 60
    while not os.path.exists(go) and time.time() < end:
        time.sleep(0.01)
h, total = hashlib.sha256(), 0
with open(out, "wb") as f:
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        f.write(b)
        h.update(b)
        total += len(b)
print(total, h.hexdigest(), flush=True)
"#;

/// The sha256 of a file, in hex (`sha256sum`).
pub fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Deterministic pseudo-random bytes (xorshift), so a failure is reproducible.
pub fn write_random(path: &Path, len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ len as u64;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    std::fs::File::create(path).unwrap().write_all(&v).unwrap();
    v
}

/// `ss -tn` lines that mention `port` (kernel TCP sockets on it).
pub fn kernel_sockets_on(port: u16) -> Vec<String> {
    let out = Command::new("ss").args(["-tnH"]).output();
    let Ok(out) = out else { return vec![] };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!(":{port} ")))
        .map(String::from)
        .collect()
}

/// An nginx configuration with `sendfile on;`, one worker, listening on 127.0.0.1:`port` and
/// serving `dir/www` (created).
pub fn nginx_sendfile_conf(dir: &Path, port: u16) -> PathBuf {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let conf = format!(
        "daemon off;\n{user}master_process on;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log;\nevents {{ worker_connections 64; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n\
           proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
           uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  sendfile on;\n\
           server {{ listen 127.0.0.1:{port}; root {d}/www; }}\n}}\n",
        d = dir.display(),
        // As root, nginx's workers would run as nobody, who cannot reach the daemon socket.
        user = if root { "user root;\n" } else { "" }
    );
    std::fs::create_dir_all(dir.join("www")).unwrap();
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    path
}
