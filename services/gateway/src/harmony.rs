//! gpt-oss's chats with tools or a response format (its output is harmony's messages:
//! [`ferrite_text::harmony`]).
//!
//! A call is a message to a function, `<|channel|>commentary to=functions.get_weather
//! <|constrain|>json<|message|>{"location":"Paris"}<|call|>`: the stream reads its recipient
//! from the header's words ([`function`]) and its arguments from the body, by token, as the
//! model writes them. The answer is the `final` channel's body, so a grammar (a response
//! format, or a call the request requires) holds the channels as well ([`grammar`]): thinking
//! stays free, the header of the answer or the call is forced, and the request's own
//! constraint holds the body.

use ferrite_structured::Spec;
use ferrite_text::harmony::{Harmony, recipient};
use ferrite_text::reasoning::State;
use ferrite_text::{ChatMessage, TextError, Tokenizer};

use crate::tools::{ToolChoice, Tools};

/// The function a header addresses (`to=functions.NAME`), its words decoded run by run.
/// `None` for any other message: thinking, a preamble, the answer, a built-in tool's call.
pub fn function(tokenizer: &Tokenizer, header: &[Vec<u32>]) -> Result<Option<String>, TextError> {
    let words = header
        .iter()
        .map(|run| tokenizer.decode(run, false))
        .collect::<Result<Vec<_>, _>>()?
        .join(" ");
    let name = recipient(&words).and_then(|r| r.strip_prefix("functions."));
    Ok(name.map(str::to_owned))
}

/// `messages` as gpt-oss's template reads them: a past assistant message's thinking as
/// `thinking` (which it writes before a call, in the `analysis` channel), not
/// `reasoning_content`.
pub fn template_messages(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut messages = messages.to_vec();
    for m in &mut messages {
        m.thinking = m.reasoning_content.take();
    }
    messages
}

/// The grammar of a gpt-oss chat's output whose prompt leaves it in `state`: any thinking,
/// then the answer in the `final` channel, held to `answer`, and/or a call that `tools`
/// allow, its arguments held to its parameters (both built as a response format's JSON is:
/// bounded, whitespace too). `None` where nothing is held (no `answer`, and calls left to
/// the model); an error naming what cannot be met. The channels' names are `h`'s tokens, as
/// the split reads them.
pub fn grammar(
    h: &Harmony,
    state: State,
    answer: Option<Spec>,
    tools: Option<&Tools>,
) -> Result<Option<Spec>, String> {
    let must_call =
        tools.is_some_and(|t| matches!(t.choice, ToolChoice::Required | ToolChoice::Named(_)));
    let may_call = tools.is_some_and(Tools::may_call);
    if must_call && answer.is_some() {
        let why = "tools that must be called cannot also follow response_format or \
                   structured_outputs";
        return Err(why.into());
    }
    let calls = tools.filter(|_| must_call || (may_call && answer.is_some()));
    if answer.is_none() && calls.is_none() {
        return Ok(None);
    }
    // A message of thinking, and the start of the next message's header.
    let thought = format!(
        "thought: <|channel|> <[{}]> <|message|> TEXT? <|end|> <|start|> \"assistant\"\n\
         TEXT: /(.|\\n)+/\n",
        h.analysis_channel
    );
    let head = match state {
        State::Start => "start: thought* tail\n",
        State::Thinking => "start: TEXT? <|end|> <|start|> \"assistant\" thought* tail\n",
        // The prompt opened the answer's body itself: it is all answer.
        State::Answering if must_call => {
            return Err(
                "the chat template opened the final answer, where no call can be made".into(),
            );
        }
        State::Answering => return Ok(answer),
    };
    let (mut tails, mut parts) = (Vec::new(), Vec::new());
    if let Some(answer) = answer {
        tails.push(format!(
            "<|channel|> <[{}]> <|message|> @answer",
            h.final_channel
        ));
        parts.push(("answer".to_owned(), answer));
    }
    for (i, f) in calls.iter().flat_map(|t| t.callable()).enumerate() {
        // A name of `[a-zA-Z0-9_-]` (checked when the request was read) is a Lark string.
        tails.push(format!(
            "<|channel|> \"commentary to=functions.{} \" <|constrain|> \"json\" <|message|> \
             @args_{i} <|call|>",
            f.name
        ));
        let schema = Spec::JsonSchema {
            schema: f.parameters.clone(),
            strict: false,
        };
        parts.push((format!("args_{i}"), schema));
    }
    let lark = format!("{head}{thought}tail: {}\n", tails.join(" | "));
    Ok(Some(Spec::Within { lark, parts }))
}

#[cfg(test)]
#[path = "harmony_tests.rs"]
pub(crate) mod tests;
