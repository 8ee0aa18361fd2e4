//! The TCP backend with ranks as threads of one process (the CLI's `bench collective` runs
//! them as processes): results for 1 to 4 ranks, and the faults that must fail within the
//! timeout naming the rank.

use std::thread;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(5);
const EPOCH: u64 = 7;

fn key(world: usize) -> PoolKey {
    PoolKey {
        world,
        epoch: EPOCH,
        secret: Vec::new(),
    }
}

fn limits(collective: Duration) -> JoinLimits {
    JoinLimits::new(TIMEOUT, collective)
}

/// Runs `body` on every rank of a pool of `world` and returns rank order results.
fn pool<T: Send + 'static>(
    world: usize,
    body: impl Fn(&mut TcpCollective) -> T + Send + Sync + 'static + Clone,
) -> Vec<T> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("addr");
    let mut handles = Vec::new();
    for rank in 1..world {
        let body = body.clone();
        handles.push(thread::spawn(move || {
            let mut c =
                TcpCollective::join(leader, rank, &key(world), limits(TIMEOUT)).expect("join");
            body(&mut c)
        }));
    }
    let mut c = TcpCollective::lead(listener, &key(world), TIMEOUT, TIMEOUT).expect("lead");
    let mut out = vec![body(&mut c)];
    out.extend(handles.into_iter().map(|h| h.join().expect("rank thread")));
    out
}

fn values(rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((rank * 7919 + i) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

#[test]
fn all_reduce_sums_in_rank_order_for_any_world() {
    for world in 1..=4 {
        let n = 1000;
        let results = pool(world, move |c| {
            let mut buf = values(c.rank(), n);
            c.all_reduce_sum(&mut buf).expect("all-reduce");
            buf
        });
        let mut want = values(0, n);
        for r in 1..world {
            for (w, x) in want.iter_mut().zip(values(r, n)) {
                *w += x;
            }
        }
        for (rank, got) in results.iter().enumerate() {
            assert_eq!(got, &want, "world {world}, rank {rank}: bit for bit");
        }
    }
}

#[test]
fn all_gather_broadcast_and_barrier() {
    let results = pool(3, |c| {
        let mut out = vec![0.0; 3 * 4];
        c.all_gather(&values(c.rank(), 4), &mut out)
            .expect("gather");
        let mut plan = if c.rank() == 0 {
            b"step 7".to_vec()
        } else {
            Vec::new()
        };
        c.broadcast(&mut plan).expect("broadcast");
        c.barrier().expect("barrier");
        (out, plan)
    });
    let want: Vec<f32> = (0..3).flat_map(|r| values(r, 4)).collect();
    for (out, plan) in results {
        assert_eq!(out, want);
        assert_eq!(plan, b"step 7");
    }
}

#[test]
fn a_rank_that_leaves_fails_the_all_reduce_naming_it() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("addr");
    let good = thread::spawn(move || {
        let mut c = TcpCollective::join(leader, 1, &key(3), limits(TIMEOUT)).expect("join");
        let _ = c.all_reduce_sum(&mut [1.0; 8]);
    });
    let gone = thread::spawn(move || {
        // Joins, then goes away before the first collective (a killed process).
        drop(TcpCollective::join(leader, 2, &key(3), limits(TIMEOUT)).expect("join"));
    });
    let mut c = TcpCollective::lead(listener, &key(3), TIMEOUT, TIMEOUT).expect("lead");
    gone.join().expect("thread");
    let started = Instant::now();
    let err = c.all_reduce_sum(&mut [1.0; 8]).expect_err("rank 2 is gone");
    assert_eq!(err.rank(), Some(2), "{err}");
    assert!(err.to_string().contains("rank 2"), "{err}");
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    drop(c);
    let _ = good.join();
}

#[test]
fn a_stalled_rank_times_out_naming_it() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("addr");
    let short = Duration::from_millis(300);
    let stalled = thread::spawn(move || {
        let c = TcpCollective::join(leader, 1, &key(2), limits(short)).expect("join");
        thread::sleep(Duration::from_secs(2));
        drop(c);
    });
    let mut c = TcpCollective::lead(listener, &key(2), TIMEOUT, short).expect("lead");
    let err = c.all_reduce_sum(&mut [1.0; 4]).expect_err("stalled");
    assert!(
        matches!(err, CollectiveError::Timeout { rank: 1, .. }),
        "{err}"
    );
    stalled.join().expect("thread");
}

#[test]
fn a_pool_missing_ranks_says_which() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("addr");
    let one =
        thread::spawn(move || TcpCollective::join(leader, 1, &key(3), limits(TIMEOUT)).map(|_| ()));
    let err = TcpCollective::lead(listener, &key(3), Duration::from_millis(500), TIMEOUT)
        .expect_err("rank 2 never came");
    assert!(err.to_string().contains("[2]"), "{err}");
    let _ = one.join();
}

#[test]
fn ranks_of_another_epoch_or_without_the_secret_are_refused_and_the_pool_still_forms() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("addr");
    let pool = PoolKey {
        secret: b"s3cret".to_vec(),
        ..key(2)
    };
    let strays = [
        // A rank of an earlier incarnation of the pool.
        PoolKey {
            epoch: EPOCH + 1,
            ..pool.clone()
        },
        // A stray that does not know the secret.
        key(2),
        PoolKey {
            secret: b"guess".to_vec(),
            ..pool.clone()
        },
    ];
    let strays: Vec<_> = strays
        .into_iter()
        .map(|k| thread::spawn(move || TcpCollective::join(leader, 1, &k, limits(TIMEOUT))))
        .collect();
    // Refusals take a moment each: let the strays connect first.
    thread::sleep(Duration::from_millis(200));
    let member = pool.clone();
    let good = thread::spawn(move || {
        let mut c = TcpCollective::join(leader, 1, &member, limits(TIMEOUT)).expect("join");
        let mut buf = [2.0];
        c.all_reduce_sum(&mut buf).expect("all-reduce");
        buf[0]
    });
    let mut c = TcpCollective::lead(listener, &pool, TIMEOUT, TIMEOUT).expect("lead");
    let mut buf = [1.0];
    c.all_reduce_sum(&mut buf).expect("all-reduce");
    assert_eq!((buf[0], good.join().expect("thread")), (3.0, 3.0));
    for stray in strays {
        let err = stray.join().expect("thread").expect_err("refused");
        assert!(err.to_string().contains("refused rank 1"), "{err}");
    }
}

/// Rank 0 accepts only once its own shard is loaded: a rank that joined long before waits for
/// the welcome (within the start-up timeout), not just the collective timeout, and the pool
/// forms.
#[test]
fn a_rank_waits_for_a_late_leaders_welcome_past_the_collective_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("addr");
    let short = Duration::from_millis(200);
    let early = thread::spawn(move || {
        let mut c = TcpCollective::join(leader, 1, &key(2), limits(short)).expect("welcomed");
        let mut buf = [2.0];
        c.all_reduce_sum(&mut buf).map(|()| buf[0])
    });
    // The leader is still loading: ten collective timeouts pass before it accepts.
    thread::sleep(short * 10);
    let mut c = TcpCollective::lead(listener, &key(2), TIMEOUT, short).expect("lead");
    let mut buf = [1.0];
    c.all_reduce_sum(&mut buf).expect("all-reduce");
    assert_eq!(early.join().expect("thread").expect("all-reduce"), 3.0);
    // A leader that never comes: the joining rank gives up at its welcome limit, saying why.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = silent.local_addr().expect("addr");
    let patience = JoinLimits {
        welcome: short,
        ..limits(short)
    };
    let err = TcpCollective::join(at, 1, &key(2), patience).expect_err("no welcome");
    assert!(err.to_string().contains("did not welcome"), "{err}");
}

#[test]
fn gather_fills_rank_0_only() {
    let results = pool(3, |c| {
        let mut out = if c.rank() == 0 {
            vec![0.0; 3 * 4]
        } else {
            Vec::new()
        };
        c.gather(&values(c.rank(), 4), &mut out).expect("gather");
        c.barrier().expect("barrier");
        out
    });
    let want: Vec<f32> = (0..3).flat_map(|r| values(r, 4)).collect();
    assert_eq!(results[0], want);
    assert!(results[1].is_empty() && results[2].is_empty());
}

#[test]
fn solo_collectives_leave_buffers_as_they_are() {
    let mut s = crate::Solo;
    let mut buf = [1.0, 2.0];
    s.all_reduce_sum(&mut buf).expect("all-reduce");
    let mut out = [0.0; 2];
    s.all_gather(&buf, &mut out).expect("gather");
    assert_eq!((buf, out), ([1.0, 2.0], [1.0, 2.0]));
    assert!(s.all_gather(&buf, &mut [0.0; 3]).is_err());
}
