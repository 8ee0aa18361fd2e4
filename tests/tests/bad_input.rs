//! Bad requests through the gateway get the documented status (gRPC) or OpenAI error (HTTP),
//! with a message naming the limit; a full queue and a passed deadline too.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferrite_cluster_tests::grpc::{self, greedy_ids, greedy_text};
use ferrite_cluster_tests::{Cluster, MODEL, WorkerOptions, WorkerProc, http, serial, wait};
use ferrite_proto::v1::{GenerateRequest, GenerateResponse, SamplingParams};
use serde_json::json;
use tonic::{Code, Streaming};

/// Sends `req` and returns the error it must fail with (before or during the stream).
async fn error_of(cluster: &Cluster, req: GenerateRequest) -> Result<tonic::Status> {
    let mut client = cluster.inference().await?;
    match grpc::generate(&mut client, req.clone()).await {
        Ok(c) => anyhow::bail!("{req:?} succeeded: {c:?}"),
        Err(status) => Ok(status),
    }
}

/// Asserts `req` fails with `code` and a message containing every one of `words`.
async fn expect(
    cluster: &Cluster,
    what: &str,
    req: GenerateRequest,
    code: Code,
    words: &[&str],
) -> Result<()> {
    let status = error_of(cluster, req).await?;
    assert_eq!(status.code(), code, "{what}: {status:?}");
    for w in words {
        assert!(
            status.message().contains(w),
            "{what}: message {:?} does not name {w:?}",
            status.message()
        );
    }
    Ok(())
}

/// Sets one sampling parameter.
type SetSampling = fn(&mut SamplingParams);

fn with_sampling(mut req: GenerateRequest, f: impl FnOnce(&mut SamplingParams)) -> GenerateRequest {
    if let Some(s) = req.sampling.as_mut() {
        f(s);
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_documented_status_and_name_the_limit() -> Result<()> {
    let _turn = serial().await;
    let cluster = Cluster::start(&["a"], WorkerOptions::default()).await?;
    let entry = cluster
        .model_entry()
        .await?
        .context("the model is not listed")?;
    let max_len = entry.max_model_len;
    let limit = max_len.to_string();

    let mut unknown = greedy_text("Hello", 4);
    unknown.model = "no-such-model".into();
    expect(
        &cluster,
        "unknown model",
        unknown,
        Code::NotFound,
        &["no-such-model"],
    )
    .await?;

    expect(
        &cluster,
        "empty prompt",
        greedy_text("", 4),
        Code::InvalidArgument,
        &["empty"],
    )
    .await?;
    expect(
        &cluster,
        "empty token ids",
        greedy_ids(vec![], 4),
        Code::InvalidArgument,
        &["empty"],
    )
    .await?;
    let mut no_prompt = greedy_text("Hello", 4);
    no_prompt.prompt = None;
    expect(
        &cluster,
        "no prompt",
        no_prompt,
        Code::InvalidArgument,
        &["prompt"],
    )
    .await?;

    let too_long = greedy_ids(vec![42; max_len as usize], 1);
    expect(
        &cluster,
        "prompt of max_model_len ids",
        too_long,
        Code::InvalidArgument,
        &[&limit],
    )
    .await?;
    let long_text = "hello ".repeat(max_len as usize + 8);
    expect(
        &cluster,
        "over-long text prompt",
        greedy_text(&long_text, 1),
        Code::InvalidArgument,
        &[&limit],
    )
    .await?;

    expect(
        &cluster,
        "max_tokens 0",
        greedy_text("Hello", 0),
        Code::InvalidArgument,
        &["max_tokens"],
    )
    .await?;
    let prompt = vec![42; 10];
    let room = (max_len - 10).to_string();
    let over = greedy_ids(prompt.clone(), max_len - 9);
    expect(
        &cluster,
        "max_tokens past the context",
        over,
        Code::InvalidArgument,
        &["max_tokens", &room],
    )
    .await?;
    // The largest that fits is accepted (only its first token is read).
    let mut client = cluster.inference().await?;
    let mut fits = client
        .generate(greedy_ids(prompt, max_len - 10))
        .await?
        .into_inner();
    fits.message().await?.context("no first message")?;
    drop(fits);

    let outside = greedy_ids(vec![1, 2, u32::MAX - 1], 4);
    expect(
        &cluster,
        "token id outside the vocabulary",
        outside,
        Code::InvalidArgument,
        &["vocabulary"],
    )
    .await?;

    // Sampling limits from inference.proto.
    let cases: [(&str, SetSampling, &str); 6] = [
        (
            "temperature 101",
            |s| s.temperature = Some(101.0),
            "temperature",
        ),
        ("top_p 0", |s| s.top_p = Some(0.0), "top_p"),
        ("min_p 1.5", |s| s.min_p = Some(1.5), "min_p"),
        (
            "repetition_penalty 11",
            |s| s.repetition_penalty = Some(11.0),
            "repetition_penalty",
        ),
        (
            "presence_penalty 3",
            |s| s.presence_penalty = Some(3.0),
            "presence_penalty",
        ),
        ("logprobs 21", |s| s.logprobs = Some(21), "logprobs"),
    ];
    for (what, set, name) in cases {
        let req = with_sampling(greedy_text("Hello", 4), set);
        expect(&cluster, what, req, Code::InvalidArgument, &[name]).await?;
    }

    // The same through the OpenAI-compatible HTTP API: status and error shape.
    let addr = cluster.gateway.http;
    let r = http::post_json(
        addr,
        "/v1/completions",
        &json!({"model": "no-such-model", "prompt": "Hi"}),
    )
    .await?;
    assert_eq!(r.status, 404, "{r:?}");
    let e = &r.json()?["error"];
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-model")),
        "{r:?}"
    );
    assert!(
        e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(),
        "{r:?}"
    );

    let body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 0});
    let r = http::post_json(addr, "/v1/completions", &body).await?;
    assert_eq!(r.status, 400, "{r:?}");
    let e = &r.json()?["error"];
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens")),
        "{r:?}"
    );
    assert_eq!(e["type"], "invalid_request_error", "{r:?}");

    // A token id past 32 bits is refused, not truncated (2^32 + 5 would run as token 5).
    let body = json!({"model": MODEL, "prompt": [4_294_967_301u64], "max_tokens": 2});
    let r = http::post_json(addr, "/v1/completions", &body).await?;
    assert_eq!(r.status, 400, "64-bit token id: {r:?}");
    let e = &r.json()?["error"];
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("4294967301")),
        "{r:?}"
    );
    assert_eq!(e["param"], "prompt", "{r:?}");

    // A body past the 2 MiB limit: 413, in OpenAI's error shape.
    let huge = json!({"model": MODEL, "prompt": "x".repeat(3 << 20), "max_tokens": 2});
    let r = http::post_json(addr, "/v1/completions", &huge).await?;
    assert_eq!(r.status, 413, "3 MiB body: {}", r.status);
    assert!(r.json()?["error"]["message"].is_string(), "{}", r.body);

    let body = json!({"model": MODEL, "messages": [], "max_tokens": 4});
    let r = http::post_json(addr, "/v1/chat/completions", &body).await?;
    assert_eq!(r.status, 400, "empty chat: {r:?}");
    assert!(r.json()?["error"]["message"].is_string(), "{r:?}");

    let r = http::post_json(addr, "/v1/chat/completions", &json!({"model": MODEL})).await?;
    assert_eq!(r.status, 400, "no messages: {r:?}");
    assert!(r.json()?["error"]["message"].is_string(), "{r:?}");
    Ok(())
}

/// One pool that runs one sequence at a time with one waiting slot, its slot taken by a long
/// request (dropped with the returned stream).
async fn busy_pool() -> Result<(Cluster, Streaming<GenerateResponse>)> {
    let options = WorkerOptions {
        max_num_seqs: Some(1),
        max_waiting: Some(1),
        ..WorkerOptions::default()
    };
    let cluster = Cluster::start(&["q"], options).await?;
    let mut client = cluster.inference().await?;
    let mut running = client
        .generate(greedy_text("Tell me a long story.", 1500))
        .await?
        .into_inner();
    running.message().await?.context("no first message")?;
    Ok((cluster, running))
}

/// Waits until the worker's queue holds `waiting` requests (next to the one running).
async fn wait_for_waiting(worker: &WorkerProc, waiting: u32) -> Result<()> {
    wait::until(
        &format!("{waiting} waiting requests"),
        Duration::from_secs(10),
        || async {
            match worker.load().await {
                Ok(l) if l.running == 1 && l.waiting == waiting => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    Ok(())
}

/// Waits until the worker runs nothing and holds no KV block.
async fn wait_for_idle(worker: &WorkerProc) -> Result<()> {
    wait::until("the worker to be idle", Duration::from_secs(10), || async {
        match worker.load().await {
            Ok(l) if l.running == 0 && l.waiting == 0 && l.kv_blocks_used == 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_resource_exhausted() -> Result<()> {
    let _turn = serial().await;
    let (cluster, running) = busy_pool().await?;
    let worker = cluster.worker("q");

    // Fill the only waiting slot.
    let mut waiter_client = cluster.inference().await?;
    let waiter = tokio::spawn(async move {
        waiter_client
            .generate(greedy_text("Waiting.", 4))
            .await
            .map(|_| ())
    });
    wait_for_waiting(worker, 1).await?;

    let full = error_of(&cluster, greedy_text("One too many.", 4)).await?;
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    assert!(!full.message().is_empty(), "{full:?}");

    let body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 4});
    let r = http::post_json(cluster.gateway.http, "/v1/completions", &body).await?;
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.json()?["error"]["message"].is_string(), "{r:?}");

    waiter.abort();
    let _ = waiter.await;
    drop(running);
    wait_for_idle(worker).await
}

/// A deadline (`grpc-timeout`) that passes while the request waits in the queue. Sent with a
/// client that does not enforce the deadline itself (see `grpc::raw_call`), to see the server's
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_passes_in_the_queue_is_deadline_exceeded() -> Result<()> {
    const TIMEOUT: Duration = Duration::from_millis(200);
    const ATTEMPTS: usize = 25;
    let _turn = serial().await;
    let (cluster, running) = busy_pool().await?;
    let worker = cluster.worker("q");
    let timeout = format!("{}m", TIMEOUT.as_millis());
    // Many tries, each of which must be DEADLINE_EXCEEDED: a race between timers shows up as
    // a mix of codes.
    let mut wrong = Vec::new();
    for attempt in 0..ATTEMPTS {
        let sent = Instant::now();
        let late = grpc::raw_call(
            cluster.gateway.grpc,
            "/ferrite.v1.Inference/Generate",
            &greedy_text("Too late.", 4),
            &[("grpc-timeout", &timeout)],
        )
        .await?;
        let took = sent.elapsed();
        // Generous upper bound: `took` includes starting curl on a loaded 2-core machine. The
        // lower bound allows the timers' millisecond granularity (seen: 199.9 ms for 200).
        if late.code != Code::DeadlineExceeded
            || took + Duration::from_millis(2) < TIMEOUT
            || took > TIMEOUT + Duration::from_secs(2)
        {
            wrong.push(format!(
                "attempt {attempt}: {:?} {:?} after {took:?}",
                late.code, late.message
            ));
        }
        // The expired request leaves the queue (at the engine's next step).
        wait_for_waiting(worker, 0).await?;
    }
    assert!(
        wrong.is_empty(),
        "{} of {ATTEMPTS} requests did not end DEADLINE_EXCEEDED on time:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    drop(running);
    wait_for_idle(worker).await
}

/// A gateway over `cluster`'s placement with two API keys and a limit of 3 requests a minute.
async fn keyed_gateway(cluster: &Cluster) -> Result<ferrite_cluster_tests::cluster::GatewayProc> {
    use ferrite_cluster_tests::cluster::GatewayProc;
    let env = [
        ("FERRITE_API_KEYS", "key-one,key-two"),
        ("FERRITE_RATE_LIMIT_REQUESTS_PER_MIN", "3"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    GatewayProc::ready(GatewayProc::spawn_with_env(&cluster.etcd.endpoint(), &env)?).await
}

/// The official `openai` client and `grpcio` with the right key, a wrong one and none.
async fn keys_through_the_official_clients(
    keyed: &ferrite_cluster_tests::cluster::GatewayProc,
) -> Result<()> {
    let args = [
        "--http-port".into(),
        keyed.http.port().to_string(),
        "--grpc-port".into(),
        keyed.grpc.port().to_string(),
        "--key".into(),
        "key-one".into(),
    ];
    let timeout = Duration::from_secs(120);
    let out = ferrite_cluster_tests::python::run_client("keys_client.py", &args, timeout).await?;
    let show = serde_json::to_string_pretty(&out)?;
    assert_eq!(out["openai_key"]["models"], json!([MODEL]), "{show}");
    assert_eq!(out["grpc_key"]["models"], json!([MODEL]), "{show}");
    let denied = &out["openai_wrong_key"];
    assert_eq!(denied["error"], "AuthenticationError", "{show}");
    assert_eq!(denied["status_code"], 401, "{show}");
    assert_eq!(denied["code"], "invalid_api_key", "{show}");
    for denied in ["grpc_wrong_key", "grpc_no_key"] {
        assert_eq!(out[denied]["error"], "UNAUTHENTICATED", "{show}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_and_rate_limits_on_both_apis() -> Result<()> {
    use ferrite_cluster_tests::cluster::{DISCOVERY_TIMEOUT, channel};
    use ferrite_proto::v1::inference_client::InferenceClient;
    let _turn = serial().await;
    let cluster = Cluster::start(&["a"], WorkerOptions::default()).await?;
    let keyed = keyed_gateway(&cluster).await?;
    let body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2});
    let wrong = [("authorization", "Bearer key-three")];
    let two = [("authorization", "Bearer key-two")];
    let cases: [(&[(&str, &str)], u16); 3] = [(&[], 401), (&wrong, 401), (&two, 200)];
    for (headers, status) in cases {
        // The right key waits for the new gateway to find the pool (refusals before admission
        // count against no limit).
        wait::until(
            &format!("HTTP {status} with {headers:?}"),
            DISCOVERY_TIMEOUT,
            || async {
                match http::post_json_with_headers(keyed.http, "/v1/completions", &body, headers)
                    .await
                {
                    Ok(r) if r.status == status => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await?;
    }
    let r = http::post_json(keyed.http, "/v1/completions", &body).await?;
    assert_eq!(r.json()?["error"]["code"], "invalid_api_key", "{r:?}");
    keys_through_the_official_clients(&keyed).await?;
    assert_eq!(
        http::get(keyed.http, "/health").await?.status,
        200,
        "health stays open"
    );

    // key-two has made one request of its three a minute.
    for n in 2..=3 {
        let r = http::post_json_with_headers(keyed.http, "/v1/completions", &body, &two).await?;
        assert_eq!(r.status, 200, "request {n}: {r:?}");
    }
    let r = http::post_json_with_headers(keyed.http, "/v1/completions", &body, &two).await?;
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.json()?["error"]["type"], "rate_limit_error", "{r:?}");
    let retry: u64 = r
        .headers
        .iter()
        .find(|(k, _)| k == "retry-after")
        .context("no Retry-After")?
        .1
        .parse()?;
    assert!(
        (1..=20).contains(&retry),
        "one request refills in 20 s: {retry}"
    );

    let mut client = InferenceClient::new(channel(keyed.grpc).await?);
    let denied = grpc::generate(&mut client, greedy_text("Hi", 2)).await;
    assert_eq!(denied.err().map(|s| s.code()), Some(Code::Unauthenticated));
    let with_key = |key: &str| -> Result<tonic::Request<GenerateRequest>> {
        let mut req = tonic::Request::new(greedy_text("Hi", 2));
        req.metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse()?);
        Ok(req)
    };
    // key-one has its own bucket; key-two's is empty on gRPC too.
    let done = grpc::collect(client.generate(with_key("key-one")?).await?.into_inner()).await?;
    assert_eq!(done.token_ids.len(), 2, "{done:?}");
    let limited = client
        .generate(with_key("key-two")?)
        .await
        .err()
        .context("not limited")?;
    assert_eq!(limited.code(), Code::ResourceExhausted, "{limited:?}");
    assert!(
        limited.metadata().get("retry-after").is_some(),
        "{limited:?}"
    );
    Ok(())
}
