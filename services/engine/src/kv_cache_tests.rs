//! The invariants of the module doc, each with a test (numbered as there), and a long random
//! run against a shadow model that checks all of them after every operation.

use super::*;

fn h(n: u128) -> BlockHash {
    BlockHash(n)
}

/// Walks the free queue both ways and checks every structural invariant: links agree, the
/// queue holds exactly the blocks with count 0, the index and the blocks' hashes agree.
fn check(pool: &KvBlockPool) {
    let mut forward = Vec::new();
    let mut b = pool.head;
    while b != NONE {
        forward.push(b);
        assert!(forward.len() <= pool.num_blocks(), "a cycle in the queue");
        b = pool.next[b as usize];
    }
    let mut backward = Vec::new();
    let mut b = pool.tail;
    while b != NONE {
        backward.push(b);
        assert!(backward.len() <= pool.num_blocks(), "a cycle in the queue");
        b = pool.prev[b as usize];
    }
    backward.reverse();
    assert_eq!(forward, backward, "the links agree");
    assert_eq!(forward.len(), pool.num_free());
    let mut queued = vec![false; pool.num_blocks()];
    for &b in &forward {
        assert!(!queued[b as usize], "block {b} queued twice");
        queued[b as usize] = true;
    }
    for (b, &q) in queued.iter().enumerate() {
        assert_eq!(q, pool.refs[b] == 0, "block {b}: queued iff free");
    }
    assert_eq!(pool.num_free() + pool.num_used(), pool.num_blocks());
    for (hash, &b) in &pool.index {
        assert_eq!(pool.hash[b as usize], Some(*hash), "index and block agree");
    }
    let named = pool.hash.iter().filter(|x| x.is_some()).count();
    assert_eq!(named, pool.index.len());
    let empty = forward
        .iter()
        .filter(|&&b| pool.hash[b as usize].is_none())
        .count();
    assert_eq!(
        pool.num_empty(),
        empty,
        "free blocks without a cached prefix"
    );
}

/// 1: free + used = total; a shared block counts once per table holding it.
#[test]
fn free_plus_used_is_total_and_counts_are_the_tables_holding_a_block() {
    let mut pool = KvBlockPool::new(8);
    let mut a = BlockTable::default();
    let mut b = BlockTable::default();
    assert!(pool.allocate_into(3, &mut a));
    assert!(pool.allocate_into(5, &mut b));
    check(&pool);
    let mut all: Vec<u32> = a.blocks().iter().chain(b.blocks()).copied().collect();
    all.sort();
    assert_eq!(all, (0..8).collect::<Vec<_>>());
    assert_eq!(pool.allocate(), None);
    // A third table shares a's first block.
    let shared = a.blocks()[0];
    assert!(pool.register(shared, h(1)));
    let mut c = BlockTable::default();
    assert!(pool.hold_into(&[shared], &mut c));
    assert_eq!(pool.ref_count(shared), 2);
    assert_eq!(pool.num_used(), 8, "held twice, counted once");
    pool.release(&mut a);
    assert_eq!(pool.ref_count(shared), 1, "c still holds it");
    assert_eq!(pool.num_free(), 2);
    check(&pool);
}

/// 2: the queue is threaded through flat index vectors; every operation keeps it consistent
/// (the costs are O(1) by construction: no operation walks the queue).
#[test]
fn the_free_queue_stays_consistent_through_every_operation() {
    let mut pool = KvBlockPool::new(6);
    check(&pool);
    let mut t = BlockTable::default();
    assert!(pool.allocate_into(4, &mut t));
    check(&pool);
    for (i, &b) in t.blocks().iter().enumerate().take(2) {
        assert!(pool.register(b, h(i as u128)));
    }
    let hits = t.blocks()[..2].to_vec();
    pool.release(&mut t);
    check(&pool);
    let mut u = BlockTable::default();
    assert!(
        pool.hold_into(&hits[1..], &mut u),
        "a block from the middle of the queue"
    );
    check(&pool);
    assert!(pool.allocate_into(4, &mut u));
    check(&pool);
    pool.release(&mut u);
    check(&pool);
}

/// 3: all or nothing.
#[test]
fn allocation_is_all_or_nothing() {
    let mut pool = KvBlockPool::new(4);
    let mut a = BlockTable::default();
    assert!(pool.allocate_into(3, &mut a));
    let mut b = BlockTable::default();
    assert!(!pool.allocate_into(2, &mut b));
    assert!(b.is_empty());
    assert_eq!(pool.num_free(), 1);
    // Holding is all or nothing too: one unnamed block refuses the lot.
    assert!(pool.register(a.blocks()[0], h(5)));
    assert!(!pool.hold_into(&[a.blocks()[0], a.blocks()[1]], &mut b));
    assert!(b.is_empty());
    assert_eq!(pool.ref_count(a.blocks()[0]), 1);
    check(&pool);
}

/// 4: a block is freed once per hold, never more.
#[test]
fn freeing_past_zero_and_out_of_range_is_refused() {
    let mut pool = KvBlockPool::new(2);
    let b = pool.allocate().expect("one block");
    assert!(pool.register(b, h(1)));
    let mut t = BlockTable::default();
    assert!(pool.hold_into(&[b], &mut t));
    assert!(pool.free(b));
    assert!(pool.free(b));
    assert!(!pool.free(b), "a third free would queue it twice");
    assert!(!pool.free(7));
    assert_eq!(pool.num_free(), 2);
    check(&pool);
}

/// 5: cached blocks are never written: registered blocks are not private, a block is only
/// registered while held and unnamed, and allocation evicts before it hands a block out.
#[test]
fn a_cached_block_is_never_handed_out_for_writing_under_its_name() {
    let mut pool = KvBlockPool::new(3);
    let mut a = BlockTable::default();
    assert!(pool.allocate_into(1, &mut a));
    let b = a.blocks()[0];
    assert!(pool.is_private(b), "new and held once: writable");
    assert!(pool.register(b, h(9)));
    assert!(!pool.is_private(b), "cached: read-only from now on");
    assert!(!pool.register(b, h(10)), "named once");
    let free_block = pool.allocate().expect("a free block");
    pool.free(free_block);
    assert!(
        !pool.register(free_block, h(11)),
        "a free block is not registered"
    );
    pool.release(&mut a);
    // Only b (cached) and the two unnamed blocks are free: the unnamed go first.
    let mut t = BlockTable::default();
    assert!(pool.allocate_into(2, &mut t));
    assert!(!t.blocks().contains(&b), "cached blocks are evicted last");
    assert_eq!(pool.lookup(h(9)), Some(b));
    let taken = pool.allocate().expect("the cached block, evicted");
    assert_eq!(taken, b);
    assert_eq!(pool.lookup(h(9)), None, "evicted before it is written");
    assert!(pool.is_private(taken));
    check(&pool);
}

/// 6: no use after evict: a block some sequence holds is never evicted, however hard the pool
/// is pressed; once let go, it is evicted in least-recently-freed order.
#[test]
fn held_blocks_are_never_evicted_and_free_ones_go_least_recently_freed_first() {
    let mut pool = KvBlockPool::new(6);
    let mut a = BlockTable::default();
    assert!(pool.allocate_into(6, &mut a));
    for (i, &b) in a.blocks().iter().enumerate() {
        assert!(pool.register(b, h(i as u128)));
    }
    let blocks = a.blocks().to_vec();
    // A second sequence reuses the first two blocks (a prefix hit), then the first finishes.
    let mut reader = BlockTable::default();
    assert!(pool.hold_into(&blocks[..2], &mut reader));
    pool.release(&mut a);
    // Freed last block first: 5, 4, 3, 2 are free (0 and 1 are held by the reader).
    assert_eq!(pool.num_free(), 4);
    let mut writer = BlockTable::default();
    let mut evicted = Vec::new();
    while let Some(b) = pool.allocate() {
        evicted.push(b);
        writer.blocks.push(b);
    }
    assert_eq!(evicted, vec![blocks[5], blocks[4], blocks[3], blocks[2]]);
    for &b in &blocks[..2] {
        assert_eq!(
            pool.ref_count(b),
            1,
            "the reader's blocks were never handed out"
        );
    }
    assert_eq!(pool.lookup(h(0)), Some(blocks[0]));
    assert_eq!(pool.lookup(h(5)), None);
    // The reader lets go: its blocks are evictable now, and go next.
    pool.release(&mut reader);
    assert_eq!(pool.allocate(), Some(blocks[1]));
    check(&pool);
}

/// 7: one block per name: a second block with the same contents stays private.
#[test]
fn a_duplicate_block_stays_unregistered_and_private() {
    let mut pool = KvBlockPool::new(2);
    let (mut a, mut b) = (BlockTable::default(), BlockTable::default());
    assert!(pool.allocate_into(1, &mut a));
    assert!(pool.allocate_into(1, &mut b));
    assert!(pool.register(a.blocks()[0], h(3)));
    assert!(!pool.register(b.blocks()[0], h(3)));
    assert!(pool.is_private(b.blocks()[0]));
    assert_eq!(pool.lookup(h(3)), Some(a.blocks()[0]));
    check(&pool);
}

#[test]
fn events_record_stores_and_evictions_in_order_and_reset_forgets_free_blocks() {
    let mut pool = KvBlockPool::new(2);
    let mut a = BlockTable::default();
    assert!(pool.allocate_into(1, &mut a));
    assert!(
        pool.register(a.blocks()[0], h(1)),
        "not recorded: nobody listens"
    );
    assert!(pool.take_events().is_empty());
    pool.record_events(true);
    let mut b = BlockTable::default();
    assert!(pool.allocate_into(1, &mut b));
    assert!(pool.register(b.blocks()[0], h(2)));
    pool.release(&mut a);
    assert!(pool.allocate_into(1, &mut a), "evicts h(1)");
    assert_eq!(
        pool.take_events(),
        vec![KvEvent::Stored(h(2)), KvEvent::Removed(h(1))]
    );
    pool.release(&mut a);
    assert_eq!(pool.reset_cache(), 0, "h(2) is held: still cached");
    pool.release(&mut b);
    assert_eq!(pool.reset_cache(), 1);
    assert_eq!(pool.take_events(), vec![KvEvent::Removed(h(2))]);
    assert_eq!(pool.num_cached(), 0);
    check(&pool);
}

/// Thousands of random operations (allocate, hit, register, release) against a shadow of
/// each table: counts always equal the tables holding a block, a held block is never handed
/// out again, and the structure checks hold after every step.
#[test]
fn random_operations_keep_every_invariant() {
    let mut pool = KvBlockPool::new(16);
    let mut tables: Vec<BlockTable> = (0..5).map(|_| BlockTable::default()).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut names = 0u128;
    for _ in 0..5000 {
        let t = (next() % 5) as usize;
        match next() % 4 {
            0 => {
                let n = (next() % 4) as usize;
                let before = pool.num_free();
                let mut grown = tables[t].clone();
                if pool.allocate_into(n, &mut grown) {
                    let held: Vec<u32> = tables.iter().flat_map(|x| x.blocks().to_vec()).collect();
                    for b in &grown.blocks()[tables[t].len()..] {
                        assert!(!held.contains(b), "block {b} handed out while held");
                    }
                    tables[t] = grown;
                } else {
                    assert_eq!(pool.num_free(), before);
                }
            }
            1 => {
                let cached: Vec<BlockHash> = pool.cached_hashes();
                if let Some(&hash) = cached.get((next() as usize) % cached.len().max(1)) {
                    let b = pool.lookup(hash).expect("indexed");
                    assert!(pool.hold_into(&[b], &mut tables[t]));
                }
            }
            2 => {
                if let Some(&b) = tables[t].blocks().last()
                    && pool.is_private(b)
                {
                    names += 1;
                    assert!(pool.register(b, h(names)));
                }
            }
            _ => pool.release(&mut tables[t]),
        }
        for b in 0..pool.num_blocks() as u32 {
            let holders = tables
                .iter()
                .map(|x| x.blocks().iter().filter(|&&y| y == b).count())
                .sum::<usize>();
            assert_eq!(pool.ref_count(b) as usize, holders, "block {b}");
        }
        check(&pool);
    }
}
