//! `ferrite bench perplexity`: the quality cost of quantized weights, as perplexity on a text
//! (by default the GPL-3 text every Debian machine has), original weights first.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_engine::eval::perplexity;
use ferrite_engine::model::{self, LoadOptions};
use ferrite_engine::registry;
use serde_json::json;

use crate::table::Table;

#[derive(Debug, Args)]
pub struct PerplexityArgs {
    /// A .gguf file, a Hugging Face model directory, or a known model name.
    #[arg(long, default_value = registry::DEFAULT_MODEL)]
    model: String,
    /// The text to score.
    #[arg(long, default_value = "/usr/share/common-licenses/GPL-3")]
    file: PathBuf,
    /// Comma-separated weight formats: `original` (as stored) or a --quantize value.
    #[arg(
        long,
        default_value = "original,rtn-w8g128,rtn-w4g128,rtn-w2g64",
        value_delimiter = ','
    )]
    formats: Vec<String>,
    /// Tokens per chunk (the second half of each is scored).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Score at most this many chunks.
    #[arg(long)]
    max_chunks: Option<usize>,
    #[arg(long)]
    json: bool,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let formats = args
        .formats
        .iter()
        .map(|f| match f.as_str() {
            "original" => Ok(None),
            q => model::parse_quantize(q)
                .map(Some)
                .map_err(anyhow::Error::msg),
        })
        .collect::<Result<Vec<_>>>()?;
    if formats.is_empty() {
        bail!("--formats is empty");
    }
    let path = registry::resolve(&args.model, |m| {
        eprintln!("ferrite: pulling {} ...", m.name);
    })?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let mut table = Table::new(&[
        "model", "weights", "text", "tokens", "ctx", "scored", "ppl", "vs first", "seconds",
    ]);
    let mut rows = Vec::new();
    let mut first_ppl = None;
    let text_name = args
        .file
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    for quantize in formats {
        let loaded = model::load_with(
            &path,
            LoadOptions {
                quantize,
                ..LoadOptions::default()
            },
        )
        .with_context(|| format!("loading {}", path.display()))?;
        let tokenizer = loaded
            .tokenizer
            .as_ref()
            .context("the model has no tokenizer")?;
        let mut tokens: Vec<u32> = tokenizer.bos_id().into_iter().collect();
        tokens.extend(tokenizer.encode(&text, false)?);
        let start = Instant::now();
        let p = perplexity(&loaded.model, &tokens, args.ctx, args.max_chunks)?;
        let seconds = start.elapsed().as_secs_f64();
        let weights = match quantize {
            Some(f) => format!("rtn-{f}"),
            None => format!("original ({})", loaded.model.linear_storage()),
        };
        let base = *first_ppl.get_or_insert(p.ppl);
        let rel = (p.ppl / base - 1.0) * 100.0;
        table.row(vec![
            args.model.clone(),
            weights.clone(),
            text_name.clone(),
            tokens.len().to_string(),
            args.ctx.to_string(),
            p.scored_tokens.to_string(),
            format!("{:.4}", p.ppl),
            format!("{rel:+.2}%"),
            format!("{seconds:.1}"),
        ]);
        rows.push(json!({
            "model": args.model, "weights": weights, "text": text_name,
            "tokens": tokens.len(), "ctx": args.ctx, "scored_tokens": p.scored_tokens,
            "chunks": p.chunks, "ppl": p.ppl, "mean_nll": p.mean_nll,
            "vs_first_percent": rel, "seconds": seconds,
        }));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", table.render());
    }
    Ok(())
}
