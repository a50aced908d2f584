//! `flowstack serve http` sending files with `send_file`, checked by the kernel's curl over a
//! TAP in a network namespace the test creates and removes: whole files, `curl -r` ranges
//! (206 + Content-Range), an unsatisfiable range (416), `Accept-Ranges`, also under loss.
//! (`flowstack get -o`, which receives with `recv_to_file`, is checked against the kernel in
//! `interop.rs`.) Root only: skipped with a message otherwise, failing if `CI` is set.

mod common;
use common::{have_root, run, Netns};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const FLOWSTACK: &str = env!("CARGO_BIN_EXE_flowstack");

/// A namespace with a TAP `fsr0` (kernel side 10.79.0.1/24).
fn tap_netns() -> Netns {
    let ns = Netns::new("fsr");
    ns.ip(&["tuntap", "add", "dev", "fsr0", "mode", "tap"]);
    ns.ip(&["addr", "add", "10.79.0.1/24", "dev", "fsr0"]);
    ns.ip(&["link", "set", "fsr0", "up"]);
    ns
}

/// The file-transfer tests' namespace helpers (the type is shared: `common::Netns`).
impl Netns {
    /// Starts `flowstack serve http` on the TAP and waits (bounded) until it serves.
    fn serve(&mut self, root: &Path, extra: &[&str], log: &Path) {
        let mut c = self.cmd(FLOWSTACK);
        c.args(["serve", "--tap", "fsr0", "--ip", "10.79.0.2/24"])
            .args(extra)
            .args(["http", "--root"])
            .arg(root)
            .args(["--port", "80"]);
        self.spawn(c, log);
        let start = Instant::now();
        while !fs::read_to_string(log)
            .unwrap_or_default()
            .contains("serving http")
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "serve never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fs-interop-file-{}-{tag}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Pseudo-random bytes.
fn data(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `curl -r RANGE` (or the whole file); (status code, body, response headers).
fn curl(ns: &Netns, range: Option<&str>, out: &Path) -> (u16, Vec<u8>, String) {
    let mut c = ns.cmd("curl");
    c.args(["-s", "-S", "--max-time", "60", "-D", "-", "-o"])
        .arg(out)
        .args(["-w", "\ncode=%{http_code}"]);
    if let Some(r) = range {
        c.args(["-r", r]);
    }
    let o = run(c.arg("http://10.79.0.2/f.bin"));
    assert!(
        o.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let code = text
        .rsplit("code=")
        .next()
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0);
    (code, fs::read(out).unwrap_or_default(), text)
}

fn ranges_against_curl(tag: &str, extra: &[&str]) {
    let d = tmpdir(tag);
    let www = d.join("www");
    fs::create_dir_all(&www).unwrap();
    let len = 3 * 1024 * 1024 + 7;
    let body = data(len);
    fs::write(www.join("f.bin"), &body).unwrap();
    let mut ns = tap_netns();
    ns.serve(&www, extra, &d.join("serve.log"));
    let out = d.join("out.bin");
    let (code, got, head) = curl(&ns, None, &out);
    assert_eq!(code, 200);
    assert!(got == body, "whole file differs");
    assert!(head.contains("Accept-Ranges: bytes"), "{head}");
    let cases: [(&str, std::ops::Range<usize>); 5] = [
        ("0-0", 0..1),
        ("100-", 100..len),
        ("-4097", len - 4097..len),
        ("4095-2000000", 4095..2000001),
        ("1048576-99999999", 1048576..len),
    ];
    for (r, want) in cases {
        let (code, got, head) = curl(&ns, Some(r), &out);
        assert_eq!(code, 206, "-r {r}: {head}");
        assert!(got == body[want.clone()], "-r {r}: bytes differ");
        let cr = format!("Content-Range: bytes {}-{}/{len}", want.start, want.end - 1);
        assert!(head.contains(&cr), "-r {r}: want {cr} in {head}");
    }
    let (code, _, head) = curl(&ns, Some(&format!("{len}-")), &out);
    assert_eq!(code, 416, "{head}");
    assert!(
        head.contains(&format!("Content-Range: bytes */{len}")),
        "{head}"
    );
    drop(ns);
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn tap_kernel_curl_ranges_from_send_file() {
    if have_root() {
        ranges_against_curl("plain", &[]);
    }
}

#[test]
fn tap_kernel_curl_ranges_from_send_file_under_loss() {
    if have_root() {
        ranges_against_curl(
            "loss",
            &["--impair", "loss=0.02,reorder=0.02", "--seed", "5"],
        );
    }
}
