//! The TCP backend with ranks as threads of one process (the CLI's `bench collective` runs
//! them as processes): results for 1 to 4 ranks, and the faults that must fail within the
//! timeout naming the rank.

use std::thread;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(5);
const EPOCH: u64 = 7;

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
                TcpCollective::join(leader, rank, world, EPOCH, TIMEOUT, TIMEOUT).expect("join");
            body(&mut c)
        }));
    }
    let mut c = TcpCollective::lead(listener, world, EPOCH, TIMEOUT, TIMEOUT).expect("lead");
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
        let mut c = TcpCollective::join(leader, 1, 3, EPOCH, TIMEOUT, TIMEOUT).expect("join");
        let _ = c.all_reduce_sum(&mut [1.0; 8]);
    });
    let gone = thread::spawn(move || {
        // Joins, then goes away before the first collective (a killed process).
        drop(TcpCollective::join(leader, 2, 3, EPOCH, TIMEOUT, TIMEOUT).expect("join"));
    });
    let mut c = TcpCollective::lead(listener, 3, EPOCH, TIMEOUT, TIMEOUT).expect("lead");
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
        let c = TcpCollective::join(leader, 1, 2, EPOCH, TIMEOUT, short).expect("join");
        thread::sleep(Duration::from_secs(2));
        drop(c);
    });
    let mut c = TcpCollective::lead(listener, 2, EPOCH, TIMEOUT, short).expect("lead");
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
    let one = thread::spawn(move || {
        TcpCollective::join(leader, 1, 3, EPOCH, TIMEOUT, TIMEOUT).map(|_| ())
    });
    let err = TcpCollective::lead(listener, 3, EPOCH, Duration::from_millis(500), TIMEOUT)
        .expect_err("rank 2 never came");
    assert!(err.to_string().contains("[2]"), "{err}");
    let _ = one.join();
}

#[test]
fn a_rank_of_another_epoch_is_refused_and_the_pool_still_forms() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("addr");
    // A rank of an earlier incarnation of the pool, then the right one.
    let stale = thread::spawn(move || {
        let mut c = TcpCollective::join(leader, 1, 2, EPOCH + 1, TIMEOUT, TIMEOUT).expect("join");
        c.all_reduce_sum(&mut [1.0])
            .expect_err("refused: its link is closed")
    });
    let stale_err = stale.join().expect("thread");
    assert!(stale_err.rank() == Some(0), "{stale_err}");
    let good = thread::spawn(move || {
        let mut c = TcpCollective::join(leader, 1, 2, EPOCH, TIMEOUT, TIMEOUT).expect("join");
        let mut buf = [2.0];
        c.all_reduce_sum(&mut buf).expect("all-reduce");
        buf[0]
    });
    let mut c = TcpCollective::lead(listener, 2, EPOCH, TIMEOUT, TIMEOUT).expect("lead");
    let mut buf = [1.0];
    c.all_reduce_sum(&mut buf).expect("all-reduce");
    assert_eq!((buf[0], good.join().expect("thread")), (3.0, 3.0));
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
