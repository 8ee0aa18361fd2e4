//! Choosing a pool and streaming from it.
//!
//! Two policies ([`Routing`]), over the ready pools serving the model (minus those already
//! tried):
//!
//! - `p2c`, power of two choices: pick two at random and take the one with less outstanding
//!   work (this gateway's requests in flight there).
//! - `kv` (the default): KV-aware. Each pool's cost is in tokens of prefill ([`kv_cost`]):
//!   - the prompt tokens it does not hold in its prefix cache (from the pools' KV events,
//!     [`crate::kv_index`]): what it would compute for this request;
//!   - its backlog (prompt tokens it has yet to prefill, one per decoding request, as it
//!     reports them): what it computes first (the queue and the running requests);
//!   - KV use: the cached tokens its new blocks would evict (those beyond its empty blocks),
//!     which some later request would compute again; or, when even its evictable blocks
//!     cannot hold them, a whole prompt (it would wait for running requests to finish, so its
//!     cached prefix is worth nothing).
//!
//!   The first two are the sum Dynamo's router minimises; the third keeps a pool whose cache
//!   is full of other prefixes from taking on more while another has room (without it, a pool
//!   that drew more prefixes than it holds keeps them all, half-evicted, and recomputes their
//!   tails forever). The cheapest pool wins; pools within one block of it are a tie, settled
//!   by power of two choices among them, and so is a cold request (no pool holds any of it),
//!   so cold requests and prefixes held everywhere still spread by load instead of piling
//!   onto one pool. Every input but the tie-break comes from the pools, so gateways agree
//!   without talking to each other.
//!
//! Each pool's backlog is what it last reported plus what this gateway sent it since
//! ([`crate::kv_index`]), so a burst does not herd onto the pool that looked idle 50 ms ago.
//!
//! A pool that fails before sending its first token (it is unavailable, its queue is full, it
//! sends no first token within [`UpstreamLimits::first_token`]) is marked tried and the request
//! goes to another; once a token has reached the client the request is bound to its pool, and
//! a pool that then falls silent for [`UpstreamLimits::idle`] fails it with UNAVAILABLE. Pools
//! that keep failing are set aside for a while ([`crate::outlier`]); pools whose context cannot
//! hold the request are never chosen.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferrite_proto::worker::v1 as pb;
use futures::{Stream, StreamExt};
use tracing::Instrument;

use crate::error::GatewayError;
use crate::kv_index::PoolPrefix;
use crate::pools::{Pool, PoolView};
use crate::validate::ValidatedRequest;

/// How the gateway picks among the pools that can serve a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// Power of two choices on this gateway's requests in flight.
    P2c,
    /// Cached prefix and load, from the pools' KV events; p2c for cold requests and ties.
    #[default]
    Kv,
}

impl Routing {
    pub fn as_str(self) -> &'static str {
        match self {
            Routing::P2c => "p2c",
            Routing::Kv => "kv",
        }
    }
}

impl std::str::FromStr for Routing {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "p2c" => Ok(Routing::P2c),
            "kv" => Ok(Routing::Kv),
            other => Err(format!("unknown routing `{other}` (p2c or kv)")),
        }
    }
}

impl std::fmt::Display for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long the gateway waits on a pool: the bounds that keep a stalled pool from stalling
/// its requests for ever (HTTP/2 keep-alive, [`crate::pools::ChannelConfig`], covers a pool
/// that stops answering altogether).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamLimits {
    /// No first token within this: the request goes to another pool, or fails UNAVAILABLE.
    pub first_token: Duration,
    /// No token for this long once streaming: the request fails UNAVAILABLE.
    pub idle: Duration,
}

impl Default for UpstreamLimits {
    fn default() -> Self {
        Self {
            first_token: Duration::from_secs(60),
            idle: Duration::from_secs(30),
        }
    }
}

/// The worker's token stream, with the pool's outstanding count held until it is dropped.
pub struct Upstream {
    pub first: pb::GenerateResponse,
    pub rest: Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, tonic::Status>> + Send>>,
    _guard: Outstanding,
    pub pool: String,
    /// The `upstream` span of this call (entered while its messages are handled).
    pub span: tracing::Span,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

struct Outstanding(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Upstream {
    /// An upstream of canned worker messages, for unit tests of what follows routing.
    #[cfg(test)]
    pub(crate) fn canned(
        first: pb::GenerateResponse,
        rest: Vec<Result<pb::GenerateResponse, tonic::Status>>,
    ) -> Self {
        let outstanding = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(1));
        Self {
            first,
            rest: Box::pin(futures::stream::iter(rest)),
            _guard: Outstanding(outstanding),
            pool: "canned".into(),
            span: tracing::Span::none(),
        }
    }
}

#[cfg(test)]
impl Upstream {
    /// [`Upstream::canned`], after which the worker sends nothing, never ending the stream.
    pub(crate) fn canned_then_silent(
        first: pb::GenerateResponse,
        rest: Vec<Result<pb::GenerateResponse, tonic::Status>>,
    ) -> Self {
        let mut u = Self::canned(first, vec![]);
        u.rest = Box::pin(futures::stream::iter(rest).chain(futures::stream::pending()));
        u
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How much longer than the gateway's deadline a worker is given.
const WORKER_DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_millis(100);

/// Two random candidates, the less loaded wins.
pub fn pick(candidates: &[Pool], seed: u64) -> Option<&Pool> {
    match candidates.len() {
        0 => None,
        1 => candidates.first(),
        n => {
            let a = (seed % n as u64) as usize;
            let mut b = ((seed >> 32) % (n as u64 - 1)) as usize;
            if b >= a {
                b += 1;
            }
            let (pa, pb) = (&candidates[a], &candidates[b]);
            Some(if pb.load() < pa.load() { pb } else { pa })
        }
    }
}

/// The work `pool` would do before the first token of a `prompt_len`-token request, in tokens
/// (see the module doc). A pool that has not reported yet counts as idle and cold.
pub fn kv_cost(pool: &PoolPrefix, prompt_len: usize) -> usize {
    let uncached = prompt_len.saturating_sub(pool.cached_tokens);
    let Some(load) = &pool.load else {
        return uncached;
    };
    let backlog = usize::try_from(load.pending_tokens)
        .unwrap_or(usize::MAX)
        .saturating_add(pool.routed_tokens);
    let bs = pool.block_size.max(1);
    let need = uncached.div_ceil(bs);
    let free = load.kv_blocks_total.saturating_sub(load.kv_blocks_used) as usize;
    let kv_use = if load.kv_blocks_total == 0 {
        0
    } else if need > free {
        prompt_len
    } else {
        need.saturating_sub(load.kv_blocks_empty as usize) * bs
    };
    uncached.saturating_add(backlog).saturating_add(kv_use)
}

/// Why the KV-aware choice went as it did (the metric's `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvReason {
    /// One pool's cached prefix made it the cheapest by more than a block.
    Prefix,
    /// No pool holds any block of the prompt: power of two choices.
    Cold,
    /// Several pools within one block of the cheapest: power of two choices among them.
    Tie,
}

impl KvReason {
    pub fn as_str(self) -> &'static str {
        match self {
            KvReason::Prefix => "prefix",
            KvReason::Cold => "cold",
            KvReason::Tie => "tie",
        }
    }
}

/// The KV-aware choice among `candidates`, whose prefixes (same order) `prefixes` gives.
pub fn pick_kv(
    candidates: &[Pool],
    prefixes: &[PoolPrefix],
    prompt_len: usize,
    seed: u64,
) -> Option<(Pool, KvReason)> {
    if prefixes.iter().all(|p| p.cached_tokens == 0) {
        return pick(candidates, seed).map(|p| (p.clone(), KvReason::Cold));
    }
    let costs: Vec<usize> = prefixes.iter().map(|p| kv_cost(p, prompt_len)).collect();
    let (best, &min) = costs.iter().enumerate().min_by_key(|&(_, c)| *c)?;
    let tolerance = prefixes[best].block_size.max(1);
    let tied: Vec<Pool> = candidates
        .iter()
        .zip(&costs)
        .filter(|&(_, &c)| c <= min.saturating_add(tolerance))
        .map(|(p, _)| p.clone())
        .collect();
    if tied.len() > 1 {
        return pick(&tied, seed).map(|p| (p.clone(), KvReason::Tie));
    }
    candidates.get(best).map(|p| (p.clone(), KvReason::Prefix))
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    // RandomState's keys differ per instance; the clock adds variation between processes.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.finish()
}

/// The pools `req` may go to: ready pools of its model with the text side it was tokenized
/// under and a context that holds it, not tried yet; those set aside for failing lately only
/// when no other is left.
fn candidates(view: &PoolView, req: &ValidatedRequest, tried: &HashSet<String>) -> Vec<Pool> {
    let needed = req.context_needed();
    let usable: Vec<Pool> = view
        .ready(&req.model().name)
        .into_iter()
        .filter(|p| !tried.contains(&p.name))
        .filter(|p| p.record.text_digest == req.model().digest)
        .filter(|p| p.record.max_model_len as usize >= needed)
        .collect();
    let now = Instant::now();
    let (healthy, ejected): (Vec<Pool>, Vec<Pool>) =
        usable.into_iter().partition(|p| !p.health.is_ejected(now));
    if healthy.is_empty() { ejected } else { healthy }
}

/// The routing policy's choice among `candidates`; under KV-aware routing, with the prompt
/// tokens it would prefill (which count in its backlog until its reports show them: p2c, which
/// goes by this gateway's in-flight counts, needs neither the lookup nor the count).
fn choose(
    view: &PoolView,
    req: &ValidatedRequest,
    candidates: &[Pool],
    routing: Routing,
) -> Option<(Pool, Option<usize>)> {
    let chosen = match routing {
        Routing::P2c => {
            let p = pick(candidates, random_seed())?.clone();
            ferrite_telemetry::metrics::route_decision(routing.as_str(), "p2c");
            (p, None)
        }
        Routing::Kv => {
            let prompt = req.prompt_ids();
            let names: Vec<&str> = candidates.iter().map(|p| p.name.as_str()).collect();
            let lora = req.model().lora.as_deref();
            let prefixes = view.kv().lookup(&names, prompt, lora);
            let (p, why) = pick_kv(candidates, &prefixes, prompt.len(), random_seed())?;
            ferrite_telemetry::metrics::route_decision(routing.as_str(), why.as_str());
            let cached = names
                .iter()
                .position(|n| *n == p.name)
                .map_or(0, |i| prefixes[i].cached_tokens);
            (p, Some(prompt.len().saturating_sub(cached)))
        }
    };
    Some(chosen)
}

/// Why a call failed before its first token, for the retry metric and the pool's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Unavailable,
    QueueFull,
    FirstTokenTimeout,
}

impl Failure {
    fn as_str(self) -> &'static str {
        match self {
            Failure::Unavailable => "unavailable",
            Failure::QueueFull => "queue_full",
            Failure::FirstTokenTimeout => "first_token_timeout",
        }
    }
}

type FirstToken = (pb::GenerateResponse, tonic::Streaming<pb::GenerateResponse>);

/// Calls `pool` and waits for the first token, at most until `deadline` (the request's) or
/// `first_token` from now.
async fn call(
    pool: &Pool,
    req: &ValidatedRequest,
    deadline: Option<Instant>,
    first_token: Duration,
    span: &tracing::Span,
) -> Result<FirstToken, (GatewayError, Option<Failure>)> {
    let attempt = async {
        let mut client = pool.client.clone();
        let mut request = tonic::Request::new(req.worker_request());
        ferrite_telemetry::propagation::inject_into_metadata(span, request.metadata_mut());
        if let Some(d) = deadline {
            // A margin past our own deadline: the gateway decides when time is up, so the
            // client sees DEADLINE_EXCEEDED rather than the worker's cancellation.
            request
                .set_timeout(d.saturating_duration_since(Instant::now()) + WORKER_DEADLINE_MARGIN);
        }
        let mut stream = client
            .generate(request)
            .await
            .map_err(|s| GatewayError::from_worker(&s))?
            .into_inner();
        match stream.next().await {
            Some(Ok(first)) => Ok((first, stream)),
            Some(Err(s)) => Err(GatewayError::from_worker(&s)),
            None => Err(GatewayError::Unavailable(
                "the worker closed the stream without a token".into(),
            )),
        }
    }
    .instrument(span.clone());
    let patience = Instant::now() + first_token;
    let until = deadline.map_or(patience, |d| d.min(patience));
    let failure = |e: &GatewayError| match e {
        GatewayError::ResourceExhausted(_) => Some(Failure::QueueFull),
        e if e.retryable() => Some(Failure::Unavailable),
        _ => None,
    };
    match tokio::time::timeout_at(until.into(), attempt).await {
        Ok(Ok(first)) => Ok(first),
        Ok(Err(e)) => {
            let why = failure(&e);
            Err((e, why))
        }
        Err(_) if until < patience => Err((GatewayError::DeadlineExceeded, None)),
        Err(_) => Err((
            GatewayError::Unavailable(format!(
                "pool {} sent no first token within {first_token:?}",
                pool.name
            )),
            Some(Failure::FirstTokenTimeout),
        )),
    }
}

/// Sends `req` to a ready pool of its model and waits for the first token, trying other
/// pools while the failure is one another pool may not have (see the module doc). The pool
/// named `prefer` is tried first while it is a candidate: a request's later choices go where
/// its first one was prefilled, whose prefix cache holds their prompt by then.
pub async fn open(
    view: &PoolView,
    req: &ValidatedRequest,
    deadline: Option<Instant>,
    (routing, limits): (Routing, UpstreamLimits),
    prefer: Option<&str>,
) -> Result<Upstream, GatewayError> {
    let model = &req.model().name;
    let mut tried: HashSet<String> = HashSet::new();
    let mut last_err = None;
    loop {
        let candidates = candidates(view, req, &tried);
        let preferred = prefer
            .filter(|_| tried.is_empty())
            .and_then(|name| candidates.iter().find(|p| p.name == name));
        let chosen = match preferred {
            Some(p) => {
                ferrite_telemetry::metrics::route_decision(routing.as_str(), "sibling");
                Some((p.clone(), None))
            }
            None => choose(view, req, &candidates, routing),
        };
        let Some((pool, uncached)) = chosen else {
            return Err(last_err.unwrap_or_else(|| {
                GatewayError::Unavailable(format!(
                    "no ready pool serves `{model}` with a context of {} tokens",
                    req.context_needed()
                ))
            }));
        };
        tried.insert(pool.name.clone());
        if let Some(tokens) = uncached {
            view.kv().note_routed(&pool.name, tokens);
        }
        pool.outstanding.fetch_add(1, Ordering::Relaxed);
        let guard = Outstanding(pool.outstanding.clone());
        let span = tracing::info_span!("upstream", otel.kind = "client", ferrite.pool = %pool.name,
            server.address = %pool.record.leader_addr, otel.status_code = tracing::field::Empty);
        match call(&pool, req, deadline, limits.first_token, &span).await {
            Ok((first, rest)) => {
                pool.health.succeeded();
                return Ok(Upstream {
                    first,
                    rest: Box::pin(rest),
                    _guard: guard,
                    pool: pool.name,
                    span,
                });
            }
            Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => {
                return Err(GatewayError::DeadlineExceeded);
            }
            Err((e, Some(why))) => {
                span.record("otel.status_code", "ERROR");
                ferrite_telemetry::metrics::gateway_upstream_retry(&pool.name, why.as_str());
                // A full queue is a busy pool, not a broken one.
                if why != Failure::QueueFull && pool.health.failed(Instant::now()) {
                    ferrite_telemetry::metrics::gateway_pool_ejection(&pool.name);
                    tracing::warn!(pool = %pool.name, "pool set aside after failing calls in a row");
                }
                tracing::warn!(pool = %pool.name, "pool failed before the first token ({}), trying another: {e}", why.as_str());
                last_err = Some(e);
            }
            Err((e, None)) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::testing::pool;

    #[tokio::test]
    async fn the_less_loaded_of_two_candidates_wins() {
        assert!(pick(&[], 7).is_none());
        let one = [pool("a", 5, None)];
        assert_eq!(pick(&one, 7).map(|p| p.name.as_str()), Some("a"));
        let pools = [pool("a", 3, None), pool("b", 1, None), pool("c", 2, None)];
        for seed in 0..64u64 {
            let a = (seed % 3) as usize;
            let mut b = ((seed >> 32) % 2) as usize;
            if b >= a {
                b += 1;
            }
            let want = if pools[b].load() < pools[a].load() {
                b
            } else {
                a
            };
            let got = pick(&pools, seed).expect("a pool");
            assert_eq!(got.name, pools[want].name, "seed {seed}");
            assert_ne!(got.name, "a", "the most loaded never wins a pair");
        }
    }

    fn prefix(cached: usize, pending: u64, used: u32) -> PoolPrefix {
        PoolPrefix {
            cached_tokens: cached,
            block_size: 16,
            load: Some(pb::Load {
                pending_tokens: pending,
                kv_blocks_used: used,
                kv_blocks_total: 1000,
                // Every free block empty: taking one evicts nothing.
                kv_blocks_empty: 1000 - used,
                ..pb::Load::default()
            }),
            routed_tokens: 0,
        }
    }

    /// `p` with its free blocks full of other prefixes but `empty`.
    fn with_empty(mut p: PoolPrefix, empty: u32) -> PoolPrefix {
        if let Some(l) = p.load.as_mut() {
            l.kv_blocks_empty = empty;
        }
        p
    }

    /// Every pool `pick_kv` chooses over 64 seeds, and the reasons it gave.
    fn chosen(pools: &[Pool], prefixes: &[PoolPrefix]) -> (HashSet<String>, HashSet<KvReason>) {
        let mut names = HashSet::new();
        let mut reasons = HashSet::new();
        for seed in 0..64u64 {
            let (p, why) = pick_kv(
                pools,
                prefixes,
                2000,
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            )
            .expect("a pool");
            names.insert(p.name.clone());
            reasons.insert(why);
        }
        (names, reasons)
    }

    #[tokio::test]
    async fn the_pool_holding_the_prefix_wins_whatever_this_gateway_has_in_flight() {
        // b is the less loaded by this gateway's count, which p2c would go by.
        let pools = [pool("a", 9, None), pool("b", 0, None)];
        let (names, reasons) = chosen(&pools, &[prefix(1984, 0, 0), prefix(0, 0, 0)]);
        assert_eq!(names, HashSet::from(["a".to_owned()]));
        assert_eq!(reasons, HashSet::from([KvReason::Prefix]));
    }

    #[tokio::test]
    async fn cold_requests_and_ties_spread_by_power_of_two_choices() {
        let pools = [pool("a", 0, None), pool("b", 0, None), pool("c", 0, None)];
        let cold = [prefix(0, 0, 0), prefix(0, 50, 0), prefix(0, 0, 0)];
        let (names, reasons) = chosen(&pools, &cold);
        assert_eq!(
            names.len(),
            3,
            "cold: any pool, not the least backlogged: {names:?}"
        );
        assert_eq!(reasons, HashSet::from([KvReason::Cold]));
        let both = [prefix(1984, 0, 0), prefix(1984, 3, 0), prefix(0, 0, 0)];
        let (names, reasons) = chosen(&pools, &both);
        assert_eq!(names, HashSet::from(["a".to_owned(), "b".to_owned()]));
        assert_eq!(reasons, HashSet::from([KvReason::Tie]));
        // A block's worth of difference is a tie: a shared header does not pull every request.
        let header = [prefix(16, 0, 0), prefix(0, 0, 0), prefix(0, 0, 0)];
        let (names, _) = chosen(&pools, &header);
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[tokio::test]
    async fn a_backlog_or_a_full_kv_cache_outweighs_a_cached_prefix() {
        let pools = [pool("a", 0, None), pool("b", 0, None)];
        // a would save 1984 tokens of prefill but has 3000 to do first.
        let (names, _) = chosen(&pools, &[prefix(1984, 3000, 0), prefix(0, 0, 0)]);
        assert_eq!(names, HashSet::from(["b".to_owned()]));
        // a holds it but has no free block for the rest: the request would wait, so its
        // cached prefix is worth nothing (a tie with the cold pool) ...
        let (names, reasons) = chosen(&pools, &[prefix(1984, 0, 1000), prefix(0, 0, 0)]);
        assert_eq!(names.len(), 2);
        assert_eq!(reasons, HashSet::from([KvReason::Tie]));
        // ... and a pool that holds it too and has room wins.
        let (names, _) = chosen(&pools, &[prefix(1984, 0, 1000), prefix(1984, 0, 0)]);
        assert_eq!(names, HashSet::from(["b".to_owned()]));
        assert_eq!(kv_cost(&prefix(1984, 0, 1000), 2000), 16 + 2000);
        assert_eq!(
            kv_cost(&PoolPrefix::default(), 2000),
            2000,
            "unknown: idle and cold"
        );
    }

    /// A pool whose cache is full of other prefixes (no empty block) pays for what its new
    /// blocks would evict: it keeps a prefix it mostly holds, but one it holds less than half
    /// of goes to a pool with room, so a pool that drew too many prefixes sheds them.
    #[tokio::test]
    async fn a_full_cache_gives_up_a_prefix_it_barely_holds_to_a_pool_with_room() {
        let pools = [pool("a", 0, None), pool("b", 0, None)];
        let roomy = prefix(0, 0, 0);
        // 1016 tokens; a holds 30 of its 63 blocks: 34 new blocks evict 544 cached tokens.
        let barely = with_empty(prefix(480, 0, 0), 0);
        assert_eq!(kv_cost(&barely, 1016), 536 + 544);
        assert_eq!(kv_cost(&roomy, 1016), 1016);
        let (p, why) = pick_kv(&pools, &[barely, roomy.clone()], 1016, 1).expect("a pool");
        assert_eq!((p.name.as_str(), why), ("b", KvReason::Prefix));
        // Holding 50 blocks, a keeps it: 14 new blocks cost 216 + 224 tokens.
        let mostly = with_empty(prefix(800, 0, 0), 0);
        let (p, _) = pick_kv(&pools, &[mostly, roomy], 1016, 1).expect("a pool");
        assert_eq!(p.name, "a");
    }

    /// Pools that reported the same backlog: what this gateway sent since counts, so a burst
    /// of cold requests spreads instead of following one stale report.
    #[tokio::test]
    async fn what_this_gateway_sent_since_a_report_counts_in_the_backlog() {
        let pools = [pool("a", 0, None), pool("b", 0, None)];
        let mut sent = prefix(1984, 0, 0);
        // Both hold the prefix; a was sent 64 requests' tails since its last report.
        sent.routed_tokens = 64 * 16;
        let (names, reasons) = chosen(&pools, &[sent, prefix(1984, 0, 0)]);
        assert_eq!(names, HashSet::from(["b".to_owned()]));
        assert_eq!(reasons, HashSet::from([KvReason::Prefix]));
    }

    #[tokio::test]
    async fn both_candidates_are_drawn_from_every_position() {
        let pools = [pool("a", 0, None), pool("b", 0, None), pool("c", 0, None)];
        let mut seen = HashSet::new();
        for seed in 0..3u64 {
            for hi in 0..2u64 {
                seen.insert(pick(&pools, seed | (hi << 32)).expect("pool").name.clone());
            }
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
    }
}
