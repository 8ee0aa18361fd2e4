//! Which tensor names a checkpoint uses, llama.cpp's or Hugging Face's.

/// Which tensor names a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightNaming {
    /// llama.cpp names: `blk.0.attn_q.weight`.
    Gguf,
    /// Hugging Face names: `model.layers.0.self_attn.q_proj.weight`.
    HuggingFace,
}

impl WeightNaming {
    pub(crate) fn global(self, gguf: &str, hf: &str) -> String {
        match self {
            WeightNaming::Gguf => gguf.to_owned(),
            WeightNaming::HuggingFace => hf.to_owned(),
        }
    }

    pub(crate) fn layer(self, i: usize, gguf: &str, hf: &str) -> String {
        match self {
            WeightNaming::Gguf => format!("blk.{i}.{gguf}"),
            WeightNaming::HuggingFace => format!("model.layers.{i}.{hf}"),
        }
    }
}
