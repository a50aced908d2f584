//! `flowstack simnet`: seeded network simulations at scale (the scenarios and checks are
//! [`flowstack_stack::simnet`]; this parses and prints).

use clap::Args;
use flowstack_stack::simnet::{replay_command, run_range, run_seed_with, scenario};
use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant as WallClock;

/// Options of `flowstack simnet`.
#[derive(Args, Debug)]
pub struct SimnetArgs {
    /// How many seeds to run (from --first).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        conflicts_with = "seed"
    )]
    seeds: u64,
    /// The first seed of the range.
    #[arg(long, value_name = "S", default_value_t = 0, conflicts_with = "seed")]
    first: u64,
    /// Replay one seed and describe its scenario.
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// With --seed: write host A's view of the link to this pcap file.
    #[arg(long, value_name = "FILE", requires = "seed")]
    pcap: Option<PathBuf>,
}

/// Runs `flowstack simnet`.
pub fn run(a: SimnetArgs) -> ExitCode {
    if let Some(seed) = a.seed {
        return one(seed, a.pcap);
    }
    if a.seeds == 0 {
        eprintln!("flowstack: --seeds must be at least 1");
        return ExitCode::from(2);
    }
    let start = WallClock::now();
    let mut bytes = 0u64;
    let failures = run_range(a.first, a.seeds, |_, r| {
        if let Ok(o) = r {
            bytes += o.bytes;
        }
    });
    for (seed, f) in &failures {
        println!("FAILED {f}");
        println!("  replay: {}", replay_command(*seed));
    }
    println!(
        "simnet: {} seeds ({}..{}), {} passed, {} failed, {:.1} MB verified, {:.1} s",
        a.seeds,
        a.first,
        a.first + a.seeds - 1,
        a.seeds - failures.len() as u64,
        failures.len(),
        bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn one(seed: u64, pcap: Option<PathBuf>) -> ExitCode {
    println!("{}", scenario(seed));
    let writer: Option<Box<dyn std::io::Write>> = match pcap {
        Some(p) => match File::create(&p) {
            Ok(f) => Some(Box::new(BufWriter::new(f))),
            Err(e) => {
                eprintln!("flowstack: cannot create {}: {e}", p.display());
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    match run_seed_with(seed, writer) {
        Ok(o) => {
            println!(
                "ok: {} bytes verified in {:.3} s of virtual time",
                o.bytes,
                o.virtual_time.as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(f) => {
            println!("FAILED {}", f.what);
            ExitCode::from(1)
        }
    }
}
