//! Tensor-parallel shards against the same references as the whole models: each pool's ranks
//! are threads of this test, each loading only its shard and meeting the others over TCP on
//! loopback (the CLI's tests run them as processes).
//!
//! - Every tiny architecture (Llama with tied embeddings, Llama 3.1, Mistral, Qwen2 with QKV
//!   bias, Qwen3 with QK norm, Gemma 2 with post norms and soft caps; safetensors and GGUF) split
//!   2 ways (KV heads split) and 4 ways (KV heads replicated) gives transformers' logits; so do
//!   the mixtures of experts (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE), each
//!   expert split as a dense MLP.
//! - Block-scaled FP8 splits on whole blocks, and is refused where a cut falls inside one.
//! - The default model (Q4_1 GGUF) on 3 ranks generates transformers' greedy tokens through the
//!   leader and its followers; split 2 ways it is refused with the sizes that work.
//! - Prefix caching is the leader's decision: plans whose new sequences' tables begin with
//!   shared cached blocks (a chunk starting after them) run on the followers as any other, and
//!   the default model on 3 ranks gives the golden tokens with full and partial hits.
//! - Embeddings and classifiers: the leader pools the final hidden state it holds whole, and
//!   a classifier's head is whole on it (2 ranks).
//! - A rank that dies fails the leader's next step naming it, and its followers learn the
//!   leader is gone.

mod common;

#[path = "common/ranks.rs"]
mod ranks;

use std::path::Path;

use common::*;
use ferrite_engine::EngineError;
use ferrite_engine::engine::{EmbedParams, Engine, EngineConfig, Speculation};
use ferrite_engine::executor::Executor;
use ferrite_engine::kv_cache::KvCache;
use ferrite_engine::model::{self, LoadOptions, LogitsWanted, SeqChunk};
use ferrite_engine::sampler::SamplingParams;
use ferrite_engine::tp::TpRank;
use ranks::on_ranks;

/// fp32 against fp32: only summation order differs (more so across ranks).
const LOGIT_TOLERANCE: f32 = 1e-3;

fn load_shard(path: &Path, tp: TpRank) -> model::LoadedModel {
    let options = LoadOptions {
        tp,
        ..LoadOptions::default()
    };
    model::load_with(path, options).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Rank 0's next-token logits of `prompt` (one prefill through every rank's shard), after
/// checking that the other ranks got none: the logits are gathered to the leader only.
fn prefill_on_ranks(path: &Path, world: usize, prompt: &[u32]) -> Vec<f32> {
    let mut per_rank = on_ranks(world, |tp, mut comm| {
        let m = load_shard(path, tp).model;
        let c = m.config();
        let mut kv = KvCache::new(
            c.num_layers,
            prompt.len().div_ceil(16),
            16,
            c.num_kv_heads,
            c.head_dim,
        );
        let table: Vec<u32> = (0..kv.num_blocks as u32).collect();
        let chunk = SeqChunk {
            tokens: prompt,
            start_pos: 0,
            block_table: &table,
            logits: LogitsWanted::Last,
            prompt: true,
            lora: None,
        };
        m.forward(&[chunk], &mut kv, comm.as_mut())
            .expect("forward")
    });
    for (rank, logits) in per_rank.iter().enumerate().skip(1) {
        assert!(logits.is_empty(), "rank {rank} got {} logits", logits.len());
    }
    per_rank.swap_remove(0)
}

fn check_tiny(dir: &str, file: Option<&str>, expected_key: Option<&str>) {
    let base = fixtures().join("models").join(dir);
    let path = file.map_or(base.clone(), |f| base.join(f));
    let expected = read_json(&base.join("expected.json"));
    let cases = expected_key
        .and_then(|k| expected[k]["cases"].as_array())
        .or_else(|| expected["cases"].as_array())
        .cloned()
        .expect("cases");
    for world in [2, 4] {
        for case in &cases {
            let prompt = ids(&case["prompt_token_ids"]);
            let want = floats(&case["first_logits"]);
            let got = prefill_on_ranks(&path, world, &prompt);
            assert_eq!(got.len(), want.len());
            let d = max_abs_diff(&got, &want);
            assert!(
                d < LOGIT_TOLERANCE,
                "{dir} {file:?} on {world} ranks: the logits differ by {d}"
            );
        }
    }
}

#[test]
fn tiny_llama_family_split_two_and_four_ways() {
    check_tiny("llama2_tied", None, None);
    check_tiny("llama2_tied", Some("model.gguf"), Some("gguf"));
    check_tiny("llama31", None, None);
    check_tiny("mistral", None, None);
    check_tiny("phi3", None, None);
    check_tiny("phi3", Some("model.gguf"), Some("gguf"));
    check_tiny("phi3_longrope", None, None);
    check_tiny("smollm3", None, None);
    check_tiny("smollm3", Some("model.gguf"), Some("gguf"));
    check_tiny("granite", None, None);
    check_tiny("granite", Some("model.gguf"), Some("gguf"));
}

#[test]
fn tiny_qwen_and_gemma_split_two_and_four_ways() {
    check_tiny("qwen2", None, None);
    check_tiny("qwen2", Some("model.gguf"), None);
    check_tiny("qwen3", None, None);
    check_tiny("qwen3_yarn", None, None);
    check_tiny("gemma2", None, None);
    check_tiny("gemma3", None, None);
    check_tiny("gemma3", Some("model.gguf"), Some("gguf"));
}

/// Mixtures of experts: every rank holds every expert's share of rows, routes the same, and
/// the MLP's all-reduce sums the parts (safetensors and GGUF's stacked experts).
#[test]
fn tiny_mixtures_of_experts_split_two_and_four_ways() {
    check_tiny("mixtral", None, None);
    check_tiny("mixtral", Some("model.gguf"), Some("gguf"));
    check_tiny("qwen3_moe", None, None);
    check_tiny("qwen2_moe", None, None);
    check_tiny("qwen2_moe", Some("model.gguf"), Some("gguf"));
    // Biases on the output projections (rank 0's alone) and per-head sinks (each rank its
    // heads'), the experts from transformers' stacks and from MXFP4.
    check_tiny("gpt_oss", None, None);
}

/// gpt-oss's MXFP4 experts (its checkpoint's and llama.cpp's GGUF, biases on rank 0) split 2
/// ways, on whole blocks of 32 of their down projection; 4 ways would cut them into 16
/// columns: refused, naming the sizes that work.
#[test]
fn mxfp4_experts_split_on_whole_blocks_only() {
    let path = fixtures().join("models/gpt_oss_mxfp4");
    let expected = read_json(&path.join("expected.json"));
    for case in expected["cases"].as_array().expect("cases") {
        let got = prefill_on_ranks(&path, 2, &ids(&case["prompt_token_ids"]));
        let d = max_abs_diff(&got, &floats(&case["first_logits"]));
        assert!(
            d < LOGIT_TOLERANCE,
            "MXFP4 on 2 ranks: the logits differ by {d}"
        );
    }
    let gguf = &expected["gguf"]["cases"];
    for case in gguf.as_array().expect("GGUF cases") {
        let got = prefill_on_ranks(&path.join("model.gguf"), 2, &ids(&case["prompt_token_ids"]));
        let d = max_abs_diff(&got, &floats(&case["first_logits"]));
        assert!(
            d < LOGIT_TOLERANCE,
            "MXFP4 GGUF on 2 ranks: the logits differ by {d}"
        );
    }
    let options = LoadOptions {
        tp: TpRank { rank: 0, world: 4 },
        ..LoadOptions::default()
    };
    let e = model::load_with(&path, options).expect_err("MXFP4 cut on 4 ranks");
    let msg = e.to_string();
    assert!(msg.contains("not whole blocks of 32"), "{msg}");
    assert!(msg.contains("sizes that work: [1, 2]"), "{msg}");
    let options = LoadOptions {
        tp: TpRank { rank: 0, world: 4 },
        ..LoadOptions::default()
    };
    let e = model::load_with(&path.join("model.gguf"), options).expect_err("GGUF on 4 ranks");
    assert!(e.to_string().contains("sizes that work: [1, 2]"), "{e}");
}

/// Block-scaled FP8 (transformers' format, blocks of 16x32, activations in groups of 32) split
/// 2 ways on whole blocks gives the checkpoint's reference logits: each rank's column slice of
/// the O and down inputs is quantized in the same groups as the whole. 4 ways would cut the
/// 64-wide O input into 16 columns, inside a block: refused, naming the sizes that work.
#[test]
fn block_fp8_splits_on_whole_blocks_only() {
    let path = fixtures().join("quant/interop/hf_fp8_block");
    let expected = read_json(&path.join("expected.json"));
    // Cases with an activation near a rounding tie may round the other way across ranks.
    let clear = expected["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["tie_margin"].as_f64().is_some_and(|m| m > 1e-6));
    let mut checked = 0;
    for case in clear {
        let want = floats(&case["first_logits"]);
        let prompt = ids(&case["prompt_token_ids"]);
        let got = prefill_on_ranks(&path, 2, &prompt);
        assert_eq!(got.len(), want.len());
        let d = max_abs_diff(&got, &want);
        assert!(d < LOGIT_TOLERANCE, "the logits differ by {d}");
        checked += 1;
    }
    assert!(checked >= 2, "{checked} cases clear of ties");
    let options = LoadOptions {
        tp: TpRank { rank: 0, world: 4 },
        ..LoadOptions::default()
    };
    let e = model::load_with(&path, options).expect_err("blocks cut on 4 ranks");
    let msg = e.to_string();
    assert!(msg.contains("not whole blocks of 32"), "{msg}");
    assert!(msg.contains("sizes that work: [1, 2]"), "{msg}");
}

/// The leader's executor; a follower's runs the leader's plans until told to stop (`None`).
fn leader_or_follow(tp: TpRank, mut exec: Executor) -> Option<Executor> {
    if tp.rank == 0 {
        return Some(exec);
    }
    exec.agree_on_blocks().expect("blocks");
    exec.follow().expect("the leader says stop");
    None
}

fn engine_cfg() -> EngineConfig {
    EngineConfig {
        max_model_len: Some(1024),
        max_num_batched_tokens: 96,
        kv_cache_bytes: 128 << 20,
        ..EngineConfig::default()
    }
}

/// The golden prompts of `tests/fixtures/golden` (transformers on the same GGUF) through a
/// leader and two followers: chunked prefill mixed with decodes, every rank's step from the
/// leader's plans; the first 16 greedy tokens of each equal the reference. The leader
/// decodes speculatively (4 drafts by n-gram lookup): its plans carry chunks of several
/// generated tokens that bring back a row each, and drafts are accepted.
#[test]
fn default_model_on_three_ranks_generates_the_golden_tokens() {
    let golden = read_json(&fixtures().join("golden/smollm2_q4_1.json"));
    let cases = golden["cases"].as_array().expect("cases");
    let path = default_model_path();
    let results = on_ranks(3, |tp, comm| {
        let m = load_shard(&path, tp).model;
        let exec = Executor::new(m.into(), &engine_cfg(), comm).expect("executor");
        let exec = leader_or_follow(tp, exec)?;
        let cfg = EngineConfig {
            speculation: Some(Speculation::ngram(4)),
            ..engine_cfg()
        };
        let mut engine = Engine::from_executor(exec, vec![], &cfg).expect("leader");
        let requests = cases
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
        let out = engine
            .run_to_completion(requests, |_| true)
            .expect("generate");
        Some((out, engine.stats()))
    });
    let (out, stats) = results[0].as_ref().expect("the leader's tokens");
    for (i, case) in cases.iter().enumerate() {
        let want = ids(&case["greedy_token_ids"]);
        assert_eq!(
            out[&(i as u64)].token_ids(),
            want[..16],
            "{}: first 16 greedy tokens on 3 ranks",
            case["name"]
        );
    }
    assert!(stats.spec_accepted_tokens > 0, "{stats:?}");
}

/// What the leader of 2 ranks pools for each of `prompts` under `params` (embeddings or a
/// classifier's logits), the model in `dir` loaded with `tokens` as its classifier's.
fn pooled_on_two_ranks(
    dir: &Path,
    tokens: &[&str],
    params: SamplingParams,
    prompts: Vec<Vec<u32>>,
) -> std::collections::HashMap<u64, Vec<f32>> {
    let mut results = on_ranks(2, |tp, comm| {
        let options = LoadOptions {
            tp,
            classifier_tokens: tokens.iter().map(|t| t.to_string()).collect(),
            ..LoadOptions::default()
        };
        let m = model::load_with(dir, options).expect("shard").model;
        let exec = Executor::new(m.into(), &engine_cfg(), comm).expect("executor");
        let exec = leader_or_follow(tp, exec)?;
        let mut engine = Engine::from_executor(exec, vec![], &engine_cfg()).expect("leader");
        let requests = (prompts.iter().enumerate())
            .map(|(i, p)| (i as u64, p.clone(), params.clone()))
            .collect();
        let mut got = std::collections::HashMap::new();
        engine
            .run_to_completion(requests, |ev| {
                got.insert(ev.id, ev.embedding.clone().expect("an answer"));
                true
            })
            .expect("pooled");
        Some(got)
    });
    results.swap_remove(0).expect("the leader's answers")
}

/// Embeddings on a leader and a follower (the tiny Qwen3-Embedding layout split 2 ways): the
/// leader pools the final hidden state it holds whole after the last all-reduce, and each is
/// transformers' (as on one rank, `embeddings.rs`).
#[test]
fn embeddings_on_two_ranks_are_transformers() {
    let dir = fixtures().join("models/qwen3_embed");
    let expected = read_json(&dir.join("expected.json"));
    let cases = expected["cases"].as_array().expect("cases").clone();
    let params = SamplingParams {
        ignore_eos: true,
        embed: Some(EmbedParams {
            normalize: true,
            dimensions: None,
            classify: false,
        }),
        ..SamplingParams::greedy(1)
    };
    let prompts = cases.iter().map(|c| ids(&c["prompt_token_ids"])).collect();
    let got = pooled_on_two_ranks(&dir, &[], params, prompts);
    for (i, case) in cases.iter().enumerate() {
        let d = max_abs_diff(&got[&(i as u64)], &floats(&case["embedding"]));
        assert!(d < 1e-4, "prompt {i} on 2 ranks: differs by {d}");
    }
}

/// Classifiers on a leader and a follower: a classifier whose checkpoint has no LM head, and a
/// causal LM made a reranker by two tokens (its head made from the whole LM head, not the
/// leader's rows of it), each transformers' (as on one rank, `classify.rs`).
#[test]
fn classifiers_on_two_ranks_are_transformers() {
    let dir = fixtures().join("models/llama_classify");
    let texts = read_json(&dir.join("expected.json"))["texts"].clone();
    let texts = texts.as_array().expect("texts");
    let prompts = texts.iter().map(|t| ids(&t["input_ids"])).collect();
    let got = pooled_on_two_ranks(&dir, &[], SamplingParams::classify(), prompts);
    for (i, t) in texts.iter().enumerate() {
        let d = max_abs_diff(&got[&(i as u64)], &floats(&t["logits"]));
        assert!(d < 1e-4, "text {i} on 2 ranks: differs by {d}");
    }
    let dir = fixtures().join("models/qwen3_yes_no");
    let pairs = read_json(&dir.join("expected.json"))["pairs"].clone();
    let pairs = pairs.as_array().expect("pairs");
    let prompts = pairs.iter().map(|p| ids(&p["input_ids"])).collect();
    // `n` in the leader's half of the vocabulary, `</s>` (257) in the follower's.
    let got = pooled_on_two_ranks(&dir, &["n", "</s>"], SamplingParams::classify(), prompts);
    for (i, p) in pairs.iter().enumerate() {
        let last = floats(&p["last_logits"]);
        let d = max_abs_diff(&got[&(i as u64)], &[last[257] - last[b'n' as usize]]);
        assert!(d < 1e-4, "pair {i} on 2 ranks: differs by {d}");
    }
}

/// The golden prompts on a leader and two followers with prefix caching (blocks of 4 tokens):
/// cold, then with each prompt's first half cached (partial hits), then whole (full hits). The
/// followers' tables are rebuilt from plans whose new tables begin with shared blocks; every
/// round gives the reference's first 16 greedy tokens and the cold round's 16. The leader
/// plans under async scheduling (each plan made before the step it follows has run).
#[test]
fn default_model_on_three_ranks_with_cached_prefixes_generates_the_golden_tokens() {
    let golden = read_json(&fixtures().join("golden/smollm2_q4_1.json"));
    let cases = golden["cases"].as_array().expect("cases");
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["prompt_token_ids"])).collect();
    let cfg = EngineConfig {
        block_size: 4,
        async_scheduling: true,
        ..engine_cfg()
    };
    let path = default_model_path();
    let results = on_ranks(3, |tp, comm| {
        let m = load_shard(&path, tp).model;
        let exec = Executor::new(m.into(), &cfg, comm).expect("executor");
        let exec = leader_or_follow(tp, exec)?;
        let mut engine = Engine::from_executor(exec, vec![], &cfg).expect("leader");
        let round = |engine: &mut Engine, prompts: &[Vec<u32>], base: u64| {
            let requests = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let params = SamplingParams {
                        ignore_eos: true,
                        ..SamplingParams::greedy(16)
                    };
                    (base + i as u64, p.clone(), params)
                })
                .collect();
            let mut cached = 0;
            let out = engine
                .run_to_completion(requests, |ev| {
                    cached += ev.cached_tokens.unwrap_or(0);
                    true
                })
                .expect("generate");
            let tokens: Vec<Vec<u32>> = (0..prompts.len())
                .map(|i| out[&(base + i as u64)].token_ids())
                .collect();
            (tokens, cached)
        };
        let (cold, cold_cached) = round(&mut engine, &prompts, 0);
        engine.reset_prefix_cache();
        let halves: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| p[..p.len() / 2].iter().copied().chain([13]).collect())
            .collect();
        round(&mut engine, &halves, 100);
        let (partial, partial_cached) = round(&mut engine, &prompts, 200);
        let (full, full_cached) = round(&mut engine, &prompts, 300);
        Some((
            cold,
            partial,
            full,
            [cold_cached, partial_cached, full_cached],
        ))
    });
    let (cold, partial, full, cached) = results[0].as_ref().expect("the leader's tokens");
    assert_eq!(cached[0], 0, "nothing cached in the cold round");
    assert!(cached[1] > 0 && cached[2] > cached[1], "hits: {cached:?}");
    for (i, case) in cases.iter().enumerate() {
        let want = ids(&case["greedy_token_ids"]);
        assert_eq!(cold[i], want[..16], "{}: cold on 3 ranks", case["name"]);
        assert_eq!(
            partial[i], cold[i],
            "{}: partial hit on 3 ranks",
            case["name"]
        );
        assert_eq!(full[i], cold[i], "{}: full hit on 3 ranks", case["name"]);
    }
}

#[test]
fn a_split_that_does_not_divide_names_the_sizes_that_work() {
    let options = LoadOptions {
        tp: TpRank { rank: 0, world: 2 },
        ..LoadOptions::default()
    };
    let e = model::load_with(&default_model_path(), options).expect_err("9 heads over 2 ranks");
    let msg = e.to_string();
    assert!(
        msg.contains("9 attention heads do not divide by 2"),
        "{msg}"
    );
    assert!(msg.contains("sizes that work: [1, 3]"), "{msg}");
}

/// Rank 3 dies after the pool formed: the leader's next step fails naming it, and rank 1 (a
/// follower) learns that the leader is gone once the leader gives up.
#[test]
fn a_lost_rank_fails_the_step_naming_it() {
    let path = fixtures().join("models/llama2_tied");
    let cfg = EngineConfig {
        max_model_len: Some(64),
        kv_cache_bytes: 4 << 20,
        ..EngineConfig::default()
    };
    let results = on_ranks(4, |tp, comm| {
        let m = load_shard(&path, tp).model;
        let mut exec = Executor::new(m.into(), &cfg, comm).expect("executor");
        match tp.rank {
            0 => {
                let mut engine = Engine::from_executor(exec, vec![], &cfg).expect("leader");
                let params = SamplingParams::greedy(4);
                let e = engine
                    .run_to_completion(vec![(1, vec![1, 2, 3], params)], |_| true)
                    .expect_err("rank 3 is gone");
                Some(e)
            }
            1 | 2 => {
                exec.agree_on_blocks().expect("blocks");
                exec.follow().err()
            }
            _ => {
                exec.agree_on_blocks().expect("blocks");
                None // returns: its links close, as a killed process's do
            }
        }
    });
    let leader = results[0].as_ref().expect("the leader's error");
    assert!(
        matches!(
            leader,
            EngineError::RankLost {
                rank: Some(3),
                step: 1,
                ..
            }
        ),
        "{leader}"
    );
    assert!(leader.is_fatal());
    let msg = leader.to_string();
    assert!(msg.contains("lost rank 3 during step 1"), "{msg}");
    assert!(msg.contains("every rank finished step 0"), "{msg}");
    let follower = results[1].as_ref().expect("rank 1's error");
    assert!(
        matches!(follower, EngineError::RankLost { rank: Some(0), .. }),
        "{follower}"
    );
    assert!(
        follower.to_string().contains("rank 0 (the leader)"),
        "{follower}"
    );
}
