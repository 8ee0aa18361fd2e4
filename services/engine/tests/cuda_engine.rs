//! The engine on a CUDA device against the same engine on the CPU: the default model (a real
//! SmolLM2-135M, head size 64) generates the same greedy tokens in f16 (the bar: the
//! first 16 of at least 9 of 10 prompts) with close first-token log-probabilities; the tiny
//! Gemma 2 and Qwen3 checkpoints (head size 32: soft caps, sliding windows, post-norms, q/k
//! norms) give close log-probabilities; decode runs through CUDA graphs (f16) and eagerly
//! (bf16); prefix-cache hits give the cold tokens; async scheduling gives the tokens of one step
//! at a time; and a context the GPU's memory cannot hold
//! is refused with the flag to change.
//!
//! Where a format's precision flips near-ties (bf16, `rtn-w8g128`, the 8-bit checkpoints: on
//! the H100, PyTorch's own bf16 gives its f32's greedy tokens on only 6 of the 10 prompts,
//! with logit margins of 0.003–0.19 where they part), equal greedy tokens are the wrong bar.
//! Those tests compare teacher-forced log-probabilities instead (see [`teacher_forced`] and
//! [`assert_close_to_the_cpu`]): the CPU's greedy tokens run through the GPU, and the GPU's
//! log-probability of each must stay near the CPU's.
//!
//! The default model's projections are GGUF Q4_1, which stay quantized on the GPU (repacked to
//! 4-bit codes plus per-group minimums, `wq::gguf`), so these comparisons run the quantized
//! kernels and the minimums' correction (`wq_mins`), in decode (the GEMV, whose second n8 tile
//! takes the ten together) and prefill chunks (`wq_mma`) alike.
//!
//! Without a CUDA device these tests say so and pass, unless `FERRITE_REQUIRE_CUDA=1` (set it
//! on the GPU host, so they cannot silently skip there).

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use ferrite_engine::engine::{CudaPlacement, Engine, EngineConfig, Generation};
use ferrite_engine::gpu::{GpuOptions, StepLimits, build_runner};
use ferrite_engine::kv_cache::KvCache;
use ferrite_engine::model::{self, EngineModel, LoadedModel, LogitsWanted, SeqChunk};
use ferrite_engine::sampler::{self, SamplingParams};
use ferrite_kernels::cuda::Gpu;
use ferrite_kernels::cuda::ops::Dtype;

/// The default model with `options` (`FERRITE_TEST_GGUF`, else pulled as `ferrite` does).
fn default_model_with(options: model::LoadOptions) -> LoadedModel {
    model::load_with(&default_model_path(), options).expect("load")
}

fn default_model() -> LoadedModel {
    default_model_with(model::LoadOptions::default())
}

/// `gpu` with half its memory for this engine, in `dtype`, decode through CUDA graphs or not.
fn on(gpu: &Arc<Gpu>, dtype: Dtype, cuda_graphs: bool) -> Option<CudaPlacement> {
    Some(CudaPlacement {
        gpu: gpu.clone(),
        opts: GpuOptions {
            dtype,
            memory_utilization: 0.5,
            cuda_graphs,
            ..GpuOptions::new(dtype)
        },
    })
}

/// Prompts (of the ten) whose tokens are the same in `a` and `b`.
fn same_tokens(a: &HashMap<u64, Generation>, b: &HashMap<u64, Generation>) -> usize {
    (0..10u64)
        .filter(|i| a[i].token_ids() == b[i].token_ids())
        .count()
}

fn cfg(cuda: Option<CudaPlacement>) -> EngineConfig {
    EngineConfig {
        max_model_len: Some(512),
        max_num_batched_tokens: 128,
        max_num_seqs: 16,
        kv_cache_bytes: 128 << 20,
        cuda,
        ..EngineConfig::default()
    }
}

/// Ten prompts of 5..50 pseudo-random in-vocabulary ids, 16 greedy tokens each, with the top
/// 5 log-probabilities of every token.
fn generate(
    model: impl Into<EngineModel>,
    cuda: Option<CudaPlacement>,
) -> HashMap<u64, Generation> {
    let params = SamplingParams {
        ignore_eos: true,
        logprobs: Some(5),
        ..SamplingParams::greedy(16)
    };
    generate_with(model, cuda, params)
}

/// The ten prompts of [`generate`]: 5, 10, ..., 50 pseudo-random ids below `vocab` (the same
/// formula as `tests/fixtures/gpu/torch_reference.py`'s).
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let vocab = vocab as u64;
    (0..10u64)
        .map(|i| {
            (0..5 + 5 * i)
                .map(|j| ((i * 7919 + j * 104_729 + 11) % vocab) as u32)
                .collect()
        })
        .collect()
}

/// [`generate`] with other sampling parameters for every prompt.
fn generate_with(
    model: impl Into<EngineModel>,
    cuda: Option<CudaPlacement>,
    params: SamplingParams,
) -> HashMap<u64, Generation> {
    let model = model.into();
    let prompts = prompts(model.config().vocab_size);
    let mut engine = Engine::new(model, vec![], cfg(cuda)).expect("engine");
    let requests = (0..10u64)
        .zip(prompts)
        .map(|(i, prompt)| (i, prompt, params.clone()))
        .collect();
    engine
        .run_to_completion(requests, |_| true)
        .expect("generate")
}

/// Every prompt's first-token top-5 log-probabilities within 0.05 of the CPU's.
fn assert_first_logprobs_close(
    name: &str,
    want: &HashMap<u64, Generation>,
    got: &HashMap<u64, Generation>,
) {
    for i in 0..10u64 {
        let gap = first_logprob_gap(&want[&i], &got[&i]);
        assert!(
            gap < 0.05,
            "{name} prompt {i}: first-token logprobs differ by {gap}"
        );
    }
}

/// One prompt's 16 CPU greedy tokens as the GPU scores them, teacher-forced.
#[derive(Debug)]
struct Forced {
    /// The largest |logprob_gpu(t) − logprob_cpu(t)| over the tokens, and at which token.
    gap: f32,
    at: usize,
    /// The first token the GPU's argmax is not the CPU's, and the CPU's margin there (its top
    /// logit minus its second: a near-tie when small).
    diverges: Option<(usize, f32)>,
}

/// Runs each prompt and then the CPU's greedy tokens (`cpu`, from [`generate`]) through
/// `forward` (one step of the model over its KV cache, which holds `blocks` blocks of 16) as the
/// engine runs a generation: each prompt's prefill, then decode steps of the ten sequences
/// together, except that each step feeds the CPU's token, not the model's pick. Scores every
/// token the CPU chose.
fn teacher_forced(
    vocab: usize,
    blocks: usize,
    mut forward: impl FnMut(&[SeqChunk<'_>]) -> Vec<f32>,
    cpu: &HashMap<u64, Generation>,
) -> Vec<Forced> {
    let prompts = prompts(vocab);
    let per_seq = (prompts[9].len() + 16).div_ceil(16);
    assert!(blocks >= 10 * per_seq, "KV blocks for ten sequences");
    let tables: Vec<Vec<u32>> = (0..10)
        .map(|i| (i * per_seq..(i + 1) * per_seq).map(|b| b as u32).collect())
        .collect();
    let fed = |i: usize, k: usize| cpu[&(i as u64)].tokens[k].id;
    let mut rows: Vec<Vec<Scored>> = (0..10).map(|_| Vec::new()).collect();
    for (i, prompt) in prompts.iter().enumerate() {
        let chunk = SeqChunk {
            tokens: prompt,
            start_pos: 0,
            block_table: &tables[i],
            logits: LogitsWanted::Last,
            prompt: true,
            lora: None,
        };
        rows[i].push(Scored::of(&forward(&[chunk]), fed(i, 0)));
    }
    for k in 1..16 {
        let tokens: Vec<[u32; 1]> = (0..10).map(|i| [fed(i, k - 1)]).collect();
        let chunks: Vec<SeqChunk<'_>> = (0..10)
            .map(|i| SeqChunk {
                tokens: &tokens[i],
                start_pos: prompts[i].len() + k - 1,
                block_table: &tables[i],
                logits: LogitsWanted::Last,
                prompt: false,
                lora: None,
            })
            .collect();
        let logits = forward(&chunks);
        assert_eq!(logits.len(), 10 * vocab, "one row of logits per sequence");
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            rows[i].push(Scored::of(row, fed(i, k)));
        }
    }
    (0..10)
        .map(|i| Forced::compare(&cpu[&(i as u64)], &rows[i]))
        .collect()
}

/// [`teacher_forced`] on a GPU runner with the engine's limits in [`cfg`] (decode steps replay
/// the CUDA graphs when `placement` captures them).
fn teacher_forced_on_gpu(
    model: EngineModel,
    placement: &CudaPlacement,
    cpu: &HashMap<u64, Generation>,
) -> Vec<Forced> {
    let vocab = model.config().vocab_size;
    let limits = StepLimits {
        max_tokens: 128,
        max_seqs: 16,
        max_model_len: 512,
        block_size: 16,
    };
    let solo = &mut ferrite_collective::Solo;
    let mut runner = build_runner(&model, placement.gpu.clone(), placement.opts, limits, solo)
        .expect("GPU runner");
    let blocks = runner.num_blocks();
    let forward = |chunks: &[SeqChunk<'_>]| runner.forward(chunks, solo).expect("GPU step");
    teacher_forced(vocab, blocks, forward, cpu)
}

/// The harness checked where it can be, without a GPU: the CPU's own greedy tokens teacher-forced
/// through the CPU model step by step give the log-probabilities its generation reported (to
/// f32 rounding: the engine's steps batch differently) and its argmax at every token.
#[test]
fn teacher_forcing_the_cpu_gives_its_own_logprobs() {
    let want = generate(default_model().model, None);
    let model = default_model().model;
    let c = model.config().clone();
    let blocks = 64;
    let mut kv = KvCache::new(c.num_layers, blocks, 16, c.num_kv_heads, c.head_dim);
    let forward = |chunks: &[SeqChunk<'_>]| {
        model
            .forward(chunks, &mut kv, &mut ferrite_collective::Solo)
            .expect("CPU step")
    };
    let forced = teacher_forced(c.vocab_size, blocks, forward, &want);
    for (i, f) in forced.iter().enumerate() {
        assert!(f.gap < 1e-3, "prompt {i}: {f:?}");
        assert_eq!(f.diverges, None, "prompt {i}");
    }
}

/// What a row of GPU logits says of the CPU's token.
#[derive(Debug)]
struct Scored {
    logprob: f32,
    argmax: u32,
}

impl Scored {
    fn of(logits: &[f32], token: u32) -> Self {
        Self {
            logprob: -sampler::token_nll(logits, token) as f32,
            argmax: sampler::argmax(logits),
        }
    }
}

impl Forced {
    fn compare(cpu: &Generation, gpu: &[Scored]) -> Self {
        assert_eq!(cpu.tokens.len(), gpu.len(), "tokens scored");
        let (mut gap, mut at) = (0f32, 0);
        let mut diverges = None;
        for (k, (want, got)) in cpu.tokens.iter().zip(gpu).enumerate() {
            let d = (got.logprob - want.logprob).abs();
            // A NaN logprob must fail, not hide behind `>`.
            if d > gap || d.is_nan() {
                (gap, at) = (d, k);
            }
            if diverges.is_none() && got.argmax != want.id {
                diverges = Some((k, want.top[0].1 - want.top[1].1));
            }
        }
        Self { gap, at, diverges }
    }
}

/// PyTorch's own teacher-forced gap between `dtype` and f32 on the default model (the largest
/// over its ten prompts), from `teacher_forced.json` in `FERRITE_TORCH_REFERENCE`, which
/// `tests/fixtures/gpu/torch_reference.py` writes on the GPU host; `None` where not measured.
fn torch_gap(dtype: Dtype) -> Option<f32> {
    let dir = PathBuf::from(std::env::var_os("FERRITE_TORCH_REFERENCE")?);
    let path = dir.join("teacher_forced.json");
    if !path.is_file() {
        return None;
    }
    read_json(&path)[dtype.name()]["max_gap"]
        .as_f64()
        .map(|g| g as f32)
}

/// The teacher-forced bar: ferrite's largest gap over the ten prompts may not exceed
/// `max(floor, 1.5 × PyTorch's gap in the same dtype)`. The floor is a fixed bound per format,
/// and the whole bar where PyTorch's gap was not measured; the second term lets ferrite move
/// the log-probabilities half again as far as PyTorch's own 16-bit arithmetic moves the default
/// model's (for the 8-bit checkpoints, another model's figure: an orientation only). Prints both
/// gaps, and where the greedy tokens part, the position and the CPU's margin there.
fn assert_close_to_the_cpu(name: &str, dtype: Dtype, floor: f32, forced: &[Forced]) {
    for (i, f) in forced.iter().enumerate() {
        if let Some((k, margin)) = f.diverges {
            eprintln!("{name} prompt {i}: greedy tokens part at token {k}, CPU margin {margin:.4}");
        }
    }
    let (i, worst) = forced
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.gap.total_cmp(&b.1.gap))
        .expect("ten prompts");
    let torch = torch_gap(dtype);
    let allowed = torch.map_or(floor, |t| floor.max(1.5 * t));
    let torch = torch.map_or("not measured".to_string(), |t| format!("{t:.4}"));
    let line = format!(
        "{name}: teacher-forced max |Δlogprob| {:.4} (prompt {i}, token {}); PyTorch {} vs \
         f32 {torch}; allowed {allowed:.4}",
        worst.gap,
        worst.at,
        dtype.name()
    );
    eprintln!("{line}");
    assert!(worst.gap <= allowed, "{line}");
}

/// f16 through CUDA graphs: its precision keeps the greedy tokens (bf16's does not, see
/// [`bf16_gives_the_cpus_logprobs_for_its_greedy_tokens`]).
#[test]
fn the_default_model_generates_the_cpus_greedy_tokens() {
    let Some(gpu) = gpu("the_default_model_generates_the_cpus_greedy_tokens") else {
        return;
    };
    let want = generate(default_model().model, None);
    let got = generate(default_model().model, on(&gpu, Dtype::F16, true));
    let same = same_tokens(&got, &want);
    assert!(
        same >= 9,
        "f16: {same}/10 prompts gave the CPU's 16 greedy tokens"
    );
    assert_first_logprobs_close("f16", &want, &got);
}

/// bf16, decoding eagerly: the CPU's greedy tokens teacher-forced through the GPU.
#[test]
fn bf16_gives_the_cpus_logprobs_for_its_greedy_tokens() {
    let Some(gpu) = gpu("bf16_gives_the_cpus_logprobs_for_its_greedy_tokens") else {
        return;
    };
    let want = generate(default_model().model, None);
    let placement = on(&gpu, Dtype::Bf16, false).expect("placement");
    let forced = teacher_forced_on_gpu(default_model().model.into(), &placement, &want);
    assert_close_to_the_cpu("default model, bf16", Dtype::Bf16, 0.5, &forced);
}

/// Prefix caching on the GPU: the ten prompts (lengthened to 40..85 tokens, several blocks of
/// 16) cold, then with their first halves cached (partial hits), then whole (full hits), all
/// on one engine through CUDA graphs. A cache fault (a wrong block, a use after evict) gives
/// garbage; batch shapes that differ from the cold round's may flip a near tie in f16, so the
/// bar is the CPU comparison's: the 16 greedy tokens of at least 9 of 10 prompts.
#[test]
fn prefix_cache_hits_on_the_gpu_give_its_cold_tokens() {
    let Some(gpu) = gpu("prefix_cache_hits_on_the_gpu_give_its_cold_tokens") else {
        return;
    };
    let model = default_model().model;
    let vocab = model.config().vocab_size as u64;
    let mut engine = Engine::new(model, vec![], cfg(on(&gpu, Dtype::F16, true))).expect("engine");
    let prompts: Vec<Vec<u32>> = (0..10u64)
        .map(|i| {
            (0..40 + 5 * i)
                .map(|j| ((i * 7919 + j * 104_729 + 11) % vocab) as u32)
                .collect()
        })
        .collect();
    let round = |engine: &mut Engine, prompts: &[Vec<u32>], base: u64| {
        let params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(16)
        };
        let requests = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (base + i as u64, p.clone(), params.clone()))
            .collect();
        let mut cached = 0;
        let out = engine
            .run_to_completion(requests, |ev| {
                cached += ev.cached_tokens.unwrap_or(0);
                true
            })
            .expect("generate");
        let tokens: Vec<Vec<u32>> = (0..prompts.len() as u64)
            .map(|i| out[&(base + i)].token_ids())
            .collect();
        (tokens, cached)
    };
    let (cold, none) = round(&mut engine, &prompts, 0);
    assert_eq!(none, 0);
    engine.reset_prefix_cache();
    let halves: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| p[..p.len() / 2].iter().copied().chain([13]).collect())
        .collect();
    round(&mut engine, &halves, 100);
    let (partial, partial_cached) = round(&mut engine, &prompts, 200);
    let (full, full_cached) = round(&mut engine, &prompts, 300);
    assert!(
        partial_cached > 0 && full_cached > partial_cached,
        "{partial_cached} {full_cached}"
    );
    for (name, got) in [("partial", &partial), ("full", &full)] {
        let same = (0..10).filter(|&i| got[i] == cold[i]).count();
        assert!(
            same >= 9,
            "{name} hits: {same}/10 prompts gave the cold tokens"
        );
    }
}

/// Gemma 2 and 3, Qwen3, Phi-3 and SmolLM3 (f16, graphs): the first token's top-5
/// log-probabilities (Gemma 3's sliding layers rotate by a base of their own; Phi-3 rotates
/// half of a head; YaRN and LongRoPE scale cos and sin; SmolLM3's fourth layer rotates none).
#[test]
fn tiny_models_match_the_cpu() {
    let Some(gpu) = gpu("tiny_models_match_the_cpu") else {
        return;
    };
    for dir in [
        "models/gemma2",
        "models/gemma3",
        "models/qwen3",
        "models/phi3",
        "models/qwen3_yarn",
        "models/phi3_longrope",
        "models/smollm3",
    ] {
        let path = fixtures().join(dir);
        let want = generate(model::load(&path).expect("tiny model").model, None);
        let loaded = model::load(&path).expect("tiny model");
        let got = generate(loaded.model, on(&gpu, Dtype::F16, true));
        assert_first_logprobs_close(dir, &want, &got);
    }
}

/// A W8A8 checkpoint (llm-compressor's SmoothQuant + GPTQ, on the int8 kernels, which compute
/// the CPU's integer sums and scales exactly, from activations rounded to f16 first, so a code
/// can land one step off the CPU's) and an FP8 one (dynamic per token, on the FP8 kernels where
/// the GPU has them): teacher-forced log-probabilities, f16 through graphs.
#[test]
fn eight_bit_checkpoints_give_the_cpus_logprobs() {
    let Some(gpu) = gpu("eight_bit_checkpoints_give_the_cpus_logprobs") else {
        return;
    };
    for dir in [
        "quant/interop/ct_smoothquant_w8a8",
        "quant/interop/ct_fp8_dynamic",
    ] {
        let path = fixtures().join(dir);
        let want = generate(model::load(&path).expect("checkpoint").model, None);
        let loaded = model::load(&path).expect("checkpoint");
        let placement = on(&gpu, Dtype::F16, true).expect("placement");
        let forced = teacher_forced_on_gpu(loaded.model.into(), &placement, &want);
        assert_close_to_the_cpu(dir, Dtype::F16, 0.2, &forced);
    }
}

#[test]
fn a_context_the_gpu_cannot_hold_is_refused() {
    let Some(gpu) = gpu("a_context_the_gpu_cannot_hold_is_refused") else {
        return;
    };
    let loaded = default_model();
    let opts = GpuOptions {
        dtype: Dtype::F16,
        memory_utilization: 0.005,
        cuda_graphs: false,
        ..GpuOptions::new(Dtype::F16)
    };
    let cfg = EngineConfig {
        max_model_len: Some(8192),
        cuda: Some(CudaPlacement { gpu, opts }),
        ..EngineConfig::default()
    };
    let e =
        Engine::new(loaded.model, vec![], cfg).expect_err("0.5% of the GPU for an 8192 context");
    assert!(e.to_string().contains("--gpu-memory-utilization"), "{e}");
}

/// Issue #5's end-to-end check: a random-weight safetensors checkpoint, and PyTorch's greedy
/// tokens for it on the same GPU, made by `tests/fixtures/gpu/torch_reference.py` on the GPU
/// host (`FERRITE_TORCH_REFERENCE` names its directory). ferrite's CUDA path (f16, graphs) and
/// its CPU path each give PyTorch's first 16 tokens for at least 9 of the 10 prompts.
#[test]
fn a_random_checkpoint_matches_pytorch_on_the_gpu() {
    let Some(gpu) = gpu("a_random_checkpoint_matches_pytorch_on_the_gpu") else {
        return;
    };
    let Some(dir) = std::env::var_os("FERRITE_TORCH_REFERENCE").map(PathBuf::from) else {
        assert!(
            std::env::var_os("FERRITE_REQUIRE_CUDA").is_none(),
            "on the GPU host, run tests/fixtures/gpu/torch_reference.py and set FERRITE_TORCH_REFERENCE"
        );
        return;
    };
    let reference = read_json(&dir.join("torch_reference.json"));
    let cases = reference["cases"].as_array().expect("cases");
    let requests: Vec<(u64, Vec<u32>, SamplingParams)> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let params = SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(16)
            };
            (i as u64, ids(&c["prompt_token_ids"]), params)
        })
        .collect();
    for (path, cuda) in [("cpu", None), ("cuda", on(&gpu, Dtype::F16, true))] {
        let loaded = model::load(&dir).expect("the reference checkpoint");
        let mut engine = Engine::new(loaded.model, vec![], cfg(cuda)).expect("engine");
        let out = engine
            .run_to_completion(requests.clone(), |_| true)
            .expect("generate");
        let same = cases
            .iter()
            .enumerate()
            .filter(|(i, c)| out[&(*i as u64)].token_ids() == ids(&c["greedy_token_ids"])[..16])
            .count();
        assert!(
            same >= 9,
            "{path}: {same}/10 prompts gave PyTorch's 16 greedy tokens"
        );
    }
}

/// Weight-only quantized projections on the GPU's quantized kernels (GEMV up to 16 rows: the
/// ten prompts decode together; the tensor-core GEMM above: prefill chunks are up to 128
/// tokens) against the CPU running the same codes: 4-bit codes keep the greedy tokens; 8-bit
/// codes (whose f16 rounding flips near-ties) give the CPU's teacher-forced logprobs.
#[test]
fn quantized_weights_match_the_cpu() {
    let Some(gpu) = gpu("quantized_weights_match_the_cpu") else {
        return;
    };
    let load = |format: &str| {
        let options = model::LoadOptions {
            quantize: Some(model::parse_quantize(format).expect("format")),
            ..Default::default()
        };
        default_model_with(options)
    };
    let want = generate(load("rtn-w4g128").model, None);
    let got = generate(load("rtn-w4g128").model, on(&gpu, Dtype::F16, true));
    let same = same_tokens(&got, &want);
    assert!(
        same >= 9,
        "rtn-w4g128: {same}/10 prompts gave the CPU's 16 greedy tokens"
    );
    let want = generate(load("rtn-w8g128").model, None);
    let placement = on(&gpu, Dtype::F16, true).expect("placement");
    let forced = teacher_forced_on_gpu(load("rtn-w8g128").model.into(), &placement, &want);
    assert_close_to_the_cpu("rtn-w8g128", Dtype::F16, 0.15, &forced);
}

/// `--load-format dummy` on a GPU: random weights of a preset's shape made on the device (no
/// host copy), plain and as random 4-bit codes, generate finite output through the whole
/// engine, the same twice over for the same seed.
#[test]
fn random_weights_made_on_the_device_run_through_the_engine() {
    let Some(gpu) = gpu("random_weights_made_on_the_device_run_through_the_engine") else {
        return;
    };
    for quantize in [None, Some("w4g128-sym")] {
        let shape = || {
            let options = model::LoadOptions {
                quantize: quantize.map(|f| f.parse().expect("format")),
                ..Default::default()
            };
            model::device_random_shape("small", 3, options).expect("preset")
        };
        let placement = || on(&gpu, Dtype::F16, true);
        let a = generate(EngineModel::DeviceRandom(shape()), placement());
        let b = generate(EngineModel::DeviceRandom(shape()), placement());
        for i in 0..10u64 {
            assert_eq!(a[&i].token_ids().len(), 16, "{quantize:?}");
            assert_eq!(
                a[&i].token_ids(),
                b[&i].token_ids(),
                "{quantize:?} prompt {i}"
            );
            assert!(
                a[&i]
                    .tokens
                    .iter()
                    .all(|t| t.top.iter().all(|(_, lp)| lp.is_finite()))
            );
        }
    }
}

/// Without logprobs or penalties the GPU samples by itself and reads back only the ids:
/// greedy picks are the CPU's, and seeded draws repeat from run to run (the device's random
/// stream is keyed by seed, step and token) and change with the seed.
#[test]
fn sampling_on_the_device_matches_greedy_and_repeats_seeded_draws() {
    let Some(gpu) = gpu("sampling_on_the_device_matches_greedy_and_repeats_seeded_draws") else {
        return;
    };
    let placement = || on(&gpu, Dtype::F16, true);
    let greedy = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(16)
    };
    let want = generate_with(default_model().model, None, greedy.clone());
    let got = generate_with(default_model().model, placement(), greedy);
    let same = same_tokens(&got, &want);
    assert!(
        same >= 9,
        "{same}/10 prompts gave the CPU's 16 greedy tokens"
    );
    let seeded = |seed| SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        seed: Some(seed),
        ignore_eos: true,
        ..SamplingParams::greedy(16)
    };
    let a = generate_with(default_model().model, placement(), seeded(7));
    let b = generate_with(default_model().model, placement(), seeded(7));
    let c = generate_with(default_model().model, placement(), seeded(8));
    let ids =
        |g: &HashMap<u64, Generation>| (0..10u64).map(|i| g[&i].token_ids()).collect::<Vec<_>>();
    assert_eq!(ids(&a), ids(&b), "the same seed drew different tokens");
    assert_ne!(ids(&a), ids(&c), "seeds 7 and 8 drew the same 160 tokens");
    assert!(
        a[&0]
            .tokens
            .iter()
            .all(|t| t.logprob.is_nan() && t.top.is_empty())
    );
}

/// Async scheduling (the host plans step n+1 while the device runs step n; the ids come back
/// through page-locked memory) gives the tokens of steps run one at a time: greedy and seeded
/// draws on the device, whose steps chain (step n+1 is launched before step n's ids are back,
/// and takes them on the device), draws with a penalty, which the device makes too (counting
/// the carried draw from the step's input), and both in one step; all of them chain.
#[test]
fn async_scheduling_gives_the_tokens_of_one_step_at_a_time() {
    let Some(gpu) = gpu("async_scheduling_gives_the_tokens_of_one_step_at_a_time") else {
        return;
    };
    let run = |async_scheduling: bool, params: &[SamplingParams; 2]| {
        let model = default_model().model;
        let prompts = prompts(model.config().vocab_size);
        let cfg = EngineConfig {
            async_scheduling,
            ..cfg(on(&gpu, Dtype::F16, true))
        };
        let mut e = Engine::new(model, vec![], cfg).expect("engine");
        for (i, prompt) in (0..10u64).zip(prompts) {
            e.add_request(i, prompt, params[i as usize % 2].clone())
                .expect("add");
        }
        let (mut got, mut chained) = (HashMap::<u64, Vec<u32>>::new(), 0);
        while e.has_unfinished() {
            let out = e.step().expect("step");
            chained += usize::from(out.chained);
            for ev in out.events {
                got.entry(ev.id).or_default().push(ev.token.id);
            }
        }
        (got, chained)
    };
    let greedy = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(16)
    };
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: Some(7),
        ..greedy.clone()
    };
    let penalized = SamplingParams {
        frequency_penalty: 0.5,
        ..greedy.clone()
    };
    for (params, chains) in [
        ([greedy.clone(), greedy.clone()], true),
        ([seeded.clone(), seeded], true),
        ([penalized.clone(), penalized.clone()], true),
        ([greedy, penalized], true),
    ] {
        let ((want, _), (got, chained)) = (run(false, &params), run(true, &params));
        for i in 0..10u64 {
            assert_eq!(got[&i], want[&i], "prompt {i}, {params:?}");
        }
        // 16 tokens each: 15 decode steps, each chained behind the one before.
        assert_eq!(chained >= 14, chains, "{chained} steps chained, {params:?}");
    }
}

/// A grammar that allows one given token a step and is complete after the last.
#[derive(Debug)]
struct OneEach {
    seq: Vec<u32>,
    at: usize,
}

impl ferrite_engine::constraint::Constraint for OneEach {
    fn allowed(&mut self, mask: &mut [u32], _: usize) -> Result<(), String> {
        mask.fill(0);
        let t = *self.seq.get(self.at).ok_or("past the end")?;
        mask[t as usize / 32] |= 1 << (t % 32);
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<bool, String> {
        if token != self.seq[self.at] {
            return Err(format!("token {token} was not allowed"));
        }
        self.at += 1;
        Ok(self.at == self.seq.len())
    }
}

/// Requests under a grammar sample on the device with the rest of their step (no logprobs, no
/// penalties): their masks, computed on the host while the forward runs, go to the device and
/// hold the draw, greedy or at temperature 1, to the one token each step allows, and the grammar
/// ends the output; an unconstrained neighbour in the same steps runs to its length.
#[test]
fn device_sampling_holds_to_a_grammars_mask() {
    let Some(gpu) = gpu("device_sampling_holds_to_a_grammars_mask") else {
        return;
    };
    for async_scheduling in [false, true] {
        grammar_on_the_device(&gpu, async_scheduling);
    }
}

/// [`device_sampling_holds_to_a_grammars_mask`] with steps one at a time, or under async
/// scheduling (each grammar follows its token before the next step's mask is computed).
fn grammar_on_the_device(gpu: &Arc<Gpu>, async_scheduling: bool) {
    let model = default_model().model;
    let vocab = model.config().vocab_size as u32;
    let cfg = EngineConfig {
        async_scheduling,
        ..cfg(on(gpu, Dtype::F16, true))
    };
    let mut e = Engine::new(model, vec![], cfg).expect("engine");
    let seq: Vec<u32> = [40, 9000, 3, 20_000, 17, 777]
        .iter()
        .map(|t| t % vocab)
        .collect();
    let sampled = SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        ..SamplingParams::greedy(50)
    };
    for (id, params) in [(1, sampled), (2, SamplingParams::greedy(50))] {
        let grammar = OneEach {
            seq: seq.clone(),
            at: 0,
        };
        e.add_constrained(id, vec![5, 6, 7, 8], params, Some(Box::new(grammar)))
            .expect("add");
    }
    e.add_request(3, vec![9, 10, 11], SamplingParams::greedy(8))
        .expect("add");
    let mut out: HashMap<u64, Vec<ferrite_engine::engine::TokenEvent>> = HashMap::new();
    while e.has_unfinished() {
        for ev in e.step().expect("step").events {
            out.entry(ev.id).or_default().push(ev);
        }
    }
    for id in [1, 2] {
        let tokens: Vec<u32> = out[&id].iter().map(|ev| ev.token.id).collect();
        assert_eq!(
            tokens, seq,
            "request {id}, async scheduling {async_scheduling}"
        );
        let last = out[&id].last().expect("tokens").finish;
        assert_eq!(last, Some(ferrite_engine::engine::FinishReason::Stop));
    }
    assert_eq!(out[&3].len(), 8);
}
