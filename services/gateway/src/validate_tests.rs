//! Validation against a small word-level tokenizer: prompts of each form, vocabulary and
//! context limits, and every sampling range.

use super::*;

/// The context length of the test model's pools.
const CONTEXT: usize = 16;

fn model() -> Arc<ModelText> {
    crate::models::testing::word_model()
}

/// A request of token 1 that leaves every option unset.
fn plain(text: Arc<ModelText>) -> ValidatedRequest {
    validate(text, CONTEXT, &Prompt::TokenIds(vec![1]), None, None, None).expect("ok")
}

/// Sets one sampling parameter.
type SetSampling = fn(&mut api::SamplingParams);

fn sampling(f: impl FnOnce(&mut api::SamplingParams)) -> Option<api::SamplingParams> {
    let mut s = api::SamplingParams {
        max_tokens: Some(4),
        ..api::SamplingParams::default()
    };
    f(&mut s);
    Some(s)
}

fn refused(prompt: &Prompt, s: Option<api::SamplingParams>) -> String {
    match validate(model(), CONTEXT, prompt, s, None, None) {
        Err(GatewayError::InvalidArgument(m)) => m,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

#[test]
fn prompts_of_each_form_become_ids() {
    let text = validate(
        model(),
        CONTEXT,
        &Prompt::Text("a b c".into()),
        None,
        None,
        None,
    )
    .expect("text");
    assert_eq!(text.prompt_ids(), [1, 2, 3]);
    assert_eq!(text.model().digest.as_deref(), Some("d1"));
    let chat = Prompt::Chat(Chat::new(vec![ChatMessage::new("user", "x y")]));
    let chat = validate(model(), CONTEXT, &chat, None, None, None).expect("chat");
    assert_eq!(chat.prompt_ids(), [4, 5, 6, 7]);
    let ids = validate(
        model(),
        CONTEXT,
        &Prompt::TokenIds(vec![7, 0]),
        None,
        None,
        None,
    )
    .expect("ids");
    assert_eq!(ids.prompt_ids(), [7, 0]);
}

#[test]
fn defaults_fill_the_worker_request() {
    let v = plain(model());
    let s = v.sampling();
    // Unset, max_tokens is what the context leaves (16 - 1), below the default.
    assert_eq!(s.max_tokens, 15);
    assert_eq!(
        (s.temperature, s.top_p, s.repetition_penalty),
        (1.0, 1.0, 1.0)
    );
}

#[test]
fn prompts_outside_the_model_are_refused() {
    assert!(refused(&Prompt::Text(String::new()), None).contains("empty"));
    assert!(refused(&Prompt::TokenIds(vec![]), None).contains("empty"));
    assert!(refused(&Prompt::Chat(Chat::new(vec![])), None).contains("no messages"));
    assert!(refused(&Prompt::TokenIds(vec![1, 8]), None).contains("token id 8"));
    let long = Prompt::TokenIds(vec![1; 16]);
    assert!(refused(&long, None).contains("context length"));
    let room = refused(
        &Prompt::TokenIds(vec![1; 10]),
        sampling(|s| s.max_tokens = Some(7)),
    );
    assert!(room.contains("between 1 and 6"), "{room}");
    let stop = refused(
        &Prompt::TokenIds(vec![1]),
        sampling(|s| s.stop = vec![String::new()]),
    );
    assert!(stop.contains("stop"), "{stop}");
}

#[test]
fn every_sampling_range_is_checked_here() {
    let cases: [(&str, SetSampling); 8] = [
        ("temperature", |s| s.temperature = Some(-1.0)),
        ("temperature", |s| s.temperature = Some(f32::INFINITY)),
        ("top_p", |s| s.top_p = Some(1.5)),
        ("min_p", |s| s.min_p = Some(-0.1)),
        ("repetition_penalty", |s| s.repetition_penalty = Some(0.0)),
        ("presence_penalty", |s| s.presence_penalty = Some(3.0)),
        ("frequency_penalty", |s| s.frequency_penalty = Some(-2.5)),
        ("logprobs", |s| s.logprobs = Some(21)),
    ];
    for (field, f) in cases {
        let m = refused(&Prompt::TokenIds(vec![1]), sampling(f));
        assert!(m.starts_with(field), "{field}: {m}");
    }
}

#[test]
fn unset_fields_take_the_models_recommendation_and_set_ones_win() {
    let text = crate::models::testing::word_model_with(api::SamplingDefaults {
        temperature: Some(0.2),
        top_p: Some(0.9),
        repetition_penalty: Some(1.1),
        ..api::SamplingDefaults::default()
    });
    let unset = plain(text.clone());
    let s = unset.sampling();
    assert_eq!(
        (
            s.temperature,
            s.top_p,
            s.top_k,
            s.min_p,
            s.repetition_penalty
        ),
        (0.2, 0.9, 0, 0.0, 1.1)
    );
    let own = sampling(|s| {
        s.temperature = Some(1.0);
        s.top_p = Some(1.0);
    });
    let set = validate(text, CONTEXT, &Prompt::TokenIds(vec![1]), own, None, None).expect("ok");
    let s = set.sampling();
    assert_eq!(
        (s.temperature, s.top_p, s.repetition_penalty),
        (1.0, 1.0, 1.1)
    );
}

#[test]
fn tools_reach_a_template_that_takes_them_and_the_others_in_a_system_message() {
    use crate::tools::{Function, ToolChoice, ToolFormat, Tools};
    let tools = Arc::new(Tools {
        functions: vec![Function {
            name: "lookup".into(),
            description: None,
            parameters: serde_json::json!({"type": "object"}),
        }],
        choice: ToolChoice::Auto,
        parallel: true,
    });
    let chat = Prompt::Chat(Chat::new(vec![ChatMessage::new("user", "a")]));
    // A Hermes-style template lists the tools itself; under `auto` nothing constrains.
    let hermes = crate::models::testing::word_model_of(
        api::SamplingDefaults::default(),
        "{% for t in tools %}{{ t.function.name }} {% endfor %}<tool_call>\
         {% for m in messages %}{{ m.content }}{% endfor %}",
    );
    let (_, rendered) = tokenize(&hermes, &chat, Some(&tools)).expect("rendered");
    assert_eq!(rendered.as_deref(), Some("lookup <tool_call>a"));
    let v = validate(hermes, 64, &chat, None, None, Some(tools.clone())).expect("valid");
    assert_eq!(v.tools().map(|(_, f)| *f), Some(ToolFormat::Hermes));
    assert!(v.worker_request().grammar.is_none());
    // The word model's template ignores tools: they come in a system message.
    let (_, rendered) = tokenize(&model(), &chat, Some(&tools)).expect("rendered");
    let rendered = rendered.expect("a chat");
    assert!(
        rendered.starts_with("system : You can call these tools:"),
        "{rendered}"
    );
    assert!(
        rendered.contains("\"lookup\"") && rendered.ends_with("user : a "),
        "{rendered}"
    );
}

/// `chat_template_kwargs` reach the template, over the model's defaults; one that would
/// replace a variable the server sets is refused, naming the field.
#[test]
fn template_kwargs_reach_the_template() {
    let think = crate::models::testing::think_model("qwen3");
    let chat = |kwargs: &str| {
        Chat::new(vec![ChatMessage::new("user", "x")])
            .with_kwargs_json(kwargs)
            .map(Prompt::Chat)
    };
    let ids = |p: &Prompt| {
        validate(think.clone(), CONTEXT, p, None, None, None)
            .expect("valid")
            .prompt_ids()
            .to_vec()
    };
    assert_eq!(ids(&chat("").expect("none")), [4, 5, 6]);
    let off = chat(r#"{"enable_thinking": false}"#).expect("an object");
    assert_eq!(ids(&off), [4, 5, 6, 8, 9]);
    // The model's default, and a request's over it.
    let defaults =
        crate::models::testing::think_model_with("qwen3", Some(r#"{"enable_thinking": false}"#));
    let on = chat(r#"{"enable_thinking": true}"#).expect("an object");
    let with = |p: &Prompt| {
        validate(defaults.clone(), CONTEXT, p, None, None, None)
            .expect("valid")
            .prompt_ids()
            .len()
    };
    assert_eq!((with(&chat("").expect("none")), with(&on)), (5, 3));
    for bad in [r#"{"messages": []}"#, "[1]", "{"] {
        match chat(bad) {
            Err(GatewayError::InvalidField { field, message }) => {
                assert_eq!(field, "chat_template_kwargs", "{message}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

/// A reasoning model's chat says where its thinking is (for the worker, when a grammar must
/// hold the answer alone: the cluster tests constrain one); completions and other models'
/// chats have none, and an unconstrained request sends none.
#[test]
fn a_reasoning_chat_says_where_its_thinking_is() {
    let think = crate::models::testing::think_model("deepseek_r1");
    let span = |text: &Arc<ModelText>, prompt: &Prompt| {
        let req = validate(text.clone(), CONTEXT, prompt, None, None, None).expect("valid");
        assert_eq!(req.worker_request().reasoning, None, "no grammar");
        req.reasoning_span()
    };
    let chat = Prompt::Chat(Chat::new(vec![ChatMessage::new("user", "x")]));
    let want = pb::ReasoningSpan {
        start_token: 8,
        end_token: 9,
        start: pb::ReasoningStart::Thinking as i32,
    };
    assert_eq!(span(&think, &chat), Some(want));
    // The prompt closed the block: the answer starts with the output.
    let closed = Prompt::Chat(
        Chat::new(vec![ChatMessage::new("user", "x")])
            .with_kwargs_json(r#"{"enable_thinking": false}"#)
            .expect("kwargs"),
    );
    let answering = pb::ReasoningStart::Answering as i32;
    assert_eq!(span(&think, &closed).map(|s| s.start), Some(answering));
    assert_eq!(span(&think, &Prompt::Text("a".into())), None);
    assert_eq!(span(&model(), &chat), None);
}
