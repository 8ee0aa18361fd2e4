//! Temporary probe (deleted after use).
use std::time::Duration;
use anyhow::{Context, Result};
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::{Cluster, WorkerOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_deadline_codes() -> Result<()> {
    let options = WorkerOptions { max_num_seqs: Some(1), max_waiting: Some(4), ..WorkerOptions::default() };
    let cluster = Cluster::start(&["q"], options).await?;
    let mut client = cluster.inference().await?;
    let mut running = client.generate(greedy_text("Tell me a long story.", 3000)).await?.into_inner();
    running.message().await?.context("first")?;
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..200 {
        let mut req = tonic::Request::new(greedy_text("Too late.", 4));
        req.metadata_mut().insert("grpc-timeout", "20m".parse()?);
        let code = match client.generate(req).await {
            Ok(s) => grpc::collect(s.into_inner()).await.err().map(|s| format!("{:?} {}", s.code(), s.message())),
            Err(s) => Some(format!("{:?} {}", s.code(), s.message())),
        };
        *counts.entry(code).or_insert(0) += 1;
    }
    eprintln!("{counts:?}");
    drop(running);
    let _ = Duration::from_secs(1);
    Ok(())
}
