//! A model's vocabulary as llguidance sees it (a trie of each token's bytes), and the guide of
//! one sequence.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use ferrite_text::Tokenizer;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::closing::{Closer, Finish, Scan};
use crate::{Grammar, GrammarError, Spec};

/// Each token's bytes, read from a `tokenizer.json` (special tokens by their text). Also what
/// log-probabilities report as a token's `bytes`.
#[derive(Debug, Clone)]
pub struct TokenBytes(Vec<Vec<u8>>);

impl TokenBytes {
    pub fn from_tokenizer_json(tokenizer_json: &str) -> Result<Self, GrammarError> {
        let bad = |e: String| GrammarError::Vocabulary(e);
        let value: serde_json::Value =
            serde_json::from_str(tokenizer_json).map_err(|e| bad(e.to_string()))?;
        // llguidance asserts on some malformed vocabularies; a model with one serves on,
        // without structured outputs.
        let words = catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&value))
            .map_err(|_| bad("its tokenizer.json could not be read".into()))?
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self(words))
    }

    /// The bytes of token `id` (empty for an id the tokenizer does not have). A special
    /// token's are its text.
    pub fn get(&self, id: u32) -> &[u8] {
        let bytes = self.0.get(id as usize).map_or(&[][..], Vec::as_slice);
        match bytes.split_first() {
            Some((&TokTrie::SPECIAL_TOKEN_MARKER, text)) => text,
            _ => bytes,
        }
    }
}

/// The tokenizer llguidance tokenizes with where it must (forced text): the model's own, so
/// the tokens it forces are the ones the model would have seen.
struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// One model's grammar compiler: made once per model, shared by its requests.
pub struct Vocabulary {
    factory: ParserFactory,
    closer: Arc<Closer>,
    /// Words of a mask: the logits row's width in bits, rounded up.
    mask_words: usize,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("mask_words", &self.mask_words)
            .finish_non_exhaustive()
    }
}

impl Vocabulary {
    /// The vocabulary of a model whose logits rows are `logits_width` wide (its embedding's
    /// rows, often more than the tokenizer's tokens: ids past the tokenizer's are padding and
    /// never allowed). The first of `eos_ids` is the token that ends a guided output.
    pub fn new(
        bytes: &TokenBytes,
        tokenizer: Tokenizer,
        eos_ids: &[u32],
        logits_width: usize,
    ) -> Result<Self, GrammarError> {
        let eos = *eos_ids.first().ok_or_else(|| {
            GrammarError::Vocabulary("the tokenizer names no end-of-sequence token".into())
        })?;
        let mut words = bytes.0.clone();
        words.resize(words.len().max(logits_width), Vec::new());
        let vocab_size = u32::try_from(words.len())
            .map_err(|_| GrammarError::Vocabulary("more than 2^32 tokens".into()))?;
        let info = TokRxInfo::new(vocab_size, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tokenizer });
        let closer = Arc::new(Closer::new(env.clone(), eos));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        factory.set_stderr_log_level(0);
        // Errors name the grammar's fault, not the parser's internal state and the tokens.
        factory.limits_mut().verbose_errors = false;
        Ok(Self {
            factory,
            closer,
            mask_words: logits_width.div_ceil(32),
        })
    }

    /// The vocabulary of `tokenizer` (whose `tokenizer.json` text is `tokenizer_json`), ending
    /// guided outputs with its first end-of-sequence token: what a worker makes at start-up.
    pub fn from_tokenizer_json(
        tokenizer_json: &str,
        tokenizer: Tokenizer,
        logits_width: usize,
    ) -> Result<Self, GrammarError> {
        let bytes = TokenBytes::from_tokenizer_json(tokenizer_json)?;
        let eos = tokenizer.eos_ids().to_vec();
        Self::new(&bytes, tokenizer, &eos, logits_width)
    }

    /// The grammar of `spec`, compiled. With `bounded`, the bounded one of [`Spec::grammar`]
    /// (strings, arrays and free values the schema leaves unbounded get bounds, so a small
    /// model held to it ends), or, where llguidance cannot compile that (a bound meets what
    /// the schema asks for), the schema as written; without, the schema as written. A refusal
    /// gives the reason of the latter. What the gateway checks a request with and sends on.
    pub fn compile_spec(
        &self,
        spec: &Spec,
        bounded: bool,
    ) -> Result<(Grammar, Guide), GrammarError> {
        if bounded {
            let grammar = spec.grammar()?;
            if let Ok(guide) = self.compile(&grammar) {
                return Ok((grammar, guide));
            }
        }
        let as_written = spec.grammar_as_written()?;
        let guide = self.compile(&as_written)?;
        Ok((as_written, guide))
    }

    /// Compiles `grammar` for one sequence. The compile is bounded by llguidance's limits
    /// (lexer fuel, grammar size): a grammar past them is refused, not run.
    pub fn compile(&self, grammar: &Grammar) -> Result<Guide, GrammarError> {
        let parser = catch_unwind(AssertUnwindSafe(|| {
            self.factory.create_parser(grammar.0.clone())
        }))
        .map_err(|_| GrammarError::Invalid("the grammar could not be compiled".into()))?;
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(e));
        }
        Ok(Guide {
            matcher,
            mask_words: self.mask_words,
            closer: self.closer.clone(),
            closing: Finish::START,
            scan: Scan::default(),
        })
    }
}

/// One sequence's place in its grammar.
pub struct Guide {
    matcher: Matcher,
    mask_words: usize,
    closer: Arc<Closer>,
    closing: Finish,
    /// Whether the output so far ends inside a string, for the closer.
    scan: Scan,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide")
            .field("stopped", &self.matcher.is_stopped())
            .field("closing", &self.closing)
            .finish_non_exhaustive()
    }
}

impl Guide {
    /// Words of the masks [`Guide::allowed`] fills.
    pub fn mask_words(&self) -> usize {
        self.mask_words
    }

    /// Fills `mask` (bit `i % 32` of word `i / 32` for token `i`) with the tokens the grammar
    /// allows next, `budget` tokens (this one included) before the output is cut. Once the
    /// grammar is complete that is the end-of-sequence token alone; once the budget left is
    /// about what finishing takes, the one token that finishes soonest.
    pub fn allowed(&mut self, mask: &mut [u32], budget: usize) -> Result<(), String> {
        self.count_closing(budget);
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let words = vob.as_slice();
        let n = words.len().min(mask.len());
        mask[..n].copy_from_slice(&words[..n]);
        mask[n..].fill(0);
        if self.closing == Finish::Closing {
            self.closer.narrow(&mut self.matcher, self.scan, mask);
        }
        Ok(())
    }

    /// Counts what finishing takes where it is due, and starts closing when the budget left
    /// is down to that (see [`crate::closing`]).
    fn count_closing(&mut self, budget: usize) {
        if self.closing.due(budget) && !self.matcher.is_stopped() {
            let need = self
                .closer
                .tokens_to_finish(&self.matcher, self.scan, budget);
            self.closing.counted(budget, need);
        }
    }

    /// Follows the chosen `token`; `true` when it completed the grammar (the output ends).
    pub fn accept(&mut self, token: u32) -> Result<bool, String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| e.to_string())?;
        self.closer.follow(&mut self.scan, token);
        let done = self.matcher.is_stopped();
        if done && self.closing == Finish::Closing {
            self.closing = Finish::Closed;
        }
        Ok(done)
    }

    /// Whether the closer, not the model, finished the grammar: the output was cut to fit its
    /// budget (so it ends as one cut at `max_tokens` does).
    pub fn cut_short(&self) -> bool {
        self.closing == Finish::Closed
    }
}
