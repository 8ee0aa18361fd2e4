//! `ferrite serve`: gateway and worker in one process with in-process placement (no etcd).

use std::time::Duration;

use anyhow::{Context, Result};
use ferrite_cluster_tests::cluster::{WORKER_READY_TIMEOUT, addr_after, channel};
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::{MODEL, Proc, ferrite_bin, http, serial, wait};
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::v1::{FinishReason, ListModelsRequest};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_grpc_and_openai_without_etcd_and_drains_on_sigterm() -> Result<()> {
    let _turn = serial().await;
    let args = [
        "serve",
        "--model",
        MODEL,
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--kv-cache-mib",
        "400",
    ]
    .map(String::from);
    let mut serve = Proc::spawn("serve", &ferrite_bin()?, &args)?;
    let lines = serve.wait_ready(WORKER_READY_TIMEOUT).await?;
    let grpc_addr = addr_after(&lines, "gRPC")?;
    let http_addr = addr_after(&lines, "HTTP")?;
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
