//! Steps that meet faults: a failed forward and a forward that gives too few picks fail the
//! step's requests loudly (no sequence is left waiting for a token that never comes), and their
//! clients are told it was the server's fault.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::handle::EngineHandle;

/// Faults the next step meets, set by a test.
#[derive(Debug, Default)]
pub(super) struct Faults {
    /// The next forward fails with this.
    pub fail_next: Option<EngineError>,
    /// The next forward gives one pick too few.
    pub drop_pick: bool,
}

impl Faults {
    pub fn apply(&mut self, picks: Picks, vocab: usize) -> Result<Picks> {
        if let Some(e) = self.fail_next.take() {
            return Err(e);
        }
        if !std::mem::take(&mut self.drop_pick) {
            return Ok(picks);
        }
        Ok(match picks {
            Picks::Logits(mut l) => {
                l.truncate(l.len().saturating_sub(vocab));
                Picks::Logits(l)
            }
            Picks::Ids(mut i) => {
                i.pop();
                Picks::Ids(i)
            }
        })
    }
}

fn engine() -> Engine {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2");
    let loaded = crate::model::load(&dir).expect("tiny model");
    let cfg = EngineConfig {
        max_model_len: Some(256),
        kv_cache_bytes: 8 << 20,
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

#[test]
fn too_few_picks_fail_the_step_instead_of_stranding_sequences() {
    let mut e = engine();
    for id in [1, 2, 3] {
        e.add_request(id, vec![5, 6, 7, 8], greedy(4)).expect("add");
    }
    e.faults.drop_pick = true;
    let err = e.step().expect_err("a short step must fail");
    assert!(matches!(err, EngineError::Internal(_)), "{err:?}");
    // Every request of the failed step is gone: none waits forever for its token.
    assert!(!e.has_unfinished(), "{:?}", e.stats());
    assert_eq!(e.stats().kv_blocks_used, 0);
    // The engine goes on serving.
    let after = e
        .run_to_completion(vec![(4, vec![5, 6, 7, 8], greedy(3))], |_| true)
        .expect("steps after the fault");
    assert_eq!(after[&4].tokens.len(), 3);
}

#[test]
fn a_failed_step_reaches_its_clients_as_a_server_fault() {
    for (fault, want_kind) in [
        (EngineError::Device("launch failed".into()), "device"),
        (EngineError::Internal("broken".into()), "internal"),
    ] {
        let mut e = engine();
        e.faults.fail_next = Some(fault);
        let (handle, _thread) = EngineHandle::spawn(e, 8).expect("spawn");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let got = rt.block_on(async {
            let mut s = handle
                .submit(vec![5, 6, 7], greedy(4))
                .await
                .expect("admit");
            tokio::time::timeout(Duration::from_secs(10), s.next())
                .await
                .expect("an answer, not a hang")
        });
        let err = got.expect("an event").expect_err("the step failed");
        assert_eq!(err.kind(), want_kind, "{err}");
        assert!(err.to_string().contains("the step failed"), "{err}");
    }
}
