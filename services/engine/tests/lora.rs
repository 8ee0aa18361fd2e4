//! LoRA adapters against PEFT (`tests/fixtures/models/generate_lora.py`: two adapters of the
//! tiny Qwen3, one on every projection, one rsLoRA on q and v of one layer, and the outputs of
//! `PeftModel` over the base with each).

mod common;

#[path = "common/ranks.rs"]
mod ranks;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::*;
use ferrite_engine::engine::{EmbedParams, Engine, EngineConfig, Speculation};
use ferrite_engine::error::EngineError;
use ferrite_engine::kv_cache::KvCache;
use ferrite_engine::model::{self, LlamaModel, LoadOptions, LogitsWanted, SeqChunk};
use ferrite_engine::sampler::SamplingParams;
use ferrite_engine::tp::TpRank;
use serde_json::Value;

/// fp32 against fp32: only summation order differs (more so across ranks).
const TOLERANCE: f32 = 1e-3;
const ADAPTERS: [&str; 2] = ["all", "qv"];

fn lora_dir() -> PathBuf {
    fixtures().join("models/qwen3_lora")
}

/// The tiny Qwen3 (`tp`'s shard) with both adapters, numbered as [`ADAPTERS`] lists them.
fn with_adapters(tp: TpRank) -> LlamaModel {
    let options = LoadOptions {
        tp,
        ..LoadOptions::default()
    };
    let base = fixtures().join("models/qwen3");
    let mut m = model::load_with(&base, options).expect("qwen3").model;
    for name in ADAPTERS {
        m.load_lora(name, &lora_dir().join(name)).expect(name);
    }
    m
}

/// Next-token logits of `prompt` with adapter `lora` (one prefill; rank 0's where `comm`
/// joins other ranks).
fn prefill(
    m: &LlamaModel,
    prompt: &[u32],
    lora: Option<u32>,
    comm: &mut dyn ferrite_collective::Collective,
) -> Vec<f32> {
    let c = m.config();
    let blocks = prompt.len().div_ceil(16);
    let mut kv = KvCache::new(c.num_layers, blocks, 16, c.num_kv_heads, c.head_dim);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let chunk = SeqChunk {
        tokens: prompt,
        start_pos: 0,
        block_table: &table,
        logits: LogitsWanted::Last,
        prompt: true,
        lora,
    };
    m.forward(&[chunk], &mut kv, comm).expect("forward")
}

fn expected() -> Value {
    read_json(&lora_dir().join("expected.json"))
}

fn greedy(n: usize, lora: Option<u32>) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        lora,
        ..SamplingParams::greedy(n)
    }
}

/// Each adapter's first logits are PEFT's, on one rank and split 2 ways; with no adapter
/// asked for, the base model's.
#[test]
fn each_adapter_gives_pefts_logits_whole_and_split() {
    let want = expected();
    let base_cases = read_json(&fixtures().join("models/qwen3/expected.json"));
    let whole = with_adapters(TpRank::SOLO);
    assert_eq!(whole.lora_names(), ADAPTERS);
    let mut solo = ferrite_collective::Solo;
    for (i, name) in ADAPTERS.iter().enumerate() {
        for (k, case) in want["adapters"][name]
            .as_array()
            .expect("cases")
            .iter()
            .enumerate()
        {
            let prompt = ids(&case["prompt_token_ids"]);
            let got = prefill(&whole, &prompt, Some(i as u32), &mut solo);
            let d = max_abs_diff(&got, &floats(&case["first_logits"]));
            assert!(d < TOLERANCE, "{name} case {k}: max |Δ logit| {d}");
            let base = prefill(&whole, &prompt, None, &mut solo);
            let b = &base_cases["cases"][k];
            assert_eq!(ids(&b["prompt_token_ids"]), prompt, "the fixtures' prompts");
            let d = max_abs_diff(&base, &floats(&b["first_logits"]));
            assert!(d < TOLERANCE, "base case {k}: max |Δ logit| {d}");
        }
    }
    let split = ranks::on_ranks(2, |tp, mut comm| {
        let m = with_adapters(tp);
        let cases = want["adapters"]["all"].as_array().expect("cases");
        (cases.iter())
            .map(|c| prefill(&m, &ids(&c["prompt_token_ids"]), Some(0), comm.as_mut()))
            .collect::<Vec<_>>()
    });
    for (k, case) in want["adapters"]["all"]
        .as_array()
        .expect("cases")
        .iter()
        .enumerate()
    {
        let d = max_abs_diff(&split[0][k], &floats(&case["first_logits"]));
        assert!(d < TOLERANCE, "all, 2 ranks, case {k}: max |Δ logit| {d}");
    }
}

/// The greedy tokens of `case`, as far as its margins say rounding cannot flip them.
fn clear_tokens(case: &Value) -> Vec<u32> {
    let margins = floats(&case["greedy_margins"]);
    let tokens = ids(&case["greedy_token_ids"]);
    let clear = margins.iter().take_while(|m| **m > 2.0 * TOLERANCE).count();
    tokens[..clear].to_vec()
}

/// Runs `requests` on `engine`, returning each one's tokens and cached prompt tokens.
fn run(engine: &mut Engine, requests: Vec<Request>) -> HashMap<u64, (Vec<u32>, usize)> {
    let mut cached = HashMap::new();
    let out = engine
        .run_to_completion(requests, |ev| {
            if let Some(c) = ev.cached_tokens {
                cached.insert(ev.id, c);
            }
            true
        })
        .expect("run");
    (out.into_iter())
        .map(|(id, g)| (id, (g.token_ids(), cached[&id])))
        .collect()
}

/// An engine over the tiny Qwen3 with both adapters, its prefills chunked.
fn engine_with(speculation: Option<Speculation>) -> Engine {
    let cfg = EngineConfig {
        max_model_len: Some(128),
        max_num_batched_tokens: 24,
        kv_cache_bytes: 8 << 20,
        speculation,
        ..EngineConfig::default()
    };
    Engine::new(with_adapters(TpRank::SOLO), vec![], cfg).expect("engine")
}

type Request = (u64, Vec<u32>, SamplingParams);

/// For each of the fixtures' prompts (k), 16 greedy tokens with the base, adapter `all` and
/// adapter `qv` (j = 0, 1, 2), as request `3k + j`; and the tokens each must begin with.
fn base_and_adapter_requests() -> (Vec<Request>, HashMap<u64, Vec<u32>>) {
    let want = expected();
    let base_cases = read_json(&fixtures().join("models/qwen3/expected.json"));
    let mut requests = Vec::new();
    let mut wanted = HashMap::new();
    for (k, b) in base_cases["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .enumerate()
    {
        for (j, lora) in [None, Some(0), Some(1)].into_iter().enumerate() {
            let case = match lora {
                None => b,
                Some(i) => &want["adapters"][ADAPTERS[i as usize]][k],
            };
            let id = (3 * k + j) as u64;
            requests.push((id, ids(&case["prompt_token_ids"]), greedy(16, lora)));
            wanted.insert(id, clear_tokens(case));
        }
    }
    (requests, wanted)
}

/// Requests of the base and of both adapters, in one batch with their prefills chunked, each
/// generate what PEFT (or transformers, for the base) does; then again, after all of them
/// left their blocks in the prefix cache: each request reuses only its own adapter's blocks,
/// and generates the same tokens.
#[test]
fn adapters_and_the_base_share_batches_but_not_cached_blocks() {
    let mut engine = engine_with(None);
    assert_eq!(engine.lora_names(), ADAPTERS);
    let (mut requests, mut wanted) = base_and_adapter_requests();
    for round in 0..2 {
        let got = run(&mut engine, requests.clone());
        for (id, (tokens, cached)) in &got {
            let clear = &wanted[id];
            assert_eq!(&tokens[..clear.len()], clear, "round {round}, request {id}");
            assert!(
                clear.len() >= 3,
                "request {id}: {} clear tokens",
                clear.len()
            );
            let prompt_len = requests[*id as usize % 100].1.len();
            // The second round finds every full block of its prompt that its own adapter's
            // (or the base's) first round left: the 17- and 40-token prompts hold 1 and 2.
            let full = match round {
                0 => 0,
                _ => (prompt_len - 1) / 16 * 16,
            };
            assert_eq!(*cached, full, "round {round}, request {id}: cached tokens");
        }
        requests.iter_mut().for_each(|r| r.0 += 100);
        wanted = wanted.into_iter().map(|(id, w)| (id + 100, w)).collect();
    }
}

/// A number with no adapter behind it is the caller's mistake; adapters with what ferrite
/// does not apply, or factors of the wrong shape, are refused at load, naming why.
#[test]
fn unknown_numbers_and_unsupported_adapters_are_refused() {
    let mut engine = Engine::new(
        with_adapters(TpRank::SOLO),
        vec![],
        EngineConfig {
            kv_cache_bytes: 8 << 20,
            max_model_len: Some(128),
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let err = engine
        .add_request(1, vec![5, 6], greedy(2, Some(2)))
        .expect_err("refused");
    assert!(
        matches!(&err, EngineError::InvalidRequest(m) if m.contains("adapter 2")),
        "{err}"
    );
    let base = fixtures().join("models/qwen3");
    let mut m = model::load(&base).expect("qwen3").model;
    m.load_lora("all", &lora_dir().join("all")).expect("all");
    let err = m
        .load_lora("all", &lora_dir().join("qv"))
        .expect_err("refused");
    assert!(err.to_string().contains("two LoRA adapters"), "{err}");
    // The adapter of another model: Qwen3's factors against Llama-shaped projections.
    let other = fixtures().join("models/llama31");
    let mut llama = model::load(&other).expect("llama31").model;
    let err = llama
        .load_lora("all", &lora_dir().join("all"))
        .expect_err("refused");
    assert!(err.to_string().contains("shape"), "{err}");
    let dir = tempdir_with_config(&lora_dir().join("all"), |c| c["use_dora"] = true.into());
    let err = m.load_lora("dora", &dir).expect_err("refused");
    assert!(err.to_string().contains("DoRA"), "{err}");
}

/// A copy of adapter `from` in a fresh directory, its config changed by `edit`.
fn tempdir_with_config(from: &Path, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-lora-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut cfg = read_json(&from.join("adapter_config.json"));
    edit(&mut cfg);
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).expect("config");
    let weights = "adapter_model.safetensors";
    std::fs::copy(from.join(weights), dir.join(weights)).expect("weights");
    dir
}

/// A `llama` GGUF model (its Q/K rows permuted by llama.cpp's converter) takes a PEFT adapter
/// and the same adapter as a GGUF file (`convert_lora_to_gguf.py`'s layout) alike: both give
/// PEFT's logits (over the base rounded as the file holds it), and llama.cpp's within its
/// own rounding. The model in Hugging Face's order takes both alike too.
#[test]
fn peft_and_gguf_adapters_agree_on_gguf_and_safetensors_models() {
    let dir = fixtures().join("models/llama2_lora");
    let want = read_json(&dir.join("expected.json"));
    let (peft, gguf) = (dir.join("peft"), dir.join("adapter.gguf"));
    let base = fixtures().join("models/llama2_tied");
    let mut solo = ferrite_collective::Solo;
    for file in ["model.gguf", "model.safetensors"] {
        let path = if file.ends_with("gguf") {
            base.join(file)
        } else {
            base.clone()
        };
        let mut m = model::load(&path).expect("llama2_tied").model;
        m.load_lora("peft", &peft).expect("PEFT adapter");
        m.load_lora("gguf", &gguf).expect("GGUF adapter");
        let cases = want["cases"].as_array().expect("cases");
        for (k, case) in cases.iter().enumerate() {
            let prompt = ids(&case["prompt_token_ids"]);
            let (p, g) = (
                prefill(&m, &prompt, Some(0), &mut solo),
                prefill(&m, &prompt, Some(1), &mut solo),
            );
            let d = max_abs_diff(&p, &g);
            assert!(
                d < 1e-4,
                "{file} case {k}: PEFT and GGUF adapters differ by {d}"
            );
            if file == "model.gguf" {
                let d = max_abs_diff(&p, &floats(&case["first_logits"]));
                assert!(d < TOLERANCE, "{file} case {k}: PEFT's logits by {d}");
                let llamacpp = floats(&want["llamacpp_first_logits"][k]);
                let d = max_abs_diff(&g, &llamacpp);
                assert!(d < 0.05, "{file} case {k}: llama.cpp's logits by {d}");
            }
        }
    }
}

/// Embeddings and speculative decoding take an adapter too: each prompt's embedding with
/// adapter `all` is PEFT's decoder's (its last hidden state, normalized), and with n-gram
/// drafts checked in the same steps, every request of the base and both adapters generates
/// what it does one token at a time.
#[test]
fn embeddings_and_speculative_decoding_run_with_adapters() {
    let want = expected();
    let mut engine = engine_with(Some(Speculation {
        tokens: 3,
        lookup_max: 3,
        lookup_min: 1,
    }));
    let embed = SamplingParams {
        embed: Some(EmbedParams {
            normalize: true,
            dimensions: None,
            classify: false,
        }),
        ..greedy(1, Some(0))
    };
    let (mut requests, wanted) = base_and_adapter_requests();
    for k in 0..3 {
        let case = &want["adapters"]["all"][k];
        requests.push((
            100 + k as u64,
            ids(&case["prompt_token_ids"]),
            embed.clone(),
        ));
    }
    let mut embeddings = HashMap::new();
    let out = engine
        .run_to_completion(requests, |ev| {
            if let Some(e) = &ev.embedding {
                embeddings.insert(ev.id, e.clone());
            }
            true
        })
        .expect("run");
    for (id, clear) in &wanted {
        let tokens = out[id].token_ids();
        assert_eq!(&tokens[..clear.len()], clear, "request {id}");
    }
    for k in 0..3 {
        let got = &embeddings[&(100 + k as u64)];
        let d = max_abs_diff(got, &floats(&want["adapters"]["all"][k]["embedding"]));
        assert!(d < 1e-4, "embedding {k}: max |Δ| {d}");
    }
    assert!(engine.stats().spec_draft_tokens > 0, "no draft was checked");
}
