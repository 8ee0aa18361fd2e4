//! Flags for who may connect, and how: API keys and rate limits (gateway), TLS of a listener,
//! TLS from the gateway to workers and how long it waits on them, and TLS to etcd. Every flag can also come from its
//! `FERRITE_…` variable.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use ferrite_gateway::Gateway;
use ferrite_placement::{KeySchema, Store};
use ferrite_tls::TlsFiles;

/// Who may call the public APIs, and how much.
#[derive(Debug, Clone, Args)]
pub struct AccessArgs {
    /// API keys, one per line (`#` comments): every call must then bear one as `Authorization:
    /// Bearer KEY` (HTTP header or gRPC metadata). Health, reflection and /metrics stay open.
    #[arg(long, env = "FERRITE_API_KEYS_FILE")]
    api_keys_file: Option<std::path::PathBuf>,
    /// API keys, comma-separated (beside or instead of --api-keys-file).
    #[arg(
        long,
        env = "FERRITE_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    api_keys: Vec<String>,
    /// Requests per minute each API key may make (all callers alike without keys); over it,
    /// 429 / RESOURCE_EXHAUSTED with a retry delay. At least 1 (leave it out for no limit).
    #[arg(long, env = "FERRITE_RATE_LIMIT_REQUESTS_PER_MIN",
        value_parser = clap::value_parser!(u32).range(1..))]
    rate_limit_requests_per_min: Option<u32>,
    /// Tokens per minute each API key may use, counted as prompt + max_tokens at admission.
    /// At least 1 (leave it out for no limit).
    #[arg(long, env = "FERRITE_RATE_LIMIT_TOKENS_PER_MIN",
        value_parser = clap::value_parser!(u32).range(1..))]
    rate_limit_tokens_per_min: Option<u32>,
}

/// How long the gateway waits on a worker pool before it gives up on it.
#[derive(Debug, Clone, Args)]
pub struct UpstreamArgs {
    /// Seconds between HTTP/2 pings to each worker; a worker that leaves one unanswered as
    /// long fails its calls (a stopped or unreachable worker is found within twice this).
    #[arg(long, default_value_t = 5, env = "FERRITE_WORKER_KEEPALIVE_S",
        value_parser = clap::value_parser!(u64).range(1..))]
    worker_keepalive_s: u64,
    /// Seconds a pool may take to send a request's first token; past it the request goes to
    /// another pool, or fails with UNAVAILABLE.
    #[arg(long, default_value_t = 60, env = "FERRITE_FIRST_TOKEN_TIMEOUT_S",
        value_parser = clap::value_parser!(u64).range(1..))]
    first_token_timeout_s: u64,
    /// Seconds a pool may go without sending a token once a request streams; past it the
    /// request fails with UNAVAILABLE.
    #[arg(long, default_value_t = 30, env = "FERRITE_TOKEN_IDLE_TIMEOUT_S",
        value_parser = clap::value_parser!(u64).range(1..))]
    token_idle_timeout_s: u64,
}

impl Default for UpstreamArgs {
    fn default() -> Self {
        Self {
            worker_keepalive_s: 5,
            first_token_timeout_s: 60,
            token_idle_timeout_s: 30,
        }
    }
}

impl UpstreamArgs {
    fn limits(&self) -> ferrite_gateway::route::UpstreamLimits {
        ferrite_gateway::route::UpstreamLimits {
            first_token: Duration::from_secs(self.first_token_timeout_s),
            idle: Duration::from_secs(self.token_idle_timeout_s),
        }
    }
}

impl AccessArgs {
    /// A gateway over `store` with these keys and limits, calling workers with `worker_tls`
    /// and waiting on them as `upstream` says.
    pub fn gateway(
        &self,
        store: Store,
        schema: KeySchema,
        worker_tls: &WorkerTlsArgs,
        upstream: &UpstreamArgs,
    ) -> Result<Gateway> {
        let limits = ferrite_gateway::RateLimits {
            requests_per_min: self.rate_limit_requests_per_min,
            tokens_per_min: self.rate_limit_tokens_per_min,
        };
        let channels = ferrite_gateway::pools::ChannelConfig {
            tls: worker_tls.worker_tls()?,
            keepalive: Duration::from_secs(upstream.worker_keepalive_s),
        };
        Ok(Gateway::with_channels(store, schema, channels)
            .with_api_keys(self.load()?)
            .with_rate_limits(limits)
            .with_upstream_limits(upstream.limits()))
    }

    /// The keys from both sources; a named file that cannot be read, or names no key, is an
    /// error rather than an open gateway.
    fn load(&self) -> Result<ferrite_gateway::ApiKeys> {
        let mut keys: Vec<String> = self.api_keys.clone();
        if let Some(path) = &self.api_keys_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the API keys file {}", path.display()))?;
            let listed: Vec<String> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .map(str::to_owned)
                .collect();
            anyhow::ensure!(
                listed.iter().any(|k| !k.trim().is_empty()),
                "the API keys file {} lists no key",
                path.display()
            );
            keys.extend(listed);
        }
        Ok(ferrite_gateway::ApiKeys::from_keys(
            keys.iter().map(String::as_str),
        ))
    }
}

/// TLS of a listener (the gateway's public ones, a worker's API).
#[derive(Debug, Clone, Default, Args)]
pub struct ListenTlsArgs {
    /// Serve TLS with this certificate chain (PEM, leaf first; re-read when it changes).
    #[arg(long, env = "FERRITE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "FERRITE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require clients to present a certificate chaining to this CA (mutual TLS; on a worker:
    /// the gateways' CA).
    #[arg(long, env = "FERRITE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
}

impl ListenTlsArgs {
    /// The files, when TLS is asked for.
    pub fn files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
        })
    }
}

/// How the gateway calls workers that serve TLS.
#[derive(Debug, Clone, Default, Args)]
pub struct WorkerTlsArgs {
    /// Call workers over TLS, trusting this CA (their addresses are then `https://`).
    #[arg(long, env = "FERRITE_WORKER_TLS_CA")]
    worker_tls_ca: Option<PathBuf>,
    /// The gateway's client certificate for workers that require one (mutual TLS).
    #[arg(long, env = "FERRITE_WORKER_TLS_CERT", requires_all = ["worker_tls_key", "worker_tls_ca"])]
    worker_tls_cert: Option<PathBuf>,
    #[arg(long, env = "FERRITE_WORKER_TLS_KEY", requires = "worker_tls_cert")]
    worker_tls_key: Option<PathBuf>,
}

impl WorkerTlsArgs {
    /// The files, loaded now and again whenever they change (a renewed client certificate).
    fn worker_tls(&self) -> Result<Option<ferrite_gateway::pools::WorkerTls>> {
        let Some(ca) = &self.worker_tls_ca else {
            return Ok(None);
        };
        let files = ferrite_tls::ClientTlsFiles {
            ca: ca.clone(),
            identity: self
                .worker_tls_cert
                .clone()
                .zip(self.worker_tls_key.clone()),
        };
        let tls = ferrite_gateway::pools::WorkerTls::from_files(files).context("TLS to workers")?;
        Ok(Some(tls))
    }
}

/// TLS to etcd.
#[derive(Debug, Clone, Default, Args)]
pub struct EtcdTlsArgs {
    /// Trust this CA for etcd's certificate (`https://` endpoints).
    #[arg(long, env = "FERRITE_ETCD_CA")]
    etcd_ca: Option<PathBuf>,
    /// A client certificate for an etcd that requires one (`--client-cert-auth`).
    #[arg(long, env = "FERRITE_ETCD_CERT", requires_all = ["etcd_key", "etcd_ca"])]
    etcd_cert: Option<PathBuf>,
    #[arg(long, env = "FERRITE_ETCD_KEY", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
}

impl EtcdTlsArgs {
    pub fn client_config(&self) -> Result<Option<tonic::transport::ClientTlsConfig>> {
        client_tls(&self.etcd_ca, &self.etcd_cert, &self.etcd_key).context("TLS to etcd")
    }
}

/// A client TLS configuration from a CA and an optional client certificate and key.
fn client_tls(
    ca: &Option<PathBuf>,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
) -> Result<Option<tonic::transport::ClientTlsConfig>> {
    let Some(ca) = ca else { return Ok(None) };
    let identity = cert.as_deref().zip(key.as_deref());
    Ok(Some(ferrite_tls::client_config(ca, identity)?))
}
