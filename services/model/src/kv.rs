//! The K and V storage of a paged KV cache, in host memory: what the CPU forward writes and
//! its attention reads, block by block through each sequence's block table. Which blocks a
//! sequence holds is the serving core's business (the engine's block pool); this is only where
//! they lie.
//!
//! Token `p` of a sequence lives at slot `p % block_size` of its block `p / block_size`.
//!
//! The values are stored as f32, as f16 ([`KvDtype`], `--kv-cache-dtype f16`): half the
//! memory, so twice the tokens in the same bytes, and half what attention reads at each step,
//! or as FP8 e4m3 (`fp8`, vLLM's cache of scale 1): a quarter of f32's bytes; each K and V
//! value is rounded once, as it is written.

use std::str::FromStr;

use ferrite_kernels::cpu::attention::{AttentionOptions, E4m3, KvElem, PagedKv, QueryToken};
use half::f16;
use half::slice::HalfBitsSliceExt;

/// Blocks needed to hold `tokens` tokens.
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}

/// What the CPU's KV cache stores its values as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// Exact: the forward's own values (transformers' f32 reference is matched bit for bit
    /// where the arithmetic allows).
    #[default]
    F32,
    /// Half the memory; each value rounded to nearest once.
    F16,
    /// A quarter of the memory: FP8 e4m3, each value rounded to nearest once, saturating at
    /// ±448 (no scale: vLLM's `fp8` cache uncalibrated; keys and values stay far inside).
    Fp8,
}

impl KvDtype {
    /// Bytes of one value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
            KvDtype::Fp8 => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Fp8 => "fp8",
        }
    }
}

impl FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" | "float32" => Ok(KvDtype::F32),
            "f16" | "float16" | "half" => Ok(KvDtype::F16),
            "fp8" | "fp8_e4m3" | "fp8-e4m3" => Ok(KvDtype::Fp8),
            other => Err(format!("kv cache dtype `{other}`: f32, f16 or fp8")),
        }
    }
}

/// One layer's K or V values.
#[derive(Debug)]
enum Values {
    F32(Vec<f32>),
    /// f16 values as their bits: a zeroed `u16` allocation is the allocator's zeroed pages,
    /// touched only when written (filling `f16::ZERO` element by element wrote the whole
    /// cache at start-up, 0.4 s for 1 GiB).
    F16(Vec<u16>),
    /// e4m3 codes (a zeroed allocation, as above).
    Fp8(Vec<u8>),
}

impl Values {
    fn zeroed(dtype: KvDtype, n: usize) -> Self {
        match dtype {
            KvDtype::F32 => Values::F32(vec![0.0; n]),
            KvDtype::F16 => Values::F16(vec![0u16; n]),
            KvDtype::Fp8 => Values::Fp8(vec![0u8; n]),
        }
    }

    fn write(&mut self, at: usize, row: &[f32]) {
        fn put<E: KvElem>(dst: &mut [E], row: &[f32]) {
            for (d, &x) in dst.iter_mut().zip(row) {
                *d = E::from_f32(x);
            }
        }
        match self {
            Values::F32(v) => v[at..at + row.len()].copy_from_slice(row),
            Values::F16(v) => put(v[at..at + row.len()].reinterpret_cast_mut::<f16>(), row),
            Values::Fp8(v) => put(E4m3::slice_mut(&mut v[at..at + row.len()]), row),
        }
    }
}

/// K and V storage for every layer: `[layer][block][slot][kv_head][head_dim]`.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Values>,
    v: Vec<Values>,
    pub dtype: KvDtype,
    pub block_size: usize,
    pub num_blocks: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvCache {
    /// An f32 cache.
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let shape = (num_blocks, block_size, kv_heads, head_dim);
        Self::with_dtype(num_layers, shape, KvDtype::F32)
    }

    /// A cache of `num_layers` layers of `(num_blocks, block_size, kv_heads, head_dim)`
    /// values stored as `dtype`.
    pub fn with_dtype(
        num_layers: usize,
        (num_blocks, block_size, kv_heads, head_dim): (usize, usize, usize, usize),
        dtype: KvDtype,
    ) -> Self {
        let per_layer = num_blocks * block_size * kv_heads * head_dim;
        Self {
            k: (0..num_layers)
                .map(|_| Values::zeroed(dtype, per_layer))
                .collect(),
            v: (0..num_layers)
                .map(|_| Values::zeroed(dtype, per_layer))
                .collect(),
            dtype,
            block_size,
            num_blocks,
            kv_heads,
            head_dim,
        }
    }

    /// Bytes of K+V storage per token across all layers, stored as `dtype`.
    pub fn bytes_per_token(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> usize {
        2 * num_layers * kv_heads * head_dim * dtype.bytes()
    }

    /// Writes the K and V rows (`kv_heads * head_dim` each) of the token at `pos`.
    pub fn write(&mut self, layer: usize, block_table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let kv_dim = self.kv_heads * self.head_dim;
        let block = block_table[pos / self.block_size] as usize;
        let off = (block * self.block_size + pos % self.block_size) * kv_dim;
        self.k[layer].write(off, &k[..kv_dim]);
        self.v[layer].write(off, &v[..kv_dim]);
    }

    /// [`paged_attention`](ferrite_kernels::cpu::attention::paged_attention) of `q` over
    /// layer `layer`'s keys and values, into `out`.
    pub fn attend(
        &self,
        layer: usize,
        (q, tokens, n_heads): (&[f32], &[QueryToken<'_>], usize),
        opts: AttentionOptions,
        out: &mut [f32],
    ) {
        use ferrite_kernels::cpu::attention::paged_attention;
        match (&self.k[layer], &self.v[layer]) {
            (Values::F32(k), Values::F32(v)) => {
                paged_attention(q, tokens, n_heads, &self.view(k, v), opts, out)
            }
            (Values::F16(k), Values::F16(v)) => {
                let (k, v) = (k.reinterpret_cast::<f16>(), v.reinterpret_cast::<f16>());
                paged_attention(q, tokens, n_heads, &self.view(k, v), opts, out)
            }
            (Values::Fp8(k), Values::Fp8(v)) => {
                let (k, v) = (E4m3::slice(k), E4m3::slice(v));
                paged_attention(q, tokens, n_heads, &self.view(k, v), opts, out)
            }
            _ => unreachable!("K and V are made with one dtype"),
        }
    }

    fn view<'a, E>(&self, k: &'a [E], v: &'a [E]) -> PagedKv<'a, E> {
        PagedKv {
            k,
            v,
            block_size: self.block_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_kernels::fp8::fake_quantize;

    /// An f16 or FP8 cache holds each value rounded to nearest: attention over one position
    /// gives back its V row as stored, and the f32 cache the row itself.
    #[test]
    fn an_f16_cache_rounds_each_value_once() {
        let row: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 * 1e-4).collect();
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Fp8] {
            let mut kv = KvCache::with_dtype(1, (2, 4, 1, 16), dtype);
            let table = [1u32];
            kv.write(0, &table, 2, &row, &row);
            let tokens = [QueryToken {
                block_table: &table,
                pos: 0,
            }];
            // Position 0 was never written (zeros): write it too, then attend from 0 alone.
            kv.write(0, &table, 0, &row, &row);
            let mut out = vec![0f32; 16];
            kv.attend(
                0,
                (&row, &tokens, 1),
                AttentionOptions::causal(0.25),
                &mut out,
            );
            let want: Vec<f32> = match dtype {
                KvDtype::F32 => row.clone(),
                KvDtype::F16 => row.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
                KvDtype::Fp8 => row.iter().map(|&x| fake_quantize(x, 1.0)).collect(),
            };
            assert_eq!(out, want, "{dtype:?}");
        }
        assert_ne!(
            f16::from_f32(row[1]).to_f32(),
            row[1],
            "the row is not f16-exact"
        );
        assert_eq!(KvCache::bytes_per_token(2, 3, 64, KvDtype::F16), 1536);
        assert_eq!(KvCache::bytes_per_token(2, 3, 64, KvDtype::Fp8), 768);
        assert_eq!("f16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert_eq!("fp8".parse::<KvDtype>(), Ok(KvDtype::Fp8));
    }

    #[test]
    fn blocks_for_rounds_up() {
        assert_eq!(blocks_for(0, 16), 0);
        assert_eq!(blocks_for(1, 16), 1);
        assert_eq!(blocks_for(16, 16), 1);
        assert_eq!(blocks_for(17, 16), 2);
    }
}
