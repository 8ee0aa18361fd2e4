//! Paged attention on every backend (see `common`), against numpy's values in
//! `tests/fixtures/ops/attention.json`: decode with grouped-query heads over contexts spanning
//! several GPU decode partitions, prefill over a whole prompt and over a chunk that continues a
//! cached context, and Gemma 2's soft cap and sliding window. On a GPU the CUDA kernels are also
//! compared with the CPU's `paged_attention` (which the fixture checks) at model sizes: decode
//! split over partitions (at batch 1, a 1300-token context in eleven of 128 positions), head sizes with
//! (64/128/256) and without (96; 80, the seed's 2.7B model; 16) a tensor-core kernel. The
//! cache's blocks are scattered, as a long-running server's are.

// The GPU wrappers take raw device pointers; every pointer comes from a `Buffers` set that
// outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{
    Backend, Buffers, DTYPES, assert_close, backends, fixture, floats, items, num, random, round,
    uint, uints,
};
use ferrite_kernels::cpu::attention::{AttentionOptions, PagedKv, QueryToken, paged_attention};
use ferrite_kernels::cuda::attention::{DecodeScratch, PagedAttention, decode_parts};
use ferrite_kernels::cuda::ops::Dtype;
use serde_json::Value;

const BLOCK: usize = 16;

/// A batch: per sequence its context length (cache filled to it) and how many of its last
/// tokens are queries.
struct Case {
    n_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// (context length, query tokens) per sequence.
    seqs: Vec<(usize, usize)>,
    opts: AttentionOptions<'static>,
}

struct Inputs {
    k: Vec<f32>,
    v: Vec<f32>,
    q: Vec<f32>,
    tables: Vec<Vec<u32>>,
    max_blocks: usize,
}

fn inputs(c: &Case, dtype: Dtype) -> Inputs {
    let max_blocks = c
        .seqs
        .iter()
        .map(|s| s.0.div_ceil(BLOCK))
        .max()
        .unwrap_or(1);
    let total_blocks: usize = c.seqs.iter().map(|s| s.0.div_ceil(BLOCK)).sum::<usize>() + 3;
    // Scattered physical blocks: sequence s takes every n-th block from a shuffled order.
    let mut order: Vec<u32> = (0..total_blocks as u32).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (i * 7919 + 13) % (i + 1));
    }
    let mut next = order.into_iter();
    let tables = c
        .seqs
        .iter()
        .map(|s| {
            (0..s.0.div_ceil(BLOCK))
                .map(|_| next.next().unwrap_or(0))
                .collect()
        })
        .collect();
    let slot = c.kv_heads * c.head_dim;
    let q_rows: usize = c.seqs.iter().map(|s| s.1).sum();
    Inputs {
        k: round(dtype, &random(total_blocks * BLOCK * slot, 31, 1.0)),
        v: round(dtype, &random(total_blocks * BLOCK * slot, 32, 1.0)),
        q: round(dtype, &random(q_rows * c.n_heads * c.head_dim, 33, 1.0)),
        tables,
        max_blocks,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kernel {
    Decode,
    Prefill,
    PrefillSimt,
}

const KERNELS: [Kernel; 3] = [Kernel::Decode, Kernel::Prefill, Kernel::PrefillSimt];

/// A fixture case: the batch and the kernels that run it.
fn fixture_case(c: &Value) -> (Case, Vec<Kernel>) {
    let seqs = items(&c["seqs"]).iter().map(uints).map(|s| (s[0], s[1]));
    let kernels = items(&c["kernels"]).iter().map(|k| {
        let found = KERNELS
            .into_iter()
            .find(|&kernel| *k == format!("{kernel:?}"));
        found.unwrap_or_else(|| panic!("kernel {k}"))
    });
    let case = Case {
        n_heads: uint(&c["n_heads"]),
        kv_heads: uint(&c["kv_heads"]),
        head_dim: uint(&c["head_dim"]),
        seqs: seqs.collect(),
        opts: AttentionOptions {
            scale: num(&c["scale"]),
            soft_cap: c["soft_cap"].as_f64().map(|cap| cap as f32),
            sliding_window: c["window"].as_u64().map(|w| w as usize),
            sinks: None,
        },
    };
    (case, kernels.collect())
}

fn attention_on(b: &Backend, dtype: Dtype, c: &Case, x: &Inputs, kernel: Kernel) -> Vec<f32> {
    let width = c.n_heads * c.head_dim;
    match b {
        Backend::Cpu => {
            let kv = PagedKv {
                k: &x.k,
                v: &x.v,
                block_size: BLOCK,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
            };
            let tokens: Vec<QueryToken<'_>> = c
                .seqs
                .iter()
                .zip(&x.tables)
                .flat_map(|(&(ctx, nq), t)| {
                    (ctx - nq..ctx).map(move |pos| QueryToken {
                        block_table: t,
                        pos,
                    })
                })
                .collect();
            let mut out = vec![0.0; x.q.len()];
            paged_attention(&x.q, &tokens, c.n_heads, &kv, c.opts, &mut out);
            round(dtype, &out)
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let flat_tables: Vec<i32> = x
                .tables
                .iter()
                .flat_map(|t| (0..x.max_blocks).map(|i| t.get(i).map_or(0, |&b| b as i32)))
                .collect();
            let ctx: Vec<i32> = c.seqs.iter().map(|s| s.0 as i32).collect();
            let a = PagedAttention {
                k_cache: m.half(dtype, &x.k),
                v_cache: m.half(dtype, &x.v),
                block_tables: m.i32s(&flat_tables),
                max_blocks: x.max_blocks,
                context_lens: m.i32s(&ctx),
                n_seqs: c.seqs.len(),
                n_heads: c.n_heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                block_size: BLOCK,
                scale: c.opts.scale,
                soft_cap: c.opts.soft_cap.unwrap_or(0.0),
                window: c.opts.sliding_window.unwrap_or(0),
            };
            let q = m.half(dtype, &x.q);
            let out = m.zeroed(2 * x.q.len());
            match kernel {
                Kernel::Decode => {
                    let longest = c.seqs.iter().map(|s| s.0).max().unwrap_or(1);
                    let n_parts = decode_parts(longest);
                    let (po, pm) =
                        DecodeScratch::sizes(c.seqs.len(), c.n_heads, c.head_dim, n_parts);
                    let counters = c.seqs.len() * c.kv_heads;
                    let scratch = DecodeScratch {
                        part_out: m.zeroed(4 * po),
                        part_max: m.zeroed(4 * pm),
                        part_sum: m.zeroed(4 * pm),
                        counters: m.zeroed(4 * counters),
                        n_parts,
                    };
                    // Twice, as a captured graph replays it: the last partition to finish
                    // combines them and resets its counter, so the second launch must give
                    // the same bits and leave every counter at zero again.
                    let again = m.zeroed(2 * x.q.len());
                    for o in [again, out] {
                        unsafe { gpu.attention_decode(dtype, o, width, q, width, &a, &scratch) }
                            .expect("decode");
                    }
                    let (first, second) =
                        (m.read_u16(again, x.q.len()), m.read_u16(out, x.q.len()));
                    assert_eq!(first, second, "decode relaunched gave other bits");
                    let left = m.read_i32(scratch.counters, counters);
                    assert!(left.iter().all(|&c| c == 0), "counters left: {left:?}");
                }
                Kernel::Prefill | Kernel::PrefillSimt => {
                    let mut starts = vec![0i32];
                    for s in &c.seqs {
                        starts.push(starts[starts.len() - 1] + s.1 as i32);
                    }
                    let qs = m.i32s(&starts);
                    let max_q = c.seqs.iter().map(|s| s.1).max().unwrap_or(1);
                    if kernel == Kernel::Prefill {
                        unsafe { gpu.attention_prefill(dtype, out, width, q, width, qs, max_q, &a) }
                    } else {
                        unsafe {
                            gpu.attention_prefill_simt(dtype, out, width, q, width, qs, max_q, &a)
                        }
                    }
                    .expect("prefill");
                }
            }
            m.read_half(dtype, out, x.q.len())
        }
    }
}

/// Every kernel on every backend against numpy, for the fixture's cases named `name`.
fn check_fixture(name: &str) {
    let fx = fixture("attention.json");
    let cases: Vec<&Value> = items(&fx["cases"])
        .iter()
        .filter(|c| c["name"] == name)
        .collect();
    assert!(!cases.is_empty(), "no fixture case {name}");
    for b in backends() {
        for &fc in &cases {
            let (c, kernels) = fixture_case(fc);
            let tables: Vec<Vec<usize>> = items(&fc["tables"]).iter().map(uints).collect();
            for dtype in DTYPES {
                let x = inputs(&c, dtype);
                let ours = x.tables.iter().map(|t| t.iter().map(|&b| b as usize));
                let ours: Vec<Vec<usize>> = ours.map(Iterator::collect).collect();
                assert_eq!(ours, tables, "generate.py scatters the blocks differently");
                let want = floats(&fc["want"][dtype.name()]);
                for &k in &kernels {
                    let got = attention_on(&b, dtype, &c, &x, k);
                    // Softmax-weighted sums of rounded values: a few ulps of the output type.
                    let what = format!("{k:?} {name} {:?} {:?} on {}", c.seqs, c.opts, b.name());
                    assert_close(&what, dtype, &got, &want, 4.0);
                }
            }
        }
    }
}

/// The CUDA kernels against the CPU's `paged_attention` (which `check_fixture` checks), at
/// sizes a fixture would make large; nothing to do without a GPU.
fn check_against_the_cpu(c: &Case, kernels: &[Kernel]) {
    for b in backends().into_iter().filter(Backend::is_gpu) {
        for dtype in DTYPES {
            let x = inputs(c, dtype);
            let want = attention_on(&Backend::Cpu, dtype, c, &x, Kernel::Prefill);
            for &k in kernels {
                let got = attention_on(&b, dtype, c, &x, k);
                let what = format!(
                    "{k:?} hd{} seqs {:?} {:?} on {}",
                    c.head_dim,
                    c.seqs,
                    c.opts,
                    b.name()
                );
                assert_close(&what, dtype, &got, &want, 4.0);
            }
        }
    }
}

#[test]
fn decode_over_short_and_partitioned_contexts_with_gqa() {
    check_fixture("decode");
    for head_dim in [64, 128, 256, 80] {
        let case = Case {
            n_heads: 8,
            kv_heads: 2,
            head_dim,
            seqs: vec![(1, 1), (17, 1), (1300, 1), (512, 1)],
            opts: AttentionOptions::causal(1.0 / (head_dim as f32).sqrt()),
        };
        check_against_the_cpu(&case, &[Kernel::Decode, Kernel::Prefill]);
    }
}

#[test]
fn prefill_whole_prompts_and_a_continued_chunk() {
    check_fixture("prefill");
    for head_dim in [64, 128, 96, 80, 16] {
        let case = Case {
            n_heads: 4,
            kv_heads: 4,
            head_dim,
            // A 70-token prompt, a 5-token chunk after 30 cached tokens, a 1-token "decode".
            seqs: vec![(70, 70), (35, 5), (9, 1)],
            opts: AttentionOptions::causal(1.0 / (head_dim as f32).sqrt()),
        };
        check_against_the_cpu(&case, &[Kernel::Prefill, Kernel::PrefillSimt]);
    }
}

#[test]
fn gemma2_soft_cap_and_sliding_window() {
    check_fixture("gemma2");
    let opts = AttentionOptions {
        scale: 256f32.powf(-0.5),
        soft_cap: Some(50.0),
        sliding_window: Some(40),
        sinks: None,
    };
    let case = Case {
        n_heads: 8,
        kv_heads: 4,
        head_dim: 256,
        seqs: vec![(100, 100), (600, 1)],
        opts,
    };
    check_against_the_cpu(&case, &[Kernel::Prefill, Kernel::PrefillSimt]);
    let decode = Case {
        seqs: vec![(600, 1), (30, 1), (1100, 1)],
        ..case
    };
    check_against_the_cpu(&decode, &[Kernel::Decode]);
}
