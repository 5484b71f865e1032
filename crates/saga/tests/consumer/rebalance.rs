//! A partition that moves while its records' calls are in flight: the old owner lets it go.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use saga::consumer;
use saga::{Applier, Envelope, Handler, HandlerError, Outcome, Step, Transaction};
use saga_testkit::{TestKafka, eventually};
use tokio_util::sync::CancellationToken;

use crate::run::{SERVICE, WAIT, database, dead_letters, event, settings};

/// What a consumer did for a partition, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// A call began (the prepare, as a handler's call to another system).
    Called,
    /// A call came back.
    Answered,
    /// A transaction began applying the record.
    Applied,
}

/// Who (a consumer's name) did what for which partition's event, and when.
#[derive(Debug, Clone)]
struct Done {
    who: &'static str,
    partition: i32,
    event_id: String,
    act: Act,
    at: Instant,
}

type Acts = Arc<Mutex<Vec<Done>>>;

/// A handler whose prepare is a slow call, and which writes down who did what when.
#[derive(Clone)]
struct Caller {
    who: &'static str,
    acts: Acts,
}

/// How long each call takes: long enough that a revoke finds calls in flight.
const CALL: Duration = Duration::from_millis(200);

impl Caller {
    fn act(&self, event: &Envelope, act: Act) {
        let partition = event.delivery.partition.expect("a record's partition");
        self.acts.lock().unwrap().push(Done {
            who: self.who,
            partition,
            event_id: event.id.clone(),
            act,
            at: Instant::now(),
        });
    }
}

impl Handler for Caller {
    type Command = ();
    type Prepared = ();

    fn decode(&self, _: &Envelope) -> Result<Option<()>, HandlerError> {
        Ok(Some(()))
    }

    async fn prepare(&self, _: &Pool, event: &Envelope, (): ()) -> Result<Step<()>, HandlerError> {
        self.act(event, Act::Called);
        tokio::time::sleep(CALL).await;
        self.act(event, Act::Answered);
        Ok(Step::Apply(()))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        (): (),
    ) -> Result<Outcome, HandlerError> {
        self.act(event, Act::Applied);
        tx.execute(
            "INSERT INTO applied (event_id, txid) VALUES ($1, txid_current())",
            &[&event.id],
        )
        .await?;
        Ok(Outcome::Applied)
    }
}

/// Records per partition at least, however soon the second consumer is given one.
const MIN_PER_PARTITION: usize = 20;
/// Records per partition produced at once, before the rest trickle in: a backlog the
/// first consumer has queued when its partitions are revoked, which it would go on
/// draining beside the new owner if it did not let them go.
const BACKLOG: usize = 200;

/// A second consumer joins while the first has calls in flight on every partition: the
/// partitions that move are revoked from the first before the second gets them, and from
/// the revoke on the first makes no call and applies nothing for them (its calls in flight
/// abandoned, its queue dropped), where before it drained its queue beside the new owner.
/// Every record is still applied, and the group commits everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partition_gets_no_call_and_no_write_from_its_old_owner_after_the_revoke() {
    let kafka = Arc::new(TestKafka::new().await);
    let db = database().await;
    let acts = Acts::default();
    let start = |who| {
        let shutdown = CancellationToken::new();
        let caller = Caller {
            who,
            acts: Arc::clone(&acts),
        };
        let task = tokio::spawn(consumer::run(
            settings(&kafka),
            Arc::new(Applier::new(db.pool.clone(), caller)),
            dead_letters(&kafka),
            shutdown.clone(),
        ));
        (shutdown, task)
    };
    let producing = CancellationToken::new();
    let producer = tokio::spawn(backlog_then_trickle(kafka.clone(), producing.clone()));
    let (stop_a, task_a) = start("a");
    let acted = |who: &'static str, partitions: usize| {
        let acts = &acts;
        move || async move {
            let of: HashSet<i32> = acts
                .lock()
                .unwrap()
                .iter()
                .filter(|d| d.who == who)
                .map(|d| d.partition)
                .collect();
            (of.len() >= partitions).then_some(())
        }
    };
    eventually(
        WAIT,
        "the first consumer to call on every partition",
        acted("a", 3),
    )
    .await;
    let (stop_b, task_b) = start("b");
    eventually(
        WAIT,
        "the second consumer to be given a partition",
        acted("b", 1),
    )
    .await;
    producing.cancel();
    let produced = producer.await.unwrap();
    let group = kafka.topics.group(SERVICE);
    eventually(WAIT, "the group to commit everything", || async {
        kafka
            .group_caught_up(&group, &kafka.topics.orders)
            .await
            .then_some(())
    })
    .await;
    for (stop, task) in [(stop_a, task_a), (stop_b, task_b)] {
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    let abandoned = nothing_after_the_takeover(&acts.lock().unwrap());
    assert!(
        abandoned > 0,
        "no call was in flight on a moved partition at its revoke: the test met nothing"
    );
    let applied: HashSet<String> = db
        .client()
        .await
        .query("SELECT event_id FROM applied", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let missing: Vec<&String> = produced
        .iter()
        .filter(|id| !applied.contains(*id))
        .collect();
    assert!(missing.is_empty(), "never applied: {missing:?}");
}

/// Produces [`BACKLOG`] records on every partition at once, then one a partition every
/// quarter call until `producing` is cancelled (and [`MIN_PER_PARTITION`] at least);
/// returns their ids.
async fn backlog_then_trickle(kafka: Arc<TestKafka>, producing: CancellationToken) -> Vec<String> {
    let mut produced = Vec::new();
    for n in 0.. {
        if producing.is_cancelled() && n >= MIN_PER_PARTITION {
            break;
        }
        for partition in 0..3 {
            let id = format!("p{partition}-{n}");
            kafka
                .produce_to(&kafka.topics.orders, Some(partition), None, &event(&id))
                .await;
            produced.push(id);
        }
        if n >= BACKLOG {
            tokio::time::sleep(CALL / 4).await;
        }
    }
    produced
}

/// For each partition the second consumer ("b") took over: nothing the first ("a") did
/// for it is as late as b's first act. Returns how many of a's calls on those partitions
/// were abandoned (begun, never answered).
fn nothing_after_the_takeover(acts: &[Done]) -> usize {
    let mut moved = 0;
    let mut abandoned = 0;
    for partition in 0..3 {
        let of = |who| {
            acts.iter()
                .filter(move |d| d.who == who && d.partition == partition)
        };
        let Some(taken_over) = of("b").map(|d| d.at).min() else {
            continue;
        };
        moved += 1;
        let late: Vec<&Done> = of("a").filter(|d| d.at >= taken_over).collect();
        assert!(
            late.is_empty(),
            "partition {partition}: the old owner acted {} times after the new one began, first {:?}",
            late.len(),
            &late[..late.len().min(3)]
        );
        let calls = of("a").filter(|d| d.act != Act::Applied).fold(
            BTreeMap::<&str, usize>::new(),
            |mut n, d| {
                *n.entry(d.event_id.as_str()).or_default() += 1;
                n
            },
        );
        abandoned += calls.values().filter(|n| **n == 1).count();
    }
    assert!(moved > 0, "no partition moved to the second consumer");
    abandoned
}
