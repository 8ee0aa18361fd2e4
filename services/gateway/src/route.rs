//! Choosing a pool and streaming from it.
//!
//! Power of two choices: of the ready pools serving the model (minus those already tried),
//! pick two at random and take the one with less outstanding work. A pool that fails before
//! sending its first token is marked tried and the request goes to another; once a token has
//! reached the client the request is bound to its pool.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ferrite_proto::worker::v1 as pb;
use futures::{Stream, StreamExt};
use tracing::Instrument;

use crate::error::GatewayError;
use crate::pools::{Pool, PoolView};
use crate::validate::ValidatedRequest;

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

/// Sends `req` to a ready pool of its model and waits for the first token, trying other
/// pools while the failure is retryable.
pub async fn open(
    view: &PoolView,
    req: &ValidatedRequest,
    deadline: Option<Instant>,
) -> Result<Upstream, GatewayError> {
    let model = &req.model().name;
    let mut tried: HashSet<String> = HashSet::new();
    let mut last_err = None;
    loop {
        // Only pools of the text side the request was tokenized under.
        let candidates: Vec<Pool> = view
            .ready(model)
            .into_iter()
            .filter(|p| !tried.contains(&p.name))
            .filter(|p| p.record.text_digest == req.model().digest)
            .collect();
        let Some(pool) = pick(&candidates, random_seed()).cloned() else {
            return Err(last_err.unwrap_or_else(|| {
                GatewayError::Unavailable(format!("no ready pool serves `{model}`"))
            }));
        };
        tried.insert(pool.name.clone());
        pool.outstanding.fetch_add(1, Ordering::Relaxed);
        let guard = Outstanding(pool.outstanding.clone());
        let span = tracing::info_span!("upstream", otel.kind = "client", ferrite.pool = %pool.name,
            server.address = %pool.record.leader_addr, otel.status_code = tracing::field::Empty);
        let attempt = async {
            let mut client = pool.client.clone();
            let mut request = tonic::Request::new(req.worker_request());
            ferrite_telemetry::propagation::inject_into_metadata(&span, request.metadata_mut());
            if let Some(d) = deadline {
                // A margin past our own deadline: the gateway decides when time is up, so the
                // client sees DEADLINE_EXCEEDED rather than the worker's cancellation.
                request.set_timeout(
                    d.saturating_duration_since(Instant::now()) + WORKER_DEADLINE_MARGIN,
                );
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
        };
        let attempt = attempt.instrument(span.clone());
        let result = match deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), attempt).await {
                Ok(r) => r,
                Err(_) => return Err(GatewayError::DeadlineExceeded),
            },
            None => attempt.await,
        };
        match result {
            Ok((first, rest)) => {
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
            Err(e) if e.retryable() => {
                span.record("otel.status_code", "ERROR");
                tracing::warn!(pool = %pool.name, "pool failed before the first token, trying another: {e}");
                last_err = Some(e);
            }
            Err(e) => return Err(e),
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
