use super::testing::record;
use super::*;
use ferrite_proto::prefix;
use ferrite_proto::worker::v1 as pb;

fn schema() -> KeySchema {
    KeySchema::new("/t")
}

/// A listener that accepts TCP connections and never answers: a worker channel to it opens
/// (lazily) and its calls wait, so a pool's prefix-cache stream neither ends nor fails while a
/// test runs.
fn silent_worker() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = format!("http://{}", l.local_addr().expect("addr"));
    (l, addr)
}

fn put(name: &str, r: &PoolRecord) -> (String, Vec<u8>) {
    (schema().pool(name), serde_json::to_vec(r).expect("record"))
}

fn names(pools: &[Pool]) -> Vec<String> {
    let mut n: Vec<String> = pools.iter().map(|p| p.name.clone()).collect();
    n.sort();
    n
}

fn snapshot(blocks: usize) -> pb::KvCacheUpdate {
    let seed = prefix::seed("m");
    let tokens: Vec<u32> = (0..blocks as u32 * 4).collect();
    pb::KvCacheUpdate {
        reset: true,
        block_size: 4,
        hash_seed: seed.to_bytes().to_vec(),
        stored: prefix::chain(seed, 4, &tokens)
            .iter()
            .map(|h| h.to_bytes().to_vec())
            .collect(),
        ..pb::KvCacheUpdate::default()
    }
}

#[tokio::test]
async fn a_resync_is_a_diff_that_keeps_the_routing_state_of_the_pools_it_still_names() {
    let (_a_listener, a_addr) = silent_worker();
    let (_b_listener, b_addr) = silent_worker();
    let view = PoolView::default();
    let a = PoolRecord {
        leader_addr: a_addr,
        ..record(Some("d"))
    };
    let b = PoolRecord {
        leader_addr: b_addr,
        ..record(Some("d"))
    };
    view.apply(
        &schema(),
        WatchEvent::Resync(vec![put("a", &a), put("b", &b)]),
    );
    assert_eq!(names(&view.ready("m")), ["a", "b"]);
    let before = view.ready("m").into_iter().find(|p| p.name == "a");
    let before = before.expect("a");
    before.outstanding.fetch_add(3, Ordering::Relaxed);
    view.kv().apply("a", snapshot(5));
    assert_eq!(view.kv().blocks_of("a"), 5);

    // etcd came back: a is there as it was, b is gone, c is new.
    let c = PoolRecord {
        state: PoolState::Starting,
        ..b.clone()
    };
    view.apply(
        &schema(),
        WatchEvent::Resync(vec![put("a", &a), put("c", &c)]),
    );
    assert_eq!(names(&view.ready("m")), ["a"]);
    let after = view.ready("m").pop().expect("a");
    assert_eq!(after.load(), 3, "a's in-flight count survives the resync");
    assert!(Arc::ptr_eq(&after.health, &before.health));
    assert_eq!(
        view.kv().blocks_of("a"),
        5,
        "a's prefix-cache stream and index survive the resync"
    );
    assert_eq!(view.kv().blocks_of("b"), 0);
}

#[tokio::test]
async fn no_ready_pool_is_unavailable_unless_the_model_was_never_served() {
    let view = PoolView::default();
    let e = view.none_ready("m");
    assert!(
        matches!(e, GatewayError::Unavailable(_)),
        "before placement answered: {e:?}"
    );
    view.apply(&schema(), WatchEvent::Resync(vec![]));
    assert!(view.is_synced());
    assert!(matches!(
        view.none_ready("m"),
        GatewayError::ModelNotFound(_)
    ));
    let draining = PoolRecord {
        state: PoolState::Draining,
        ..record(None)
    };
    let (key, value) = put("a", &draining);
    view.apply(&schema(), WatchEvent::Put(key.clone(), value));
    let e = view.none_ready("m");
    assert!(e.to_string().contains("1 draining"), "{e}");
    assert_eq!(e.kind(), "unavailable");
    view.apply(&schema(), WatchEvent::Delete(key));
    let e = view.none_ready("m");
    assert_eq!(e.kind(), "unavailable", "served lately: {e}");
    assert_eq!(view.none_ready("other").kind(), "model_not_found");
}

#[tokio::test]
async fn a_model_lists_the_largest_context_of_its_ready_pools() {
    let view = PoolView::default();
    let short = record(None);
    let long = PoolRecord {
        max_model_len: 64,
        leader_addr: "http://127.0.0.1:10".into(),
        ..record(None)
    };
    view.apply(
        &schema(),
        WatchEvent::Resync(vec![put("a", &short), put("b", &long)]),
    );
    let served = Served {
        name: "m".into(),
        max_model_len: 64,
        ready_pools: 2,
        parent: None,
    };
    assert_eq!(view.models(), vec![served]);
}
