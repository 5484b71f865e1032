//! The one backoff policy for everything that waits for the world to heal (a database or
//! broker that is down): exponential from 100 ms, jittered so instances recovering
//! together do not retry in lockstep, never more than 10 s, and never giving up.
//!
//! The jitter adds up to as much again as the delay (that is how `backon` jitters), so
//! the delay doubles up to 5 s and each wait is 100–200 ms at first and 5–10 s at most.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The longest any wait gets, jitter included.
pub const MAX_DELAY: Duration = Duration::from_secs(10);

pub fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(MAX_DELAY / 2)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The next delay of `backoff`; the policy above has no last one.
pub fn next_delay(backoff: &mut ExponentialBackoff) -> Duration {
    backoff.next().unwrap_or(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_near_100_ms_and_never_waits_more_than_10_s() {
        for _ in 0..20 {
            let mut delays = backoff();
            let first = next_delay(&mut delays);
            assert!(first >= Duration::from_millis(100) && first <= Duration::from_millis(200));
            let later: Vec<Duration> = (0..40).map(|_| next_delay(&mut delays)).collect();
            assert!(later.iter().all(|d| *d <= MAX_DELAY), "{later:?}");
            assert!(later.last().unwrap() >= &(MAX_DELAY / 2), "{later:?}");
        }
    }
}
