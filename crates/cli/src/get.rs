//! `flowstack get`: an HTTP/1.1 client on a flowstack instance (Content-Length and chunked
//! bodies).

use crate::net::{open_or_exit, AddrArgs, LinkArgs};
use clap::Args;
use flowstack_link::Device;
use flowstack_runtime::Host;
use flowstack_stack::{SocketError, TcpHandle};
use flowstack_wire::{Duration, Ipv4Address};
use std::io::{IsTerminal, Write};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `flowstack get`.
#[derive(Args, Debug)]
pub struct GetArgs {
    #[command(flatten)]
    link: LinkArgs,
    #[command(flatten)]
    addr: AddrArgs,
    /// URL to fetch: http://IPv4[:PORT]/PATH (no DNS).
    #[arg(value_name = "URL")]
    url: String,
    /// Write the body here instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Seconds without progress before giving up.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u64,
}

/// A parsed `http://` URL.
#[derive(Debug, PartialEq, Eq)]
pub struct Url {
    pub host: Ipv4Address,
    pub port: u16,
    pub path: String,
}

/// Parses `http://A.B.C.D[:PORT][/PATH]`.
pub fn parse_url(u: &str) -> Result<Url, String> {
    let rest = u
        .strip_prefix("http://")
        .ok_or_else(|| format!("'{u}': only http:// URLs are supported"))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().map_err(|_| format!("'{u}': bad port"))?),
        None => (hostport, 80),
    };
    let host = host
        .parse::<Ipv4Address>()
        .map_err(|_| format!("'{u}': host must be an IPv4 address (flowstack has no resolver)"))?;
    if port == 0 {
        return Err(format!("'{u}': port 0"));
    }
    Ok(Url {
        host,
        port,
        path: path.to_string(),
    })
}

pub fn run(a: GetArgs) -> ExitCode {
    let url = match parse_url(&a.url) {
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
    let mut out: Box<dyn Write> = match &a.output {
        Some(p) => match std::fs::File::create(p) {
            Ok(f) => Box::new(std::io::BufWriter::new(f)),
            Err(e) => {
                eprintln!("flowstack: cannot create {}: {e}", p.display());
                return ExitCode::from(1);
            }
        },
        None => Box::new(std::io::stdout().lock()),
    };
    match fetch(&mut host, &url, Duration::from_secs(a.timeout), &mut out) {
        Ok((status, n)) => {
            if let Err(e) = out.flush() {
                eprintln!("flowstack: writing output failed: {e}");
                return ExitCode::from(1);
            }
            if !(200..300).contains(&status) {
                eprintln!("flowstack: server answered {status} ({n} body bytes)");
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("flowstack: get {}: {e}", a.url);
            ExitCode::from(1)
        }
    }
}

/// Reads at least one more byte into `buf`; error on early end of stream.
fn fill<D: Device>(
    host: &mut Host<D>,
    h: TcpHandle,
    buf: &mut Vec<u8>,
    t: Duration,
) -> Result<(), String> {
    let mut tmp = [0u8; 65536];
    match host.recv(h, &mut tmp, t) {
        Ok(0) => Err("connection closed before the response was complete".into()),
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            Ok(())
        }
        Err(SocketError::TimedOut) => Err("timed out waiting for data".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Performs the GET; writes the body to `out`; returns (status, body bytes).
pub fn fetch<D: Device>(
    host: &mut Host<D>,
    url: &Url,
    t: Duration,
    out: &mut dyn Write,
) -> Result<(u16, u64), String> {
    let h = host
        .connect(SocketAddrV4::new(url.host.into(), url.port), t)
        .map_err(|e| e.to_string())?;
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: flowstack\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        url.path, url.host, url.port
    );
    host.send_all(h, req.as_bytes(), t)
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > 64 * 1024 {
            return Err("response header larger than 64 KiB".into());
        }
        fill(host, h, &mut buf, t)?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("malformed status line '{status_line}'"))?;
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("content-length") {
                length = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("bad Content-Length '{v}'"))?,
                );
            } else if k.eq_ignore_ascii_case("transfer-encoding")
                && v.eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            }
        }
    }
    buf.drain(..head_end + 4);
    let progress = std::io::stderr().is_terminal();
    let mut got = 0u64;
    let mut write = |data: &[u8], got: &mut u64| -> Result<(), String> {
        out.write_all(data)
            .map_err(|e| format!("writing output: {e}"))?;
        *got += data.len() as u64;
        if progress {
            match length {
                Some(l) if l > 0 => eprint!(
                    "\r{} / {} bytes ({:.0}%)",
                    got,
                    l,
                    *got as f64 * 100.0 / l as f64
                ),
                _ => eprint!("\r{got} bytes"),
            }
        }
        Ok(())
    };
    if chunked {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                fill(host, h, &mut buf, t)?;
            };
            let size_str = String::from_utf8_lossy(&buf[..line_end]).to_string();
            let size = u64::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| format!("bad chunk size '{size_str}'"))?;
            buf.drain(..line_end + 2);
            if size == 0 {
                break;
            }
            let mut left = size;
            while left > 0 {
                if buf.is_empty() {
                    fill(host, h, &mut buf, t)?;
                }
                let n = (buf.len() as u64).min(left) as usize;
                write(&buf[..n], &mut got)?;
                buf.drain(..n);
                left -= n as u64;
            }
            while buf.len() < 2 {
                fill(host, h, &mut buf, t)?;
            }
            buf.drain(..2);
        }
    } else if let Some(len) = length {
        let n = (buf.len() as u64).min(len) as usize;
        write(&buf[..n], &mut got)?;
        let mut tmp = vec![0u8; 256 * 1024];
        while got < len {
            match host.recv(h, &mut tmp, t) {
                Ok(0) => return Err(format!("connection closed after {got} of {len} body bytes")),
                Ok(k) => {
                    let k = (k as u64).min(len - got) as usize;
                    write(&tmp[..k], &mut got)?
                }
                Err(e) => return Err(format!("after {got} of {len} body bytes: {e}")),
            }
        }
    } else {
        // No length: the body runs to end of stream.
        write(&buf, &mut got)?;
        let mut tmp = vec![0u8; 256 * 1024];
        loop {
            match host.recv(h, &mut tmp, t) {
                Ok(0) => break,
                Ok(k) => write(&tmp[..k], &mut got)?,
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    if progress {
        eprintln!();
    }
    let _ = host.engine.tcp_close(h);
    // Let the FIN go out.
    let _ = host.block(Duration::from_millis(200), |e, _| {
        (e.tcp_connections() == 0).then_some(Ok(()))
    });
    Ok((status, got))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("http://10.0.0.1:8080/a/b").unwrap(),
            Url {
                host: Ipv4Address::new(10, 0, 0, 1),
                port: 8080,
                path: "/a/b".into()
            }
        );
        assert_eq!(parse_url("http://10.0.0.1").unwrap().path, "/");
        assert!(parse_url("https://10.0.0.1/").is_err());
        assert!(parse_url("http://example.com/").is_err());
        assert!(parse_url("http://10.0.0.1:0/").is_err());
    }
}
