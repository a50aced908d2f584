//! Per-application buffer memory (`--max-app-memory`): the bytes an application's sockets
//! hold in the engine's socket buffers — the send queue (unsent and unacknowledged) and the
//! receive queue (received, not yet delivered to its area). Bytes it posted that the engine
//! has not taken yet are not counted: they are bounded by its send credit (`SOCK_SNDBUF` per
//! socket), and counting them could hold a limited application's sends forever.
//!
//! Counted once per turn ([`account`]), as Linux counts `sk_wmem_queued` and
//! `sk_rmem_alloc` against `tcp_mem`. Over the limit, the application is *limited*: new
//! sockets are refused with `ENOBUFS` (`App::at_limit`), and its bytes stay in the daemon's
//! queue instead of entering the engine, so no send credit returns and its sends block (or
//! fail with `EAGAIN`) as a kernel socket's do under memory pressure (`sk_stream_wait_memory`),
//! until acknowledgements and reads bring it back under. Each time an application becomes
//! limited, and each socket refused for it, counts `FlowstackdAppMemLimited`.

use super::*;

/// Most bytes one socket can hold counted: the engine's send and receive buffers. An
/// application whose sockets cannot reach the limit together is not counted at all.
fn socket_max() -> u64 {
    let t = TcpConfig::default();
    t.send_buffer as u64 + t.recv_buffer as u64
}

/// Bytes connection `c` holds in its engine's buffers.
fn held(lo: &Loopback, c: &Conn) -> u64 {
    lo.engines[c.eng]
        .tcp_conn(c.h)
        .map(|k| (k.send_queue() + k.recv_queue()) as u64)
        .unwrap_or(0)
}

/// Recounts the applications' memory and sets their limited state: every application if
/// `all`, else only those limited now (so they are let go as soon as they are under).
/// O(sockets): the engine loop asks for `all` every [`ACCOUNT_GAP`](super::ACCOUNT_GAP),
/// not every turn (an application with thousands of idle connections made each turn
/// count them all). The limit may be passed by what the engines take in that time.
pub(crate) fn account(sh: &mut Shared, apps: &mut [App], all: bool) {
    let limit = sh.max_app_memory;
    let most = socket_max();
    for a in apps.iter_mut() {
        if !all && !a.mem_limited {
            continue;
        }
        if (a.handles.len() as u64).saturating_mul(most) <= limit {
            a.memory = 0;
            unlimit(sh, a);
            continue;
        }
        let mut total = 0u64;
        for gid in a.handles.values() {
            if let Some(GSock {
                kind: Kind::Conn(c),
                holder: Some((app, _)),
                ..
            }) = sh.socks.get(gid)
            {
                if *app == a.id {
                    total += held(&sh.lo, c);
                }
            }
        }
        a.memory = total;
        let over = total > limit;
        if over && !a.mem_limited {
            sh.counters.app_mem_limited += 1;
        }
        if over {
            a.mem_limited = true;
        } else {
            unlimit(sh, a);
        }
    }
}

/// Ends `a`'s limited state; its connections' stalled bytes can move again, so every one is
/// looked at by the next turn (`marks`).
fn unlimit(sh: &mut Shared, a: &mut App) {
    if std::mem::replace(&mut a.mem_limited, false) {
        for &gid in a.handles.values() {
            sh.mark(gid);
        }
    }
}
