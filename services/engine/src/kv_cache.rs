//! Paged KV cache: a pool of fixed-size blocks and the per-layer K/V storage they index.
//!
//! # Invariants of [`KvBlockPool`]
//!
//! 1. Every block id in `0..num_blocks` is either on the free list or held by exactly one owner
//!    (a sequence's [`BlockTable`]); `free + used == num_blocks` at all times.
//! 2. `allocate` and `free` are O(1): the free list is threaded through a flat `Vec<u32>` of
//!    "next" indices; no per-block heap node exists.
//! 3. Allocating `n` blocks is all-or-nothing: on failure nothing was taken.
//! 4. Freeing a block that is already free is refused (it would put it on the list twice and
//!    hand it to two sequences).
//!
//! A sequence at length `len` holds exactly `ceil(len / block_size)` blocks; token `p` lives at
//! slot `p % block_size` of its block `p / block_size`.

use ferrite_kernels::cpu::attention::PagedKv;

const NONE: u32 = u32::MAX;

/// The free list of KV blocks.
#[derive(Debug)]
pub struct KvBlockPool {
    /// `next[b]` is the next free block after `b` while `b` is free.
    next: Vec<u32>,
    is_free: Vec<bool>,
    head: u32,
    free: usize,
}

impl KvBlockPool {
    pub fn new(num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        let next = (0..num_blocks)
            .map(|b| if b + 1 < num_blocks { b + 1 } else { NONE })
            .collect();
        Self {
            next,
            is_free: vec![true; n],
            head: if n > 0 { 0 } else { NONE },
            free: n,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.next.len()
    }

    pub fn num_free(&self) -> usize {
        self.free
    }

    pub fn num_used(&self) -> usize {
        self.next.len() - self.free
    }

    /// Takes one free block, O(1).
    pub fn allocate(&mut self) -> Option<u32> {
        if self.head == NONE {
            return None;
        }
        let b = self.head;
        self.head = self.next[b as usize];
        self.is_free[b as usize] = false;
        self.free -= 1;
        Some(b)
    }

    /// Appends `n` blocks to `table`, or takes none and returns false.
    pub fn allocate_into(&mut self, n: usize, table: &mut BlockTable) -> bool {
        if n > self.free {
            return false;
        }
        for _ in 0..n {
            match self.allocate() {
                Some(b) => table.blocks.push(b),
                None => return false, // unreachable: `free` counted them
            }
        }
        true
    }

    /// Returns a block to the pool, O(1). Returns false (and changes nothing) if it was free
    /// already or out of range.
    pub fn free(&mut self, block: u32) -> bool {
        let Some(slot) = self.is_free.get_mut(block as usize) else {
            return false;
        };
        if *slot {
            return false;
        }
        *slot = true;
        self.next[block as usize] = self.head;
        self.head = block;
        self.free += 1;
        true
    }

    /// Frees every block of `table` and empties it.
    pub fn release(&mut self, table: &mut BlockTable) {
        for b in table.blocks.drain(..) {
            let freed = self.free(b);
            debug_assert!(freed, "block {b} released twice");
        }
    }
}

/// The physical blocks of one sequence, in logical order.
#[derive(Debug, Default, Clone)]
pub struct BlockTable {
    blocks: Vec<u32>,
}

impl BlockTable {
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

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
    fn free_plus_used_is_total_and_blocks_are_unique() {
        let mut pool = KvBlockPool::new(8);
        let mut a = BlockTable::default();
        let mut b = BlockTable::default();
        assert!(pool.allocate_into(3, &mut a));
        assert!(pool.allocate_into(5, &mut b));
        assert_eq!(pool.num_free() + pool.num_used(), 8);
        let mut all: Vec<u32> = a.blocks().iter().chain(b.blocks()).copied().collect();
        all.sort();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        assert_eq!(pool.allocate(), None);
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut pool = KvBlockPool::new(4);
        let mut a = BlockTable::default();
        assert!(pool.allocate_into(3, &mut a));
        let mut b = BlockTable::default();
        assert!(!pool.allocate_into(2, &mut b));
        assert!(b.is_empty());
        assert_eq!(pool.num_free(), 1);
    }

    #[test]
    fn double_free_and_out_of_range_are_refused() {
        let mut pool = KvBlockPool::new(2);
        let b = pool.allocate().expect("one block");
        assert!(pool.free(b));
        assert!(!pool.free(b));
        assert!(!pool.free(7));
        assert_eq!(pool.num_free(), 2);
    }

    #[test]
    fn released_blocks_are_reused() {
        let mut pool = KvBlockPool::new(3);
        let mut a = BlockTable::default();
        assert!(pool.allocate_into(3, &mut a));
        pool.release(&mut a);
        assert!(a.is_empty());
        assert_eq!(pool.num_free(), 3);
        let mut b = BlockTable::default();
        assert!(pool.allocate_into(3, &mut b));
    }

    #[test]
    fn blocks_for_rounds_up() {
        assert_eq!(blocks_for(0, 16), 0);
        assert_eq!(blocks_for(1, 16), 1);
        assert_eq!(blocks_for(16, 16), 1);
        assert_eq!(blocks_for(17, 16), 2);
    }
}
