//! gpt-oss's grammars over [`harmony_model`]'s byte-level vocabulary with harmony's special
//! tokens: compiled as the gateway sends them, and fed the tokens gpt-oss writes.

use std::sync::Arc;

use ferrite_structured::{Grammar, Guide};
use ferrite_text::ChatMessage;
use serde_json::json;

use super::*;
use crate::error::GatewayError;
use crate::models::ModelText;
use crate::models::testing::{fixture, harmony_model, o200k_model};
use crate::tools::{self, Function};
use crate::validate::{Chat, Constraint, Prompt, ValidatedRequest, validate};

const START: u32 = 256;
const CHANNEL: u32 = 257;
const CONSTRAIN: u32 = 258;
const MESSAGE: u32 = 259;
const END: u32 = 260;
const CALL: u32 = 261;
const RETURN: u32 = 262;
const FINAL: u32 = 263;
const ANALYSIS: u32 = 264;

fn tools(choice: ToolChoice) -> Option<Arc<Tools>> {
    let params = json!({"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"], "additionalProperties": false});
    let weather = Function::new("get_weather", None, Some(params)).expect("f");
    let time = Function::new("get_time", None, None).expect("f");
    Tools::new(vec![weather, time], choice, true)
        .expect("tools")
        .map(Arc::new)
}

fn schema() -> Constraint {
    Constraint {
        spec: Spec::JsonSchema {
            schema: json!({"type": "object", "properties": {"n": {"type": "integer"}},
                "required": ["n"], "additionalProperties": false}),
            strict: true,
        },
        field: "response_format",
    }
}

fn request(
    constraint: Option<&Constraint>,
    tools: Option<Arc<Tools>>,
) -> Result<ValidatedRequest, GatewayError> {
    let chat = Prompt::Chat(Chat::new(vec![ChatMessage::new("user", "Paris?")]));
    validate(harmony_model(), 4096, &chat, None, constraint, tools)
}

/// The guide of a request's grammar, as a worker compiles it.
fn guide(model: &ModelText, req: &ValidatedRequest) -> Guide {
    let wire = req.worker_request().grammar.expect("a grammar");
    let grammar = Grammar::from_wire(&wire).expect("wire");
    model
        .vocabulary()
        .expect("vocabulary")
        .compile(&grammar)
        .expect("compiled")
}

fn allowed(g: &mut Guide) -> Vec<u32> {
    let mask = mask(g);
    (0..265).filter(|&i| has(&mask, i)).collect()
}

/// What `g` allows next, as the worker asks it (a budget far from its end).
fn mask(g: &mut Guide) -> Vec<u32> {
    let mut mask = vec![0u32; g.mask_words()];
    g.allowed(&mut mask, 100_000).expect("mask");
    mask
}

/// Whether `mask` allows `token`.
fn has(mask: &[u32], token: u32) -> bool {
    mask[token as usize / 32] >> (token % 32) & 1 == 1
}

/// Whether `g` allows `token` next.
pub(crate) fn allows(g: &mut Guide, token: u32) -> bool {
    has(&mask(g), token)
}

/// Feeds `ids`, each allowed; returns whether the last completed the grammar.
fn feed(g: &mut Guide, ids: &[u32]) -> bool {
    let mut done = false;
    for &t in ids {
        assert!(!done, "the grammar ended before {t}");
        assert!(allowed(g).contains(&t), "{t} is not allowed");
        done = g.accept(t).expect("accepted");
    }
    done
}

fn bytes(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// `<|channel|>analysis<|message|>…<|end|><|start|>assistant`.
fn thinking(text: &str) -> Vec<u32> {
    let mut ids = vec![CHANNEL, ANALYSIS, MESSAGE];
    ids.extend(bytes(text));
    ids.extend([END, START]);
    ids.extend(bytes("assistant"));
    ids
}

/// A response format holds the final channel's body: the thinking before it is free, the
/// header of the answer is the only way on from a header, the answer follows the schema,
/// and `<|return|>` ends it.
#[test]
fn a_response_format_holds_the_final_answer_after_free_thinking() {
    let model = harmony_model();
    let req = request(Some(&schema()), None).expect("valid");
    let mut g = guide(&model, &req);
    assert_eq!(
        allowed(&mut g),
        [CHANNEL],
        "the prompt ended on <|start|>assistant"
    );
    assert!(!feed(&mut g, &[CHANNEL]));
    // The channels by their tokens alone (not spelled in bytes, which the split would not
    // know); no commentary: calls are not asked for.
    assert_eq!(allowed(&mut g), [FINAL, ANALYSIS]);
    assert!(!feed(&mut g, &thinking("any text, even {\"n\": 1}")[1..]));
    assert!(!feed(&mut g, &[CHANNEL, FINAL, MESSAGE]));
    assert_eq!(
        allowed(&mut g),
        [u32::from(b'{')],
        "the schema holds the body"
    );
    assert!(feed(&mut g, &bytes(r#"{"n": 42}"#)));
    assert_eq!(allowed(&mut g), [RETURN]);
}

/// A required call: any thinking, then the header of a call to one of the tools, its
/// arguments held to its parameters, `<|call|>`; a named choice allows that tool alone.
#[test]
fn a_required_call_is_a_message_to_a_function_with_its_arguments() {
    let model = harmony_model();
    let call = |name: &str| {
        let mut ids = vec![CHANNEL];
        ids.extend(bytes(&format!("commentary to=functions.{name} ")));
        ids.extend([CONSTRAIN]);
        ids.extend(bytes("json"));
        ids.push(MESSAGE);
        ids
    };
    let req = request(None, tools(ToolChoice::Required)).expect("valid");
    let mut g = guide(&model, &req);
    assert!(!feed(&mut g, &thinking("I should call it.")));
    assert!(!feed(&mut g, &call("get_weather")));
    assert_eq!(allowed(&mut g), [u32::from(b'{')]);
    assert!(!feed(&mut g, &bytes(r#"{"city": "Paris"}"#)));
    assert_eq!(allowed(&mut g), [CALL]);
    assert!(feed(&mut g, &[CALL]));
    // No final answer under `required`; without thinking, the call comes at once.
    let mut g = guide(&model, &req);
    assert!(!feed(&mut g, &[CHANNEL]));
    assert_eq!(allowed(&mut g), [u32::from(b'c'), ANALYSIS]);
    assert!(!feed(&mut g, &call("get_time")[1..]));
    // A named choice: that function alone.
    let named = ToolChoice::Named("get_time".into());
    let req = request(None, tools(named)).expect("valid");
    let mut g = guide(&model, &req);
    feed(&mut g, &[CHANNEL]);
    feed(&mut g, &bytes("commentary to=functions.get_"));
    let next = allowed(&mut g);
    assert!(next.contains(&u32::from(b't')) && !next.contains(&u32::from(b'w')));
}

/// Under `auto` with a response format, the model answers in the format or calls; `auto`
/// alone leaves the output free; `required` with a response format cannot be met.
#[test]
fn what_auto_required_and_formats_together_ask() {
    let model = harmony_model();
    let req = request(Some(&schema()), tools(ToolChoice::Auto)).expect("valid");
    let mut g = guide(&model, &req);
    feed(&mut g, &[CHANNEL]);
    assert_eq!(allowed(&mut g), [u32::from(b'c'), FINAL, ANALYSIS]);
    let free = request(None, tools(ToolChoice::Auto)).expect("valid");
    assert_eq!(free.worker_request().grammar, None);
    let e = request(Some(&schema()), tools(ToolChoice::Required)).expect_err("both");
    assert!(
        e.to_string().contains("`tools`: tools that must be called"),
        "{e}"
    );
}

/// A prompt that opened a thinking body starts the grammar inside it; one that opened the
/// answer's body is all answer, where no call can be made.
#[test]
fn the_grammar_starts_where_the_prompt_left_the_output() {
    let answer = || Some(schema().spec);
    let Some(ferrite_text::Reasoning::Harmony(h)) = harmony_model().reasoning else {
        panic!("served with harmony")
    };
    let grammar = |state, answer, tools| grammar(&h, state, answer, tools);
    let thinking = grammar(State::Thinking, answer(), None).expect("ok");
    let model = harmony_model();
    let vocabulary = model.vocabulary().expect("vocabulary");
    let built = thinking.expect("a grammar").grammar().expect("built");
    let mut g = vocabulary.compile(&built).expect("compiled");
    assert!(!feed(&mut g, &bytes("the rest of a thought")));
    assert!(!feed(&mut g, &[END, START]));
    assert!(!feed(&mut g, &bytes("assistant")));
    assert!(!feed(&mut g, &[CHANNEL, FINAL, MESSAGE]));
    assert!(feed(&mut g, &bytes(r#"{"n": 1}"#)));
    assert_eq!(grammar(State::Answering, answer(), None), Ok(answer()));
    let required = tools(ToolChoice::Required);
    let e = grammar(State::Answering, None, required.as_deref()).expect_err("no call");
    assert!(e.contains("opened the final answer"), "{e}");
    assert_eq!(grammar(State::Start, None, None), Ok(None));
}

/// The function a header names, decoded run by run, wherever the recipient stands.
#[test]
fn a_headers_recipient_names_the_function() {
    let model = harmony_model();
    let runs = |texts: &[&str]| -> Vec<Vec<u32>> { texts.iter().map(|t| bytes(t)).collect() };
    let name = |texts: &[&str]| function(&model.tokenizer, &runs(texts)).expect("decoded");
    let called = name(&["commentary to=functions.get_weather ", "json"]);
    assert_eq!(called.as_deref(), Some("get_weather"));
    let role = name(&["assistant to=functions.f", "commentary json"]);
    assert_eq!(role.as_deref(), Some("f"));
    assert_eq!(name(&["commentary"]), None, "a preamble");
    assert_eq!(
        name(&["analysis to=browser.search"]),
        None,
        "a built-in tool"
    );
}

/// A conversation that called a tool, as a client sends it back: the call's thinking reaches
/// gpt-oss's template as `thinking` (which it writes before the call), the arguments as an
/// object, the result as the function's message; the output starts in a header again.
#[test]
fn a_past_call_renders_with_its_thinking_for_the_next_turn() {
    let model = harmony_model();
    let mut called = tools::chat_message(
        "assistant",
        String::new(),
        vec![
            tools::PastCall::new("c1".into(), "get_weather".into(), r#"{"city":"Paris"}"#)
                .expect("call"),
        ],
        None,
    )
    .expect("assistant");
    called.reasoning_content = Some("Need the weather.".into());
    let result = tools::chat_message("tool", "18 °C".into(), Vec::new(), Some("c1".into()));
    let chat = Prompt::Chat(Chat::new(vec![
        ChatMessage::new("user", "Paris?"),
        called,
        result.expect("tool"),
    ]));
    let t = tools(ToolChoice::Auto);
    let (ids, rendered) = crate::validate::tokenize(&model, &chat, t.as_deref()).expect("rendered");
    let rendered = rendered.expect("a chat's render");
    let want = "<|start|>user<|message|>Paris?<|end|>\
        <|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>\
        <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>\
        {\"city\": \"Paris\"}<|call|>\
        <|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"18 °C\"<|end|>\
        <|start|>assistant";
    assert!(rendered.ends_with(want), "{rendered}");
    let Some(ferrite_text::Reasoning::Harmony(h)) = model.reasoning else {
        panic!("served with harmony")
    };
    assert_eq!(h.state_after(&ids), State::Start);
}

/// The ids of gpt-oss output `name` of `harmony_reference.json` (openai-harmony's encoding).
pub(crate) fn reference_ids(name: &str) -> Vec<u32> {
    let f: serde_json::Value =
        serde_json::from_str(&fixture("text/harmony_reference.json")).expect("json");
    serde_json::from_value(f["outputs"][name]["ids"].clone()).expect("ids")
}

/// gpt-oss's outputs in its own vocabulary, as openai-harmony encodes them, follow the
/// grammars built for them: a required call (its header in the tokens gpt-oss writes:
/// `comment`, `ary`, ` to`, `=`, `functions`, `.get`, `_weather`, ` `) to `<|call|>`, and a
/// response format after thinking, ended by `<|return|>`.
#[test]
fn gpt_oss_outputs_in_its_own_vocabulary_follow_the_grammars() {
    let model = o200k_model();
    let chat = Prompt::Chat(Chat::new(vec![ChatMessage::new("user", "Paris?")]));
    let params = json!({"type": "object", "properties": {"location": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["location"]});
    let weather = Function::new("get_weather", None, Some(params)).expect("f");
    let tools = Tools::new(vec![weather], ToolChoice::Required, true).expect("tools");
    let req = validate(model.clone(), 4096, &chat, None, None, tools.map(Arc::new));
    let mut g = guide(&model, &req.expect("valid"));
    let ids = reference_ids("call_named_in_the_channel");
    let ended = ids.iter().map(|&t| g.accept(t).expect("accepted")).last();
    assert_eq!(ended, Some(true), "done at <|call|>");
    let answer = Constraint {
        spec: Spec::Regex("The capital of France is [A-Z][a-z]+\\.".into()),
        field: "structured_outputs",
    };
    let req = validate(model.clone(), 4096, &chat, None, Some(&answer), None);
    let mut g = guide(&model, &req.expect("valid"));
    let ids = reference_ids("think_then_answer");
    let (last, answer) = ids.split_last().expect("ids");
    let ended = answer
        .iter()
        .map(|&t| g.accept(t).expect("accepted"))
        .last();
    assert_eq!(ended, Some(true), "done at the answer's end");
    assert!(allows(&mut g, *last), "<|return|> ends it");
}
