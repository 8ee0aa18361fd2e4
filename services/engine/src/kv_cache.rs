//! Paged KV cache: a pool of fixed-size blocks that sequences share by prefix, and their block
//! tables. The per-layer K/V storage the blocks index is the model's ([`KvCache`], from
//! `ferrite_model::kv`, re-exported here): the forward writes it, the pool only hands out ids.
//!
//! # Invariants of [`KvBlockPool`]
//!
//! 1. Every block id in `0..num_blocks` is either *free* (reference count 0, on the free queue)
//!    or *held* (count ≥ 1: the number of block tables that list it; not on the queue);
//!    `free + used == num_blocks` at all times.
//! 2. `allocate`, `free`, `hold` (a prefix-cache hit) and `lookup` are O(1): the free queue is a
//!    doubly linked list threaded through flat `Vec<u32>`s of indices; no per-block heap node
//!    exists. (The index of cached blocks is one hash map from [`BlockHash`] to block id.)
//! 3. Allocating `n` blocks is all-or-nothing: on failure nothing was taken.
//! 4. Freeing a block whose count is already 0 is refused (it would be queued twice and handed
//!    to two sequences).
//! 5. A *cached* block (one the index names) holds exactly the full block of tokens its hash
//!    names, and is never written again: only full, computed blocks are registered
//!    ([`KvBlockPool::register`]); a sequence writes only past its computed tokens, into blocks
//!    that are its alone and unregistered ([`KvBlockPool::is_private`]); and `allocate` takes a
//!    block off the index (evicts it) before handing it out to be written.
//! 6. Only free blocks are evicted, least recently freed first: a block held by any sequence is
//!    never evicted or handed to another (no use after evict). Free blocks without a hash go
//!    out before any cached block is evicted, and a finished sequence's blocks are freed last
//!    block first, so its prefix (the part others share) stays cached longest.
//! 7. The index names each hash once: a second block computed with the same contents (two
//!    requests prefilling one prefix at once) stays unregistered, private to its sequence.
//!
//! A sequence at length `len` holds exactly `ceil(len / block_size)` blocks; token `p` lives at
//! slot `p % block_size` of its block `p / block_size`.

use std::collections::HashMap;

pub use ferrite_model::kv::{KvCache, blocks_for};
pub use ferrite_proto::prefix::BlockHash;

const NONE: u32 = u32::MAX;

/// A change to what the pool's cache holds, in the order it happened (for the KV events a pool
/// publishes to gateways).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEvent {
    /// A full block is now cached under this hash.
    Stored(BlockHash),
    /// The block cached under this hash was evicted (or the cache was reset).
    Removed(BlockHash),
}

/// The KV blocks of a pool: reference counts, the free queue (LRU order) and the index of
/// cached blocks.
#[derive(Debug)]
pub struct KvBlockPool {
    /// Block tables listing each block.
    refs: Vec<u32>,
    /// The hash a cached block is indexed under.
    hash: Vec<Option<BlockHash>>,
    /// The free queue, head first (next to be handed out): links while a block is free.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    free: usize,
    /// Free blocks that hold no cached prefix (taking one evicts nothing).
    empty: usize,
    index: HashMap<BlockHash, u32>,
    /// Changes to the index since last taken, when someone listens.
    events: Option<Vec<KvEvent>>,
}

impl KvBlockPool {
    pub fn new(num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        let mut pool = Self {
            refs: vec![0; n],
            hash: vec![None; n],
            prev: vec![NONE; n],
            next: vec![NONE; n],
            head: NONE,
            tail: NONE,
            free: 0,
            empty: 0,
            index: HashMap::new(),
            events: None,
        };
        for b in 0..num_blocks {
            pool.push_back(b);
        }
        pool
    }

    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks no sequence holds (cached ones among them, evictable).
    pub fn num_free(&self) -> usize {
        self.free
    }

    /// Free blocks that hold no cached prefix: what the pool can hand out without evicting.
    pub fn num_empty(&self) -> usize {
        self.empty
    }

    /// Blocks some sequence holds.
    pub fn num_used(&self) -> usize {
        self.refs.len() - self.free
    }

    /// Blocks the index names (held or free).
    pub fn num_cached(&self) -> usize {
        self.index.len()
    }

    /// Block tables listing `block` (0: free).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.refs.get(block as usize).copied().unwrap_or(0)
    }

    /// Whether `block` may be written: held by one table only and not cached (invariant 5).
    pub fn is_private(&self, block: u32) -> bool {
        self.ref_count(block) == 1 && self.hash.get(block as usize) == Some(&None)
    }

    /// Starts (or stops) recording [`KvEvent`]s for [`Self::take_events`].
    pub fn record_events(&mut self, on: bool) {
        self.events = on.then(Vec::new);
    }

    /// The index changes since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn event(&mut self, e: KvEvent) {
        if let Some(events) = &mut self.events {
            events.push(e);
        }
    }

    /// Every hash the index holds (for a snapshot to a new listener).
    pub fn cached_hashes(&self) -> Vec<BlockHash> {
        self.index.keys().copied().collect()
    }

    fn push_back(&mut self, b: u32) {
        let i = b as usize;
        self.prev[i] = self.tail;
        self.next[i] = NONE;
        match self.tail {
            NONE => self.head = b,
            t => self.next[t as usize] = b,
        }
        self.tail = b;
        self.free += 1;
        self.empty += usize::from(self.hash[i].is_none());
    }

    fn push_front(&mut self, b: u32) {
        let i = b as usize;
        self.prev[i] = NONE;
        self.next[i] = self.head;
        match self.head {
            NONE => self.tail = b,
            h => self.prev[h as usize] = b,
        }
        self.head = b;
        self.free += 1;
        self.empty += usize::from(self.hash[i].is_none());
    }

    fn unlink(&mut self, b: u32) {
        let i = b as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        match p {
            NONE => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NONE => self.tail = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[i] = NONE;
        self.next[i] = NONE;
        self.free -= 1;
        self.empty -= usize::from(self.hash[i].is_none());
    }

    /// Takes the free block at the head of the queue, O(1), evicting its cached contents.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NONE {
            return None;
        }
        self.unlink(b);
        if let Some(h) = self.hash[b as usize].take() {
            self.index.remove(&h);
            self.event(KvEvent::Removed(h));
        }
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// Appends `n` new blocks to `table`, or takes none and returns false.
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

    /// The cached block named `hash`, if any, O(1).
    pub fn lookup(&self, hash: BlockHash) -> Option<u32> {
        self.index.get(&hash).copied()
    }

    /// Appends cached `blocks` (prefix hits) to `table`, each held once more; a free one leaves
    /// the free queue. Returns false (and holds none) if one is not cached.
    pub fn hold_into(&mut self, blocks: &[u32], table: &mut BlockTable) -> bool {
        if blocks
            .iter()
            .any(|&b| self.hash.get(b as usize).is_none_or(Option::is_none))
        {
            return false;
        }
        for &b in blocks {
            if self.refs[b as usize] == 0 {
                self.unlink(b);
            }
            self.refs[b as usize] += 1;
            table.blocks.push(b);
        }
        true
    }

    /// Names `block` (full, computed, held) by `hash` in the index. Returns false if the index
    /// already names another block so (invariant 7) or `block` is not a held, unnamed block.
    pub fn register(&mut self, block: u32, hash: BlockHash) -> bool {
        let i = block as usize;
        if self.refs.get(i).is_none_or(|&r| r == 0)
            || self.hash[i].is_some()
            || self.index.contains_key(&hash)
        {
            return false;
        }
        self.hash[i] = Some(hash);
        self.index.insert(hash, block);
        self.event(KvEvent::Stored(hash));
        true
    }

    /// Drops one hold on `block`, O(1); at none it joins the free queue (a cached block at the
    /// tail, evicted last; another at the head, handed out first). Returns false (and changes
    /// nothing) if it was free already or out of range.
    pub fn free(&mut self, block: u32) -> bool {
        let i = block as usize;
        match self.refs.get(i) {
            None | Some(0) => return false,
            Some(_) => {}
        }
        self.refs[i] -= 1;
        if self.refs[i] == 0 {
            if self.hash[i].is_some() {
                self.push_back(block);
            } else {
                self.push_front(block);
            }
        }
        true
    }

    /// Drops `table`'s hold on each of its blocks, last block first, and empties it.
    pub fn release(&mut self, table: &mut BlockTable) {
        while let Some(b) = table.blocks.pop() {
            let freed = self.free(b);
            debug_assert!(freed, "block {b} released twice");
        }
    }

    /// Forgets every cached block no sequence holds (held ones stay named: their contents are
    /// still what their hashes say). Returns how many were forgotten.
    pub fn reset_cache(&mut self) -> usize {
        let mut forgotten = 0;
        for b in 0..self.refs.len() {
            if self.refs[b] == 0
                && let Some(h) = self.hash[b].take()
            {
                self.index.remove(&h);
                self.event(KvEvent::Removed(h));
                self.empty += 1;
                forgotten += 1;
            }
        }
        forgotten
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

#[cfg(test)]
#[path = "kv_cache_tests.rs"]
mod tests;
