//! A model's rotary embedding: its base frequencies and how they are scaled past the length it
//! was trained at (linear, Llama 3.1, YaRN, LongRoPE), read from `config.json` or GGUF metadata
//! and computed as transformers computes them, in f32 where it does.
//!
//! YaRN and LongRoPE also multiply the rotation's cos and sin by an attention factor (the
//! kernels' `Rope::scale`). LongRoPE has two lists of per-pair factors, one for contexts up to
//! the original length and one beyond; which one a model uses is fixed by the context it is
//! served with ([`crate::config::ModelConfig::default_context`], or `--max-model-len` through
//! [`crate::LlamaModel::fit_context`]), as llama.cpp chooses it, so every position of every
//! sequence rotates alike and cached keys stay valid. transformers switches per forward, which
//! gives the same frequencies whenever a sequence fits on one side of the boundary.

use ferrite_kernels::cpu::rope::Rope;
use serde_json::Value;

use crate::error::{ModelError, Result};

/// Rope frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.1: long wavelengths divided by `factor`, short kept, smooth in between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: usize,
    },
    /// YaRN (Qwen2.5 and Qwen3 past 32k, DeepSeek): each frequency blended between itself and
    /// itself divided by `factor`, by how many turns it makes in the original length.
    Yarn {
        factor: f32,
        original_max_position: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// Whether the blend's bounds are rounded outwards to whole pairs.
        truncate: bool,
        attention_factor: f32,
    },
    /// LongRoPE (Phi-3.5, Phi-4-mini): each frequency divided by its own factor, from
    /// `short_factor` for contexts up to `original_max_position` and `long_factor` beyond.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position: usize,
        attention_factor: f32,
    },
}

/// What a `rope_scaling` (or `rope_parameters`) object of a `config.json` names, with the
/// config's other keys it may need.
pub(crate) struct HfRope<'a> {
    pub cfg: &'a Value,
    pub rope: Option<&'a Value>,
    pub max_position: usize,
    pub rope_dim: usize,
}

impl HfRope<'_> {
    fn float(&self, k: &str) -> Option<f64> {
        self.rope.and_then(|r| r.get(k)).and_then(Value::as_f64)
    }

    /// The pretraining length: the config's own `original_max_position_embeddings` first (as
    /// Phi-3 writes it), then the scaling's, then `max_position_embeddings`, as transformers.
    fn original_max_position(&self) -> usize {
        let top = self.cfg.get("original_max_position_embeddings");
        let inner = self
            .rope
            .and_then(|r| r.get("original_max_position_embeddings"));
        // An integer, though some configs write it as a float (8192.0).
        let count = |v: &Value| v.as_u64().or_else(|| v.as_f64().map(|f| f as u64));
        top.or(inner)
            .and_then(count)
            .map_or(self.max_position, |v| v as usize)
    }

    /// `factor`, or the ratio of the lengths where the config gives none.
    fn factor(&self, original: usize) -> f64 {
        self.float("factor")
            .unwrap_or(self.max_position as f64 / original as f64)
    }

    fn factors(&self, k: &str) -> Result<Vec<f32>> {
        let list = self.rope.and_then(|r| r.get(k)).and_then(Value::as_array);
        let bad = || ModelError::BadConfig(format!("config.json: LongRoPE `{k}` is not a list"));
        list.ok_or_else(bad)?
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32).ok_or_else(bad))
            .collect()
    }

    /// The scaling the config names (`rope_type`, or the older `type`).
    pub fn scaling(&self) -> Result<RopeScaling> {
        let kind = (self.rope)
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let original = self.original_max_position();
        Ok(match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: self.float("factor").unwrap_or(1.0) as f32,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: self.float("factor").unwrap_or(8.0) as f32,
                low_freq_factor: self.float("low_freq_factor").unwrap_or(1.0) as f32,
                high_freq_factor: self.float("high_freq_factor").unwrap_or(4.0) as f32,
                original_max_position: original,
            },
            "yarn" => self.yarn(original),
            // Phi-3's first 128k checkpoints call it "su".
            "longrope" | "su" => self.longrope(original)?,
            other => {
                return Err(ModelError::BadConfig(format!(
                    "rope scaling `{other}` is not supported (supported: default, linear, \
                     llama3, yarn, longrope)"
                )));
            }
        })
    }

    fn yarn(&self, original: usize) -> RopeScaling {
        let factor = self.factor(original);
        let attention_factor = self.float("attention_factor").unwrap_or_else(|| {
            match (self.float("mscale"), self.float("mscale_all_dim")) {
                (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, all)
                }
                _ => yarn_mscale(factor, 1.0),
            }
        });
        let truncate = (self.rope)
            .and_then(|r| r.get("truncate"))
            .and_then(Value::as_bool)
            .unwrap_or(true);
        RopeScaling::Yarn {
            factor: factor as f32,
            original_max_position: original,
            beta_fast: self.float("beta_fast").unwrap_or(32.0) as f32,
            beta_slow: self.float("beta_slow").unwrap_or(1.0) as f32,
            truncate,
            attention_factor: attention_factor as f32,
        }
    }

    fn longrope(&self, original: usize) -> Result<RopeScaling> {
        let (short_factor, long_factor) =
            (self.factors("short_factor")?, self.factors("long_factor")?);
        let pairs = self.rope_dim / 2;
        if short_factor.len() != pairs || long_factor.len() != pairs {
            return Err(ModelError::BadConfig(format!(
                "config.json: LongRoPE has {} short and {} long factors for {pairs} rotated pairs",
                short_factor.len(),
                long_factor.len()
            )));
        }
        let attention_factor = self
            .float("attention_factor")
            .unwrap_or_else(|| longrope_attention(self.factor(original), original));
        Ok(RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position: original,
            attention_factor: attention_factor as f32,
        })
    }
}

/// YaRN's attention factor for `factor` (transformers' `get_mscale`).
pub(crate) fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

/// LongRoPE's attention factor for contexts `factor` times the original length.
pub(crate) fn longrope_attention(factor: f64, original: usize) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / (original as f64).ln()).sqrt()
    }
}

impl RopeScaling {
    /// Whether a model served with contexts of `context` tokens rotates by LongRoPE's long
    /// factors.
    pub fn long_factors_for(&self, context: usize) -> bool {
        matches!(self, Self::LongRope { original_max_position, .. } if context > *original_max_position)
    }

    /// Checks the numbers a config gave.
    pub(crate) fn validate(&self, rope_dim: usize) -> Result<()> {
        let positive = |v: f32| v.is_finite() && v > 0.0;
        let ok = match self {
            Self::None => true,
            Self::Linear { factor } => positive(*factor),
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                positive(*factor)
                    && positive(*low_freq_factor)
                    && high_freq_factor > low_freq_factor
                    && *original_max_position > 0
            }
            Self::Yarn {
                factor,
                original_max_position,
                beta_fast,
                beta_slow,
                attention_factor,
                ..
            } => {
                positive(*factor)
                    && positive(*beta_fast)
                    && positive(*beta_slow)
                    && positive(*attention_factor)
                    && *original_max_position > 0
            }
            Self::LongRope {
                short_factor,
                long_factor,
                original_max_position,
                attention_factor,
            } => {
                short_factor.len() == rope_dim / 2
                    && long_factor.len() == rope_dim / 2
                    && short_factor.iter().chain(long_factor).all(|f| positive(*f))
                    && positive(*attention_factor)
                    && *original_max_position > 1
            }
        };
        if ok {
            Ok(())
        } else {
            Err(ModelError::BadConfig(format!(
                "rope scaling {self:?} is out of range"
            )))
        }
    }
}

/// A rotary embedding's frequencies, scaled: what the kernels' `Rope` is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Frequencies {
    /// `rope_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Positions are multiplied by this (linear scaling).
    pub position_scale: f32,
    /// Cos and sin are multiplied by this (YaRN's and LongRoPE's attention factor).
    pub scale: f32,
}

impl RopeScaling {
    /// The frequencies of base `theta` over `dim` rotated dimensions, scaled, for a model
    /// served with contexts of `context` tokens (which only LongRoPE reads).
    pub fn frequencies(&self, theta: f32, dim: usize, context: usize) -> Frequencies {
        let mut f = Frequencies {
            inv_freq: Rope::base_inv_freq(theta, dim),
            position_scale: 1.0,
            scale: 1.0,
        };
        match self {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => f.position_scale = 1.0 / factor,
            RopeScaling::Llama3 { .. } => llama3(self, &mut f.inv_freq),
            RopeScaling::Yarn {
                attention_factor, ..
            } => {
                f.inv_freq = yarn(self, theta, dim);
                f.scale = *attention_factor;
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                attention_factor,
                ..
            } => {
                let long = self.long_factors_for(context);
                let factors = if long { long_factor } else { short_factor };
                // transformers: 1 / (factor * base^(2i/dim)), in f32.
                for (i, (x, ext)) in f.inv_freq.iter_mut().zip(factors).enumerate() {
                    *x = 1.0 / (ext * theta.powf((2 * i) as f32 / dim as f32));
                }
                f.scale = *attention_factor;
            }
        }
        f
    }
}

/// transformers' `_compute_llama3_parameters`, in f32 as there.
fn llama3(scaling: &RopeScaling, inv_freq: &mut [f32]) {
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position,
    } = *scaling
    else {
        return;
    };
    let old = original_max_position as f32;
    let low_wavelen = old / low_freq_factor;
    let high_wavelen = old / high_freq_factor;
    for f in inv_freq {
        let wavelen = 2.0 * std::f32::consts::PI / *f;
        let scaled = if wavelen > low_wavelen {
            *f / factor
        } else {
            *f
        };
        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
        *f = if medium {
            (1.0 - smooth) * scaled / factor + smooth * scaled
        } else {
            scaled
        };
    }
}

/// transformers' `_compute_yarn_parameters`: the pairs that turn fewer than `beta_slow` times
/// in the original length are interpolated (divided by `factor`), those turning more than
/// `beta_fast` times kept, and a linear ramp between; the bounds in f64, the blend in f32.
fn yarn(scaling: &RopeScaling, theta: f32, dim: usize) -> Vec<f32> {
    let RopeScaling::Yarn {
        factor,
        original_max_position,
        beta_fast,
        beta_slow,
        truncate,
        ..
    } = *scaling
    else {
        return Rope::base_inv_freq(theta, dim);
    };
    let turns_at = |rotations: f64| {
        let (d, base) = (dim as f64, theta as f64);
        d * (original_max_position as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let (mut low, mut high) = (turns_at(beta_fast as f64), turns_at(beta_slow as f64));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
    if low == high {
        high += 0.001;
    }
    let span = (high - low) as f32;
    (0..dim / 2)
        .map(|i| {
            let pos_freq = theta.powf((2 * i) as f32 / dim as f32);
            let extrapolated = 1.0 / pos_freq;
            let interpolated = 1.0 / (factor * pos_freq);
            let ramp = ((i as f32 - low as f32) / span).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            interpolated * (1.0 - keep) + extrapolated * keep
        })
        .collect()
}
