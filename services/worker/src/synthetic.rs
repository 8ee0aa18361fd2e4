//! A stand-in engine for measuring the gateway: it emits token ids at a fixed rate and loads no
//! model, so what a benchmark sees is the cost of the gateway and the network path alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferrite_proto::worker::v1 as pb;
use ferrite_text::{GgufVocab, Tokenizer};
use tonic::Status;

use crate::streams::TokenStream;

/// Context length the synthetic model claims.
const MAX_MODEL_LEN: u32 = 1 << 16;

#[derive(Debug, Clone)]
pub struct SyntheticEngine {
    token_interval: Duration,
    running: Arc<AtomicUsize>,
}

impl SyntheticEngine {
    pub fn new(tokens_per_s: f64) -> Self {
        Self {
            token_interval: Duration::from_secs_f64(1.0 / tokens_per_s.max(1e-3)),
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// A byte-level tokenizer of 256 tokens (id = byte), for the gateway's text handling.
    pub fn tokenizer() -> Result<Tokenizer, ferrite_text::TextError> {
        Tokenizer::from_gguf_vocab(GgufVocab::byte_level())
    }

    pub fn max_model_len(&self) -> usize {
        MAX_MODEL_LEN as usize
    }

    /// `max_tokens` letters, one every token interval, the last with finish reason `length`.
    pub fn generate(&self, req: pb::GenerateRequest) -> Result<TokenStream, Status> {
        let n = req.sampling.map_or(0, |s| s.max_tokens);
        if req.prompt_token_ids.is_empty() || n == 0 {
            return Err(Status::invalid_argument("empty prompt or max_tokens 0"));
        }
        if req.embed.is_some() {
            return Err(Status::invalid_argument(
                "a synthetic worker has no model to embed with",
            ));
        }
        let guard = RunningGuard::new(self.running.clone());
        let mut interval = tokio::time::interval(self.token_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Box::pin(futures::stream::unfold(
            (0u32, interval, guard),
            move |(i, mut interval, guard)| async move {
                if i >= n {
                    return None;
                }
                interval.tick().await;
                let last = i + 1 == n;
                let msg = pb::GenerateResponse {
                    tokens: vec![pb::Token {
                        id: u32::from(b'a') + i % 26,
                        logprob: 0.0,
                        top: Vec::new(),
                    }],
                    finish_reason: if last {
                        pb::FinishReason::Length as i32
                    } else {
                        pb::FinishReason::Unspecified as i32
                    },
                    // No model, no KV cache.
                    cached_tokens: (i == 0).then_some(0),
                    prompt_logprobs: Vec::new(),
                    embedding: Vec::new(),
                };
                Some((Ok(msg), (i + 1, interval, guard)))
            },
        )))
    }
}

struct RunningGuard(Arc<AtomicUsize>);

impl RunningGuard {
    fn new(c: Arc<AtomicUsize>) -> Self {
        c.fetch_add(1, Ordering::Relaxed);
        Self(c)
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_vocabulary_round_trips_text() {
        let t = SyntheticEngine::tokenizer().expect("tokenizer");
        let ids = t.encode("hello, world\n", false).expect("encode");
        assert_eq!(
            ids,
            b"hello, world\n"
                .iter()
                .map(|&b| u32::from(b))
                .collect::<Vec<_>>()
        );
        assert_eq!(t.decode(&ids, false).expect("decode"), "hello, world\n");
    }
}
