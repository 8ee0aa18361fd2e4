//! The public APIs of a cluster (real etcd, `ferrite worker` pools `a` and `b`, `ferrite
//! gateway`), through the Rust tonic client, a Python `grpcio` client and the official `openai`
//! package, compared with `ferrite generate --json`.

use std::time::Duration;

use anyhow::{Context, Result};
use ferrite_cluster_tests::grpc::{self, greedy_chat, greedy_text};
use ferrite_cluster_tests::{Cluster, MODEL, WorkerOptions, metrics, python, reference, serial};
use ferrite_proto::v1::tokenize_request::Input;
use ferrite_proto::v1::{
    ChatMessage, ChatMessages, DetokenizeRequest, FinishReason, ListModelsRequest, TokenizeRequest,
};
use futures::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
];
const CHAT: &str = "What is the tallest mountain in the world?";
const MAX_TOKENS: u32 = 16;
const PYTHON_TIMEOUT: Duration = Duration::from_secs(90);

async fn two_pools() -> Result<Cluster> {
    Cluster::start(&["a", "b"], WorkerOptions::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_through_the_gateway_equals_ferrite_generate() -> Result<()> {
    let _turn = serial().await;
    let references = futures::future::try_join_all(PROMPTS.map(|p| reference::text(p, MAX_TOKENS)));
    let (cluster, references, chat_reference) =
        tokio::try_join!(two_pools(), references, reference::chat(CHAT, MAX_TOKENS))?;
    let mut client = cluster.inference().await?;

    for (prompt, want) in PROMPTS.iter().zip(&references) {
        let got = grpc::generate(&mut client, greedy_text(prompt, MAX_TOKENS)).await?;
        assert_eq!(got.token_ids, want.token_ids, "token ids for {prompt:?}");
        assert_eq!(got.text, want.text, "text for {prompt:?}");
        let finish = got.finish.context("no finish")?;
        assert_eq!(finish.reason(), FinishReason::Length, "{prompt:?}");
        let usage = finish.usage.context("no usage")?;
        assert_eq!(
            usage.prompt_tokens as usize,
            want.prompt_token_ids.len(),
            "{prompt:?}"
        );
        assert_eq!(usage.completion_tokens, MAX_TOKENS, "{prompt:?}");
        assert!(
            finish.time_to_first_token_ms > 0.0,
            "{prompt:?}: ttft {}",
            finish.time_to_first_token_ms
        );
    }

    let chat = grpc::generate(&mut client, greedy_chat(CHAT, MAX_TOKENS)).await?;
    assert_eq!(chat.token_ids, chat_reference.token_ids, "chat token ids");
    assert_eq!(chat.text, chat_reference.text, "chat text");

    // The gateway routes at random: ask each pool directly so both are checked.
    for worker in &cluster.workers {
        let mut wc = worker.client().await?;
        for want in &references {
            let ids =
                grpc::worker_greedy(&mut wc, want.prompt_token_ids.clone(), MAX_TOKENS).await?;
            assert_eq!(
                ids, want.token_ids,
                "pool {} on {:?}",
                worker.pool, want.prompt_token_ids
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_models_tokenize_health_and_reflection() -> Result<()> {
    let _turn = serial().await;
    let cluster = two_pools().await?;
    let mut client = cluster.inference().await?;

    let models = client
        .list_models(ListModelsRequest {})
        .await?
        .into_inner()
        .models;
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0].name, MODEL);
    assert_eq!(models[0].ready_pools, 2, "{models:?}");
    assert!(models[0].max_model_len >= 2048, "{models:?}");

    for text in PROMPTS.iter().chain([&"naïve café — 東京 🚀"]) {
        let ids = client
            .tokenize(TokenizeRequest {
                model: MODEL.into(),
                input: Some(Input::Text((*text).into())),
                add_special_tokens: None,
            })
            .await?
            .into_inner()
            .token_ids;
        assert!(!ids.is_empty(), "{text:?}");
        let back = client
            .detokenize(DetokenizeRequest {
                model: MODEL.into(),
                token_ids: ids.clone(),
                skip_special_tokens: true,
            })
            .await?
            .into_inner()
            .text;
        assert_eq!(&back, text, "round trip of {ids:?}");
    }

    let chat = client
        .tokenize(TokenizeRequest {
            model: MODEL.into(),
            input: Some(Input::Chat(ChatMessages {
                messages: vec![ChatMessage {
                    role: "user".into(),
                    content: CHAT.into(),
                    ..Default::default()
                }],
            })),
            add_special_tokens: None,
        })
        .await?
        .into_inner();
    assert!(
        chat.rendered.contains(CHAT),
        "rendered chat: {:?}",
        chat.rendered
    );
    let rendered_ids = client
        .tokenize(TokenizeRequest {
            model: MODEL.into(),
            input: Some(Input::Text(chat.rendered.clone())),
            add_special_tokens: Some(false),
        })
        .await?
        .into_inner()
        .token_ids;
    assert_eq!(
        chat.token_ids, rendered_ids,
        "a chat's ids are its rendered text's ids"
    );

    let unknown = client
        .tokenize(TokenizeRequest {
            model: "no-such-model".into(),
            input: Some(Input::Text("hi".into())),
            add_special_tokens: None,
        })
        .await
        .expect_err("an unknown model");
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");

    let channel = ferrite_cluster_tests::cluster::channel(cluster.gateway.grpc).await?;
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "ferrite.v1.Inference"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .with_context(|| format!("health of {service:?}"))?
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "health of {service:?}");
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("ferrite.v1.Inference".into()),
    ]
    .map(|m| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    });
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter(requests))
        .await?
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.next().await.context("no answer")??.message_response
    else {
        anyhow::bail!("reflection: not a service list");
    };
    let services: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["ferrite.v1.Inference", "grpc.health.v1.Health"] {
        assert!(
            services.iter().any(|s| s == want),
            "{want} not in {services:?}"
        );
    }
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        answers.next().await.context("no answer")??.message_response
    else {
        anyhow::bail!("reflection: no file descriptor for ferrite.v1.Inference");
    };
    assert!(!files.file_descriptor_proto.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_client_gets_the_rust_clients_text() -> Result<()> {
    let _turn = serial().await;
    let cluster = two_pools().await?;
    let mut client = cluster.inference().await?;
    let prompt = PROMPTS[0];
    let rust = grpc::generate(&mut client, greedy_text(prompt, MAX_TOKENS)).await?;

    let args = [
        "--addr".into(),
        cluster.gateway.grpc.to_string(),
        "--prompt".into(),
        prompt.into(),
        "--max-tokens".into(),
        MAX_TOKENS.to_string(),
    ];
    let py = python::run_client("grpc_client.py", &args, PYTHON_TIMEOUT).await?;
    assert_eq!(
        py["text"].as_str(),
        Some(rust.text.as_str()),
        "python: {py}"
    );
    let py_ids: Vec<u32> = serde_json::from_value(py["token_ids"].clone())?;
    assert_eq!(py_ids, rust.token_ids, "python: {py}");
    assert_eq!(py["finish_reason"], "FINISH_REASON_LENGTH", "python: {py}");
    assert_eq!(py["usage"]["completion_tokens"], MAX_TOKENS, "python: {py}");
    assert_eq!(py["unknown_model_code"], "NOT_FOUND", "python: {py}");
    // grpcio-reflection's default module speaks v1alpha, which the gateway serves beside v1.
    let services = &py["reflection_v1alpha"]["services"];
    assert!(
        services
            .as_array()
            .is_some_and(|s| s.contains(&"ferrite.v1.Inference".into())),
        "python: {py}"
    );
    assert_eq!(
        py["reflection_v1alpha"]["inference_file"], "ferrite/v1/inference.proto",
        "python: {py}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_gets_the_grpc_text() -> Result<()> {
    let _turn = serial().await;
    let cluster = two_pools().await?;
    let mut client = cluster.inference().await?;
    let prompt = PROMPTS[2];
    let text = grpc::generate(&mut client, greedy_text(prompt, MAX_TOKENS))
        .await?
        .text;
    let chat = grpc::generate(&mut client, greedy_chat(CHAT, MAX_TOKENS))
        .await?
        .text;

    let args = [
        "--base-url".into(),
        format!("http://{}/v1", cluster.gateway.http),
        "--prompt".into(),
        prompt.into(),
        "--chat".into(),
        CHAT.into(),
        "--max-tokens".into(),
        MAX_TOKENS.to_string(),
    ];
    let out = python::run_client("openai_client.py", &args, PYTHON_TIMEOUT).await?;
    let show = serde_json::to_string_pretty(&out)?;

    assert_eq!(out["models"], serde_json::json!([MODEL]), "{show}");
    assert_eq!(out["model"]["id"], MODEL, "{show}");
    assert!(out["model"]["max_model_len"].as_u64() > Some(0), "{show}");
    assert_eq!(out["model_unknown"]["status_code"], 404, "{show}");

    assert_eq!(
        out["completion"]["text"].as_str(),
        Some(text.as_str()),
        "{show}"
    );
    assert_eq!(out["completion"]["finish_reason"], "length", "{show}");
    assert_eq!(out["completion"]["object"], "text_completion", "{show}");
    assert_eq!(
        out["completion"]["usage"]["completion_tokens"], MAX_TOKENS,
        "{show}"
    );
    assert_eq!(
        out["completion_stream"]["text"].as_str(),
        Some(text.as_str()),
        "{show}"
    );
    assert_eq!(
        out["completion_stream"]["finish_reason"], "length",
        "{show}"
    );
    assert!(
        out["completion_stream"]["chunks"].as_u64() > Some(1),
        "{show}"
    );

    assert_eq!(
        out["chat"]["content"].as_str(),
        Some(chat.as_str()),
        "{show}"
    );
    assert_eq!(out["chat"]["role"], "assistant", "{show}");
    assert_eq!(out["chat"]["object"], "chat.completion", "{show}");
    assert_eq!(
        out["chat_stream"]["content"].as_str(),
        Some(chat.as_str()),
        "{show}"
    );
    assert_eq!(out["chat_stream"]["role"], "assistant", "{show}");
    assert_eq!(
        out["chat_stream"]["finish_reason"], out["chat"]["finish_reason"],
        "{show}"
    );

    let unknown = &out["unknown_model"];
    assert_eq!(unknown["raised"], "NotFoundError", "{show}");
    assert_eq!(unknown["is_not_found_error"], true, "{show}");
    assert_eq!(unknown["status_code"], 404, "{show}");
    assert!(
        unknown["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-model")),
        "{show}"
    );
    assert_eq!(unknown["param"], "model", "{show}");

    // Usage is streamed only when asked for, then as a last chunk of its own.
    assert_eq!(out["usage_chunks_unasked"], serde_json::json!([]), "{show}");
    let asked = out["usage_chunks_asked"]
        .as_array()
        .context("usage chunks")?;
    assert_eq!(asked.len(), 1, "{show}");
    assert_eq!(asked[0]["choices"], 0, "{show}");
    assert_eq!(asked[0]["usage"]["completion_tokens"], MAX_TOKENS, "{show}");
    // Fields ferrite does not serve are refused by name, not ignored.
    for (case, param) in [
        ("functions", "functions"),
        ("echo", "echo"),
        ("n=0", "n"),
        ("n=129", "n"),
    ] {
        let r = &out["refused"][case];
        assert_eq!(r["status_code"], 400, "{case}: {show}");
        assert_eq!(r["param"], param, "{show}");
    }
    check_choices(&out["choices"]).with_context(|| show.clone())?;
    check_echo(&out["echo"], prompt).with_context(|| show.clone())?;
    // gRPC's n: the same seeded choices, each under its index.
    let mut req = greedy_text(prompt, 6);
    req.n = 3;
    if let Some(s) = req.sampling.as_mut() {
        (s.temperature, s.seed) = (Some(1.0), Some(7));
    }
    let got = grpc::generate_choices(&mut client, req.clone()).await?;
    let texts: Vec<&str> = got.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(serde_json::json!(texts), out["choices"]["texts"], "{show}");
    req.n = 129;
    let e = grpc::generate(&mut client, req).await.expect_err("n = 129");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Every later choice went to the pool its first choice was prefilled on (of two): the
    // seeded n = 3 whole and streamed, the chats' n = 2, the batch's two prompts' n = 2, and
    // gRPC's n = 3.
    let m = metrics::scrape(cluster.gateway.http).await?;
    let key = "ferrite_gateway_route_decisions_total{policy=kv,reason=sibling}";
    let siblings = metrics::sample(&m, key);
    assert_eq!(siblings, (2 + 2 + 1 + 1 + 1 + 1 + 2) as f64, "{key}");
    Ok(())
}

/// `echo` with logprobs, from `openai_client.py`: the prompt scored alone (each token's
/// logprob but the first's, no token generated), then before 3 generated tokens, whole and
/// streamed, with the same scores.
fn check_echo(e: &serde_json::Value, prompt: &str) -> Result<()> {
    let alone = &e["alone"];
    assert_eq!(alone["text"], prompt);
    assert_eq!(alone["finish_reason"], "length");
    assert_eq!(alone["usage"]["completion_tokens"], 0);
    let scores = alone["token_logprobs"].as_array().context("scores")?;
    assert_eq!(
        Some(scores.len() as u64),
        alone["usage"]["prompt_tokens"].as_u64()
    );
    assert!(scores[0].is_null() && alone["top_logprobs"][0].is_null());
    for (j, s) in scores.iter().enumerate().skip(1) {
        let s = s.as_f64().context("a logprob")?;
        let top = alone["top_logprobs"][j].as_object().context("top")?;
        let best = top
            .values()
            .filter_map(serde_json::Value::as_f64)
            .fold(f64::MIN, f64::max);
        assert!(
            s <= 0.0 && s <= best + 1e-6,
            "position {j}: {s}, most likely {best}"
        );
    }
    let generated = &e["generated"];
    let text = generated["text"].as_str().context("text")?;
    assert!(
        text.starts_with(prompt) && text.len() > prompt.len(),
        "{text:?}"
    );
    let with = generated["token_logprobs"].as_array().context("logprobs")?;
    assert_eq!(with.len(), scores.len() + 3);
    for (a, b) in scores[1..].iter().zip(&with[1..]) {
        let (a, b) = (a.as_f64().unwrap_or(f64::NAN), b.as_f64().unwrap_or(0.0));
        assert!((a - b).abs() < 1e-3, "{a} against {b}");
    }
    assert_eq!(generated["usage"]["completion_tokens"], 3);
    assert_eq!(e["stream"]["text"], generated["text"]);
    assert_eq!(
        e["stream"]["first"]["text"], prompt,
        "the prompt comes first"
    );
    let first = e["stream"]["first"]["token_logprobs"]
        .as_array()
        .context("first")?;
    assert_eq!(first.len(), scores.len());
    Ok(())
}

/// `n`: three seeded completions (whole and streamed) and two greedy chats (whole and
/// streamed), from `openai_client.py`.
fn check_choices(c: &serde_json::Value) -> Result<()> {
    use serde_json::json;
    assert_eq!(c["indexes"], json!([0, 1, 2]));
    assert_eq!(c["finishes"], json!(["length", "length", "length"]));
    assert_eq!(c["usage"]["completion_tokens"], 18, "3 choices of 6 tokens");
    assert!(c["usage"]["prompt_tokens"].as_u64() > Some(0));
    // Choice i of the request seeded 7 is the request seeded 7 + i.
    assert_eq!(c["texts"], c["alone"]);
    let texts: std::collections::HashSet<&str> = c["texts"]
        .as_array()
        .context("texts")?
        .iter()
        .filter_map(serde_json::Value::as_str)
        .collect();
    assert!(texts.len() >= 2, "seeded choices differ");
    // Streamed, each choice's chunks add up to its text; the usage comes once, at the end.
    assert_eq!(c["stream"]["texts"], c["texts"]);
    assert_eq!(c["stream"]["finishes"], c["finishes"]);
    let usage_chunks = c["stream"]["usage_chunks"].as_array().context("usage")?;
    assert_eq!(usage_chunks.len(), 1);
    assert_eq!(usage_chunks[0]["choices"], 0);
    for count in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(
            usage_chunks[0]["usage"][count], c["usage"][count],
            "{count}"
        );
    }
    // Greedy choices are alike; a streamed chat names the role once per choice.
    let chat = &c["chat"];
    assert_eq!(chat[0]["index"], 0);
    assert_eq!(chat[1]["index"], 1);
    assert_eq!(chat[0]["content"], chat[1]["content"]);
    let contents = json!([chat[0]["content"], chat[1]["content"]]);
    assert_eq!(c["chat_stream"]["contents"], contents);
    assert_eq!(c["chat_stream"]["roles"], json!([1, 1]));
    // A batch of two prompts: choice j of prompt i has index 2i + j; each prompt counts once.
    let b = &c["batch"];
    assert_eq!(b["indexes"], json!([0, 1, 2, 3]));
    let alone = &b["alone_texts"];
    assert_eq!(b["texts"], json!([alone[0], alone[0], alone[1], alone[1]]));
    assert_ne!(alone[0], alone[1]);
    let prompt_tokens: u64 = b["alone_prompt_tokens"]
        .as_array()
        .context("prompt tokens")?
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .sum();
    assert_eq!(b["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(b["usage"]["completion_tokens"], 16);
    Ok(())
}

/// `/v1/embeddings` through the official `openai` client, across two pools: a batch in order,
/// each vector normalized and the model's width, base64 (the client's default) equal to
/// floats, token ids equal to their text, a Matryoshka cut equal to the renormalized head,
/// usage counting each input's prompt tokens, and bad requests refused naming the field. And
/// gRPC's `Embed`: the HTTP endpoint's vectors, and no input refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_through_the_openai_client() -> Result<()> {
    let _turn = serial().await;
    let cluster = two_pools().await?;
    let args = [
        "--base-url".into(),
        format!("http://{}/v1", cluster.gateway.http),
        "--model".into(),
        MODEL.to_string(),
    ];
    let out = python::run_client("embeddings_client.py", &args, PYTHON_TIMEOUT).await?;
    let show = serde_json::to_string_pretty(&out)?;
    check_embeddings(&out).with_context(|| show)?;

    use ferrite_proto::v1::{EmbedInput, EmbedRequest, TokenIds, embed_input::Input as Embedded};
    let mut client = cluster.inference().await?;
    let text = || EmbedInput {
        input: Some(Embedded::Text(PROMPTS[0].into())),
    };
    let ids = client
        .tokenize(TokenizeRequest {
            model: MODEL.into(),
            input: Some(Input::Text(PROMPTS[0].into())),
            add_special_tokens: None,
        })
        .await?
        .into_inner()
        .token_ids;
    let by_ids = EmbedInput {
        input: Some(Embedded::TokenIds(TokenIds { ids: ids.clone() })),
    };
    let req = |inputs| EmbedRequest {
        model: MODEL.into(),
        inputs,
        dimensions: 0,
    };
    let got = client.embed(req(vec![text(), by_ids])).await?.into_inner();
    let [a, b] = &got.embeddings[..] else {
        anyhow::bail!("{} embeddings for 2 inputs", got.embeddings.len());
    };
    anyhow::ensure!(a.values.len() == 576 && a.prompt_tokens as usize == ids.len());
    anyhow::ensure!(a.values == b.values, "text and its token ids differ");
    let body = serde_json::json!({"model": MODEL, "input": PROMPTS[0], "encoding_format": "float"});
    let r = ferrite_cluster_tests::http::post_json(cluster.gateway.http, "/v1/embeddings", &body)
        .await?;
    let http: Vec<f32> = serde_json::from_value(r.json()?["data"][0]["embedding"].clone())?;
    anyhow::ensure!(http == a.values, "gRPC and HTTP differ");
    for bad in [vec![], vec![EmbedInput { input: None }]] {
        let e = client.embed(req(bad)).await.expect_err("refused");
        anyhow::ensure!(e.code() == tonic::Code::InvalidArgument, "{e:?}");
    }
    Ok(())
}

fn check_embeddings(out: &serde_json::Value) -> Result<()> {
    use serde_json::json;
    let close = |v: &serde_json::Value, to: f64, tol: f64| {
        v.as_f64().is_some_and(|x| (x - to).abs() <= tol)
    };
    // SmolLM2-135M's hidden size.
    anyhow::ensure!(out["object"] == "list" && out["model"] == MODEL);
    anyhow::ensure!(out["indices"] == json!([0, 1, 2]) && out["dims"] == json!([576, 576, 576]));
    let norms = out["norms"].as_array().context("norms")?;
    anyhow::ensure!(norms.iter().all(|n| close(n, 1.0, 1e-4)), "norms");
    let counts = out["token_counts"].as_array().context("counts")?;
    let total: u64 = counts.iter().filter_map(serde_json::Value::as_u64).sum();
    anyhow::ensure!(
        out["usage"]["prompt_tokens"] == total && out["usage"]["total_tokens"] == total
    );
    anyhow::ensure!(out["float_vs_base64"] == 0.0, "base64 and floats differ");
    anyhow::ensure!(
        close(&out["ids_vs_text"], 0.0, 1e-6),
        "token ids and text differ"
    );
    let cut = &out["cut"];
    anyhow::ensure!(cut["dims"] == 32 && close(&cut["norm"], 1.0, 1e-4));
    anyhow::ensure!(close(&cut["vs_renormed_head"], 0.0, 1e-5), "the cut");
    anyhow::ensure!(
        out["distinct"].as_f64() > Some(1e-3),
        "different texts, one vector"
    );
    let r = &out["refused"];
    for (case, param) in [
        ("empty_list", "input"),
        ("empty_text", "input"),
        ("dimensions_0", "dimensions"),
        ("encoding", "encoding_format"),
    ] {
        anyhow::ensure!(
            r[case]["status_code"] == 400 && r[case]["param"] == param,
            "{case}"
        );
    }
    let too_many = r["dimensions_too_many"]["message"]
        .as_str()
        .unwrap_or_default();
    anyhow::ensure!(
        r["dimensions_too_many"]["status_code"] == 400
            && too_many.contains("dimensions must be 1 to 576"),
        "dimensions past the width"
    );
    anyhow::ensure!(r["unknown_model"]["status_code"] == 404, "unknown model");
    Ok(())
}
