//! Per-caller rate limits: requests per minute and tokens per minute, as token buckets.
//!
//! A caller is the API key a request bore (every request is one anonymous caller when the
//! gateway has no keys). Each bucket holds up to a minute's worth and refills continuously.
//! Tokens are counted as OpenAI counts them against a limit: prompt tokens plus `max_tokens`,
//! at admission, so a request is never cut off mid-stream for the tokens it produces. A refused
//! request takes nothing from either bucket and is told when to retry.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::auth::Caller;
use crate::error::GatewayError;

/// The limits every caller gets; `None` means no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimits {
    pub requests_per_min: Option<u32>,
    pub tokens_per_min: Option<u32>,
}

/// A bucket of `capacity` that refills at `capacity` per minute.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    capacity: f64,
    updated: Instant,
}

impl Bucket {
    fn full(per_min: u32, now: Instant) -> Self {
        Self {
            level: f64::from(per_min),
            capacity: f64::from(per_min),
            updated: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let secs = now.saturating_duration_since(self.updated).as_secs_f64();
        self.level = (self.level + secs * self.capacity / 60.0).min(self.capacity);
        self.updated = now;
    }

    /// How long until `amount` is there (zero if it is now). More than the capacity is
    /// never there: it waits for a full bucket. A bucket of 0 per minute never has anything
    /// (the CLI refuses such a limit; a library caller gets every request refused).
    fn wait_for(&self, amount: f64) -> Duration {
        if self.capacity <= 0.0 {
            return Duration::from_secs(60);
        }
        let short = amount.min(self.capacity) - self.level;
        if short <= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(short * 60.0 / self.capacity).unwrap_or(Duration::MAX)
    }
}

/// One caller's buckets.
#[derive(Debug)]
struct Buckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// The rate limiter of one gateway.
#[derive(Debug, Default)]
pub struct Limiter {
    limits: RateLimits,
    // A std mutex: held for a few arithmetic operations, never across an await.
    callers: Mutex<HashMap<Caller, Buckets>>,
}

impl Limiter {
    pub fn new(limits: RateLimits) -> Self {
        Self {
            limits,
            callers: Mutex::default(),
        }
    }

    /// Refuses `caller` at `now` if it has no request left this minute, without taking one
    /// (so a caller over its limit is refused before its prompt is tokenized; [`Self::admit`]
    /// takes it).
    pub fn check_requests(&self, caller: Caller, now: Instant) -> Result<(), GatewayError> {
        let Some(per_min) = self.limits.requests_per_min else {
            return Ok(());
        };
        let mut callers = self.callers.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(bucket) = callers.get_mut(&caller).and_then(|b| b.requests.as_mut()) else {
            return Ok(());
        };
        bucket.refill(now);
        let wait = bucket.wait_for(1.0);
        if wait > Duration::ZERO {
            return Err(GatewayError::RateLimited {
                message: format!("rate limit of {per_min} requests per minute reached"),
                retry_after: wait,
            });
        }
        Ok(())
    }

    /// Admits one request of `tokens` (prompt + max_tokens) for `caller` at `now`, or says
    /// how long to wait (RESOURCE_EXHAUSTED / 429 with a retry delay).
    pub fn admit(&self, caller: Caller, tokens: usize, now: Instant) -> Result<(), GatewayError> {
        if self.limits == RateLimits::default() {
            return Ok(());
        }
        let mut callers = self.callers.lock().unwrap_or_else(PoisonError::into_inner);
        let b = callers.entry(caller).or_insert_with(|| Buckets {
            requests: self.limits.requests_per_min.map(|n| Bucket::full(n, now)),
            tokens: self.limits.tokens_per_min.map(|n| Bucket::full(n, now)),
        });
        let tokens = tokens as f64;
        let mut wait = Duration::ZERO;
        let mut which = "";
        for (name, bucket, amount) in [
            ("requests", b.requests.as_mut(), 1.0),
            ("tokens", b.tokens.as_mut(), tokens),
        ] {
            if let Some(bucket) = bucket {
                bucket.refill(now);
                let w = bucket.wait_for(amount);
                if w > wait {
                    (wait, which) = (w, name);
                }
            }
        }
        if wait > Duration::ZERO {
            let limit = match which {
                "requests" => self.limits.requests_per_min,
                _ => self.limits.tokens_per_min,
            };
            return Err(GatewayError::RateLimited {
                message: format!(
                    "rate limit of {} {which} per minute reached (this request: {} tokens)",
                    limit.unwrap_or(0),
                    tokens
                ),
                retry_after: wait,
            });
        }
        if let Some(r) = b.requests.as_mut() {
            r.level -= 1.0;
        }
        if let Some(t) = b.tokens.as_mut() {
            // A request larger than the whole bucket empties it (it waited for a full one).
            t.level = (t.level - tokens).max(0.0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry_after(e: GatewayError) -> Duration {
        match e {
            GatewayError::RateLimited { retry_after, .. } => retry_after,
            other => panic!("not rate limited: {other:?}"),
        }
    }

    #[test]
    fn requests_refill_at_the_rate_per_minute() {
        let l = Limiter::new(RateLimits {
            requests_per_min: Some(2),
            tokens_per_min: None,
        });
        let (t0, a) = (Instant::now(), Caller::Key(0));
        l.admit(a, 10, t0).expect("first");
        l.admit(a, 10, t0).expect("second");
        let wait = retry_after(l.admit(a, 10, t0).expect_err("third"));
        assert_eq!(wait.as_secs(), 30, "{wait:?}");
        // Another caller has its own bucket.
        l.admit(Caller::Key(1), 10, t0).expect("another key");
        l.admit(a, 10, t0 + Duration::from_secs(30))
            .expect("refilled");
        assert!(l.admit(a, 10, t0 + Duration::from_secs(31)).is_err());
    }

    #[test]
    fn tokens_count_prompt_plus_max_tokens_and_refusals_take_nothing() {
        let l = Limiter::new(RateLimits {
            requests_per_min: Some(100),
            tokens_per_min: Some(600),
        });
        let (t0, a) = (Instant::now(), Caller::Anonymous);
        l.admit(a, 500, t0).expect("500 of 600");
        let wait = retry_after(l.admit(a, 200, t0).expect_err("100 left"));
        assert_eq!(wait.as_secs(), 10, "100 tokens short at 10 per second");
        l.admit(a, 100, t0).expect("the refusal took nothing");
        // More than a minute's worth waits for a full bucket, then goes.
        let wait = retry_after(l.admit(a, 5000, t0).expect_err("too big"));
        assert_eq!(wait.as_secs(), 60);
        l.admit(a, 5000, t0 + Duration::from_secs(60))
            .expect("a full bucket");
    }

    #[test]
    fn a_limit_of_zero_refuses_everything_and_never_panics() {
        let l = Limiter::new(RateLimits {
            requests_per_min: Some(0),
            tokens_per_min: Some(0),
        });
        let t0 = Instant::now();
        for i in 0..3 {
            let wait = retry_after(l.admit(Caller::Anonymous, 1, t0).expect_err("zero"));
            assert_eq!(wait.as_secs(), 60, "try {i}");
        }
        let l = Limiter::new(RateLimits {
            requests_per_min: None,
            tokens_per_min: Some(0),
        });
        assert!(l.admit(Caller::Anonymous, 0, t0).is_err());
    }

    #[test]
    fn an_exhausted_caller_is_refused_before_anything_is_taken() {
        let l = Limiter::new(RateLimits {
            requests_per_min: Some(1),
            tokens_per_min: Some(100),
        });
        let (t0, a) = (Instant::now(), Caller::Key(3));
        l.check_requests(a, t0)
            .expect("a new caller has a full bucket");
        l.admit(a, 10, t0).expect("first");
        let wait = retry_after(l.check_requests(a, t0).expect_err("none left"));
        assert_eq!(wait.as_secs(), 60);
        l.check_requests(Caller::Key(4), t0)
            .expect("another caller");
    }

    #[test]
    fn no_limits_admit_everything() {
        let l = Limiter::default();
        for _ in 0..1000 {
            l.admit(Caller::Anonymous, 1 << 20, Instant::now())
                .expect("no limit");
        }
    }
}
