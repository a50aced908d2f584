//! Memory at rest through the daemon: a keep-alive connection that sent a file
//! (`sendfile`, the engine's zero-copy chunks) or bulk zero-copy spans from the transmit
//! area gives its send buffers back once quiet (`REST_AFTER`), although the daemon never
//! takes those sends' completion tokens. Seen through the `FlowstackdTcpAccountedBytes`
//! gauge of `flowstack stats`. And the client's own zero-copy tokens, counted the same way.
//! Private socket paths, bounded waits.

mod common;
use common::*;
use flowstack_client::posix::{Posix, RecvFlags, Type};
use flowstack_client::Client;
use flowstack_offload::stats;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

fn counter(path: &Path, name: &str) -> u64 {
    stats::query(path).unwrap().counters[name]
}

/// What the engines' socket tables hold, once it is at most `limit` (polled, bounded by
/// [`T`]); the last value seen otherwise.
fn accounted_down_to(path: &Path, limit: u64) -> u64 {
    let start = Instant::now();
    loop {
        let now = counter(path, "FlowstackdTcpAccountedBytes");
        if now <= limit || start.elapsed() > T {
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Slack over the just-opened baseline that two connections at rest may keep (RACK's and
/// congestion avoidance's state, a few hundred bytes each); any send buffer is more.
const REST_SLACK: u64 = 2048;

#[test]
fn a_keep_alive_connection_that_sent_a_file_gives_its_buffers_back() {
    let d = daemon("rest-file", 1, false);
    let server = Posix::attach(&d.path).unwrap();
    let client = Posix::attach(&d.path).unwrap();
    let (_la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 16, None).unwrap();
    let (_ca, cid) = client.socket(Type::Stream).unwrap();
    client.connect(cid, lo(port), false, Some(T)).unwrap();
    let (_sa, sid, _, _) = server.accept(lid, false, Some(T)).unwrap();
    let opened = counter(&d.path, "FlowstackdTcpAccountedBytes");
    let len = (2 << 20) + 4321;
    let path = sock_path("rest-file-data").with_file_name("f");
    let data: Vec<u8> = (0..len).map(pattern).collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
    let got = std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut out = vec![0u8; len];
            let mut n = 0;
            while n < len {
                let k = client
                    .recv(cid, &mut out[n..], RecvFlags::BLOCK, Some(T))
                    .unwrap();
                assert!(k > 0, "early end of stream at {n}");
                n += k;
            }
            out
        });
        let n = server
            .send_file(sid, f.as_fd(), 0, len, false, Some(T))
            .unwrap();
        assert_eq!(n, len);
        r.join().unwrap()
    });
    assert!(got == data, "bytes differ");
    assert_eq!(counter(&d.path, "FlowstackdSendFileBytes"), len as u64);
    // Both connections stay open (keep-alive) and quiet.
    let rest = accounted_down_to(&d.path, opened + REST_SLACK);
    eprintln!("accounted: {opened} B just opened, {rest} B at rest after the file");
    assert!(
        rest <= opened + REST_SLACK,
        "the connections kept {} B over their opened size",
        rest - opened
    );
}

#[test]
fn a_keep_alive_connection_that_sent_zero_copy_spans_gives_its_buffers_back() {
    let d = daemon("rest-txzc", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7591).unwrap();
    let c = cli.connect_to(lo(7591), T).unwrap();
    let a = srv.accept(l, T).unwrap();
    let opened = counter(&d.path, "FlowstackdTcpAccountedBytes");
    let len = 1 << 20;
    let data: Vec<u8> = (0..len).map(pattern).collect();
    let got = std::thread::scope(|s| {
        let r = s.spawn(|| recv_exact(&mut srv, a, len));
        for k in data.chunks(128 << 10) {
            cli.send_all(c, k, T).unwrap();
        }
        r.join().unwrap()
    });
    assert!(got == data, "bytes differ");
    assert!(
        counter(&d.path, "FlowstackdTxZcBytes") >= len as u64 / 2,
        "the bulk went the copy path: nothing to show"
    );
    let rest = accounted_down_to(&d.path, opened + REST_SLACK);
    eprintln!("accounted: {opened} B just opened, {rest} B at rest after the spans");
    assert!(
        rest <= opened + REST_SLACK,
        "the connections kept {} B over their opened size",
        rest - opened
    );
}

/// The client's `Sockets::tcp_send_zc` copies into the transmit area, so its tokens are done
/// at once; like the engine's, they count from 0 per connection and are reported in order,
/// and not taking them costs nothing (two counters per connection, not a list).
#[test]
fn the_clients_zero_copy_tokens_count_per_connection_like_the_engines() {
    use flowstack_api::Sockets;
    let d = daemon("rest-tokens", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7592).unwrap();
    let c = cli.connect_to(lo(7592), T).unwrap();
    let a = srv.accept(l, T).unwrap();
    let buf: std::sync::Arc<[u8]> = (0..1000).map(pattern).collect();
    let tokens: Vec<u64> = (0..3)
        .map(|_| cli.tcp_send_zc(c, buf.clone()).unwrap())
        .collect();
    assert_eq!(tokens, [0, 1, 2]);
    assert_eq!(cli.tcp_zc_completion(c), Some(0));
    assert_eq!(cli.tcp_send_zc(c, buf.clone()), Ok(3));
    let done: Vec<u64> = std::iter::from_fn(|| cli.tcp_zc_completion(c)).collect();
    assert_eq!(done, [1, 2, 3]);
    let got = recv_exact(&mut srv, a, 4 * buf.len());
    assert!(got.chunks(buf.len()).all(|k| *k == *buf), "bytes differ");
}
