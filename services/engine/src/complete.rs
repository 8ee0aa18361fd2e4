//! Running a batch of requests to completion on one thread: for the CLI, tests and
//! benchmarks (a server drives [`Engine::step`] itself, from the engine's handle).

use std::collections::HashMap;

use crate::engine::{Engine, FinishReason, TokenEvent};
use crate::error::Result;
use crate::sampler::{SampledToken, SamplingParams};
use crate::scheduler::SeqId;

/// The result of running a request to completion.
#[derive(Debug, Clone, Default)]
pub struct Generation {
    pub tokens: Vec<SampledToken>,
    pub finish: Option<FinishReason>,
}

impl Generation {
    pub fn token_ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.id).collect()
    }
}

impl Engine {
    /// Adds `requests` and steps until all finish; `on_event` sees every token as it comes.
    /// For the CLI, tests and benchmarks; a server drives [`Engine::step`] itself.
    pub fn run_to_completion(
        &mut self,
        requests: Vec<(SeqId, Vec<u32>, SamplingParams)>,
        mut on_event: impl FnMut(&TokenEvent) -> bool,
    ) -> Result<HashMap<SeqId, Generation>> {
        let mut results: HashMap<SeqId, Generation> = HashMap::new();
        for (id, prompt, params) in requests {
            self.add_request(id, prompt, params)?;
            results.insert(id, Generation::default());
        }
        while self.has_unfinished() {
            let out = self.step()?;
            if let Some((_, e)) = out.failed.into_iter().next() {
                return Err(e);
            }
            for ev in out.events {
                let keep_going = on_event(&ev);
                let g = results.entry(ev.id).or_default();
                g.tokens.push(ev.token);
                g.finish = ev.finish;
                if !keep_going && ev.finish.is_none() {
                    self.abort(ev.id);
                    g.finish = Some(FinishReason::Stop);
                }
            }
        }
        Ok(results)
    }
}
