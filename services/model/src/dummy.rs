//! `--load-format dummy`: a preset's tensors filled with random F16 values in memory, then
//! loaded through the same path as a checkpoint (so every shape check still runs).

use std::ops::Range;
use std::sync::Arc;

use ferrite_formats::{IntTensor, IntType, TensorEntry, TensorMap};
use ferrite_kernels::mapped::MappedFile;
use ferrite_kernels::quant::GgmlType;
use half::f16;
use rayon::prelude::*;

use crate::config::{Architecture, ModelConfig};

/// Uniform in ±this: the spread of a N(0, 0.02) initialisation, so activations stay finite
/// through deep stacks.
const SPREAD: f32 = 0.035;

/// The Hugging Face names and shapes of a model of shape `c`.
fn tensor_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, f, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let (q, kv) = (c.q_dim(), c.kv_dim());
    let mut t = vec![
        ("model.embed_tokens.weight".to_owned(), vec![v, h]),
        ("model.norm.weight".to_owned(), vec![h]),
    ];
    if !c.tie_word_embeddings {
        t.push(("lm_head.weight".to_owned(), vec![v, h]));
    }
    for i in 0..c.num_layers {
        let p = |n: &str| format!("model.layers.{i}.{n}");
        // Llama's post_attention_layernorm is the MLP's pre-norm; Gemma's and OLMo 2's the
        // attention output's.
        if c.pre_norms {
            t.push((p("input_layernorm.weight"), vec![h]));
        }
        t.push((p("post_attention_layernorm.weight"), vec![h]));
        if c.post_norms {
            if c.pre_norms {
                t.push((p("pre_feedforward_layernorm.weight"), vec![h]));
            }
            t.push((p("post_feedforward_layernorm.weight"), vec![h]));
        }
        let mut matrices = vec![
            ("self_attn.q_proj".to_owned(), q, h),
            ("self_attn.k_proj".to_owned(), kv, h),
            ("self_attn.v_proj".to_owned(), kv, h),
            ("self_attn.o_proj".to_owned(), h, q),
        ];
        match c.moe.as_ref().filter(|m| m.sparse_layers[i]) {
            // gpt-oss: the router and the experts' biases here, their MXFP4 weights in bytes
            // ([`byte_shapes`]).
            Some(m) if c.architecture == Architecture::GptOss => {
                let (e, ef) = (m.num_experts, m.expert_intermediate_size);
                t.push((p("mlp.router.bias"), vec![e]));
                t.push((p("mlp.experts.gate_up_proj_bias"), vec![e, 2 * ef]));
                t.push((p("mlp.experts.down_proj_bias"), vec![e, h]));
                t.push((p("self_attn.sinks"), vec![c.num_heads]));
                matrices.push(("mlp.router".to_owned(), e, h));
            }
            // Qwen2/3-MoE's names (the loader also takes Mixtral's).
            Some(m) => {
                let ef = m.expert_intermediate_size;
                matrices.push(("mlp.gate".to_owned(), m.num_experts, h));
                for e in 0..m.num_experts {
                    let x = |n: &str| format!("mlp.experts.{e}.{n}");
                    matrices.push((x("gate_proj"), ef, h));
                    matrices.push((x("up_proj"), ef, h));
                    matrices.push((x("down_proj"), h, ef));
                }
                if let Some(sf) = m.shared_expert_intermediate_size {
                    matrices.push(("mlp.shared_expert.gate_proj".to_owned(), sf, h));
                    matrices.push(("mlp.shared_expert.up_proj".to_owned(), sf, h));
                    matrices.push(("mlp.shared_expert.down_proj".to_owned(), h, sf));
                    matrices.push(("mlp.shared_expert_gate".to_owned(), 1, h));
                }
            }
            None => {
                matrices.push(("mlp.gate_proj".to_owned(), f, h));
                matrices.push(("mlp.up_proj".to_owned(), f, h));
                matrices.push(("mlp.down_proj".to_owned(), h, f));
            }
        }
        for (n, rows, cols) in matrices {
            t.push((p(&format!("{n}.weight")), vec![rows, cols]));
        }
        if c.qkv_bias {
            t.push((p("self_attn.q_proj.bias"), vec![q]));
            t.push((p("self_attn.k_proj.bias"), vec![kv]));
            t.push((p("self_attn.v_proj.bias"), vec![kv]));
        }
        if c.o_bias {
            t.push((p("self_attn.o_proj.bias"), vec![h]));
        }
        if c.qk_norm {
            let (qn, kn) = c.qk_norm_lens();
            t.push((p("self_attn.q_norm.weight"), vec![qn]));
            t.push((p("self_attn.k_norm.weight"), vec![kn]));
        }
    }
    t
}

/// gpt-oss's experts as OpenAI publishes them, in MXFP4: per layer the gate|up and down stacks'
/// `_blocks` `[experts, rows, cols / 32, 16]` and `_scales` `[experts, rows, cols / 32]`.
fn byte_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let Some(m) = c
        .moe
        .as_ref()
        .filter(|_| c.architecture == Architecture::GptOss)
    else {
        return Vec::new();
    };
    let (e, h, ef) = (m.num_experts, c.hidden_size, m.expert_intermediate_size);
    let mut t = Vec::new();
    for i in 0..c.num_layers {
        for (stem, rows, cols) in [("gate_up_proj", 2 * ef, h), ("down_proj", h, ef)] {
            let name = format!("model.layers.{i}.mlp.experts.{stem}");
            t.push((format!("{name}_blocks"), vec![e, rows, cols / 32, 16]));
            t.push((format!("{name}_scales"), vec![e, rows, cols / 32]));
        }
    }
    t
}

/// Random weights of shape `c` (deterministic in `seed`): matrices and biases uniform in
/// ±[`SPREAD`], norms at an effective weight of 1; gpt-oss's MXFP4 experts random codes under
/// scales of 2^-7 to 2^-5, values within ±0.19.
pub fn dummy_tensors(c: &ModelConfig, seed: u64) -> TensorMap {
    // A norm stores `1 - offset`, so that with the architecture's offset it scales by 1.
    let norm_value = f16::from_f32(1.0 - c.norm_weight_offset).to_le_bytes();
    let (buf, floats) = lay_out(tensor_shapes(c), 2, seed, |name, region, seed| {
        if name.ends_with("norm.weight") {
            region
                .chunks_exact_mut(2)
                .for_each(|v| v.copy_from_slice(&norm_value));
        } else {
            fill_random(region, seed);
        }
    });
    let mut map = TensorMap::new(vec![Arc::new(MappedFile::from_vec(buf))]);
    for (name, shape, at) in floats {
        let (ty, file, start, end) = (GgmlType::F16, 0, at.start, at.end);
        map.insert(
            name,
            TensorEntry {
                ty,
                shape,
                file,
                start,
                end,
            },
        );
    }
    let (buf, bytes) = lay_out(byte_shapes(c), 1, seed, |name, region, seed| {
        if name.ends_with("_scales") {
            (region.iter_mut().enumerate()).for_each(|(j, v)| *v = 120 + (j % 3) as u8);
        } else {
            fill_random(region, seed);
        }
    });
    if !bytes.is_empty() {
        map.add_file(Arc::new(MappedFile::from_vec(buf)));
    }
    for (name, shape, at) in bytes {
        let (ty, file, start, end) = (IntType::U8, 1, at.start, at.end);
        map.insert_i32(
            name,
            IntTensor {
                ty,
                shape,
                file,
                start,
                end,
            },
        );
    }
    map
}

/// A tensor's name, shape and byte range in its buffer.
type Placed = (String, Vec<usize>, Range<usize>);

/// One buffer holding the tensors of `shapes` back to back, `elem` bytes per element, each
/// region filled by `fill(name, region, its own seed)`; with each tensor's byte range.
fn lay_out(
    shapes: Vec<(String, Vec<usize>)>,
    elem: usize,
    seed: u64,
    fill: impl Fn(&str, &mut [u8], u64),
) -> (Vec<u8>, Vec<Placed>) {
    let total: usize = shapes
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    let mut buf = vec![0u8; total * elem];
    let mut at = 0;
    let placed = shapes
        .into_iter()
        .map(|(name, shape)| {
            let range = at..at + shape.iter().product::<usize>() * elem;
            let region_seed = seed ^ (at as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            fill(&name, &mut buf[range.clone()], region_seed);
            at = range.end;
            (name, shape, range)
        })
        .collect();
    (buf, placed)
}

/// Uniform F16 values in ±SPREAD (as bytes, MXFP4's random codes), 64 KiB chunks in parallel,
/// each from its own xorshift.
fn fill_random(region: &mut [u8], seed: u64) {
    region
        .par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut s = (seed ^ (i as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9)) | 1;
            for v in chunk.chunks_exact_mut(2) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                v.copy_from_slice(&f16::from_f32(u * SPREAD).to_le_bytes());
            }
        });
}
