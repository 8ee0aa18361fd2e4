//! `ferrite bench startup`: start-up phase times of fresh `ferrite serve` processes, read from
//! the spans they export, in the seed tables' layout (one row per phase, one column per run).
//!
//! Each run starts an OTLP receiver, launches `ferrite serve` pointed at it, waits for `ready`,
//! sends one request and waits for its first token (`actual_total_time`: process start to first
//! token served), then collects the run's `startup` trace. `total_time` is the `startup` span;
//! every other row is the span of that phase, or a sum of phases (`model_loading`,
//! `init_engine`), or `--` where the phase does not apply (no span, e.g. GPU phases on a CPU).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_engine::registry;
use ferrite_proto::v1 as api;
use ferrite_telemetry::receiver::{OtlpReceiver, ReceivedSpan};
use serde_json::json;

use crate::serve_child::ServeChild;
use crate::table::Table;

#[derive(Debug, Args)]
pub struct StartupBenchArgs {
    /// Models to start (names or paths), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = registry::DEFAULT_MODEL)]
    models: Vec<String>,
    /// Context lengths to sweep, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "256,512,1024,2048,4096,8192"
    )]
    max_model_len: Vec<usize>,
    /// GPU memory fractions to sweep (ignored by the CPU backend, which sizes its KV cache
    /// with --kv-cache-mib).
    #[arg(long, value_delimiter = ',', default_value = "0.9")]
    gpu_memory_utilization: Vec<f64>,
    /// KV-cache memory on the CPU, in MiB.
    #[arg(long, default_value_t = 1024)]
    kv_cache_mib: usize,
    /// The servers' `--device` (cpu, cuda, cuda:N, auto).
    #[arg(long, default_value = "auto")]
    device: ferrite_kernels::device::DeviceRequest,
    /// Runs per configuration.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Seconds one process may take to serve its first token.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    #[arg(long)]
    json: bool,
}

/// The table's rows: the seed's rows in the seed's order (torch-only ones stay, as `--`), with
/// ferrite's own phases where they run.
const ROWS: &[&str] = &[
    "config",
    "device_init",
    "kernel_compile",
    "load_weights",
    "model_init",
    "model_loading",
    "dynamo_transform_time",
    "graph_compile_general_shape",
    "graph_compile_cached",
    "torch.compile",
    "kv_cache_profiling",
    "graph_capturing",
    "kv_cache_init",
    "warmup",
    "register",
    "init_engine",
    "tokenizer_init",
    "total_time",
    "actual_total_time",
];

/// Rows that are sums of phases.
fn composite(row: &str) -> Option<&'static [&'static str]> {
    match row {
        "model_loading" => Some(&["load_weights", "model_init"]),
        "init_engine" => Some(&[
            "kv_cache_profiling",
            "graph_capturing",
            "kv_cache_init",
            "warmup",
        ]),
        _ => None,
    }
}

/// One configuration to start.
#[derive(Debug, Clone)]
struct RunSpec {
    model: String,
    max_model_len: usize,
    gpu_memory_utilization: f64,
    run: usize,
}

/// What one run measured.
#[derive(Debug)]
struct RunResult {
    column: String,
    spec: RunSpec,
    /// The start-up root's child spans (a phase name may occur more than once).
    phases: Vec<ReceivedSpan>,
    total: Option<f64>,
    actual_total: f64,
}

impl RunResult {
    fn seconds(&self, row: &str) -> Option<f64> {
        match row {
            "total_time" => return self.total,
            "actual_total_time" => return Some(self.actual_total),
            _ => {}
        }
        // A phase may run in parts (on a GPU, `load_weights` maps the checkpoint on the host,
        // then streams it to the device): its row is their sum.
        let one = |name: &str| {
            let parts: Vec<f64> = self
                .phases
                .iter()
                .filter(|s| s.name == name)
                .map(ReceivedSpan::seconds)
                .collect();
            (!parts.is_empty()).then(|| parts.iter().sum())
        };
        match composite(row) {
            Some(parts) => {
                let found: Vec<f64> = parts.iter().filter_map(|p| one(p)).collect();
                (!found.is_empty()).then(|| found.iter().sum())
            }
            None => one(row),
        }
    }
}

pub fn run(args: StartupBenchArgs) -> Result<()> {
    if args.runs == 0 || args.models.is_empty() {
        bail!("--runs ≥ 1 and at least one model are needed");
    }
    let mut specs = Vec::new();
    for model in &args.models {
        for &max_model_len in &args.max_model_len {
            for &gpu_memory_utilization in &args.gpu_memory_utilization {
                for run in 0..args.runs {
                    specs.push(RunSpec {
                        model: model.clone(),
                        max_model_len,
                        gpu_memory_utilization,
                        run,
                    });
                }
            }
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut results = Vec::new();
    for spec in specs {
        let column = column_name(&spec, &args);
        eprintln!("ferrite bench startup: {column}");
        match rt.block_on(one_run(&spec, &args)) {
            Ok((phases, total, actual_total)) => results.push(RunResult {
                column,
                spec,
                phases,
                total,
                actual_total,
            }),
            Err(e) => eprintln!("  failed: {e:#}"),
        }
    }
    if results.is_empty() {
        bail!("no run succeeded");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&results))?);
    } else {
        print!("{}", table(&results).render());
    }
    Ok(())
}

/// Named like the seed's columns (`output_model_qwen-4b_max-model-len_1024.txt`), naming only
/// what the sweep varies besides model and length.
fn column_name(spec: &RunSpec, args: &StartupBenchArgs) -> String {
    let model = std::path::Path::new(&spec.model)
        .file_stem()
        .map_or_else(|| spec.model.clone(), |s| s.to_string_lossy().into_owned());
    let mut name = format!("model_{model}_max-model-len_{}", spec.max_model_len);
    if args.gpu_memory_utilization.len() > 1 {
        name.push_str(&format!(
            "_gpu-memory-utilization_{}",
            spec.gpu_memory_utilization
        ));
    }
    if args.runs > 1 {
        name.push_str(&format!("_run_{}", spec.run + 1));
    }
    name
}

fn table(results: &[RunResult]) -> Table {
    let mut header = vec!["Metric"];
    header.extend(results.iter().map(|r| r.column.as_str()));
    let mut t = Table::new(&header);
    for row in ROWS {
        let mut cells = vec![(*row).to_owned()];
        cells.extend(results.iter().map(|r| {
            r.seconds(row)
                .map_or_else(|| "--".to_owned(), |s| format!("{s:.3}"))
        }));
        t.row(cells);
    }
    t
}

fn to_json(results: &[RunResult]) -> serde_json::Value {
    let runs: Vec<_> = results
        .iter()
        .map(|r| {
            let seconds: serde_json::Map<String, serde_json::Value> = ROWS
                .iter()
                .map(|row| ((*row).to_owned(), json!(r.seconds(row))))
                .collect();
            let attributes: serde_json::Map<String, serde_json::Value> = r
                .phases
                .iter()
                .map(|s| {
                    let attrs: serde_json::Map<String, serde_json::Value> = s
                        .attributes
                        .iter()
                        .map(|(k, v)| (k.clone(), json!(v.to_string())))
                        .collect();
                    (s.name.clone(), serde_json::Value::Object(attrs))
                })
                .collect();
            json!({
                "column": r.column,
                "model": r.spec.model,
                "max_model_len": r.spec.max_model_len,
                "gpu_memory_utilization": r.spec.gpu_memory_utilization,
                "run": r.spec.run + 1,
                "seconds": seconds,
                "attributes": attributes,
            })
        })
        .collect();
    json!({ "unit": "seconds", "runs": runs })
}

/// Kills the child when the run ends, however it ends.
/// Starts one `ferrite serve`, serves one request, returns its phase spans, the `startup`
/// span's seconds and the seconds from spawn to the first token.
async fn one_run(
    spec: &RunSpec,
    args: &StartupBenchArgs,
) -> Result<(Vec<ReceivedSpan>, Option<f64>, f64)> {
    let receiver = OtlpReceiver::start()
        .await
        .context("starting the OTLP receiver")?;
    let started = Instant::now();
    let timeout = Duration::from_secs(args.timeout_s);
    let serve = ServeChild::start(
        |cmd| {
            cmd.args(["--model", &spec.model])
                .args(["--max-model-len", &spec.max_model_len.to_string()])
                .args([
                    "--gpu-memory-utilization",
                    &spec.gpu_memory_utilization.to_string(),
                ])
                .args(["--kv-cache-mib", &args.kv_cache_mib.to_string()])
                .args(["--device", &args.device.to_string()])
                .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .env_remove("TRACEPARENT")
                .stderr(Stdio::inherit());
        },
        timeout,
    )
    .await?;
    let pid = serve.pid();
    first_token(&serve.grpc, &serve.model, timeout).await?;
    let actual_total = started.elapsed().as_secs_f64();
    let is_root = |s: &ReceivedSpan| {
        s.name == ferrite_telemetry::phases::ROOT
            && s.attr("pid").and_then(|p| p.as_f64()) == Some(f64::from(pid))
    };
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| spans.iter().any(is_root))
        .await
        .map_err(|got| {
            let names: Vec<&str> = got.iter().map(|s| s.name.as_str()).collect();
            anyhow::anyhow!(
                "no `startup` span arrived from process {pid} (received: {})",
                names.join(", ")
            )
        })?;
    drop(serve);
    let root = spans.iter().find(|s| is_root(s)).cloned();
    let phases = root.as_ref().map_or_else(Vec::new, |root| {
        spans
            .iter()
            .filter(|s| s.parent_span_id.as_deref() == Some(root.span_id.as_str()))
            .cloned()
            .collect()
    });
    Ok((phases, root.map(|r| r.seconds()), actual_total))
}

/// Sends one request and waits for its first token.
async fn first_token(grpc: &str, model: &str, timeout: Duration) -> Result<()> {
    let mut client = api::inference_client::InferenceClient::connect(format!("http://{grpc}"))
        .await
        .context("connecting to ferrite serve")?;
    let req = api::GenerateRequest {
        model: model.to_owned(),
        prompt: Some(api::generate_request::Prompt::Text("Hello".into())),
        sampling: Some(api::SamplingParams {
            max_tokens: Some(1),
            temperature: Some(0.0),
            ..api::SamplingParams::default()
        }),
        ..Default::default()
    };
    let mut stream = client.generate(req).await?.into_inner();
    tokio::time::timeout(timeout, stream.message())
        .await
        .context("no first token in time")??
        .context("the stream ended without a token")?;
    Ok(())
}
