//! Which partitions this consumer owns, and letting one go.
//!
//! A partition's work (its worker, and the records it prepares ahead: a handler's calls to
//! another system) runs under the partition's [`Owned`]. When the group revokes the
//! partition, librdkafka calls [`Ownership::revoke`] before it unassigns it: the work is
//! cancelled, and each task stops at its next `.await` without polling its work again
//! ([`unless_revoked`]), so it starts no call and no write after that. A call already
//! sent is abandoned (its answer, and whatever it did, are the next owner's to find
//! again: a handler's calls are keyed, and every call has its intent committed first). A
//! transaction under way rolls back, unless its `COMMIT` was sent already: then it may
//! still commit, its offset never stored, and the new owner's inbox stops the repeat. The revoke waits for the tasks to have stopped,
//! within [`REVOKE_BOUND`]; only then does librdkafka unassign the partition and commit
//! the offsets its records stored (none for an assignment lost, whose partitions another
//! member may hold already). Records of a partition no longer owned are not dispatched.
//!
//! The wait blocks the thread that polls the consumer, which is where librdkafka calls
//! back. On a multi-threaded runtime the tasks stop on the other threads meanwhile; on a
//! single-threaded one no task runs while the callback does, so none can be half way
//! through a poll, and cancelling is enough.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The longest a revoke waits for its partitions' tasks to stop. Stopping is prompt
/// (each task is dropped at its next `.await`); the bound is for a task stuck in a poll
/// that never yields, which would be a bug: the revoke then goes on, and says so.
pub const REVOKE_BOUND: Duration = Duration::from_secs(10);

/// One partition, owned until revoked.
#[derive(Clone)]
pub(super) struct Owned {
    /// Tells this ownership apart from the partition's earlier ones (a partition can be
    /// revoked and assigned back): a queue made for an earlier one is not this one's.
    pub(super) generation: u64,
    /// Cancelled on revoke: the partition's tasks stop at their next `.await`.
    pub(super) revoked: CancellationToken,
    /// The partition's worker and the prepares it began ahead.
    pub(super) tasks: TaskTracker,
}

impl Owned {
    /// `future` as one of the partition's tasks: tracked, and dropped when the partition
    /// is revoked.
    pub(super) fn task<F: Future>(
        &self,
        future: F,
    ) -> impl Future<Output = Option<F::Output>> + use<F> {
        self.tasks
            .track_future(unless_revoked(self.revoked.clone(), future))
    }
}

/// `future`'s output, unless `revoked` is cancelled first. Unlike
/// `CancellationToken::run_until_cancelled`, which polls the future once more when both
/// are ready, the revoke is looked at first on every poll: a revoked partition's work
/// takes no further step.
pub(super) async fn unless_revoked<F: Future>(
    revoked: CancellationToken,
    future: F,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        () = revoked.cancelled() => None,
        output = future => Some(output),
    }
}

/// The partitions of the consumer's topic it owns now.
#[derive(Default)]
pub(super) struct Ownership {
    owned: Mutex<HashMap<i32, Owned>>,
    generations: AtomicU64,
    /// Bumped on every assignment or revoke: the consumer loop forgets the queues of
    /// partitions it no longer owns when it sees it move.
    changes: AtomicU64,
}

impl Ownership {
    /// Takes `partitions` on, each with a new generation. A partition assigned again
    /// without a revoke between (librdkafka never does so) has its earlier work stopped,
    /// so that two workers never share one.
    pub(super) fn assign(&self, partitions: &[i32]) {
        let mut owned = self.owned.lock().expect("never poisoned");
        for partition in partitions {
            let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
            let earlier = owned.insert(
                *partition,
                Owned {
                    generation,
                    revoked: CancellationToken::new(),
                    tasks: TaskTracker::new(),
                },
            );
            if let Some(earlier) = earlier {
                earlier.revoked.cancel();
            }
        }
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// Every partition owned now: what a rebalance that failed unassigns.
    pub(super) fn all(&self) -> Vec<i32> {
        self.owned
            .lock()
            .expect("never poisoned")
            .keys()
            .copied()
            .collect()
    }

    /// The ownership of `partition`, if the consumer owns it.
    pub(super) fn owned(&self, partition: i32) -> Option<Owned> {
        self.owned
            .lock()
            .expect("never poisoned")
            .get(&partition)
            .cloned()
    }

    /// How many times the ownership changed: the consumer loop's cue to forget queues.
    pub(super) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Lets `partitions` go: their work is cancelled, and this waits (within `bound`)
    /// until their tasks have stopped. False if some had not by then.
    pub(super) fn revoke(&self, partitions: &[i32], bound: Duration) -> bool {
        let revoked: Vec<Owned> = {
            let mut owned = self.owned.lock().expect("never poisoned");
            partitions
                .iter()
                .filter_map(|partition| owned.remove(partition))
                .collect()
        };
        self.changes.fetch_add(1, Ordering::Release);
        for owned in &revoked {
            owned.revoked.cancel();
            owned.tasks.close();
        }
        let stopped = async {
            for owned in &revoked {
                owned.tasks.wait().await;
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime)
                if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread =>
            {
                tokio::task::block_in_place(|| {
                    runtime.block_on(async { tokio::time::timeout(bound, stopped).await.is_ok() })
                })
            }
            // No task runs while this does: each is parked at an `.await`, and stops at
            // its next poll, before anything else.
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_revoked_partitions_tasks_have_ended_when_the_revoke_returns() {
        let ownership = std::sync::Arc::new(Ownership::default());
        ownership.assign(&[0, 1]);
        let owned: Vec<Owned> = [0, 1].map(|p| ownership.owned(p).unwrap()).into();
        for owned in &owned {
            // Busy on another thread, never parked for long: as a handler's task between
            // two steps.
            tokio::spawn(owned.task(async {
                loop {
                    tokio::task::yield_now().await;
                }
            }));
        }
        let revoking = ownership.clone();
        let stopped = tokio::task::spawn(async move { revoking.revoke(&[0, 1], REVOKE_BOUND) })
            .await
            .unwrap();

        assert!(stopped);
        for owned in &owned {
            // An ended task is never polled again: nothing of it runs after the revoke.
            assert!(owned.tasks.is_closed() && owned.tasks.is_empty());
            assert!(owned.revoked.is_cancelled());
        }
        assert!(ownership.owned(0).is_none());
    }

    #[test]
    fn a_partition_assigned_back_is_a_new_generation() {
        let ownership = Ownership::default();
        ownership.assign(&[3]);
        let first = ownership.owned(3).unwrap().generation;
        assert!(ownership.revoke(&[3], REVOKE_BOUND));
        ownership.assign(&[3]);
        assert_ne!(ownership.owned(3).unwrap().generation, first);
        assert!(ownership.changes() >= 3);
    }
}
