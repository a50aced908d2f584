//! The record codec's tests: round trips, rejections, and mutated or random records.
use super::*;
use crate::SocketError;

fn all_commands() -> Vec<Command> {
    let sa = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 8080);
    vec![
        Command::TcpListen {
            port: 80,
            backlog: 128,
        },
        Command::TcpAccept { listener: 3 },
        Command::TcpConnect { remote: sa },
        Command::TcpSend {
            handle: 7,
            offset: 4096,
            len: 1000,
        },
        Command::TcpConsume { handle: 7, len: 99 },
        Command::TcpShutdown { handle: 1 },
        Command::TcpClose { handle: MAX_HANDLE },
        Command::TcpAbort { handle: 2 },
        Command::TcpSetNodelay {
            handle: 2,
            on: true,
        },
        Command::TcpSendFile {
            handle: 2,
            offset: 5 << 30,
            len: 1 << 20,
        },
        Command::FileRelease { handle: 2 },
        Command::Attach {
            handle: 2,
            op: AttachOp::File,
            ty: SockType::Stream,
        },
        Command::UdpBind { port: 0 },
        Command::UdpSendTo {
            handle: 4,
            dst: sa,
            offset: 0,
            len: 512,
        },
        Command::UdpClose { handle: 4 },
        Command::UdpCarries { remote: sa },
        Command::Connect {
            handle: 9,
            remote: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
        },
        Command::Attach {
            handle: 9,
            op: AttachOp::Adopt,
            ty: SockType::Dgram,
        },
        Command::Bind {
            handle: 9,
            local: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 0),
            flags: 0,
        },
        Command::Bind {
            handle: 9,
            local: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 80),
            flags: BIND_REUSEADDR | BIND_REUSEPORT,
        },
        Command::Listen {
            handle: 9,
            backlog: 128,
        },
        Command::Connect {
            handle: 9,
            remote: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 80),
        },
        Command::TokenCleared {
            handle: 9,
            seen: 77,
        },
        Command::WantWritable { handle: 9 },
        Command::SetNotify {
            handle: 9,
            quiet: true,
        },
        Command::SetNotify {
            handle: 9,
            quiet: false,
        },
        Command::Attach {
            handle: 0,
            op: AttachOp::Wake,
            ty: SockType::Stream,
        },
        Command::Forget {
            handle: 9,
            recycle: false,
        },
        Command::Forget {
            handle: 9,
            recycle: true,
        },
        Command::Carries {
            remote: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 6379),
        },
        Command::GetAddr {
            handle: 9,
            peer: true,
        },
        Command::TcpInfo { handle: 9, part: 6 },
        Command::Hold {
            handle: 9,
            how: HoldHow::Take,
        },
        Command::Pipe {
            handle: 9,
            op: PipeOp::Switch,
        },
        Command::Pipe {
            handle: 9,
            op: PipeOp::Kick,
        },
        Command::Hold {
            handle: 9,
            how: HoldHow::Release,
        },
        Command::Report {
            kind: ReportKind::NotCarried as u32,
            dst: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 53), 53),
        },
    ]
}

/// Fuzz-style: many mutations of valid records and of random bytes. Decoding never
/// panics, and whatever it accepts re-encodes to exactly the same 64 bytes (nothing is
/// half-accepted: every byte of an accepted record has a meaning).
#[test]
fn mutated_records_are_rejected_or_exact() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let seeds: Vec<[u8; RECORD_LEN]> = all_commands()
        .into_iter()
        .map(|cmd| {
            let mut b = [0; RECORD_LEN];
            CommandRecord {
                id: 3,
                mode: Mode::Sync,
                cmd,
            }
            .encode(&mut b);
            b
        })
        .collect();
    let (mut accepted, mut rejected) = (0, 0);
    for i in 0..200_000 {
        let mut b = if i % 10 == 0 {
            let mut r = [0u8; RECORD_LEN];
            r.iter_mut().for_each(|v| *v = rnd() as u8);
            r
        } else {
            seeds[(rnd() as usize) % seeds.len()]
        };
        for _ in 0..(1 + rnd() % 3) {
            let at = (rnd() as usize) % RECORD_LEN;
            b[at] = if rnd() % 2 == 0 {
                rnd() as u8
            } else {
                b[at] ^ (1 << (rnd() % 8))
            };
        }
        match CommandRecord::decode(&b) {
            Ok(rec) => {
                accepted += 1;
                let mut again = [0u8; RECORD_LEN];
                rec.encode(&mut again);
                assert_eq!(
                    again, b,
                    "{rec:?} accepted from bytes it does not re-encode to"
                );
            }
            Err(_) => rejected += 1,
        }
    }
    assert!(
        accepted > 1000 && rejected > 1000,
        "{accepted} accepted, {rejected} rejected"
    );
}

#[test]
fn every_command_round_trips() {
    for (i, cmd) in all_commands().into_iter().enumerate() {
        let rec = CommandRecord {
            id: i as u32 * 77,
            mode: if i % 2 == 0 { Mode::Sync } else { Mode::Async },
            cmd,
        };
        let mut b = [0xAA; RECORD_LEN];
        rec.encode(&mut b);
        assert_eq!(CommandRecord::decode(&b), Ok(rec));
    }
}

#[test]
fn garbage_in_any_field_is_rejected_not_trusted() {
    let rec = CommandRecord {
        id: 1,
        mode: Mode::Sync,
        cmd: Command::TcpClose { handle: 5 },
    };
    let mut b = [0; RECORD_LEN];
    rec.encode(&mut b);
    let mut t = b;
    t[0] = 0xEE;
    assert_eq!(CommandRecord::decode(&t), Err(RecordError::UnknownOp(0xEE)));
    let mut t = b;
    t[2] = 9;
    assert_eq!(CommandRecord::decode(&t), Err(RecordError::BadMode(9)));
    let mut t = b;
    t[63] = 1;
    assert_eq!(CommandRecord::decode(&t), Err(RecordError::ReservedNotZero));
    let mut t = b;
    t[field::HANDLE].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        CommandRecord::decode(&t),
        Err(RecordError::BadHandle(u32::MAX))
    );
    // A close that also carries a length: an unused field is not silently ignored.
    let mut t = b;
    t[field::LEN.start] = 1;
    assert_eq!(CommandRecord::decode(&t), Err(RecordError::ReservedNotZero));
    // A span that wraps the address space.
    let send = CommandRecord {
        id: 1,
        mode: Mode::Async,
        cmd: Command::TcpSend {
            handle: 1,
            offset: u64::MAX - 1,
            len: 10,
        },
    };
    send.encode(&mut t);
    assert_eq!(CommandRecord::decode(&t), Err(RecordError::BadSpan));
}

#[test]
fn arbitrary_bytes_never_panic_and_accepted_ones_re_encode_identically() {
    // A small xorshift generator: deterministic, no dependency.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let valid = all_commands();
    let (mut accepted, mut rejected) = (0, 0);
    for round in 0..200_000u32 {
        let mut b = [0u8; RECORD_LEN];
        if round % 4 == 0 {
            // Pure noise.
            for chunk in b.chunks_mut(8) {
                chunk.copy_from_slice(&next().to_le_bytes());
            }
        } else {
            // A valid record with one to three bytes overwritten.
            let cmd = valid[(next() % valid.len() as u64) as usize];
            CommandRecord {
                id: round,
                mode: Mode::Sync,
                cmd,
            }
            .encode(&mut b);
            for _ in 0..1 + next() % 3 {
                let r = next();
                b[(r % RECORD_LEN as u64) as usize] = (r >> 32) as u8;
            }
        }
        match CommandRecord::decode(&b) {
            Ok(r) => {
                accepted += 1;
                let mut again = [0; RECORD_LEN];
                r.encode(&mut again);
                assert_eq!(CommandRecord::decode(&again), Ok(r));
            }
            Err(_) => rejected += 1,
        }
        let _ = EventRecord::decode(&b);
    }
    assert!(accepted > 1000 && rejected > 1000, "{accepted} {rejected}");
}

#[test]
fn events_round_trip_and_carry_errno() {
    let e = EventRecord::completion(9, 3, Err(SocketError::ConnectionRefused));
    let mut b = [0; RECORD_LEN];
    e.encode(&mut b);
    let d = EventRecord::decode(&b).unwrap();
    assert_eq!(d, e);
    assert_eq!(d.outcome(), Err(SocketError::ConnectionRefused));
    let ok = EventRecord::completion(1, 0, Ok(42));
    ok.encode(&mut b);
    assert_eq!(EventRecord::decode(&b).unwrap().outcome(), Ok(42));
    b[0] = 77;
    assert_eq!(EventRecord::decode(&b), Err(RecordError::UnknownOp(77)));
}

#[test]
fn spans_are_checked_against_the_area() {
    assert_eq!(check_span(0, 10, 10), Ok((0, 10)));
    assert_eq!(check_span(1, 10, 10), Err(RecordError::BadSpan));
    assert_eq!(check_span(u64::MAX, 2, 10), Err(RecordError::BadSpan));
}

#[test]
fn file_sends_are_versioned_and_their_ranges_checked() {
    const {
        assert!(
            VERSION >= 3,
            "AttachOp::File and FileRelease came with version 3"
        )
    };
    assert_eq!(
        AttachOp::from_code(AttachOp::File.code()),
        Some(AttachOp::File)
    );
    assert_eq!(AttachOp::File.fds(), 1);
    let mut b = [0; RECORD_LEN];
    let rec = |offset, len| CommandRecord {
        id: 1,
        mode: Mode::Sync,
        cmd: Command::TcpSendFile {
            handle: 3,
            offset,
            len,
        },
    };
    // The end of the range must be a file offset (off_t), as sendfile(2) checks.
    rec(i64::MAX as u64 - 10, 10).encode(&mut b);
    assert!(CommandRecord::decode(&b).is_ok());
    rec(i64::MAX as u64 - 10, 11).encode(&mut b);
    assert_eq!(CommandRecord::decode(&b), Err(RecordError::BadSpan));
    // At most MAX_SPAN per record.
    rec(0, MAX_SPAN + 1).encode(&mut b);
    assert_eq!(CommandRecord::decode(&b), Err(RecordError::BadSpan));
    // The argument field is unused: garbage there is refused.
    rec(0, 1).encode(&mut b);
    b[field::ARG.start] = 1;
    assert_eq!(CommandRecord::decode(&b), Err(RecordError::ReservedNotZero));
}

#[test]
fn notify_modes_are_versioned_and_strict() {
    assert_eq!(
        VERSION, 10,
        "SetNotify and AttachOp::Wake came with version 4, TcpInfo with 5, pools with 6, \
         recycling with 7, Hold and Unheld with 8, pipes with 9, the header's woken word \
         with 10"
    );
    // Hold's argument is one of three ways, nothing else.
    let mut h = [0; RECORD_LEN];
    CommandRecord {
        id: 1,
        mode: Mode::Async,
        cmd: Command::Hold {
            handle: 3,
            how: HoldHow::Release,
        },
    }
    .encode(&mut h);
    assert!(CommandRecord::decode(&h).is_ok());
    h[field::ARG.start] = 3;
    assert_eq!(CommandRecord::decode(&h), Err(RecordError::BadArgument));
    h[field::ARG.start] = 1; // IfFree, gone with version 9
    assert_eq!(CommandRecord::decode(&h), Err(RecordError::BadArgument));
    // A pipe command is one of two, nothing else; the pipe's events round-trip.
    CommandRecord {
        id: 1,
        mode: Mode::Async,
        cmd: Command::Pipe {
            handle: 3,
            op: PipeOp::Kick,
        },
    }
    .encode(&mut h);
    h[field::ARG.start] = 2;
    assert_eq!(CommandRecord::decode(&h), Err(RecordError::BadArgument));
    for kind in [EventKind::Fused, EventKind::PipeOpen, EventKind::PipeNews] {
        let e = EventRecord {
            kind,
            id: 0,
            handle: 4,
            result: FUSED_WRITES_1 | FUSED_OPEN,
            offset: 77,
            len: 1 << 20,
        };
        let mut b = [0; RECORD_LEN];
        e.encode(&mut b);
        assert_eq!(EventRecord::decode(&b), Ok(e));
    }
    for op in [
        AttachOp::Pool,
        AttachOp::NewPooled,
        AttachOp::PlacePooled,
        AttachOp::Repool,
    ] {
        assert_eq!(AttachOp::from_code(op.code()), Some(op));
    }
    assert_eq!(AttachOp::NewPooled.fds(), 0);
    assert_eq!(AttachOp::Repool.fds(), 0);
    assert_eq!(AttachOp::from_code(11), None);
    // Forget's argument is the recycle flag: 0 or 1, nothing else.
    let mut f = [0; RECORD_LEN];
    CommandRecord {
        id: 1,
        mode: Mode::Sync,
        cmd: Command::Forget {
            handle: 3,
            recycle: true,
        },
    }
    .encode(&mut f);
    f[field::ARG.start] = 2;
    assert_eq!(CommandRecord::decode(&f), Err(RecordError::BadArgument));
    assert_eq!(AttachOp::from_code(6), Some(AttachOp::Wake));
    assert_eq!(AttachOp::Wake.fds(), 1);
    let mut b = [0; RECORD_LEN];
    CommandRecord {
        id: 1,
        mode: Mode::Async,
        cmd: Command::SetNotify {
            handle: 3,
            quiet: true,
        },
    }
    .encode(&mut b);
    assert!(CommandRecord::decode(&b).is_ok());
    // Only 0 and 1 are modes.
    b[field::ARG.start] = 2;
    assert_eq!(CommandRecord::decode(&b), Err(RecordError::BadArgument));
}
