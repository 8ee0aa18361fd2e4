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
        .map(|_| s.sample(&mut logits(), &[], &[]).expect("finite").id)
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
    apply_penalties(&mut l, &p, &[0, 1], &[2, 2]);
    assert_eq!(l, vec![0.5, -2.0, 1.0 / 2.0 - 0.5 - 0.5, 1.0]);
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
    let out = s.sample(&mut l, &[3], &[]).expect("finite");
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
                .sample(&mut row.clone(), &[1], &[2])
                .expect_err("no distribution");
            assert_eq!(err.kind(), "bad_logits", "row {i} at {temperature}: {err}");
        }
    }
}
