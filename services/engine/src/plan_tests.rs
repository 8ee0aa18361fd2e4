//! The plan invariants of the module doc, each with a test: tables on a rank rebuilt from the
//! plans equal the scheduler's, through chunked prefill, preemption, finishing and aborts, and
//! through the wire encoding; out-of-order plans and unknown sequences are refused.

use super::*;
use crate::scheduler::SchedulerConfig;

fn sched(blocks: u32) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: 8,
            max_num_seqs: 8,
            max_model_len: 64,
            block_size: 4,
            prefix_cache: None,
            max_logits_rows: 64,
            whole_prompts: false,
        },
        blocks,
    )
}

/// One step as the leader and a rank run it: schedule, plan, send (encoded), apply on the rank,
/// compute, sample `token`; finished sequences (at `len` tokens) are removed and forgotten.
fn step(
    s: &mut Scheduler,
    b: &mut PlanBuilder,
    rank: &mut BlockTables,
    len: usize,
) -> Result<StepPlan> {
    let schedule = s.schedule();
    let mut plan = b.build(&schedule, s)?;
    // As a GPU leader would set it: the wire must carry it.
    plan.graph = Some(plan.chunks.len().next_power_of_two());
    let Order::Step(received) = Order::decode(&OrderRef::Step(&plan).encode())? else {
        panic!("a step plan decodes as a step");
    };
    assert_eq!(received, plan, "the wire keeps every field");
    rank.apply(&received)?;
    let chunks = rank.chunks(&received)?;
    for (c, planned) in schedule.chunks.iter().zip(&chunks) {
        let seq = s.get(c.id).expect("planned sequence");
        assert_eq!(
            planned.block_table,
            seq.block_table.blocks(),
            "seq {}",
            c.id
        );
        assert_eq!(planned.tokens, &seq.tokens[c.start..c.start + c.len]);
        assert_eq!(planned.start_pos, c.start);
        // Any prompt token makes a prompt chunk (the CPU's activations differ for them); a
        // generated token alone does not.
        if c.start < seq.prompt_len {
            assert!(
                planned.prompt,
                "seq {} at {}: a prompt chunk",
                c.id, c.start
            );
        } else if c.len == 1 {
            assert!(
                !planned.prompt,
                "seq {} at {}: a decode step",
                c.id, c.start
            );
        }
    }
    for c in &schedule.chunks {
        s.mark_computed(c, 0);
        if c.samples {
            s.push_token(c.id, 7);
            if s.get(c.id).is_some_and(|q| q.tokens.len() >= len) {
                s.remove(c.id);
                b.forget(c.id);
            }
        }
    }
    Ok(plan)
}

#[test]
fn tables_rebuilt_from_plans_equal_the_schedulers() -> Result<()> {
    let (mut s, mut b, mut rank) = (sched(64), PlanBuilder::default(), BlockTables::default());
    s.add(1, vec![1; 10]);
    s.add(2, vec![2; 3]);
    let first = step(&mut s, &mut b, &mut rank, 20)?;
    // A new sequence's table comes in full; tokens come with their chunk.
    assert_eq!(first.tables.len(), 1);
    assert!(first.tables[0].new);
    assert_eq!(first.chunks[0].tokens, vec![1; 8]);
    let (mut grown, mut freed) = (0, 0);
    for _ in 0..30 {
        if !s.has_work() {
            break;
        }
        let p = step(&mut s, &mut b, &mut rank, 20)?;
        grown += p.tables.iter().filter(|t| !t.new).count();
        freed += p.freed.len();
        // A decode step sends one token per sequence.
        for c in &p.chunks {
            assert!(c.tokens.len() <= 8);
        }
    }
    assert!(!s.has_work(), "both finished");
    assert!(grown > 0, "tables grew by diffs");
    // Each finished sequence's table is dropped with the plan after its last token.
    let last = step(&mut s, &mut b, &mut rank, 20)?;
    assert_eq!(freed + last.freed.len(), 2, "{last:?}");
    assert!(rank.is_empty());
    Ok(())
}

/// A prompt's last token, left alone by chunked prefill (9 tokens, 8 a step), is still a
/// prompt chunk; the token generated after it is not.
#[test]
fn a_prompts_last_token_alone_is_still_a_prompt_chunk() -> Result<()> {
    let (mut s, mut b, mut rank) = (sched(64), PlanBuilder::default(), BlockTables::default());
    s.add(1, vec![1; 9]);
    let kinds: Vec<(usize, bool)> = (0..3)
        .map(|_| {
            step(&mut s, &mut b, &mut rank, 20)
                .map(|p| (p.chunks[0].tokens.len(), p.chunks[0].prompt))
        })
        .collect::<Result<_>>()?;
    assert_eq!(kinds, [(8, true), (1, true), (1, false)]);
    Ok(())
}

#[test]
fn preempted_sequences_are_freed_and_sent_again_in_full() -> Result<()> {
    // 6 blocks of 4 tokens: two 12-token prompts fill them; decoding preempts the newest.
    let (mut s, mut b, mut rank) = (sched(6), PlanBuilder::default(), BlockTables::default());
    s.add(1, vec![1; 12]);
    s.add(2, vec![2; 12]);
    let mut preempted_and_freed = false;
    let mut resent = false;
    for _ in 0..60 {
        if !s.has_work() {
            break;
        }
        let p = step(&mut s, &mut b, &mut rank, 20)?;
        preempted_and_freed |= !p.freed.is_empty() && s.num_waiting() > 0;
        resent |= preempted_and_freed && p.tables.iter().any(|t| t.new);
    }
    assert!(preempted_and_freed, "a preemption freed a table");
    assert!(resent, "the preempted sequence came back in full");
    assert!(!s.has_work());
    Ok(())
}

#[test]
fn plans_out_of_order_or_naming_unknown_sequences_are_refused() {
    let mut rank = BlockTables::default();
    let skip = StepPlan {
        step: 2,
        ..StepPlan::default()
    };
    let e = rank.apply(&skip).expect_err("step 1 is missing");
    assert!(
        e.to_string().contains("last plan applied was step 0"),
        "{e}"
    );
    let grow_unknown = StepPlan {
        step: 1,
        tables: vec![TableUpdate {
            id: 5,
            new: false,
            blocks: vec![1],
        }],
        ..StepPlan::default()
    };
    assert!(rank.apply(&grow_unknown).is_err());
    let free_unknown = StepPlan {
        step: 1,
        freed: vec![9],
        ..StepPlan::default()
    };
    assert!(rank.apply(&free_unknown).is_err());
    let chunk_without_table = StepPlan {
        step: 1,
        chunks: vec![PlannedChunk {
            id: 3,
            start: 0,
            tokens: vec![1],
            logits: LogitsWanted::Last,
            prompt: true,
            lora: None,
        }],
        ..StepPlan::default()
    };
    rank.apply(&chunk_without_table).expect("nothing to apply");
    assert!(rank.chunks(&chunk_without_table).is_err());
    assert!(
        Order::decode(&[0xff, 0xff]).is_err(),
        "garbage does not decode"
    );
}

/// With prefix caching, a new sequence's table begins with another's (cached, shared) blocks
/// and its first chunk starts after them; the ranks rebuild exactly that table from the plan.
#[test]
fn a_table_that_begins_with_shared_cached_blocks_reaches_the_ranks_in_full() -> Result<()> {
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: 8,
            max_num_seqs: 8,
            max_model_len: 64,
            block_size: 4,
            prefix_cache: Some(ferrite_proto::prefix::seed("plan test")),
            max_logits_rows: 64,
            whole_prompts: false,
        },
        32,
    );
    let (mut b, mut rank) = (PlanBuilder::default(), BlockTables::default());
    let prompt: Vec<u32> = (1..=10).collect();
    s.add(1, prompt.clone());
    while s.get(1).is_some_and(|q| q.num_computed < 10) {
        step(&mut s, &mut b, &mut rank, 30)?;
    }
    let first_blocks = s.get(1).expect("seq 1").block_table.blocks()[..2].to_vec();
    s.add(2, prompt.iter().copied().chain([77, 78]).collect());
    let p = step(&mut s, &mut b, &mut rank, 30)?;
    let new = p
        .tables
        .iter()
        .find(|t| t.id == 2)
        .expect("seq 2's table is sent");
    assert!(new.new);
    assert_eq!(
        new.blocks[..2],
        first_blocks[..],
        "it begins with seq 1's blocks"
    );
    let chunk = p.chunks.iter().find(|c| c.id == 2).expect("seq 2 runs");
    assert_eq!(chunk.start, 8, "after the two cached blocks");
    assert_eq!(chunk.tokens, vec![9, 10, 77, 78]);
    Ok(())
}
