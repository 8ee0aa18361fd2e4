//! Leases and registrations: expiry after a crash, deregistration, updates,
//! re-registration after the lease is lost. On both backends.

mod common;

use std::time::{Duration, Instant};

use common::{Backend, Mirror, next_event};
use ferrite_placement::keys::encode;
use ferrite_placement::{
    PlacementError, PoolRecord, PoolState, Registration, RegistrationState, WatchEvent,
};

const TTL: Duration = Duration::from_secs(2);
const WITHIN: Duration = Duration::from_secs(5);

fn pool(state: PoolState) -> Vec<u8> {
    encode(&PoolRecord {
        model: "m".into(),
        tp: 1,
        leader_addr: "http://127.0.0.1:1".into(),
        state,
        max_model_len: 128,
        text_digest: None,
        lora: Vec::new(),
    })
}

async fn raw_lease_semantics(b: Backend) {
    let store = &b.store;
    let s = store.schema().clone();
    let lease = store.grant_lease(TTL).await.expect("grant");
    store
        .put(&s.node("n1"), b"x".to_vec(), Some(lease))
        .await
        .expect("put under lease");
    assert!(store.keep_alive_once(lease).await.expect("keep alive"));
    store.revoke_lease(lease).await.expect("revoke");
    assert!(store.get_prefix(&s.root()).await.expect("get").is_empty());
    assert!(!store.keep_alive_once(lease).await.expect("keep alive"));
    store
        .revoke_lease(lease)
        .await
        .expect("revoking twice is fine");
    let err = store
        .put(&s.node("n1"), b"x".to_vec(), Some(lease))
        .await
        .expect_err("put under a revoked lease");
    assert!(matches!(err, PlacementError::LeaseNotFound(_)), "{err:?}");
}
on_both_backends!(raw_lease_semantics);

async fn dropped_registration_expires_within_ttl(b: Backend) {
    let store = &b.store;
    let s = store.schema().clone();
    let mut watch = store.watch_prefix(&s.root());
    let mut mirror = Mirror::default();
    let entries = vec![
        (s.pool("p"), pool(PoolState::Ready)),
        (s.rank("p", 0), b"{}".to_vec()),
    ];
    let reg = Registration::start(store.clone(), TTL, entries);
    tokio::time::timeout(WITHIN, reg.registered())
        .await
        .expect("registered in time")
        .expect("registered");
    mirror.until(&mut watch, WITHIN, |m| m.len() == 2).await;

    // Let a few keep-alives happen: the keys must outlive the TTL while alive.
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    assert_eq!(store.get_prefix(&s.root()).await.expect("get").len(), 2);

    // A crash: no deregistration, the keep-alive just stops.
    let dropped = Instant::now();
    drop(reg);
    mirror
        .until(&mut watch, TTL + Duration::from_secs(3), |m| m.is_empty())
        .await;
    let took = dropped.elapsed();
    assert!(
        took <= TTL + Duration::from_secs(1),
        "keys vanished after {took:?}"
    );
    assert!(
        mirror
            .events
            .iter()
            .any(|e| matches!(e, WatchEvent::Delete(k) if *k == s.pool("p"))),
        "{:?}",
        mirror.events
    );
}
on_both_backends!(dropped_registration_expires_within_ttl);

async fn deregister_removes_keys_at_once(b: Backend) {
    let store = &b.store;
    let s = store.schema().clone();
    let reg = Registration::start(
        store.clone(),
        TTL,
        vec![(s.pool("p"), pool(PoolState::Ready))],
    );
    tokio::time::timeout(WITHIN, reg.registered())
        .await
        .expect("registered in time")
        .expect("registered");
    let mut watch = store.watch_prefix(&s.root());
    let first = next_event(&mut watch, WITHIN).await;
    assert!(
        matches!(&first, WatchEvent::Resync(kvs) if kvs.len() == 1),
        "{first:?}"
    );

    let started = Instant::now();
    reg.deregister().await.expect("deregister");
    let event = next_event(&mut watch, Duration::from_secs(1)).await;
    assert_eq!(event, WatchEvent::Delete(s.pool("p")));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(store.get_prefix(&s.root()).await.expect("get").is_empty());
}
on_both_backends!(deregister_removes_keys_at_once);

async fn update_rewrites_under_the_lease(b: Backend) {
    let store = &b.store;
    let s = store.schema().clone();
    let key = s.pool("p");
    let reg = Registration::start(
        store.clone(),
        TTL,
        vec![(key.clone(), pool(PoolState::Starting))],
    );
    let lease = tokio::time::timeout(WITHIN, reg.registered())
        .await
        .expect("registered in time")
        .expect("registered");
    let mut watch = store.watch_prefix(&s.root());
    next_event(&mut watch, WITHIN).await; // Resync

    reg.update(key.clone(), pool(PoolState::Ready))
        .await
        .expect("update");
    assert_eq!(
        next_event(&mut watch, WITHIN).await,
        WatchEvent::Put(key.clone(), pool(PoolState::Ready))
    );
    // A new key joins the registration, under the same lease.
    reg.update(s.nccl("p"), b"id".to_vec())
        .await
        .expect("add key");
    next_event(&mut watch, WITHIN).await;
    // Both keys hang off the registration's lease.
    store.revoke_lease(lease).await.expect("revoke");
    let mut deleted = vec![
        next_event(&mut watch, WITHIN).await,
        next_event(&mut watch, WITHIN).await,
    ];
    let mut expected = vec![WatchEvent::Delete(s.nccl("p")), WatchEvent::Delete(key)];
    // A revoke deletes the lease's keys in no particular order.
    deleted.sort_by_key(|e| format!("{e:?}"));
    expected.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(deleted, expected);
}
on_both_backends!(update_rewrites_under_the_lease);

async fn lost_lease_is_replaced_and_entries_rewritten(b: Backend) {
    let store = &b.store;
    let s = store.schema().clone();
    let entries = vec![
        (s.pool("p"), pool(PoolState::Ready)),
        (s.rank("p", 0), b"r".to_vec()),
    ];
    let reg = Registration::start(store.clone(), TTL, entries);
    let first = tokio::time::timeout(WITHIN, reg.registered())
        .await
        .expect("registered in time")
        .expect("registered");
    let mut watch = store.watch_prefix(&s.root());
    let mut mirror = Mirror::default();
    mirror.until(&mut watch, WITHIN, |m| m.len() == 2).await;

    // What an expiry during a long outage looks like to the worker: the lease
    // is gone. The next keep-alive (<= ttl/3) must notice and register again.
    store.revoke_lease(first).await.expect("revoke");
    mirror.until(&mut watch, WITHIN, |m| m.is_empty()).await;
    mirror.until(&mut watch, WITHIN, |m| m.len() == 2).await;
    let mut state = reg.subscribe();
    tokio::time::timeout(
        WITHIN,
        state.wait_for(|s| matches!(s, RegistrationState::Registered(l) if *l != first)),
    )
    .await
    .expect("registered again in time")
    .expect("registration alive");
    assert_eq!(
        mirror.state.get(&s.rank("p", 0)).map(Vec::as_slice),
        Some(&b"r"[..])
    );
}
on_both_backends!(lost_lease_is_replaced_and_entries_rewritten);
