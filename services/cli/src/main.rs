//! `ferrite`: the command-line entry point.
//!
//! # Layout
//!
//! - `generate`: one prompt through the engine, streamed to the terminal or printed as JSON.
//! - `model`: list and pull the models ferrite knows by name.
//! - `cluster`: `worker`, `gateway`, and `serve` (gateway + one worker pool in one process).
//! - `bench`: measurements that print tables (`bench decode`: CPU decode throughput).
//! - `loading`: resolving a model name or path and loading it, shared by the commands.

mod bench;
mod bench_gateway;
mod cluster;
mod generate;
mod loading;
mod model_cmd;
mod table;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "ferrite",
    version,
    about = "ferrite: a distributed LLM serving cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Gateway and one worker pool in one process (in-process placement unless --etcd).
    Serve(cluster::ServeArgs),
    /// One rank of a worker pool, registered in etcd.
    Worker(cluster::WorkerArgs),
    /// The public gRPC + OpenAI-compatible HTTP front, routing to pools found in etcd.
    Gateway(cluster::GatewayArgs),
    /// Generate a completion for one prompt.
    Generate(generate::GenerateArgs),
    /// List or pull the models ferrite knows by name.
    #[command(subcommand)]
    Model(model_cmd::ModelCommand),
    /// Benchmarks that print tables.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERRITE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => cluster::serve(args),
        Command::Worker(args) => cluster::worker(args),
        Command::Gateway(args) => cluster::gateway(args),
        Command::Generate(args) => generate::run(args),
        Command::Model(cmd) => model_cmd::run(cmd),
        Command::Bench(cmd) => bench::run(cmd),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
