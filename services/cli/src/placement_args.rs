//! `--etcd`, `--prefix` and etcd's TLS: where placement lives, for every command that registers
//! or watches pools (and for the rank processes `serve --tp` starts).

use anyhow::{Context, Result};
use clap::Args;
use ferrite_placement::{KeySchema, Store};

use crate::security_args::EtcdTlsArgs;

/// Where placement lives.
#[derive(Debug, Clone, Args)]
pub struct PlacementArgs {
    /// etcd endpoints, comma-separated (e.g. http://127.0.0.1:2379). `serve` without it uses an
    /// in-process store.
    #[arg(long, value_delimiter = ',', env = "FERRITE_ETCD")]
    pub etcd: Vec<String>,
    /// Key prefix in etcd.
    #[arg(long, default_value = "/ferrite/v1", env = "FERRITE_ETCD_PREFIX")]
    pub prefix: String,
    #[command(flatten)]
    pub tls: EtcdTlsArgs,
}

impl PlacementArgs {
    pub(crate) async fn store(&self, embedded_ok: bool) -> Result<(Store, KeySchema)> {
        let schema = KeySchema::new(self.prefix.clone());
        if self.etcd.is_empty() {
            anyhow::ensure!(embedded_ok, "--etcd is required");
            return Ok((Store::embedded(), schema));
        }
        let options = ferrite_placement::EtcdOptions {
            tls: self.tls.client_config()?,
            ..ferrite_placement::EtcdOptions::default()
        };
        let store = Store::connect_with(&self.etcd, &self.prefix, options)
            .await
            .with_context(|| format!("connecting to etcd at {}", self.etcd.join(",")))?;
        Ok((store, schema))
    }
}
