use serde_json::{Value, json};

use ferrite_kernels::cpu::rope::Rope;

use super::{Architecture, ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};

/// A config of 128-dimension heads, `extra` over it.
fn config(arch: &str, extra: Value) -> Result<ModelConfig> {
    let mut cfg = json!({"architectures": [arch], "hidden_size": 1024,
        "intermediate_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 2, "vocab_size": 256, "rope_theta": 1e6});
    for (k, v) in extra.as_object().expect("object") {
        cfg[k] = v.clone();
    }
    ModelConfig::from_hf_config(&cfg)
}

/// Qwen3's model-card YaRN (factor 4 over 32768): the pairs that turn often in 32768
/// positions keep their frequency, the slow ones are divided by 4, a ramp between; cos and
/// sin scaled by 0.1 ln 4 + 1.
#[test]
fn yarn_as_qwen_sets_it() {
    let c = config(
        "Qwen3ForCausalLM",
        json!({"max_position_embeddings": 131_072,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 32768}}),
    )
    .expect("config");
    let RopeScaling::Yarn {
        attention_factor,
        original_max_position,
        ..
    } = c.rope_scaling
    else {
        panic!("{:?}", c.rope_scaling)
    };
    assert_eq!(original_max_position, 32768);
    assert!((attention_factor - 1.138_629_4).abs() < 1e-6);
    let base = Rope::base_inv_freq(1e6, 128);
    let rope = c.rope(None, 8192);
    assert_eq!(rope.scale, attention_factor);
    // Bounds: floor(23.6) and ceil(39.6) of the pairs turning 32 and 1 times.
    assert_eq!(rope.inv_freq[..=23], base[..=23], "pairs 0-23 are kept");
    for i in 40..64 {
        let want = 1.0 / (4.0 * (1e6f32).powf((2 * i) as f32 / 128.0));
        assert_eq!(rope.inv_freq[i], want, "pair {i} is interpolated");
    }
    assert!(rope.inv_freq[31] < base[31] && rope.inv_freq[31] > base[31] / 4.0);
}

/// DeepSeek's YaRN: the attention factor from `mscale` over `mscale_all_dim`, or as given.
#[test]
fn yarn_attention_factor_variants() {
    let yarn = |extra: Value| {
        let mut r = json!({"rope_type": "yarn", "factor": 40.0,
            "original_max_position_embeddings": 4096});
        for (k, v) in extra.as_object().expect("object") {
            r[k] = v.clone();
        }
        let c = config("LlamaForCausalLM", json!({"rope_scaling": r})).expect("config");
        c.rope(None, 4096).scale
    };
    let plain = (0.1 * 40f64.ln() + 1.0) as f32;
    assert_eq!(yarn(json!({})), plain);
    assert_eq!(yarn(json!({"mscale": 1.0, "mscale_all_dim": 1.0})), 1.0);
    let ratio = (0.1 * 0.707 * 40f64.ln() + 1.0) / (0.1 * 40f64.ln() + 1.0);
    assert_eq!(
        yarn(json!({"mscale": 0.707, "mscale_all_dim": 1.0})),
        ratio as f32
    );
    assert_eq!(yarn(json!({"attention_factor": 1.25})), 1.25);
}

/// Phi-4-mini's config: 96 of 128 dimensions rotate, 48 short and 48 long factors, the
/// original length top-level; the attention factor from 131072 / 4096; the long factors past
/// 4096 tokens of context. Phi-3's first long checkpoints call it "su".
#[test]
fn longrope_as_phi_writes_it() {
    for kind in ["longrope", "su"] {
        let short: Vec<f32> = (0..48).map(|i| 1.0 + i as f32 / 100.0).collect();
        let long: Vec<f32> = (0..48).map(|i| 1.0 + i as f32).collect();
        let c = config(
            "Phi3ForCausalLM",
            json!({"partial_rotary_factor": 0.75,
            "max_position_embeddings": 131_072, "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": kind, "short_factor": short, "long_factor": long}}),
        )
        .expect("config");
        assert_eq!((c.architecture, c.rope_dim), (Architecture::Phi3, 96));
        let want_scale = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt() as f32;
        assert!(!c.rope_scaling.long_factors_for(4096));
        assert!(c.rope_scaling.long_factors_for(4097));
        for (context, factors) in [(4096, &short), (8192, &long)] {
            let rope = c.rope(None, context);
            assert_eq!(rope.scale, want_scale);
            for (i, (f, ext)) in rope.inv_freq.iter().zip(factors).enumerate() {
                let want = 1.0 / (ext * (1e6f32).powf((2 * i) as f32 / 96.0));
                assert_eq!(*f, want, "pair {i} at context {context}");
            }
        }
    }
}

/// A scaling ferrite does not compute is refused by name, as is a malformed one.
#[test]
fn unsupported_or_malformed_scaling_is_refused() {
    for bad in [
        json!({"rope_type": "dynamic", "factor": 2.0}),
        json!({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}),
        json!({"rope_type": "longrope", "short_factor": "x"}),
        json!({"rope_type": "yarn", "factor": -4.0}),
    ] {
        let r = config("LlamaForCausalLM", json!({"rope_scaling": bad.clone()}));
        assert!(
            matches!(r, Err(ModelError::BadConfig(_))),
            "{bad}: expected BadConfig, got {r:?}"
        );
    }
    let r = config(
        "LlamaForCausalLM",
        json!({"rope_scaling": {"rope_type": "dynamic"}}),
    );
    let msg = r.expect_err("dynamic").to_string();
    assert!(msg.contains("`dynamic`") && msg.contains("yarn"), "{msg}");
}
