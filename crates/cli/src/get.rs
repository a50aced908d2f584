//! `flowstack get`: an HTTP/1.1 client on a flowstack instance (Content-Length and chunked
//! bodies).
//!
//! The client is [`flowstack_apps::get::HttpGet`], run by the host's drive loop; the
//! download's progress is an `indicatif` bar on stderr when stderr is a terminal.

use crate::net::{open_or_exit, AddrArgs, LinkArgs};
use clap::Args;
use flowstack_api::app::Progress;
use flowstack_apps::get::{GetSpec, HttpGet, Url};
use flowstack_stack::SocketError;
use flowstack_wire::Duration;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `flowstack get`.
#[derive(Args, Debug)]
pub struct GetArgs {
    #[command(flatten)]
    link: LinkArgs,
    #[command(flatten)]
    addr: AddrArgs,
    /// URL to fetch: `http://IPv4[:PORT]/PATH` (no DNS).
    #[arg(value_name = "URL")]
    url: String,
    /// Write the body here instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Seconds without progress before giving up.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u64,
}

pub fn run(a: GetArgs) -> ExitCode {
    let url = match Url::parse(&a.url) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(2);
        }
    };
    let mut host = match open_or_exit(&a.link, &a.addr) {
        Ok(h) => h,
        Err(code) => return code,
    };
    // With -o the body goes straight from the receive buffer to the file (recv_to_file).
    let (out, file): (Box<dyn Write>, _) = match &a.output {
        Some(p) => match std::fs::File::create(p) {
            Ok(f) => (Box::new(std::io::sink()), Some(f)),
            Err(e) => {
                eprintln!("flowstack: cannot create {}: {e}", p.display());
                return ExitCode::from(1);
            }
        },
        None => (Box::new(std::io::stdout().lock()), None),
    };
    let bar = progress_bar();
    let spec = GetSpec::for_url(&url, Duration::from_secs(a.timeout));
    let mut first = true;
    let mut get = HttpGet::new(spec, out);
    if let Some(f) = file {
        get = get.body_file(f);
    }
    let mut get = get.on_progress(|got, len| {
        if std::mem::take(&mut first) {
            match len {
                Some(len) => bar.set_length(len),
                None => bar.set_style(unknown_length_style()),
            }
        }
        bar.set_position(got);
    });
    if host.run(&mut get, || false) != Progress::Done {
        get.abandon(SocketError::LinkDown);
    }
    let (status, n) = (get.head().map(|h| h.status), get.body_bytes());
    let (mut out, result) = get.into_parts();
    if !bar.is_hidden() {
        bar.finish();
    }
    if let Some(Err(e)) = result {
        eprintln!("flowstack: get {}: {e}", a.url);
        return ExitCode::from(1);
    }
    if let Err(e) = out.flush() {
        eprintln!("flowstack: writing output failed: {e}");
        return ExitCode::from(1);
    }
    let status = status.unwrap_or(0);
    if !(200..300).contains(&status) {
        eprintln!("flowstack: server answered {status} ({n} body bytes)");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// The download's progress on stderr; hidden when stderr is not a terminal. Without a
/// Content-Length it shows bytes and rate only.
fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{bytes} / {total_bytes} ({percent}%) {bytes_per_sec} [{wide_bar}] {eta}",
    );
    bar.set_style(style.unwrap_or_else(|_| ProgressStyle::default_bar()));
    bar
}

/// The bar's look for a body of unknown length (chunked, or up to end of stream).
fn unknown_length_style() -> ProgressStyle {
    ProgressStyle::with_template("{bytes} {bytes_per_sec} {elapsed}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}
