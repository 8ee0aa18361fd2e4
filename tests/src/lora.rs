//! LoRA adapters of random factors for the default model, written as PEFT saves them
//! (`adapter_config.json`, `adapter_model.safetensors` with `base_model.model.model.layers.…`
//! names), so a test can serve one without torch. Their outputs are checked against
//! `ferrite generate --lora`, itself checked against PEFT on a tiny model
//! (`services/engine/tests/lora.rs`).

use std::path::Path;

use anyhow::Result;

/// SmolLM2-135M: 30 layers of hidden 576, 9 query heads and 3 KV heads of 64.
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const KV_DIM: usize = 192;

/// Writes into `dir` an adapter of rank `r` on every layer's q_proj and v_proj, its factors
/// drawn from `seed`, scaled by `lora_alpha / r`.
pub fn write_adapter(dir: &Path, seed: u64, r: usize, lora_alpha: f32) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let config = serde_json::json!({
        "peft_type": "LORA", "r": r, "lora_alpha": lora_alpha, "bias": "none",
        "target_modules": ["q_proj", "v_proj"], "use_rslora": false, "use_dora": false,
        "fan_in_fan_out": false, "modules_to_save": null, "rank_pattern": {}, "alpha_pattern": {},
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string())?;
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut draw = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                // xorshift64*: uniform in [-0.1, 0.1).
                rng ^= rng >> 12;
                rng ^= rng << 25;
                rng ^= rng >> 27;
                let u =
                    (rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
                0.2 * u - 0.1
            })
            .collect()
    };
    let mut tensors = Vec::new();
    for layer in 0..LAYERS {
        for (proj, out) in [("q_proj", HIDDEN), ("v_proj", KV_DIM)] {
            let stem = format!("base_model.model.model.layers.{layer}.self_attn.{proj}");
            tensors.push((
                format!("{stem}.lora_A.weight"),
                [r, HIDDEN],
                draw(r * HIDDEN),
            ));
            tensors.push((format!("{stem}.lora_B.weight"), [out, r], draw(out * r)));
        }
    }
    std::fs::write(dir.join("adapter_model.safetensors"), safetensors(&tensors))?;
    Ok(())
}

/// The safetensors file of f32 `tensors` (name, shape, values).
fn safetensors(tensors: &[(String, [usize; 2], Vec<f32>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (name, shape, values) in tensors {
        let end = at + 4 * values.len();
        let entry = serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, end]});
        header.insert(name.clone(), entry);
        at = end;
    }
    let header = serde_json::Value::Object(header).to_string().into_bytes();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    for (_, _, values) in tensors {
        out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    }
    out
}
