use super::*;

fn sched(budget: usize, max_seqs: usize, blocks: u32) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: max_seqs,
            max_model_len: 64,
            block_size: 4,
        },
        blocks,
    )
}

/// Runs a step as the engine would: every chunk computed, sampling chunks get `token`.
fn run_step(s: &mut Scheduler, token: u32) -> Schedule {
    let plan = s.schedule();
    for c in &plan.chunks {
        s.mark_computed(c);
        if c.samples {
            s.push_token(c.id, token);
        }
    }
    plan
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
            samples: false
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
                samples: true
            },
            ScheduledChunk {
                id: 2,
                start: 0,
                len: 3,
                samples: true
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
            samples: true
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
            samples: true
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
