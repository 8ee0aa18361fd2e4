//! Mixture-of-experts MLPs: Mixtral, Qwen2-MoE, Qwen3-MoE and gpt-oss. A sparse layer's MLP is
//! a router (a small `[experts, hidden]` matrix) and a set of experts, each an MLP of its own
//! (gate, up, down); each token goes through the `k` experts the router scores highest, and
//! their outputs are summed weighted by the router's softmax (renormalized over the chosen `k`
//! where the model says so). Qwen2-MoE adds a shared expert every token goes through, behind a
//! sigmoid gate; gpt-oss biases on the router and on each expert's projections (its stacked
//! layout is read by `gpt_oss.rs`).
//!
//! Under tensor parallelism every rank holds every expert, cut as a dense MLP is (gate and up
//! by rows, down by columns: [`crate::tp`]), and the router whole: each rank routes the same
//! tokens the same way (the all-reduce gives every rank the same hidden states), computes its
//! rows of the chosen experts, and the layer's one all-reduce after the MLP sums the parts, as
//! after a dense one. vLLM calls this the TP layout of the experts (its default without
//! expert parallelism).

use std::ops::Range;

use ferrite_formats::{Matrix, TensorMap};
use ferrite_kernels::cpu::add_bias;
use ferrite_kernels::cpu::matmul::MatmulOptions;
use rayon::prelude::*;

use crate::config::{Activation, ModelConfig};
use crate::error::{ModelError, Result};
pub use crate::ffn::{Ffn, FfnBias};
use crate::gpt_oss;
pub use crate::moe_config::{MoeConfig, MoeFamily};
use crate::naming::WeightNaming;
use crate::tp::TpRank;

/// A decoder layer's MLP.
#[derive(Debug, Clone)]
pub enum Mlp {
    Dense(Ffn),
    Sparse(Moe),
}

impl Mlp {
    /// The dense MLP (`None` for a mixture: the caller says what that means to it).
    pub fn dense(&self) -> Option<&Ffn> {
        match self {
            Mlp::Dense(f) => Some(f),
            Mlp::Sparse(_) => None,
        }
    }

    /// Every matrix the MLP multiplies by.
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = self.projections();
        if let Mlp::Sparse(m) = self {
            all.push(&m.router);
        }
        all
    }

    /// Its projections: every matrix but a mixture's router (which stays as stored).
    pub fn projections(&self) -> Vec<&Matrix> {
        match self {
            Mlp::Dense(f) => f.matrices().to_vec(),
            Mlp::Sparse(m) => {
                let shared = m.shared.iter().flat_map(|s| s.ffn.matrices());
                let experts = m.experts.iter().flat_map(Ffn::matrices);
                experts.chain(shared).collect()
            }
        }
    }

    /// The matrices a rank may requantize (the router stays as stored), each with a name.
    pub fn named_mut(&mut self) -> Vec<(String, &mut Matrix)> {
        let names = ["gate", "up", "down"];
        match self {
            Mlp::Dense(f) => names
                .into_iter()
                .map(str::to_owned)
                .zip(f.matrices_mut())
                .collect(),
            Mlp::Sparse(m) => {
                let shared = m
                    .shared
                    .iter_mut()
                    .map(|s| ("shared expert".to_owned(), &mut s.ffn));
                (m.experts.iter_mut().enumerate())
                    .map(|(e, f)| (format!("expert {e}"), f))
                    .chain(shared)
                    .flat_map(|(who, f)| {
                        let names = names.map(|n| format!("{who} {n}"));
                        names.into_iter().zip(f.matrices_mut())
                    })
                    .collect()
            }
        }
    }
}

/// What refuses a mixture of experts says.
pub fn moe_unsupported(what: &str) -> ModelError {
    ModelError::BadConfig(format!(
        "{what} does not take mixture-of-experts models yet (they run on the CPU: --device cpu)"
    ))
}

/// A sparse MLP: the router and the experts (this rank's rows of each).
#[derive(Debug, Clone)]
pub struct Moe {
    /// `[experts, hidden]`, whole on every rank.
    pub router: Matrix,
    /// gpt-oss: the router's bias, added to its logits.
    pub router_bias: Option<Vec<f32>>,
    pub experts: Vec<Ffn>,
    pub experts_per_token: usize,
    pub normalize_top_k: bool,
    /// Qwen2-MoE's shared expert (this rank's rows of it).
    pub shared: Option<SharedExpert>,
}

/// An expert every token goes through, its output scaled by `sigmoid(gate · x)` (Qwen2-MoE).
#[derive(Debug, Clone)]
pub struct SharedExpert {
    pub ffn: Ffn,
    /// `[hidden]`, whole on every rank.
    pub gate: Vec<f32>,
}

impl Moe {
    /// Layer `i`'s experts, each cut to `tp`'s part of its intermediate rows. Hugging Face
    /// checkpoints name each expert's matrices (Mixtral `block_sparse_moe.experts.E.w1/w3/w2`,
    /// Qwen2/3-MoE `mlp.experts.E.gate_proj/up_proj/down_proj`); GGUF stacks them in 3-D
    /// tensors (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`).
    pub(crate) fn load(
        t: &TensorMap,
        n: WeightNaming,
        i: usize,
        c: &ModelConfig,
        moe: &MoeConfig,
        tp: TpRank,
    ) -> Result<Self> {
        let (h, ffn, count) = (c.hidden_size, moe.expert_intermediate_size, moe.num_experts);
        let ffn_part = &tp.part(ffn);
        if gpt_oss::Stack::is_gpt_oss(t, n, i) {
            let stack = gpt_oss::Stack {
                t,
                n,
                layer: i,
                h,
                ffn,
                count,
            };
            let router = stack.router();
            let bias = router.replace(".weight", ".bias");
            return Ok(Moe {
                router: rows(t, &router, count, h)?,
                router_bias: Some(t.vector_of_len(&bias, count)?),
                experts: stack.experts(tp)?,
                experts_per_token: moe.experts_per_token,
                normalize_top_k: moe.normalize_top_k,
                shared: None,
            });
        }
        let (router_name, experts) = match n {
            WeightNaming::Gguf => (
                n.layer(i, "ffn_gate_inp.weight", ""),
                gguf_experts(t, i, h, ffn, count, ffn_part)?,
            ),
            WeightNaming::HuggingFace => {
                let mixtral = t.contains(&n.layer(i, "", "block_sparse_moe.gate.weight"));
                let (block, names) = if mixtral {
                    ("block_sparse_moe", ["w1", "w3", "w2"])
                } else {
                    ("mlp", ["gate_proj", "up_proj", "down_proj"])
                };
                let experts = (0..count)
                    .map(|e| {
                        let name =
                            |m: &str| n.layer(i, "", &format!("{block}.experts.{e}.{m}.weight"));
                        let [g, u, d] = names.map(name);
                        Ok(Ffn {
                            gate: rows(t, &g, ffn, h)?.slice_rows(&g, ffn_part.clone())?,
                            up: rows(t, &u, ffn, h)?.slice_rows(&u, ffn_part.clone())?,
                            down: rows(t, &d, h, ffn)?.slice_cols(&d, ffn_part.clone())?,
                            bias: None,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                (n.layer(i, "", &format!("{block}.gate.weight")), experts)
            }
        };
        let shared = match moe.shared_expert_intermediate_size {
            Some(size) => Some(SharedExpert::load(t, n, i, h, size, &tp.part(size))?),
            None => None,
        };
        // llama.cpp's gpt-oss: a bias beside the router and each stack.
        let bias = router_name.replace(".weight", ".bias");
        let (router_bias, experts) = match n == WeightNaming::Gguf && t.contains(&bias) {
            true => (
                Some(t.vector_of_len(&bias, count)?),
                gguf_expert_biases(t, i, (h, ffn, count), tp, experts)?,
            ),
            false => (None, experts),
        };
        Ok(Moe {
            router: rows(t, &router_name, count, h)?,
            router_bias,
            experts,
            experts_per_token: moe.experts_per_token,
            normalize_top_k: moe.normalize_top_k,
            shared,
        })
    }

    /// `proj = Σ weight · expert(xn)` over each of the `n_tok` tokens' chosen experts.
    ///
    /// Experts chosen by the same tokens (at one decode token, all of them) take their gate and
    /// up products in one call over the same input: one fork and join, its tasks spread over
    /// every expert's rows. Apart, eight experts of a few MB each split worse over the cores
    /// than one dense MLP of the same bytes (0.72x its speed at batch 1 on 2 cores; together,
    /// level with it). The down products, each over its own expert's activations, run side by
    /// side. Outputs are added in the order of the experts, so the sum does not depend on the
    /// threads.
    pub(crate) fn forward(
        &self,
        xn: &[f32],
        n_tok: usize,
        mm: MatmulOptions,
        act: Activation,
        proj: &mut [f32],
    ) {
        let h = self.router.cols;
        let routes = self.route(xn, n_tok, mm);
        let busy = self.by_expert(&routes);
        let groups = same_token_groups(&busy);
        let mut acts: Vec<(usize, Vec<f32>)> = groups
            .par_iter()
            .flat_map_iter(|g| gated(&busy, g, xn, h, mm, act))
            .collect();
        acts.sort_by_key(|a| a.0);
        let outputs: Vec<Vec<f32>> = (busy.par_iter().zip(acts))
            .map(|((expert, mine), (_, a))| {
                let mut y = vec![0f32; mine.len() * h];
                mm.one(&a, mine.len(), expert.down.view(), &mut y);
                if let Some(b) = expert.bias.as_ref().and_then(|b| b.down.as_ref()) {
                    add_bias(&mut y, b);
                }
                y
            })
            .collect();
        proj.fill(0.0);
        for ((_, mine), y) in busy.iter().zip(outputs) {
            for (&(t, w), y) in mine.iter().zip(y.chunks_exact(h)) {
                for (p, y) in proj[t * h..(t + 1) * h].iter_mut().zip(y) {
                    *p += w * y;
                }
            }
        }
        if let Some(shared) = &self.shared {
            shared.add_to(xn, n_tok, mm, act, proj);
        }
    }

    /// The experts `routes` chose, in order, each with its tokens and their weights.
    fn by_expert(&self, routes: &[Vec<(usize, f32)>]) -> Vec<(&Ffn, Vec<(usize, f32)>)> {
        let mut tokens: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.experts.len()];
        for (t, chosen) in routes.iter().enumerate() {
            for &(e, w) in chosen {
                tokens[e].push((t, w));
            }
        }
        (self.experts.iter().zip(tokens))
            .filter(|(_, mine)| !mine.is_empty())
            .collect()
    }

    /// Each token's chosen experts with their weights: the router's softmax in f32 over exact
    /// activations (a rounded input could flip a near tie, and with it the expert), the `k`
    /// highest (the lower index first among equals, as `torch.topk`), renormalized where the
    /// model says.
    fn route(&self, xn: &[f32], n_tok: usize, mm: MatmulOptions) -> Vec<Vec<(usize, f32)>> {
        let count = self.router.rows;
        let mut logits = vec![0f32; n_tok * count];
        mm.exact().one(xn, n_tok, self.router.view(), &mut logits);
        if let Some(b) = &self.router_bias {
            add_bias(&mut logits, b);
        }
        logits
            .chunks_exact(count)
            .map(|row| top_k(row, self.experts_per_token, self.normalize_top_k))
            .collect()
    }
}

/// `busy`'s experts (by index) grouped by the tokens that chose them, in order within each.
fn same_token_groups(busy: &[(&Ffn, Vec<(usize, f32)>)]) -> Vec<Vec<usize>> {
    let same = |a: &[(usize, f32)], b: &[(usize, f32)]| {
        a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.0 == b.0)
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, (_, mine)) in busy.iter().enumerate() {
        match groups.iter_mut().find(|g| same(&busy[g[0]].1, mine)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// `act(gate) * up` of each expert of `group` (indices into `busy`, all chosen by the same
/// tokens) over those tokens' rows of `xn`: one product call for the whole group.
fn gated(
    busy: &[(&Ffn, Vec<(usize, f32)>)],
    group: &[usize],
    xn: &[f32],
    h: usize,
    mm: MatmulOptions,
    act: Activation,
) -> Vec<(usize, Vec<f32>)> {
    let mine = &busy[group[0]].1;
    let m = mine.len();
    let x: Vec<f32> = (mine.iter())
        .flat_map(|&(t, _)| &xn[t * h..(t + 1) * h])
        .copied()
        .collect();
    let experts = group.iter().map(|&i| busy[i].0);
    let ws: Vec<_> = (experts.clone())
        .flat_map(|e| [e.gate.view(), e.up.view()])
        .collect();
    let mut outs: Vec<Vec<f32>> = experts
        .flat_map(|e| [vec![0f32; m * e.gate.rows], vec![0f32; m * e.up.rows]])
        .collect();
    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
    mm.many(&x, m, &ws, &mut refs);
    let mut outs = outs.into_iter();
    group
        .iter()
        .map(|&i| {
            let (mut gate, mut up) = (
                outs.next().unwrap_or_default(),
                outs.next().unwrap_or_default(),
            );
            if let Some(b) = &busy[i].0.bias {
                add_bias(&mut gate, &b.gate);
                add_bias(&mut up, &b.up);
            }
            act.gated_in_place(&mut gate, &up);
            (i, gate)
        })
        .collect()
}

/// The `k` most likely of `logits` under their softmax, with their probabilities (summing to
/// 1 where `normalize`).
pub(crate) fn top_k(logits: &[f32], k: usize, normalize: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]).then(a.cmp(&b)));
    let mut chosen: Vec<(usize, f32)> = order[..k].iter().map(|&e| (e, exp[e] / sum)).collect();
    if normalize {
        let total: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= total);
    }
    chosen
}

impl SharedExpert {
    /// Layer `i`'s shared expert of intermediate size `size`, cut to `part` of it: Hugging
    /// Face's `mlp.shared_expert.*_proj` and `mlp.shared_expert_gate` (`[1, hidden]`), GGUF's
    /// `ffn_*_shexp` and `ffn_gate_inp_shexp` (`[hidden]`).
    fn load(
        t: &TensorMap,
        n: WeightNaming,
        i: usize,
        h: usize,
        size: usize,
        part: &Range<usize>,
    ) -> Result<Self> {
        let name = |gguf: &str, hf: &str| n.layer(i, gguf, hf);
        let [g, u, d] = [
            name(
                "ffn_gate_shexp.weight",
                "mlp.shared_expert.gate_proj.weight",
            ),
            name("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
            name(
                "ffn_down_shexp.weight",
                "mlp.shared_expert.down_proj.weight",
            ),
        ];
        let gate = name("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight");
        Ok(SharedExpert {
            ffn: Ffn {
                gate: rows(t, &g, size, h)?.slice_rows(&g, part.clone())?,
                up: rows(t, &u, size, h)?.slice_rows(&u, part.clone())?,
                down: rows(t, &d, h, size)?.slice_cols(&d, part.clone())?,
                bias: None,
            },
            gate: t.vector_of_len(&gate, h)?,
        })
    }

    /// `proj += sigmoid(gate · xn) * ffn(xn)` for each of the `n_tok` tokens.
    fn add_to(
        &self,
        xn: &[f32],
        n_tok: usize,
        mm: MatmulOptions,
        act: Activation,
        proj: &mut [f32],
    ) {
        let h = self.gate.len();
        let f = &self.ffn;
        let (mut gate, mut up) = (
            vec![0f32; n_tok * f.gate.rows],
            vec![0f32; n_tok * f.up.rows],
        );
        mm.many(
            xn,
            n_tok,
            &[f.gate.view(), f.up.view()],
            &mut [&mut gate, &mut up],
        );
        act.gated_in_place(&mut gate, &up);
        let mut y = vec![0f32; n_tok * h];
        mm.one(&gate, n_tok, f.down.view(), &mut y);
        for ((p, y), x) in (proj.chunks_exact_mut(h).zip(y.chunks_exact(h))).zip(xn.chunks_exact(h))
        {
            let g: f32 = x.iter().zip(&self.gate).map(|(x, w)| x * w).sum();
            let scale = 1.0 / (1.0 + (-g).exp());
            p.iter_mut().zip(y).for_each(|(p, y)| *p += scale * y);
        }
    }
}

/// A 2-D tensor `name` of shape `[rows, cols]`.
fn rows(t: &TensorMap, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
    Ok(t.matrix(name)?.expect_shape(name, rows, cols)?)
}

/// Layer `i`'s experts from GGUF's stacks: `ffn_gate_exps`/`ffn_up_exps` `[experts, ffn,
/// hidden]` and `ffn_down_exps` `[experts, hidden, ffn]` (row-major), each expert a run of
/// rows of the stack seen as a matrix.
fn gguf_experts(
    t: &TensorMap,
    i: usize,
    h: usize,
    ffn: usize,
    count: usize,
    ffn_part: &Range<usize>,
) -> Result<Vec<Ffn>> {
    let stack = |name: &str, rows: usize, cols: usize| -> Result<(String, Matrix)> {
        let name = format!("blk.{i}.{name}");
        let m = t.stacked_matrix(&name, count)?;
        Ok((name.clone(), m.expect_shape(&name, count * rows, cols)?))
    };
    let (gn, gate) = stack("ffn_gate_exps.weight", ffn, h)?;
    let (un, up) = stack("ffn_up_exps.weight", ffn, h)?;
    let (dn, down) = stack("ffn_down_exps.weight", h, ffn)?;
    let shift = |r: &Range<usize>, e: usize, n: usize| e * n + r.start..e * n + r.end;
    (0..count)
        .map(|e| {
            Ok(Ffn {
                gate: gate.slice_rows(&gn, shift(ffn_part, e, ffn))?,
                up: up.slice_rows(&un, shift(ffn_part, e, ffn))?,
                down: down
                    .slice_rows(&dn, shift(&(0..h), e, h))?
                    .slice_cols(&dn, ffn_part.clone())?,
                bias: None,
            })
        })
        .collect()
}

/// `experts` with layer `i`'s biases from GGUF's stacks `ffn_{gate,up,down}_exps.bias`
/// (`[experts, ffn]`, and `[experts, hidden]` for down: on rank 0 alone, the ranks' parts
/// being summed after it).
fn gguf_expert_biases(
    t: &TensorMap,
    i: usize,
    (h, ffn, count): (usize, usize, usize),
    tp: TpRank,
    experts: Vec<Ffn>,
) -> Result<Vec<Ffn>> {
    let stack = |name: &str, len: usize| t.vector_of_len(&format!("blk.{i}.{name}"), count * len);
    let (gate, up) = (
        stack("ffn_gate_exps.bias", ffn)?,
        stack("ffn_up_exps.bias", ffn)?,
    );
    let down = stack("ffn_down_exps.bias", h)?;
    let part = tp.part(ffn);
    let mine = |v: &[f32], e: usize| v[e * ffn + part.start..e * ffn + part.end].to_vec();
    let with = |(e, f): (usize, Ffn)| Ffn {
        bias: Some(Box::new(FfnBias {
            gate: mine(&gate, e),
            up: mine(&up, e),
            down: (tp.rank == 0).then(|| down[e * h..(e + 1) * h].to_vec()),
        })),
        ..f
    };
    Ok(experts.into_iter().enumerate().map(with).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_takes_the_highest_lower_index_first_and_renormalizes() {
        let logits = [0.0, 2.0, 1.0, 2.0];
        let raw = top_k(&logits, 2, false);
        assert_eq!(raw.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
        let sum: f32 = logits.iter().map(|l: &f32| l.exp()).sum();
        assert!((raw[0].1 - 2f32.exp() / sum).abs() < 1e-6);
        let norm = top_k(&logits, 2, true);
        assert_eq!(norm.iter().map(|c| c.1).collect::<Vec<_>>(), [0.5, 0.5]);
        let one = top_k(&logits, 3, true);
        assert_eq!(one.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3, 2]);
        assert!((one.iter().map(|c| c.1).sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
