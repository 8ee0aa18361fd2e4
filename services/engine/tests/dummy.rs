//! `--load-format dummy`: a preset's shape with random weights runs through the normal path.

mod common;

use common::*;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::model::{self, EngineModel, LoadOptions, LogitsWanted};

#[test]
fn a_dummy_preset_loads_runs_and_quantizes() {
    let loaded = model::load_dummy("small", 7, LoadOptions::default()).expect("dummy small");
    let c = loaded.model.config().clone();
    assert_eq!(
        (c.hidden_size, c.num_layers, c.vocab_size),
        (768, 12, 10_000)
    );
    assert!(loaded.tokenizer.is_none());
    let prompt: Vec<u32> = (0..12).map(|i| i * 811 % 10_000).collect();
    let logits = prefill_logits(&loaded.model, &prompt, LogitsWanted::Last);
    assert!(logits.iter().all(|l| l.is_finite()));
    let spread = logits.iter().copied().fold(f32::MIN, f32::max)
        - logits.iter().copied().fold(f32::MAX, f32::min);
    assert!(spread > 0.0, "all logits equal");
    // Same seed, same weights; quantized at load, close to them.
    let again = model::load_dummy("small", 7, LoadOptions::default()).expect("again");
    assert_eq!(
        prefill_logits(&again.model, &prompt, LogitsWanted::Last),
        logits
    );
    let w8 = model::load_dummy(
        "small",
        7,
        LoadOptions {
            quantize: Some("w8g128".parse().expect("format")),
            ..Default::default()
        },
    )
    .expect("w8");
    assert_eq!(w8.model.linear_storage(), "w8g128");
    let d = max_abs_diff(
        &prefill_logits(&w8.model, &prompt, LogitsWanted::Last),
        &logits,
    );
    assert!(
        d > 0.0 && d < 0.05 * spread,
        "w8 moved logits by {d} (spread {spread})"
    );
    let e = model::load_dummy("gpt-5", 0, LoadOptions::default()).expect_err("unknown");
    assert!(e.to_string().contains("llama-3-8b"), "{e}");
}

/// Random weights meant to be made on a GPU have no host copy: the CPU engine refuses them
/// clearly instead of running nothing.
#[test]
fn device_random_weights_need_a_gpu() {
    let shape = model::device_random_shape("llama-3-70b", 0, LoadOptions::default())
        .expect("shape only: no 140 GB on the host");
    assert_eq!(shape.cfg.num_layers, 80);
    let model = EngineModel::DeviceRandom(shape);
    assert_eq!(model.linear_storage(), "F16");
    let e = Engine::new(model, vec![], EngineConfig::default()).expect_err("no GPU");
    assert!(e.to_string().contains("--device cuda"), "{e}");
    assert!(model::device_random_shape("gpt-5", 0, LoadOptions::default()).is_err());
}
