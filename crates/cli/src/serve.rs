//! `flowstack serve`: servers on a flowstack instance — static HTTP files, echo, sink.
//!
//! The server is [`flowstack_apps::serve::Server`], run by the host's drive loop until
//! SIGINT/SIGTERM; then the summary.

use crate::net::{open_or_exit, print_counters, stop_flag, AddrArgs, LinkArgs};
use clap::{Args, Subcommand};
use flowstack_apps::serve::{ServeError, ServeSpec, Server, Service};
use flowstack_stack::Counter;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

/// Options of `flowstack serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    link: LinkArgs,
    #[command(flatten)]
    addr: AddrArgs,
    /// Listen backlog (per engine).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    backlog: usize,
    /// Engines, one per core, each with its own queue of the link (multi-queue TAP or an
    /// AF_PACKET fanout group), its own listener on the port and its own connections.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    cores: u16,
    /// CPUs to pin the engines to, e.g. 0-3 or 0,2 (one per engine; default: the first N
    /// CPUs when there are that many, else unpinned).
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    #[command(subcommand)]
    app: App,
}

#[derive(Subcommand, Debug)]
enum App {
    /// HTTP/1.1 static files: GET and HEAD, keep-alive, streamed bodies.
    Http {
        /// Directory to serve.
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// TCP port.
        #[arg(long, default_value_t = 80)]
        port: u16,
    },
    /// Sends back every byte received.
    Echo {
        /// TCP port.
        #[arg(long, default_value_t = 7)]
        port: u16,
    },
    /// Discards every byte received and reports throughput.
    Sink {
        /// TCP port.
        #[arg(long, default_value_t = 5001)]
        port: u16,
    },
}

impl App {
    fn spec(&self, backlog: usize) -> ServeSpec {
        let (service, port) = match self {
            App::Http { root, port } => (Service::Http { root: root.clone() }, *port),
            App::Echo { port } => (Service::Echo, *port),
            App::Sink { port } => (Service::Sink, *port),
        };
        ServeSpec {
            service,
            port,
            backlog,
        }
    }
}

pub fn run(a: ServeArgs) -> ExitCode {
    if a.cores > 1 || a.cpus.is_some() {
        return crate::serve_cores::run(
            a.cores as usize,
            a.cpus.as_deref(),
            &a.link,
            &a.addr,
            a.app.spec(a.backlog),
            matches!(a.app, App::Sink { .. }),
        );
    }
    let mut host = match open_or_exit(&a.link, &a.addr) {
        Ok(h) => h,
        Err(code) => return code,
    };
    let spec = a.app.spec(a.backlog);
    let mut server = match Server::listen(&mut host.engine, spec) {
        Ok(s) => s,
        Err(ServeError::NotADirectory(root)) => {
            eprintln!("flowstack: --root {} is not a directory", root.display());
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(1);
        }
    };
    let link = a.link.spec(&a.addr).map(|s| s.link.to_string());
    tracing::info!(
        "serving {} on {}:{} ({}); Ctrl-C stops",
        server.service().name(),
        a.addr.ip.addr,
        server.port(),
        link.unwrap_or_default()
    );
    let stop = stop_flag();
    let start = std::time::Instant::now();
    host.run(&mut server, || stop.load(Ordering::Relaxed));
    let gone = flowstack_link::Device::link_down(&host.dev);
    if gone {
        eprintln!("flowstack: the link went away; stopping");
    }
    let secs = start.elapsed().as_secs_f64();
    let t = server.totals();
    let e = &host.engine;
    println!("flowstack serve summary ({secs:.1} s):");
    println!(
        "  connections {}  requests {}  bytes in {}  bytes out {}  retransmissions {}",
        t.conns,
        t.requests,
        t.bytes_in,
        t.bytes_out,
        e.counters().get(Counter::TcpRetransSegs)
    );
    if matches!(a.app, App::Sink { .. }) && secs > 0.0 {
        println!(
            "  sink throughput {:.1} Mbit/s",
            t.bytes_in as f64 * 8.0 / secs / 1e6
        );
    }
    println!("  counters (drops by reason and events):");
    print_counters(e, &mut std::io::stdout());
    if gone {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
