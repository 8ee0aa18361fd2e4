//! Reasoning models served end to end: worker processes serving the tiny reasoning model of
//! `tests/fixtures/models/generate_think.py` (its greedy answer thinks "Hm!" between
//! `<think>` and `</think>`, then says "OK", as transformers generates it) with
//! `--reasoning-parser qwen3`, and with `deepseek_r1` and template defaults that turn
//! thinking off, behind one gateway. OpenAI's official client reads the thinking apart from
//! the answer, whole and streamed; `chat_template_kwargs` reach the template; a JSON schema
//! holds the answer and leaves the thinking free; the Responses API gives a reasoning item.
//! A parser whose markers are not tokens of the model is refused at start-up. gpt-oss (the
//! tiny random one of `generate_gpt_oss.py` with harmony's tokens, `gpt_oss_chat`) calls
//! tools and answers in a JSON schema through the official client, held by grammars.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ferrite_cluster_tests::{Cluster, WorkerOptions, WorkerProc, grpc, http, python, serial};
use serde_json::{Value, json};

fn fixture() -> std::path::PathBuf {
    ferrite_cluster_tests::fixture_model("qwen3_think")
}

/// The fixture served as `name` with `flags`.
async fn serve(cluster: &Cluster, name: &str, flags: &[&str]) -> Result<WorkerProc> {
    WorkerProc::serve_fixture(cluster, "qwen3_think", name, flags).await
}

async fn chat(cluster: &Cluster, model: &str, extra: Value) -> Result<(u16, Value)> {
    let mut body = json!({"model": model, "temperature": 0, "max_tokens": 16,
        "messages": [{"role": "user", "content": "Is the sky blue?"}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = http::post_json(cluster.gateway.http, "/v1/chat/completions", &body).await?;
    Ok((r.status, r.json()?))
}

/// A 200's message: its thinking (null where none) and its answer.
fn parts(status: u16, body: &Value) -> Result<(Value, Value)> {
    ensure!(status == 200, "{status} {body}");
    let m = &body["choices"][0]["message"];
    Ok((m["reasoning_content"].clone(), m["content"].clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_models_thinking_comes_apart_from_its_answer() -> Result<()> {
    let _turn = serial().await;
    let expected: Value = serde_json::from_slice(&std::fs::read(fixture().join("expected.json"))?)?;
    ensure!(
        expected["cases"][0]["output"] == json!("<think>Hm!</think>OK"),
        "{expected}"
    );
    // A pool of the default model beside them (the cluster waits for one).
    let cluster = Cluster::start(&["a"], WorkerOptions::default()).await?;
    let off = r#"{"enable_thinking": false}"#;
    let r1 = [
        "--reasoning-parser",
        "deepseek_r1",
        "--default-chat-template-kwargs",
        off,
    ];
    let _workers = tokio::try_join!(
        serve(&cluster, "think", &["--reasoning-parser", "qwen3"]),
        serve(&cluster, "think_r1", &r1),
        WorkerProc::serve_fixture(&cluster, "gpt_oss_chat", "gpt-oss", &[]),
    )?;
    cluster
        .wait_listed(&["think", "think_r1", "gpt-oss"])
        .await?;
    gpt_oss(&cluster).await?;

    openai_client(&cluster).await?;
    grpc(&cluster).await?;
    // The model's defaults turn thinking off; a request turns it back on.
    let (status, body) = chat(&cluster, "think_r1", json!({})).await?;
    ensure!(
        parts(status, &body)? == (Value::Null, json!("OK")),
        "{body}"
    );
    let on = json!({"chat_template_kwargs": {"enable_thinking": true}});
    let (status, body) = chat(&cluster, "think_r1", on).await?;
    ensure!(
        parts(status, &body)? == (json!("Hm!"), json!("OK")),
        "{body}"
    );
    // include_reasoning false: the answer alone.
    let hide = json!({"include_reasoning": false});
    let (status, body) = chat(&cluster, "think", hide).await?;
    ensure!(
        parts(status, &body)? == (Value::Null, json!("OK")),
        "{body}"
    );
    // A past answer's thinking reaches the template (it renders it in a <think> block).
    let history = json!({"model": "think", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "OK", "reasoning_content": "Hm!"}]});
    let r = http::post_json(cluster.gateway.http, "/tokenize", &history).await?;
    let ids = r.json()?["tokens"].clone();
    let ids: Vec<u64> = serde_json::from_value(ids).context("tokens")?;
    ensure!(ids.contains(&258) && ids.contains(&259), "{ids:?}");
    // What cannot be a template variable is refused, naming the field.
    let bad = json!({"chat_template_kwargs": {"add_generation_prompt": false}});
    let (status, body) = chat(&cluster, "think", bad).await?;
    ensure!(status == 400, "{status} {body}");
    ensure!(body["error"]["param"] == "chat_template_kwargs", "{body}");
    refused_at_start(&cluster).await
}

/// The official client: thinking and answer whole and streamed, thinking off by
/// `chat_template_kwargs`, a schema that holds the answer only, the Responses API.
async fn openai_client(cluster: &Cluster) -> Result<()> {
    let args = [
        "--base-url".to_owned(),
        format!("http://{}", cluster.gateway.http),
        "--model".into(),
        "think".into(),
        "--question".into(),
        "Is the sky blue?".into(),
    ];
    let got = python::run_client("reasoning_client.py", &args, Duration::from_secs(90)).await?;
    let whole = &got["whole"];
    ensure!(
        whole["content"] == "OK" && whole["reasoning_content"] == "Hm!",
        "{got}"
    );
    ensure!(whole["reasoning"] == "Hm!", "{got}");
    // <think> H m ! </think> O K, and the end of the sequence.
    ensure!(
        whole["completion_tokens"] == 8 && whole["reasoning_tokens"] == 5,
        "{got}"
    );
    let streamed = &got["streamed"];
    let want = json!({"content": "OK", "reasoning_content": "Hm!", "role": "assistant"});
    ensure!(streamed == &want, "{got}");
    ensure!(got["no_thinking"]["content"] == "OK", "{got}");
    ensure!(got["no_thinking"]["reasoning_content"].is_null(), "{got}");
    // Without the thinking left free, the schema would have forbidden <think>.
    ensure!(got["schema"]["content"] == "\"NO\"", "{got}");
    ensure!(got["schema"]["reasoning_content"] == "Hm!", "{got}");
    let responses = &got["responses"];
    ensure!(
        responses["types"] == json!(["reasoning", "message"]),
        "{got}"
    );
    ensure!(responses["reasoning"] == json!(["Hm!"]), "{got}");
    ensure!(
        responses["text"] == "OK" && responses["reasoning_tokens"] == 5,
        "{got}"
    );
    Ok(())
}

/// The public gRPC API: `Delta.reasoning`, the thinking's tokens in the usage, and
/// `chat_template_kwargs` as JSON text (a bad one is INVALID_ARGUMENT).
async fn grpc(cluster: &Cluster) -> Result<()> {
    let mut client = cluster.inference().await?;
    let mut req = grpc::greedy_chat("Is the sky blue?", 16);
    req.model = "think".into();
    let c = grpc::generate(&mut client, req.clone()).await?;
    ensure!(
        (c.reasoning.as_str(), c.text.as_str()) == ("Hm!", "OK"),
        "{c:?}"
    );
    let usage = c.finish.and_then(|f| f.usage).context("usage")?;
    let details = usage.completion_tokens_details.context("details")?;
    ensure!(details.reasoning_tokens == 5, "{usage:?}");
    req.chat_template_kwargs = r#"{"enable_thinking": false}"#.into();
    let c = grpc::generate(&mut client, req.clone()).await?;
    ensure!(
        (c.reasoning.as_str(), c.text.as_str()) == ("", "OK"),
        "{c:?}"
    );
    req.chat_template_kwargs = "[1]".into();
    let e = grpc::generate(&mut client, req)
        .await
        .err()
        .context("refused")?;
    ensure!(e.code() == tonic::Code::InvalidArgument, "{e:?}");
    Ok(())
}

/// gpt-oss, served with its reasoning parser by default (its vocabulary has harmony's
/// tokens): through the official client a call by name and a required one, whole and
/// streamed, an answer in a JSON schema, a second turn after a call. The model is random: a
/// logit bias keeps it out of the thinking channel, and the grammars leave it one output.
async fn gpt_oss(cluster: &Cluster) -> Result<()> {
    let tokens = |text: &str| {
        let body = json!({"model": "gpt-oss", "prompt": text});
        async move {
            let r = http::post_json(cluster.gateway.http, "/tokenize", &body).await?;
            let ids: Vec<u32> = serde_json::from_value(r.json()?["tokens"].clone())?;
            anyhow::Ok(ids)
        }
    };
    let analysis = tokens("analysis").await?;
    ensure!(analysis.len() == 1, "{analysis:?}");
    let args = [
        "--base-url".to_owned(),
        format!("http://{}", cluster.gateway.http),
        "--model".into(),
        "gpt-oss".into(),
        "--analysis-token".into(),
        analysis[0].to_string(),
    ];
    let got = python::run_client("harmony_client.py", &args, Duration::from_secs(120)).await?;
    let weather = json!({"name": "get_weather", "arguments": {"city": "Paris"}});
    let named = &got["named"];
    ensure!(named["calls"][0]["name"] == "get_weather", "{got}");
    ensure!(
        named["calls"][0]["arguments"] == weather["arguments"],
        "{got}"
    );
    // A call by name finishes on `stop` (OpenAI's), no answer beside it.
    ensure!(named["finish_reason"] == "stop", "{got}");
    ensure!(
        named["content"].is_null() || named["content"] == "",
        "{got}"
    );
    let time = json!({"name": "get_time", "arguments": {"zone": "UTC"}});
    let streamed = &got["required_streamed"];
    let call = &streamed["calls"];
    ensure!(call == &json!([weather]) || call == &json!([time]), "{got}");
    ensure!(streamed["finish_reason"] == "tool_calls", "{got}");
    let schema = &got["schema"];
    ensure!(schema["content"] == json!({"answer": "Paris"}), "{got}");
    ensure!(schema["reasoning_content"].is_null(), "{got}");
    ensure!(schema["finish_reason"] == "stop", "{got}");
    ensure!(
        got["second_turn"]["content"] == json!({"answer": "Paris"}),
        "{got}"
    );
    // The second turn's prompt holds the call's thinking, and the call as gpt-oss wrote it.
    let history = json!({"model": "gpt-oss", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "Hm",
         "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "18"}]});
    let r = http::post_json(cluster.gateway.http, "/tokenize", &history).await?;
    let ids: Vec<u32> = serde_json::from_value(r.json()?["tokens"].clone())?;
    for part in [
        "<|start|>assistant<|channel|>analysis<|message|>Hm<|end|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}<|call|>",
    ] {
        let want = tokens(part).await?;
        ensure!(
            ids.windows(want.len()).any(|w| w == want),
            "{part}: {ids:?}"
        );
    }
    Ok(())
}

/// `--reasoning-parser` on a model whose vocabulary lacks the markers (the default model):
/// the worker does not start, and says why.
async fn refused_at_start(cluster: &Cluster) -> Result<()> {
    let options = WorkerOptions {
        extra_args: vec!["--reasoning-parser".into(), "qwen3".into()],
        ..WorkerOptions::default()
    };
    let started = WorkerProc::start(&cluster.etcd.endpoint(), "no-markers", &options).await;
    let e = format!("{:#}", started.err().context("a worker that started")?);
    ensure!(e.contains("`<think>` is not a token"), "{e}");
    Ok(())
}
