//! Structured outputs, tool calls and log-probabilities on both APIs of `ferrite serve`: the
//! official `openai` client (`tests/clients/structured_client.py`: a Pydantic `parse`, a choice
//! list, a regex, a streamed JSON schema, a Lark grammar, tool calls, logprobs, a logit bias,
//! and every kind of bad constraint or bias), and `ferrite.v1.Inference` with a JSON schema.
//! And the same through OpenAI's Responses API (`tests/clients/responses_client.py`).

use std::time::Duration;

use anyhow::{Context, Result};
use ferrite_cluster_tests::cluster::{ServeProc, channel};
use ferrite_cluster_tests::grpc::{self, greedy_chat};
use ferrite_cluster_tests::python::run_client;
use ferrite_cluster_tests::{MODEL, serial};
use ferrite_proto::v1::generate_request::Constraint;
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::v1::{FinishReason, Tool};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_follow_their_constraints_on_both_apis_and_bad_ones_are_refused_by_field()
-> Result<()> {
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    let (grpc_addr, http_addr) = (serve.grpc, serve.http);

    let base = format!("http://{http_addr}/v1");
    let client_args = ["--base-url", &base, "--model", MODEL].map(String::from);
    let out = run_client(
        "structured_client.py",
        &client_args,
        Duration::from_secs(240),
    )
    .await?;
    let show = serde_json::to_string_pretty(&out)?;
    check_openai(&out).with_context(|| show.clone())?;

    // gRPC: a JSON schema constraint, and a regex llguidance cannot compile.
    let mut client = InferenceClient::new(channel(grpc_addr).await?);
    let schema = json!({"type": "object", "required": ["city"], "additionalProperties": false,
        "properties": {"city": {"enum": ["Paris", "Lyon"]}}});
    let mut req = greedy_chat("Which city is the capital of France? Answer in JSON.", 40);
    if let Some(s) = req.sampling.as_mut() {
        s.ignore_eos = false;
    }
    req.constraint = Some(Constraint::JsonSchema(schema.to_string()));
    let c = grpc::generate(&mut client, req.clone()).await?;
    let value: Value = serde_json::from_str(&c.text).with_context(|| c.text.clone())?;
    assert!(
        value == json!({"city": "Paris"}) || value == json!({"city": "Lyon"}),
        "{value}"
    );
    assert_eq!(c.finish.map(|f| f.reason()), Some(FinishReason::Stop));
    req.constraint = Some(Constraint::Regex("(unclosed".into()));
    let e = grpc::generate(&mut client, req).await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("`regex`:"), "{}", e.message());

    // gRPC tools: a required call comes back in the finish. (The model writes two calls in 46
    // tokens; with 60 to spend, its guide closed the second early, with `length`.)
    let mut req = greedy_chat("What is the weather in Paris?", 100);
    req.tools = vec![Tool {
        name: "get_weather".into(),
        description: "The weather in a city".into(),
        parameters: json!({"type": "object", "required": ["city"],
            "properties": {"city": {"type": "string"}}})
        .to_string(),
    }];
    req.tool_choice = "required".into();
    let c = grpc::generate(&mut client, req.clone()).await?;
    let finish = c.finish.context("a finish")?;
    assert_eq!(finish.reason(), FinishReason::ToolCalls, "{finish:?}");
    let call = finish.tool_calls.first().context("a call")?;
    assert_eq!(call.name, "get_weather");
    let args: Value = serde_json::from_str(&call.arguments)?;
    assert!(args["city"].is_string(), "{args}");
    req.tool_choice = "nowhere".into();
    let e = grpc::generate(&mut client, req).await.expect_err("refused");
    assert!(e.message().starts_with("`tool_choice`:"), "{}", e.message());
    Ok(())
}

/// Tool calls: well-formed calls of the request's tools, `tool_calls` as the finish when the
/// model chose to call and `stop` for a named function, the call's head before its arguments
/// when streamed (and they in pieces, as written), and a final answer in text after the tool's.
fn check_tools(tools: &Value) -> Result<()> {
    let well_formed = |calls: &Value, names: &[&str]| -> Result<usize> {
        let calls = calls.as_array().context("calls")?;
        for c in calls {
            let name = c["name"].as_str().unwrap_or_default();
            anyhow::ensure!(names.contains(&name), "a call of {name}");
            anyhow::ensure!(c["arguments"]["city"].is_string(), "its arguments: {c}");
            anyhow::ensure!(c["id"].as_str().is_some_and(|i| i.starts_with("call_")));
        }
        Ok(calls.len())
    };
    let both = ["get_weather", "get_time"];
    let required = &tools["required"];
    anyhow::ensure!(required["finish"] == "tool_calls", "required: {required}");
    anyhow::ensure!(well_formed(&required["calls"], &both)? >= 1);
    let named = &tools["named"];
    anyhow::ensure!(named["finish"] == "stop", "named: {named}");
    anyhow::ensure!(well_formed(&named["calls"], &["get_weather"])? == 1);
    let auto = &tools["auto"];
    let called = well_formed(&auto["calls"], &both)? > 0;
    anyhow::ensure!(
        (called && auto["finish"] == "tool_calls") || (!called && auto["content"].is_string()),
        "auto: {auto}"
    );
    let streamed = &tools["streamed"];
    anyhow::ensure!(streamed["finish"] == "tool_calls", "streamed: {streamed}");
    anyhow::ensure!(well_formed(&streamed["calls"], &both)? >= 1);
    let order = streamed["order"].as_array().context("order")?;
    anyhow::ensure!(order.iter().all(|o| o == "head"), "streamed: {streamed}");
    // The arguments come as the model writes them: in several pieces, not whole at the end.
    let pieces = streamed["argument_pieces"].as_array().context("pieces")?;
    anyhow::ensure!(
        pieces.iter().all(|n| n.as_u64().is_some_and(|n| n >= 2)),
        "streamed: {streamed}"
    );
    let last = &tools["final"];
    anyhow::ensure!(
        last["finish"] == "stop" && last["calls"] == json!([]),
        "final: {last}"
    );
    anyhow::ensure!(last["content"].as_str().is_some_and(|c| !c.is_empty()));
    Ok(())
}

/// What the official client got back (see structured_client.py).
fn check_openai(out: &Value) -> Result<()> {
    let parsed = &out["parsed"];
    anyhow::ensure!(parsed["finish"] == "stop", "parse ended by its grammar");
    anyhow::ensure!(parsed["parsed"]["name"].is_string(), "a parsed City");
    anyhow::ensure!(
        parsed["parsed"]["population"].is_i64(),
        "an integer population"
    );

    let choice = &out["choice"];
    anyhow::ensure!(choice["in_choices"] == true && choice["finish"] == "stop");
    anyhow::ensure!(
        choice["logprob_tokens"] == choice["content"],
        "logprobs cover the text"
    );
    anyhow::ensure!(choice["bytes_match"] == true);
    let counts = choice["top_counts"].as_array().context("top counts")?;
    anyhow::ensure!(
        counts.iter().all(|n| n == 3),
        "three alternatives per token"
    );
    let logprobs = choice["logprobs"].as_array().context("logprobs")?;
    anyhow::ensure!(
        logprobs
            .iter()
            .all(|l| l.as_f64().is_some_and(|l| l <= 0.0))
    );

    let regex = &out["regex"];
    anyhow::ensure!(regex["matches"] == true && regex["finish"] == "stop");
    anyhow::ensure!(
        regex["tokens"] == regex["text"],
        "completions' logprobs cover the text"
    );
    let offsets = regex["offsets"].as_array().context("offsets")?;
    anyhow::ensure!(offsets.first() == Some(&json!(0)), "offsets start at 0");
    anyhow::ensure!(
        regex["top"]
            .as_array()
            .is_some_and(|t| t.iter().all(|n| n == 2))
    );

    anyhow::ensure!(out["stream"]["valid"] == true && out["stream"]["finish"] == "stop");
    let city = out["lark"]["content"].as_str().context("lark")?;
    anyhow::ensure!(["Paris", "Rome", "Tokyo"].contains(&city), "{city}");

    check_tools(&out["tools"])?;

    let bias = &out["logit_bias"];
    anyhow::ensure!(
        bias["content"] == ",,,,,," && bias["finish"] == "length",
        "{bias}"
    );
    // The first comma is far from the model's choice (it says "Hello"): its logprob is the
    // model's, not the biased distribution's ≈ 0.
    anyhow::ensure!(
        bias["logprobs"][0].as_f64().is_some_and(|l| l < -1.0),
        "{bias}"
    );
    anyhow::ensure!(bias["top"][0] != ",", "{bias}");

    let refused = &out["refused"];
    let fields = [
        ("schema_not_compiled", "response_format"),
        ("schema_not_json", "structured_outputs"),
        ("schema_not_object", "response_format"),
        ("regex", "structured_outputs"),
        ("lark", "structured_outputs"),
        ("too_big", "structured_outputs"),
        ("empty_choice", "structured_outputs"),
        ("two_constraints", "structured_outputs"),
        ("wizard_role", "messages"),
        ("tool_message", "messages"),
        ("top_logprobs_alone", "top_logprobs"),
        ("missing_function", "tool_choice"),
        ("bad_tool_name", "tools"),
        ("logit_bias_key", "logit_bias"),
    ];
    for (case, field) in fields {
        let r = &refused[case];
        anyhow::ensure!(r["status"] == 400 && r["param"] == field, "{case}: {r}");
    }
    // Ranges and the vocabulary are checked past the parsing: the message names the field.
    for case in ["logit_bias_range", "logit_bias_vocabulary"] {
        let r = &refused[case];
        let named = r["message"]
            .as_str()
            .is_some_and(|m| m.contains("logit_bias"));
        anyhow::ensure!(r["status"] == 400 && named, "{case}: {r}");
    }
    // llguidance's own reasons reach the client.
    let reason = refused["regex"]["message"].as_str().unwrap_or_default();
    anyhow::ensure!(reason.contains("unclosed group"), "{reason}");
    anyhow::ensure!(refused["served_on"] == true);
    Ok(())
}

/// A JSON schema under speculative decoding: `ferrite serve` with 4 drafts a step and one
/// without (both with exact f32 activations) write the same list of people, greedy, and the
/// one with drafts accepted some (the objects repeat their keys, which the drafts copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_under_speculative_decoding_gives_the_same_output() -> Result<()> {
    let _turn = serial().await;
    let f32 = ("FERRITE_CPU_ACTIVATIONS".to_owned(), "f32".to_owned());
    let drafts = ("FERRITE_NUM_SPECULATIVE_TOKENS".to_owned(), "4".to_owned());
    let schema = json!({"type": "array", "minItems": 4, "maxItems": 4, "items": {
        "type": "object", "additionalProperties": false, "required": ["name", "age", "city"],
        "properties": {"name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "city": {"type": "string", "maxLength": 12}}}});
    let mut req = greedy_chat(
        "List four people with their name, age and city, in JSON.",
        160,
    );
    req.constraint = Some(Constraint::JsonSchema(schema.to_string()));
    let mut texts = Vec::new();
    for env in [vec![f32.clone()], vec![f32.clone(), drafts.clone()]] {
        let serve = ServeProc::start_with_env(&env).await?;
        let mut client = InferenceClient::new(channel(serve.grpc).await?);
        let c = grpc::generate(&mut client, req.clone()).await?;
        let people: Value = serde_json::from_str(&c.text).with_context(|| c.text.clone())?;
        assert_eq!(people.as_array().map(Vec::len), Some(4), "{people}");
        let m = ferrite_cluster_tests::metrics::scrape(serve.http).await?;
        let accepted = ferrite_cluster_tests::metrics::sample(
            &m,
            &format!("ferrite_spec_decode_num_accepted_tokens_total{{model_name={MODEL}}}"),
        );
        texts.push((c.text, accepted));
    }
    assert_eq!(texts[0].0, texts[1].0);
    assert_eq!(texts[0].1, 0.0);
    assert!(texts[1].1 >= 10.0, "{} drafts accepted", texts[1].1);
    Ok(())
}

/// The Responses API through the official `openai` client (`tests/clients/responses_client.py`):
/// the chat endpoint's greedy text for the same messages (instructions and a developer
/// message as system messages), an answer cut by `max_output_tokens` as incomplete, the typed
/// stream in order, logprobs, `responses.parse`, function calls (required, streamed, a round
/// trip with their outputs), a response continued by `previous_response_id`, retrieved and
/// deleted, and what is not served refused by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_responses_api_answers_the_official_client_as_the_chat_endpoint_does() -> Result<()> {
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    let base = format!("http://{}/v1", serve.http);
    let args = ["--base-url", &base, "--model", MODEL].map(String::from);
    let out = run_client("responses_client.py", &args, Duration::from_secs(240)).await?;
    let show = serde_json::to_string_pretty(&out)?;
    check_responses(&out).with_context(|| show.clone())
}

fn check_responses(out: &Value) -> Result<()> {
    let t = &out["texts"];
    anyhow::ensure!(t["text"] == t["chat"] && t["text"].as_str().is_some_and(|s| !s.is_empty()));
    anyhow::ensure!(t["instructed"] == t["instructed_chat"] && t["status"] == "completed");
    anyhow::ensure!(t["id"].as_str().is_some_and(|i| i.starts_with("resp_")));
    let usage = &t["usage"];
    anyhow::ensure!(usage["input_tokens"].as_u64().is_some_and(|n| n > 0));
    anyhow::ensure!(
        usage["total_tokens"].as_u64()
            == Some(
                usage["input_tokens"].as_u64().unwrap_or(0)
                    + usage["output_tokens"].as_u64().unwrap_or(0)
            )
    );
    anyhow::ensure!(
        t["cut"]
            == json!({"status": "incomplete", "reason": "max_output_tokens", "output_tokens": 3})
    );

    let s = &out["stream"];
    let types: Vec<&str> = s["types"]
        .as_array()
        .context("types")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let (head, tail) = (&types[..4], &types[types.len() - 4..]);
    anyhow::ensure!(
        head == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    anyhow::ensure!(
        tail == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let sequence: Vec<u64> = s["sequence"]
        .as_array()
        .context("sequence")?
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    anyhow::ensure!(sequence == (0..types.len() as u64).collect::<Vec<_>>());
    anyhow::ensure!(s["deltas"].as_u64().is_some_and(|n| n >= 2) && s["joined"] == s["final_text"]);

    let l = &out["logprobs"];
    anyhow::ensure!(l["tokens"] == l["text"] && l["all_negative"] == true);
    let counts = l["top_counts"].as_array().context("counts")?;
    anyhow::ensure!(!counts.is_empty() && counts.iter().all(|c| c == 2));

    let p = &out["parsed"];
    anyhow::ensure!(p["status"] == "completed" && p["parsed"]["name"].is_string());
    anyhow::ensure!(p["parsed"]["population"].is_i64());

    let c = &out["calls"];
    let calls = c["calls"].as_array().context("calls")?;
    anyhow::ensure!(!calls.is_empty());
    for call in calls {
        anyhow::ensure!(call["name"] == "get_weather" && call["arguments"]["city"].is_string());
        anyhow::ensure!(
            call["call_id"]
                .as_str()
                .is_some_and(|i| i.starts_with("call_"))
        );
    }
    // The tool's output reached the model: its answer is text, and uses it.
    anyhow::ensure!(c["answer_types"] == json!(["message"]));
    anyhow::ensure!(c["answer"].as_str().is_some_and(|a| a.contains("22")));
    let streamed: Vec<&str> = c["stream_types"]
        .as_array()
        .context("stream types")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let added = streamed
        .iter()
        .position(|t| *t == "response.output_item.added");
    let delta = streamed
        .iter()
        .position(|t| *t == "response.function_call_arguments.delta");
    anyhow::ensure!(
        added.is_some() && added < delta,
        "the call's item before its arguments"
    );
    anyhow::ensure!(c["argument_pieces"].as_u64().is_some_and(|n| n >= 2));
    anyhow::ensure!(c["joined"] == c["final_arguments"]);

    for (case, status, param) in [
        ("previous_response_id", 404, "previous_response_id"),
        ("hosted_tool", 400, "tools"),
        ("image", 400, "input"),
    ] {
        let r = &out["refused"][case];
        anyhow::ensure!(r["status"] == status && r["param"] == param, "{case}: {r}");
    }
    // Continued by `previous_response_id`: the chat endpoint's answer to the whole
    // conversation; kept until deleted; none kept with `store: false`.
    let k = &out["kept"];
    anyhow::ensure!(
        k["continued"] == k["chat"] && k["previous"] == k["r1"],
        "{k}"
    );
    anyhow::ensure!(k["retrieved"] == true && k["after_delete"] == 404, "{k}");
    anyhow::ensure!(k["unkept_store"] == false && k["unkept"] == 404, "{k}");
    Ok(())
}
