//! Probes for an orchestrator, on two paths, as Kubernetes asks of them:
//!
//! - `GET /livez`: the process serves HTTP, and no piece of work has been stuck in one
//!   attempt for longer than `LIVENESS_STALL_AFTER`. An attempt is one try of a
//!   consumer's record (or batch) or one round of the outbox relay: each ends, well or
//!   badly, within its own timeouts, so one that has not ended awaits something nothing
//!   will wake, and only a restart frees its partition. Waiting *between* attempts, for
//!   a database or broker away, is not a stall: a restart cures no outage, so a
//!   liveness probe that failed on one would only restart healthy services during it.
//!   503 names each stalled piece of work and for how long.
//! - `GET /readyz`: 200 when the service can do its work: its database answers, its
//!   consumer has joined its group, and it is not stopping. 503 otherwise, naming each
//!   reason. On SIGTERM it turns 503 first, and the drain begins `SHUTDOWN_DELAY` later
//!   ([`crate::shutdown`]), so that a load balancer stops sending requests before the
//!   listener closes.
//!
//! The broker is not asked. Every write goes to the database first (the outbox), so a
//! broker that is slow or away for a while stops nothing a request does: order-service
//! keeps taking orders, and the relay and the consumer wait for the broker and go on. A
//! readiness that asked the broker took every copy out of its Service at the moment the
//! outbox lets them carry on, and asked every copy, every few seconds, for the cluster's
//! whole metadata. The broker's absence shows where it matters: the outbox's lag and the
//! consumers' (`saga_outbox_oldest_unpublished_age_seconds`, the alerts).
//!
//! "Joined its group" means it was assigned partitions once since it started, even none
//! (a copy beyond the topic's partitions gets none): a rebalance later does not make it
//! unready, or every rebalance would take order-service's API out of its load balancer.
//! `GET /health` (the database only) stays for the scripts and compose files that use it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use deadpool_postgres::Pool;
use serde_json::json;

/// How long the database check may take: a probe's own timeout is usually a second or
/// more.
const CHECK_TIMEOUT: Duration = Duration::from_millis(900);

/// What the probes check.
#[derive(Clone)]
pub struct Probes {
    pool: Pool,
    joined: Option<Arc<AtomicBool>>,
    progress: Option<(Progress, Duration)>,
}

impl Probes {
    /// Ready when `pool` reaches the database (and not stopping): the card provider's.
    pub fn database(pool: Pool) -> Self {
        Self {
            pool,
            joined: None,
            progress: None,
        }
    }

    /// Also ready only once `joined` is set: by the consumer, on its first assignment.
    pub fn consumer(mut self, joined: Arc<AtomicBool>) -> Self {
        self.joined = Some(joined);
        self
    }

    /// Live only while no attempt of `progress` has lasted longer than `stall_after`.
    pub fn progress(mut self, progress: Progress, stall_after: Duration) -> Self {
        self.progress = Some((progress, stall_after));
        self
    }

    /// Why the service is not ready; empty when it is.
    async fn reasons(&self) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        if crate::shutdown::stopping() {
            reasons.push("stopping");
        }
        if !self.database_answers().await {
            reasons.push("database unreachable");
        }
        if self
            .joined
            .as_ref()
            .is_some_and(|joined| !joined.load(Ordering::Relaxed))
        {
            reasons.push("consumer not yet in its group");
        }
        reasons
    }

    async fn database_answers(&self) -> bool {
        let check = async {
            let client = self.pool.get().await.ok()?;
            client.simple_query("SELECT 1").await.ok()
        };
        matches!(
            tokio::time::timeout(CHECK_TIMEOUT, check).await,
            Ok(Some(_))
        )
    }
}

/// The attempts under way in a service's loops, for `/livez`. Cheap to clone: clones
/// share one record.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<Attempts>);

#[derive(Debug, Default)]
struct Attempts {
    next: AtomicU64,
    running: Mutex<HashMap<u64, (Arc<str>, Instant)>>,
}

impl Progress {
    /// Begins an attempt at `work` (such as `consumer orders[3]`), which ends when the
    /// returned value is dropped, however the attempt ends.
    pub fn attempt(&self, work: impl Into<Arc<str>>) -> Attempt {
        let id = self.0.next.fetch_add(1, Ordering::Relaxed);
        self.running().insert(id, (work.into(), Instant::now()));
        Attempt {
            progress: self.clone(),
            id,
        }
    }

    /// Each attempt running for longer than `after`, with how long, longest first.
    pub fn stalled(&self, after: Duration) -> Vec<(Arc<str>, Duration)> {
        let mut stalled: Vec<_> = (self.running().values())
            .map(|(work, since)| (Arc::clone(work), since.elapsed()))
            .filter(|(_, running)| *running > after)
            .collect();
        stalled.sort_by_key(|(_, running)| std::cmp::Reverse(*running));
        stalled
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Arc<str>, Instant)>> {
        // Nothing panics holding it; a poisoned map is still a map.
        self.0.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One attempt under way ([`Progress::attempt`]).
#[must_use = "the attempt ends when this is dropped"]
pub struct Attempt {
    progress: Progress,
    id: u64,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.progress.running().remove(&self.id);
    }
}

/// `/livez` and `/readyz`.
pub fn router(probes: Probes) -> Router {
    Router::new()
        .route("/livez", get(live))
        .route("/readyz", get(ready))
        .with_state(probes)
}

async fn live(State(probes): State<Probes>) -> impl IntoResponse {
    let stalled = probes
        .progress
        .as_ref()
        .map(|(progress, after)| progress.stalled(*after))
        .unwrap_or_default();
    if stalled.is_empty() {
        return (StatusCode::OK, Json(json!({ "status": "live" })));
    }
    let stalled: Vec<_> = (stalled.iter())
        .map(|(work, running)| json!({ "work": &**work, "for_seconds": running.as_secs() }))
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "status": "stalled", "stalled": stalled })),
    )
}

async fn ready(State(probes): State<Probes>) -> impl IntoResponse {
    let reasons = probes.reasons().await;
    if reasons.is_empty() {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not_ready", "reasons": reasons })),
        )
    }
}

/// Set once the consumer was first assigned partitions (any number, none included).
pub(crate) fn joined(flag: &AtomicBool) {
    flag.store(true, Ordering::Relaxed);
}
