//! `ferrite generate --json`: the single-process engine, the reference the cluster's answers
//! are compared with.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::{MODEL, Proc, ferrite_bin};

/// How long one `ferrite generate` may take (model load plus a few tokens).
const TIMEOUT: Duration = Duration::from_secs(120);

/// One `ferrite generate --json` answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: String,
}

/// Greedy completion of a text prompt, exactly `max_tokens` tokens (`--ignore-eos`).
pub async fn text(prompt: &str, max_tokens: u32) -> Result<Reference> {
    run(&["--prompt", prompt, "--ignore-eos"], max_tokens).await
}

/// [`text`] with `flags` added to the command line (`--lora-modules`, `--lora`).
pub async fn text_with(prompt: &str, max_tokens: u32, flags: &[String]) -> Result<Reference> {
    let mut extra = vec!["--prompt", prompt, "--ignore-eos"];
    extra.extend(flags.iter().map(String::as_str));
    run(&extra, max_tokens).await
}

/// Greedy completion of one user message through the chat template (stops at EOS).
pub async fn chat(user: &str, max_tokens: u32) -> Result<Reference> {
    run(&["--chat", "--prompt", user], max_tokens).await
}

async fn run(extra: &[&str], max_tokens: u32) -> Result<Reference> {
    let mut args: Vec<String> = [
        "generate",
        "--model",
        MODEL,
        "--temperature",
        "0",
        "--json",
        "--kv-cache-mib",
        "400",
        // The exact arithmetic, as the cluster's workers run it: a sequence decoded alone
        // and one in a batch agree only there.
        "--cpu-activations",
        "f32",
    ]
    .map(String::from)
    .into();
    args.extend(["--max-tokens".into(), max_tokens.to_string()]);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let stdout = Proc::output("ferrite generate", &ferrite_bin()?, &args, TIMEOUT).await?;
    let v: serde_json::Value = serde_json::from_str(&stdout)
        .with_context(|| format!("ferrite generate {args:?} printed no JSON: {stdout}"))?;
    let ids = |key: &str| -> Result<Vec<u32>> {
        v[key]
            .as_array()
            .with_context(|| format!("no {key} in {v}"))?
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .with_context(|| format!("bad id in {key}"))
            })
            .collect()
    };
    Ok(Reference {
        prompt_token_ids: ids("prompt_token_ids")?,
        token_ids: ids("token_ids")?,
        text: v["text"].as_str().context("no text")?.to_owned(),
        finish_reason: v["finish_reason"]
            .as_str()
            .context("no finish_reason")?
            .to_owned(),
    })
}
