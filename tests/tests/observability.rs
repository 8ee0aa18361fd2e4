//! Observability end to end: real processes export OTLP to a real receiver (the official
//! protocol definitions, `opentelemetry-proto`), and `/metrics` is parsed by the Prometheus
//! Python client's parser.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ferrite_cluster_tests::cluster::{
    PREFIX, ServeProc, WORKER_READY_TIMEOUT, addr_after, channel,
};
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::metrics::{sample, scrape};
use ferrite_cluster_tests::{MODEL, Proc, ferrite_bin, http, serial};
use ferrite_placement::testing::EtcdServer;
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_telemetry::receiver::{AttrValue, OtlpReceiver, ReceivedSpan};
use serde_json::json;

const SPAN_TIMEOUT: Duration = Duration::from_secs(20);

/// The phases a CPU process runs, with an attribute each must carry.
const CPU_PHASES: &[(&str, &str)] = &[
    ("config", "architecture"),
    ("tokenizer_init", "source"),
    ("device_init", "isa"),
    ("load_weights", "gb_per_s"),
    ("model_init", "num_layers"),
    ("kv_cache_init", "num_blocks"),
    ("warmup", "prompt_tokens"),
    ("register", "pool"),
];

/// The phases of a rank > 0 of a tensor-parallel pool: no warm-up of its own (it runs the
/// leader's), and the pool's forming.
const FOLLOWER_PHASES: &[(&str, &str)] = &[
    ("config", "architecture"),
    ("tokenizer_init", "source"),
    ("device_init", "isa"),
    ("load_weights", "gb_per_s"),
    ("model_init", "num_layers"),
    ("comm_init", "epoch"),
    ("kv_cache_init", "num_blocks"),
    ("register", "pool"),
];

/// GPU-only phases: no span on the CPU.
const GPU_PHASES: &[&str] = &["kernel_compile", "kv_cache_profiling", "graph_capturing"];

fn otel_env(receiver: &OtlpReceiver, service: &str) -> Vec<(String, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.endpoint()),
        ("OTEL_SERVICE_NAME".into(), service.into()),
    ]
}

fn int(span: &ReceivedSpan, key: &str) -> Option<i64> {
    match span.attr(key) {
        Some(AttrValue::Int(i)) => Some(*i),
        _ => None,
    }
}

fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.parent_span_id.as_deref() == Some(parent.span_id.as_str()))
        .collect()
}

fn one<'a>(
    spans: &'a [ReceivedSpan],
    what: &str,
    pred: impl Fn(&ReceivedSpan) -> bool,
) -> Result<&'a ReceivedSpan> {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| pred(s)).collect();
    ensure!(
        found.len() == 1,
        "expected one {what}, found {}: {:#?}",
        found.len(),
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    Ok(found[0])
}

/// Waits until `count(spans)` reaches `n`; the error names what arrived instead.
async fn wait_spans(
    receiver: &OtlpReceiver,
    what: &str,
    n: usize,
    count: impl Fn(&[ReceivedSpan]) -> usize,
) -> Result<Vec<ReceivedSpan>> {
    receiver
        .wait_for(SPAN_TIMEOUT, |s| count(s) >= n)
        .await
        .map_err(|got| {
            let names: Vec<&str> = got.iter().map(|s| s.name.as_str()).collect();
            anyhow::anyhow!("waiting for {n} {what} spans; got {names:?}")
        })
}

fn named(name: &'static str) -> impl Fn(&[ReceivedSpan]) -> usize {
    move |spans| spans.iter().filter(|s| s.name == name).count()
}

/// Checks a process's `startup` trace: each of `phases` once, a child of `root`, with its
/// attribute; no GPU phase; `load_weights` read more than `min_bytes`.
fn check_startup(
    spans: &[ReceivedSpan],
    root: &ReceivedSpan,
    phases: &[(&str, &str)],
    min_bytes: i64,
) -> Result<()> {
    let kids = children(spans, root);
    for (phase, attr) in phases {
        let matching: Vec<_> = kids.iter().filter(|s| s.name == *phase).collect();
        ensure!(
            matching.len() == 1,
            "phase {phase}: {} spans under startup",
            matching.len()
        );
        let s = matching[0];
        ensure!(s.trace_id == root.trace_id, "{phase} is in another trace");
        ensure!(
            s.attr(attr).is_some(),
            "{phase} lacks {attr}: {:?}",
            s.attributes
        );
        ensure!(
            s.start_unix_nanos >= root.start_unix_nanos && s.end_unix_nanos <= root.end_unix_nanos,
            "{phase} is outside the startup span"
        );
    }
    for phase in GPU_PHASES {
        ensure!(
            !spans.iter().any(|s| s.name == *phase),
            "{phase} ran on the CPU"
        );
    }
    let load = kids
        .iter()
        .find(|s| s.name == "load_weights")
        .context("load_weights")?;
    ensure!(
        int(load, "bytes").is_some_and(|b| b > min_bytes),
        "{:?}",
        load.attributes
    );
    ensure!(
        load.attr("gb_per_s")
            .and_then(AttrValue::as_f64)
            .is_some_and(|g| g > 0.0)
    );
    let kv = kids
        .iter()
        .find(|s| s.name == "kv_cache_init")
        .context("kv_cache_init")?;
    ensure!(
        int(kv, "num_blocks").is_some_and(|b| b > 0),
        "{:?}",
        kv.attributes
    );
    ensure!(
        int(kv, "bytes").is_some_and(|b| b > 0),
        "{:?}",
        kv.attributes
    );
    ensure!(
        int(kv, "max_model_len").is_some_and(|b| b > 0),
        "{:?}",
        kv.attributes
    );
    Ok(())
}

/// A fresh W3C trace context: (traceparent, trace id, parent span id).
fn client_context(seed: u64) -> (String, String, String) {
    let trace_id = format!("{:016x}{:016x}", 0x4bf9_2f35_77b3_4da6_u64 ^ seed, seed | 1);
    let span_id = format!("{:016x}", 0x00f0_67aa_0ba9_02b7_u64 ^ seed);
    (format!("00-{trace_id}-{span_id}-01"), trace_id, span_id)
}

/// The spans of trace `trace_id`.
fn trace_of(spans: &[ReceivedSpan], trace_id: &str) -> Vec<ReceivedSpan> {
    let of_it = spans.iter().filter(|s| s.trace_id == trace_id);
    of_it.cloned().collect()
}

/// Checks one request's trace: gateway span (child of the client's span) named
/// `{operation} {model}` with GenAI attributes, `validate` and `upstream` children, the
/// worker's span under `upstream`, and `queue`/`prefill`/`decode` under the worker's span.
fn check_request(
    spans: &[ReceivedSpan],
    trace_id: &str,
    client_span: Option<&str>,
    operation: &str,
    output_tokens: i64,
) -> Result<()> {
    let trace = trace_of(spans, trace_id);
    let name = format!("{operation} {MODEL}");
    let gw = one(&trace, &name, |s| s.name == name)?;
    ensure!(
        gw.parent_span_id.as_deref() == client_span,
        "gateway parent {:?}",
        gw.parent_span_id
    );
    ensure!(
        gw.kind == 2,
        "the gateway span is kind {} (server is 2)",
        gw.kind
    );
    ensure!(gw.attr("gen_ai.operation.name").and_then(AttrValue::as_str) == Some(operation));
    ensure!(gw.attr("gen_ai.request.model").and_then(AttrValue::as_str) == Some(MODEL));
    ensure!(
        int(gw, "gen_ai.usage.input_tokens").is_some_and(|n| n > 0),
        "{:?}",
        gw.attributes
    );
    ensure!(
        int(gw, "gen_ai.usage.output_tokens") == Some(output_tokens),
        "{:?}",
        gw.attributes
    );
    let ttft = gw
        .attr("gen_ai.server.time_to_first_token")
        .and_then(AttrValue::as_f64);
    ensure!(
        ttft.is_some_and(|t| t > 0.0 && t <= gw.seconds()),
        "ttft {ttft:?} of a {} s span",
        gw.seconds()
    );
    let kids = children(&trace, gw);
    ensure!(
        kids.iter().any(|s| s.name == "validate"),
        "no validate span"
    );
    let upstream = kids
        .iter()
        .find(|s| s.name == "upstream")
        .context("no upstream span")?;
    ensure!(
        upstream.kind == 3,
        "upstream is kind {} (client is 3)",
        upstream.kind
    );
    let worker = one(&trace, "worker.generate", |s| s.name == "worker.generate")?;
    ensure!(
        worker.parent_span_id.as_deref() == Some(upstream.span_id.as_str()),
        "worker parent"
    );
    ensure!(int(worker, "gen_ai.usage.output_tokens") == Some(output_tokens));
    let stages: Vec<&str> = children(&trace, worker)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    for stage in ["queue", "prefill", "decode"] {
        ensure!(
            stages.contains(&stage),
            "worker stages {stages:?} lack {stage}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_exports_phase_and_request_traces_and_metrics_move() -> Result<()> {
    let _turn = serial().await;
    let receiver = OtlpReceiver::start().await?;
    let ServeProc {
        grpc: grpc_addr,
        http: http_addr,
        proc: mut serve,
    } = ServeProc::start_with_env(&otel_env(&receiver, "ferrite-test-serve")).await?;

    // Start-up: flushed before `ready`, so it is here (or arriving) now.
    let spans = wait_spans(&receiver, "startup", 1, named("startup")).await?;
    let root = one(&spans, "startup span", |s| s.name == "startup")?;
    ensure!(
        root.parent_span_id.is_none(),
        "startup has a parent without TRACEPARENT"
    );
    ensure!(
        root.service_name.as_deref() == Some("ferrite-test-serve"),
        "{:?}",
        root.service_name
    );
    check_startup(&spans, root, CPU_PHASES, 50_000_000)?;

    let before = scrape(http_addr).await?;
    ensure!(
        sample(&before, "ferrite_startup_phase_seconds{phase=load_weights}") > 0.0,
        "no load_weights gauge"
    );
    ensure!(
        sample(&before, "ferrite_startup_phase_seconds{phase=total_time}") > 0.0,
        "no total_time gauge"
    );
    ensure!(
        before.contains_key(&format!(
            "ferrite_kv_cache_usage_perc{{model_name={MODEL}}}"
        )),
        "no KV usage gauge"
    );

    // gRPC with the client's traceparent.
    let (traceparent, trace_id, client_span) = client_context(1);
    let mut client = InferenceClient::new(channel(grpc_addr).await?);
    let mut req = tonic::Request::new(greedy_text("The capital of France is", 4));
    req.metadata_mut()
        .insert("traceparent", traceparent.parse()?);
    let c = grpc::collect(client.generate(req).await?.into_inner()).await?;
    ensure!(c.token_ids.len() == 4, "{c:?}");

    // OpenAI HTTP chat with the client's traceparent header.
    let (http_parent, http_trace, http_span) = client_context(2);
    let r = http::post_json_with_headers(
        http_addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}),
        &[("traceparent", &http_parent)],
    )
    .await?;
    ensure!(r.status == 200, "{r:?}");
    // The chat may end at EOS before max_tokens: take the count it reports.
    let chat_tokens = r.json()?["usage"]["completion_tokens"]
        .as_i64()
        .context("usage")?;

    // And one without: the gateway span is a root, the worker's shares its trace.
    let c = grpc::generate(&mut client, greedy_text("Hello", 2)).await?;
    ensure!(c.token_ids.len() == 2, "{c:?}");

    // The worker's `decode` span is recorded when its request finished.
    let spans = wait_spans(&receiver, "decode", 3, named("decode")).await?;
    check_request(&spans, &trace_id, Some(&client_span), "text_completion", 4)?;
    check_request(&spans, &http_trace, Some(&http_span), "chat", chat_tokens)?;
    let unparented = one(&spans, "unparented gateway span", |s| {
        s.name == format!("text_completion {MODEL}") && s.parent_span_id.is_none()
    })?;
    check_request(
        &spans,
        &unparented.trace_id.clone(),
        None,
        "text_completion",
        2,
    )?;

    let after = scrape(http_addr).await?;
    let grpc_ok = format!("ferrite_gateway_requests_total{{api=grpc,code=ok,model_name={MODEL}}}");
    ensure!(
        sample(&after, &grpc_ok) - sample(&before, &grpc_ok) == 2.0,
        "{grpc_ok}: {after:?}"
    );
    let generated = (4 + 2 + chat_tokens) as f64;
    let tokens = format!("ferrite_generation_tokens_total{{model_name={MODEL}}}");
    ensure!(
        sample(&after, &tokens) - sample(&before, &tokens) == generated,
        "{tokens}"
    );
    let gw_tokens = format!("ferrite_gateway_generation_tokens_total{{model_name={MODEL}}}");
    ensure!(
        sample(&after, &gw_tokens) - sample(&before, &gw_tokens) == generated,
        "{gw_tokens}"
    );
    for h in [
        "ferrite_time_to_first_token_seconds_count",
        "ferrite_gateway_time_to_first_token_seconds_count",
        "ferrite_e2e_request_latency_seconds_count",
    ] {
        let key = format!("{h}{{model_name={MODEL}}}");
        ensure!(sample(&after, &key) - sample(&before, &key) == 3.0, "{key}");
    }
    let itl = format!("ferrite_inter_token_latency_seconds_count{{model_name={MODEL}}}");
    // One gap per token after the first, per request.
    ensure!(
        sample(&after, &itl) - sample(&before, &itl) == generated - 3.0,
        "{itl}"
    );
    let prompt = format!("ferrite_prompt_tokens_total{{model_name={MODEL}}}");
    ensure!(
        sample(&after, &prompt) > sample(&before, &prompt),
        "{prompt}"
    );
    let usage = sample(
        &after,
        &format!("ferrite_kv_cache_usage_perc{{model_name={MODEL}}}"),
    );
    ensure!((0.0..=1.0).contains(&usage), "KV usage {usage}");

    // Two choices of one request: one request span, an upstream call and worker request each.
    let (parent, trace_id, _) = client_context(4);
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "n": 2, "max_tokens": 3,
        "temperature": 1, "ignore_eos": true});
    let r = http::post_json_with_headers(
        http_addr,
        "/v1/completions",
        &body,
        &[("traceparent", &parent)],
    )
    .await?;
    ensure!(r.status == 200, "{r:?}");
    let spans = wait_spans(&receiver, "decode", 5, named("decode")).await?;
    check_choices_trace(&spans, &trace_id)?;
    serve.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

/// The trace of a request for two choices of 3 tokens each.
fn check_choices_trace(spans: &[ReceivedSpan], trace_id: &str) -> Result<()> {
    let trace = trace_of(spans, trace_id);
    let name = format!("text_completion {MODEL}");
    let gw = one(&trace, &name, |s| s.name == name)?;
    let attrs = &gw.attributes;
    ensure!(
        int(gw, "gen_ai.request.choice.count") == Some(2),
        "{attrs:?}"
    );
    ensure!(
        int(gw, "gen_ai.usage.output_tokens") == Some(6),
        "{attrs:?}"
    );
    let reasons = gw
        .attr("gen_ai.response.finish_reasons")
        .map(|r| r.to_string());
    let both = reasons.is_some_and(|r| r.matches("length").count() == 2);
    ensure!(both, "{attrs:?}");
    let upstreams: Vec<&ReceivedSpan> = children(&trace, gw)
        .into_iter()
        .filter(|s| s.name == "upstream")
        .collect();
    ensure!(upstreams.len() == 2, "{trace:#?}");
    for up in upstreams {
        let worker = one(&trace, "worker span of an upstream", |s| {
            s.name == "worker.generate" && s.parent_span_id.as_deref() == Some(&up.span_id)
        })?;
        ensure!(int(worker, "gen_ai.usage.output_tokens") == Some(3));
    }
    Ok(())
}

/// Every rank of a pool started with one `TRACEPARENT` reports its start-up into that trace,
/// with the pool's forming (`comm_init`); each reads only its shard (a third of the model);
/// rank 0 serves `/metrics` on its own port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_started_with_one_traceparent_share_a_startup_trace() -> Result<()> {
    let _turn = serial().await;
    let etcd = EtcdServer::start();
    let receiver = OtlpReceiver::start().await?;
    let (traceparent, trace_id, launcher_span) = client_context(3);
    let mut env = otel_env(&receiver, "ferrite-test-worker");
    env.push(("TRACEPARENT".into(), traceparent));
    let mut ranks = Vec::new();
    for rank in ["0", "1", "2"] {
        let args = [
            "worker",
            "--model",
            MODEL,
            "--pool",
            "traced",
            "--rank",
            rank,
            "--tp",
            "3",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--etcd",
            &etcd.endpoint(),
            "--prefix",
            PREFIX,
            "--kv-cache-mib",
            "200",
            "--max-model-len",
            "2048",
        ]
        .map(String::from);
        ranks.push(Proc::spawn_with_env(
            format!("rank {rank}"),
            &ferrite_bin()?,
            &args,
            &env,
        )?);
    }
    let mut lines = Vec::new();
    for p in &mut ranks {
        lines.push(p.wait_ready(WORKER_READY_TIMEOUT).await?);
    }
    let metrics = addr_after(&lines[0], "metrics:")?;
    let spans = wait_spans(&receiver, "startup", 3, named("startup")).await?;
    let mut leaders = 0;
    for root in spans.iter().filter(|s| s.name == "startup") {
        ensure!(
            root.trace_id == trace_id,
            "a rank's startup is in trace {}",
            root.trace_id
        );
        ensure!(
            root.parent_span_id.as_deref() == Some(launcher_span.as_str()),
            "startup parent"
        );
        // The shards' matrices: a third of the model's ~100 MB each.
        let leads = children(&spans, root).iter().any(|s| s.name == "warmup");
        let (phases, rest): (&[(&str, &str)], _) = if leads {
            leaders += 1;
            (CPU_PHASES, &[("comm_init", "epoch")][..])
        } else {
            (FOLLOWER_PHASES, &[][..])
        };
        check_startup(&spans, root, phases, 20_000_000)?;
        check_startup(&spans, root, rest, 20_000_000)?;
    }
    ensure!(leaders == 1, "{leaders} ranks warmed up the pool");
    let m = scrape(metrics).await?;
    ensure!(
        sample(&m, "ferrite_startup_phase_seconds{phase=warmup}") > 0.0,
        "no warmup gauge at {metrics}"
    );
    ensure!(
        sample(&m, "ferrite_startup_phase_seconds{phase=comm_init}") > 0.0,
        "no comm_init gauge at {metrics}"
    );
    ensure!(
        m.contains_key(&format!(
            "ferrite_num_requests_waiting{{model_name={MODEL}}}"
        )),
        "no waiting gauge at {metrics}"
    );
    // SIGTERM to rank 0: it drains and stops the pool; the other ranks leave with it, cleanly.
    ranks[0].signal_term()?;
    for mut p in ranks {
        let status = p.wait_exit(Duration::from_secs(30)).await?;
        ensure!(status.success(), "{}: {status:?}", p.name());
    }
    Ok(())
}
