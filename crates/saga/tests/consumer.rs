//! The consumer loop against the real broker, with handlers that record what they see
//! and misbehave on cue.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;
use saga::consumer::{self, ConsumerSettings};
use saga::{Applier, Envelope, Handler, HandlerError, Outcome, Step, Transaction};
use saga_testkit::{TestDatabase, TestKafka, eventually, header};
use serde_json::json;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);
const SERVICE: &str = "payment-service";

type Behaviour =
    dyn Fn(Envelope, u32) -> BoxFuture<'static, Result<Outcome, HandlerError>> + Send + Sync;

/// Records every event it applies, in order, after `behaviour` lets it through: in
/// memory as it applies it, and in the `applied` table inside the transaction it is
/// handed, so that table holds what was committed.
#[derive(Clone)]
struct Recorder(Arc<RecorderState>);

struct RecorderState {
    /// Every event prepared, in the order their prepares began.
    prepared: watch::Sender<Vec<String>>,
    applied: Mutex<Vec<String>>,
    attempts: Mutex<BTreeMap<String, u32>>,
    behaviour: Box<Behaviour>,
}

impl Recorder {
    fn new(
        behaviour: impl Fn(Envelope, u32) -> BoxFuture<'static, Result<Outcome, HandlerError>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self::watching(behaviour, watch::Sender::default())
    }

    /// Like [`Recorder::new`], and every prepare is told to `prepared`'s receivers.
    fn watching(
        behaviour: impl Fn(Envelope, u32) -> BoxFuture<'static, Result<Outcome, HandlerError>>
        + Send
        + Sync
        + 'static,
        prepared: watch::Sender<Vec<String>>,
    ) -> Self {
        Self(Arc::new(RecorderState {
            prepared,
            applied: Mutex::default(),
            attempts: Mutex::default(),
            behaviour: Box::new(behaviour),
        }))
    }

    fn obedient() -> Self {
        Self::new(|_, _| Box::pin(async { Ok(Outcome::Applied) }))
    }

    /// Holds event `id` inside its transaction: `entered` gets a permit when it gets
    /// there, and it goes on once `release` has one.
    fn holding(id: &'static str) -> (Self, Arc<Semaphore>, Arc<Semaphore>) {
        let entered = Arc::new(Semaphore::new(0));
        let release = Arc::new(Semaphore::new(0));
        let (entered_tx, release_rx) = (entered.clone(), release.clone());
        let handler = Self::new(move |event, _| {
            let (entered, release) = (entered_tx.clone(), release_rx.clone());
            Box::pin(async move {
                if event.id == id {
                    entered.add_permits(1);
                    let _permit = release.acquire().await.unwrap();
                }
                Ok(Outcome::Applied)
            })
        });
        (handler, entered, release)
    }

    fn prepared(&self) -> Vec<String> {
        self.0.prepared.borrow().clone()
    }

    fn applied(&self) -> Vec<String> {
        self.0.applied.lock().unwrap().clone()
    }

    fn attempts(&self, id: &str) -> u32 {
        self.0
            .attempts
            .lock()
            .unwrap()
            .get(id)
            .copied()
            .unwrap_or(0)
    }
}

impl Handler for Recorder {
    type Command = ();
    type Prepared = ();

    fn decode(&self, _: &Envelope) -> Result<Option<()>, HandlerError> {
        Ok(Some(()))
    }

    async fn prepare(&self, _: &Pool, event: &Envelope, (): ()) -> Result<Step<()>, HandlerError> {
        self.0
            .prepared
            .send_modify(|prepared| prepared.push(event.id.clone()));
        Ok(Step::Apply(()))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        (): (),
    ) -> Result<Outcome, HandlerError> {
        let attempt = {
            let mut attempts = self.0.attempts.lock().unwrap();
            let n = attempts.entry(event.id.clone()).or_default();
            *n += 1;
            *n
        };
        let outcome = (self.0.behaviour)(event.clone(), attempt).await?;
        tx.execute(
            "INSERT INTO applied (event_id, txid) VALUES ($1, txid_current())",
            &[&event.id],
        )
        .await?;
        self.0.applied.lock().unwrap().push(event.id.clone());
        Ok(outcome)
    }
}

/// A database for the recorder's `applied` table.
async fn database() -> TestDatabase {
    let db = TestDatabase::empty().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE applied (seq bigserial PRIMARY KEY, event_id text NOT NULL, txid bigint NOT NULL)",
        )
        .await
        .unwrap();
    db
}

fn event(id: &str) -> Vec<u8> {
    saga_testkit::envelope(id, "order.created", Uuid::nil(), json!({}))
}

fn transient() -> HandlerError {
    HandlerError::Pool(deadpool_postgres::PoolError::Timeout(
        deadpool_postgres::TimeoutType::Wait,
    ))
}

struct Run {
    kafka: TestKafka,
    db: TestDatabase,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(kafka: TestKafka, handler: Recorder) -> Run {
    start_with(kafka, handler, settings).await
}

/// The producer a consumer sends its dead letters with, as a service's relay lends it.
fn dead_letters(kafka: &TestKafka) -> FutureProducer {
    saga::kafka::idempotent_producer(&kafka.brokers)
        .create()
        .unwrap()
}

async fn start_with(
    kafka: TestKafka,
    handler: Recorder,
    settings: impl Fn(&TestKafka) -> ConsumerSettings,
) -> Run {
    let db = database().await;
    let shutdown = CancellationToken::new();
    let applier = Arc::new(Applier::new(db.pool.clone(), handler));
    let task = tokio::spawn(consumer::run(
        settings(&kafka),
        applier,
        dead_letters(&kafka),
        shutdown.clone(),
    ));
    Run {
        kafka,
        db,
        shutdown,
        task,
    }
}

fn settings(kafka: &TestKafka) -> ConsumerSettings {
    let topics = &kafka.topics;
    ConsumerSettings::new(
        &kafka.brokers,
        topics.group(SERVICE),
        topics.orders.clone(),
        topics.dead_letter(&topics.orders, SERVICE),
    )
}

impl Run {
    async fn produce(&self, partition: i32, id: &str) {
        self.kafka
            .produce_to(&self.kafka.topics.orders, Some(partition), None, &event(id))
            .await;
    }

    async fn caught_up(&self) {
        let group = self.kafka.topics.group(SERVICE);
        eventually(WAIT, "the group to commit everything", || async {
            self.kafka
                .group_caught_up(&group, &self.kafka.topics.orders)
                .await
                .then_some(())
        })
        .await;
    }

    async fn committed(&self, partition: i32) -> i64 {
        self.kafka
            .committed_offset(
                &self.kafka.topics.group(SERVICE),
                &self.kafka.topics.orders,
                partition,
            )
            .await
    }

    /// What the `applied` table holds, in commit order: event id and transaction id.
    async fn committed_events(&self) -> Vec<(String, i64)> {
        self.db
            .client()
            .await
            .query("SELECT event_id, txid FROM applied ORDER BY seq", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn each_partition_is_applied_in_order_and_partitions_in_parallel() {
    // The first record of partition 0 is held until partition 1 has been applied: with
    // partitions handled one after another this would never finish.
    let partition_one_done = Arc::new(Semaphore::new(0));
    let gate = partition_one_done.clone();
    let handler = Recorder::new(move |event, _| {
        let gate = gate.clone();
        Box::pin(async move {
            if event.id == "p0-0" {
                let _permit = gate.acquire().await.unwrap();
            }
            if event.id.starts_with("p1-") {
                gate.add_permits(1);
            }
            Ok(Outcome::Applied)
        })
    });
    let run = start(TestKafka::new().await, handler.clone()).await;
    for seq in 0..30 {
        for partition in 0..3 {
            run.produce(partition, &format!("p{partition}-{seq}")).await;
        }
    }

    run.caught_up().await;

    let applied = handler.applied();
    for partition in 0..3 {
        let prefix = format!("p{partition}-");
        let seen: Vec<String> = applied
            .iter()
            .filter(|id| id.starts_with(&prefix))
            .cloned()
            .collect();
        let expected: Vec<String> = (0..30).map(|seq| format!("{prefix}{seq}")).collect();
        assert_eq!(
            seen, expected,
            "partition {partition} out of order or incomplete"
        );
    }
    run.stop().await;
}

/// A backlog waiting on every partition, longer than a partition's queue, is applied on
/// all of them at once: every partition starts before any is half way through. (The loop
/// once waited for room in the queue of the record in hand, and the partitions of a
/// backlog were applied one after another.) Each partition's backlog is several times its
/// queue: on a busy machine one partition's first records have arrived after another had
/// applied 950 of its own, and since a resumed partition is fetched again at once, a
/// backlog of 1 500 let the first reach half way before the others began.
#[tokio::test]
async fn a_backlog_waiting_on_every_partition_is_applied_on_all_of_them_at_once() {
    const EACH: usize = 4_000;
    let kafka = TestKafka::new().await;
    let records: Vec<(i32, Vec<u8>)> = (0..EACH)
        .flat_map(|seq| {
            (0..3).map(move |partition| (partition, event(&format!("p{partition}-{seq}"))))
        })
        .collect();
    // Sent together: the producer keeps a partition's records in the order they are sent.
    futures::future::join_all(records.iter().map(|(partition, record)| {
        kafka.produce_to(&kafka.topics.orders, Some(*partition), None, record)
    }))
    .await;
    let handler = Recorder::obedient();
    let run = start(kafka, handler.clone()).await;

    run.caught_up().await;

    let applied = handler.applied();
    assert_eq!(applied.len(), 3 * EACH);
    let position = |id: String| applied.iter().position(|seen| *seen == id).unwrap();
    let starts: Vec<usize> = (0..3).map(|p| position(format!("p{p}-0"))).collect();
    let halves: Vec<usize> = (0..3)
        .map(|p| position(format!("p{p}-{}", EACH / 2)))
        .collect();
    assert!(
        starts.iter().max() < halves.iter().min(),
        "a partition started only after another was half way through: first records at \
         {starts:?}, middle records at {halves:?} of {} applied",
        applied.len()
    );
    run.stop().await;
}

/// A transaction per event, the records behind the one in hand, up to
/// [`consumer::LOOK_AHEAD`], are prepared (for ChargeOrder: charged at the provider) while
/// that one is applied, and no more.
#[tokio::test]
async fn the_records_behind_the_one_in_hand_are_prepared_while_its_transaction_runs() {
    records_prepared_ahead(settings, consumer::LOOK_AHEAD, "ahead").await;
}

/// In batches, the next batch is prepared while a batch's transaction runs, and no more:
/// a batch's calls wait beside the transaction ahead of it, not after it.
#[tokio::test]
async fn in_batches_the_next_batch_is_prepared_while_a_batch_transaction_runs() {
    records_prepared_ahead(batched(6), 6, "next").await;
}

/// Records `<prefix>-<n>` produced on one partition while the consumer runs, so the ones
/// behind reach the queue at any point of the transaction in hand. Each record's apply
/// waits until the prepare of the record `ahead` behind it has begun: with fewer prepared
/// ahead of its transaction, it would wait for ever. Then, from what each apply saw and
/// the transactions that committed, at most `ahead` records were prepared past the last
/// record of the transaction in hand, and `ahead` were.
async fn records_prepared_ahead(
    settings: impl Fn(&TestKafka) -> ConsumerSettings,
    ahead: usize,
    prefix: &'static str,
) {
    const RECORDS: usize = 60;
    let ids: Vec<String> = (0..RECORDS).map(|seq| format!("{prefix}-{seq}")).collect();
    let seq = move |id: &str| -> usize {
        id.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('-'))
            .unwrap()
            .parse()
            .unwrap()
    };
    let prepares = watch::Sender::default();
    let seen = prepares.subscribe();
    // For each apply: its record, and how many records had been prepared once it waited.
    let sightings = Arc::new(Mutex::new(Vec::new()));
    let waits = {
        let sightings = sightings.clone();
        move |event: Envelope, _| {
            let position = seq(&event.id);
            let awaited =
                (position + ahead < RECORDS).then(|| format!("{prefix}-{}", position + ahead));
            let (mut seen, sightings) = (seen.clone(), sightings.clone());
            Box::pin(async move {
                if let Some(awaited) = awaited {
                    seen.wait_for(|prepared: &Vec<String>| prepared.contains(&awaited))
                        .await
                        .unwrap();
                }
                let prepared = seen.borrow().len();
                sightings.lock().unwrap().push((position, prepared));
                Ok(Outcome::Applied)
            }) as BoxFuture<'static, _>
        }
    };
    let handler = Recorder::watching(waits, prepares);
    let run = start_with(TestKafka::new().await, handler.clone(), settings).await;

    for id in &ids {
        run.produce(0, id).await;
    }
    run.caught_up().await;

    assert_eq!(handler.applied(), ids, "applied in offset order, each once");
    // Begun in any order: each prepare is a task of its own.
    let mut prepared = handler.prepared();
    prepared.sort_by_key(|id| seq(id));
    assert_eq!(prepared, ids, "each prepared once");
    // The last record of each record's transaction.
    let mut last_of_its_transaction = vec![0; RECORDS];
    for transaction in transactions(&run.committed_events().await) {
        let last = seq(transaction.last().unwrap());
        for id in &transaction {
            last_of_its_transaction[seq(id)] = last;
        }
    }
    let beyond: Vec<usize> = sightings
        .lock()
        .unwrap()
        .iter()
        .map(|&(position, prepared)| prepared - (last_of_its_transaction[position] + 1))
        .collect();
    assert_eq!(
        beyond.iter().max(),
        Some(&ahead),
        "records prepared beyond the transaction in hand, at most: {beyond:?}"
    );
    run.stop().await;
}

#[tokio::test]
async fn an_offset_is_committed_only_after_its_handler_finished() {
    let release = Arc::new(Semaphore::new(0));
    let gate = release.clone();
    let handler = Recorder::new(move |event, _| {
        let gate = gate.clone();
        Box::pin(async move {
            if event.id == "slow" {
                let _permit = gate.acquire().await.unwrap();
            }
            Ok(Outcome::Applied)
        })
    });
    let run = start(TestKafka::new().await, handler.clone()).await;
    run.produce(0, "slow").await;
    run.produce(1, "fast").await;

    // Partition 1's commit proves commits are flowing; partition 0's record is still in
    // its handler, so its offset must not have been committed with it.
    eventually(WAIT, "partition 1 to be committed", || async {
        (run.committed(1).await == 1).then_some(())
    })
    .await;
    assert_eq!(
        run.committed(0).await,
        0,
        "offset committed before the handler finished"
    );
    assert_eq!(handler.applied(), ["fast"]);

    release.add_permits(1);
    eventually(WAIT, "partition 0 to be committed", || async {
        (run.committed(0).await == 1).then_some(())
    })
    .await;
    run.stop().await;
}

#[tokio::test]
async fn a_transient_failure_is_retried_until_it_works_and_nothing_behind_it_is_skipped() {
    let handler = Recorder::new(|event, attempt| {
        Box::pin(async move {
            if event.id == "flaky" && attempt <= 3 {
                return Err(transient());
            }
            Ok(Outcome::Applied)
        })
    });
    let run = start(TestKafka::new().await, handler.clone()).await;
    run.produce(0, "flaky").await;
    run.produce(0, "after").await;

    run.caught_up().await;

    assert_eq!(handler.applied(), ["flaky", "after"]);
    assert_eq!(handler.attempts("flaky"), 4);
    let dlq = run
        .kafka
        .topics
        .dead_letter(&run.kafka.topics.orders, SERVICE);
    assert!(
        run.kafka.read_all(&dlq).await.is_empty(),
        "a transient failure was dead-lettered"
    );
    run.stop().await;
}

#[tokio::test]
async fn a_rejected_event_is_dead_lettered_at_once_and_the_partition_moves_on() {
    let handler = Recorder::new(|event, _| {
        Box::pin(async move {
            if event.id == "poison" {
                return Err(HandlerError::rejected("order 42 does not exist"));
            }
            Ok(Outcome::Applied)
        })
    });
    let run = start(TestKafka::new().await, handler.clone()).await;
    run.produce(2, "poison").await;
    run.produce(2, "after").await;

    run.caught_up().await;

    assert_eq!(handler.applied(), ["after"]);
    assert_eq!(handler.attempts("poison"), 1);
    let topics = &run.kafka.topics;
    let dead = run
        .kafka
        .read_all(&topics.dead_letter(&topics.orders, SERVICE))
        .await;
    assert_eq!(dead.len(), 1);
    let record = &dead[0];
    assert_eq!(
        record.payload().unwrap(),
        event("poison").as_slice(),
        "the original bytes"
    );
    assert_eq!(
        header(record, "dlq.reason").as_deref(),
        Some("order 42 does not exist")
    );
    assert_eq!(
        header(record, "dlq.original.topic").as_deref(),
        Some(topics.orders.as_str())
    );
    assert_eq!(
        header(record, "dlq.original.partition").as_deref(),
        Some("2")
    );
    assert_eq!(header(record, "dlq.original.offset").as_deref(), Some("0"));
    assert_eq!(header(record, "dlq.attempts").as_deref(), Some("1"));
    run.stop().await;
}

#[tokio::test]
async fn an_unexpected_database_error_is_retried_a_few_times_then_dead_lettered() {
    let db = TestDatabase::empty().await;
    let pool = db.pool.clone();
    let handler = Recorder::new(move |event, _| {
        let pool = pool.clone();
        Box::pin(async move {
            if event.id == "divides-by-zero" {
                // A real error the code did not foresee: SQLSTATE 22012.
                pool.get().await?.query("SELECT 1 / 0", &[]).await?;
            }
            Ok(Outcome::Applied)
        })
    });
    let run = start(TestKafka::new().await, handler.clone()).await;
    run.produce(1, "divides-by-zero").await;
    run.produce(1, "after").await;

    run.caught_up().await;

    assert_eq!(handler.attempts("divides-by-zero"), 5);
    assert_eq!(handler.applied(), ["after"]);
    let topics = &run.kafka.topics;
    let dead = run
        .kafka
        .read_all(&topics.dead_letter(&topics.orders, SERVICE))
        .await;
    assert_eq!(dead.len(), 1);
    assert_eq!(header(&dead[0], "dlq.attempts").as_deref(), Some("5"));
    assert!(
        header(&dead[0], "dlq.reason")
            .unwrap()
            .contains("division by zero")
    );
    run.stop().await;
}

#[tokio::test]
async fn stopping_finishes_the_record_in_hand_commits_it_and_starts_no_other() {
    let (handler, entered, release) = Recorder::holding("in-hand");
    let run = start(TestKafka::new().await, handler.clone()).await;
    run.produce(0, "in-hand").await;
    run.produce(0, "behind").await;
    let _in_handler = entered.acquire().await.unwrap();

    run.shutdown.cancel();
    release.add_permits(1);
    let Run { kafka, task, .. } = run;
    task.await.unwrap().unwrap();

    assert_eq!(handler.applied(), ["in-hand"]);
    let group = kafka.topics.group(SERVICE);
    assert_eq!(
        kafka
            .committed_offset(&group, &kafka.topics.orders, 0)
            .await,
        1
    );
}

/// Consumers join and leave while records flow: every record is applied at least once
/// and the group ends with everything committed.
#[tokio::test]
async fn a_rebalance_loses_nothing() {
    let first = Recorder::obedient();
    let second = Recorder::obedient();
    let run_a = start(TestKafka::new().await, first.clone()).await;
    let produced = Mutex::new(Vec::<String>::new());
    for _ in 0..50 {
        produce_next(&run_a.kafka, &produced).await;
    }

    // A second member joins: the group rebalances while records keep coming.
    let shutdown_b = CancellationToken::new();
    let task_b = tokio::spawn(consumer::run(
        settings(&run_a.kafka),
        Arc::new(Applier::new(run_a.db.pool.clone(), second.clone())),
        dead_letters(&run_a.kafka),
        shutdown_b.clone(),
    ));
    eventually(
        WAIT,
        "the second consumer to be given partitions",
        || async {
            produce_next(&run_a.kafka, &produced).await;
            (!second.applied().is_empty()).then_some(())
        },
    )
    .await;
    for _ in 0..50 {
        produce_next(&run_a.kafka, &produced).await;
    }

    // The first leaves mid-stream: its partitions move to the second, records keep coming.
    let Run {
        kafka,
        shutdown,
        task,
        ..
    } = run_a;
    shutdown.cancel();
    for _ in 0..50 {
        produce_next(&kafka, &produced).await;
    }
    task.await.unwrap().unwrap();
    let group = kafka.topics.group(SERVICE);
    eventually(WAIT, "the group to commit everything", || async {
        kafka
            .group_caught_up(&group, &kafka.topics.orders)
            .await
            .then_some(())
    })
    .await;
    shutdown_b.cancel();
    task_b.await.unwrap().unwrap();

    let applied: HashSet<String> = first
        .applied()
        .into_iter()
        .chain(second.applied())
        .collect();
    let produced = produced.into_inner().unwrap();
    let missing: Vec<&String> = produced
        .iter()
        .filter(|id| !applied.contains(*id))
        .collect();
    assert!(missing.is_empty(), "never applied: {missing:?}");
    assert!(!first.applied().is_empty() && !second.applied().is_empty());
}

/// Produces the next numbered record, round robin over the three partitions.
async fn produce_next(kafka: &TestKafka, produced: &Mutex<Vec<String>>) {
    let (id, partition) = {
        let mut produced = produced.lock().unwrap();
        let n = produced.len();
        produced.push(format!("r-{n}"));
        (format!("r-{n}"), (n % 3) as i32)
    };
    kafka
        .produce_to(&kafka.topics.orders, Some(partition), None, &event(&id))
        .await;
}

fn batched(size: usize) -> impl Fn(&TestKafka) -> ConsumerSettings {
    move |kafka| ConsumerSettings {
        batch_size: size,
        ..settings(kafka)
    }
}

/// The records of one partition, in offset order, grouped by the transaction that
/// committed them.
fn transactions(committed: &[(String, i64)]) -> Vec<Vec<String>> {
    let mut grouped: Vec<(i64, Vec<String>)> = Vec::new();
    for (id, txid) in committed {
        match grouped.last_mut() {
            Some((last, ids)) if last == txid => ids.push(id.clone()),
            _ => grouped.push((*txid, vec![id.clone()])),
        }
    }
    grouped.into_iter().map(|(_, ids)| ids).collect()
}

/// A fresh namespace with `n` records `<prefix>-<i>` on `partition`, produced before any
/// consumer starts, so they are all waiting when one does.
async fn waiting_records(partition: i32, prefix: &str, n: usize) -> (TestKafka, Vec<String>) {
    let kafka = TestKafka::new().await;
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for id in &ids {
        kafka
            .produce_to(&kafka.topics.orders, Some(partition), None, &event(id))
            .await;
    }
    (kafka, ids)
}

#[tokio::test]
async fn batched_records_waiting_for_a_partition_commit_together_in_order_each_once() {
    let (kafka, ids) = waiting_records(0, "b", 60).await;
    let run = start_with(kafka, Recorder::obedient(), batched(16)).await;

    run.caught_up().await;

    let committed = run.committed_events().await;
    let order: Vec<String> = committed.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(order, ids, "every record committed once, in offset order");
    let transactions = transactions(&committed);
    assert!(
        transactions.len() < ids.len(),
        "no two records shared a transaction: {transactions:?}"
    );
    assert!(
        transactions.iter().all(|t| t.len() <= 16),
        "a transaction held more than the batch size: {transactions:?}"
    );
    assert_eq!(run.committed(0).await, 60);
    run.stop().await;
}

#[tokio::test]
async fn a_batch_with_a_poison_record_commits_nothing_then_each_record_is_applied_alone() {
    let (kafka, ids) = waiting_records(1, "q", 40).await;
    // Every fifth record can never be applied: each batch it is in rolls back.
    let poison = |id: &str| id.ends_with('4') || id.ends_with('9');
    let handler = Recorder::new(move |event, _| {
        Box::pin(async move {
            if poison(&event.id) {
                return Err(HandlerError::rejected("never applies"));
            }
            Ok(Outcome::Applied)
        })
    });
    let run = start_with(kafka, handler.clone(), batched(8)).await;

    run.caught_up().await;

    let committed: Vec<String> = run
        .committed_events()
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(
        handler.applied().len() > committed.len(),
        "no batch with a poison record in it held a good one: nothing was rolled back"
    );
    let good: Vec<String> = ids.iter().filter(|id| !poison(id)).cloned().collect();
    assert_eq!(
        committed, good,
        "each good record committed once, in order, none from a rolled-back batch"
    );
    let topics = &run.kafka.topics;
    // Sorted: the dead-letter topic has partitions of its own, read one after another.
    let mut dead: Vec<i64> = run
        .kafka
        .read_all(&topics.dead_letter(&topics.orders, SERVICE))
        .await
        .iter()
        .map(|record| {
            header(record, "dlq.original.offset")
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    dead.sort_unstable();
    let expected: Vec<i64> = (0..40).filter(|n| poison(&ids[*n as usize])).collect();
    assert_eq!(dead, expected, "each poison record dead-lettered once");
    assert_eq!(run.committed(1).await, 40);
    run.stop().await;
}

#[tokio::test]
async fn a_batch_offset_is_committed_only_after_its_transaction_committed() {
    let (kafka, ids) = waiting_records(0, "w", 20).await;
    let (handler, entered, release) = Recorder::holding("w-10");
    let run = start_with(kafka, handler, batched(16)).await;
    let _in_transaction = entered.acquire().await.unwrap();

    // A commit of partition 1 made after w-10's batch began proves commits are flowing:
    // had that batch's offset been stored before its transaction committed, it would be
    // committed with it.
    run.produce(1, "flowing").await;
    eventually(WAIT, "partition 1 to be committed", || async {
        (run.committed(1).await == 1).then_some(())
    })
    .await;
    let committed = run.committed(0).await;
    assert!(
        committed <= 10,
        "offset {committed} committed while w-10's transaction was still open"
    );

    release.add_permits(1);
    eventually(WAIT, "partition 0 to be committed", || async {
        (run.committed(0).await == 20).then_some(())
    })
    .await;
    let order: Vec<String> = run
        .committed_events()
        .await
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| id.starts_with("w-"))
        .collect();
    assert_eq!(order, ids);
    run.stop().await;
}
