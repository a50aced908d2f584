//! `flowstack run [--socket PATH] [-v] -- CMD ARGS...`: an unmodified program on flowstack.
//!
//! Starts the offload daemon on the socket if none answers, puts `libflowstack_preload.so` in
//! `LD_PRELOAD` and runs CMD. Without `-v` CMD replaces this process (its exit status is the
//! command's by construction); with `-v` CMD runs as a child and, when it exits, every process
//! it started under the shim is summarised: sockets through flowstack, on the kernel and why.

use clap::Args;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The shim's file name.
pub const PRELOAD_NAME: &str = "libflowstack_preload.so";
/// How long to wait for a daemon we started to answer.
const DAEMON_START: Duration = Duration::from_secs(5);

/// Arguments of `flowstack run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The daemon's unix socket [default: as `flowstack daemon`]; a daemon is started there
    /// if none answers.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// At exit, print per process: sockets through flowstack, on the kernel and why.
    #[arg(short, long)]
    pub verbose: bool,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<OsString>,
}

/// Runs the command; returns only on failure or with `-v`.
pub fn run(a: RunArgs) -> ExitCode {
    let socket = a
        .socket
        .clone()
        .unwrap_or_else(flowstack_offload::default_socket_path);
    let shim = match find_preload() {
        Ok(p) => p,
        Err(m) => {
            eprintln!("flowstack: run: {m}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(m) = ensure_daemon(&socket) {
        eprintln!("flowstack: run: {m}");
        return ExitCode::FAILURE;
    }
    let mut preload = shim.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(" ");
        preload.push(old);
    }
    let mut cmd = Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..])
        .env("LD_PRELOAD", preload)
        .env("FLOWSTACK_SOCKET", &socket)
        .env_remove("FLOWSTACK_FDS");
    if !a.verbose {
        let e = cmd.exec();
        eprintln!("flowstack: run: {}: {e}", a.cmd[0].to_string_lossy());
        return ExitCode::from(127);
    }
    let report = std::env::temp_dir().join(format!("flowstack-run-{}.report", std::process::id()));
    let _ = std::fs::remove_file(&report);
    cmd.env("FLOWSTACK_REPORT", &report);
    // The child gets the terminal's signals itself; we stay to summarise.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, Default::default());
    }
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowstack: run: {}: {e}", a.cmd[0].to_string_lossy());
            return ExitCode::from(127);
        }
    };
    let lines = std::fs::read_to_string(&report).unwrap_or_default();
    let _ = std::fs::remove_file(&report);
    for l in summary(&lines) {
        eprintln!("flowstack run: {l}");
    }
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(s)) => ExitCode::from(128u8.wrapping_add(s as u8)),
        _ => ExitCode::FAILURE,
    }
}

/// `FLOWSTACK_PRELOAD`, or the shim next to this executable (the cargo target directory, or
/// `../lib` of an installed tree).
fn find_preload() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FLOWSTACK_PRELOAD") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(std::fs::canonicalize(&p).unwrap_or(p))
        } else {
            Err(format!("FLOWSTACK_PRELOAD={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("where am I: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join(PRELOAD_NAME),
        dir.join("..").join(PRELOAD_NAME),
        dir.join("../lib").join(PRELOAD_NAME),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            format!(
                "{PRELOAD_NAME} not found next to {} (build it: cargo build -p flowstack-preload; \
                 or set FLOWSTACK_PRELOAD)",
                exe.display()
            )
        })
}

/// Starts `flowstack daemon --socket PATH` (own process group, output to `PATH.log`, its pid in
/// `PATH.pid`) unless a
/// daemon answers there; waits for it at most [`DAEMON_START`].
fn ensure_daemon(socket: &Path) -> Result<(), String> {
    if UnixStream::connect(socket).is_ok() {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| format!("where am I: {e}"))?;
    // The log sits next to the socket, whose directory (e.g. /run/flowstack as root) may not
    // exist yet on a fresh machine.
    if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut log_name = socket.as_os_str().to_owned();
    log_name.push(".log");
    let log = std::fs::File::create(&log_name)
        .map_err(|e| format!("{}: {e}", Path::new(&log_name).display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .arg("daemon")
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let mut pid_name = socket.as_os_str().to_owned();
    pid_name.push(".pid");
    let _ = std::fs::write(&pid_name, format!("{}\n", child.id()));
    let start = Instant::now();
    while start.elapsed() < DAEMON_START {
        if UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!(
                "the daemon exited ({st}) before answering on {}; see {}",
                socket.display(),
                Path::new(&log_name).display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "no daemon answered on {} within {:?}",
        socket.display(),
        DAEMON_START
    ))
}

/// Per process (in order of appearance): the shim's report lines (`pid comm fd path why`)
/// summed into one line.
pub fn summary(report: &str) -> Vec<String> {
    #[derive(Default)]
    struct P {
        comm: String,
        flowstack: i64,
        kernel: BTreeMap<String, u64>,
    }
    let mut order = Vec::new();
    let mut procs: BTreeMap<u32, P> = BTreeMap::new();
    for l in report.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        let [pid, comm, _fd, path, why] = f[..] else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let p = procs.entry(pid).or_insert_with(|| {
            order.push(pid);
            P::default()
        });
        p.comm = comm.to_string();
        match path {
            "flowstack" => p.flowstack += 1,
            "moved" => {
                p.flowstack -= 1;
                *p.kernel.entry(why.to_string()).or_default() += 1;
            }
            _ => *p.kernel.entry(why.to_string()).or_default() += 1,
        }
    }
    order
        .iter()
        .map(|pid| {
            let p = &procs[pid];
            let k: u64 = p.kernel.values().sum();
            let why: Vec<String> = p.kernel.iter().map(|(w, n)| format!("{w} {n}")).collect();
            let why = if why.is_empty() {
                String::new()
            } else {
                format!(" ({})", why.join(", "))
            };
            format!(
                "pid {pid} ({}): {} sockets through flowstack, {k} on the kernel{why}",
                p.comm,
                p.flowstack.max(0)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_per_process_and_moves_count_once() {
        let r = "10\tcurl\t3\tflowstack\tsocket\n\
                 10\tcurl\t4\tflowstack\tsocket\n\
                 10\tcurl\t4\tmoved\tnot-carried\n\
                 11\tnginx\t6\tflowstack\taccept\n\
                 10\tcurl\t5\tkernel\tunix\n\
                 garbage line\n";
        let s = summary(r);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0],
            "pid 10 (curl): 1 sockets through flowstack, 2 on the kernel (not-carried 1, unix 1)"
        );
        assert_eq!(
            s[1],
            "pid 11 (nginx): 1 sockets through flowstack, 0 on the kernel"
        );
        assert!(summary("").is_empty());
    }
}
