//! What the ranks draw for a step's sampling rows ([`crate::plan::StepPlan::device_sampling`]):
//! each request's parameters as the device's sampler takes them, and the extras of a request
//! with penalties, logprobs or a logit bias, which the ranks take around the draw as the host's
//! sampler does.

use super::Request;
use crate::executor::Executor;
use crate::model::{DeviceSampling, DrawExtras};
use crate::sampler::Seen;
use crate::scheduler::SeqState;

/// The draw the ranks make for a row sampled on the host, whose id nobody reads: the cheapest.
pub(crate) const STAND_IN: DeviceSampling = DeviceSampling {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    min_p: 0.0,
    seed: 0,
    step: 0,
};

/// `req`'s next draw as the GPU sampler takes it (its penalties and logprobs apart:
/// [`draw_extras`]; a grammar's mask goes to the device with the step: [`Engine::run_masked`]).
pub(crate) fn device_sampling(req: &Request, generated: usize) -> DeviceSampling {
    let p = req.sampler.params();
    DeviceSampling {
        temperature: p.temperature,
        top_k: i32::try_from(p.top_k).unwrap_or(i32::MAX),
        top_p: p.top_p,
        min_p: p.min_p,
        seed: req.device_seed,
        step: generated as u64,
    }
}

/// Whether the ranks of `exec` may draw `req`'s next token themselves, as `d` says (the plan
/// then samples "on the device"): a GPU makes any draw [`device_sampling`] gives; the CPU only
/// greedy picks without a grammar (with their extras), and only under async scheduling, where a
/// step may then take the tokens the one before drew without waiting for the host (`overlap`).
pub(crate) fn ranks_draw(exec: &Executor, req: &Request, d: &DeviceSampling) -> bool {
    exec.samples_on_device() || (d.temperature <= 0.0 && req.constraint.is_none())
}

/// Whether `req`'s draws need [`DrawExtras`]: penalties, logprobs or a logit bias.
pub(crate) fn wants_extras(req: &Request) -> bool {
    let p = req.sampler.params();
    p.penalties().any() || p.logprobs.is_some() || !p.logit_bias.is_empty()
}

/// The extras of `req`'s draw as sampling row `row`, of the token at `index` of `seq` (the
/// one after its chunk): the tokens so far for its penalties, and its logprobs; `None` where
/// it asks for neither.
///
/// The chunk's last token, at `index - 1`, is left to the ranks where it is one of the
/// output: under async scheduling it may be a draw of the step in flight, which the host has
/// not read yet (a placeholder here), and which each rank has in its input ids.
pub(crate) fn draw_extras(
    req: &mut Request,
    seq: &SeqState,
    index: usize,
    row: u32,
) -> Option<DrawExtras> {
    if !wants_extras(req) {
        return None;
    }
    let (penalties, logprobs, bias) = {
        let p = req.sampler.params();
        let logprobs = p.logprobs.map(|n| n as u32);
        (p.penalties(), logprobs, p.logit_bias.clone())
    };
    let last_is_output = penalties.any() && index > seq.prompt_len;
    let seen = match penalties.any() {
        true => req
            .seen
            .through(seq, index - usize::from(last_is_output))
            .to_vec(),
        false => Vec::new(),
    };
    Some(DrawExtras {
        row,
        penalties,
        seen,
        last_is_output,
        logprobs,
        bias,
    })
}

/// A request's tokens so far as its penalties read them (in its draws' extras, or on the host),
/// kept from step to step: a step adds only the tokens that came since the last (a request
/// with penalties and a long context would otherwise take each of its tokens through a hash
/// map every step).
#[derive(Debug, Default)]
pub(crate) struct SeenSoFar {
    seen: Seen,
    upto: usize,
}

impl SeenSoFar {
    /// The tokens of `seq` before `known`, which only grows from step to step and never
    /// reaches a placeholder: the ranks' extras ask for the tokens before the newest draw, the
    /// host's sampler for those before the token it draws.
    pub(crate) fn through(&mut self, seq: &SeqState, known: usize) -> &[(u32, u32)] {
        for (i, &t) in seq.tokens.iter().enumerate().take(known).skip(self.upto) {
            self.seen.add(t, i >= seq.prompt_len);
        }
        self.upto = self.upto.max(known);
        self.seen.pairs()
    }
}

/// Whether the ranks draw for requests with penalties, logprobs or a logit bias (on unless
/// `FERRITE_DRAW_EXTRAS=0`, read once; off, their rows are sampled on the host): the off
/// switch is for A/B runs on one machine (tests/gpu/host.sh's `ab` stage).
pub(crate) fn extras_on_ranks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !super::switched_off("FERRITE_DRAW_EXTRAS"))
}
