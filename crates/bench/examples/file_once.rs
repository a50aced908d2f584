//! One `bench file` transfer, for an instruction profiler:
//! `valgrind --tool=callgrind target/release/examples/file_once read 64M /tmp/f.bin`
//! (methods: `read`, `map`, `rw`, `ksendfile`, `krw`; the file is written if absent).
//! Sender and receiver turns are separate functions (`sender_turn`, `receiver_turn`).

use flowstack_bench::file::{once, Method};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: file_once read|map|rw|ksendfile|krw SIZE PATH");
        std::process::exit(2);
    }
    let method = match args[1].as_str() {
        "read" => Method::FlowstackSendFile,
        "map" => Method::FlowstackSendFileMap,
        "rw" => Method::FlowstackReadWrite,
        "ksendfile" => Method::KernelSendfile,
        "krw" => Method::KernelReadWrite,
        m => {
            eprintln!("unknown method {m}");
            std::process::exit(2);
        }
    };
    let s = args[2].to_ascii_uppercase();
    let (num, mul) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    let Ok(n) = num.parse::<u64>() else {
        eprintln!("bad size {}", args[2]);
        std::process::exit(2);
    };
    match once(std::path::Path::new(&args[3]), n * mul, method) {
        Ok(s) => println!(
            "{}: {:.3} s, {:.2} GiB/s, sender {:.3} s, cpu {:.3} s",
            method.name(),
            s.secs,
            (n * mul) as f64 / (1u64 << 30) as f64 / s.secs,
            s.sender_cpu_s,
            s.total_cpu_s
        ),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
