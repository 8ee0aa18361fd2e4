//! Draws with penalties and logprobs on a CUDA device (`sampling.cu`'s `sample_extras_f32`)
//! against the host sampler's steps on the same logits: the default model's GPU runner takes
//! one step of ten prompts and gives its logits back, then takes it again drawing on the
//! device with extras (logit biases, penalties of each kind over tokens seen in the prompt and
//! the output,
//! the chunk's last token counted from the step's input ids, logprobs from none to the most);
//! the host's `greedy_with_extras` on the first step's logits must give the same ids, the same
//! top tokens and logprobs within f32 summation, and the device's rows with no extras the
//! plain draw.
//!
//! Scored prompts (`prompt_logprobs`) turn the device's draws off for their steps: every row
//! of their chunks comes back, within the GPU's room for rows, and the host scores them. The
//! default model's scores on the GPU must be the CPU's (within f16's 0.05).
//!
//! Without a CUDA device these tests say so and pass, unless `FERRITE_REQUIRE_CUDA=1`.

mod common;

use common::*;
use ferrite_engine::engine::{CudaPlacement, Engine, EngineConfig};
use ferrite_engine::gpu::{GpuOptions, StepDraws, StepLimits, build_runner};
use ferrite_engine::model::{
    self, DeviceSampling, DrawExtras, EngineModel, LogitsWanted, Penalties, SeqChunk,
};
use ferrite_engine::sampler::{self, MAX_LOGPROBS, SampledToken, SamplingParams};
use ferrite_kernels::cuda::ops::Dtype;

/// Row `i`'s extras: penalties of one of four kinds over tokens of its prompt (every third of
/// them seen in the output too, some several times), and logprobs from none to the most.
fn extras(i: usize, prompt: &[u32]) -> DrawExtras {
    let penalties = [
        Penalties::NONE,
        Penalties {
            repetition: 1.4,
            ..Penalties::NONE
        },
        Penalties {
            presence: 0.6,
            frequency: 0.9,
            ..Penalties::NONE
        },
        Penalties {
            repetition: 1.2,
            presence: 0.3,
            frequency: 2.5,
        },
    ][i % 4];
    let seen = match penalties.any() {
        true => sampler::seen_tokens(prompt, &prompt[..prompt.len() / 3].repeat(2)),
        false => Vec::new(),
    };
    DrawExtras {
        row: i as u32,
        penalties,
        seen,
        last_is_output: penalties.any() && i % 2 == 1,
        logprobs: [None, Some(0), Some(5), Some(MAX_LOGPROBS as u32)][(i / 2) % 4],
        // Every third row: a bias that lifts one of its prompt's tokens, another that sinks.
        bias: match i % 3 {
            0 => vec![(prompt[0], 7.5), (prompt[1], -100.0)],
            _ => Vec::new(),
        },
    }
}

#[test]
fn device_extras_take_the_host_samplers_steps_on_the_same_logits() {
    let Some(gpu) = gpu("device_extras_take_the_host_samplers_steps_on_the_same_logits") else {
        return;
    };
    let model: EngineModel = model::load(&default_model_path())
        .expect("default model")
        .model
        .into();
    let vocab = model.config().vocab_size;
    let limits = StepLimits {
        max_tokens: 256,
        max_seqs: 16,
        max_model_len: 512,
        block_size: 16,
    };
    let opts = GpuOptions::new(Dtype::F16);
    let solo = &mut ferrite_collective::Solo;
    let mut runner = build_runner(&model, gpu, opts, limits, solo).expect("GPU runner");
    let prompts: Vec<Vec<u32>> = (0..10u64)
        .map(|i| {
            (0..4 + 3 * i)
                .map(|j| ((i * 7919 + j * 104_729 + 11) % vocab as u64) as u32)
                .collect()
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..10u32).map(|i| (4 * i..4 * i + 4).collect()).collect();
    let chunks: Vec<SeqChunk<'_>> = (0..10)
        .map(|i| SeqChunk {
            tokens: &prompts[i],
            start_pos: 0,
            block_table: &tables[i],
            logits: LogitsWanted::Last,
            prompt: true,
            lora: None,
        })
        .collect();
    let logits = runner.forward(&chunks, solo).expect("GPU step");
    // Rows 8 and 9 have no extras: the plain draw, greedy and at a temperature.
    let extras: Vec<DrawExtras> = (0..8).map(|i| extras(i, &prompts[i])).collect();
    let params: Vec<DeviceSampling> = (0..10)
        .map(|i| DeviceSampling {
            temperature: if i == 9 { 0.8 } else { 0.0 },
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 5,
            step: 0,
        })
        .collect();
    let draws = StepDraws {
        params: &params,
        extras: &extras,
    };
    let drawn = runner
        .launch_sampled(&chunks, draws, None, &[], solo, None)
        .and_then(|d| runner.finish_ids(d))
        .expect("device draws");
    assert_eq!(drawn.ids.len(), 10);
    for (i, x) in extras.iter().enumerate() {
        let mut row = logits[i * vocab..(i + 1) * vocab].to_vec();
        let last = prompts[i].last().copied();
        let (id, want) = sampler::greedy_with_extras(&mut row, x, last);
        assert_eq!(drawn.ids[i], id, "row {i}: {x:?}");
        let got = drawn.logprobs.iter().find(|(r, _)| *r as usize == i);
        match (want, got) {
            (None, None) => {}
            (Some(w), Some((_, g))) => {
                assert!(
                    (w.logprob - g.logprob).abs() <= 1e-4,
                    "row {i}: {w:?} {g:?}"
                );
                assert_eq!(w.top.len(), g.top.len(), "row {i}");
                for (a, b) in w.top.iter().zip(&g.top) {
                    assert_eq!(a.0, b.0, "row {i}: {w:?} {g:?}");
                    assert!((a.1 - b.1).abs() <= 1e-4, "row {i}: {w:?} {g:?}");
                }
            }
            (w, g) => panic!("row {i}: logprobs {w:?} on the host, {g:?} on the device"),
        }
    }
    let row8 = &logits[8 * vocab..9 * vocab];
    assert_eq!(drawn.ids[8], sampler::argmax(row8), "a plain greedy row");
    assert!(
        (drawn.ids[9] as usize) < vocab,
        "a plain draw at a temperature"
    );
}

/// Each scored request's prompt scores, from an engine on `cuda` (or the CPU): ten prompts of
/// 5..50 tokens and one of 300, scored with their 5 most likely tokens beside ten plain
/// decodes, in a pool of 24 sequences (so the scored chunks are cut to the rows left).
fn scores(cuda: Option<CudaPlacement>, async_scheduling: bool) -> Vec<Vec<SampledToken>> {
    let model = model::load(&default_model_path()).expect("load").model;
    let vocab = model.config().vocab_size as u64;
    let cfg = EngineConfig {
        max_model_len: Some(512),
        max_num_batched_tokens: 128,
        max_num_seqs: 24,
        kv_cache_bytes: 128 << 20,
        cuda,
        async_scheduling,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(model, vec![], cfg).expect("engine");
    let prompt = |i: u64, n: u64| -> Vec<u32> {
        (0..n)
            .map(|j| ((i * 7919 + j * 104_729 + 11) % vocab) as u32)
            .collect()
    };
    for i in 0..11u64 {
        let scored = SamplingParams {
            ignore_eos: true,
            prompt_logprobs: Some(5),
            ..SamplingParams::greedy(2)
        };
        let n = if i == 10 { 300 } else { 5 + 5 * i };
        engine.add_request(i, prompt(i, n), scored).expect("add");
        let plain = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(8)
        };
        engine
            .add_request(100 + i, prompt(100 + i, 20), plain)
            .expect("add");
    }
    let mut out = vec![Vec::new(); 11];
    while engine.has_unfinished() {
        let step = engine.step().expect("step");
        assert!(step.failed.is_empty(), "{:?}", step.failed);
        for ev in step.events.into_iter().filter(|e| e.id < 11) {
            if !ev.prompt_logprobs.is_empty() {
                out[ev.id as usize] = ev.prompt_logprobs;
            }
        }
    }
    out
}

#[test]
fn scored_prompts_on_the_gpu_give_the_cpus_scores() {
    let Some(gpu) = gpu("scored_prompts_on_the_gpu_give_the_cpus_scores") else {
        return;
    };
    let want = scores(None, false);
    for async_scheduling in [false, true] {
        let placement = CudaPlacement {
            gpu: gpu.clone(),
            opts: GpuOptions {
                memory_utilization: 0.5,
                ..GpuOptions::new(Dtype::F16)
            },
        };
        let got = scores(Some(placement), async_scheduling);
        let (mut positions, mut same_top) = (0, 0);
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w.len(), g.len(), "one score per prompt token");
            for (w, g) in w.iter().zip(g) {
                assert_eq!(w.id, g.id);
                assert!((w.logprob - g.logprob).abs() < 0.05, "{w:?} against {g:?}");
                positions += 1;
                same_top += usize::from(w.top[0].0 == g.top[0].0);
            }
        }
        // f16 may flip a near tie among the most likely tokens; not many.
        assert!(same_top * 100 >= positions * 95, "{same_top}/{positions}");
    }
}
