//! `ferrite serve`: gateway and worker in one process with in-process placement (no etcd).

use std::time::Duration;

use anyhow::{Context, Result};
use ferrite_cluster_tests::cluster::{ServeProc, WORKER_READY_TIMEOUT, addr_after, channel};
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::{MODEL, Proc, ferrite_bin, http, metrics, serial, wait};
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::v1::{FinishReason, ListModelsRequest};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_grpc_and_openai_without_etcd_and_drains_on_sigterm() -> Result<()> {
    let _turn = serial().await;
    let ServeProc {
        grpc: grpc_addr,
        http: http_addr,
        proc: mut serve,
    } = ServeProc::start().await?;
    let mut client = InferenceClient::new(channel(grpc_addr).await?);

    wait::until("serve to list its model", Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            match client.list_models(ListModelsRequest {}).await {
                Ok(r)
                    if r.get_ref()
                        .models
                        .iter()
                        .any(|m| m.name == MODEL && m.ready_pools == 1) =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await?;

    let c = grpc::generate(&mut client, greedy_text("The capital of France is", 8)).await?;
    assert_eq!(c.token_ids.len(), 8, "{c:?}");
    assert!(!c.text.is_empty(), "{c:?}");
    assert_eq!(
        c.finish.as_ref().map(|f| f.reason()),
        Some(FinishReason::Length),
        "{c:?}"
    );

    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
    });
    let r = http::post_json(http_addr, "/v1/chat/completions", &body).await?;
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json()?;
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant", "{v}");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{v}"
    );
    assert!(
        v["usage"]["completion_tokens"]
            .as_u64()
            .is_some_and(|n| (1..=8).contains(&n)),
        "{v}"
    );

    // SIGTERM with a request in flight: it finishes, then the process exits 0.
    let mut in_flight = client
        .generate(greedy_text("Once upon a time", 24))
        .await?
        .into_inner();
    in_flight.message().await?.context("no first message")?;
    serve.signal_term()?;
    let rest = tokio::time::timeout(Duration::from_secs(10), grpc::collect(in_flight))
        .await
        .context("the in-flight request did not finish within 10 s of SIGTERM")?;
    let rest =
        rest.map_err(|s| anyhow::anyhow!("the in-flight request failed after SIGTERM: {s:?}"))?;
    assert_eq!(
        rest.finish.as_ref().map(|f| f.reason()),
        Some(FinishReason::Length),
        "{rest:?}"
    );

    let status = serve.wait_exit(Duration::from_secs(10)).await;
    let status = match status {
        Ok(s) => s,
        Err(e) => anyhow::bail!("{e}\n{}", serve.stderr_report().await),
    };
    assert!(
        status.success(),
        "serve exited with {status} after SIGTERM\n{}",
        serve.stderr_report().await
    );
    Ok(())
}

/// The README's `curl`, word for word: `ferrite serve` with its defaults samples the default
/// model as the registry recommends (temperature 0.2, top-p 0.5), which names Paris, where
/// temperature 1 wandered off to Gabon and North America; a request's own temperature still
/// wins, drawing exactly what `ferrite generate` draws at that temperature and seed (and the
/// model's top-p, which the request left unset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_curl_names_paris_and_a_requests_own_temperature_wins() -> Result<()> {
    let _turn = serial().await;
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--kv-cache-mib",
        "400",
    ]
    .map(String::from);
    let mut serve = Proc::spawn("serve", &ferrite_bin()?, &args)?;
    let lines = serve.wait_ready(WORKER_READY_TIMEOUT).await?;
    let http_addr = addr_after(&lines, "HTTP")?;
    // First, with nothing in the prefix cache: the same steps as `ferrite generate`'s.
    let question = "What is the capital of France?";
    let own = json!({"model": "smollm2-135m", "messages": [{"role": "user", "content": question}],
        "temperature": 1, "seed": 11, "max_tokens": 24});
    let r = http::post_json(http_addr, "/v1/chat/completions", &own).await?;
    let served = r.json()?["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // The request sets the temperature only: top-p is still the model's (0.5).
    let reference = [
        "generate",
        "--chat",
        "--prompt",
        question,
        "--temperature",
        "1",
        "--top-p",
        "0.5",
        "--seed",
        "11",
        "--max-tokens",
        "24",
        "--json",
    ]
    .map(String::from);
    let out = Proc::output(
        "generate",
        &ferrite_bin()?,
        &reference,
        WORKER_READY_TIMEOUT,
    )
    .await?;
    let want: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(
        served,
        want["text"].as_str().unwrap_or_default(),
        "temperature 1 as asked"
    );
    let readme = json!({"model": "smollm2-135m", "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let mut paris = 0;
    let mut answers = Vec::new();
    for _ in 0..10 {
        let r = http::post_json(http_addr, "/v1/chat/completions", &readme).await?;
        assert_eq!(r.status, 200, "{r:?}");
        let text = r.json()?["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        paris += usize::from(text.contains("Paris"));
        answers.push(text);
    }
    assert!(paris >= 9, "{paris} of 10 name Paris: {answers:#?}");
    let models = http::get(http_addr, "/v1/models").await?.json()?;
    let defaults = &models["data"][0]["sampling_defaults"];
    assert_eq!(defaults["temperature"], json!(0.2f32), "{models}");
    assert_eq!(defaults["top_p"], json!(0.5f32), "{models}");

    serve.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

/// `n` prefills the prompt once: the later choices go out after the first has its first
/// token, when the prompt's full blocks are in the prefix cache, so each of them finds them
/// there. (Sent together, all four would prefill it in one step, and none would find it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_choices_prefill_their_prompt_once() -> Result<()> {
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    // 100 prompt tokens that no other request sends: 6 full blocks of 16.
    let prompt: Vec<u32> = (0..100).map(|i| 1000 + 37 * i).collect();
    let hits = format!("ferrite_prefix_cache_hits_total{{model_name={MODEL}}}");
    let before = metrics::sample(&metrics::scrape(serve.http).await?, &hits);
    let body = json!({"model": MODEL, "prompt": prompt, "n": 4, "max_tokens": 3,
        "temperature": 1, "ignore_eos": true});
    let r = http::post_json(serve.http, "/v1/completions", &body).await?;
    let reply = r.json()?;
    assert_eq!(r.status, 200, "{reply}");
    assert_eq!(
        reply["choices"].as_array().map(Vec::len),
        Some(4),
        "{reply}"
    );
    assert_eq!(reply["usage"]["prompt_tokens"], 100, "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 12, "{reply}");
    assert_eq!(
        reply["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "choice 0 prefilled it: {reply}"
    );
    let after = metrics::sample(&metrics::scrape(serve.http).await?, &hits);
    assert_eq!(
        after - before,
        3.0 * 96.0,
        "the later choices' cached tokens"
    );
    Ok(())
}
