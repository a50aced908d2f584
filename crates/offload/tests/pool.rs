//! Placeholder pairs handed to the daemon in batches (`flowstack_client::posix`'s `pool`,
//! `Attach{Pool}`) and recycled (`Forget { recycle }`, `Attach{Repool}`): a process's
//! sockets take pooled pairs, the pool refills a batch at a time, a pooled placeholder's
//! last close still reaches the daemon, a forked child's copies of pooled pairs leave
//! nothing behind in the daemon, and a closed connection's pair comes back, empty, for a
//! later socket unless another process may hold it. Every wait is bounded.

use flowstack_api::record::POOL_BATCH;

/// Pooling is on unless `FLOWSTACK_PLACEHOLDER_POOL=0`; made sure of before this process's
/// first socket (read once), the same value in every test of this binary.
fn pooling_on() {
    std::env::set_var("FLOWSTACK_PLACEHOLDER_POOL", "1");
}
use flowstack_client::posix::{Errno, Posix, RecvFlags, SockId, Type};
use flowstack_offload::{Daemon, DaemonConfig, DaemonHandle};
use flowstack_sys::process::{exit_now, fork, wait_exit, Forked};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(20));

fn daemon(name: &str) -> DaemonHandle {
    let dir = std::env::temp_dir().join(format!("flowstack-pool-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        ..DaemonConfig::default()
    })
    .unwrap()
}

/// A server process listening on the loopback and a client process: (server, client, the
/// listener's placeholder, its id, its port).
fn listening(d: &DaemonHandle) -> (Posix, Posix, std::os::fd::OwnedFd, SockId, u16) {
    let server = Posix::attach(&d.path).unwrap();
    let client = Posix::attach(&d.path).unwrap();
    let (la, l) = server.socket(Type::Stream).unwrap();
    let port = server
        .bind(l, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .unwrap();
    server.listen(l, 16, None).unwrap();
    (server, client, la, l, port)
}

fn counter(d: &DaemonHandle, k: &str) -> u64 {
    flowstack_offload::stats::query(&d.path).unwrap().counters[k]
}

/// Queries the daemon's counters until `k` is `want` (bounded: 20 s).
fn until(d: &DaemonHandle, k: &str, want: u64) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let v = counter(d, k);
        if v == want {
            return;
        }
        assert!(Instant::now() < end, "{k} is {v}, want {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sockets_take_pooled_pairs_refilled_a_batch_at_a_time() {
    pooling_on();
    let d = daemon("batches");
    let app = Posix::attach(&d.path).unwrap();
    let b = POOL_BATCH as usize;
    let socks: Vec<_> = (0..2 * b + 1)
        .map(|_| app.socket(Type::Stream).unwrap())
        .collect();
    // A sync call behind the posted attaches: the daemon has taken them all.
    assert!(!app
        .carries(SocketAddrV4::new(Ipv4Addr::new(10, 9, 9, 9), 1))
        .unwrap());
    let s = flowstack_offload::stats::query(&d.path).unwrap();
    assert_eq!(
        s.counters["FlowstackdPlaceholderBatches"], 3,
        "{:?}",
        s.counters
    );
    assert_eq!(s.counters["FlowstackdPlaceholdersPooled"], 3 * b as u64);
    assert_eq!(s.counters["FlowstackdPlaceholdersWaiting"], b as u64 - 1);
    assert_eq!(s.counters["FlowstackdTableSockets"], 2 * b as u64 + 1);
    assert_eq!(s.counters["FlowstackdTableIdents"], 2 * b as u64 + 1);
    // Every socket's placeholder is its own (one identity each, above) and usable.
    for (_, id) in &socks {
        assert_eq!(
            app.bind(*id, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
                .err(),
            None
        );
    }
    // The last close of a pooled placeholder another process may hold (pinned, as one sent
    // with SCM_RIGHTS) reaches the daemon when the program's number and the library's copy
    // are closed: the daemon closes the socket, and the pair is not recycled.
    let mut socks = socks.into_iter();
    let (a, id) = socks.next().unwrap();
    app.pin(id);
    app.forget(id).unwrap();
    drop(a);
    until(&d, "FlowstackdLastCloses", 1);
    until(&d, "FlowstackdTableSockets", 2 * b as u64);
    assert_eq!(counter(&d, "FlowstackdPlaceholdersRecycled"), 0);
    // One nothing else holds is closed at once and its pair kept (the program's number
    // closes after the library forgot it, as the shim's close does).
    let (a, id) = socks.next().unwrap();
    app.forget(id).unwrap();
    drop(a);
    until(&d, "FlowstackdPlaceholdersRecycled", 1);
    until(&d, "FlowstackdTableSockets", 2 * b as u64 - 1);
    assert_eq!(counter(&d, "FlowstackdLastCloses"), 1);
}

/// Sockets until one's placeholder is the pair with identity `ident` (bounded: two
/// batches' worth); returns it and the sockets made before it.
fn socket_on_pair(
    app: &Posix,
    ident: (u64, u64),
) -> (
    (std::os::fd::OwnedFd, SockId),
    Vec<(std::os::fd::OwnedFd, SockId)>,
) {
    let mut before = Vec::new();
    for _ in 0..2 * POOL_BATCH {
        let s = app.socket(Type::Stream).unwrap();
        if identity(&s.0) == ident {
            return (s, before);
        }
        before.push(s);
    }
    panic!("no socket got the recycled pair {ident:?}");
}

fn identity(fd: &std::os::fd::OwnedFd) -> (u64, u64) {
    flowstack_sys::placeholder::identity(fd.as_fd()).unwrap()
}

#[test]
fn a_closed_connections_pair_carries_the_next_connection() {
    pooling_on();
    let d = daemon("recycle");
    let (server, client, _la, l, port) = listening(&d);
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let (ca, c) = client.socket(Type::Stream).unwrap();
    let ident = identity(&ca);
    client.connect(c, to, false, T).unwrap();
    let (_sa, s, _, _) = server.accept(l, false, T).unwrap();
    assert_eq!(client.send(c, b"first", false, T).unwrap(), 5);
    let mut buf = [0u8; 16];
    let n = server.recv(s, &mut buf, RecvFlags::BLOCK, T).unwrap();
    assert_eq!(&buf[..n], b"first");
    // The client closes: the daemon closes the connection at once (FIN) and keeps the pair.
    client.forget(c).unwrap();
    drop(ca);
    assert_eq!(server.recv(s, &mut buf, RecvFlags::BLOCK, T), Ok(0), "FIN");
    until(&d, "FlowstackdPlaceholdersRecycled", 1);
    // A later socket of the client gets the same pair back (after the rest of its batch)
    // and carries a new connection both ways; nothing stale makes it readable early.
    let ((ra, r), _before) = socket_on_pair(&client, ident);
    // Its `Attach{Repool}` is posted, not waited for: the daemon moves it back soon.
    until(&d, "FlowstackdPlaceholdersKept", 0);
    client.connect(r, to, false, T).unwrap();
    let (_sb, s2, _, _) = server.accept(l, false, T).unwrap();
    assert!(!flowstack_sys::poll::wait_readable(&ra, Duration::ZERO).unwrap());
    assert_eq!(server.send(s2, b"second", false, T).unwrap(), 6);
    let n = client.recv(r, &mut buf, RecvFlags::BLOCK, T).unwrap();
    assert_eq!(&buf[..n], b"second");
    assert_eq!(client.send(r, b"back", false, T).unwrap(), 4);
    let n = server.recv(s2, &mut buf, RecvFlags::BLOCK, T).unwrap();
    assert_eq!(&buf[..n], b"back");
}

/// A kept pair stays in the daemon's watch set (no `epoll_ctl` per socket): when a later
/// socket on it is closed by its last copy anywhere (pinned: another process may hold it),
/// the daemon still sees that and closes the socket; nothing is reported that no socket or
/// pool holds.
#[test]
fn a_recycled_pairs_last_close_is_still_seen() {
    pooling_on();
    let d = daemon("rewatch");
    let app = Posix::attach(&d.path).unwrap();
    let (a, id) = app.socket(Type::Stream).unwrap();
    let ident = identity(&a);
    app.forget(id).unwrap();
    drop(a);
    until(&d, "FlowstackdPlaceholdersRecycled", 1);
    let ((ra, r), before) = socket_on_pair(&app, ident);
    let open = before.len() as u64 + 1;
    until(&d, "FlowstackdTableSockets", open);
    app.pin(r);
    app.forget(r).unwrap();
    drop(ra);
    until(&d, "FlowstackdLastCloses", 1);
    until(&d, "FlowstackdTableSockets", open - 1);
    assert_eq!(counter(&d, "FlowstackdPlaceholdersRecycled"), 1);
    assert_eq!(counter(&d, "FlowstackdLooseHangups"), 0);
}

#[test]
fn recycled_pairs_go_back_to_the_pool_a_batch_at_a_time() {
    pooling_on();
    let d = daemon("repool");
    let app = Posix::attach(&d.path).unwrap();
    let n = 4 * POOL_BATCH as u64;
    for i in 1..=n {
        let (a, id) = app.socket(Type::Stream).unwrap();
        app.forget(id).unwrap();
        drop(a);
        // The daemon's answer is in before the next socket looks for it.
        until(&d, "FlowstackdPlaceholdersRecycled", i);
    }
    let repools = counter(&d, "FlowstackdPlaceholderRepools");
    // One per socket before batching (31 here); now one per POOL_BATCH closed sockets.
    assert!(
        (1..=n / POOL_BATCH as u64 + 1).contains(&repools),
        "{repools} repools for {n} closed sockets"
    );
    // The recycled pairs were used again: one fresh batch, two at most.
    assert!(counter(&d, "FlowstackdPlaceholderBatches") <= 2);
}

#[test]
fn a_recycled_pair_that_held_a_token_comes_back_empty() {
    pooling_on();
    let d = daemon("token");
    let (server, client, _la, l, port) = listening(&d);
    let (_ca, c) = client.socket(Type::Stream).unwrap();
    client
        .connect(c, SocketAddrV4::new(Ipv4Addr::LOCALHOST, port), false, T)
        .unwrap();
    let (sa, s, _, _) = server.accept(l, false, T).unwrap();
    let ident = identity(&sa);
    assert_eq!(client.send(c, b"unread", false, T).unwrap(), 6);
    // Bytes the server never reads: the daemon writes a token into its placeholder.
    assert!(flowstack_sys::poll::wait_readable(&sa, Duration::from_secs(20)).unwrap());
    server.forget(s).unwrap();
    drop(sa);
    until(&d, "FlowstackdPlaceholdersRecycled", 1);
    // The server's next sockets: the pair comes back with its token taken out.
    let ((ra, _r), _before) = socket_on_pair(&server, ident);
    assert!(!flowstack_sys::poll::wait_readable(&ra, Duration::ZERO).unwrap());
}

#[test]
fn sockets_alive_at_a_fork_are_not_recycled() {
    pooling_on();
    let d = daemon("settled");
    let app = Posix::attach(&d.path).unwrap();
    let (a, id) = app.socket(Type::Stream).unwrap();
    // What the shim's fork and exec call first: a child may hold A now.
    app.settle();
    app.forget(id).unwrap();
    drop(a);
    until(&d, "FlowstackdLastCloses", 1);
    assert_eq!(counter(&d, "FlowstackdPlaceholdersRecycled"), 0);
    assert_eq!(counter(&d, "FlowstackdTableSockets"), 0);
}

#[test]
fn a_pooled_connection_carries_bytes_and_its_last_close_is_a_fin() {
    pooling_on();
    let d = daemon("conn");
    let (server, client, _la, l, port) = listening(&d);
    let (ca, c) = client.socket(Type::Stream).unwrap();
    client
        .connect(c, SocketAddrV4::new(Ipv4Addr::LOCALHOST, port), false, T)
        .unwrap();
    // The accepted connection's placeholder is pooled too (`PlacePooled`).
    let (_sa, s, _, _) = server.accept(l, false, T).unwrap();
    assert_eq!(client.send(c, b"pooled", false, T).unwrap(), 6);
    let mut buf = [0u8; 16];
    let n = server.recv(s, &mut buf, RecvFlags::BLOCK, T).unwrap();
    assert_eq!(&buf[..n], b"pooled");
    assert!(
        counter(&d, "FlowstackdPlaceholderBatches") >= 2,
        "both processes pooled"
    );
    client.forget(c).unwrap();
    drop(ca);
    assert_eq!(server.recv(s, &mut buf, RecvFlags::BLOCK, T), Ok(0), "FIN");
}

#[test]
fn a_forked_child_with_pooled_pairs_leaves_nothing_in_the_daemon() {
    pooling_on();
    let d = daemon("fork");
    let app = Posix::attach(&d.path).unwrap();
    let (a, id) = app.socket(Type::Stream).unwrap();
    app.settle();
    let b = POOL_BATCH as u64;
    assert_eq!(counter(&d, "FlowstackdPlaceholdersWaiting"), b - 1);
    match fork().unwrap() {
        Forked::Child => {
            // The child inherited the pooled A's: it closes its copies as it forgets its
            // parent's client, registers anew and pools for itself.
            let ok = app.socket(Type::Stream).is_ok() && app.socket(Type::Stream).is_ok();
            exit_now(if ok { 0 } else { 1 });
        }
        Forked::Parent(pid) => {
            assert_eq!(wait_exit(pid).unwrap(), 0, "child failed");
            // The child's application is gone with its sockets and its pool; the parent's
            // pool and socket are untouched (the child closed only its own copies).
            until(&d, "FlowstackdApps", 1);
            let s = flowstack_offload::stats::query(&d.path).unwrap();
            assert_eq!(s.counters["FlowstackdPlaceholdersWaiting"], b - 1);
            assert_eq!(s.counters["FlowstackdTableSockets"], 1, "{:#?}", s.sockets);
            assert_eq!(s.counters["FlowstackdTableIdents"], 1);
            // The parent goes on taking from its pool.
            let more: Vec<_> = (0..b).map(|_| app.socket(Type::Stream).unwrap()).collect();
            assert_eq!(
                app.bind(more[0].1, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
                    .err(),
                None
            );
            assert_eq!(counter(&d, "FlowstackdTableSockets"), 1 + b);
            assert!(a.as_fd().try_clone_to_owned().is_ok());
            assert_ne!(
                app.bind(id, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)),
                Err(Errno::EBADF)
            );
        }
    }
}
