//! The one backoff policy for everything that waits for the world to heal (a database or
//! broker that is down): exponential from 100 ms, capped at 10 s, jittered so instances
//! recovering together do not retry in lockstep, and never giving up.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

pub fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times()
        .build()
}

/// The next delay of `backoff`; the policy above has no last one.
pub fn next_delay(backoff: &mut ExponentialBackoff) -> Duration {
    backoff.next().unwrap_or(Duration::from_secs(10))
}
