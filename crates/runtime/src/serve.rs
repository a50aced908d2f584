//! Servers on one engine per core (seed 003): every shard listens on the same port of its own
//! engine, behind its own queue of a multi-queue link, and owns the connections the flow hash
//! gives it; outgoing connections use ports that hash back to their shard.

use crate::link::{LinkError, LinkSpec};
use crate::shard::{Placement, Runtime, RuntimeSpec, ShardInfo, StartError};
use crate::steer::Queue;
use crate::xring::RingSpec;
use flowstack_apps::serve::{ServeSpec, Server};
use flowstack_stack::{Engine, Steering};
use std::fmt;

/// Why the servers did not start.
#[derive(Debug)]
pub enum ServeCoresError {
    /// The link's queues could not be opened.
    Link(LinkError),
    /// The runtime (or a shard's server) did not start.
    Start(StartError),
}

impl fmt::Display for ServeCoresError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeCoresError::Link(e) => write!(f, "{e}"),
            ServeCoresError::Start(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ServeCoresError {}

/// Opens `n` queues of `link` and starts one shard per queue, placed by `placement`, each
/// serving `spec` on its own engine (steered: [`Steering`] with its queue index). Stop it
/// with [`Runtime::stop`]/[`Runtime::shutdown`]; each shard's report hands its [`Server`] back.
pub fn serve_on_cores(
    link: &LinkSpec,
    n: usize,
    placement: Placement,
    spec: ServeSpec,
) -> Result<Runtime<Server>, ServeCoresError> {
    let devs = link
        .open_queues_waitable(n)
        .map_err(ServeCoresError::Link)?;
    let addr = link.addr;
    // A queue with a descriptor sleeps in poll(2) on it and on its peers' eventfd: an idle
    // shard uses no CPU; the others sleep in slices.
    let queues = devs
        .into_iter()
        .map(|w| match w.fd {
            Some(fd) => Queue::with_fd(w.dev, fd),
            None => Ok(Queue::boxed(w.dev)),
        })
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| ServeCoresError::Link(LinkError::Device(e)))?;
    Runtime::start(RuntimeSpec {
        placement,
        queues,
        rings: RingSpec::default(),
        engine: move |s: &ShardInfo| {
            let mut c = addr.engine_config();
            c.steering = Some(Steering {
                queue: s.index,
                queues: s.count,
            });
            c
        },
        app: move |_: &ShardInfo, e: &mut Engine| Server::listen(e, spec.clone()),
    })
    .map_err(ServeCoresError::Start)
}
