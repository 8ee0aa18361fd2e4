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
//! Without a CUDA device these tests say so and pass, unless `FERRITE_REQUIRE_CUDA=1`.

mod common;

use common::*;
use ferrite_engine::gpu::{GpuOptions, StepDraws, StepLimits, build_runner};
use ferrite_engine::model::{
    self, DeviceSampling, DrawExtras, EngineModel, LogitsWanted, Penalties, SeqChunk,
};
use ferrite_engine::sampler::{self, MAX_LOGPROBS};
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
