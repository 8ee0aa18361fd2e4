//! The K and V storage of a paged KV cache, in host memory: what the CPU forward writes and
//! its attention reads, block by block through each sequence's block table. Which blocks a
//! sequence holds is the serving core's business (the engine's block pool); this is only where
//! they lie.
//!
//! Token `p` of a sequence lives at slot `p % block_size` of its block `p / block_size`.

use ferrite_kernels::cpu::attention::PagedKv;

/// Blocks needed to hold `tokens` tokens.
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}

/// K and V storage for every layer: `[layer][block][slot][kv_head][head_dim]`, f32.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    pub block_size: usize,
    pub num_blocks: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvCache {
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let per_layer = num_blocks * block_size * kv_heads * head_dim;
        Self {
            k: (0..num_layers).map(|_| vec![0f32; per_layer]).collect(),
            v: (0..num_layers).map(|_| vec![0f32; per_layer]).collect(),
            block_size,
            num_blocks,
            kv_heads,
            head_dim,
        }
    }

    /// Bytes of K+V storage per token across all layers.
    pub fn bytes_per_token(num_layers: usize, kv_heads: usize, head_dim: usize) -> usize {
        2 * num_layers * kv_heads * head_dim * std::mem::size_of::<f32>()
    }

    /// Writes the K and V rows (`kv_heads * head_dim` each) of the token at `pos`.
    pub fn write(&mut self, layer: usize, block_table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let kv_dim = self.kv_heads * self.head_dim;
        let block = block_table[pos / self.block_size] as usize;
        let off = (block * self.block_size + pos % self.block_size) * kv_dim;
        self.k[layer][off..off + kv_dim].copy_from_slice(k);
        self.v[layer][off..off + kv_dim].copy_from_slice(v);
    }

    /// One layer, for the attention kernel.
    pub fn layer(&self, layer: usize) -> PagedKv<'_> {
        PagedKv {
            k: &self.k[layer],
            v: &self.v[layer],
            block_size: self.block_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_for_rounds_up() {
        assert_eq!(blocks_for(0, 16), 0);
        assert_eq!(blocks_for(1, 16), 1);
        assert_eq!(blocks_for(16, 16), 1);
        assert_eq!(blocks_for(17, 16), 2);
    }
}
