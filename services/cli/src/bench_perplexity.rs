//! `ferrite bench perplexity`: the quality cost of quantized weights, as perplexity on a text
//! (by default the GPL-3 text every Debian machine has), original weights first.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_engine::model::kv::KvDtype;
use ferrite_engine::model::{self, LoadOptions, LoadQuantize};
use ferrite_engine::registry;
use ferrite_quantize::calib::split_tokens;
use ferrite_quantize::eval::perplexity;
use serde_json::json;

use crate::table::Table;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Split {
    All,
    HeldOut,
}

/// One row: the model at `--model` (as stored or quantized at load), or another checkpoint.
#[derive(Debug, Clone)]
enum Row {
    Model(Option<LoadQuantize>),
    Dir(PathBuf),
}
#[derive(Debug, Args)]
pub struct PerplexityArgs {
    /// A .gguf file, a Hugging Face model directory, or a known model name.
    #[arg(long, default_value = registry::DEFAULT_MODEL)]
    model: String,
    /// The text to score.
    #[arg(long, default_value = "/usr/share/common-licenses/GPL-3")]
    file: PathBuf,
    /// Comma-separated rows: `original` (as stored), a --quantize value, or a directory
    /// written by `ferrite quantize` (any quantized Hugging Face directory).
    #[arg(
        long,
        default_value = "original,rtn-w8g128,rtn-w4g128,rtn-w2g64",
        value_delimiter = ','
    )]
    formats: Vec<String>,
    /// Comma-separated KV cache types each format is scored with (`f32`: exact; `f16`, `fp8`:
    /// what `--kv-cache-dtype` costs in quality).
    #[arg(long, default_value = "f32", value_delimiter = ',')]
    kv_cache_dtypes: Vec<KvDtype>,
    /// Tokens per chunk (the second half of each is scored).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Score at most this many chunks.
    #[arg(long)]
    max_chunks: Option<usize>,
    /// Which tokens of the text to score: `all`, or `held-out` (the second half, which
    /// `ferrite quantize` does not calibrate on).
    #[arg(long, value_enum, default_value = "all")]
    split: Split,
    #[arg(long)]
    json: bool,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let formats = args
        .formats
        .iter()
        .map(|f| match f.as_str() {
            "original" => Ok(Row::Model(None)),
            q if std::path::Path::new(q).is_dir() => Ok(Row::Dir(PathBuf::from(q))),
            q => model::parse_quantize(q)
                .map(|f| Row::Model(Some(f)))
                .map_err(|e| anyhow::anyhow!("{e} (or name a quantized model directory)")),
        })
        .collect::<Result<Vec<_>>>()?;
    if formats.is_empty() {
        bail!("--formats is empty");
    }
    let path = registry::resolve(&args.model, |what| {
        eprintln!("ferrite: {what} ...");
    })?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let mut table = Table::new(&[
        "model", "weights", "kv cache", "text", "tokens", "ctx", "scored", "ppl", "vs first",
        "seconds",
    ]);
    let mut rows = Vec::new();
    let mut first_ppl = None;
    let text_name = args
        .file
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    for row in formats {
        let (row_path, quantize) = match &row {
            Row::Model(q) => (path.clone(), *q),
            Row::Dir(d) => (d.clone(), None),
        };
        let loaded = model::load_with(
            &row_path,
            LoadOptions {
                quantize,
                ..LoadOptions::default()
            },
        )
        .with_context(|| format!("loading {}", row_path.display()))?;
        let tokenizer = loaded
            .tokenizer
            .as_ref()
            .context("the model has no tokenizer")?;
        let mut tokens: Vec<u32> = tokenizer.bos_id().into_iter().collect();
        tokens.extend(tokenizer.encode(&text, false)?);
        if args.split == Split::HeldOut {
            tokens = split_tokens(&tokens).1.to_vec();
        }
        let weights = match (&row, quantize) {
            (_, Some(f)) => format!("rtn-{f}"),
            (Row::Dir(d), None) => {
                format!("{} ({})", quantizer_of(d), loaded.model.linear_storage())
            }
            (Row::Model(_), None) => format!("original ({})", loaded.model.linear_storage()),
        };
        for &kv in &args.kv_cache_dtypes {
            let start = Instant::now();
            let p = perplexity(&loaded.model, &tokens, (args.ctx, args.max_chunks), kv)?;
            let seconds = start.elapsed().as_secs_f64();
            let base = *first_ppl.get_or_insert(p.ppl);
            let rel = (p.ppl / base - 1.0) * 100.0;
            table.row(vec![
                args.model.clone(),
                weights.clone(),
                kv.as_str().into(),
                text_name.clone(),
                tokens.len().to_string(),
                args.ctx.to_string(),
                p.scored_tokens.to_string(),
                format!("{:.4}", p.ppl),
                format!("{rel:+.2}%"),
                format!("{seconds:.1}"),
            ]);
            rows.push(json!({
                "model": args.model, "weights": weights, "kv_cache": kv.as_str(),
                "text": text_name, "tokens": tokens.len(), "ctx": args.ctx,
                "scored_tokens": p.scored_tokens, "chunks": p.chunks, "ppl": p.ppl,
                "mean_nll": p.mean_nll, "vs_first_percent": rel, "seconds": seconds,
            }));
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", table.render());
    }
    Ok(())
}

/// What made a quantized directory: the `quantizer` its safetensors metadata names (`ferrite
/// gptq-w4g128`), else its directory name.
fn quantizer_of(dir: &std::path::Path) -> String {
    let name = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    use std::io::Read;
    let header = std::fs::File::open(dir.join("model.safetensors"))
        .ok()
        .and_then(|mut f| {
            let mut len = [0u8; 8];
            f.read_exact(&mut len).ok()?;
            let mut h = vec![0u8; usize::try_from(u64::from_le_bytes(len)).ok()?.min(1 << 26)];
            f.read_exact(&mut h).ok()?;
            Some(h)
        });
    header
        .and_then(|h| serde_json::from_slice::<serde_json::Value>(&h).ok())
        .and_then(|h| h["__metadata__"]["quantizer"].as_str().map(str::to_owned))
        .map_or(name, |q| q.trim_start_matches("ferrite ").to_owned())
}
