//! Encoders served end to end: worker processes serving the tiny BERT (mean pooling) and
//! XLM-RoBERTa (CLS pooling) of `tests/fixtures/models/generate_bert.py`, laid out as
//! sentence-transformers publishes such models, behind one gateway beside a pool of the
//! default model. OpenAI's official client gets each text's embedding as
//! `SentenceTransformer(dir).encode(text)` gives it (the gateway tokenizes: WordPiece and
//! Unigram, the special tokens around the text), whole and cut to 16 values; a text cut by
//! `truncate_prompt_tokens` embeds as its first tokens do; a completion and a text longer
//! than the encoder's positions are 400s saying why.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ferrite_cluster_tests::{Cluster, WorkerOptions, WorkerProc, http, python, serial};
use serde_json::{Value, json};

/// fp32 against fp32, normalized: only summation order differs.
const TOLERANCE: f64 = 1e-4;

fn max_diff(got: &Value, want: &Value) -> f64 {
    let (Some(g), Some(w)) = (got.as_array(), want.as_array()) else {
        return f64::INFINITY;
    };
    if g.len() != w.len() {
        return f64::INFINITY;
    }
    let diff = |(a, b): (&Value, &Value)| match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) => (a - b).abs(),
        _ => f64::INFINITY,
    };
    g.iter().zip(w).map(diff).fold(0.0, f64::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoders_embed_as_sentence_transformers_does() -> Result<()> {
    let _turn = serial().await;
    let cluster = Cluster::start(&["a"], WorkerOptions::default()).await?;
    let names = ["bert_embed", "xlmr_embed"];
    let _workers = tokio::try_join!(
        WorkerProc::serve_fixture(&cluster, names[0], names[0], &[]),
        WorkerProc::serve_fixture(&cluster, names[1], names[1], &[]),
    )?;
    cluster.wait_listed(&names).await?;
    for name in names {
        check(&cluster, name).await.with_context(|| name)?;
    }
    Ok(())
}

/// `name`'s embeddings through the official client, against the fixture's.
async fn check(cluster: &Cluster, name: &str) -> Result<()> {
    let expected = ferrite_cluster_tests::fixture_model(name).join("expected.json");
    let want: Value = serde_json::from_slice(&std::fs::read(&expected)?)?;
    let args = [
        "--base-url".into(),
        format!("http://{}/v1", cluster.gateway.http),
        "--model".into(),
        name.to_owned(),
        "--texts-from".into(),
        expected.to_string_lossy().into_owned(),
    ];
    let got = python::run_client("encoder_client.py", &args, Duration::from_secs(120)).await?;
    let cases = want["cases"].as_array().context("cases")?;
    ensure!(got["model"] == name, "{got}");
    for (i, c) in cases.iter().enumerate() {
        ensure!(got["indices"][i] == i, "order: {}", got["indices"]);
        for (key, rows) in [("embedding", "embeddings"), ("embedding_16", "cut")] {
            let d = max_diff(&got[rows][i], &c[key]);
            ensure!(d < TOLERANCE, "case {i} {key}: differs by {d}");
        }
    }
    let tokens: usize = (cases.iter())
        .filter_map(|c| c["token_ids"].as_array().map(Vec::len))
        .sum();
    ensure!(got["usage"]["prompt_tokens"] == tokens, "{}", got["usage"]);
    truncation(cluster, name, cases).await?;
    let refused = &got["refused"];
    for (case, says) in [
        ("completion", "is an encoder"),
        ("long", "takes 64 at most"),
    ] {
        let r = &refused[case];
        let message = r["message"].as_str().unwrap_or_default();
        ensure!(
            r["status_code"] == 400 && message.contains(says),
            "{case}: {r}"
        );
    }
    Ok(())
}

/// `truncate_prompt_tokens` (vLLM's): a text cut to its first tokens with its special tokens
/// kept embeds as those ids do; -1 cuts to the most the model takes (64).
async fn truncation(cluster: &Cluster, name: &str, cases: &[Value]) -> Result<()> {
    let long = cases
        .iter()
        .max_by_key(|c| c["token_ids"].as_array().map_or(0, Vec::len));
    let long = long.context("a case")?;
    let ids: Vec<u64> = serde_json::from_value(long["token_ids"].clone())?;
    let cut = [&ids[..9], &ids[ids.len() - 1..]].concat();
    let embed = |input: Value, truncate: Option<i64>| async move {
        let mut body = json!({"model": name, "input": input, "encoding_format": "float"});
        if let Some(t) = truncate {
            body["truncate_prompt_tokens"] = json!(t);
        }
        let r = http::post_json(cluster.gateway.http, "/v1/embeddings", &body).await?;
        let v = r.json()?;
        ensure!(r.status == 200, "{} {v}", r.status);
        Ok::<_, anyhow::Error>(v)
    };
    let by_text = embed(long["text"].clone(), Some(10)).await?;
    let by_ids = embed(json!(cut), None).await?;
    ensure!(
        by_text["usage"]["prompt_tokens"] == 10,
        "{}",
        by_text["usage"]
    );
    ensure!(
        by_text["data"][0]["embedding"] == by_ids["data"][0]["embedding"],
        "cut text vs ids"
    );
    let words = "word ".repeat(200);
    let most = embed(json!(words), Some(-1)).await?;
    ensure!(most["usage"]["prompt_tokens"] == 64, "{}", most["usage"]);
    Ok(())
}
