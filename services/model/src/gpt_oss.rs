//! gpt-oss (OpenAI's open-weight models, `GptOssForCausalLM`): the Llama layer with options
//! (biases on all four attention projections, a sink logit per head, sliding windows on
//! alternate layers, YaRN: [`crate::gpt_oss_config`]) and a mixture of experts whose router
//! and experts have biases and whose activation is a clamped SwiGLU.
//!
//! Its checkpoints store the experts of a layer stacked and the other way round from every
//! other family: `mlp.experts.gate_up_proj` `[experts, hidden, 2 · intermediate]` (inputs
//! first), gate and up interleaved along the last axis (gate `j` at `2j`, up `j` at `2j + 1`),
//! and `down_proj` `[experts, intermediate, hidden]`; each with a `_bias`. OpenAI's releases
//! hold them in MXFP4 (`_blocks` and `_scales`, outputs first: [`ferrite_formats::mxfp4`]), the
//! rest in bf16. Each expert is cut out here into the gate, up and down projections the
//! mixture's forward ([`crate::moe`]) runs, its rows this rank's share, as for any expert.
//! llama.cpp's GGUF files (arch `gpt-oss`) hold them as other families' stacks, gate and up
//! apart, with `.bias` tensors beside ([`crate::moe`] reads them).

use std::ops::Range;

use ferrite_formats::{IntType, Matrix, TensorMap, mxfp4};

use crate::error::{ModelError, Result};
use crate::ffn::{Ffn, FfnBias};
use crate::naming::WeightNaming;
use crate::tp::TpRank;

/// Where a layer's stacked experts are and how big: `h` hidden, `ffn` each expert's
/// intermediate size, `count` experts.
pub(crate) struct Stack<'a> {
    pub t: &'a TensorMap,
    pub n: WeightNaming,
    pub layer: usize,
    pub h: usize,
    pub ffn: usize,
    pub count: usize,
}

impl Stack<'_> {
    /// Whether layer `layer`'s MLP is gpt-oss's (its router is `mlp.router`).
    pub(crate) fn is_gpt_oss(t: &TensorMap, n: WeightNaming, layer: usize) -> bool {
        t.contains(&n.layer(layer, "", "mlp.router.weight"))
    }

    /// The router's name (`[experts, hidden]`, with a bias beside it).
    pub(crate) fn router(&self) -> String {
        self.name("mlp.router.weight")
    }

    fn name(&self, hf: &str) -> String {
        self.n.layer(self.layer, "", hf)
    }

    /// Every expert, cut to `tp`'s rows (gate and up) and columns (down), with its biases;
    /// the down projection's bias on rank 0 alone, as the ranks' parts are summed after it.
    pub(crate) fn experts(&self, tp: TpRank) -> Result<Vec<Ffn>> {
        let part = tp.part(self.ffn);
        let gate_up_bias = self.t.vector_of_len(
            &self.name("mlp.experts.gate_up_proj_bias"),
            self.count * 2 * self.ffn,
        )?;
        let down_bias = self.t.vector_of_len(
            &self.name("mlp.experts.down_proj_bias"),
            self.count * self.h,
        )?;
        let weights = self.weights(&part)?;
        (0..self.count)
            .zip(weights)
            .map(|(e, (gate, up, down))| {
                let at = |j: usize| gate_up_bias[e * 2 * self.ffn + j];
                let bias = FfnBias {
                    gate: part.clone().map(|j| at(2 * j)).collect(),
                    up: part.clone().map(|j| at(2 * j + 1)).collect(),
                    down: (tp.rank == 0).then(|| down_bias[e * self.h..(e + 1) * self.h].to_vec()),
                };
                Ok(Ffn {
                    gate,
                    up,
                    down,
                    bias: Some(Box::new(bias)),
                })
            })
            .collect()
    }

    /// Each expert's gate, up and down matrices for intermediate rows `part`, from MXFP4
    /// blocks where the checkpoint has them, else from its float tensors.
    fn weights(&self, part: &Range<usize>) -> Result<Vec<(Matrix, Matrix, Matrix)>> {
        let gate_up = self.name("mlp.experts.gate_up_proj");
        let down = self.name("mlp.experts.down_proj");
        let (h, ffn) = (self.h, self.ffn);
        // Gate `j` is row (or column) `first + 2j` of the interleaved stack, up `j` the one
        // after it: every other one from `first`, or from `first + 1`.
        let every_other =
            |first: usize| -> Vec<usize> { part.clone().map(|j| first + 2 * j).collect() };
        if self.t.int_type(&format!("{gate_up}_blocks")).is_some() {
            let gu = Mxfp4::read(self.t, &gate_up, [self.count, 2 * ffn, h])?;
            let dn = Mxfp4::read(self.t, &down, [self.count, h, ffn])?;
            return (0..self.count)
                .map(|e| {
                    let rows: Vec<usize> = (e * h..(e + 1) * h).collect();
                    Ok((
                        gu.rows(&every_other(e * 2 * ffn))?,
                        gu.rows(&every_other(e * 2 * ffn + 1))?,
                        dn.rows(&rows)?.slice_cols(&down, part.clone())?,
                    ))
                })
                .collect();
        }
        let stacked = |name: &str, rows: usize, cols: usize| -> Result<Matrix> {
            let m = self.t.stacked_matrix(name, self.count)?;
            Ok(m.expect_shape(name, self.count * rows, cols)?)
        };
        let (gu, dn) = (stacked(&gate_up, h, 2 * ffn)?, stacked(&down, ffn, h)?);
        let all_h: Vec<usize> = (0..h).collect();
        (0..self.count)
            .map(|e| {
                let mine = gu.slice_rows(&gate_up, e * h..(e + 1) * h)?;
                let rows = e * ffn + part.start..e * ffn + part.end;
                Ok((
                    mine.columns_as_rows(&gate_up, &every_other(0))?,
                    mine.columns_as_rows(&gate_up, &every_other(1))?,
                    (dn.slice_rows(&down, rows)?).columns_as_rows(&down, &all_h)?,
                ))
            })
            .collect()
    }
}

/// A stack of MXFP4 matrices: `<name>_blocks` and `<name>_scales` of shape `[count, rows,
/// cols]` (in weights).
struct Mxfp4<'a> {
    name: &'a str,
    blocks: &'a [u8],
    scales: &'a [u8],
    cols: usize,
}

impl<'a> Mxfp4<'a> {
    fn read(t: &'a TensorMap, name: &'a str, [count, rows, cols]: [usize; 3]) -> Result<Self> {
        let runs = cols / mxfp4::BLOCK;
        let (bs, blocks) = t.int_bytes(&format!("{name}_blocks"), IntType::U8)?;
        let (ss, scales) = t.int_bytes(&format!("{name}_scales"), IntType::U8)?;
        if bs != [count, rows, runs, mxfp4::BLOCK / 2] || ss != [count, rows, runs] {
            return Err(ModelError::BadConfig(format!(
                "{name}: MXFP4 blocks {bs:?} and scales {ss:?} are not {count} matrices of \
                 {rows} x {cols}"
            )));
        }
        Ok(Self {
            name,
            blocks,
            scales,
            cols,
        })
    }

    /// Rows `picks` of the stack seen as one matrix of `count · rows` rows.
    fn rows(&self, picks: &[usize]) -> Result<Matrix> {
        Ok(mxfp4::rows(
            self.name,
            self.blocks,
            self.scales,
            self.cols,
            picks,
        )?)
    }
}
