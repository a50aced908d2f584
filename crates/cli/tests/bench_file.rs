//! `flowstack bench file`: the table and the JSON carry the per-end and CPU-time figures.

mod common;
use common::ok;
use std::process::Command;

#[test]
fn bench_file_prints_cpu_time_ratios_and_writes_them_to_json() {
    let json = std::env::temp_dir().join(format!(
        "flowstack-cli-bench-file-{}.json",
        std::process::id()
    ));
    let out = ok(Command::new(env!("CARGO_BIN_EXE_flowstack"))
        .args([
            "bench", "file", "--size", "1M", "--runs", "1", "--peer", "both", "--json",
        ])
        .arg(&json));
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(
        s.contains("receiver s/GiB") && s.contains("GiB per CPU s"),
        "{s}"
    );
    assert!(s.contains("in CPU time (both ends"), "{s}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert!(
        j["cpu_speedup_over_read_write"].as_f64().unwrap() > 0.0,
        "{j}"
    );
    assert!(j["cpu_speedup"].as_f64().unwrap() > 0.0, "{j}");
    for m in j["methods"].as_array().unwrap() {
        assert!(m["gib_per_cpu_s"].as_f64().unwrap() > 0.0, "{m}");
        let total = m["samples"][0]["total_cpu_s"].as_f64().unwrap();
        assert!(total > 0.0, "{m}");
    }
}
