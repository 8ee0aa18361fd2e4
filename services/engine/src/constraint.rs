//! A grammar a request's output must follow, as the engine sees it: which tokens may come next,
//! and whether a token ended the output. The engine knows no grammar: the worker implements
//! this over llguidance (`ferrite-structured`).
//!
//! Masks are bitmasks over a logits row: bit `i % 32` of word `i / 32` allows token `i`. The
//! engine computes a step's masks on a thread of their own while the forward runs (they depend
//! only on the tokens so far), and the sampler keeps the allowed tokens alone.

use crate::executor::Executor;
use crate::model::MaskSource;
use crate::plan::StepPlan;
use crate::scheduler::SeqId;

/// One sequence's grammar.
pub trait Constraint: Send + std::fmt::Debug {
    /// Fills `mask` (as wide as a logits row, in 32-bit words) with the tokens allowed next,
    /// `budget` tokens (this one included) before `max_tokens` or the context cuts the output:
    /// a grammar may narrow it to finish in time.
    fn allowed(&mut self, mask: &mut [u32], budget: usize) -> Result<(), String>;
    /// Follows the chosen `token`; `true` when it completed the grammar (the output ends).
    fn accept(&mut self, token: u32) -> Result<bool, String>;
    /// Whether the grammar was completed by narrowing to the budget rather than by the model:
    /// the output then ends as one cut at `max_tokens` does (`length`).
    fn cut_short(&self) -> bool {
        false
    }
}

/// Sets every logit `mask` does not allow to -inf. Errors when it allows none of the row.
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) -> Result<(), String> {
    let mut any = false;
    for (i, l) in logits.iter_mut().enumerate() {
        let word = mask.get(i / 32).copied().unwrap_or(0);
        if word >> (i % 32) & 1 == 0 {
            *l = f32::NEG_INFINITY;
        } else {
            any = true;
        }
    }
    if any {
        Ok(())
    } else {
        Err("the grammar allows no token of the vocabulary here".into())
    }
}

/// Whether `mask` allows `token`, as an error like [`apply_mask`]'s when it does not (a device
/// sampling under the mask draws outside it only where it allowed nothing).
pub fn check_allowed(mask: &[u32], token: u32) -> Result<(), String> {
    let word = mask.get(token as usize / 32).copied().unwrap_or(0);
    if word >> (token % 32) & 1 == 1 {
        Ok(())
    } else if mask.iter().all(|&w| w == 0) {
        Err("the grammar allows no token of the vocabulary here".into())
    } else {
        Err(format!(
            "token {token} was drawn outside the grammar's mask"
        ))
    }
}

/// The masks of a step's requests under a grammar, by request.
pub(crate) type Masks = Vec<(SeqId, Result<Vec<u32>, String>)>;

/// A request sampling this step under a grammar: its id, the tokens its output may still take
/// and its grammar.
pub(crate) type Grammar<'a> = (SeqId, usize, &'a mut (dyn Constraint + 'static));

/// The mask of each of `grammars`.
fn compute_masks(grammars: Vec<Grammar<'_>>, words: usize) -> Masks {
    let mut out = Vec::with_capacity(grammars.len());
    for (id, budget, c) in grammars {
        let mut mask = vec![0; words];
        out.push((id, c.allowed(&mut mask, budget).map(|()| mask)));
    }
    out
}

/// Runs `lead` (the executor leading `plan`, with or without waiting for it) while a thread
/// computes the masks of `grammars`; a device that samples takes them once the forward is
/// queued, one per sampling row (`rows`: the request with a grammar, if any, of each). Returns
/// what `lead` did and every mask computed, for the host's sampling and checks.
pub(crate) fn with_masks<T>(
    exec: &mut Executor,
    plan: &mut StepPlan,
    grammars: Vec<Grammar<'_>>,
    rows: &[Option<SeqId>],
    words: usize,
    lead: impl FnOnce(&mut Executor, &mut StepPlan, MaskSource<'_>) -> crate::Result<T>,
) -> (crate::Result<T>, Masks) {
    // A mask thread that panicked leaves its requests without masks: each then fails with a
    // grammar error, as any missing mask does.
    let join = |t: Option<std::thread::ScopedJoinHandle<'_, Masks>>| {
        t.map(|t| t.join().unwrap_or_default()).unwrap_or_default()
    };
    std::thread::scope(|s| {
        let mut thread = Some(s.spawn(|| compute_masks(grammars, words)));
        let mut computed: Option<Masks> = None;
        let led = {
            let mut source = || {
                let masks = join(thread.take());
                let by_row = rows
                    .iter()
                    .map(|row| {
                        let (_, m) = masks.iter().find(|(id, _)| Some(*id) == *row)?;
                        // A failed mask leaves the row unmasked; the host then fails the request.
                        m.as_ref().ok().cloned()
                    })
                    .collect();
                computed = Some(masks);
                by_row
            };
            lead(exec, plan, &mut source)
        };
        let masks = computed.unwrap_or_else(|| join(thread.take()));
        (led, masks)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_outside_its_mask_is_named_and_an_empty_mask_said_so() {
        let mut mask = [0u32; 2];
        mask[1] |= 1 << 5; // token 37
        assert!(check_allowed(&mask, 37).is_ok());
        let e = check_allowed(&mask, 36).expect_err("outside");
        assert!(e.contains("token 36"), "{e}");
        let e = check_allowed(&[0, 0], 0).expect_err("none allowed");
        assert!(e.contains("allows no token"), "{e}");
    }

    #[test]
    fn a_mask_keeps_its_tokens_alone() {
        let mut row = vec![1.0f32; 40];
        let mut mask = [0u32; 2];
        mask[0] |= 1 << 3;
        mask[1] |= 1 << 2; // token 34
        apply_mask(&mut row, &mask).expect("some allowed");
        let kept: Vec<usize> = (0..40).filter(|&i| row[i].is_finite()).collect();
        assert_eq!(kept, [3, 34]);
        // A mask shorter than the row allows nothing past it; one allowing nothing is an error.
        assert!(apply_mask(&mut [1.0; 40], &[0]).is_err());
    }
}
