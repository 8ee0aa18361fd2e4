//! Requests that run with a LoRA adapter ([`SamplingParams::lora`]): the model applies it to
//! their rows of each step (`ferrite_model::lora`), and the prefix cache names their blocks
//! from the adapter's own seed, so they share blocks with requests of the same adapter only.

use ferrite_proto::prefix::{self, BlockHash};

use super::Engine;
use crate::error::{EngineError, Result};
use crate::sampler::SamplingParams;
use crate::scheduler::SeqAdapter;

/// The seeds of the block hashes of each adapter in `names`, in a pool whose seed is `base`.
pub(super) fn seeds(base: BlockHash, names: &[String]) -> Vec<BlockHash> {
    names
        .iter()
        .map(|n| prefix::adapter_seed(base, n))
        .collect()
}

impl Engine {
    /// The LoRA adapters requests may ask for, by [`SamplingParams::lora`]'s number.
    pub fn lora_names(&self) -> &[String] {
        self.exec.lora_names()
    }

    /// [`SamplingParams::lora`]'s number of the adapter called `name`; the error lists the
    /// names there are.
    pub fn lora_number(&self, name: &str) -> Result<u32> {
        let names = self.lora_names();
        match names.iter().position(|n| n == name) {
            Some(i) => Ok(i as u32),
            None => Err(EngineError::InvalidRequest(format!(
                "no LoRA adapter `{name}` (--lora-modules names {names:?})"
            ))),
        }
    }

    /// The adapter a request with `params` runs with; refuses a number with no adapter.
    pub(super) fn seq_adapter(&self, params: &SamplingParams) -> Result<Option<SeqAdapter>> {
        let Some(index) = params.lora else {
            return Ok(None);
        };
        match self.lora_seeds.get(index as usize) {
            Some(&seed) => Ok(Some(SeqAdapter { index, seed })),
            None => Err(EngineError::InvalidRequest(format!(
                "LoRA adapter {index} asked for; this engine has {}",
                self.lora_seeds.len()
            ))),
        }
    }
}
