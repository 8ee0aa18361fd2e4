//! KV-aware routing's view of the pools' prefix caches: an index from block hash to the pools
//! that hold the block, kept by following each pool's `WatchKvCache` stream.
//!
//! The index comes from the pools' own events, never from this gateway's routing history, so
//! gateways that never talk to each other build the same index and make the same choices (a
//! gateway-local guess of what each pool holds drifts apart as gateways are added). Each stream
//! starts with a snapshot of the pool's cache: a gateway that starts or restarts, or reconnects
//! after a fault, is whole again after one message. While a pool's stream is down its blocks
//! are out of the index: what it holds is unknown, and unknown counts as cold.
//!
//! Between a pool's load reports (at most every 50 ms while it is busy) this gateway's own
//! picks of the pool count too: a burst routed in that window would otherwise all see the same
//! stale backlog and herd onto one pool. A pick counts until a report arrived after it and it
//! is older than [`PICK_MEMORY`] (by then the pool's reports include it); a pool that stops
//! reporting keeps paying for every pick since its last report.
//!
//! A request's blocks are named as the pool names them ([`ferrite_proto::prefix`], with the
//! seed and block size the pool's stream sent), so a lookup walks the request's hash chain once
//! per kind of pool and counts, for each pool, the leading blocks it holds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use ferrite_proto::prefix::{self, BlockHash};
use ferrite_proto::worker::v1 as pb;
use ferrite_proto::worker::v1::worker_client::WorkerClient;
use futures::StreamExt;
use tonic::transport::Channel;

/// Waits between attempts to (re)open a pool's stream: doubling from the first to the last.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_LAST: Duration = Duration::from_secs(5);

/// How long a pick may take to show in the pool's load reports (two report intervals): a
/// report that arrives this long after a pick includes it.
pub const PICK_MEMORY: Duration = Duration::from_millis(100);
/// Picks remembered per pool at most (a pool that never reports again stops counting more).
const MAX_PICKS: usize = 4096;

/// What a pool's stream said of its cache.
#[derive(Debug, Clone)]
struct PoolCache {
    /// The pool's bit in the block entries.
    slot: u32,
    seed: Option<BlockHash>,
    block_size: usize,
    load: pb::Load,
    /// When the last load report arrived.
    reported_at: Instant,
    /// This gateway's picks of the pool (when, tokens to prefill), oldest first.
    picks: VecDeque<(Instant, usize)>,
}

impl PoolCache {
    /// Whether the pool's reports show a pick made at `t`: one arrived long enough after it.
    fn shows(&self, t: Instant) -> bool {
        self.reported_at.saturating_duration_since(t) >= PICK_MEMORY
    }

    /// Tokens of the picks the pool's reports may not show yet.
    fn unreported_tokens(&self) -> usize {
        self.picks
            .iter()
            .filter(|&&(t, _)| !self.shows(t))
            .map(|&(_, n)| n)
            .sum()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Block hash → slots of the pools that hold it.
    blocks: HashMap<BlockHash, Vec<u32>>,
    pools: HashMap<String, PoolCache>,
    next_slot: u32,
}

impl State {
    /// Drops every block of `pool` from the index (and the pool, unless `keep`).
    fn clear(&mut self, pool: &str, keep: bool) {
        let Some(slot) = self.pools.get(pool).map(|p| p.slot) else {
            return;
        };
        self.blocks.retain(|_, holders| {
            holders.retain(|&s| s != slot);
            !holders.is_empty()
        });
        if !keep {
            self.pools.remove(pool);
        }
    }
}

/// What one pool would reuse of a request's prompt, and its load as it last reported it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolPrefix {
    /// Leading prompt tokens whose blocks the pool holds.
    pub cached_tokens: usize,
    /// Tokens per block (0: the pool caches no prefixes, or has not said yet).
    pub block_size: usize,
    /// `None` until the pool's stream has said something.
    pub load: Option<pb::Load>,
    /// Prompt tokens this gateway sent the pool that its load report may not show yet.
    pub routed_tokens: usize,
}

/// The index, shared by the gateway's routing and the tasks that follow each pool. Cheap to
/// clone.
#[derive(Debug, Clone, Default)]
pub struct KvIndex {
    state: Arc<RwLock<State>>,
    watchers: Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>>,
}

impl KvIndex {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one message of `pool`'s stream: a reset drops what was known of it and says how
    /// its blocks are named; then its removed blocks leave the index and its stored ones join.
    pub fn apply(&self, pool: &str, msg: pb::KvCacheUpdate) {
        let mut st = self.write();
        if msg.reset {
            st.clear(pool, true);
            let slot = match st.pools.get(pool) {
                Some(p) => p.slot,
                None => {
                    st.next_slot += 1;
                    st.next_slot
                }
            };
            let seed = BlockHash::from_bytes(&msg.hash_seed);
            let picks = st
                .pools
                .get_mut(pool)
                .map(|p| std::mem::take(&mut p.picks))
                .unwrap_or_default();
            st.pools.insert(
                pool.to_owned(),
                PoolCache {
                    slot,
                    block_size: if seed.is_some() {
                        msg.block_size as usize
                    } else {
                        0
                    },
                    seed,
                    load: msg.load.unwrap_or_default(),
                    reported_at: Instant::now(),
                    picks,
                },
            );
        }
        let Some(p) = st.pools.get_mut(pool) else {
            // Changes before any snapshot: nothing to apply them to.
            return;
        };
        if let Some(load) = msg.load {
            p.load = load;
            p.reported_at = Instant::now();
        }
        let slot = p.slot;
        for h in msg.removed.iter().filter_map(|b| BlockHash::from_bytes(b)) {
            if let Some(holders) = st.blocks.get_mut(&h) {
                holders.retain(|&s| s != slot);
                if holders.is_empty() {
                    st.blocks.remove(&h);
                }
            }
        }
        for h in msg.stored.iter().filter_map(|b| BlockHash::from_bytes(b)) {
            let holders = st.blocks.entry(h).or_default();
            if !holders.contains(&slot) {
                holders.push(slot);
            }
        }
    }

    /// This gateway just sent `pool` a request with `tokens` to prefill: they count in its
    /// backlog until its load reports show them.
    pub fn note_routed(&self, pool: &str, tokens: usize) {
        let mut st = self.write();
        let Some(p) = st.pools.get_mut(pool) else {
            return;
        };
        // Shown picks are the oldest: drop them from the front.
        while let Some(&(t, _)) = p.picks.front() {
            if !p.shows(t) && p.picks.len() < MAX_PICKS {
                break;
            }
            p.picks.pop_front();
        }
        p.picks.push_back((Instant::now(), tokens));
    }

    /// `pool`'s stream is down: its blocks leave the index until it is back.
    pub fn disconnected(&self, pool: &str) {
        self.write().clear(pool, false);
        ferrite_telemetry::metrics::gateway_kv_index_blocks(pool, 0);
    }

    /// Blocks the index holds for each pool it hears from (for `/metrics`).
    pub fn block_counts(&self) -> Vec<(String, usize)> {
        let st = self.read();
        let mut per_slot: HashMap<u32, usize> = HashMap::new();
        for holders in st.blocks.values() {
            for &s in holders {
                *per_slot.entry(s).or_default() += 1;
            }
        }
        st.pools
            .iter()
            .map(|(name, p)| (name.clone(), per_slot.get(&p.slot).copied().unwrap_or(0)))
            .collect()
    }

    /// Stops following `pool` and forgets it.
    pub fn forget(&self, pool: &str) {
        if let Some(w) = self
            .watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(pool)
        {
            w.abort();
        }
        self.disconnected(pool);
    }

    /// Stops following every pool.
    pub fn forget_all(&self) {
        let names: Vec<String> = self
            .watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        for n in names {
            self.forget(&n);
        }
    }

    /// Follows `pool`'s prefix cache through `client` (replacing any earlier follower), until
    /// [`Self::forget`]: reconnecting after every fault, each time from a fresh snapshot.
    pub fn watch(&self, pool: &str, client: WorkerClient<Channel>) {
        let index = self.clone();
        let name = pool.to_owned();
        let task = tokio::spawn(async move { index.follow(&name, client).await });
        if let Some(old) = self
            .watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(pool.to_owned(), task.abort_handle())
        {
            old.abort();
        }
    }

    async fn follow(&self, pool: &str, mut client: WorkerClient<Channel>) {
        let mut wait = RETRY_FIRST;
        loop {
            if let Ok(response) = client.watch_kv_cache(pb::WatchKvCacheRequest {}).await {
                let mut stream = response.into_inner();
                while let Some(Ok(msg)) = stream.next().await {
                    if msg.reset {
                        wait = RETRY_FIRST;
                    }
                    self.apply(pool, msg);
                }
            }
            self.disconnected(pool);
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RETRY_LAST);
        }
    }

    /// For each of `pools`: the leading tokens of `prompt` whose blocks it holds, and its load.
    /// At most `(len − 1) / block_size` blocks count, as the engine reuses no more (the last
    /// token is always computed). A request that runs with LoRA adapter `lora` looks for the
    /// blocks of its own chain, which starts from the adapter's seed in each pool.
    pub fn lookup(&self, pools: &[&str], prompt: &[u32], lora: Option<&str>) -> Vec<PoolPrefix> {
        let st = self.read();
        let mut out: Vec<PoolPrefix> = pools
            .iter()
            .map(|name| match st.pools.get(*name) {
                Some(p) => PoolPrefix {
                    cached_tokens: 0,
                    block_size: p.block_size,
                    load: Some(p.load),
                    routed_tokens: p.unreported_tokens(),
                },
                None => PoolPrefix::default(),
            })
            .collect();
        // One hash chain per way of naming blocks among these pools (usually one).
        let mut kinds: Vec<(BlockHash, usize)> = pools
            .iter()
            .filter_map(|n| st.pools.get(*n))
            .filter_map(|p| p.seed.map(|s| (s, p.block_size)))
            .filter(|&(_, bs)| bs > 0)
            .collect();
        kinds.sort();
        kinds.dedup();
        for (seed, bs) in kinds {
            let usable = &prompt[..prompt.len().saturating_sub(1) / bs * bs];
            let first = lora.map_or(seed, |name| prefix::adapter_seed(seed, name));
            let chain = prefix::chain(first, bs, usable);
            // (position in `pools`, slot) of the pools naming blocks this way, still matching.
            let mut alive: Vec<(usize, u32)> = pools
                .iter()
                .enumerate()
                .filter_map(|(i, n)| st.pools.get(*n).map(|p| (i, p)))
                .filter(|(_, p)| p.seed == Some(seed) && p.block_size == bs)
                .map(|(i, p)| (i, p.slot))
                .collect();
            for h in &chain {
                let Some(holders) = st.blocks.get(h) else {
                    break;
                };
                alive.retain(|(_, slot)| holders.contains(slot));
                if alive.is_empty() {
                    break;
                }
                for &(i, _) in &alive {
                    out[i].cached_tokens += bs;
                }
            }
        }
        out
    }

    /// Blocks `pool` holds, as the index knows.
    pub fn blocks_of(&self, pool: &str) -> usize {
        self.block_counts()
            .into_iter()
            .find(|(n, _)| n == pool)
            .map_or(0, |(_, b)| b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(seed: BlockHash, tokens: &[u32]) -> Vec<Vec<u8>> {
        prefix::chain(seed, 4, tokens)
            .iter()
            .map(|h| h.to_bytes().to_vec())
            .collect()
    }

    fn snapshot(seed: BlockHash, stored: Vec<Vec<u8>>, pending: u64) -> pb::KvCacheUpdate {
        pb::KvCacheUpdate {
            reset: true,
            block_size: 4,
            hash_seed: seed.to_bytes().to_vec(),
            stored,
            load: Some(pb::Load {
                pending_tokens: pending,
                kv_blocks_total: 100,
                ..pb::Load::default()
            }),
            ..pb::KvCacheUpdate::default()
        }
    }

    #[test]
    fn lookups_count_the_leading_blocks_each_pool_holds() {
        let seed = prefix::seed("m");
        let prompt: Vec<u32> = (1..=17).collect();
        let index = KvIndex::default();
        // a holds the first three blocks, b the first and the third (not a prefix past one).
        let all = hashes(seed, &prompt);
        index.apply("a", snapshot(seed, all[..3].to_vec(), 5));
        index.apply("b", snapshot(seed, vec![all[0].clone(), all[2].clone()], 0));
        let got = index.lookup(&["a", "b", "c"], &prompt, None);
        assert_eq!(got[0].cached_tokens, 12);
        assert_eq!(got[1].cached_tokens, 4);
        assert_eq!(got[2], PoolPrefix::default(), "c never reported");
        assert_eq!(got[0].load.as_ref().map(|l| l.pending_tokens), Some(5));
        // A whole prompt of full blocks: the last token is computed anyway, so its block
        // does not count.
        index.apply(
            "a",
            pb::KvCacheUpdate {
                stored: all[3..].to_vec(),
                ..pb::KvCacheUpdate::default()
            },
        );
        assert_eq!(
            index.lookup(&["a"], &prompt[..16], None)[0].cached_tokens,
            12
        );
        assert_eq!(index.lookup(&["a"], &prompt, None)[0].cached_tokens, 16);
    }

    #[test]
    fn a_lora_request_finds_the_blocks_of_its_adapter_only() {
        let seed = prefix::seed("m");
        let prompt: Vec<u32> = (1..=9).collect();
        let index = KvIndex::default();
        // a's blocks were computed with adapter sql, b's with none.
        let sql = hashes(prefix::adapter_seed(seed, "sql"), &prompt);
        index.apply("a", snapshot(seed, sql, 0));
        index.apply("b", snapshot(seed, hashes(seed, &prompt), 0));
        let cached = |lora| {
            let got = index.lookup(&["a", "b"], &prompt, lora);
            (got[0].cached_tokens, got[1].cached_tokens)
        };
        assert_eq!(cached(Some("sql")), (8, 0));
        assert_eq!(cached(None), (0, 8));
        assert_eq!(cached(Some("chat")), (0, 0));
    }

    #[test]
    fn removals_resets_and_disconnects_take_blocks_out() {
        let seed = prefix::seed("m");
        let prompt: Vec<u32> = (1..=9).collect();
        let all = hashes(seed, &prompt);
        let index = KvIndex::default();
        index.apply("a", snapshot(seed, all.clone(), 0));
        assert_eq!(index.blocks_of("a"), 2);
        index.apply(
            "a",
            pb::KvCacheUpdate {
                removed: vec![all[1].clone()],
                ..pb::KvCacheUpdate::default()
            },
        );
        assert_eq!(index.lookup(&["a"], &prompt, None)[0].cached_tokens, 4);
        // A reconnect's snapshot replaces everything known of the pool.
        index.apply("a", snapshot(seed, vec![], 0));
        assert_eq!(index.lookup(&["a"], &prompt, None)[0].cached_tokens, 0);
        index.apply("a", snapshot(seed, all.clone(), 0));
        index.disconnected("a");
        assert_eq!(
            index.lookup(&["a"], &prompt, None)[0],
            PoolPrefix::default()
        );
        // Changes before a snapshot are not applied.
        index.apply(
            "b",
            pb::KvCacheUpdate {
                stored: all,
                ..pb::KvCacheUpdate::default()
            },
        );
        assert_eq!(index.blocks_of("b"), 0);
    }

    #[test]
    fn picks_count_until_the_pools_reports_show_them() {
        let seed = prefix::seed("m");
        let index = KvIndex::default();
        index.apply("a", snapshot(seed, vec![], 7));
        index.note_routed("a", 100);
        index.note_routed("a", 20);
        index.note_routed("b", 5);
        let got = index.lookup(&["a", "b"], &[1, 2, 3], None);
        assert_eq!(got[0].routed_tokens, 120);
        assert_eq!(
            got[1].routed_tokens, 0,
            "b never reported: unknown, idle and cold"
        );
        // A report right after the picks may not show them yet: they still count ...
        let load_only = pb::KvCacheUpdate {
            load: Some(pb::Load::default()),
            ..pb::KvCacheUpdate::default()
        };
        index.apply("a", load_only.clone());
        assert_eq!(index.lookup(&["a"], &[1], None)[0].routed_tokens, 120);
        // ... until they are older than the memory and a report came after them.
        std::thread::sleep(PICK_MEMORY);
        assert_eq!(index.lookup(&["a"], &[1], None)[0].routed_tokens, 120);
        index.apply("a", load_only);
        assert_eq!(index.lookup(&["a"], &[1], None)[0].routed_tokens, 0);
        // A pool that stops reporting keeps paying for every pick.
        index.note_routed("a", 9);
        std::thread::sleep(PICK_MEMORY);
        assert_eq!(index.lookup(&["a"], &[1], None)[0].routed_tokens, 9);
    }

    #[test]
    fn pools_of_another_model_identity_never_match() {
        let prompt: Vec<u32> = (1..=9).collect();
        let (s1, s2) = (prefix::seed("m1"), prefix::seed("m2"));
        let index = KvIndex::default();
        index.apply("a", snapshot(s1, hashes(s1, &prompt), 0));
        // b says it holds a's hashes but names blocks with another seed.
        index.apply("b", snapshot(s2, hashes(s1, &prompt), 0));
        let got = index.lookup(&["a", "b"], &prompt, None);
        assert_eq!((got[0].cached_tokens, got[1].cached_tokens), (8, 0));
        // A pool that caches nothing (block size 0) matches nothing.
        index.apply(
            "c",
            pb::KvCacheUpdate {
                reset: true,
                ..pb::KvCacheUpdate::default()
            },
        );
        assert_eq!(index.lookup(&["c"], &prompt, None)[0].block_size, 0);
    }
}
