//! `flowstack sim` end to end: the same seed prints the same table, seed 001 is reproduced,
//! misuse exits 2 with one line, the plot is an SVG with a line per architecture.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flowstack"))
        .arg("sim")
        .args(args)
        .output()
        .expect("runs")
}

#[test]
fn the_same_seed_prints_the_same_table() {
    let args = [
        "--arch",
        "kernel,percore,daemon:2",
        "--workload",
        "rr",
        "--cores",
        "2",
        "--load",
        "50000",
        "--txns",
        "3000",
        "--seed",
        "5",
    ];
    let a = sim(&args);
    let b = sim(&args);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(a.stdout, b.stdout);
    let out = String::from_utf8_lossy(&a.stdout);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("daemon:2")).count(),
        1,
        "{out}"
    );
}

#[test]
fn seed_001_is_reproduced_and_misuse_exits_2() {
    let r = sim(&["--seed001"]);
    assert!(r.status.success());
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(out.contains("reproduced within ±10 points"), "{out}");
    for bad in [
        vec!["--arch", "nic"],
        vec!["--workload", "udp"],
        vec!["--cores", "0"],
        vec!["--plot", "x.png", "--cores", "1,2"],
        vec!["--validate", "--duration", "5", "--runs", "3"],
        vec!["--calibration", "/nonexistent.json"],
    ] {
        let r = sim(&bad);
        assert_eq!(r.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{bad:?}: {err}");
    }
}

#[test]
fn the_cores_plot_has_a_line_per_architecture() {
    let dir = std::env::temp_dir().join(format!("flowstack-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("cores.svg");
    let r = sim(&[
        "--arch",
        "kernel,percore,daemon:c/4",
        "--workload",
        "crr",
        "--cores",
        "1,2,4,8",
        "--txns",
        "2000",
        "--plot",
        p.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let svg = std::fs::read_to_string(&p).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 3);
    assert!(svg.contains("crr: connections/s vs cores"));
    std::fs::remove_dir_all(&dir).unwrap();
}
