//! TLS: the gateway's public listeners against the official `openai` client and `grpcio`
//! (trusted, untrusted, plaintext, and a renewal to an expired certificate), and a cluster that
//! is TLS end to end: etcd requiring client certificates, a worker requiring the gateway's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use ferrite_cluster_tests::cluster::{DISCOVERY_TIMEOUT, channel};
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::{
    Cluster, GatewayProc, MODEL, WorkerOptions, WorkerProc, python, serial, wait,
};
use ferrite_placement::testing::{EtcdServer, EtcdTls};
use ferrite_proto::v1::ListModelsRequest;
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::worker::v1::GetLoadRequest;
use ferrite_proto::worker::v1::worker_client::WorkerClient;
use ferrite_tls::testing::{Leaf, TestCa};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const PYTHON_TIMEOUT: Duration = Duration::from_secs(120);

/// A directory for one test's certificates, removed on drop.
struct CertDir(PathBuf);

impl CertDir {
    fn new(name: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("ferrite-certs-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for CertDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn env(pairs: &[(&str, &Path)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.display().to_string()))
        .collect()
}

/// Replaces a listener's certificate and key with `leaf`, dated later than any earlier write.
fn renew(leaf: &Leaf, dir: &Path, stem: &str) -> Result<()> {
    let (cert, key) = leaf.write(dir, stem);
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    for path in [cert, key] {
        std::fs::File::options()
            .append(true)
            .open(&path)?
            .set_modified(later)?;
    }
    Ok(())
}

async fn tls_client(gateway: &GatewayProc, ca: &Path) -> Result<serde_json::Value> {
    let args = [
        "--http-port".into(),
        gateway.http.port().to_string(),
        "--grpc-port".into(),
        gateway.grpc.port().to_string(),
        "--ca".into(),
        ca.display().to_string(),
    ];
    python::run_client("tls_client.py", &args, PYTHON_TIMEOUT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_listeners_speak_tls_to_the_official_clients() -> Result<()> {
    let _turn = serial().await;
    let dir = CertDir::new("public")?;
    let ca = TestCa::new("ferrite test CA");
    let ca_pem = ca.write(&dir.0, "ca");
    let (cert, key) = ca.issue("gateway", false).write(&dir.0, "gateway");
    let cluster = Cluster::start(&["a"], WorkerOptions::default()).await?;
    let vars = env(&[("FERRITE_TLS_CERT", &cert), ("FERRITE_TLS_KEY", &key)]);
    let gateway = GatewayProc::ready(GatewayProc::spawn_with_env(
        &cluster.etcd.endpoint(),
        &vars,
    )?)
    .await?;

    let out = wait::until(
        "the TLS gateway to list the model",
        DISCOVERY_TIMEOUT,
        || async {
            match tls_client(&gateway, &ca_pem).await {
                Ok(o) if o["grpc_trusted"]["models"] == serde_json::json!([MODEL]) => Ok(o),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?
    .0;
    let show = serde_json::to_string_pretty(&out)?;
    assert_eq!(
        out["openai_trusted"]["models"],
        serde_json::json!([MODEL]),
        "{show}"
    );
    let untrusted = out["openai_untrusted"]["text"].as_str().unwrap_or_default();
    assert!(untrusted.contains("CERTIFICATE_VERIFY_FAILED"), "{show}");
    assert_eq!(out["openai_plaintext"]["status_code"], 400, "{show}");
    let plain = out["openai_plaintext"]["text"].as_str().unwrap_or_default();
    assert!(plain.contains("This port speaks TLS"), "{show}");
    assert_eq!(out["grpc_untrusted"]["error"], "UNAVAILABLE", "{show}");
    assert_eq!(out["grpc_plaintext"]["error"], "UNAVAILABLE", "{show}");

    // Renewed on disk to an expired certificate: served within a second (the files are
    // looked at that often), and refused by the clients.
    renew(&ca.issue("gateway", true), &dir.0, "gateway")?;
    tokio::time::sleep(ferrite_tls::RECHECK).await;
    let out = tls_client(&gateway, &ca_pem).await?;
    let show = serde_json::to_string_pretty(&out)?;
    let expired = out["openai_trusted"]["text"].as_str().unwrap_or_default();
    assert!(expired.contains("certificate has expired"), "{show}");
    assert_eq!(out["grpc_trusted"]["error"], "UNAVAILABLE", "{show}");
    Ok(())
}

/// A TLS client configuration trusting `ca`, presenting `leaf` if given.
fn client_tls(ca: &TestCa, leaf: Option<&Leaf>) -> ClientTlsConfig {
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.pem()));
    match leaf {
        Some(l) => tls.identity(Identity::from_pem(&l.cert_pem, &l.key_pem)),
        None => tls,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_can_be_tls_end_to_end() -> Result<()> {
    let _turn = serial().await;
    let dir = CertDir::new("cluster")?;
    let ca = TestCa::new("ferrite cluster CA");
    let ca_pem = ca.write(&dir.0, "ca");
    let [etcd_pair, worker_pair, gateway_pair] =
        ["etcd", "worker", "gateway"].map(|name| ca.issue(name, false).write(&dir.0, name));
    let gateway_leaf = ca.issue("gateway-client", false);
    let tls = EtcdTls {
        cert: etcd_pair.0.clone(),
        key: etcd_pair.1.clone(),
        client_ca: ca_pem.clone(),
    };
    let etcd = tokio::task::spawn_blocking(move || EtcdServer::start_with(Some(tls))).await?;
    let endpoint = etcd.endpoint();
    anyhow::ensure!(endpoint.starts_with("https://"), "{endpoint}");

    // Both talk to etcd with their own client certificate.
    let worker_env = env(&[
        ("FERRITE_ETCD_CA", &ca_pem),
        ("FERRITE_ETCD_CERT", &worker_pair.0),
        ("FERRITE_ETCD_KEY", &worker_pair.1),
        ("FERRITE_TLS_CERT", &worker_pair.0),
        ("FERRITE_TLS_KEY", &worker_pair.1),
        ("FERRITE_TLS_CLIENT_CA", &ca_pem),
    ]);
    let options = WorkerOptions {
        env: worker_env,
        ..WorkerOptions::default()
    };
    let worker = WorkerProc::start(&endpoint, "secure", &options).await?;
    let (gw_cert, gw_key) = gateway_leaf.write(&dir.0, "gateway-client");
    let gateway_env = env(&[
        ("FERRITE_ETCD_CA", &ca_pem),
        ("FERRITE_ETCD_CERT", &gateway_pair.0),
        ("FERRITE_ETCD_KEY", &gateway_pair.1),
        ("FERRITE_TLS_CERT", &gateway_pair.0),
        ("FERRITE_TLS_KEY", &gateway_pair.1),
        ("FERRITE_WORKER_TLS_CA", &ca_pem),
        ("FERRITE_WORKER_TLS_CERT", &gw_cert),
        ("FERRITE_WORKER_TLS_KEY", &gw_key),
    ]);
    let gateway = GatewayProc::ready(GatewayProc::spawn_with_env(&endpoint, &gateway_env)?).await?;

    // A client trusting the CA generates through the TLS gateway, which calls the worker with
    // its client certificate.
    let public = Endpoint::from_shared(format!("https://localhost:{}", gateway.grpc.port()))?
        .tls_config(client_tls(&ca, None))?
        .connect()
        .await?;
    let mut client = InferenceClient::new(public);
    wait::until(
        "the gateway to list the TLS pool",
        DISCOVERY_TIMEOUT,
        || {
            let mut client = client.clone();
            async move {
                match client.list_models(ListModelsRequest {}).await {
                    Ok(r) if r.get_ref().models.iter().any(|m| m.name == MODEL) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await?;
    let done = grpc::generate(&mut client, greedy_text("The sky is", 4)).await?;
    assert_eq!(done.token_ids.len(), 4, "{done:?}");

    // The gateway's client certificate, renewed on disk, is presented without a restart: one
    // of a CA the worker does not trust is refused (so the gateway did load it), and a good
    // one again serves again.
    let stranger = TestCa::new("another CA").issue("gateway-client", false);
    renew(&stranger, &dir.0, "gateway-client")?;
    let outcome = |want_ok: bool| {
        let client = client.clone();
        move || {
            let mut client = client.clone();
            async move {
                match grpc::generate(&mut client, greedy_text("The sky is", 2)).await {
                    Ok(_) if want_ok => Ok(()),
                    Err(s) if !want_ok && s.code() == tonic::Code::Unavailable => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        }
    };
    wait::until(
        "the renewed certificate to be refused",
        Duration::from_secs(15),
        outcome(false),
    )
    .await?;
    renew(&ca.issue("gateway-client", false), &dir.0, "gateway-client")?;
    wait::until(
        "a good certificate to serve again",
        Duration::from_secs(15),
        outcome(true),
    )
    .await?;

    // The worker refuses a caller without a certificate of the CA, and a plaintext one.
    let worker_url = format!("https://localhost:{}", worker.addr.port());
    let anonymous = Endpoint::from_shared(worker_url.clone())?.tls_config(client_tls(&ca, None))?;
    let refused = match anonymous.connect().await {
        Ok(ch) => WorkerClient::new(ch)
            .get_load(GetLoadRequest {})
            .await
            .err(),
        Err(e) => Some(tonic::Status::unavailable(e.to_string())),
    };
    assert!(
        refused.is_some(),
        "a worker answered a caller without a certificate"
    );
    let plaintext = WorkerClient::new(channel(worker.addr).await?)
        .get_load(GetLoadRequest {})
        .await;
    assert!(plaintext.is_err(), "a worker answered in plaintext");
    let member = Endpoint::from_shared(worker_url)?
        .tls_config(client_tls(&ca, Some(&gateway_leaf)))?
        .connect()
        .await
        .context("connecting with the gateway's certificate")?;
    WorkerClient::new(member)
        .get_load(GetLoadRequest {})
        .await?;
    drop((gateway, worker));
    drop(etcd);
    Ok(())
}
