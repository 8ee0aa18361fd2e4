//! etcd going away and coming back: watches resync, registrations survive and
//! late registrations wait for etcd instead of failing; requests fail fast.

mod common;

use std::time::{Duration, Instant};

use common::Mirror;
use ferrite_placement::testing::EtcdServer;
use ferrite_placement::{Registration, Store, WatchEvent};

const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resyncs_and_registrations_survive_an_outage() {
    outage(EtcdServer::stop, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resyncs_and_registrations_survive_an_etcd_crash() {
    outage(EtcdServer::kill, Duration::from_secs(3)).await;
}

/// With a watch and a registration open, takes etcd down with `stop` for
/// `down`, starts a second registration meanwhile, restarts etcd.
async fn outage(stop: fn(&mut EtcdServer), down: Duration) {
    let mut etcd = EtcdServer::start();
    let store = Store::connect(&etcd.endpoints(), "/ferrite/test")
        .await
        .expect("connect");
    let s = store.schema().clone();
    let mut watch = store.watch_prefix(&s.pools_prefix());
    let mut mirror = Mirror::default();

    let first = Registration::start(store.clone(), TTL, vec![(s.pool("a"), b"a".to_vec())]);
    mirror
        .until(&mut watch, Duration::from_secs(5), |m| {
            m.contains_key(&s.pool("a"))
        })
        .await;
    tokio::time::timeout(Duration::from_secs(5), first.registered())
        .await
        .expect("first registered in time")
        .expect("first registered");

    // EtcdServer blocks (it is a std process fixture); keep the runtime's
    // other worker free for the registration and watch tasks meanwhile.
    tokio::task::block_in_place(|| stop(&mut etcd));
    // A worker that starts while etcd is down: must not fail, just wait.
    let second = Registration::start(store.clone(), TTL, vec![(s.pool("b"), b"b".to_vec())]);
    // A gateway that starts while etcd is down: its watch stays silent.
    let mut late_watch = store.watch_prefix(&s.pools_prefix());
    tokio::time::sleep(down).await;
    assert!(!second.is_registered(), "registered while etcd was down?");
    assert!(
        tokio::time::timeout(Duration::from_millis(1), late_watch.recv())
            .await
            .is_err(),
        "a watch produced events while etcd was down"
    );
    let seen_during_outage = mirror.events.len();

    tokio::task::block_in_place(|| etcd.restart());
    let restarted = Instant::now();
    eprintln!("etcd back after {down:?} down");
    mirror
        .until(&mut watch, Duration::from_secs(8), |m| {
            m.contains_key(&s.pool("a")) && m.contains_key(&s.pool("b"))
        })
        .await;
    let after: Vec<_> = mirror.events[seen_during_outage..].to_vec();
    // The lost watch came back with a fresh snapshot, which has the first
    // registration's key (its lease survived the restart) ...
    let resync = after
        .iter()
        .find_map(|e| match e {
            WatchEvent::Resync(kvs) => Some(kvs),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Resync after the restart: {after:?}"));
    assert!(resync.iter().any(|(k, _)| *k == s.pool("a")), "{resync:?}");
    // ... and the second registration arrived, in the snapshot or right after.
    eprintln!(
        "both registrations visible {:?} after the restart",
        restarted.elapsed()
    );
    assert!(
        restarted.elapsed() < Duration::from_secs(5),
        "took {:?}",
        restarted.elapsed()
    );
    tokio::time::timeout(Duration::from_secs(3), second.registered())
        .await
        .expect("second registered in time")
        .expect("second registered");
    assert!(first.is_registered());

    // The late watch starts, as every watch does, with a snapshot.
    let first_event = common::next_event(&mut late_watch, Duration::from_secs(3)).await;
    assert!(
        matches!(first_event, WatchEvent::Resync(_)),
        "{first_event:?}"
    );

    // The deltas keep flowing after the resync.
    second.deregister().await.expect("deregister");
    mirror
        .until(&mut watch, Duration::from_secs(3), |m| {
            !m.contains_key(&s.pool("b"))
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_fail_fast_while_etcd_is_down() {
    let mut etcd = EtcdServer::start();
    let store = Store::connect(&etcd.endpoints(), "/ferrite/test")
        .await
        .expect("connect");
    store
        .put("/ferrite/test/x", b"1".to_vec(), None)
        .await
        .expect("put");
    tokio::task::block_in_place(|| etcd.stop());

    let started = Instant::now();
    let err = store
        .get_prefix("/ferrite/test/")
        .await
        .expect_err("etcd is down");
    assert!(err.is_transient(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    // The same store works again once etcd is back, without reconnecting by hand.
    tokio::task::block_in_place(|| etcd.restart());
    let kvs = store
        .get_prefix("/ferrite/test/")
        .await
        .expect("after restart");
    assert_eq!(kvs, [("/ferrite/test/x".to_owned(), b"1".to_vec())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_is_lazy_and_requests_time_out() {
    // A loopback port nobody listens on (etcd was never started here).
    let store = Store::connect(&["http://127.0.0.1:9".to_owned()], "/ferrite/test")
        .await
        .expect("connect is lazy");
    let started = Instant::now();
    let err = store.grant_lease(TTL).await.expect_err("nothing there");
    assert!(err.is_transient(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    // An https endpoint without the CA to trust is refused up front, naming the flag.
    let https = Store::connect(&["https://127.0.0.1:1".to_owned()], "/p").await;
    let err = https.expect_err("https without TLS options");
    assert_eq!(err.kind(), "invalid_endpoint");
    assert!(err.to_string().contains("--etcd-ca"), "{err}");
}
