//! Sampling on every backend (see `common`): greedy picks the CPU's argmax; with temperature,
//! top-k, top-p and min-p every draw lies in the set the CPU computes, and draws over many
//! steps follow the renormalised distribution. The GPU's random stream differs from any CPU
//! generator, so draws are judged by membership and frequency, not token by token.

// The GPU wrappers take raw device pointers; every pointer comes from a `Buffers` set that
// outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{Backend, Buffers, backends, random};
use ferrite_kernels::cuda::sample::SamplingArrays;

#[derive(Debug, Clone, Copy)]
struct Params {
    temperature: f32,
    top_k: i32,
    top_p: f32,
    min_p: f32,
}

/// Probabilities after temperature and the filters (HF / vLLM order: top-k, top-p, min-p),
/// renormalised; filtered tokens get 0. Ties at a threshold are kept.
fn allowed_distribution(logits: &[f32], p: Params) -> Vec<f64> {
    let scaled: Vec<f64> = logits.iter().map(|&l| (l / p.temperature) as f64).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut probs: Vec<f64> = scaled.iter().map(|s| (s - max).exp()).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    if p.top_k > 0 && (p.top_k as usize) < probs.len() {
        let kth = probs[order[p.top_k as usize - 1]];
        probs
            .iter_mut()
            .filter(|q| **q < kth)
            .for_each(|q| *q = 0.0);
    }
    if p.top_p < 1.0 {
        let total: f64 = probs.iter().sum();
        let mut mass = 0.0;
        let mut cut = 0.0;
        for &i in &order {
            if probs[i] == 0.0 {
                break;
            }
            mass += probs[i] / total;
            cut = probs[i];
            if mass >= p.top_p as f64 {
                break;
            }
        }
        probs
            .iter_mut()
            .filter(|q| **q < cut)
            .for_each(|q| *q = 0.0);
    }
    if p.min_p > 0.0 {
        let top = probs[order[0]];
        probs
            .iter_mut()
            .filter(|q| **q < p.min_p as f64 * top)
            .for_each(|q| *q = 0.0);
    }
    let total: f64 = probs.iter().sum();
    probs.iter().map(|q| q / total).collect()
}

/// `rows` draws from the same logits row, one per step.
fn draws_on(b: &Backend, logits: &[f32], p: Params, rows: usize) -> Vec<usize> {
    match b {
        Backend::Cpu => {
            let probs = allowed_distribution(logits, p);
            let mut s = 0x2545_F491_4F6C_DD1Du64;
            (0..rows)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    let mut u = (s >> 11) as f64 / (1u64 << 53) as f64;
                    probs
                        .iter()
                        .position(|&q| {
                            u -= q;
                            q > 0.0 && u < 0.0
                        })
                        .unwrap_or_else(|| probs.iter().rposition(|&q| q > 0.0).unwrap_or(0))
                })
                .collect()
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let all: Vec<f32> = (0..rows).flat_map(|_| logits.iter().copied()).collect();
            let lp = m.f32s(&all);
            let arrays = SamplingArrays {
                temperature: m.f32s(&vec![p.temperature; rows]),
                top_k: m.i32s(&vec![p.top_k; rows]),
                top_p: m.f32s(&vec![p.top_p; rows]),
                min_p: m.f32s(&vec![p.min_p; rows]),
                seeds: m.u64s(&vec![42; rows]),
                steps: m.u64s(&(0..rows as u64).collect::<Vec<_>>()),
            };
            let out = m.zeroed(4 * rows);
            unsafe { gpu.sample(out, lp, rows, logits.len(), &arrays) }.expect("launch");
            m.read_i32(out, rows)
                .into_iter()
                .map(|i| i as usize)
                .collect()
        }
    }
}

#[test]
fn greedy_picks_the_first_largest_logit() {
    let vocab = 151_936;
    let mut rows = Vec::new();
    for seed in 0..4u64 {
        let mut r = random(vocab, 20 + seed, 10.0);
        // A tie between two maxima: the lower index wins, as on the CPU.
        r[1000 + seed as usize] = 50.0;
        r[90_000] = 50.0;
        rows.push(r);
    }
    for b in backends() {
        let want: Vec<usize> = rows
            .iter()
            .map(|r| {
                r.iter()
                    .enumerate()
                    .fold(0, |best, (i, &v)| if v > r[best] { i } else { best })
            })
            .collect();
        let got: Vec<usize> = match &b {
            Backend::Cpu => want.clone(),
            Backend::Cuda(gpu) => {
                let mut m = Buffers::new(gpu);
                let flat: Vec<f32> = rows.concat();
                let lp = m.f32s(&flat);
                let out = m.zeroed(4 * rows.len());
                unsafe { gpu.argmax(out, lp, rows.len(), vocab) }.expect("launch");
                let argmax: Vec<usize> = m
                    .read_i32(out, rows.len())
                    .iter()
                    .map(|&i| i as usize)
                    .collect();
                let greedy = Params {
                    temperature: 0.0,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                };
                for (r, &w) in rows.iter().zip(&want) {
                    assert_eq!(draws_on(&b, r, greedy, 3), vec![w; 3], "sample_f32 greedy");
                }
                argmax
            }
        };
        assert_eq!(got, want, "argmax on {}", b.name());
    }
}

#[test]
fn filtered_draws_stay_in_the_allowed_set_and_follow_its_distribution() {
    // A small vocabulary with a known shape: a few likely tokens and a long tail.
    let vocab = 64;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| 4.0 - 0.25 * i as f32 + if i % 7 == 0 { 1.0 } else { 0.0 })
        .collect();
    let cases = [
        Params {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        },
        Params {
            temperature: 0.7,
            top_k: 5,
            top_p: 1.0,
            min_p: 0.0,
        },
        Params {
            temperature: 1.3,
            top_k: 0,
            top_p: 0.8,
            min_p: 0.0,
        },
        Params {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.2,
        },
        Params {
            temperature: 0.9,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.05,
        },
    ];
    let draws = 20_000;
    for b in backends() {
        for p in cases {
            let probs = allowed_distribution(&logits, p);
            let got = draws_on(&b, &logits, p, draws);
            let mut counts = vec![0usize; vocab];
            for &t in &got {
                assert!(
                    t < vocab && probs[t] > 0.0,
                    "{p:?} on {}: drew filtered token {t}",
                    b.name()
                );
                counts[t] += 1;
            }
            for (t, (&c, &q)) in counts.iter().zip(&probs).enumerate() {
                let f = c as f64 / draws as f64;
                // Five standard deviations of a binomial frequency, plus a little.
                let sd = (q * (1.0 - q) / draws as f64).sqrt();
                assert!(
                    (f - q).abs() <= 5.0 * sd + 1e-3,
                    "{p:?} on {}: token {t} drawn {f:.4}, p = {q:.4}",
                    b.name()
                );
            }
        }
    }
}
