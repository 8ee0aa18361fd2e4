//! The engine thread behind its async handle: concurrent streams, cancellation, a bounded queue.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::handle::EngineHandle;
use ferrite_engine::model;
use ferrite_engine::sampler::SamplingParams;

fn engine(max_num_seqs: usize) -> Engine {
    engine_with_len(max_num_seqs, 512)
}

fn engine_with_len(max_num_seqs: usize, max_model_len: usize) -> Engine {
    let loaded = model::load(&fixtures().join("models/qwen2")).expect("tiny model");
    let cfg = EngineConfig {
        max_model_len: Some(max_model_len),
        max_num_seqs,
        kv_cache_bytes: 16 << 20,
        ..EngineConfig::default()
    };
    Engine::new(loaded.model, vec![], cfg).expect("engine")
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(n)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_streams_get_their_own_tokens() {
    let expected = read_json(&fixtures().join("models/qwen2/expected.json"));
    let (handle, _thread) = EngineHandle::spawn(engine(8), 64).expect("spawn");
    let mut streams = Vec::new();
    for case in expected["cases"].as_array().expect("cases") {
        let s = handle
            .submit(ids(&case["prompt_token_ids"]), greedy(16))
            .await
            .expect("submit");
        streams.push((s, ids(&case["greedy_token_ids"])));
    }
    for (mut s, want) in streams {
        let mut got = Vec::new();
        while let Some(ev) = s.next().await {
            got.push(ev.expect("token").token.id);
        }
        assert_eq!(got, want[..16]);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_streams_free_their_blocks() {
    let (handle, _thread) = EngineHandle::spawn(engine(64), 256).expect("spawn");
    let mut streams = Vec::new();
    for i in 0..100u32 {
        streams.push(
            handle
                .submit(vec![i % 200 + 1; 40], greedy(400))
                .await
                .expect("submit"),
        );
    }
    // Read a token or two from some, then drop every stream mid-generation.
    for s in streams.iter_mut().take(10) {
        s.next().await.expect("a token").expect("ok");
    }
    assert!(handle.stats().kv_blocks_used > 0);
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = handle.stats();
        if st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "blocks still in use: {st:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_queue_refuses_and_bad_requests_are_refused_at_submit() {
    // One running sequence at a time, at most 2 waiting.
    let (handle, _thread) = EngineHandle::spawn(engine(1), 2).expect("spawn");
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..10 {
        match handle.submit(vec![5; 8], greedy(500)).await {
            Ok(s) => held.push(s),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("the queue filled up");
    assert_eq!(e.kind(), "queue_full", "{e}");
    assert!(held.len() <= 4, "{} admitted", held.len());
    let e = handle
        .submit(vec![], greedy(1))
        .await
        .expect_err("empty prompt");
    assert_eq!(e.kind(), "invalid_request");
}

/// A submitter dropped after the engine queued its request but before it saw the admission
/// (a client cancelling at just that moment) must not leave the request waiting forever.
#[tokio::test(flavor = "current_thread")]
async fn a_submitter_dropped_after_admission_leaves_the_queue() {
    use std::future::Future;
    use std::task::Poll;

    // The busy request must outlast the test: the tiny model decodes 500 tokens in ~20 ms,
    // its whole 4096-token context in ~0.5 s, against the test's few milliseconds.
    let (handle, _thread) = EngineHandle::spawn(engine_with_len(1, 4096), 8).expect("spawn");
    let _busy = handle
        .submit(vec![5; 8], greedy(4088))
        .await
        .expect("submit");
    let mut pending = Box::pin(handle.submit(vec![6; 8], greedy(4)));
    // Poll once: the request is sent, and the admission is not yet read.
    std::future::poll_fn(|cx| {
        assert!(pending.as_mut().poll(cx).is_pending(), "admitted at once");
        Poll::Ready(())
    })
    .await;
    let until = |want_waiting: usize, what: &'static str| {
        let handle = handle.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            while handle.stats().waiting != want_waiting {
                assert!(Instant::now() < deadline, "{what}: {:?}", handle.stats());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    until(1, "the request never queued").await;
    drop(pending);
    until(0, "the abandoned request is still queued").await;
    let stats = handle.stats();
    assert_eq!(
        stats.running, 1,
        "the busy request ended first: the test proves nothing"
    );
    // Only the busy request's prompt was ever looked up: the abandoned one was never admitted.
    assert_eq!(stats.prefix_cache_queries, 8, "{stats:?}");
}

/// A prefix-cache listener sees a snapshot, then each block a request stored (named as the
/// gateway names it, from the seed and block size the handle reports); a listener that comes
/// later finds them in its snapshot; a second request for the prompt reports its cached tokens.
#[tokio::test(flavor = "current_thread")]
async fn kv_listeners_get_a_snapshot_then_what_each_step_stored() {
    let (handle, _thread) = EngineHandle::spawn(engine(8), 64).expect("spawn");
    let info = handle.prefix_cache();
    let seed = info.seed.expect("prefix caching is on by default");
    assert_eq!(info.block_size, 16);
    let mut first = handle.watch_kv().expect("watch");
    let snap = first.recv().await.expect("snapshot");
    assert!(snap.snapshot && snap.stored.is_empty(), "{snap:?}");
    let prompt: Vec<u32> = (1..=40).collect();
    let want = ferrite_proto::prefix::chain(seed, 16, &prompt);
    assert_eq!(want.len(), 2);
    let mut s = handle
        .submit(prompt.clone(), greedy(2))
        .await
        .expect("submit");
    let first_event = s.next().await.expect("a token").expect("ok");
    assert_eq!(first_event.cached_tokens, Some(0), "cold");
    while s.next().await.is_some() {}
    let mut stored = Vec::new();
    while stored.len() < 2 {
        let u = tokio::time::timeout(Duration::from_secs(10), first.recv())
            .await
            .expect("an update in time")
            .expect("open");
        assert!(!u.snapshot);
        stored.extend(u.stored);
    }
    stored.sort();
    let mut sorted = want.clone();
    sorted.sort();
    assert_eq!(stored, sorted);
    let mut later = handle.watch_kv().expect("watch");
    let mut snap = later.recv().await.expect("snapshot");
    assert!(snap.snapshot);
    snap.stored.sort();
    assert_eq!(
        snap.stored, sorted,
        "a later listener gets them in its snapshot"
    );
    let mut again = handle.submit(prompt, greedy(1)).await.expect("submit");
    let ev = again.next().await.expect("a token").expect("ok");
    assert_eq!(ev.cached_tokens, Some(32), "two blocks reused");
}
