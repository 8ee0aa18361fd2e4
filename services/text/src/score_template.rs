//! Score templates: how a reranker's query and document become one prompt, where the model
//! wants more than its tokenizer's pair joining (`--score-template`). A template is a Jinja
//! chat template rendered with two messages, roles `query` and `document`, as vLLM renders
//! a score template; HF's variables (`bos_token`, `eos_token`) are there too.
//!
//! Built in: `qwen3-reranker`, the prompt Qwen3-Reranker's model card builds (its system
//! judgement, the default instruction, the query and the document, and an empty thinking
//! block after the assistant's header), so that rerank clients that send raw queries and
//! documents get the model card's scores.

use crate::{ChatMessage, ChatTemplate, TextError};

/// Qwen3-Reranker's prompt (its model card's `format_instruction` between its prefix and
/// suffix). The last line break of a template is dropped (jinja2's default), hence three.
const QWEN3_RERANKER: &str = "<|im_start|>system\nJudge whether the Document meets the \
requirements based on the Query and the Instruct provided. Note that the answer can only be \
\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, \
retrieve relevant passages that answer the query\n<Query>: {{ messages[0].content }}\n\
<Document>: {{ messages[1].content }}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\
\n\n\n";

/// The built-in template called `name`, if there is one.
pub fn builtin(name: &str) -> Option<&'static str> {
    match name {
        "qwen3-reranker" => Some(QWEN3_RERANKER),
        _ => None,
    }
}

/// A compiled score template.
#[derive(Debug, Clone)]
pub struct ScoreTemplate(ChatTemplate);

impl ScoreTemplate {
    /// Compiles `source` (syntax errors here, not at the first request).
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, TextError> {
        ChatTemplate::new(source, bos_token, eos_token).map(Self)
    }

    /// The prompt of one (query, document) pair.
    pub fn render(&self, query: &str, document: &str) -> Result<String, TextError> {
        let messages = [
            ChatMessage::new("query", query),
            ChatMessage::new("document", document),
        ];
        self.0.render(&messages, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in Qwen3-Reranker template renders what the model card's code builds:
    /// `prefix + format_instruction(instruction, query, doc) + suffix`.
    #[test]
    fn qwen3_reranker_renders_the_model_cards_prompt() {
        let prefix = "<|im_start|>system\nJudge whether the Document meets the requirements \
            based on the Query and the Instruct provided. Note that the answer can only be \
            \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
        let suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
        let instruction = "Given a web search query, retrieve relevant passages that answer \
            the query";
        let (query, doc) = (
            "What is the capital of China?",
            "The capital of China is Beijing.",
        );
        let card = format!(
            "{prefix}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}{suffix}"
        );
        let source = builtin("qwen3-reranker").expect("built in");
        let t = ScoreTemplate::new(source, None, None).expect("compiles");
        assert_eq!(t.render(query, doc).expect("renders"), card);
        assert!(builtin("nope").is_none());
    }

    /// A template of one's own sees both messages and the special tokens.
    #[test]
    fn templates_see_the_query_the_document_and_the_special_tokens() {
        let source = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n\
            {% endfor %}";
        let t = ScoreTemplate::new(source, Some("<s>"), None).expect("compiles");
        assert_eq!(
            t.render("q", "d").expect("renders"),
            "<s>query: q\ndocument: d\n"
        );
        assert!(ScoreTemplate::new("{% if %}", None, None).is_err());
    }
}
