//! The CPU's steps of a decoder layer ([`LayerOps`]): the kernels of `ferrite-kernels`' `cpu`
//! and `quant` modules over the f32 [`LayerBuffers`], with the offline tools' tap on each
//! projection's input. The order of the steps is [`crate::schedule`]'s.

use ferrite_collective::Collective;
use ferrite_kernels::cpu::attention::AttentionOptions;
use ferrite_kernels::cpu::matmul::MatmulOptions;
use ferrite_kernels::cpu::{add_bias, add_in_place, rms_norm, rms_norm_in_place};

use super::{Layer, LayerAt, LayerBuffers, LlamaModel, Site};
use crate::error::{ModelError, Result};
use crate::kv::KvCache;
use crate::lora::Proj;
use crate::moe::Mlp;
use crate::schedule::LayerOps;

/// One layer's forward on the CPU: where it runs, over what, and how its matmuls round.
pub(super) struct CpuLayer<'m, 'a> {
    pub model: &'m LlamaModel,
    pub at: &'a LayerAt<'a>,
    pub b: &'a mut LayerBuffers,
    pub kv: &'a mut KvCache,
    pub comm: &'a mut dyn Collective,
    pub tap: &'a mut dyn FnMut(Site, &[f32]),
    pub mm: MatmulOptions,
}

impl<'m, 'a> CpuLayer<'m, 'a> {
    fn n_tok(&self) -> usize {
        self.at.positions.len()
    }

    fn eps(&self) -> f32 {
        self.model.cfg.rms_norm_eps
    }

    /// The step's LoRA adapters, to add their changes to the projections' outputs.
    fn lora(&self) -> Lora<'m, 'a> {
        Lora {
            model: self.model,
            at: self.at,
            mm: self.mm.fine(),
        }
    }
}

/// The LoRA adapters of a layer's step ([`LayerAt::lora`]), computed in f32 whatever the
/// step's activations are: the change an adapter makes is small, and rounding it would save
/// nothing worth its error.
#[derive(Clone, Copy)]
struct Lora<'m, 'a> {
    model: &'m LlamaModel,
    at: &'a LayerAt<'a>,
    mm: MatmulOptions,
}

impl Lora<'_, '_> {
    /// Adds the adapters' change of `proj` to its output `out`, for its input `x`.
    fn add(self, proj: Proj, x: &[f32], out: &mut [f32]) {
        if self.at.lora.is_empty() {
            return;
        }
        let n = self.at.positions.len();
        let at = (self.at.index, proj);
        (self.model.lora).add(self.at.lora, at, (x, n), out, self.mm);
    }
}

/// `xn = norm(x)`, or `x` itself where the layer has no such norm (OLMo 2).
fn pre_norm(x: &[f32], norm: Option<&[f32]>, eps: f32, xn: &mut [f32]) {
    match norm {
        Some(w) => rms_norm(x, w, eps, xn),
        None => xn.copy_from_slice(x),
    }
}

/// `x += scale · branch` (Granite's `residual_multiplier`; 1 elsewhere, where `branch` is
/// added as it is). The product is rounded before the add, as transformers computes it.
fn residual_add(x: &mut [f32], branch: &mut [f32], scale: f32) {
    if scale != 1.0 {
        branch.iter_mut().for_each(|v| *v *= scale);
    }
    add_in_place(x, branch);
}

/// `layer`'s dense MLP: the schedule asks a sparse layer for its experts instead.
fn dense(layer: &Layer) -> Result<&crate::moe::Ffn> {
    (layer.mlp.dense()).ok_or_else(|| ModelError::Internal("a dense step of a sparse layer".into()))
}

impl LayerOps for CpuLayer<'_, '_> {
    type Layer = Layer;

    fn attn_norm(&mut self, layer: &Layer) -> Result<()> {
        pre_norm(
            &self.b.x,
            layer.attn_norm.as_deref(),
            self.eps(),
            &mut self.b.xn,
        );
        Ok(())
    }

    fn qkv(&mut self, layer: &Layer) -> Result<()> {
        let (n_tok, eps, lora) = (self.n_tok(), self.eps(), self.lora());
        let b = &mut *self.b;
        (self.tap)(Site::Qkv, &b.xn);
        self.mm.many(
            &b.xn,
            n_tok,
            &[layer.q.view(), layer.k.view(), layer.v.view()],
            &mut [&mut b.q, &mut b.k, &mut b.v],
        );
        lora.add(Proj::Q, &b.xn, &mut b.q);
        lora.add(Proj::K, &b.xn, &mut b.k);
        lora.add(Proj::V, &b.xn, &mut b.v);
        if let Some([bq, bk, bv]) = &layer.qkv_bias {
            add_bias(&mut b.q, bq);
            add_bias(&mut b.k, bk);
            add_bias(&mut b.v, bv);
        }
        if let Some([nq, nk]) = &layer.qk_norm {
            rms_norm_in_place(&mut b.q, nq, eps);
            rms_norm_in_place(&mut b.k, nk, eps);
        }
        Ok(())
    }

    fn rope_and_cache(&mut self, index: usize) -> Result<()> {
        let (c, b) = (&self.model.cfg, &mut *self.b);
        let kv_dim = c.kv_dim();
        if c.rotates[index] {
            let rope = self.model.rope_of(index);
            rope.apply(&mut b.q, self.at.positions, c.num_heads);
            rope.apply(&mut b.k, self.at.positions, c.num_kv_heads);
        }
        for (t, qt) in self.at.query_tokens.iter().enumerate() {
            let rows = t * kv_dim..(t + 1) * kv_dim;
            let (k, v) = (&b.k[rows.clone()], &b.v[rows]);
            self.kv.write(index, qt.block_table, qt.pos, k, v);
        }
        Ok(())
    }

    fn attention(&mut self, index: usize) -> Result<()> {
        let c = &self.model.cfg;
        let options = AttentionOptions {
            scale: c.attention_scale,
            soft_cap: c.attn_logit_softcap,
            sliding_window: c.attention_window[index],
            sinks: self.model.layers[index].sinks.as_deref(),
        };
        let (q, attn) = (&self.b.q, &mut self.b.attn);
        let queries = (q.as_slice(), self.at.query_tokens, c.num_heads);
        self.kv.attend(index, queries, options, attn);
        Ok(())
    }

    fn o_proj(&mut self, layer: &Layer) -> Result<()> {
        let (n_tok, lora) = (self.n_tok(), self.lora());
        let b = &mut *self.b;
        (self.tap)(Site::O, &b.attn);
        self.mm.one(&b.attn, n_tok, layer.o.view(), &mut b.proj);
        lora.add(Proj::O, &b.attn, &mut b.proj);
        if let Some(bias) = &layer.o_bias {
            add_bias(&mut b.proj, bias);
        }
        Ok(())
    }

    fn all_reduce(&mut self) -> Result<()> {
        Ok(self.comm.all_reduce_sum(&mut self.b.proj)?)
    }

    fn attn_residual(&mut self, layer: &Layer) -> Result<()> {
        let (eps, b) = (self.eps(), &mut *self.b);
        if let Some([post_attn, _]) = &layer.post_norms {
            rms_norm_in_place(&mut b.proj, post_attn, eps);
        }
        residual_add(&mut b.x, &mut b.proj, self.model.cfg.residual_scale);
        pre_norm(&b.x, layer.ffn_norm.as_deref(), eps, &mut b.xn);
        Ok(())
    }

    fn gate_up(&mut self, layer: &Layer) -> Result<()> {
        let (n_tok, lora) = (self.n_tok(), self.lora());
        let b = &mut *self.b;
        let f = dense(layer)?;
        (self.tap)(Site::GateUp, &b.xn);
        self.mm.many(
            &b.xn,
            n_tok,
            &[f.gate.view(), f.up.view()],
            &mut [&mut b.gate, &mut b.up],
        );
        lora.add(Proj::Gate, &b.xn, &mut b.gate);
        lora.add(Proj::Up, &b.xn, &mut b.up);
        self.model.cfg.activation.gated_in_place(&mut b.gate, &b.up);
        Ok(())
    }

    fn down_proj(&mut self, layer: &Layer) -> Result<()> {
        let (n_tok, lora) = (self.n_tok(), self.lora());
        let b = &mut *self.b;
        let f = dense(layer)?;
        (self.tap)(Site::Down, &b.gate);
        self.mm.one(&b.gate, n_tok, f.down.view(), &mut b.proj);
        lora.add(Proj::Down, &b.gate, &mut b.proj);
        Ok(())
    }

    fn sparse(layer: &Layer) -> bool {
        matches!(layer.mlp, Mlp::Sparse(_))
    }

    fn experts(&mut self, layer: &Layer) -> Result<()> {
        let Mlp::Sparse(moe) = &layer.mlp else {
            return Err(ModelError::Internal("experts of a dense layer".into()));
        };
        let (n_tok, b) = (self.n_tok(), &mut *self.b);
        (self.tap)(Site::GateUp, &b.xn);
        let act = self.model.cfg.activation;
        moe.forward(&b.xn, n_tok, self.mm, act, &mut b.proj);
        Ok(())
    }

    fn ffn_residual(&mut self, layer: &Layer) -> Result<()> {
        let (eps, b) = (self.eps(), &mut *self.b);
        if let Some([_, post_ffn]) = &layer.post_norms {
            rms_norm_in_place(&mut b.proj, post_ffn, eps);
        }
        residual_add(&mut b.x, &mut b.proj, self.model.cfg.residual_scale);
        Ok(())
    }
}
