//! Files over HTTP between two simulated engines, both ends zero-copy: the server sends with
//! `send_file` (whole files and `Range` requests: 206, 416, `Accept-Ranges`), the client
//! receives into a file with `recv_to_file` — byte-exact, also over an impaired link.

use flowstack_api::app::{App, Progress};
use flowstack_apps::get::{GetSpec, HttpGet, Url};
use flowstack_apps::serve::{ServeSpec, Server, Service};
use flowstack_link::impair::ImpairSpec;
use flowstack_runtime::sim::run_apps;
use flowstack_stack::netsim::{Net, NetConfig, B_IP};
use flowstack_stack::FILE_CHUNK;
use flowstack_wire::Duration;
use std::io::Read;
use std::path::PathBuf;

/// A served directory with `f.bin` of `len` pseudo-random bytes; removed on drop.
struct Root(PathBuf, Vec<u8>);

impl Root {
    fn new(tag: &str, len: usize) -> Root {
        let d = std::env::temp_dir().join(format!("fs-fserve-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mut x: u32 = 0x1234_5679;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        std::fs::write(d.join("f.bin"), &data).unwrap();
        Root(d, data)
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn net(impair: &str, seed: u64) -> Net {
    let cfg = NetConfig {
        impair: impair.parse::<ImpairSpec>().unwrap(),
        seed,
        ..Default::default()
    };
    Net::new(cfg, None).unwrap()
}

fn server(net: &mut Net, root: &Root) -> Server {
    let spec = ServeSpec {
        service: Service::Http {
            root: root.0.clone(),
        },
        port: 80,
        backlog: 16,
    };
    Server::listen(&mut net.b, spec).unwrap()
}

fn spec(range: Option<&str>) -> GetSpec {
    let url = Url::parse(&format!("http://{B_IP}/f.bin")).unwrap();
    let mut s = GetSpec::for_url(&url, Duration::from_secs(30));
    if let Some(r) = range {
        s.request.headers.push(("Range".into(), r.into()));
    }
    s
}

/// GET into a file with `recv_to_file`; (status, body).
fn get_to_file(net: &mut Net, srv: &mut Server, spec: GetSpec, tag: &str) -> (u16, Vec<u8>) {
    let p = std::env::temp_dir().join(format!("fs-fserve-out-{}-{tag}", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    let mut get = HttpGet::new(spec, std::io::sink()).body_file(f);
    assert!(run_apps(net, Duration::from_secs(600), &mut get, srv));
    let status = get.head().map(|h| h.status).unwrap();
    let (_, r) = get.into_parts();
    r.unwrap().unwrap();
    let mut body = Vec::new();
    std::fs::File::open(&p)
        .unwrap()
        .read_to_end(&mut body)
        .unwrap();
    std::fs::remove_file(&p).unwrap();
    (status, body)
}

/// GET into memory; (status, body, response head as text).
fn get_mem(net: &mut Net, srv: &mut Server, spec: GetSpec) -> (u16, Vec<u8>) {
    let mut get = HttpGet::new(spec, Vec::new());
    assert!(run_apps(net, Duration::from_secs(600), &mut get, srv));
    let status = get.head().map(|h| h.status).unwrap();
    let (body, r) = get.into_parts();
    r.unwrap().unwrap();
    (status, body)
}

#[test]
fn whole_files_both_ends_zero_copy_byte_exact() {
    let page = 4096;
    for (i, len) in [0, 1, page - 1, page + 1, 3 * FILE_CHUNK + 5]
        .into_iter()
        .enumerate()
    {
        let root = Root::new(&format!("whole{i}"), len);
        for (impair, seed) in [("", 1), ("loss=0.02,reorder=0.02,dup=0.01", 3)] {
            let mut n = net(impair, seed);
            let mut srv = server(&mut n, &root);
            let (status, body) = get_to_file(&mut n, &mut srv, spec(None), &format!("w{i}"));
            assert_eq!(status, 200);
            assert!(body == root.1, "len {len} {impair}: bytes differ");
        }
    }
}

#[test]
fn ranges_are_answered_206_or_416() {
    let len = 2 * FILE_CHUNK + 999;
    let root = Root::new("ranges", len);
    let mut n = net("loss=0.01", 9);
    let mut srv = server(&mut n, &root);
    let cases: [(&str, u16, std::ops::Range<usize>); 6] = [
        ("bytes=0-0", 206, 0..1),
        ("bytes=100-", 206, 100..len),
        ("bytes=-4097", 206, len - 4097..len),
        ("bytes=4095-300000", 206, 4095..300001),
        ("bytes=5-9999999", 206, 5..len),
        ("bytes=0-1,5-6", 200, 0..len),
    ];
    for (i, (r, code, want)) in cases.into_iter().enumerate() {
        let (status, body) = get_to_file(&mut n, &mut srv, spec(Some(r)), &format!("r{i}"));
        assert_eq!(status, code, "{r}");
        assert!(body == root.1[want], "{r}: bytes differ");
    }
    let (status, body) = get_mem(&mut n, &mut srv, spec(Some(&format!("bytes={len}-"))));
    assert_eq!((status, body.len()), (416, 0));
}

/// Range answers keep the connection alive and the server serving.
#[test]
fn the_engine_server_keeps_serving_after_ranges() {
    let root = Root::new("after", FILE_CHUNK + 1);
    let mut n = net("", 4);
    let mut srv = server(&mut n, &root);
    for i in 0..3 {
        let (status, body) = get_mem(&mut n, &mut srv, spec(Some("bytes=1-")));
        assert_eq!((status, body.as_slice()), (206, &root.1[1..]), "round {i}");
    }
    run_apps(&mut n, Duration::from_secs(5), &mut Idle, &mut srv);
    assert_eq!(srv.open_connections(), 0);
    assert_eq!(srv.totals().requests, 3);
}

struct Idle;
impl<S: flowstack_api::Sockets + ?Sized> App<S> for Idle {
    fn poll(&mut self, _: flowstack_wire::Instant, _: &mut S) -> Progress {
        Progress::Idle
    }
}
