//! LoRA adapters served beside the default model (`--lora-modules`), end to end: a worker
//! process serving two adapters, the gateway routing requests to them by name over the
//! OpenAI HTTP API and gRPC, each answer equal to `ferrite generate --lora`'s, and the prefix
//! cache keeping each adapter's blocks to itself.

use anyhow::{Context, Result, ensure};
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::{Cluster, MODEL, WorkerOptions, http, lora, reference, serial};
use serde_json::{Value, json};

/// Long enough for two full KV blocks of 16 tokens.
const PROMPT: &str = "The old lighthouse keeper climbed the spiral stairs every evening at dusk, \
    carrying a lantern and a notebook in which he wrote down every ship that passed the rocks \
    below, its name, its flag and the hour";
const MAX_TOKENS: u32 = 12;

/// A completion's text and its prompt tokens found in the prefix cache.
async fn complete(cluster: &Cluster, model: &str) -> Result<(String, u64)> {
    let body = json!({"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
        "temperature": 0, "ignore_eos": true});
    let r = http::post_json(cluster.gateway.http, "/v1/completions", &body).await?;
    let v = r.json()?;
    ensure!(r.status == 200, "{model}: {} {v}", r.status);
    let text = v["choices"][0]["text"].as_str().context("text")?.to_owned();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    Ok((text, cached.context("cached tokens")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_answer_by_name_as_ferrite_generate_does() -> Result<()> {
    let _turn = serial().await;
    let dir = std::env::temp_dir().join(format!("ferrite-lora-test-{}", std::process::id()));
    lora::write_adapter(&dir.join("sql"), 1, 8, 16.0)?;
    lora::write_adapter(&dir.join("chat"), 2, 8, 16.0)?;
    let modules = vec![
        "--lora-modules".to_owned(),
        format!("sql={}", dir.join("sql").display()),
        format!("chat={}", dir.join("chat").display()),
    ];
    let with = |name: &str| [modules.clone(), vec!["--lora".into(), name.into()]].concat();
    let (sql_flags, chat_flags) = (with("sql"), with("chat"));
    let options = WorkerOptions {
        extra_args: modules.clone(),
        ..WorkerOptions::default()
    };
    let (cluster, base, sql, chat) = tokio::try_join!(
        Cluster::start(&["a"], options),
        reference::text(PROMPT, MAX_TOKENS),
        reference::text_with(PROMPT, MAX_TOKENS, &sql_flags),
        reference::text_with(PROMPT, MAX_TOKENS, &chat_flags),
    )?;
    ensure!(sql.token_ids != base.token_ids && chat.token_ids != sql.token_ids);

    // Listed beside the model, as vLLM lists adapters.
    let models = http::get(cluster.gateway.http, "/v1/models")
        .await?
        .json()?;
    let parent = |id: &str| -> Option<Value> {
        let all = models["data"].as_array()?;
        Some(all.iter().find(|m| m["id"] == id)?["parent"].clone())
    };
    ensure!(parent(MODEL) == Some(Value::Null), "{models}");
    ensure!(parent("sql") == Some(json!(MODEL)) && parent("chat") == Some(json!(MODEL)));

    // The base first: its blocks are cached, and no adapter may take them.
    ensure!(complete(&cluster, MODEL).await? == (base.text.clone(), 0));
    ensure!(complete(&cluster, "sql").await? == (sql.text.clone(), 0));
    // Every full block of 16 but the last token's, as the engine reuses them.
    let full = (base.prompt_token_ids.len() as u64 - 1) / 16 * 16;
    let (again, cached) = complete(&cluster, "sql").await?;
    ensure!(
        again == sql.text && cached == full && full >= 32,
        "sql again: {cached} cached"
    );
    ensure!(complete(&cluster, "chat").await? == (chat.text.clone(), 0));

    let mut client = cluster.inference().await?;
    let mut req = greedy_text(PROMPT, MAX_TOKENS);
    req.model = "chat".into();
    let got = grpc::generate(&mut client, req).await?;
    ensure!(got.token_ids == chat.token_ids, "gRPC: {:?}", got.token_ids);

    let body = json!({"model": "nope", "prompt": PROMPT, "max_tokens": 1});
    let r = http::post_json(cluster.gateway.http, "/v1/completions", &body).await?;
    ensure!(r.status == 404, "an unknown adapter: {}", r.status);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
