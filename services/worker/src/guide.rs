//! Constrained decoding in the worker: the model's [`Vocabulary`], made once at start-up,
//! compiles each constrained request's grammar (built by the gateway) into a guide the engine
//! follows, one per sequence.

use std::sync::Arc;

use ferrite_engine::constraint::Constraint;
use ferrite_proto::worker::v1 as pb;
use ferrite_structured::{Grammar, Guide, Vocabulary};
use ferrite_text::Tokenizer;
use ferrite_text::reasoning::{Part, Split, State};
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

/// `grammar` held back while a reasoning model thinks (`span`): every token is allowed until
/// the thinking block closes, and the grammar holds the answer from there (vLLM's structured
/// outputs with a reasoning parser). Before the first token of an output outside the block,
/// the grammar's tokens and the opening marker are allowed.
pub fn after_reasoning(
    grammar: Box<dyn Constraint>,
    span: &pb::ReasoningSpan,
) -> Box<dyn Constraint> {
    let state = match span.start() {
        pb::ReasoningStart::MayOpen => State::Start,
        pb::ReasoningStart::Thinking => State::Thinking,
        pb::ReasoningStart::Answering => State::Answering,
    };
    Box::new(AfterReasoning {
        split: Split::new((span.start_token, span.end_token), state),
        grammar,
    })
}

#[derive(Debug)]
struct AfterReasoning {
    split: Split,
    grammar: Box<dyn Constraint>,
}

impl Constraint for AfterReasoning {
    fn allowed(&mut self, mask: &mut [u32], budget: usize) -> Result<(), String> {
        if !self.split.answering() {
            mask.fill(u32::MAX);
            return Ok(());
        }
        self.grammar.allowed(mask, budget)?;
        if self.split.may_open() {
            let t = self.split.start_token() as usize;
            if let Some(word) = mask.get_mut(t / 32) {
                *word |= 1 << (t % 32);
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<bool, String> {
        match self.split.on_token(token) {
            Part::Content => self.grammar.accept(token),
            Part::Reasoning | Part::Marker => Ok(false),
        }
    }

    fn cut_short(&self) -> bool {
        self.grammar.cut_short()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A grammar of one token, 5, then done; it records what it was shown.
    #[derive(Debug, Default)]
    struct Five(Vec<u32>);

    impl Constraint for Five {
        fn allowed(&mut self, mask: &mut [u32], _budget: usize) -> Result<(), String> {
            mask.fill(0);
            mask[0] = 1 << 5;
            Ok(())
        }

        fn accept(&mut self, token: u32) -> Result<bool, String> {
            self.0.push(token);
            Ok(token == 5)
        }
    }

    fn allows(c: &mut dyn Constraint) -> Vec<u32> {
        let mut mask = [0u32; 1];
        c.allowed(&mut mask, 8).expect("mask");
        (0..32).filter(|t| mask[0] >> t & 1 == 1).collect()
    }

    /// Thinking is free; the grammar holds what follows `</think>` (2); an output outside the
    /// block may open one with its first token (1) only.
    #[test]
    fn the_grammar_holds_the_answer_after_the_thinking() {
        let span = |start: pb::ReasoningStart| pb::ReasoningSpan {
            start_token: 1,
            end_token: 2,
            start: start as i32,
        };
        let mut c = after_reasoning(
            Box::new(Five::default()),
            &span(pb::ReasoningStart::Thinking),
        );
        assert_eq!(allows(c.as_mut()).len(), 32, "thinking: any token");
        for t in [7, 8, 2] {
            assert_eq!(c.accept(t), Ok(false));
        }
        assert_eq!(allows(c.as_mut()), [5]);
        assert_eq!(c.accept(5), Ok(true));

        let may_open = span(pb::ReasoningStart::MayOpen);
        let mut c = after_reasoning(Box::new(Five::default()), &may_open);
        assert_eq!(
            allows(c.as_mut()),
            [1, 5],
            "the grammar or the opening marker"
        );
        assert_eq!(c.accept(1), Ok(false));
        assert_eq!(allows(c.as_mut()).len(), 32);
        let mut c = after_reasoning(Box::new(Five::default()), &may_open);
        assert_eq!(c.accept(5), Ok(true), "answered at once");
        // The prompt closed the block: the grammar alone, from the first token.
        let closed = span(pb::ReasoningStart::Answering);
        let mut c = after_reasoning(Box::new(Five::default()), &closed);
        assert_eq!(allows(c.as_mut()), [5]);
    }
}
