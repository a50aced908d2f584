//! The `flowstack` and `flowstackd` commands as a library: each module parses one
//! subcommand's arguments and prints; the work is in the other crates.

pub mod bench;
pub mod daemon;
pub mod demo;
pub mod get;
pub mod net;
pub mod ping;
pub mod profile;
pub mod raster;
pub mod run;
pub mod serve;
pub mod serve_cores;
pub mod sim;
pub mod simnet;
pub mod stats;

use clap::Parser;
use std::process::ExitCode;

/// Parses the command line of `prog`. Help and version print and exit 0; misuse prints one
/// line naming what was wrong and exits 2.
pub fn parse_args<P: Parser>(prog: &str) -> Result<P, ExitCode> {
    match P::try_parse() {
        Ok(c) => Ok(c),
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return Err(ExitCode::SUCCESS);
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return Err(ExitCode::from(2));
            }
            let msg = e.to_string();
            let mut lines = msg.lines().map(str::trim).filter(|l| !l.is_empty());
            let mut first = lines
                .next()
                .unwrap_or("invalid usage")
                .trim_start_matches("error: ")
                .to_string();
            // "the following required arguments were not provided:" lists them below.
            if first.ends_with(':') {
                if let Some(next) = lines.next() {
                    first = format!("{first} {next}");
                }
            }
            eprintln!("{prog}: {first} (see '{prog} --help')");
            Err(ExitCode::from(2))
        }
    }
}

/// Log lines (tracing events from the command and the libraries) go to stderr as
/// `flowstack: message key=value...`; levels other than info are named. The level is info
/// unless `RUST_LOG` says otherwise (e.g. `RUST_LOG=debug`, `RUST_LOG=flowstack_apps=debug`).
pub fn init_logging() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO));
    let fmt = tracing_subscriber::fmt::layer()
        .event_format(LogLine)
        .with_writer(std::io::stderr);
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init();
}

/// The format of a log line.
struct LogLine;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for LogLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = *event.metadata().level();
        write!(w, "flowstack: ")?;
        if level != tracing::Level::INFO {
            write!(w, "{}: ", level.as_str().to_ascii_lowercase())?;
        }
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}
