//! Constrained decoding in the worker: the model's [`Vocabulary`], made once at start-up,
//! compiles each constrained request's grammar (built by the gateway) into a guide the engine
//! follows, one per sequence.

use std::sync::Arc;

use ferrite_engine::constraint::Constraint;
use ferrite_proto::worker::v1 as pb;
use ferrite_structured::{Grammar, Guide, Vocabulary};
use ferrite_text::Tokenizer;
use tonic::Status;

/// The model's vocabulary for grammars, or why it has none (it serves unconstrained requests
/// all the same). `info` is the model's `GetModelInfo` answer.
pub fn vocabulary(info: &pb::ModelInfo, tokenizer: Tokenizer) -> Result<Vocabulary, String> {
    let width = info.vocab_size as usize;
    Vocabulary::from_tokenizer_json(&info.tokenizer_json, tokenizer, width)
        .map_err(|e| e.to_string())
}

/// The guide of one request's `grammar`, compiled off the async runtime (a compile takes
/// milliseconds). INVALID_ARGUMENT when it does not compile, FAILED_PRECONDITION when this
/// model has no vocabulary for grammars.
pub async fn compile(
    vocabulary: &Result<Arc<Vocabulary>, String>,
    grammar: &str,
) -> Result<Box<dyn Constraint>, Status> {
    let vocabulary = vocabulary.as_ref().map_err(|why| {
        Status::failed_precondition(format!("this model cannot constrain outputs: {why}"))
    })?;
    let grammar =
        Grammar::from_wire(grammar).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let vocabulary = vocabulary.clone();
    let guide = tokio::task::spawn_blocking(move || vocabulary.compile(&grammar))
        .await
        .map_err(|e| Status::internal(format!("compiling the grammar: {e}")))?
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(Box::new(EngineGuide(guide)))
}

#[derive(Debug)]
struct EngineGuide(Guide);

impl Constraint for EngineGuide {
    fn allowed(&mut self, mask: &mut [u32], budget: usize) -> Result<(), String> {
        self.0.allowed(mask, budget)
    }

    fn accept(&mut self, token: u32) -> Result<bool, String> {
        self.0.accept(token)
    }

    fn cut_short(&self) -> bool {
        self.0.cut_short()
    }
}
