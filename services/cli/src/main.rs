//! `ferrite`: the command-line entry point.
//!
//! # Layout
//!
//! - `generate`: one prompt through the engine, streamed to the terminal or printed as JSON.
//! - `model`: list and pull the models ferrite knows by name.
//! - `quantize`: a safetensors checkpoint to a GPTQ-format one by round-to-nearest.
//! - `cluster`: `worker`, `gateway`, and `serve` (gateway + one worker pool in one process).
//! - `bench`: measurements that print tables (`bench decode`: CPU decode throughput;
//!   `bench gateway`: what the gateway adds; `bench startup`: start-up phases from spans;
//!   `bench perplexity`: quality of quantized weights on a text; `bench kernels`: quantized
//!   linear layers against f16 per model shape; `bench forward`: forward passes of the seed
//!   002 model sizes; `bench latency`: batch latency in the configurations of seed 003;
//!   `bench prefix`: prefix caching and KV-aware routing across pools).
//! - `loading`: resolving a model name or path and loading it, shared by the commands.

mod bench;
mod bench_collective;
mod bench_collective_gpu;
mod bench_embed;
mod bench_forward;
mod bench_gateway;
mod bench_kernels;
mod bench_kernels_model;
mod bench_kernels_row;
mod bench_latency;
mod bench_perplexity;
mod bench_prefix;
mod bench_soak;
mod bench_speculative;
mod bench_startup;
mod bench_structured;
mod chaos;
mod cluster;
mod docs;
mod doctor;
mod doctor_gpu;
mod generate;
mod kernels_cmd;
mod loading;
mod model_cmd;
mod placement_args;
mod quantize;
mod security_args;
mod serve_child;
mod serve_ranks;
mod table;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "ferrite",
    version,
    about = "ferrite: a distributed LLM serving cluster"
)]
struct Cli {
    /// OTLP gRPC endpoint for traces (default: $OTEL_EXPORTER_OTLP_ENDPOINT; neither: no export).
    #[arg(long, global = true)]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Gateway and one worker pool in one process (in-process placement unless --etcd).
    Serve(cluster::ServeArgs),
    /// One rank of a worker pool, registered in etcd.
    Worker(cluster::WorkerArgs),
    /// Check this host before serving: devices, CUDA libraries and versions, an all-reduce
    /// across local ranks, /dev/shm.
    Doctor(doctor::DoctorArgs),
    /// The public gRPC + OpenAI-compatible HTTP front, routing to pools found in etcd.
    Gateway(cluster::GatewayArgs),
    /// Generate a completion for one prompt.
    Generate(generate::GenerateArgs),
    /// Quantize a model (Hugging Face directory or GGUF file) by RTN, GPTQ, AWQ or SmoothQuant.
    Quantize(quantize::QuantizeArgs),
    /// List or pull the models ferrite knows by name.
    #[command(subcommand)]
    Model(model_cmd::ModelCommand),
    /// Benchmarks that print tables.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// CUDA kernel modules: compile them into the CUBIN cache.
    #[command(subcommand)]
    Kernels(kernels_cmd::KernelsCommand),
    /// Prints the command reference (docs/cli.md) from these definitions.
    #[command(hide = true)]
    Docs,
}

impl Command {
    /// `service.name` of this process's spans, unless `OTEL_SERVICE_NAME` says otherwise.
    fn service_name(&self) -> &'static str {
        match self {
            Command::Serve(_) => "ferrite-serve",
            Command::Worker(_) => "ferrite-worker",
            Command::Gateway(_) => "ferrite-gateway",
            Command::Generate(_) => "ferrite-generate",
            Command::Quantize(_) => "ferrite-quantize",
            Command::Model(_) => "ferrite-model",
            Command::Bench(_) => "ferrite-bench",
            Command::Kernels(_) => "ferrite-kernels",
            Command::Doctor(_) => "ferrite-doctor",
            Command::Docs => "ferrite-docs",
        }
    }

    /// Whether this process serves `/metrics`.
    fn serves_metrics(&self) -> bool {
        matches!(
            self,
            Command::Serve(_) | Command::Worker(_) | Command::Gateway(_)
        )
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let telemetry = match ferrite_telemetry::Telemetry::init(&ferrite_telemetry::TelemetryConfig {
        default_service_name: cli.command.service_name().to_owned(),
        otlp_endpoint: cli.otlp_endpoint.clone(),
        metrics: cli.command.serves_metrics(),
    }) {
        Ok(t) => t,
        Err(e) => {
            ferrite_telemetry::notice("error", &format!("error: {e}"));
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => cluster::serve(args, &telemetry),
        Command::Worker(args) => cluster::worker(args, &telemetry),
        Command::Doctor(args) => doctor::run(args),
        Command::Gateway(args) => cluster::gateway(args, &telemetry),
        Command::Generate(args) => generate::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Model(cmd) => model_cmd::run(cmd),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Kernels(cmd) => kernels_cmd::run(cmd),
        Command::Docs => {
            use clap::CommandFactory;
            print!("{}", docs::cli_reference(Cli::command()));
            Ok(())
        }
    };
    // Exports the spans still buffered.
    telemetry.shutdown();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            ferrite_telemetry::notice("error", &format!("error: {e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn the_committed_command_reference_is_current() {
        let want = crate::docs::cli_reference(Cli::command());
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md");
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/cli.md is stale: run `cargo run --release -p ferrite-cli -- docs > docs/cli.md`"
        );
    }
}
