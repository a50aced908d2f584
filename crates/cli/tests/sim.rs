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
        vec!["--plot", "x.gif", "--cores", "1,2"],
        vec!["--validate", "--duration", "5", "--runs", "3"],
        vec!["--calibration", "/nonexistent.json"],
    ] {
        let r = sim(&bad);
        assert_eq!(r.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{bad:?}: {err}");
    }
}

/// Draws crr's connections/s against 1-8 cores for three architectures into `out`.
fn cores_plot(out: &std::path::Path) {
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
        out.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn the_cores_plot_has_a_line_per_architecture() {
    let dir = std::env::temp_dir().join(format!("flowstack-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("cores.svg");
    cores_plot(&p);
    let svg = std::fs::read_to_string(&p).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 3);
    assert!(svg.contains("crr: connections/s vs cores"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--plot FILE.png` draws the same figure in pixels: a PNG of the SVG's size, each
/// architecture's line in its colour (the SVG's), axis and text ink on white.
#[test]
fn the_cores_plot_as_png_has_each_line_in_its_colour() {
    let dir = std::env::temp_dir().join(format!("flowstack-sim-png-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (p, q) = (dir.join("cores.png"), dir.join("cores.svg"));
    cores_plot(&p);
    cores_plot(&q);
    let svg = std::fs::read_to_string(&q).unwrap();
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&p).unwrap()));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    // The SVG's size.
    let size = format!(r#"width="{}" height="{}""#, info.width, info.height);
    assert!(svg.contains(&size), "{size} not in the SVG's header");
    let px: Vec<[u8; 3]> = buf[..info.buffer_size()]
        .chunks(3)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    let count = |rgb: [u8; 3]| px.iter().filter(|&&p| p == rgb).count();
    // Each polyline's colour (from the SVG) covers pixels: its line, dots and legend.
    let colours: Vec<[u8; 3]> = svg
        .lines()
        .filter(|l| l.starts_with("<polyline"))
        .map(|l| {
            let at = l.find("stroke=\"#").unwrap() + 9;
            let v = u32::from_str_radix(&l[at..at + 6], 16).unwrap();
            [(v >> 16) as u8, (v >> 8) as u8, v as u8]
        })
        .collect();
    assert_eq!(colours.len(), 3);
    for c in colours {
        assert!(count(c) > 200, "{c:?}: {} pixels", count(c));
    }
    assert!(count([0xff, 0xff, 0xff]) > px.len() / 2, "mostly white");
    assert!(count([0x20, 0x20, 0x20]) > 500, "text drawn");
    std::fs::remove_dir_all(&dir).unwrap();
}
