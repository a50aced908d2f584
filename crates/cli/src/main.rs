//! `flowstack`: a user-space TCP/IP stack and the tools that show what it does.

mod demo;
mod demo_tcp;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// flowstack — a user-space TCP/IP stack in Rust.
///
/// flowstack runs Ethernet, ARP, IPv4, ICMP, UDP and TCP in user space, one shared-nothing
/// engine per core. This command runs the stack's demonstration and tools.
///
/// EXIT STATUS: 0 on success, 1 when the job fails (e.g. data did not verify), 2 on misuse.
#[derive(Parser, Debug)]
#[command(name = "flowstack", version, about, long_about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two engines in one process over an in-process link: ARP, ping, UDP echo, a verified TCP
    /// bulk transfer and an HTTP/1.1 exchange, then a report.
    ///
    /// Needs no privileges. The link can be impaired (loss, reordering, duplication,
    /// corruption, delay) from a seeded generator, so every run with the same --seed is the
    /// same run; --pcap records host A's side of the link for tcpdump or Wireshark.
    Demo(demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // Misuse: one line naming what was wrong, exit 2.
            let msg = e.to_string();
            let first = msg
                .lines()
                .next()
                .unwrap_or("invalid usage")
                .trim_start_matches("error: ");
            eprintln!("flowstack: {first} (see 'flowstack --help')");
            return ExitCode::from(2);
        }
    };
    match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
    }
}
