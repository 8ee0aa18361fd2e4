use super::*;
use crate::kv_cache::BlockHash;

fn sched(budget: usize, max_seqs: usize, blocks: u32) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: max_seqs,
            max_model_len: 64,
            block_size: 4,
            prefix_cache: None,
            max_logits_rows: 64,
            whole_prompts: false,
        },
        blocks,
    )
}

/// Runs a step as the engine would: every chunk computed, sampling chunks get `token`.
fn run_step(s: &mut Scheduler, token: u32) -> Schedule {
    let plan = s.schedule();
    for c in &plan.chunks {
        s.mark_computed(c, 0);
        if c.samples {
            s.push_token(c.id, token);
        }
    }
    plan
}

/// An encoder's prompts run whole: one that does not fit what is left of a step waits for
/// the next (in its turn: a shorter one behind it does not pass it), and one longer than the
/// model takes is refused with its length.
#[test]
fn whole_prompts_wait_for_a_step_with_room_for_them() {
    let mut s = sched(12, 8, 64);
    s.cfg.whole_prompts = true;
    s.add(1, vec![0; 10]);
    s.add(2, vec![0; 8]);
    s.add(3, vec![0; 1]);
    let whole = |p: &Schedule| -> Vec<(u64, usize, usize)> {
        p.chunks.iter().map(|c| (c.id, c.start, c.len)).collect()
    };
    assert_eq!(whole(&run_step(&mut s, 9)), [(1, 0, 10)]);
    s.remove(1);
    assert_eq!(whole(&run_step(&mut s, 9)), [(2, 0, 8), (3, 0, 1)]);
    let e = s.check_fits(64).expect_err("64 positions of 63");
    assert!(e.contains("takes 63 at most"), "{e}");
    assert!(s.check_fits(63).is_ok());
}

#[test]
fn budget_bounds_every_step_and_prompts_are_chunked() {
    let mut s = sched(8, 8, 64);
    s.add(1, vec![0; 10]);
    s.add(2, vec![0; 3]);
    let p = run_step(&mut s, 9);
    assert_eq!(
        p.chunks,
        vec![ScheduledChunk {
            id: 1,
            start: 0,
            len: 8,
            samples: false,
            all_logits: false,
            drafts: 0
        }]
    );
    let p = run_step(&mut s, 9);
    // Seq 1 finishes its prompt (2 tokens) and samples; seq 2 gets the rest of the budget.
    assert_eq!(
        p.chunks,
        vec![
            ScheduledChunk {
                id: 1,
                start: 8,
                len: 2,
                samples: true,
                all_logits: false,
                drafts: 0
            },
            ScheduledChunk {
                id: 2,
                start: 0,
                len: 3,
                samples: true,
                all_logits: false,
                drafts: 0
            },
        ]
    );
    let p = run_step(&mut s, 9);
    assert_eq!(p.num_tokens(), 2, "two decodes");
    assert!(p.chunks.iter().all(|c| c.len == 1 && c.samples));
}

#[test]
fn max_num_seqs_limits_admission() {
    let mut s = sched(100, 2, 64);
    for id in 0..3 {
        s.add(id, vec![0; 2]);
    }
    let p = run_step(&mut s, 1);
    assert_eq!(p.chunks.len(), 2);
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn admission_waits_for_free_blocks() {
    // 4 blocks of 4 tokens: seq 1 takes 3 blocks for its 12-token prompt.
    let mut s = sched(100, 8, 4);
    s.add(1, vec![0; 12]);
    s.add(2, vec![0; 8]);
    let p = run_step(&mut s, 1);
    assert_eq!(p.chunks.len(), 1);
    assert_eq!(s.num_waiting(), 1);
    assert_eq!(s.blocks_used(), 3);
    s.remove(1);
    assert_eq!(s.blocks_used(), 0);
    let p = run_step(&mut s, 1);
    assert_eq!(p.chunks[0].id, 2);
}

#[test]
fn preemption_frees_the_newest_and_it_recomputes_later() {
    // 4 blocks. Two 7-token prompts take 2 blocks each; growing past 8 tokens needs a 5th.
    let mut s = sched(100, 8, 4);
    s.add(1, vec![0; 7]);
    s.add(2, vec![0; 7]);
    run_step(&mut s, 1); // both prefill and sample: 8 tokens each, 7 computed
    assert_eq!(s.blocks_used(), 4);
    let p = run_step(&mut s, 1); // token 8 fits in block 2: both decode
    assert_eq!(p.chunks.len(), 2);
    // Now 9 tokens each, 8 computed: token 9 needs a third block each; none free.
    let p = run_step(&mut s, 1);
    assert_eq!(p.preempted, vec![2]);
    assert_eq!(
        p.chunks,
        vec![ScheduledChunk {
            id: 1,
            start: 8,
            len: 1,
            samples: true,
            all_logits: false,
            drafts: 0
        }]
    );
    let seq2 = s.get(2).expect("seq 2 kept");
    assert_eq!(
        (
            seq2.num_computed,
            seq2.block_table.len(),
            seq2.num_preemptions
        ),
        (0, 0, 1)
    );
    assert_eq!(
        seq2.tokens.len(),
        9,
        "generated tokens are kept for recompute"
    );
    s.remove(1);
    let p = run_step(&mut s, 1);
    assert_eq!(
        p.chunks,
        vec![ScheduledChunk {
            id: 2,
            start: 0,
            len: 9,
            samples: true,
            all_logits: false,
            drafts: 0
        }]
    );
}

#[test]
fn a_lone_sequence_that_outgrows_the_pool_preempts_itself_without_looping() {
    let mut s = sched(100, 8, 1);
    s.add(1, vec![0; 4]);
    run_step(&mut s, 1); // 4 computed + 1 sampled = 5 tokens: needs a second block
    let p = s.schedule();
    assert_eq!(p.preempted, vec![1]);
    assert!(p.chunks.is_empty());
}

#[test]
fn prompts_that_can_never_fit_are_refused() {
    let s = sched(8, 8, 64);
    assert!(s.check_fits(63).is_ok());
    let err = s.check_fits(64).expect_err("too long");
    assert!(err.contains("64 tokens"), "{err}");
}

fn cached_sched(budget: usize, blocks: u32) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: 8,
            max_model_len: 64,
            block_size: 4,
            prefix_cache: Some(prefix::seed("test model")),
            max_logits_rows: 64,
            whole_prompts: false,
        },
        blocks,
    )
}

/// Runs `id` alone until its prompt is computed and one token sampled, then finishes it.
fn run_alone(s: &mut Scheduler, id: SeqId, prompt: Vec<u32>) -> Schedule {
    s.add(id, prompt);
    let first = run_step(s, 100);
    while s.get(id).is_some_and(|q| q.num_computed < q.prompt_len) {
        run_step(s, 100);
    }
    s.remove(id);
    first
}

#[test]
fn a_new_sequence_starts_after_its_longest_cached_prefix() {
    let mut s = cached_sched(100, 16);
    let first: Vec<u32> = (1..=10).collect();
    let p = run_alone(&mut s, 1, first.clone());
    assert_eq!(p.chunks[0].start, 0, "nothing cached yet");
    assert_eq!(s.blocks_cached(), 2, "the two full blocks of the prompt");
    assert_eq!(
        s.blocks_used(),
        0,
        "finished: its blocks are free but cached"
    );
    // Same first 8 tokens, another tail: two blocks reused, the rest computed.
    let mut second = first[..8].to_vec();
    second.extend([50, 51, 52, 53]);
    s.add(2, second);
    let p = s.schedule();
    assert_eq!(
        p.chunks,
        vec![ScheduledChunk {
            id: 2,
            start: 8,
            len: 4,
            samples: true,
            all_logits: false,
            drafts: 0
        }]
    );
    let seq = s.get(2).expect("seq 2");
    assert_eq!(seq.num_cached_tokens, Some(8));
    assert_eq!(s.prefix_cache_counts(), (10 + 12, 8));
    for c in &p.chunks {
        s.check_writes(c).expect("writes only its own blocks");
    }
}

#[test]
fn a_partial_hit_stops_at_the_first_block_that_differs() {
    let mut s = cached_sched(100, 16);
    run_alone(&mut s, 1, (1..=12).collect());
    let mut other: Vec<u32> = (1..=12).collect();
    other[5] = 99; // in the second block
    s.add(2, other);
    let p = s.schedule();
    assert_eq!((p.chunks[0].start, p.chunks[0].len), (4, 8));
}

#[test]
fn a_whole_prompt_in_the_cache_still_computes_its_last_token() {
    let mut s = cached_sched(100, 16);
    let prompt: Vec<u32> = (1..=8).collect();
    run_alone(&mut s, 1, prompt.clone());
    s.add(2, prompt);
    let p = s.schedule();
    // Two full blocks are cached, but the last token's logits are needed: the second block
    // is computed again (into a block of its own), the first reused.
    assert_eq!((p.chunks[0].start, p.chunks[0].len), (4, 4));
    s.check_writes(&p.chunks[0]).expect("a private block");
}

#[test]
fn blocks_shared_by_running_sequences_outlive_any_one_of_them() {
    let mut s = cached_sched(100, 8);
    let prefix: Vec<u32> = (1..=8).collect();
    run_alone(&mut s, 1, prefix.iter().copied().chain([9]).collect());
    let shared: Vec<u32> = (0..2)
        .map(|j| s.pool.lookup(s.get_hashes(&prefix)[j]).expect("cached"))
        .collect();
    for id in [2, 3] {
        s.add(id, prefix.iter().copied().chain([id as u32 + 20]).collect());
    }
    run_step(&mut s, 7);
    for &b in &shared {
        assert_eq!(s.pool.ref_count(b), 2, "both running sequences hold it");
    }
    s.remove(2);
    for &b in &shared {
        assert_eq!(s.pool.ref_count(b), 1, "still held by seq 3");
    }
    // A newcomer that needs every free block cannot take them.
    s.add(4, (30..52).collect());
    let p = s.schedule();
    assert!(p.chunks.iter().all(|c| c.id != 4), "it waits: {p:?}");
    assert_eq!(s.block_table(3)[..2], shared[..]);
}

impl Scheduler {
    /// The chained hashes of `tokens` under this scheduler's seed.
    fn get_hashes(&self, tokens: &[u32]) -> Vec<BlockHash> {
        let seed = self.cfg.prefix_cache.expect("caching on");
        prefix::chain(seed, self.cfg.block_size, tokens)
    }
}

/// A model of the KV storage that catches a use after evict: each slot remembers which prefix
/// (a hash of the tokens up to and including its position) was computed into it. Before a
/// chunk runs, every position it attends to must hold its own sequence's prefix; a block
/// evicted and rewritten under a running sequence, or a shared block written by one of its
/// readers, shows up as a slot holding another prefix.
#[test]
fn no_sequence_ever_reads_a_slot_written_for_another_prefix() {
    fn prefix_id(tokens: &[u32]) -> u64 {
        tokens.iter().fold(0xcbf2_9ce4_8422_2325, |h, &t| {
            (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3)
        })
    }
    let bs = 4;
    let mut s = cached_sched(12, 10);
    let mut slots: Vec<Option<u64>> = vec![None; 10 * bs];
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let bases: [Vec<u32>; 3] = [(1..=9).collect(), (20..=27).collect(), (40..=52).collect()];
    let (mut next_id, mut hits, mut preemptions) = (0u64, 0u64, 0usize);
    for _ in 0..3000 {
        if s.num_waiting() + s.num_running() < 8 && next() % 2 == 0 {
            next_id += 1;
            let mut prompt = bases[(next() % 3) as usize].clone();
            prompt.truncate(4 + (next() % 6) as usize);
            prompt.extend((0..next() % 5).map(|_| (next() % 4) as u32));
            s.add(next_id, prompt);
        }
        let plan = s.schedule();
        preemptions += plan.preempted.len();
        for c in &plan.chunks {
            s.check_writes(c).expect("writes stay private");
            let seq = s.get(c.id).expect("planned");
            let table = seq.block_table.blocks();
            for q in 0..c.start {
                let slot = table[q / bs] as usize * bs + q % bs;
                assert_eq!(
                    slots[slot],
                    Some(prefix_id(&seq.tokens[..=q])),
                    "seq {} reads position {q} from block {}",
                    c.id,
                    table[q / bs]
                );
            }
        }
        for c in &plan.chunks {
            let seq = s.get(c.id).expect("planned");
            let table = seq.block_table.blocks();
            for p in c.start..c.start + c.len {
                slots[table[p / bs] as usize * bs + p % bs] = Some(prefix_id(&seq.tokens[..=p]));
            }
        }
        for c in &plan.chunks {
            s.mark_computed(c, 0);
            if c.samples {
                s.push_token(c.id, (next() % 4) as u32);
                let done = s
                    .get(c.id)
                    .is_some_and(|q| q.tokens.len() > 14 + (c.id as usize % 8));
                if done || next() % 40 == 0 {
                    s.remove(c.id);
                }
            }
        }
        hits = s.prefix_cache_counts().1;
    }
    assert!(hits > 1000, "prefixes were reused ({hits} tokens)");
    assert!(
        preemptions > 10,
        "the pool was pressed ({preemptions} preemptions)"
    );
}

/// A scored prompt takes nothing from the prefix cache, and its chunks bring back a row of
/// logits per token, cut to what the step's room leaves once every running sequence has its
/// row: a decode beside it is never crowded out.
#[test]
fn a_scored_prompt_is_computed_whole_within_the_steps_rows() {
    let mut s = cached_sched(16, 32);
    s.cfg.max_logits_rows = 6;
    let prompt: Vec<u32> = (1..=10).collect();
    run_alone(&mut s, 1, prompt.clone());
    assert_eq!(s.blocks_cached(), 2);
    s.add(2, vec![7; 9]);
    run_step(&mut s, 100);
    // 2 decodes (1 row) while 3 is admitted: cut to the 5 rows left.
    s.add_scored(3, prompt.clone());
    let p = run_step(&mut s, 100);
    let chunk = |id, start, len, samples, all_logits| ScheduledChunk {
        id,
        start,
        len,
        samples,
        all_logits,
        drafts: 0,
    };
    assert_eq!(
        p.chunks,
        vec![chunk(2, 9, 1, true, false), chunk(3, 0, 5, false, true)]
    );
    assert_eq!(s.get(3).map(|q| q.num_cached_tokens), Some(Some(0)));
    // 2 keeps its row; 3 takes the other 5, and its last chunk samples.
    let p = run_step(&mut s, 100);
    assert_eq!(
        p.chunks,
        vec![chunk(2, 10, 1, true, false), chunk(3, 5, 5, true, true)]
    );
    assert!(p.chunks.iter().map(ScheduledChunk::rows).sum::<usize>() <= 6);
    // Its output is not scored: a plain decode.
    let p = run_step(&mut s, 100);
    assert_eq!(p.chunks[1], chunk(3, 10, 1, true, false));
    // A sequence added plainly with the same prompt finds it cached (8 of its 10 tokens).
    s.add(4, prompt);
    let p = run_step(&mut s, 100);
    assert_eq!(p.chunks[2], chunk(4, 8, 2, true, false));
}

/// Drafts run whole with their sequence's last token, a row each; the accepted ones stay and
/// the rest leave before any block is named; a chunk the step would cut runs without them,
/// and a sequence that does not decode takes none.
#[test]
fn drafts_run_whole_and_only_the_accepted_ones_stay() {
    let mut s = cached_sched(8, 32);
    s.add(1, vec![1, 2, 3, 4, 5]);
    run_step(&mut s, 100);
    // Waiting, and then mid-prefill: no drafts.
    s.add(2, vec![6; 12]);
    s.set_drafts(2, &[9, 9]);
    assert_eq!(s.get(2).map(|q| q.drafts), Some(0));
    s.set_drafts(1, &[7, 8, 9]);
    let p = s.schedule();
    let c = p.chunks[0];
    assert_eq!(
        (c.start, c.len, c.samples, c.all_logits),
        (5, 4, true, true)
    );
    assert_eq!(
        (c.drafts, c.rows(), c.sampling_rows(), c.first_sampled()),
        (3, 4, 4, 6)
    );
    // 2 takes the other 4 tokens of the budget.
    assert_eq!((p.chunks[1].id, p.chunks[1].len), (2, 4));
    // Its rows agreed with 7, not 8: 7 stays and the token sampled in 8's place follows.
    s.mark_computed(&c, 1);
    s.mark_computed(&p.chunks[1], 0);
    s.push_token(1, 50);
    let q = s.get(1).expect("running");
    assert_eq!(q.tokens, vec![1, 2, 3, 4, 5, 100, 7, 50]);
    assert_eq!((q.num_computed, q.drafts), (7, 0));
    assert!(q.decodes());
    // The cache names only blocks of accepted tokens: a prompt of them finds its first block
    // and not the second (which would hold a rejected draft's keys).
    assert_eq!(q.block_hashes.len(), 1);
    // 7 drafts and 2 still prefilling: 1 + 7 tokens leave 2 no token of the budget of 8.
    s.set_drafts(1, &[1; 7]);
    let p = s.schedule();
    assert_eq!((p.chunks[0].len, p.chunks[0].drafts), (1, 0));
    assert_eq!(s.get(1).map(|q| q.tokens.len()), Some(8));
    assert_eq!(p.chunks[1].id, 2);
}
