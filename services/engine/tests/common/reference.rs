//! Comparing ferrite's logits with reference cases (`first_logits`, greedy tokens and margins,
//! optionally a `tie_margin`) as `tests/fixtures/quant/interop/generate.py` writes them; the
//! tolerances are explained in `interop.rs`.

use ferrite_engine::model::{LlamaModel, LogitsWanted};
use serde_json::Value;

use super::{decode_logits, floats, ids, max_abs_diff, prefill_logits};

/// Float-rounding agreement (see `interop.rs`).
pub const TIGHT: f32 = 1e-4;
/// A case's activations this close (relative) to a rounding tie may round the other way.
pub const TIE: f64 = 1e-5;

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Checks ferrite's greedy picks, teacher-forced on the reference's tokens, wherever the
/// reference's margin exceeds `2 * tol`; returns how many steps were checked.
fn check_greedy(name: &str, model: &LlamaModel, case: &Value, first: &[f32], tol: f32) -> usize {
    let prompt = ids(&case["prompt_token_ids"]);
    let greedy = ids(&case["greedy_token_ids"]);
    let margins = floats(&case["greedy_margins"]);
    let mut steps = vec![first.to_vec()];
    steps.extend(decode_logits(model, &prompt, &greedy[..greedy.len() - 1]));
    let mut checked = 0;
    for (s, logits) in steps.iter().enumerate() {
        if margins[s] > 2.0 * tol {
            assert_eq!(argmax(logits), greedy[s], "{name}: greedy step {s}");
            checked += 1;
        }
    }
    checked
}

/// Compares every case of `cases` (tolerances as in the module docs); returns the largest
/// difference of the cases that matched tightly.
pub fn check_cases(name: &str, model: &LlamaModel, cases: &Value, perturbed: Option<f32>) -> f32 {
    let cases = cases.as_array().expect("cases");
    let (mut tight, mut worst) = (0, 0f32);
    for (i, case) in cases.iter().enumerate() {
        let prompt = ids(&case["prompt_token_ids"]);
        let got = prefill_logits(model, &prompt, LogitsWanted::Last);
        let d = max_abs_diff(&got, &floats(&case["first_logits"]));
        let near_tie = case["tie_margin"].as_f64().is_some_and(|m| m < TIE);
        let tol = if d <= TIGHT {
            tight += 1;
            worst = worst.max(d);
            TIGHT
        } else {
            let loose = 2.0 * perturbed.unwrap_or(0.0);
            assert!(
                near_tie && d <= loose,
                "{name} case {i}: max |Δ logit| {d} (tie margin {}, bound {loose})",
                case["tie_margin"]
            );
            eprintln!("{name} case {i}: {d:.4} (an activation rounds the other way)");
            loose
        };
        let checked = check_greedy(name, model, case, &got, tol);
        assert!(
            checked >= 3 || tol > TIGHT,
            "{name} case {i}: {checked} greedy steps clear"
        );
    }
    assert!(2 * tight >= cases.len(), "{name}: {tight} tight cases");
    worst
}
