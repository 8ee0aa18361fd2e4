//! Ranks of a tensor-parallel pool as threads of one test, meeting over TCP on loopback.

#![allow(dead_code)] // each test binary uses part of this module

use std::net::TcpListener;
use std::time::Duration;

use ferrite_collective::Collective;
use ferrite_collective::tcp::{JoinLimits, PoolKey, TcpCollective};
use ferrite_engine::tp::TpRank;

pub const TIMEOUT: Duration = Duration::from_secs(20);

/// The pool every test forms (epoch 1, no secret).
pub fn key(world: usize) -> PoolKey {
    PoolKey {
        world,
        epoch: 1,
        ..PoolKey::default()
    }
}

/// Runs `body` on every rank of a pool of `world`, one thread each, and returns rank-order
/// results. Each rank has a thread pool of its own, as a rank process does: a forward runs on
/// its process's pool and waits there for the other ranks, so ranks sharing one pool would
/// wait for each other's turn on it.
pub fn on_ranks<T: Send>(
    world: usize,
    body: impl Fn(TpRank, Box<dyn Collective>) -> T + Sync,
) -> Vec<T> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("addr");
    let body = &|tp: TpRank, comm: Box<dyn Collective>| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a rank's thread pool");
        pool.install(|| body(tp, comm))
    };
    std::thread::scope(|s| {
        let followers: Vec<_> = (1..world)
            .map(|rank| {
                s.spawn(move || {
                    let limits = JoinLimits::new(TIMEOUT, TIMEOUT);
                    let c = TcpCollective::join(leader, rank, &key(world), limits).expect("join");
                    body(TpRank { rank, world }, Box::new(c))
                })
            })
            .collect();
        let c = TcpCollective::lead(listener, &key(world), TIMEOUT, TIMEOUT).expect("lead");
        let mut out = vec![body(TpRank { rank: 0, world }, Box::new(c))];
        out.extend(
            followers
                .into_iter()
                .map(|h| h.join().expect("rank thread")),
        );
        out
    })
}
