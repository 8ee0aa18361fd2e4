//! Prefix-cache block hashes: the one definition, used by the engine (which KV blocks a request
//! can reuse) and by the gateway (which pool holds a request's prefix).
//!
//! A full KV block of `block_size` tokens is named by a chained hash: block `i`'s hash is
//! SHA-256 of block `i − 1`'s hash followed by block `i`'s token ids (little-endian `u32`s),
//! truncated to 128 bits; block 0's parent is the pool's [`seed`]. Chaining makes a block's name
//! depend on every token before it, as its keys and values do (attention reads them all). The
//! seed is a hash of everything else that changes a block's contents: the model, the format
//! and quantization of its weights, the dtype. Two pools whose seeds differ never share a name.
//!
//! Why SHA-256 and 128 bits: prompts are chosen by whoever sends them. With a fast 64-bit hash
//! a crafted prompt can collide with another user's block (vLLM's CVE-2025-25183), and the
//! engine would then attend to keys and values of text it never saw. A collision of 128 bits of
//! SHA-256 needs about 2^64 blocks. The cost is about half a microsecond per 16-token block,
//! some 60 µs for a 2,000-token prompt: far below the prefill it may save.

use sha2::{Digest, Sha256};

/// The name of one full KV block (with everything before it).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl std::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl BlockHash {
    /// The 16 bytes sent on the wire (big-endian).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// The hash of 16 wire bytes; `None` for any other length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let b: [u8; 16] = bytes.try_into().ok()?;
        Some(Self(u128::from_be_bytes(b)))
    }
}

fn truncated(digest: &[u8]) -> BlockHash {
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    BlockHash(u128::from_be_bytes(b))
}

/// The parent of a pool's first block: a hash of `identity`, a description of everything
/// besides the tokens that changes a block's keys and values.
pub fn seed(identity: &str) -> BlockHash {
    let mut h = Sha256::new();
    h.update(b"ferrite kv block v1\0");
    h.update(identity.as_bytes());
    truncated(&h.finalize())
}

/// The parent of the first block of a sequence that runs with the LoRA adapter `name`, in a
/// pool whose seed is `base`: its keys and values are not the base model's.
pub fn adapter_seed(base: BlockHash, name: &str) -> BlockHash {
    let mut h = Sha256::new();
    h.update(b"ferrite lora\0");
    h.update(base.to_bytes());
    h.update(name.as_bytes());
    truncated(&h.finalize())
}

/// The hash of a block holding `tokens` after the block named `parent`.
pub fn next(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(parent.to_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    truncated(&h.finalize())
}

/// Extends `hashes` (the chain of `tokens`' first full blocks, possibly empty) to every full
/// block of `tokens`. Partial blocks are never named: only a full block can be shared.
pub fn extend(hashes: &mut Vec<BlockHash>, seed: BlockHash, block_size: usize, tokens: &[u32]) {
    if block_size == 0 {
        return;
    }
    let full = tokens.len() / block_size;
    while hashes.len() < full {
        let i = hashes.len();
        let parent = hashes.last().copied().unwrap_or(seed);
        hashes.push(next(parent, &tokens[i * block_size..(i + 1) * block_size]));
    }
}

/// The hashes of every full block of `tokens`.
pub fn chain(seed: BlockHash, block_size: usize, tokens: &[u32]) -> Vec<BlockHash> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size.max(1));
    extend(&mut hashes, seed, block_size, tokens);
    hashes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_name_depends_on_every_token_before_it_and_on_the_seed() {
        let s = seed("model a");
        let tokens: Vec<u32> = (0..40).collect();
        let c = chain(s, 16, &tokens);
        assert_eq!(c.len(), 2, "the partial third block has no name");
        let mut changed = tokens.clone();
        changed[3] = 99;
        let d = chain(s, 16, &changed);
        assert_ne!(c[0], d[0]);
        assert_ne!(c[1], d[1], "a change in block 0 renames block 1");
        let e = chain(seed("model b"), 16, &tokens);
        assert!(c.iter().zip(&e).all(|(x, y)| x != y), "another model");
        // The same tokens in the last partial block do not matter.
        let mut tail = tokens.clone();
        tail[39] = 7;
        assert_eq!(chain(s, 16, &tail), c);
    }

    #[test]
    fn extending_equals_hashing_at_once_and_bytes_round_trip() {
        let s = seed("m");
        let tokens: Vec<u32> = (0..100).map(|i| i * 7 % 31).collect();
        let mut grown = Vec::new();
        for end in [0, 5, 16, 33, 64, 100] {
            extend(&mut grown, s, 16, &tokens[..end]);
        }
        assert_eq!(grown, chain(s, 16, &tokens));
        for h in &grown {
            assert_eq!(BlockHash::from_bytes(&h.to_bytes()), Some(*h));
        }
        assert_eq!(BlockHash::from_bytes(&[1, 2, 3]), None);
    }
}
