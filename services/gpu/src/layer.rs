//! The GPU's steps of a decoder layer ([`LayerOps`]): the CUDA kernels over the runner's device
//! buffers, queued on its stream (or recorded into a graph being captured). The order of the
//! steps is `ferrite_model::schedule`'s, the same as the CPU forward's.
//!
//! Five fusions shape the split: the residual add of a layer's output happens in the next
//! norm (`pending`, [`NormKind::AddThenNorm`]); a norm read by a W8A8 projection also rounds
//! its output to int8 for it (`xn_int8`); q, k and v are one projection into one buffer
//! (`qkv`), as are gate and up; the rope launch also writes the KV cache; and where the down
//! projection runs as a GEMV (decode), that GEMV computes the gated activation from the
//! gate|up buffer as it loads it, and the activation kernel is not launched
//! ([`DeviceLayers::fused_down`]).

use std::sync::OnceLock;

use ferrite_collective::Collective;
use ferrite_kernels::cuda::attention::{DecodeScratch, PagedAttention};
use ferrite_kernels::cuda::gemm::{Linear, dense_gemv_takes};
use ferrite_kernels::cuda::ops::{CacheWrite, NormKind, NormShape, RopeShape};
use ferrite_kernels::cuda::wq_mma::WqKernel;
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_model::config::Activation;
use ferrite_model::error::{ModelError, Result};
use ferrite_model::schedule::LayerOps;

use super::{DeviceBatch, GpuRunner};
use crate::matrix::DeviceMatrix;
use crate::weights::GpuLayer;

/// Which down projections' GEMVs compute the gated activation themselves
/// (`FERRITE_FUSE_ACT`, read once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FuseAct {
    /// None (`0`): the activation kernel, then the plain GEMV; for A/B runs on one machine
    /// (tests/gpu/host.sh).
    Off,
    /// The default: f16/bf16 weights only. Each of a GEMV's blocks computes the activations of
    /// every column it reads, so the arithmetic per weight byte grows as the weights shrink;
    /// on paper it stays within what the dense GEMV can issue at HBM speed (about 8
    /// activations per lane per KiB step), and not within it for 4-bit codes (about 32).
    Dense,
    /// Quantized weights too (`all`), until the runbook's `ab` stage has timed them.
    All,
}

fn fuse_act() -> FuseAct {
    static FUSE: OnceLock<FuseAct> = OnceLock::new();
    *FUSE.get_or_init(|| match std::env::var("FERRITE_FUSE_ACT").as_deref() {
        Ok("0" | "off") => FuseAct::Off,
        Ok("all") => FuseAct::All,
        _ => FuseAct::Dense,
    })
}

/// One step's layers on the device.
pub(super) struct DeviceLayers<'a> {
    r: &'a GpuRunner,
    g: &'a Gpu,
    p: &'a DeviceBatch,
    comm: &'a mut dyn Collective,
    /// Whether `proj` still has to be added into the residual stream `x`: the previous
    /// layer's output, added by the norm that follows it.
    pending: bool,
    /// Whether the last norm also rounded `xn` to int8 for the W8A8 projection that reads it
    /// (into the runner's 8-bit scratch), so that projection skips its own rounding.
    xn_int8: bool,
}

#[allow(unsafe_code)]
impl<'a> DeviceLayers<'a> {
    /// The layers of step `p` on `r`'s buffers.
    ///
    /// # Safety
    /// As [`GpuRunner::run`]: every buffer of `r` was sized for its limits, which `p` was
    /// checked against, and the packed metadata of `p` is on the device at `r.meta`.
    pub unsafe fn new(
        r: &'a GpuRunner,
        g: &'a Gpu,
        p: &'a DeviceBatch,
        comm: &'a mut dyn Collective,
    ) -> Self {
        Self {
            r,
            g,
            p,
            comm,
            pending: false,
            xn_int8: false,
        }
    }

    /// The packed metadata's array at element `at`.
    pub fn meta(&self, at: usize) -> DevPtr {
        self.r.meta_ptr.offset::<i32>(at)
    }

    fn norm(&self) -> NormShape {
        let c = &self.r.w.cfg;
        NormShape {
            rows: self.p.n_tokens,
            hidden: c.hidden_size,
            eps: c.rms_norm_eps,
            weight_offset: 0.0,
        }
    }

    /// `t` rows of `x` (rows `k` apart) times an `[n, k]` matrix.
    fn lin(&self, n: usize, k: usize) -> Linear {
        Linear {
            m: self.p.n_tokens,
            n,
            k,
            x_stride: k,
            out_stride: n,
        }
    }

    /// The down projection's shape when it reads the gate|up buffer itself (rows `2 · d_ff`
    /// apart), computing the gated activation as it loads: where `down` runs as one of the
    /// GEMVs at this step's rows (the dense one, [`dense_gemv_takes`]; the weight-only one,
    /// [`WqKernel::choose`]) and [`fuse_act`] allows it. `None`: the activation kernel writes
    /// `act` and the down projection reads that (prefill; W8A8 and FP8, whose kernels round
    /// their input to 8 bits; the tensor-core and cuBLAS paths).
    ///
    /// `gate_up` (to skip the activation kernel) and `down_proj` (to launch the fused GEMV)
    /// both ask this, so they cannot disagree. It depends on the step's rows and the weights
    /// alone: a CUDA graph, captured for a fixed number of rows, records one choice for good.
    fn fused_down(&self, down: &DeviceMatrix) -> Option<Linear> {
        let (r, c) = (self.r, &self.r.w.cfg);
        let ff = c.intermediate_size;
        let shape = Linear {
            x_stride: 2 * ff,
            ..self.lin(c.hidden_size, ff)
        };
        let fuse = fuse_act();
        let gemv = match down {
            DeviceMatrix::Dense(t) => {
                fuse != FuseAct::Off && dense_gemv_takes(&shape, r.gate_up.ptr, t.ptr)
            }
            DeviceMatrix::Quantized { w, .. } => {
                fuse == FuseAct::All && WqKernel::choose(shape.m, w) == WqKernel::Gemv
            }
            DeviceMatrix::Int8 { .. } | DeviceMatrix::Fp8 { .. } => false,
        };
        gemv.then_some(shape)
    }

    /// `proj = act(gate) · up · downᵀ` from the gate|up buffer by the GEMV that computes the
    /// activation as it loads, at the shape [`Self::fused_down`] gave.
    ///
    /// # Safety
    /// As [`Self::new`].
    unsafe fn down_from_gate_up(&self, down: &DeviceMatrix, shape: Linear) -> Result<()> {
        let (r, g) = (self.r, self.g);
        let (dt, out, gu) = (r.w.dtype, r.proj.ptr, r.gate_up.ptr);
        let gelu = r.w.cfg.activation == Activation::GeluTanh;
        // SAFETY: `new`'s contract: `gate_up` holds the step's rows of 2 · d_ff, `proj` of
        // hidden; the matrix is the down projection's.
        unsafe {
            match down {
                DeviceMatrix::Dense(t) => g.linear_gated(dt, gelu, out, gu, t.ptr, shape)?,
                DeviceMatrix::Quantized { w, mins, .. } => {
                    let mins = mins.as_ref().map(|t| t.ptr);
                    g.wq_gemv_gated(dt, gelu, out, gu, w, shape.m, mins)?
                }
                DeviceMatrix::Int8 { .. } | DeviceMatrix::Fp8 { .. } => {
                    let what = "no GEMV reads the gate|up buffer for 8-bit weights";
                    return Err(ModelError::Internal(what.into()));
                }
            }
        }
        Ok(())
    }

    /// `xn = norm(x)` with `weight`, first adding `proj` into `x` when an add is pending (the
    /// model's final norm runs it too). Where `next`, the projection that reads `xn`, is W8A8,
    /// the norm also rounds `xn` to int8 for it.
    pub fn pre_norm(&mut self, weight: DevPtr, next: Option<&DeviceMatrix>) -> Result<()> {
        let r = self.r;
        let (kind, input) = if self.pending {
            (NormKind::AddThenNorm, r.proj.ptr)
        } else {
            (NormKind::Plain, r.x.ptr)
        };
        self.pending = false;
        let int8 = match next {
            Some(DeviceMatrix::Int8 { .. }) => Some(r.rounding_scratch()?),
            _ => None,
        };
        self.xn_int8 = int8.is_some();
        let (dt, h, g) = (r.w.dtype, r.w.cfg.hidden_size, self.g);
        let (xn, x, shape) = (r.xn.ptr, r.x.ptr, self.norm());
        // SAFETY: `new`'s contract: the buffers hold the step's rows; the 8-bit scratch holds
        // the step's rows of the widest 8-bit input.
        unsafe { g.rms_norm_int8(dt, kind, xn, x, input, h, weight, shape, int8)? };
        Ok(())
    }

    /// `x += norm(proj)` with `weight` (Gemma 2's norms after attention and the MLP).
    fn norm_then_add(&mut self, weight: DevPtr) -> Result<()> {
        let r = self.r;
        let (dt, h) = (r.w.dtype, r.w.cfg.hidden_size);
        let (xn, x, proj) = (r.xn.ptr, r.x.ptr, r.proj.ptr);
        // SAFETY: as in `pre_norm`.
        unsafe {
            self.g.rms_norm(
                dt,
                NormKind::NormThenAdd,
                xn,
                x,
                proj,
                h,
                weight,
                self.norm(),
            )?
        };
        Ok(())
    }
}

#[allow(unsafe_code)]
impl LayerOps for DeviceLayers<'_> {
    type Layer = GpuLayer;

    fn attn_norm(&mut self, l: &GpuLayer) -> Result<()> {
        self.pre_norm(l.attn_norm.ptr, Some(&l.qkv))
    }

    fn qkv(&mut self, l: &GpuLayer) -> Result<()> {
        let (r, g, c) = (self.r, self.g, &self.r.w.cfg);
        let (dt, t, h, qkv) = (r.w.dtype, self.p.n_tokens, c.hidden_size, r.qkv.ptr);
        let qkv_w = c.q_dim() + 2 * c.kv_dim();
        let k = qkv.offset::<u16>(c.q_dim());
        let eps = c.rms_norm_eps;
        // SAFETY: `new`'s contract: the buffers hold the step's rows.
        unsafe {
            r.project(g, qkv, r.xn.ptr, &l.qkv, self.lin(qkv_w, h), self.xn_int8)?;
            if let Some(b) = &l.qkv_bias {
                g.add_bias(dt, qkv, qkv_w, b.ptr, t, qkv_w)?;
            }
            if let Some([nq, nk]) = &l.qk_norm {
                let head = c.head_dim;
                g.head_rms_norm(dt, qkv, qkv_w, nq.ptr, t, c.num_heads, head, eps, 0.0)?;
                g.head_rms_norm(dt, k, qkv_w, nk.ptr, t, c.num_kv_heads, head, eps, 0.0)?;
            }
        }
        Ok(())
    }

    fn rope_and_cache(&mut self, index: usize) -> Result<()> {
        let (r, g, c, p) = (self.r, self.g, &self.r.w.cfg, self.p);
        let (dt, qkv) = (r.w.dtype, r.qkv.ptr);
        let qkv_w = c.q_dim() + 2 * c.kv_dim();
        let k = qkv.offset::<u16>(c.q_dim());
        let v = qkv.offset::<u16>(c.q_dim() + c.kv_dim());
        let freqs = r.w.rope_of(index);
        let rope = RopeShape {
            tokens: p.n_tokens,
            q_stride: qkv_w,
            k_stride: qkv_w,
            n_heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            // A layer without rotation (SmolLM3's NoPE) rotates no pair: the launch only
            // writes the cache.
            rope_dim: if c.rotates[index] { c.rope_dim } else { 0 },
            position_scale: freqs.position_scale,
            scale: freqs.scale,
            adjacent: r.w.adjacent_rope,
        };
        let cache = CacheWrite {
            k_cache: r.kv.k[index].ptr,
            v_cache: r.kv.v[index].ptr,
            v,
            v_stride: qkv_w,
            slots: self.meta(p.off.slots),
        };
        let positions = self.meta(p.off.positions);
        // SAFETY: as in `qkv`; the slots address this layer's cache.
        unsafe { g.rope_then_cache(dt, qkv, k, positions, freqs.inv_freq_ptr, rope, Some(cache))? };
        Ok(())
    }

    fn attention(&mut self, index: usize) -> Result<()> {
        let (r, g, c, p) = (self.r, self.g, &self.r.w.cfg, self.p);
        let (dt, qkv, attn) = (r.w.dtype, r.qkv.ptr, r.attn.ptr);
        let (q_dim, qkv_w) = (c.q_dim(), c.q_dim() + 2 * c.kv_dim());
        let a = PagedAttention {
            k_cache: r.kv.k[index].ptr,
            v_cache: r.kv.v[index].ptr,
            block_tables: self.meta(p.off.tables),
            max_blocks: p.max_blocks,
            context_lens: self.meta(p.off.context),
            n_seqs: p.n_seqs,
            n_heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: r.limits.block_size,
            scale: c.attention_scale,
            soft_cap: c.attn_logit_softcap.unwrap_or(0.0),
            window: c
                .attention_window
                .get(index)
                .copied()
                .flatten()
                .unwrap_or(0),
        };
        // SAFETY: as in `qkv`; the block tables address the cache's blocks.
        unsafe {
            if p.max_q == 1 {
                let scratch = DecodeScratch {
                    part_out: r.part_out.ptr,
                    part_max: r.part_max.ptr,
                    part_sum: r.part_sum.ptr,
                    counters: r.part_done.ptr,
                    n_parts: r.n_parts,
                };
                g.attention_decode(dt, attn, q_dim, qkv, qkv_w, &a, &scratch)?;
            } else {
                let starts = self.meta(p.off.starts);
                g.attention_prefill(dt, attn, q_dim, qkv, qkv_w, starts, p.max_q, &a)?;
            }
        }
        Ok(())
    }

    fn o_proj(&mut self, l: &GpuLayer) -> Result<()> {
        let (r, c) = (self.r, &self.r.w.cfg);
        let shape = self.lin(c.hidden_size, c.q_dim());
        // SAFETY: as in `qkv`.
        unsafe { r.project(self.g, r.proj.ptr, r.attn.ptr, &l.o, shape, false)? };
        Ok(())
    }

    fn all_reduce(&mut self) -> Result<()> {
        let (r, len) = (self.r, self.p.n_tokens * self.r.w.cfg.hidden_size);
        // SAFETY: `proj` holds the step's rows.
        unsafe { r.all_reduce(self.g, r.proj.ptr, len, &mut *self.comm) }
    }

    fn attn_residual(&mut self, l: &GpuLayer) -> Result<()> {
        match &l.post_norms {
            Some([post_attn, _]) => {
                self.norm_then_add(post_attn.ptr)?;
                self.pre_norm(l.ffn_norm.ptr, Some(&l.gate_up))
            }
            None => {
                self.pending = true;
                self.pre_norm(l.ffn_norm.ptr, Some(&l.gate_up))
            }
        }
    }

    fn gate_up(&mut self, l: &GpuLayer) -> Result<()> {
        let (r, g, c) = (self.r, self.g, &self.r.w.cfg);
        let (ff, gu, act) = (c.intermediate_size, r.gate_up.ptr, r.act.ptr);
        let gelu = c.activation == Activation::GeluTanh;
        // SAFETY: as in `qkv`.
        unsafe {
            let shape = self.lin(2 * ff, c.hidden_size);
            r.project(g, gu, r.xn.ptr, &l.gate_up, shape, self.xn_int8)?;
            if self.fused_down(&l.down).is_none() {
                g.gated_activation(r.w.dtype, gelu, act, gu, self.p.n_tokens, ff)?;
            }
        }
        Ok(())
    }

    fn down_proj(&mut self, l: &GpuLayer) -> Result<()> {
        let (r, c) = (self.r, &self.r.w.cfg);
        if let Some(shape) = self.fused_down(&l.down) {
            // SAFETY: as in `qkv`.
            return unsafe { self.down_from_gate_up(&l.down, shape) };
        }
        let shape = self.lin(c.hidden_size, c.intermediate_size);
        // SAFETY: as in `qkv`.
        unsafe { r.project(self.g, r.proj.ptr, r.act.ptr, &l.down, shape, false)? };
        Ok(())
    }

    /// The runner refuses a mixture of experts at upload (`GpuWeights::upload`).
    fn sparse(_: &GpuLayer) -> bool {
        false
    }

    fn experts(&mut self, _: &GpuLayer) -> Result<()> {
        Err(ferrite_model::moe::moe_unsupported("the GPU runner"))
    }

    fn ffn_residual(&mut self, l: &GpuLayer) -> Result<()> {
        match &l.post_norms {
            Some([_, post_ffn]) => self.norm_then_add(post_ffn.ptr),
            None => {
                self.pending = true;
                Ok(())
            }
        }
    }
}
