//! `ferrite bench structured`: what constrained decoding costs. Output tokens per second of
//! concurrent streams under a JSON schema against the same streams unconstrained, the time of
//! each mask (per sequence and token), and the compile time of a set of schemas, on the engine
//! in this process (no gateway, no HTTP).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_engine::constraint::Constraint;
use ferrite_engine::engine::Engine;
use ferrite_engine::sampler::SamplingParams;
use ferrite_structured::{Guide, Spec, Vocabulary};
use serde_json::{Value, json};

use crate::loading::ModelArgs;
use crate::table::{Table, percentile};

#[derive(Debug, Args)]
pub struct StructuredArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Schemas to compile: a JSON list of `{"id", "schema"}` (tests/fixtures/schemas has 234
    /// from the JSON Schema Test Suite and SchemaStore).
    #[arg(long, default_value = "tests/fixtures/schemas/schemas.json")]
    schemas: PathBuf,
    /// Concurrent streams.
    #[arg(long, default_value_t = 32)]
    streams: usize,
    /// New tokens per stream (the schema cannot end sooner).
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Measured runs of each kind, after one warm-up run.
    #[arg(long, default_value_t = 2)]
    runs: usize,
    #[command(flatten)]
    schema: crate::cluster::SchemaArgs,
    #[arg(long)]
    json: bool,
}

/// The streams' schema: a list of at least 100 people, which no stream completes within its
/// tokens, so both runs make the same number of tokens.
fn people() -> Value {
    json!({"type": "array", "minItems": 100, "items": {"type": "object",
        "additionalProperties": false, "required": ["name", "age", "city"],
        "properties": {"name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "maxLength": 16}}}})
}

/// A guide that records how long each of its masks took.
#[derive(Debug)]
struct Timed {
    guide: Guide,
    times: Arc<Mutex<Vec<Duration>>>,
}

impl Constraint for Timed {
    fn allowed(&mut self, mask: &mut [u32], budget: usize) -> Result<(), String> {
        let start = Instant::now();
        let r = self.guide.allowed(mask, budget);
        let took = start.elapsed();
        self.times
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(took);
        r
    }

    fn accept(&mut self, token: u32) -> Result<bool, String> {
        self.guide.accept(token)
    }

    fn cut_short(&self) -> bool {
        self.guide.cut_short()
    }
}

pub fn run(args: StructuredArgs) -> Result<()> {
    if args.streams == 0 || args.new_tokens < 2 || args.runs == 0 {
        bail!("--streams ≥ 1, --new-tokens ≥ 2 and --runs ≥ 1 are needed");
    }
    let (model, tokenizer, _) = args.model.load_for_engine()?;
    let tokenizer = tokenizer.context("the model has no tokenizer")?;
    let cfg = args.model.engine_config(&model)?;
    let mut engine = Engine::new(model, tokenizer.eos_ids().to_vec(), cfg)?;
    let started = Instant::now();
    let json = tokenizer.to_tokenizer_json()?;
    let width = engine.config().vocab_size;
    let vocabulary = Vocabulary::from_tokenizer_json(&json, tokenizer.clone(), width)?;
    let vocabulary_ms = started.elapsed().as_secs_f64() * 1e3;
    let bounded = args.schema.json_schema_bounds;
    let compile = compile_times(&vocabulary, &args.schemas, bounded)?;

    let prompt = tokenizer.encode("A JSON list of people with their name, age and city:", true)?;
    let spec = Spec::JsonSchema {
        schema: people(),
        strict: true,
    };
    let (grammar, _) = vocabulary.compile_spec(&spec, bounded)?;
    let times = Arc::new(Mutex::new(Vec::new()));
    let mut rates = [Vec::new(), Vec::new()];
    let mut next_id = 0;
    for run in 0..=args.runs {
        for (constrained, rate) in rates.iter_mut().enumerate() {
            let mut guides = Vec::new();
            for _ in 0..args.streams {
                let guide: Option<Box<dyn Constraint>> = if constrained == 1 {
                    let guide = vocabulary.compile(&grammar)?;
                    let times = times.clone();
                    Some(Box::new(Timed { guide, times }))
                } else {
                    None
                };
                guides.push(guide);
            }
            let tokens = generate(&mut engine, &prompt, guides, args.new_tokens, &mut next_id)?;
            if run > 0 {
                rate.push(tokens);
            }
        }
        if run == 0 {
            // The warm-up's masks are not counted.
            times.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (free, guided) = (mean(&rates[0]), mean(&rates[1]));
    let mut masks: Vec<f64> = times
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|d| d.as_secs_f64() * 1e6)
        .collect();
    masks.sort_by(f64::total_cmp);
    let mask_p50 = percentile(&masks, 0.5).unwrap_or(0.0);
    let mask_p99 = percentile(&masks, 0.99).unwrap_or(0.0);
    if args.json {
        println!(
            "{}",
            json!({"model": args.model.model, "streams": args.streams,
                "new_tokens": args.new_tokens, "runs": args.runs,
                "unconstrained_tok_s": free, "constrained_tok_s": guided,
                "mask_us": {"p50": mask_p50, "p99": mask_p99, "count": masks.len()},
                "vocabulary_ms": vocabulary_ms, "compile": compile.json()})
        );
        return Ok(());
    }
    let mut t = Table::new(&[
        "model",
        "streams",
        "new",
        "unconstrained tok/s",
        "JSON schema tok/s",
        "slower by",
        "mask p50 µs",
        "mask p99 µs",
    ]);
    t.row(vec![
        args.model.model.clone(),
        args.streams.to_string(),
        args.new_tokens.to_string(),
        format!("{free:.1}"),
        format!("{guided:.1}"),
        format!("{:.1}%", (1.0 - guided / free) * 100.0),
        format!("{mask_p50:.0}"),
        format!("{mask_p99:.0}"),
    ]);
    print!("{}", t.render());
    print!("{}", compile.table(vocabulary_ms).render());
    Ok(())
}

/// Runs one stream per entry of `guides` (constrained where it has one) from `prompt` for
/// `new_tokens` each; returns the output tokens per second of them all.
fn generate(
    engine: &mut Engine,
    prompt: &[u32],
    guides: Vec<Option<Box<dyn Constraint>>>,
    new_tokens: usize,
    next_id: &mut u64,
) -> Result<f64> {
    let start = Instant::now();
    for guide in guides {
        *next_id += 1;
        let params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(new_tokens)
        };
        engine.add_constrained(*next_id, prompt.to_vec(), params, guide)?;
    }
    let mut tokens = 0;
    while engine.has_unfinished() {
        let out = engine.step()?;
        if let Some((id, e)) = out.failed.into_iter().next() {
            bail!("stream {id} failed: {e}");
        }
        tokens += out.events.len();
    }
    Ok(tokens as f64 / start.elapsed().as_secs_f64())
}

/// Compile times over a schema set.
struct CompileTimes {
    /// Milliseconds of each schema that compiled, in file order.
    ms: Vec<f64>,
    refused: usize,
}

fn compile_times(
    vocabulary: &Vocabulary,
    path: &std::path::Path,
    bounded: bool,
) -> Result<CompileTimes> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let entries: Vec<Value> = serde_json::from_str(&text)?;
    let mut out = CompileTimes {
        ms: Vec::new(),
        refused: 0,
    };
    for e in entries {
        let spec = Spec::JsonSchema {
            schema: e["schema"].clone(),
            strict: false,
        };
        let start = Instant::now();
        match vocabulary.compile_spec(&spec, bounded) {
            Ok(_) => out.ms.push(start.elapsed().as_secs_f64() * 1e3),
            Err(_) => out.refused += 1,
        }
    }
    Ok(out)
}

impl CompileTimes {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    fn json(&self) -> Value {
        let s = self.sorted();
        json!({"compiled": self.ms.len(), "refused": self.refused,
            "p50_ms": percentile(&s, 0.5), "p99_ms": percentile(&s, 0.99),
            "first_ms": self.ms.first(), "max_ms": s.last()})
    }

    fn table(&self, vocabulary_ms: f64) -> Table {
        let s = self.sorted();
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
        let mut t = Table::new(&[
            "schemas compiled",
            "refused",
            "compile p50 ms",
            "compile p99 ms",
            "max ms",
            "first ms",
            "vocabulary ms",
        ]);
        t.row(vec![
            self.ms.len().to_string(),
            self.refused.to_string(),
            ms(percentile(&s, 0.5)),
            ms(percentile(&s, 0.99)),
            ms(s.last().copied()),
            ms(self.ms.first().copied()),
            format!("{vocabulary_ms:.0}"),
        ]);
        t
    }
}
