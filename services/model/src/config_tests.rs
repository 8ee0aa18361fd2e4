use serde_json::json;

use super::*;

fn gemma2(extra: Value) -> Result<ModelConfig> {
    let mut cfg = json!({
        "architectures": ["Gemma2ForCausalLM"],
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "vocab_size": 256,
    });
    for (k, v) in extra.as_object().expect("object") {
        cfg[k] = v.clone();
    }
    ModelConfig::from_hf_config(&cfg)
}

fn bad_config(r: Result<ModelConfig>, case: &Value) -> String {
    match r {
        Err(e @ ModelError::BadConfig(_)) => e.to_string(),
        other => panic!("{case}: expected BadConfig, got {other:?}"),
    }
}

/// A hub config without `layer_types` or optional keys gets transformers' defaults.
#[test]
fn gemma2_defaults_match_transformers() {
    let c = gemma2(json!({})).expect("config");
    assert_eq!(c.architecture, Architecture::Gemma2);
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!((c.norm_weight_offset, c.embedding_scale), (1.0, 8.0));
    assert!(c.post_norms && c.tie_word_embeddings && !c.qkv_bias);
    assert_eq!(c.attention_scale, 1.0 / 16.0); // query_pre_attn_scalar 256
    assert_eq!(
        (c.attn_logit_softcap, c.final_logit_softcap),
        (Some(50.0), Some(30.0))
    );
    let w = Some(4096);
    assert_eq!(c.attention_window, [w, None, w, None]);
}

#[test]
fn gemma2_reads_layer_types_window_scalar_and_null_caps() {
    let c = gemma2(json!({
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention",
                        "full_attention"],
        "sliding_window": 8, "query_pre_attn_scalar": 144,
        "attn_logit_softcapping": null, "final_logit_softcapping": 3.0,
        "hidden_act": "this key is not the one Gemma 2 reads",
    }))
    .expect("config");
    assert_eq!(c.attention_window, [None, Some(8), Some(8), None]);
    assert_eq!(c.attention_scale, (144f64).powf(-0.5) as f32);
    assert_eq!(
        (c.attn_logit_softcap, c.final_logit_softcap),
        (None, Some(3.0))
    );
}

#[test]
fn gemma2_bad_fields_are_bad_config() {
    let cases = [
        json!({"layer_types": ["sliding_attention", "full_attention"]}),
        json!({"layer_types": ["sliding_attention", "chunked_attention",
                               "sliding_attention", "full_attention"]}),
        json!({"layer_types": "sliding_attention"}),
        json!({"sliding_window": null}),
        json!({"sliding_window": 0}),
        json!({"sliding_window": -8}),
        json!({"query_pre_attn_scalar": "256"}),
        json!({"query_pre_attn_scalar": null}),
        json!({"query_pre_attn_scalar": 0}),
        json!({"attn_logit_softcapping": -50.0}),
        json!({"final_logit_softcapping": 0.0}),
        json!({"hidden_activation": "gelu"}),
        json!({"hidden_activation": 7}),
        json!({"attention_bias": true}),
        json!({"use_bidirectional_attention": true}),
    ];
    for extra in cases {
        bad_config(gemma2(extra.clone()), &extra);
    }
    // All full-attention layers need no window.
    let full = json!({"sliding_window": null, "layer_types": vec!["full_attention"; 4]});
    assert!(gemma2(full).is_ok());
}

fn gemma3(extra: Value) -> Result<ModelConfig> {
    let mut extra = extra;
    extra["architectures"] = json!(["Gemma3ForCausalLM"]);
    extra["num_hidden_layers"] = json!(7);
    gemma2(extra)
}

/// Gemma 3 as transformers reads a hub config without optional keys, in 4.x's layout and
/// 5.x's (rope parameters per layer type).
#[test]
fn gemma3_defaults_and_both_rope_layouts() {
    let c = gemma3(json!({})).expect("config");
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert!(c.qk_norm && c.post_norms && c.tie_word_embeddings);
    assert_eq!((c.attn_logit_softcap, c.final_logit_softcap), (None, None));
    let w = Some(4096);
    assert_eq!(c.attention_window, [w, w, w, w, w, None, w]);
    assert_eq!(
        (c.rope_theta, c.local_rope_theta),
        (10_000.0, Some(10_000.0))
    );
    let classic = gemma3(json!({"rope_theta": 1e6, "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window_pattern": 2, "sliding_window": 512}))
    .expect("config");
    let nested = gemma3(json!({"rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        "sliding_window_pattern": 2, "sliding_window": 512}))
    .expect("config");
    for c in [classic, nested] {
        assert_eq!((c.rope_theta, c.local_rope_theta), (1e6, Some(1e4)));
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
        let w = Some(512);
        assert_eq!(c.attention_window, [w, None, w, None, w, None, w]);
    }
    let scaled_local = json!({"rope_parameters": {
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}});
    bad_config(gemma3(scaled_local.clone()), &scaled_local);
}

/// gemma-3-4b-it's config: a multimodal one whose `text_config` names six keys; the rest
/// are transformers' `Gemma3TextConfig` defaults.
#[test]
fn gemma3_multimodal_config_is_its_text_models() {
    let c = ModelConfig::from_hf_config(&json!({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
            "model_type": "gemma3_text", "num_hidden_layers": 34, "sliding_window": 1024,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
        "vision_config": {"model_type": "siglip_vision_model"}}))
    .expect("config");
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (8, 4, 256));
    assert_eq!((c.vocab_size, c.num_layers), (262_208, 34));
    assert_eq!((c.rope_theta, c.local_rope_theta), (1e6, Some(1e4)));
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!(c.attention_window[5], None);
    assert_eq!(c.attention_window[4], Some(1024));
    assert_eq!(c.attention_scale, 1.0 / 16.0);
    assert!(c.tie_word_embeddings && c.qk_norm);
    let none = json!({"architectures": ["Gemma3ForConditionalGeneration"]});
    bad_config(ModelConfig::from_hf_config(&none), &none);
}

/// Phi-3's part of each head that rotates, top-level or in `rope_parameters`, and its
/// window on every layer where `sliding_window` is set.
#[test]
fn phi3_partial_rotary_and_window() {
    let phi3 = |extra: Value| {
        let mut cfg = json!({"architectures": ["Phi3ForCausalLM"], "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 256});
        for (k, v) in extra.as_object().expect("object") {
            cfg[k] = v.clone();
        }
        ModelConfig::from_hf_config(&cfg)
    };
    let c = phi3(json!({"partial_rotary_factor": 0.75, "sliding_window": 2047})).expect("config");
    assert_eq!(
        (c.architecture, c.head_dim, c.rope_dim),
        (Architecture::Phi3, 16, 12)
    );
    assert_eq!(c.attention_window, [Some(2047), Some(2047)]);
    let nested = json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
        "partial_rotary_factor": 0.5}});
    let c = phi3(nested).expect("config");
    assert_eq!(
        (c.rope_dim, c.attention_window.clone()),
        (8, vec![None, None])
    );
    for bad in [
        json!({"partial_rotary_factor": 0.0}),
        json!({"partial_rotary_factor": 2}),
        json!({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}}),
    ] {
        bad_config(phi3(bad.clone()), &bad);
    }
}

/// The Llama family keeps its forward: SiLU, plain norms, no caps or windows.
#[test]
fn llama_options_and_activation() {
    let llama = |act: Value| {
        ModelConfig::from_hf_config(&json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 256, "hidden_act": act,
        }))
    };
    let c = llama(json!("silu")).expect("config");
    assert_eq!(c.activation, Activation::Silu);
    assert_eq!((c.norm_weight_offset, c.embedding_scale), (0.0, 1.0));
    assert_eq!(c.attention_scale, 0.25);
    assert!(!c.post_norms && c.attn_logit_softcap.is_none());
    assert!(c.final_logit_softcap.is_none());
    assert_eq!(c.attention_window, [None, None]);
    let relu = json!("relu");
    assert!(bad_config(llama(relu.clone()), &relu).contains("relu"));
}

/// A sequence classifier has its causal LM's shape and its labels: `id2label` in id order,
/// else `num_labels` of transformers' names, else two; a causal LM has none; no labels at all
/// is refused.
#[test]
fn sequence_classifiers_have_labels() {
    let config = |arch: &str, extra: Value| {
        let mut v = json!({"architectures": [arch], "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 256});
        for (k, x) in extra.as_object().expect("object") {
            v[k] = x.clone();
        }
        ModelConfig::from_hf_config(&v)
    };
    let c = config(
        "Qwen2ForSequenceClassification",
        json!({"id2label": {"1": "yes", "0": "no"}}),
    )
    .expect("config");
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_eq!(c.labels, Some(vec!["no".into(), "yes".into()]));
    let c = config("LlamaForSequenceClassification", json!({"num_labels": 3}));
    let labels = c.expect("config").labels.expect("labels");
    assert_eq!(labels, ["LABEL_0", "LABEL_1", "LABEL_2"]);
    let c = config("MistralForSequenceClassification", json!({})).expect("config");
    assert_eq!(c.labels.map(|l| l.len()), Some(2));
    let causal = config("LlamaForCausalLM", json!({"num_labels": 3})).expect("config");
    assert_eq!(causal.labels, None);
    let none = json!({"id2label": {}});
    let refused = config("LlamaForSequenceClassification", none.clone());
    assert!(bad_config(refused, &none).contains("no labels"));
}

/// openai/gpt-oss-20b's config.json (its shape and options; `layer_types` cut to 4 layers):
/// every projection of attention with a bias, sinks, alternate windows of 128, YaRN 32 over
/// 4096 without truncation, 32 experts of 2880, 4 per token renormalized, its clamped SwiGLU
/// whatever `hidden_act` says.
#[test]
fn gpt_oss_20b_config() {
    let c = ModelConfig::from_hf_config(&json!({
        "architectures": ["GptOssForCausalLM"], "attention_bias": true, "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                        "full_attention"],
        "max_position_embeddings": 131072, "model_type": "gpt_oss",
        "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 4,
        "num_key_value_heads": 8, "num_local_experts": 32,
        "quantization_config": {"quant_method": "mxfp4"}, "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": false},
        "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": false, "vocab_size": 201088,
    }))
    .expect("config");
    assert_eq!(c.architecture, Architecture::GptOss);
    assert!(c.qkv_bias && c.o_bias && c.attention_sinks && !c.qk_norm);
    let act = Activation::ClampedSwiglu {
        alpha: 1.702,
        limit: 7.0,
    };
    assert_eq!(c.activation, act);
    assert_eq!(c.attention_window, [Some(128), None, Some(128), None]);
    let moe = c.moe.as_ref().expect("experts");
    assert_eq!((moe.num_experts, moe.experts_per_token), (32, 4));
    assert!(moe.normalize_top_k && moe.expert_intermediate_size == 2880);
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Yarn {
            truncate: false,
            original_max_position: 4096,
            ..
        }
    ));
    let e = c.gpu_check().expect_err("not on the GPU yet");
    assert!(e.to_string().contains("--device cpu"), "{e}");
    // Qwen2's config may say `attention_bias`: its output projection has no bias all the same.
    let qwen2 = json!({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 256, "attention_bias": true});
    let q = ModelConfig::from_hf_config(&qwen2).expect("qwen2");
    assert!(q.qkv_bias && !q.o_bias);
}

/// SmolLM3-3B's config.json (its shape and options, cut to 8 layers): every fourth layer
/// without rotation, tied embeddings, no window; it runs on the GPU too.
#[test]
fn smollm3_config() {
    let c = ModelConfig::from_hf_config(&json!({
        "architectures": ["SmolLM3ForCausalLM"], "hidden_size": 2048,
        "intermediate_size": 11008, "max_position_embeddings": 65536, "model_type": "smollm3",
        "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0],
        "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 4,
        "rope_theta": 5000000.0, "sliding_window": null, "use_sliding_window": false,
        "vocab_size": 128256,
    }))
    .expect("config");
    assert_eq!(c.architecture, Architecture::SmolLm3);
    assert_eq!(
        c.rotates,
        [true, true, true, false, true, true, true, false]
    );
    assert!(c.tie_word_embeddings && c.attention_window.iter().all(Option::is_none));
    assert_eq!((c.residual_scale, c.logits_divisor), (1.0, 1.0));
    c.gpu_check().expect("SmolLM3 on the GPU");
}

/// A Granite 3.x config.json (granite-3.3-2b's multipliers, cut to 2 layers): the four
/// multipliers read; the GPU runner refuses them (its kernels have no residual multiplier).
#[test]
fn granite_config() {
    let c = ModelConfig::from_hf_config(&json!({
        "architectures": ["GraniteForCausalLM"], "attention_multiplier": 0.015625,
        "embedding_multiplier": 12.0, "hidden_size": 2048, "intermediate_size": 8192,
        "logits_scaling": 8.0, "model_type": "granite", "num_attention_heads": 32,
        "num_hidden_layers": 2, "num_key_value_heads": 8, "residual_multiplier": 0.22,
        "rope_theta": 10000000.0, "tie_word_embeddings": true, "vocab_size": 49159,
    }))
    .expect("config");
    assert_eq!(c.architecture, Architecture::Granite);
    assert_eq!((c.embedding_scale, c.attention_scale), (12.0, 0.015625));
    assert_eq!((c.residual_scale, c.logits_divisor), (0.22, 8.0));
    assert_eq!(c.rotates, [true, true]);
    let e = c.gpu_check().expect_err("not on the GPU yet");
    assert!(e.to_string().contains("Granite"), "{e}");
    let zero = json!({"architectures": ["GraniteForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 256, "logits_scaling": 0.0});
    assert!(
        ModelConfig::from_hf_config(&zero).is_err(),
        "a zero divisor"
    );
}

/// An OLMo 2 config.json (OLMo-2-1B's options, cut to 2 layers): norms after attention and
/// the MLP only, q/k norms over all heads; one rank only, and not on the GPU.
#[test]
fn olmo2_config() {
    let c = ModelConfig::from_hf_config(&json!({
        "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "hidden_size": 2048,
        "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "olmo2",
        "num_attention_heads": 16, "num_hidden_layers": 2, "num_key_value_heads": 16,
        "rms_norm_eps": 1e-06, "rope_theta": 500000, "tie_word_embeddings": false,
        "vocab_size": 100352,
    }))
    .expect("config");
    assert_eq!(c.architecture, Architecture::Olmo2);
    assert!(!c.pre_norms && c.post_norms && c.qk_norm && c.qk_norm_all_heads);
    assert_eq!(c.qk_norm_lens(), (2048, 2048));
    let e = c.gpu_check().expect_err("not on the GPU yet");
    assert!(e.to_string().contains("OLMo 2"), "{e}");
    let align = crate::tp::ShardAlign { rows: 1, cols: 1 };
    let e = crate::tp::check_split(&c, 2, align).expect_err("one rank");
    assert!(e.to_string().contains("sizes that work: [1]"), "{e}");
}
