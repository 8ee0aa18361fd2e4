//! `ferrite bench latency`: end-to-end latency of a batch of requests submitted together, in
//! the seven configurations of seed 003 and its Markdown layout (a `## Configuration` section
//! per configuration with a summary table and the individual runs).
//!
//! Definitions, as the seed's numbers show them: latency is the wall time from submitting the
//! batch to its last token; overall throughput = batch × (input_len + output_len) / latency;
//! output throughput here = batch × output_len / latency. The seed's output throughput divides
//! by less than its latency (by the latency minus roughly the prefill time), so `--json` also
//! gives each run's `ttft_s` (time until every request has its first token) to compute that
//! figure. Input throughput is not measured (the seed prints `0.00` and `N/A`).
//!
//! `--row NAME=MODEL` (repeated) measures several models in one run, as the seed's rows
//! (`original`, `w8a16_awq`, ...): each configuration's table then ranks them by output
//! throughput, and a ranking section closes the report, as in the seed.

use std::collections::HashSet;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use ferrite_engine::engine::Engine;
use ferrite_engine::sampler::SamplingParams;
use serde_json::json;

use crate::loading::ModelArgs;

/// The configurations of seed 003, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum ConfigName {
    Interactive,
    DecodeBound,
    PrefillBound,
    LongContext,
    MediumBatch,
    Base,
    HighConcurrency,
}

/// One configuration: `batch` requests of `input_len` prompt tokens and `output_len` new ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Config {
    name: &'static str,
    batch: usize,
    input_len: usize,
    output_len: usize,
}

impl ConfigName {
    /// Batch size, input and output lengths as the seed's `## Configuration:` headers state.
    fn config(self) -> Config {
        let (name, batch, input_len, output_len) = match self {
            Self::Interactive => ("interactive", 1, 128, 64),
            Self::DecodeBound => ("decode_bound", 1, 256, 512),
            Self::PrefillBound => ("prefill_bound", 1, 2048, 32),
            Self::LongContext => ("long_context", 1, 16384, 32),
            Self::MediumBatch => ("medium_batch", 8, 256, 128),
            Self::Base => ("base", 32, 256, 32),
            Self::HighConcurrency => ("high_concurrency", 64, 256, 128),
        };
        Config {
            name,
            batch,
            input_len,
            output_len,
        }
    }
}

#[derive(Debug, Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated seed 003 configurations to run (default: all seven).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "interactive,decode_bound,prefill_bound,long_context,medium_batch,base,high_concurrency"
    )]
    configs: Vec<ConfigName>,
    /// Instead of --configs, one configuration named `custom` of this batch size (needs
    /// --input-len and --output-len too).
    #[arg(long, requires_all = ["input_len", "output_len"], conflicts_with = "configs")]
    batch_size: Option<usize>,
    /// Prompt tokens per request of the `custom` configuration.
    #[arg(long, requires_all = ["batch_size", "output_len"])]
    input_len: Option<usize>,
    /// New tokens per request of the `custom` configuration.
    #[arg(long, requires_all = ["batch_size", "input_len"])]
    output_len: Option<usize>,
    /// Measured runs per configuration, after one untimed warm-up run.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Name in the Model column (`<label>_<config>`); default: `ferrite-<weight format>`.
    #[arg(long, conflicts_with = "rows")]
    label: Option<String>,
    /// `NAME=MODEL`, repeatable: measure each model (a .gguf file or directory, e.g. one
    /// written by `ferrite quantize`) as row NAME in the same run, in place of --model. With
    /// seed 003's row names (`original`, `w8a16_awq`, `w8a8_smooth_gptq`, ...) its 2:4-sparse
    /// rows are listed as not measured, with the reason.
    #[arg(long = "row", value_parser = parse_row)]
    rows: Vec<(String, String)>,
    /// One JSON object per configuration (one per line) instead of the Markdown tables.
    #[arg(long)]
    json: bool,
    /// Ranks of a tensor-parallel pool: this process is rank 0 and starts ranks 1..N as
    /// processes of their own, as `serve --tp N` does (on GPUs with `--collective` and
    /// `--devices`; on the CPU the cores are shared among them).
    #[arg(long, default_value_t = 1)]
    tp: u32,
}

/// One measured run.
#[derive(Debug, Clone, Copy)]
struct RunFigures {
    latency_s: f64,
    ttft_s: f64,
    output_tok_s: f64,
    overall_tok_s: f64,
}

/// Seed 003's rows that ferrite measures (given as `--row`s) ...
const SEED_ROWS: [&str; 6] = [
    "original",
    "w8a16_awq",
    "w8a16_smooth_awq",
    "w8a8_smooth_gptq",
    "w8a8_smooth_ptq",
    "w8a8_fp8",
];
/// ... and those it does not build.
const SPARSE_ROWS: [&str; 2] = ["w8a16_sparse_awq", "w8a8_sparse_smooth_gptq"];
const SPARSE_REASON: &str = "not measured: ferrite has no 2:4 sparse weights (out of scope: \
     the sparse rows of seed 003 are within noise of their dense ones)";

fn parse_row(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, model)) if !name.is_empty() && !model.is_empty() => {
            Ok((name.to_owned(), model.to_owned()))
        }
        _ => Err(format!("--row {s}: expected NAME=MODEL")),
    }
}

/// One row of the tables: its runs per configuration, or why it has none.
struct RowResult {
    label: String,
    model: String,
    configs: Vec<Measured>,
}

/// One (row, configuration): the measured runs, or the reason there are none.
type Measured = (Config, std::result::Result<Vec<RunFigures>, String>);

pub fn run(args: LatencyArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let configs = chosen_configs(&args)?;
    let rows: Vec<(Option<String>, ModelArgs)> = if args.rows.is_empty() {
        vec![(args.label.clone(), args.model.clone())]
    } else {
        args.rows
            .iter()
            .map(|(name, path)| {
                let mut m = args.model.clone();
                m.model = path.clone();
                (Some(name.clone()), m)
            })
            .collect()
    };
    let mut results = Vec::new();
    let mut device = String::new();
    for (label, model) in &rows {
        let (row, dev) = measure_row(label.clone(), model, &configs, args.runs, args.tp)?;
        device = dev;
        if args.json {
            for (cfg, runs) in &row.configs {
                println!("{}", to_json(*cfg, &row.label, &device, &row.model, runs));
            }
        }
        results.push(row);
    }
    if results
        .iter()
        .any(|r| SEED_ROWS.contains(&r.label.as_str()))
    {
        for name in SPARSE_ROWS {
            let configs = configs
                .iter()
                .map(|&c| (c, Err(SPARSE_REASON.to_owned())))
                .collect();
            results.push(RowResult {
                label: name.to_owned(),
                model: String::new(),
                configs,
            });
        }
    }
    if !args.json {
        print!("{}", to_markdown(&device, &configs, &results));
    }
    Ok(())
}

/// The configurations asked for: `--configs`, or the one `custom` configuration.
fn chosen_configs(args: &LatencyArgs) -> Result<Vec<Config>> {
    let configs: Vec<Config> = match (args.batch_size, args.input_len, args.output_len) {
        (Some(batch), Some(input_len), Some(output_len)) => {
            if batch == 0 || input_len == 0 || output_len == 0 {
                bail!("--batch-size, --input-len and --output-len must be at least 1");
            }
            vec![Config {
                name: "custom",
                batch,
                input_len,
                output_len,
            }]
        }
        // clap's `requires_all` leaves only all three or none.
        _ => args.configs.iter().map(|c| c.config()).collect(),
    };
    if configs.is_empty() {
        bail!("--configs is empty");
    }
    Ok(configs)
}

/// Loads one row's model and measures every configuration on it (a warm-up run, then
/// `runs`); returns the row and the device it ran on.
fn measure_row(
    label: Option<String>,
    args: &ModelArgs,
    configs: &[Config],
    runs: usize,
    tp: u32,
) -> Result<(RowResult, String)> {
    // Token ids only: dummy-weight models have no tokenizer, and `ignore_eos` needs no EOS ids.
    let (mut engine, _ranks, storage) = crate::serve_ranks::pool_engine(args, tp)?;
    let label = label.unwrap_or_else(|| match args.quantize {
        Some(f) => format!("ferrite-rtn-{f}"),
        None => format!("ferrite-{}", storage.to_lowercase()),
    });
    let device = describe(&engine, tp);
    let max_len = engine.max_model_len();
    let mut measured = Vec::new();
    let mut next_id = 0u64;
    for &cfg in configs {
        let need = cfg.input_len + cfg.output_len;
        if need > max_len {
            let reason = format!(
                "skipped {}: input_len + output_len = {need} tokens exceeds the max model \
                 length {max_len} (--max-model-len)",
                cfg.name
            );
            measured.push((cfg, Err(reason)));
            continue;
        }
        let mut figures = Vec::new();
        // Run 0 is the untimed warm-up.
        for run in 0..=runs {
            let f = measure(&mut engine, cfg, &mut next_id)?;
            if run > 0 {
                figures.push(f);
            }
        }
        // The tables come at the end (rows are ranked); a long run says how far it got.
        let [_, out, _] = stats(&figures);
        eprintln!(
            "bench latency: {label}_{}: {:.2} output tok/s",
            cfg.name, out.0
        );
        measured.push((cfg, Ok(figures)));
    }
    let model = format!(
        "{} (layers stored as {storage}, max_model_len {max_len})",
        args.model
    );
    Ok((
        RowResult {
            label,
            model,
            configs: measured,
        },
        device,
    ))
}

/// Submits one batch and times it to its last token.
fn measure(engine: &mut Engine, cfg: Config, next_id: &mut u64) -> Result<RunFigures> {
    let vocab = engine.config().vocab_size as u64;
    let requests: Vec<_> = (0..cfg.batch)
        .map(|_| {
            *next_id += 1;
            // Pseudo-random ids from the request id: no two prompts share a prefix, so no
            // request's work is shortened by another's (and the ids do not change the work).
            let mut state = *next_id;
            let prompt = (0..cfg.input_len)
                .map(|_| (splitmix64(&mut state) % vocab) as u32)
                .collect();
            let params = SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(cfg.output_len)
            };
            (*next_id, prompt, params)
        })
        .collect();
    let start = Instant::now();
    let mut first_tokens = HashSet::new();
    let mut ttft = None;
    let results = engine.run_to_completion(requests, |ev| {
        if first_tokens.insert(ev.id) && first_tokens.len() == cfg.batch {
            ttft = Some(start.elapsed().as_secs_f64());
        }
        true
    })?;
    let latency_s = start.elapsed().as_secs_f64();
    // The throughputs count output_len tokens per request: make sure each got them all.
    if let Some((id, g)) = results
        .iter()
        .find(|(_, g)| g.tokens.len() != cfg.output_len)
    {
        bail!(
            "request {id} of {} stopped after {} of {} tokens ({:?})",
            cfg.name,
            g.tokens.len(),
            cfg.output_len,
            g.finish
        );
    }
    Ok(RunFigures {
        latency_s,
        ttft_s: ttft.unwrap_or(latency_s),
        output_tok_s: (cfg.batch * cfg.output_len) as f64 / latency_s,
        overall_tok_s: (cfg.batch * (cfg.input_len + cfg.output_len)) as f64 / latency_s,
    })
}

/// The next value of a splitmix64 stream: well mixed, so nearby seeds give unrelated prompts.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The device the engine runs on, in words; on the CPU also its threads and the matrix
/// kernels' instruction set, which is what CPU speed depends on; and a pool's ranks.
fn describe(engine: &Engine, tp: u32) -> String {
    let name = engine.device_name();
    let name = if name == "cpu" {
        let isa = ferrite_kernels::quant::Isa::best();
        format!("cpu ({} threads, {isa})", rayon::current_num_threads())
    } else {
        name
    };
    if tp > 1 {
        format!("{name}, {tp} ranks (tensor parallel)")
    } else {
        name
    }
}

/// Mean and sample standard deviation (ddof = 1, as every ± of seed 003 is; 0 for one run).
fn mean_std(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = values.collect();
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// The (mean, std) of latency, output and overall throughput.
fn stats(runs: &[RunFigures]) -> [(f64, f64); 3] {
    [
        mean_std(runs.iter().map(|r| r.latency_s)),
        mean_std(runs.iter().map(|r| r.output_tok_s)),
        mean_std(runs.iter().map(|r| r.overall_tok_s)),
    ]
}

/// The seed's layout: a header, a section per configuration (the summary table with rows by
/// output throughput, best first; then each row's runs), and the ranking.
fn to_markdown(device: &str, configs: &[Config], rows: &[RowResult]) -> String {
    let measured: Vec<&RowResult> = rows.iter().filter(|r| !r.model.is_empty()).collect();
    let mut s = match measured.as_slice() {
        [one] => format!(
            "# Performance Benchmark Results\n\n**Device:** {device}; **Model:** {}\n\n---\n",
            one.model
        ),
        _ => {
            let list: Vec<String> = measured
                .iter()
                .map(|r| format!("- `{}`: {}", r.label, r.model))
                .collect();
            format!(
                "# Performance Benchmark Results\n\n**Device:** {device}; **Models:**\n\n{}\n\n---\n",
                list.join("\n")
            )
        }
    };
    for (ci, &cfg) in configs.iter().enumerate() {
        let cells: Vec<(String, &std::result::Result<Vec<RunFigures>, String>)> = rows
            .iter()
            .map(|r| (format!("{}_{}", r.label, cfg.name), &r.configs[ci].1))
            .collect();
        s.push_str(&config_section(cfg, &cells));
    }
    if rows.len() > 1 {
        s.push_str(&ranking(configs, rows));
    }
    s
}

/// Mean output throughput of measured runs (for ordering), `None` for rows not measured.
fn output_mean(runs: &std::result::Result<Vec<RunFigures>, String>) -> Option<f64> {
    runs.as_ref().ok().map(|r| stats(r)[1].0)
}

/// One configuration's section: `cells` are (row name, its runs or why there are none).
fn config_section(
    cfg: Config,
    cells: &[(String, &std::result::Result<Vec<RunFigures>, String>)],
) -> String {
    let mut s = format!(
        "\n\n## Configuration: batch_size={}, input_len={}, output_len={}\n\n",
        cfg.batch, cfg.input_len, cfg.output_len
    );
    let measured: Vec<(&String, &Vec<RunFigures>)> = cells
        .iter()
        .filter_map(|(n, r)| r.as_ref().ok().map(|r| (n, r)))
        .collect();
    let reasons: Vec<String> = cells
        .iter()
        .filter_map(|(n, r)| r.as_ref().err().map(|e| (n, e)))
        .map(|(n, e)| {
            if cells.len() == 1 {
                format!("{e}\n")
            } else {
                format!("- `{n}`: {e}\n")
            }
        })
        .collect();
    if measured.is_empty() {
        s.push_str(&reasons.concat());
        return s;
    }
    if cells.len() > 1 {
        s.push_str(&format!(
            "**Total models tested:** {}\n\n\n",
            measured.len()
        ));
    }
    let header = [
        "Model",
        "Runs",
        "Latency (s)",
        "Output Throughput (tok/s)",
        "Overall Throughput (tok/s)",
        "Input Throughput (tok/s)",
    ];
    // The seed's tables are unpadded: each rule cell is as wide as its header cell.
    let rule: Vec<String> = header.iter().map(|h| "-".repeat(h.len() + 2)).collect();
    s.push_str(&format!(
        "### Summary Table\n\n| {} |\n|{}|\n",
        header.join(" | "),
        rule.join("|")
    ));
    let mut ranked = measured.clone();
    ranked.sort_by(|a, b| stats(b.1)[1].0.total_cmp(&stats(a.1)[1].0));
    for (name, runs) in &ranked {
        let [lat, out, all] = stats(runs);
        s.push_str(&format!(
            "| `{name}` | {} | {:.2} ± {:.2} | {:.2} ± {:.2} | {:.2} ± {:.2} | 0.00 |\n",
            runs.len(),
            lat.0,
            lat.1,
            out.0,
            out.1,
            all.0,
            all.1
        ));
    }
    if !reasons.is_empty() {
        s.push_str(&format!("\nNot measured:\n\n{}", reasons.concat()));
    }
    s.push_str("\n### Detailed Results\n");
    for (name, runs) in measured {
        s.push_str(&detailed(name, runs));
    }
    s
}

/// One row's runs and statistics, as the seed's "Detailed Results" give them.
fn detailed(name: &str, runs: &[RunFigures]) -> String {
    let [lat, out, all] = stats(runs);
    let mut s = format!(
        "\n\n#### {name}\n\n- **Total runs:** {}\n\n- **Individual runs:**\n\n",
        runs.len()
    );
    for (i, r) in runs.iter().enumerate() {
        s.push_str(&format!(
            "  - `{name}_run{}`:\n    - Latency: {:.2}s\n    - Output Throughput: {:.2} tok/s\n    - Overall Throughput: {:.2} tok/s\n    - Input Throughput: N/A\n",
            i + 1,
            r.latency_s,
            r.output_tok_s,
            r.overall_tok_s
        ));
    }
    s.push_str(&format!(
        "- **Statistics:**\n\n  - Latency: {:.2} ± {:.2}\n  - Output Throughput: {:.2} ± {:.2}\n  - Overall Throughput: {:.2} ± {:.2}\n",
        lat.0, lat.1, out.0, out.1, all.0, all.1
    ));
    s
}

/// The seed's closing section: per configuration, the measured rows by output throughput.
fn ranking(configs: &[Config], rows: &[RowResult]) -> String {
    let mut s = String::from("\n---\n\n\n## Performance Ranking (by Output Throughput)\n");
    for (ci, cfg) in configs.iter().enumerate() {
        s.push_str(&format!(
            "\n\n### Configuration: batch_size={}, input_len={}, output_len={}\n\n",
            cfg.batch, cfg.input_len, cfg.output_len
        ));
        let mut ranked: Vec<(f64, String)> = rows
            .iter()
            .filter_map(|r| {
                output_mean(&r.configs[ci].1).map(|m| (m, format!("{}_{}", r.label, cfg.name)))
            })
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (i, (mean, name)) in ranked.iter().enumerate() {
            let place = match i {
                0 => "🥇".to_owned(),
                1 => "🥈".to_owned(),
                2 => "🥉".to_owned(),
                _ => format!("{}.", i + 1),
            };
            s.push_str(&format!("{place} **{name}**: {mean:.2} tok/s\n"));
        }
    }
    s
}

fn to_json(
    cfg: Config,
    label: &str,
    device: &str,
    model: &str,
    runs: &std::result::Result<Vec<RunFigures>, String>,
) -> serde_json::Value {
    let mut v = json!({
        "config": cfg.name, "label": label, "device": device, "model": model,
        "batch_size": cfg.batch, "input_len": cfg.input_len, "output_len": cfg.output_len,
    });
    let runs = match runs {
        Ok(runs) => runs,
        Err(reason) => {
            v["skipped"] = json!(reason);
            return v;
        }
    };
    let [lat, out, all] = stats(runs);
    let ms = |(mean, std): (f64, f64)| json!({ "mean": mean, "std": std });
    v["runs"] = runs
        .iter()
        .map(|r| {
            json!({ "latency_s": r.latency_s, "ttft_s": r.ttft_s,
                "output_throughput": r.output_tok_s, "overall_throughput": r.overall_tok_s })
        })
        .collect();
    v["latency_s"] = ms(lat);
    v["output_throughput"] = ms(out);
    v["overall_throughput"] = ms(all);
    v["input_throughput"] = serde_json::Value::Null;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn std_is_the_seeds_sample_std() {
        // original_interactive's three output throughputs in seed 003: 132.75 ± 8.54.
        let (mean, std) = mean_std([138.03, 122.90, 137.33].into_iter());
        assert_eq!(format!("{mean:.2} ± {std:.2}"), "132.75 ± 8.54");
        assert_eq!(mean_std([1.5].into_iter()), (1.5, 0.0));
    }

    #[test]
    fn configs_are_the_seeds() {
        let c = ConfigName::HighConcurrency.config();
        assert_eq!(
            (c.name, c.batch, c.input_len, c.output_len),
            ("high_concurrency", 64, 256, 128)
        );
        let names: Vec<_> = ConfigName::value_variants()
            .iter()
            .map(|v| v.to_possible_value().map(|p| p.get_name().to_owned()))
            .collect();
        let expected: Vec<_> = ConfigName::value_variants()
            .iter()
            .map(|v| Some(v.config().name.to_owned()))
            .collect();
        assert_eq!(names, expected);
    }
}
