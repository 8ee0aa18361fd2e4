//! Sequence classifiers served end to end: worker processes serving the tiny reranker, the
//! tiny classifier and a tiny causal LM made a reranker by two of its tokens
//! (`--classifier-from-tokens`, its pairs rendered by a `--score-template`;
//! `tests/fixtures/models/generate_classify.py`), a BERT cross-encoder and an XLM-RoBERTa
//! classifier (`generate_bert.py`), beside a pool
//! of the default model, behind one gateway. `/v1/rerank` (and `/v2/rerank`), `/v1/score`
//! and `/classify` answer with transformers' scores and labels for texts the gateway
//! tokenizes (query-document pairs as the tokenizer joins them), through a Rust HTTP client,
//! gRPC and Cohere's official Python client; what a model cannot do is a 400 saying so.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ferrite_cluster_tests::{Cluster, MODEL, WorkerOptions, WorkerProc, http, python, serial};
use serde_json::{Value, json};

/// fp32 against fp32, through a sigmoid or softmax.
const TOLERANCE: f64 = 1e-4;

fn expected(name: &str) -> Result<Value> {
    let path = ferrite_cluster_tests::fixture_model(name).join("expected.json");
    Ok(serde_json::from_slice(
        &std::fs::read(&path).with_context(|| path.display().to_string())?,
    )?)
}

/// A worker serving the fixture `name` under that name, on the CPU's exact path (an f32 KV
/// cache beside the tests' f32 activations).
async fn serve(cluster: &Cluster, name: &str, flags: &[&str]) -> Result<WorkerProc> {
    let flags = [&["--kv-cache-dtype", "f32"], flags].concat();
    WorkerProc::serve_fixture(cluster, name, name, &flags).await
}

async fn post(cluster: &Cluster, path: &str, body: Value) -> Result<(u16, Value)> {
    let r = http::post_json(cluster.gateway.http, path, &body).await?;
    Ok((r.status, r.json()?))
}

fn close(got: &Value, want: &Value) -> bool {
    matches!((got.as_f64(), want.as_f64()), (Some(g), Some(w)) if (g - w).abs() < TOLERANCE)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerankers_and_classifiers_answer_as_transformers_does() -> Result<()> {
    let _turn = serial().await;
    let cluster = Cluster::start(&["a"], WorkerOptions::default()).await?;
    let names = [
        "qwen3_rerank",
        "llama_classify",
        "qwen3_yes_no",
        "bert_rerank",
        "xlmr_classify",
    ];
    let template = ferrite_cluster_tests::fixture_model(names[2]).join("score_template.jinja");
    let template = template.to_string_lossy().into_owned();
    let by_tokens = [
        "--classifier-from-tokens",
        "n,y",
        "--score-template",
        &template,
    ];
    let _workers = tokio::try_join!(
        serve(&cluster, names[0], &[]),
        serve(&cluster, names[1], &[]),
        serve(&cluster, names[2], &by_tokens),
        serve(&cluster, names[3], &[]),
        serve(&cluster, names[4], &[]),
    )?;
    cluster.wait_listed(&names).await?;

    rerank(&cluster, "qwen3_rerank", "pairs").await?;
    // A causal LM asked by two of its tokens, each pair rendered by its score template:
    // Qwen3-Reranker's model card's scores of the rendered prompts.
    rerank(&cluster, "qwen3_yes_no", "templated_pairs").await?;
    // Encoders: a BERT cross-encoder (its pairs' second segment of token type 1) and an
    // XLM-RoBERTa classifier.
    rerank(&cluster, "bert_rerank", "pairs").await?;
    cut_documents(&cluster).await?;
    score(&cluster).await?;
    classify(&cluster, "llama_classify").await?;
    classify(&cluster, "xlmr_classify").await?;
    grpc(&cluster).await?;
    cohere_client(&cluster).await?;
    refusals(&cluster).await
}

/// The pairs' indices, highest `score` first.
fn by_score(pairs: &[Value]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    let score = |i: usize| pairs[i]["score"].as_f64().unwrap_or(f64::NAN);
    order.sort_by(|&a, &b| score(b).total_cmp(&score(a)));
    order
}

/// The documents by relevance, each scored as transformers scores its pair, the first
/// `top_n`; documents as objects and left out of the answer on `/v2/rerank`.
async fn rerank(cluster: &Cluster, model: &str, pairs: &str) -> Result<()> {
    let want = expected(model)?;
    let pairs = want[pairs].as_array().context("pairs")?;
    let documents: Vec<&Value> = pairs.iter().map(|p| &p["document"]).collect();
    let body = json!({"model": model, "query": want["query"], "documents": documents,
        "top_n": 3});
    let (status, got) = post(cluster, "/v1/rerank", body).await?;
    ensure!(status == 200, "{status} {got}");
    let results = got["results"].as_array().context("results")?;
    ensure!(results.len() == 3, "top_n 3: {got}");
    let order = by_score(pairs);
    for (r, &i) in results.iter().zip(&order) {
        ensure!(r["index"] == json!(i), "order: {got}");
        ensure!(
            close(&r["relevance_score"], &pairs[i]["score"]),
            "pair {i}: {r}"
        );
        ensure!(r["document"]["text"] == pairs[i]["document"], "{r}");
    }
    let tokens: usize = pairs
        .iter()
        .map(|p| p["input_ids"].as_array().map_or(0, Vec::len))
        .sum();
    ensure!(got["usage"]["total_tokens"] == json!(tokens), "{got}");

    let objects: Vec<Value> = documents.iter().map(|d| json!({"text": d})).collect();
    let body = json!({"model": model, "query": want["query"], "documents": objects,
        "return_documents": false});
    let (status, got) = post(cluster, "/v2/rerank", body).await?;
    ensure!(status == 200, "{status} {got}");
    let results = got["results"].as_array().context("results")?;
    ensure!(results.len() == pairs.len(), "every document: {got}");
    ensure!(results.iter().all(|r| r.get("document").is_none()), "{got}");
    ensure!(results[0]["index"] == json!(order[0]), "{got}");
    Ok(())
}

/// `max_tokens_per_doc` cuts each document to its first tokens (a byte each, for this
/// tokenizer): the scores of the documents cut by hand, and not those of the whole ones.
async fn cut_documents(cluster: &Cluster) -> Result<()> {
    let want = expected("qwen3_rerank")?;
    let pairs = want["pairs"].as_array().context("pairs")?;
    let whole: Vec<&str> = pairs
        .iter()
        .filter_map(|p| p["document"].as_str())
        .collect();
    let cut: Vec<&str> = whole.iter().map(|d| &d[..12]).collect();
    let scores = |documents: &[&str], max: Option<usize>| {
        let mut body = json!({"model": "qwen3_rerank", "query": want["query"],
            "documents": documents, "return_documents": false});
        if let Some(n) = max {
            body["max_tokens_per_doc"] = json!(n);
        }
        async move {
            let (status, got) = post(cluster, "/v1/rerank", body).await?;
            ensure!(status == 200, "{status} {got}");
            let mut by_index: Vec<(u64, f64)> = (got["results"].as_array().context("results")?)
                .iter()
                .map(|r| {
                    (
                        r["index"].as_u64().unwrap_or(0),
                        r["relevance_score"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect();
            by_index.sort_by_key(|r| r.0);
            Ok::<_, anyhow::Error>(by_index)
        }
    };
    let by_flag = scores(&whole, Some(12)).await?;
    ensure!(by_flag == scores(&cut, None).await?, "{by_flag:?}");
    ensure!(by_flag != scores(&whole, None).await?, "{by_flag:?}");
    Ok(())
}

/// One query against each document, in the documents' order.
async fn score(cluster: &Cluster) -> Result<()> {
    let want = expected("qwen3_rerank")?;
    let pairs = want["pairs"].as_array().context("pairs")?;
    let documents: Vec<&Value> = pairs.iter().map(|p| &p["document"]).collect();
    let body = json!({"model": "qwen3_rerank", "text_1": want["query"], "text_2": documents});
    let (status, got) = post(cluster, "/v1/score", body).await?;
    ensure!(status == 200, "{status} {got}");
    let data = got["data"].as_array().context("data")?;
    ensure!(data.len() == pairs.len(), "{got}");
    for (i, (d, p)) in data.iter().zip(pairs).enumerate() {
        ensure!(
            d["index"] == json!(i) && close(&d["score"], &p["score"]),
            "pair {i}: {d}"
        );
    }
    Ok(())
}

/// Each text's probabilities and label, as transformers gives them.
async fn classify(cluster: &Cluster, model: &str) -> Result<()> {
    let want = expected(model)?;
    let texts = want["texts"].as_array().context("texts")?;
    let inputs: Vec<&Value> = texts.iter().map(|t| &t["text"]).collect();
    let (status, got) = post(
        cluster,
        "/classify",
        json!({"model": model, "input": inputs}),
    )
    .await?;
    ensure!(status == 200, "{status} {got}");
    let data = got["data"].as_array().context("data")?;
    ensure!(data.len() == texts.len(), "{got}");
    for (i, (d, t)) in data.iter().zip(texts).enumerate() {
        ensure!(
            d["label"] == t["label"] && d["num_classes"] == json!(3),
            "text {i}: {d}"
        );
        let probs = d["probs"].as_array().context("probs")?;
        let want = t["probs"].as_array().context("probs")?;
        ensure!(
            probs.iter().zip(want).all(|(g, w)| close(g, w)),
            "text {i}: {d}"
        );
    }
    Ok(())
}

/// gRPC `Classify`: a reranker's pairs and a classifier's texts, as over HTTP; a generative
/// model's INVALID_ARGUMENT.
async fn grpc(cluster: &Cluster) -> Result<()> {
    use ferrite_proto::v1::{ClassifyInput, ClassifyRequest, TextPair, classify_input::Input};
    let mut client = cluster.inference().await?;
    let request = |model: &str, inputs: Vec<Input>| ClassifyRequest {
        model: model.to_owned(),
        inputs: (inputs.into_iter())
            .map(|i| ClassifyInput { input: Some(i) })
            .collect(),
    };
    let want = expected("qwen3_rerank")?;
    let pairs = want["pairs"].as_array().context("pairs")?;
    let inputs = (pairs.iter())
        .map(|p| {
            Input::Pair(TextPair {
                text: want["query"].as_str().unwrap_or_default().to_owned(),
                text_pair: p["document"].as_str().unwrap_or_default().to_owned(),
            })
        })
        .collect();
    let got = client
        .classify(request("qwen3_rerank", inputs))
        .await?
        .into_inner();
    ensure!(got.labels == ["LABEL_0"] && got.classifications.len() == pairs.len());
    for (c, p) in got.classifications.iter().zip(pairs) {
        ensure!(close(&json!(c.logits[0]), &p["logit"]), "{c:?}");
        ensure!(close(&json!(c.probs[0]), &p["score"]), "{c:?}");
        ensure!(json!(c.prompt_tokens) == json!(p["input_ids"].as_array().map(Vec::len)));
    }

    let want = expected("llama_classify")?;
    let texts = want["texts"].as_array().context("texts")?;
    let inputs = (texts.iter())
        .map(|t| Input::Text(t["text"].as_str().unwrap_or_default().to_owned()))
        .collect();
    let got = client
        .classify(request("llama_classify", inputs))
        .await?
        .into_inner();
    ensure!(
        got.labels == ["negative", "neutral", "positive"],
        "{:?}",
        got.labels
    );
    for (c, t) in got.classifications.iter().zip(texts) {
        ensure!(json!(c.label) == t["label"], "{c:?}");
        let logits = t["logits"].as_array().context("logits")?;
        ensure!(
            c.logits
                .iter()
                .zip(logits)
                .all(|(g, w)| close(&json!(g), w)),
            "{c:?}"
        );
    }

    let e = (client
        .classify(request(MODEL, vec![Input::Text("x".into())]))
        .await)
        .expect_err("a generative model");
    ensure!(e.code() == tonic::Code::InvalidArgument, "{e:?}");
    Ok(())
}

/// Cohere's official client, v2 and v1, ranks the documents as transformers scores them;
/// an unknown model is its 404.
async fn cohere_client(cluster: &Cluster) -> Result<()> {
    let want = expected("qwen3_rerank")?;
    let pairs = want["pairs"].as_array().context("pairs")?;
    let documents: Vec<&Value> = pairs.iter().map(|p| &p["document"]).collect();
    let args = [
        "--base-url".to_owned(),
        format!("http://{}", cluster.gateway.http),
        "--model".into(),
        "qwen3_rerank".into(),
        "--query".into(),
        want["query"].as_str().context("query")?.to_owned(),
        "--documents".into(),
        serde_json::to_string(&documents)?,
    ];
    let got = python::run_client("rerank_client.py", &args, Duration::from_secs(90)).await?;
    let order = by_score(pairs);
    for (client, n) in [("v2", 2), ("v1", pairs.len())] {
        let results = got[client].as_array().context("results")?;
        ensure!(results.len() == n, "{client}: {got}");
        for (r, &i) in results.iter().zip(&order) {
            ensure!(r["index"] == json!(i), "{client} order: {got}");
            ensure!(
                close(&r["relevance_score"], &pairs[i]["score"]),
                "{client}: {r}"
            );
        }
    }
    ensure!(got["v1"][0]["text"] == pairs[order[0]]["document"], "{got}");
    ensure!(got["unknown_model"] == json!(404), "{got}");
    Ok(())
}

/// What each model cannot do is the client's 400, saying why; an unknown model a 404.
async fn refusals(cluster: &Cluster) -> Result<()> {
    let rerank = |model: &str| json!({"model": model, "query": "q", "documents": ["d"]});
    for (path, body, status, says) in [
        ("/v1/rerank", rerank("llama_classify"), 400, "/classify"),
        (
            "/v1/rerank",
            rerank(MODEL),
            400,
            "not a sequence classifier",
        ),
        (
            "/classify",
            json!({"model": MODEL, "input": "x"}),
            400,
            "not a sequence classifier",
        ),
        (
            "/v1/completions",
            json!({"model": "qwen3_rerank", "prompt": "x"}),
            400,
            "generates no text",
        ),
        (
            "/v1/rerank",
            json!({"model": "qwen3_rerank", "query": "q", "documents": []}),
            400,
            "empty",
        ),
        (
            "/v1/rerank",
            json!({"model": "qwen3_rerank", "query": "q", "documents": ["d"],
                "rank_fields": ["text"]}),
            400,
            "rank_fields",
        ),
        ("/v1/rerank", rerank("nope"), 404, "nope"),
    ] {
        let (got, v) = post(cluster, path, body.clone()).await?;
        let message = v["error"]["message"].as_str().unwrap_or_default();
        ensure!(
            got == status && message.contains(says),
            "{path} {body}: {got} {v}"
        );
    }
    Ok(())
}
