//! Basic store operations and watches, on the embedded store and on a real etcd.

mod common;

use std::time::Duration;

use common::{Backend, next_event};
use ferrite_placement::keys::{decode, encode};
use ferrite_placement::{Key, PoolRecord, PoolState, RankRecord, WatchEvent};

const WITHIN: Duration = Duration::from_secs(5);

fn pool(state: PoolState) -> PoolRecord {
    PoolRecord {
        model: "HuggingFaceTB/SmolLM2-135M-Instruct".into(),
        tp: 2,
        leader_addr: "http://127.0.0.1:50051".into(),
        state,
        max_model_len: 2048,
        text_digest: None,
        lora: Vec::new(),
    }
}

async fn put_get_delete(b: Backend) {
    let store = &b.store;
    let s = store.schema().clone();
    let rank = RankRecord {
        addr: "http://127.0.0.1:50052".into(),
        gpu_uuid: Some("GPU-1234".into()),
        node: "node-a".into(),
    };
    store
        .put(&s.pool("p0"), encode(&pool(PoolState::Starting)), None)
        .await
        .expect("put pool");
    store
        .put(&s.rank("p0", 1), encode(&rank), None)
        .await
        .expect("put rank");
    store
        .put(&s.model("m"), b"{}".to_vec(), None)
        .await
        .expect("put model");

    let pools = store.get_prefix(&s.pools_prefix()).await.expect("get");
    let keys: Vec<_> = pools.iter().map(|(k, _)| s.parse(k)).collect();
    assert_eq!(
        keys,
        [
            Some(Key::Pool("p0".into())),
            Some(Key::Rank("p0".into(), 1))
        ],
        "sorted by key, models not included"
    );
    let got: PoolRecord = decode(&pools[0].0, &pools[0].1).expect("decode pool");
    assert_eq!(got, pool(PoolState::Starting));
    let got: RankRecord = decode(&pools[1].0, &pools[1].1).expect("decode rank");
    assert_eq!(got, rank);

    // Overwrite, then delete (twice: deleting a missing key is fine).
    store
        .put(&s.pool("p0"), encode(&pool(PoolState::Ready)), None)
        .await
        .expect("overwrite");
    let all = store.get_prefix(&s.root()).await.expect("get root");
    assert_eq!(all.len(), 3);
    store.delete(&s.pool("p0")).await.expect("delete");
    store.delete(&s.pool("p0")).await.expect("delete again");
    let left: Vec<_> = store
        .get_prefix(&s.root())
        .await
        .expect("get")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(left, [s.model("m"), s.rank("p0", 1)]);
}
on_both_backends!(put_get_delete);

async fn watch_starts_with_resync_then_ordered_deltas(b: Backend) {
    let store = &b.store;
    let s = store.schema().clone();
    store
        .put(&s.pool("a"), b"1".to_vec(), None)
        .await
        .expect("put");
    store
        .put(&s.pool("b"), b"2".to_vec(), None)
        .await
        .expect("put");
    // Outside the watched prefix: must never show up.
    store
        .put(&s.node("n"), b"x".to_vec(), None)
        .await
        .expect("put");

    let mut watch = store.watch_prefix(&s.pools_prefix());
    let first = next_event(&mut watch, WITHIN).await;
    assert_eq!(
        first,
        WatchEvent::Resync(vec![
            (s.pool("a"), b"1".to_vec()),
            (s.pool("b"), b"2".to_vec())
        ])
    );

    store
        .put(&s.pool("c"), b"3".to_vec(), None)
        .await
        .expect("put");
    store
        .put(&s.node("n"), b"y".to_vec(), None)
        .await
        .expect("put");
    store
        .put(&s.pool("a"), b"4".to_vec(), None)
        .await
        .expect("put");
    store.delete(&s.pool("b")).await.expect("delete");
    store
        .put(&s.rank("c", 0), b"5".to_vec(), None)
        .await
        .expect("put");

    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(next_event(&mut watch, WITHIN).await);
    }
    assert_eq!(
        got,
        [
            WatchEvent::Put(s.pool("c"), b"3".to_vec()),
            WatchEvent::Put(s.pool("a"), b"4".to_vec()),
            WatchEvent::Delete(s.pool("b")),
            WatchEvent::Put(s.rank("c", 0), b"5".to_vec()),
        ]
    );
    // Nothing else is pending (the node write was filtered out).
    assert!(
        tokio::time::timeout(Duration::from_millis(300), watch.recv())
            .await
            .is_err()
    );
}
on_both_backends!(watch_starts_with_resync_then_ordered_deltas);
