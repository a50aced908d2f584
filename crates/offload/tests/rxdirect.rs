//! Received bytes go from the frame straight into the holder's receive area (`rxdirect`,
//! one copy in the daemon) because the window the receiving connection offers is the
//! holder's remaining receive credit (`Connection::set_read_limit`): the peer never sends
//! more than the area takes at once, so the engine's receive buffer stays a fallback. A
//! reader slower than the sender, reading in small pieces, still gets every byte direct but
//! those that arrived before its first turn. Fusing is off (two applications' loopback
//! connection would otherwise move to a pipe after 1 MiB). Private socket path, bounded waits.

mod common;
use common::*;
use flowstack_client::Client;

#[test]
fn bulk_receive_goes_straight_into_the_area() {
    const TOTAL: usize = 32 << 20;
    // What the first window (offered before the holder's first turn, the engine's whole
    // receive buffer) may have let into the engine's buffer.
    const FIRST_WINDOW: u64 = 1 << 20;
    // Not fused (`fuse`): the bytes must go through the daemon for this to be seen.
    let d = daemon("rxdirect-bulk", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7571).unwrap();
    let c = cli.connect_to(lo(7571), T).unwrap();
    let s = srv.accept(l, T).unwrap();
    let reader = std::thread::spawn(move || {
        // Small reads: the sender outruns the reader, so the credit runs out again and again.
        let mut buf = vec![0u8; 4096];
        let mut got = 0usize;
        while got < TOTAL {
            let n = srv.recv(s, &mut buf, T).unwrap();
            assert!(n > 0, "early end of stream at {got}");
            for (k, &x) in buf[..n].iter().enumerate() {
                assert_eq!(x, pattern(got + k), "byte {}", got + k);
            }
            got += n;
        }
        srv
    });
    let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
    for k in data.chunks(128 << 10) {
        cli.send_all(c, k, T).unwrap();
    }
    let _srv = reader.join().unwrap();
    let direct = counter(&d.path, "FlowstackdRxDirectBytes");
    assert!(
        direct + FIRST_WINDOW >= TOTAL as u64,
        "only {direct} of {TOTAL} bytes went straight into the area"
    );
    assert!(direct <= TOTAL as u64, "{direct} direct bytes of {TOTAL}");
    cli.close(c, T).unwrap();
}
