//! Structured outputs and log-probabilities on both APIs of `ferrite serve`: the official
//! `openai` client (`tests/clients/structured_client.py`: a Pydantic `parse`, a choice list, a
//! regex, a streamed JSON schema, a Lark grammar, logprobs, and every kind of bad constraint),
//! and `ferrite.v1.Inference` with a JSON schema.

use std::time::Duration;

use anyhow::{Context, Result};
use ferrite_cluster_tests::cluster::{ServeProc, channel};
use ferrite_cluster_tests::grpc::{self, greedy_chat};
use ferrite_cluster_tests::python::run_client;
use ferrite_cluster_tests::{MODEL, serial};
use ferrite_proto::v1::FinishReason;
use ferrite_proto::v1::generate_request::Constraint;
use ferrite_proto::v1::inference_client::InferenceClient;
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
    ];
    for (case, field) in fields {
        let r = &refused[case];
        anyhow::ensure!(r["status"] == 400 && r["param"] == field, "{case}: {r}");
    }
    // llguidance's own reasons reach the client.
    let reason = refused["regex"]["message"].as_str().unwrap_or_default();
    anyhow::ensure!(reason.contains("unclosed group"), "{reason}");
    anyhow::ensure!(refused["served_on"] == true);
    Ok(())
}
