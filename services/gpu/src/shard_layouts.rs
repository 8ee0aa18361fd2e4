//! A rank's projections in their GPU layouts ([`HostMatrix::prepare`], what the runner
//! uploads) against the same slices of the whole model's: for every format the GPU runs
//! (f16/bf16/f32 checkpoints, GGUF blocks with and without minimums, GPTQ and AWQ groups, W8A8
//! int8, FP8 per channel and in blocks), each shard's rows (Q/K/V, gate/up) and columns (O,
//! down) hold exactly the whole matrix's values there, in the same layout where the shard's
//! width allows it. No GPU: the layouts are made and read on the host.

use std::ops::Range;
use std::path::{Path, PathBuf};

use ferrite_model::tp::TpRank;
use ferrite_model::{self as model, LlamaModel, LoadOptions};

use super::matrix::HostMatrix;
use super::weights::head_is_embedding;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A prepared matrix's kind and its values, row-major.
fn dense(h: &HostMatrix<'_>) -> (&'static str, Vec<f32>) {
    match h {
        HostMatrix::Dense(parts) => ("dense", parts.iter().flat_map(|m| m.to_f32()).collect()),
        HostMatrix::Quantized(r) => ("quantized", r.dequantize()),
        HostMatrix::Int8(m) => ("int8", m.dequantize()),
        HostMatrix::Fp8(m) => {
            let mut out = vec![0f32; m.rows() * m.cols()];
            for (r, row) in out.chunks_mut(m.cols()).enumerate() {
                m.dequantize_row(r, row);
            }
            ("fp8", out)
        }
    }
}

/// Rows `rows` of a `cols`-wide row-major matrix, columns `keep`.
/// A dense layer's MLP (the fixtures here have no experts).
fn dense_mlp(l: &model::llama::Layer) -> &model::moe::Ffn {
    l.mlp.dense().expect("a dense MLP")
}

fn cut(m: &[f32], cols: usize, rows: Range<usize>, keep: Range<usize>) -> Vec<f32> {
    rows.flat_map(|r| {
        m[r * cols + keep.start..r * cols + keep.end]
            .iter()
            .copied()
    })
    .collect()
}

fn scaled(r: Range<usize>, by: usize) -> Range<usize> {
    r.start * by..r.end * by
}

fn load(path: &Path, tp: TpRank) -> LlamaModel {
    let options = LoadOptions {
        tp,
        ..LoadOptions::default()
    };
    model::load_with(path, options)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .model
}

/// Every layer's four projections of `tp`'s shard against the whole model's.
fn check(path: &Path, world: usize) -> Vec<&'static str> {
    let whole = load(path, TpRank::SOLO);
    let c = whole.config().clone();
    let (hd, arch) = (c.head_dim, "sm_90");
    let mut kinds = Vec::new();
    for rank in 0..world {
        let tp = TpRank { rank, world };
        let shard = load(path, tp);
        for (w, s) in whole.layers().iter().zip(shard.layers()) {
            let q = scaled(tp.part(c.num_heads), hd);
            let kv = scaled(tp.kv_heads(c.num_kv_heads), hd);
            let (ff, h) = (tp.part(c.intermediate_size), c.hidden_size);
            let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
            // Column-parallel: the shard's rows of the stacked whole, its width unchanged.
            let rows = |whole: &[&ferrite_formats::Matrix],
                        shard: &[&ferrite_formats::Matrix],
                        cuts: &[Range<usize>]| {
                let (kw, vw) = dense(&HostMatrix::prepare(whole, arch));
                let (ks, vs) = dense(&HostMatrix::prepare(shard, arch));
                let want: Vec<f32> = cuts
                    .iter()
                    .flat_map(|r| cut(&vw, h, r.clone(), 0..h))
                    .collect();
                assert_eq!(
                    ks,
                    kw,
                    "{}: rank {rank}'s rows in another layout",
                    path.display()
                );
                assert!(vs == want, "{}: rank {rank}'s rows differ", path.display());
                ks
            };
            let (qo, ko, vo) = (
                0..q_dim,
                q_dim..q_dim + kv_dim,
                q_dim + kv_dim..q_dim + 2 * kv_dim,
            );
            let at =
                |r: &Range<usize>, base: &Range<usize>| base.start + r.start..base.start + r.end;
            kinds.push(rows(
                &[&w.q, &w.k, &w.v],
                &[&s.q, &s.k, &s.v],
                &[at(&q, &qo), at(&kv, &ko), at(&kv, &vo)],
            ));
            let fo = c.intermediate_size;
            let (w_ffn, s_ffn) = (dense_mlp(w), dense_mlp(s));
            kinds.push(rows(
                &[&w_ffn.gate, &w_ffn.up],
                &[&s_ffn.gate, &s_ffn.up],
                &[ff.clone(), fo + ff.start..fo + ff.end],
            ));
            // Row-parallel: the shard's columns of the whole.
            for (whole_m, shard_m, keep, width) in [
                (&w.o, &s.o, q.clone(), q_dim),
                (&w_ffn.down, &s_ffn.down, ff.clone(), fo),
            ] {
                let (kw, vw) = dense(&HostMatrix::prepare(&[whole_m], arch));
                let (ks, vs) = dense(&HostMatrix::prepare(&[shard_m], arch));
                let want = cut(&vw, width, 0..h, keep.clone());
                assert!(
                    vs == want,
                    "{}: rank {rank}'s columns differ",
                    path.display()
                );
                // A shard narrower than its kernels' run falls back to dense values (the same
                // numbers); a whole-width shard keeps the whole's layout.
                if ks != kw {
                    assert_eq!(ks, "dense", "{}: {kw} became {ks}", path.display());
                }
                kinds.push(ks);
            }
        }
    }
    kinds
}

#[test]
fn shards_in_gpu_layouts_equal_the_whole_models_slices() {
    let interop = fixtures().join("quant/interop");
    let cases: [(PathBuf, &str); 8] = [
        (fixtures().join("models/llama31"), "dense"),
        (
            fixtures().join("models/llama_kquant/model.gguf"),
            "quantized",
        ),
        (interop.join("ct_gptq_w4a16"), "quantized"),
        (interop.join("ct_awq_w4a16_asym"), "quantized"),
        (interop.join("autoawq_gemm"), "quantized"),
        (interop.join("ct_smoothquant_w8a8"), "int8"),
        (interop.join("ct_fp8_dynamic"), "fp8"),
        // Blocks of 32 columns: narrower than the FP8 kernels' 64-byte chunks, so this tiny
        // checkpoint runs dense on the GPU, whole or cut (its shards are checked all the same).
        (interop.join("hf_fp8_block"), "dense"),
    ];
    for (path, kind) in cases {
        let kinds = check(&path, 2);
        assert!(
            kinds.contains(&kind),
            "{}: no {kind} layout among {kinds:?}",
            path.display()
        );
    }
}

/// The default model (GGUF Q4_1 with minimums, Q8_0 …) on 3 ranks, as `--tp 3` runs it.
#[test]
fn the_default_models_shards_in_gpu_layouts_equal_its_slices() {
    let Some(path) = std::env::var_os("FERRITE_TEST_GGUF") else {
        eprintln!("FERRITE_TEST_GGUF is not set: the default model is not checked here");
        return;
    };
    let kinds = check(Path::new(&path), 3);
    assert!(kinds.iter().all(|&k| k == "quantized"), "{kinds:?}");
    tied_heads(Path::new(&path), 3);
}

/// A model whose head is tied to its embedding: one copy on the device when whole; on rank 0
/// the head's part starts where the table does (the same mapped bytes), and must not be taken
/// for the whole table.
fn tied_heads(path: &Path, world: usize) {
    assert!(head_is_embedding(&load(path, TpRank::SOLO)));
    for rank in 0..world {
        let shard = load(path, TpRank { rank, world });
        assert!(!head_is_embedding(&shard), "rank {rank}");
    }
}

#[test]
fn a_tied_heads_part_is_not_the_embedding_table() {
    tied_heads(&fixtures().join("models/llama2_tied"), 2);
}
