//! One decoder layer's steps, in order, with tensor parallelism's all-reduce points: the one
//! schedule both backends run, the CPU forward ([`crate::llama`]) and the CUDA runner
//! (`ferrite-gpu`), each through its own [`LayerOps`].
//!
//! A backend says how each step runs (its kernels, fusions and buffers); only
//! [`decoder_layer`] says which steps a layer takes, in what order, and where a rank's partial
//! sums meet its peers'. Under tensor parallelism ([`crate::tp`]) a rank holds its heads' share
//! of q/k/v and o, and its rows' share of gate/up and down: o and down then give partial sums,
//! and the two all-reduces of a layer sit right after them, before anything reads the sum.
//!
//! The state a step reads and writes, by the names the methods use: `x` the hidden states (a
//! layer's input, then its output), `xn` the normed ones, `q`/`k`/`v`, `attn` attention's
//! output, `proj` a projection's output on its way into `x`, `act` the gated activation.

use crate::error::Result;

/// The steps of a decoder layer on one backend (see the module's doc for the state's names).
pub trait LayerOps {
    /// A layer's weights as this backend holds them.
    type Layer;

    /// `xn = attn_norm(x)`. A backend may finish the previous layer's residual add here, fused
    /// with this norm ([`Self::ffn_residual`]).
    fn attn_norm(&mut self, layer: &Self::Layer) -> Result<()>;
    /// `q`, `k`, `v` from `xn`: the projection (this rank's heads), then the bias and per-head
    /// norms where the model has them.
    fn qkv(&mut self, layer: &Self::Layer) -> Result<()>;
    /// Rotary embeddings on `q` and `k`, then this step's `k` and `v` into layer `index`'s
    /// cache.
    fn rope_and_cache(&mut self, index: usize) -> Result<()>;
    /// `attn`: attention of `q` over layer `index`'s cache (this rank's heads).
    fn attention(&mut self, index: usize) -> Result<()>;
    /// `proj = attn · Oᵀ`: under tensor parallelism a partial sum over this rank's heads.
    fn o_proj(&mut self, layer: &Self::Layer) -> Result<()>;
    /// `proj` summed over the pool's ranks (nothing to do on one rank).
    fn all_reduce(&mut self) -> Result<()>;
    /// `x += post_attn_norm(proj)` (`proj` itself where the model has no such norm), then
    /// `xn = ffn_norm(x)`.
    fn attn_residual(&mut self, layer: &Self::Layer) -> Result<()>;
    /// `act = activation(gate) · up`, gate and up projected from `xn` (this rank's rows).
    fn gate_up(&mut self, layer: &Self::Layer) -> Result<()>;
    /// `proj = act · Downᵀ`: under tensor parallelism a partial sum over this rank's rows.
    fn down_proj(&mut self, layer: &Self::Layer) -> Result<()>;
    /// Whether `layer`'s MLP is a mixture of experts ([`crate::moe`]), which takes
    /// [`Self::experts`] in place of [`Self::gate_up`] and [`Self::down_proj`].
    fn sparse(layer: &Self::Layer) -> bool;
    /// `proj = Σ weight · expert(xn)` over each token's routed experts: under tensor
    /// parallelism a partial sum over this rank's rows of each.
    fn experts(&mut self, layer: &Self::Layer) -> Result<()>;
    /// `x += post_ffn_norm(proj)`: the layer's output. A backend may leave the add to the next
    /// norm, which then must do it ([`Self::attn_norm`], or the model's final norm).
    fn ffn_residual(&mut self, layer: &Self::Layer) -> Result<()>;
}

/// Layer `index` of the model, with `layer`'s weights, through `ops`.
pub fn decoder_layer<O: LayerOps>(ops: &mut O, index: usize, layer: &O::Layer) -> Result<()> {
    ops.attn_norm(layer)?;
    ops.qkv(layer)?;
    ops.rope_and_cache(index)?;
    ops.attention(index)?;
    ops.o_proj(layer)?;
    ops.all_reduce()?;
    ops.attn_residual(layer)?;
    if O::sparse(layer) {
        ops.experts(layer)?;
    } else {
        ops.gate_up(layer)?;
        ops.down_proj(layer)?;
    }
    ops.all_reduce()?;
    ops.ffn_residual(layer)
}
