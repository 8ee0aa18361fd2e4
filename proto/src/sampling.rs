//! The valid ranges of the sampling parameters: the one definition, used by the gateway's
//! validation (public requests) and by the engine's admission (worker requests and the CLI).

use crate::v1::SamplingDefaults;
use crate::worker::v1::SamplingParams;

/// The most alternatives a token's logprobs may list.
pub const MAX_LOGPROBS: u32 = 20;
/// The most tokens a request's logit bias may name.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// The most choices (completions of its prompt) one request may ask for: OpenAI's bound on `n`.
pub const MAX_CHOICES: u32 = 128;

/// How many choices a request for `n` makes (`None`: 1), or why `n` is refused.
pub fn choices(n: Option<u32>) -> Result<u32, String> {
    match n {
        None => Ok(1),
        Some(n @ 1..=MAX_CHOICES) => Ok(n),
        Some(n) => Err(format!("n must be from 1 to {MAX_CHOICES}, not {n}")),
    }
}

/// Why `p` would be refused, naming the field and its range.
pub fn check(p: &SamplingParams) -> Result<(), String> {
    if p.max_tokens == 0 {
        return Err("max_tokens must be at least 1".into());
    }
    if !p.temperature.is_finite() || !(0.0..=100.0).contains(&p.temperature) {
        return Err(format!("temperature {} is outside [0, 100]", p.temperature));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return Err(format!("top_p {} is outside (0, 1]", p.top_p));
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        return Err(format!("min_p {} is outside [0, 1]", p.min_p));
    }
    if !(p.repetition_penalty > 0.0 && p.repetition_penalty <= 10.0) {
        return Err(format!(
            "repetition_penalty {} is outside (0, 10]",
            p.repetition_penalty
        ));
    }
    for (name, v) in [
        ("presence_penalty", p.presence_penalty),
        ("frequency_penalty", p.frequency_penalty),
    ] {
        if !(-2.0..=2.0).contains(&v) {
            return Err(format!("{name} {v} is outside [-2, 2]"));
        }
    }
    for (name, n) in [
        ("logprobs", p.logprobs),
        ("prompt_logprobs", p.prompt_logprobs),
    ] {
        if let Some(n) = n
            && n > MAX_LOGPROBS
        {
            return Err(format!("{name} {n} is above the maximum {MAX_LOGPROBS}"));
        }
    }
    check_logit_bias(&p.logit_bias)
}

/// A logit bias names each token once, at most [`MAX_LOGIT_BIAS`] of them, with biases in
/// [-100, 100] (the vocabulary is the engine's to check).
fn check_logit_bias(bias: &[crate::v1::LogitBias]) -> Result<(), String> {
    if bias.len() > MAX_LOGIT_BIAS {
        return Err(format!(
            "logit_bias names {} tokens, above the maximum {MAX_LOGIT_BIAS}",
            bias.len()
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for b in bias {
        if !(-100.0..=100.0).contains(&b.bias) {
            return Err(format!(
                "logit_bias {} for token {} is outside [-100, 100]",
                b.bias, b.token
            ));
        }
        if !seen.insert(b.token) {
            return Err(format!("logit_bias names token {} twice", b.token));
        }
    }
    Ok(())
}

/// The fields `d` recommends, by name, in the API's order (for `/v1/models`, the CLI).
pub fn recommended_fields(d: &SamplingDefaults) -> Vec<(&'static str, f32)> {
    [
        ("temperature", d.temperature),
        ("top_p", d.top_p),
        ("top_k", d.top_k.map(|k| k as f32)),
        ("min_p", d.min_p),
        ("repetition_penalty", d.repetition_penalty),
    ]
    .into_iter()
    .filter_map(|(name, v)| v.map(|v| (name, v)))
    .collect()
}

/// `d` without the values [`check`] would refuse in a request (each named in the error list),
/// so a bad recommendation never refuses the requests that rely on it.
pub fn in_range(d: SamplingDefaults) -> (SamplingDefaults, Vec<String>) {
    let neutral = SamplingParams {
        max_tokens: 1,
        temperature: 1.0,
        top_p: 1.0,
        repetition_penalty: 1.0,
        ..SamplingParams::default()
    };
    let mut refused = Vec::new();
    let mut keep = |v: Option<f32>, set: fn(&mut SamplingParams, f32)| {
        let v = v?;
        let mut p = neutral.clone();
        set(&mut p, v);
        match check(&p) {
            Ok(()) => Some(v),
            Err(e) => {
                refused.push(e);
                None
            }
        }
    };
    let kept = SamplingDefaults {
        temperature: keep(d.temperature, |p, v| p.temperature = v),
        top_p: keep(d.top_p, |p, v| p.top_p = v),
        min_p: keep(d.min_p, |p, v| p.min_p = v),
        repetition_penalty: keep(d.repetition_penalty, |p, v| p.repetition_penalty = v),
        top_k: d.top_k,
        source: d.source,
    };
    (kept, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Puts one field out of range.
    type SetSampling = fn(&mut SamplingParams);

    fn ok() -> SamplingParams {
        SamplingParams {
            max_tokens: 16,
            temperature: 0.7,
            top_p: 1.0,
            repetition_penalty: 1.0,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn every_field_out_of_range_is_named() {
        assert_eq!(check(&ok()), Ok(()));
        fn bias(token: u32, bias: f32) -> crate::v1::LogitBias {
            crate::v1::LogitBias { token, bias }
        }
        let cases: [(&str, SetSampling); 13] = [
            ("max_tokens", |p| p.max_tokens = 0),
            ("temperature", |p| p.temperature = f32::NAN),
            ("temperature", |p| p.temperature = -0.5),
            ("top_p", |p| p.top_p = 0.0),
            ("min_p", |p| p.min_p = 1.5),
            ("repetition_penalty", |p| p.repetition_penalty = 0.0),
            ("presence_penalty", |p| p.presence_penalty = 2.5),
            ("frequency_penalty", |p| p.frequency_penalty = -3.0),
            ("logprobs", |p| p.logprobs = Some(MAX_LOGPROBS + 1)),
            ("logit_bias", |p| p.logit_bias = vec![bias(3, 100.5)]),
            ("logit_bias", |p| p.logit_bias = vec![bias(3, f32::NAN)]),
            ("logit_bias", |p| {
                p.logit_bias = vec![bias(3, 1.0), bias(3, -1.0)]
            }),
            ("logit_bias", |p| {
                p.logit_bias = (0..=MAX_LOGIT_BIAS as u32).map(|t| bias(t, 1.0)).collect();
            }),
        ];
        let mut fine = ok();
        fine.logit_bias = vec![bias(3, 100.0), bias(4, -100.0), bias(5, 0.5)];
        assert_eq!(check(&fine), Ok(()));
        for (field, break_it) in cases {
            let mut p = ok();
            break_it(&mut p);
            let err = check(&p).expect_err(field);
            assert!(err.starts_with(field), "{field}: {err}");
        }
    }
}
