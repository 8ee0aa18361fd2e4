//! `/metrics` scraped and parsed by the Prometheus project's own Python parser
//! (`tests/clients/metrics_parse.py`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::python::run_client;

/// Parses `/metrics` at `addr`; returns each sample's name and sorted labels
/// (`name{k=v,k2=v2}`, values unquoted) → value.
pub async fn scrape(addr: SocketAddr) -> Result<BTreeMap<String, f64>> {
    let parsed = run_client(
        "metrics_parse.py",
        &[format!("http://{addr}/metrics")],
        Duration::from_secs(30),
    )
    .await?;
    let mut out = BTreeMap::new();
    for s in parsed["samples"].as_array().context("samples")? {
        let labels = s[1].as_object().context("labels")?;
        let mut key = s[0].as_str().context("name")?.to_owned();
        let mut pairs: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
            .collect();
        pairs.sort();
        if !pairs.is_empty() {
            key.push_str(&format!("{{{}}}", pairs.join(",")));
        }
        out.insert(key, s[2].as_f64().context("value")?);
    }
    Ok(out)
}

/// The sample `key` (as [`scrape`] names it), 0 when absent.
pub fn sample(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}
