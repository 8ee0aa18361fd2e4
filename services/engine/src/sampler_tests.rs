use super::*;

fn logits() -> Vec<f32> {
    (0..100).map(|i| ((i * 37 % 100) as f32) * 0.05).collect()
}

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(7),
        ..SamplingParams::greedy(10)
    }
}

fn draws(p: SamplingParams, n: usize) -> Vec<u32> {
    let mut s = Sampler::new(p);
    (0..n)
        .map(|_| s.sample(&mut logits(), &[]).expect("finite").id)
        .collect()
}

#[test]
fn greedy_is_argmax() {
    let l = logits();
    let best = argmax(&l);
    assert_eq!(l[best as usize], l.iter().copied().fold(f32::MIN, f32::max));
    assert_eq!(draws(SamplingParams::greedy(1), 3), vec![best; 3]);
}

#[test]
fn seeded_runs_are_reproducible_and_seeds_differ() {
    let a = draws(params(1.0), 50);
    let b = draws(params(1.0), 50);
    assert_eq!(a, b);
    let c = draws(
        SamplingParams {
            seed: Some(8),
            ..params(1.0)
        },
        50,
    );
    assert_ne!(a, c);
}

#[test]
fn top_k_never_emits_an_excluded_token() {
    let l = logits();
    let allowed: Vec<u32> = top_logprobs(&l, 5).into_iter().map(|(i, _)| i).collect();
    for t in draws(
        SamplingParams {
            top_k: 5,
            ..params(5.0)
        },
        500,
    ) {
        assert!(allowed.contains(&t), "{t} outside top-5 {allowed:?}");
    }
}

#[test]
fn top_p_never_emits_an_excluded_token() {
    let l = logits();
    let ranked = top_logprobs(&l, l.len());
    let mut acc = 0.0;
    let mut allowed = Vec::new();
    for (i, lp) in ranked {
        allowed.push(i);
        acc += f64::from(lp).exp();
        if acc >= 0.3 {
            break;
        }
    }
    let seen = draws(
        SamplingParams {
            top_p: 0.3,
            ..params(1.0)
        },
        500,
    );
    for t in &seen {
        assert!(allowed.contains(t), "{t} outside the top-p set {allowed:?}");
    }
    assert!(
        seen.iter().any(|t| *t != seen[0]),
        "top-p 0.3 over {} tokens should vary",
        allowed.len()
    );
}

#[test]
fn min_p_never_emits_an_excluded_token() {
    let l = logits();
    let max = l.iter().copied().fold(f32::MIN, f32::max);
    for t in draws(
        SamplingParams {
            min_p: 0.5,
            ..params(1.0)
        },
        500,
    ) {
        // p(t) / p(max) = exp(l_t - max) at temperature 1.
        assert!(
            (l[t as usize] - max).exp() >= 0.5 - 1e-6,
            "token {t} below min-p"
        );
    }
}

#[test]
fn penalties_follow_their_rules() {
    let p = SamplingParams {
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..SamplingParams::greedy(1)
    };
    let mut l = vec![1.0f32, -1.0, 1.0, 1.0];
    let seen = seen_tokens(&[0, 1], &[2, 2]);
    let adjust = Adjustments {
        bias: &[],
        penalties: &p.penalties(),
        seen: &seen,
    };
    adjust.apply(&mut l);
    assert_eq!(l, vec![0.5, -2.0, 1.0 / 2.0 - 0.5 - 0.5, 1.0]);
}

/// A bias of -100 bans the best token, a large one forces another; the logprobs stay those of
/// the model's distribution, the drawn token's with its bias (and penalty) undone.
#[test]
fn a_logit_bias_moves_the_draw_not_the_logprobs() {
    let raw = logits();
    let best = argmax(&raw);
    let params = |logit_bias| SamplingParams {
        logit_bias,
        logprobs: Some(2),
        ..SamplingParams::greedy(1)
    };
    let lse = log_sum_exp(&raw);
    let banned = Sampler::new(params(vec![(best, -100.0)]))
        .sample(&mut raw.clone(), &[])
        .expect("finite");
    assert_ne!(banned.id, best);
    assert_eq!(banned.top[0].0, best, "the top logprobs are the model's");
    assert!((banned.logprob - (raw[banned.id as usize] - lse)).abs() < 1e-5);
    let forced = SamplingParams {
        repetition_penalty: 1.5,
        ..params(vec![(7, 30.0), (best, -100.0)])
    };
    let out = Sampler::new(forced)
        .sample(&mut raw.clone(), &seen_tokens(&[7], &[]))
        .expect("finite");
    assert_eq!(out.id, 7);
    assert!((out.logprob - (raw[7] - lse)).abs() < 1e-5, "{out:?}");
}

#[test]
fn logprobs_are_raw_and_sorted() {
    let mut s = Sampler::new(SamplingParams {
        logprobs: Some(3),
        repetition_penalty: 1.5,
        ..SamplingParams::greedy(1)
    });
    let raw = logits();
    let mut l = raw.clone();
    let out = s.sample(&mut l, &seen_tokens(&[3], &[])).expect("finite");
    let lse = log_sum_exp(&raw);
    assert_eq!(out.top.len(), 3);
    assert!(out.top.windows(2).all(|w| w[0].1 >= w[1].1));
    assert!((out.top[0].1 - (raw[out.top[0].0 as usize] - lse)).abs() < 1e-5);
    assert!((out.logprob - (raw[out.id as usize] - lse)).abs() < 1e-5);
}

#[test]
fn validation_names_the_field() {
    let cases = [
        (
            SamplingParams {
                max_tokens: 0,
                ..params(1.0)
            },
            "max_tokens",
        ),
        (
            SamplingParams {
                temperature: -1.0,
                ..params(1.0)
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..params(1.0)
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: 2.0,
                ..params(1.0)
            },
            "min_p",
        ),
        (
            SamplingParams {
                logprobs: Some(99),
                ..params(1.0)
            },
            "logprobs",
        ),
        (
            SamplingParams {
                presence_penalty: 5.0,
                ..params(1.0)
            },
            "presence_penalty",
        ),
    ];
    for (p, field) in cases {
        let err = p.validate().expect_err(field).to_string();
        assert!(err.contains(field), "{err}");
    }
    assert!(params(0.7).validate().is_ok());
}

#[test]
fn a_row_without_a_distribution_is_the_models_fault_not_a_panic() {
    let mut rows = Vec::new();
    let mut nan = logits();
    nan[5] = f32::NAN;
    rows.push(nan);
    rows.push(vec![f32::NAN; 100]);
    let mut inf = logits();
    inf[9] = f32::INFINITY;
    rows.push(inf);
    rows.push(vec![f32::NEG_INFINITY; 100]);
    for temperature in [0.0, 0.7, 1.0] {
        for (i, row) in rows.iter().enumerate() {
            let p = SamplingParams {
                top_p: 0.9,
                logprobs: Some(3),
                ..params(temperature)
            };
            let err = Sampler::new(p)
                .sample(&mut row.clone(), &seen_tokens(&[1], &[2]))
                .expect_err("no distribution");
            assert_eq!(err.kind(), "bad_logits", "row {i} at {temperature}: {err}");
        }
    }
}

/// `draw` as its doc states it, sorting every candidate first: the reference for `draw`,
/// which sorts only as much of the order as its walk reads (the same arithmetic otherwise).
fn draw_sorting_all(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let floor = max - 40.0 * p.temperature;
    let mut cand: Vec<Candidate> = (logits.iter().enumerate())
        .filter(|&(_, &l)| l >= floor)
        .map(|(i, &l)| {
            let s = (l - max) * (1.0 / p.temperature);
            Candidate {
                id: i as u32,
                s,
                w: f64::from(s).exp(),
            }
        })
        .collect();
    let total_unsorted = |c: &[Candidate]| -> f64 { c.iter().map(|c| c.w).sum() };
    let mut order = cand.clone();
    order.sort_by(draw_order);
    if p.top_k > 0 && p.top_k < order.len() {
        order.truncate(p.top_k);
        // The sum runs over the kept candidates in their first order, as `draw`'s does.
        cand.retain(|c| order.iter().any(|o| o.id == c.id));
    }
    let total = total_unsorted(&cand);
    let mut keep = order.len();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        if let Some(i) = order.iter().position(|c| {
            acc += c.w / total;
            acc >= f64::from(p.top_p)
        }) {
            keep = i + 1;
        }
    }
    if p.min_p > 0.0 {
        let passing = (order.iter().take(keep))
            .take_while(|c| c.w >= f64::from(p.min_p))
            .count();
        keep = keep.min(passing.max(1));
    }
    let keep = keep.max(1);
    let kept = match keep == order.len() {
        true => total,
        false => order[..keep].iter().map(|c| c.w).sum(),
    };
    let mut u = rng.next_f64() * kept;
    for c in &order[..keep] {
        if u < c.w {
            return c.id;
        }
        u -= c.w;
    }
    order[keep - 1].id
}

/// Rows of 5000 logits: flat (nearly every token a candidate), peaked (a few dominate, the
/// rest a long tail), and in steps of 0.25 (ties everywhere, broken by the smaller id).
fn rows_to_draw_from() -> Vec<Vec<f32>> {
    let mut rng = Rng::seeded(3);
    let mut unit = move || rng.next_f64() as f32;
    let flat = (0..5000).map(|_| unit() * 4.0).collect();
    let peaked = (0..5000)
        .map(|i| (unit() + unit() + unit() - 1.5) * 4.0 + if i % 700 == 3 { 9.0 } else { 0.0 })
        .collect();
    let steps = (0..5000).map(|_| (unit() * 24.0).floor() * 0.25).collect();
    vec![flat, peaked, steps]
}

/// The walk that sorts only what it reads picks what sorting every candidate picks, for each
/// cut (top-k small and large, top-p, min-p, together) and temperature, over 30 seeds.
#[test]
fn the_draw_picks_what_sorting_every_candidate_picks() {
    let mut checked = 0;
    for row in rows_to_draw_from() {
        for temperature in [0.3f32, 1.0, 2.0] {
            for (top_k, top_p, min_p) in [
                (0, 1.0, 0.0),
                (1, 1.0, 0.0),
                (40, 1.0, 0.0),
                (3000, 1.0, 0.0),
                (0, 0.5, 0.0),
                (0, 0.97, 0.0),
                (0, 1.0, 0.05),
                (200, 0.9, 0.02),
            ] {
                let p = SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    ..SamplingParams::greedy(1)
                };
                for seed in 0..30 {
                    let (mut a, mut b) = (Rng::seeded(seed), Rng::seeded(seed));
                    let want = draw_sorting_all(&row, &p, &mut a);
                    assert_eq!(draw(&row, &p, &mut b), want, "{p:?}, seed {seed}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 3 * 3 * 8 * 30);
}

/// The most likely tokens found in one pass are those a full sort of the row ranks first
/// (larger logit first, +0 above -0, ties to the smaller id), on rows full of ties, signed
/// zeros and -inf, for every count up to past the row's length.
#[test]
fn the_top_tokens_in_one_pass_are_those_a_full_sort_ranks_first() {
    let mut rng = Rng::seeded(11);
    for len in [1usize, 7, 40, 300] {
        let row: Vec<f32> = (0..len)
            .map(|_| match rng.next_u64() % 6 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::NEG_INFINITY,
                3 => 1.5,
                _ => (rng.next_f64() * 8.0 - 4.0) as f32,
            })
            .collect();
        let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
        let mut sorted: Vec<u32> = (0..len as u32).collect();
        sorted.sort_by(cmp);
        for n in 1..=TOP_IN_ONE_PASS.min(len + 2) {
            let got = top_in_one_pass(&row, n, cmp);
            assert_eq!(got, sorted[..n.min(len)], "row of {len}, top {n}");
        }
    }
}
