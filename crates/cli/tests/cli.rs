//! The `flowstack` command as a user runs it.

mod common;
use common::ok;
use std::path::PathBuf;
use std::process::Command;

fn flowstack() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flowstack"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowstack-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn unknown_flag_exits_2_with_one_line() {
    let out = flowstack()
        .args(["demo", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--no-such-flag"));
}

#[test]
fn bad_impair_spec_exits_2() {
    let out = flowstack()
        .args(["demo", "--impair", "loss=7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("probability"));
}

#[test]
fn help_reads_like_a_man_page() {
    let out = flowstack().arg("--help").output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("EXIT STATUS") && s.contains("demo"));
}

/// Reads a classic pcap file and returns the EtherType of each frame.
fn ethertypes(bytes: &[u8]) -> Vec<u16> {
    assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "pcap magic");
    let mut out = vec![];
    let mut i = 24;
    while i + 16 <= bytes.len() {
        let cap = u32::from_le_bytes(bytes[i + 8..i + 12].try_into().unwrap()) as usize;
        let f = &bytes[i + 16..i + 16 + cap];
        out.push(u16::from_be_bytes([f[12], f[13]]));
        i += 16 + cap;
    }
    assert_eq!(i, bytes.len(), "records tile the file");
    out
}

#[test]
fn demo_pcap_holds_arp_and_ip_and_tcpdump_reads_it() {
    let p = tmp("demo.pcap");
    ok(flowstack().args(["demo", "--pcap"]).arg(&p));
    let types = ethertypes(&std::fs::read(&p).unwrap());
    assert!(types.contains(&0x0806), "ARP frames present");
    assert!(types.contains(&0x0800), "IPv4 frames present");
    match Command::new("tcpdump").arg("-nr").arg(&p).output() {
        Ok(td) => {
            assert!(td.status.success());
            let s = String::from_utf8_lossy(&td.stdout);
            assert!(
                s.contains("ARP, Request who-has 10.0.0.2 tell 10.0.0.1"),
                "{s}"
            );
            assert!(s.contains("ARP, Reply 10.0.0.2 is-at"));
            assert!(s.contains("ICMP echo request"));
        }
        // CI installs tcpdump; a developer machine may not have it.
        Err(e) if std::env::var_os("CI").is_none() => eprintln!("tcpdump not run: {e}"),
        Err(e) => panic!("tcpdump required in CI: {e}"),
    }
}

#[test]
fn demo_under_impairment_is_reproducible() {
    let run = || {
        let out = ok(flowstack().args([
            "demo",
            "--impair",
            "loss=0.05,reorder=0.05,dup=0.02,corrupt=0.01",
            "--seed",
            "9",
        ]));
        let s = String::from_utf8(out.stdout).unwrap();
        // Everything but wall-clock figures is determined by the seed.
        s.lines()
            .filter(|l| !l.contains(" wall"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(run(), run());
}

#[test]
fn profile_covers_every_layer_for_each_size_and_writes_json_and_svg() {
    let json = tmp("p.json");
    let svg = tmp("p.svg");
    let out = ok(flowstack()
        .args([
            "profile",
            "--sizes",
            "100,1440",
            "--samples",
            "300",
            "--json",
        ])
        .arg(&json)
        .arg("--plot")
        .arg(&svg));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("hardware counters:"));
    let j = std::fs::read_to_string(&json).unwrap();
    for size in ["\"size\": 100", "\"size\": 1440"] {
        assert!(j.contains(size), "{size}");
    }
    // Every layer of seed 000's experiment appears in both sizes.
    for layer in common::PROFILE_LAYERS {
        let n = j.matches(&format!("\"layer\": \"{layer}\"")).count();
        assert!(n >= 2, "{layer} appears {n} times");
    }
    for key in [
        "send_with_ack_mbps",
        "receive_without_ack_output_mbps",
        "end_to_end",
        "samples_kept",
        "coverage_percent",
        "\"method\": \"inclusive",
        "in-process link",
    ] {
        assert!(j.contains(key), "{key}");
    }
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.contains("<rect"));
    // One bar per path and size.
    assert_eq!(s.matches("send+ACK ").count(), 2);
    assert_eq!(s.matches(">receive ").count(), 2);
}

#[test]
fn profile_draws_a_png() {
    let png = tmp("p.png");
    ok(flowstack()
        .args(["profile", "--sizes", "100", "--samples", "100", "--plot"])
        .arg(&png));
    let b = std::fs::read(&png).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
    // IHDR: width and height of the chart, 8-bit RGB.
    assert_eq!(&b[12..16], b"IHDR");
    let w = u32::from_be_bytes(b[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(b[20..24].try_into().unwrap());
    assert!(w >= 800 && h >= 100, "{w}x{h}");
    assert_eq!((b[24], b[25]), (8, 2));
}

#[test]
fn profile_rejects_bad_sizes_plot_formats_and_addresses() {
    let out = flowstack()
        .args(["profile", "--sizes", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = flowstack()
        .args(["profile", "--sizes", "2000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = flowstack()
        .args(["profile", "--plot", "x.gif"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    for args in [
        &["profile", "--ip", "10.0.0.2/24", "--peer", "10.0.0.1"][..],
        &["profile", "--tap", "t0", "--ip", "10.0.0.2/24"],
        &[
            "profile",
            "--tap",
            "t0",
            "--ip",
            "10.0.0.2/24",
            "--peer",
            "10.9.0.1",
        ],
        &[
            "profile",
            "--tap",
            "t0",
            "--ip",
            "10.0.0.2/24",
            "--peer",
            "10.0.0.2",
        ],
        &["profile", "--samples", "5"],
    ] {
        let out = flowstack().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn bench_runs_both_peers_and_writes_json_with_speedup() {
    let json = tmp("bench.json");
    let out = ok(flowstack()
        .args([
            "bench",
            "rr",
            "--peer",
            "both",
            "--duration",
            "0.3",
            "--json",
        ])
        .arg(&json));
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(
        s.contains("[flowstack]") && s.contains("[   kernel]"),
        "{s}"
    );
    let j = std::fs::read_to_string(&json).unwrap();
    for key in [
        "\"workload\": \"rr\"",
        "\"flowstack\"",
        "\"kernel\"",
        "\"p50_us\"",
        "\"p99_9_us\"",
        "\"speedup\"",
    ] {
        assert!(j.contains(key), "{key} in {j}");
    }
    assert!(!j.contains("\"speedup\": null"));
}

#[test]
fn bench_crr_on_two_cores_reports_each_core_and_leaks_nothing() {
    use flowstack_prof::report::{from_json, BenchReport, Peer};
    let json = tmp("bench-cores.json");
    let out = ok(flowstack()
        .args(["bench", "crr", "--cores", "2", "--duration", "1", "--json"])
        .arg(&json));
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("core 1 (") && s.contains("summed"), "{s}");
    let r: BenchReport = from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r.cores, Some(2));
    assert!(r.placement.is_some());
    for peer in [Peer::Flowstack, Peer::Kernel] {
        let run = &r.peers[&peer].run_results[0];
        assert_eq!(run.per_core.len(), 2, "{peer:?}");
        assert!(run.transactions > 0, "{peer:?}");
        let sum: u64 = run.per_core.iter().map(|c| c.transactions).sum();
        assert_eq!(sum, run.transactions, "{peer:?}");
    }
    let f = &r.peers[&Peer::Flowstack].run_results[0];
    for c in &f.per_core {
        let e = c.engines.as_ref().expect("flowstack engines per core");
        assert!(e.client.opened > 0);
        assert_eq!(e.client.opened, e.client.closed, "core {}", c.core);
        assert_eq!(e.server.opened, e.server.closed, "core {}", c.core);
        assert_eq!(e.client.opened, e.server.opened, "core {}", c.core);
        assert_eq!(e.client.connections_left + e.server.connections_left, 0);
        assert_eq!(e.client.timers_left + e.server.timers_left, 0);
        assert_eq!(e.misdirected_syns, 0);
        assert_eq!(
            e.client.counters.get("TcpActiveOpens"),
            Some(&e.client.opened)
        );
    }
    let sum = f.summed.as_ref().expect("summed engines");
    assert_eq!(
        sum.client.opened,
        f.per_core
            .iter()
            .map(|c| c.engines.as_ref().unwrap().client.opened)
            .sum::<u64>()
    );
    let k = &r.peers[&Peer::Kernel].run_results[0];
    assert!(k.per_core.iter().all(|c| c.accepted.is_some()));
}

#[test]
fn bench_stream_over_the_pipe_and_crr_complete() {
    let out = ok(flowstack().args([
        "bench",
        "stream",
        "--peer",
        "flowstack",
        "--link",
        "pipe",
        "--duration",
        "0.3",
    ]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(receiver)"));
    ok(flowstack().args([
        "bench",
        "crr",
        "--peer",
        "flowstack",
        "--duration",
        "0.3",
        "--no-tso",
        "--no-checksum-offload",
    ]));
}

#[test]
fn bench_misuse_exits_2() {
    for args in [
        &["bench", "nope"][..],
        &["bench", "rr", "--duration", "0"],
        &["bench", "rr", "--peer", "smoltcp"],
        &["bench", "crr", "--cores", "0"],
    ] {
        let out = flowstack().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
