//! Order and look-ahead: a partition's records in order, partitions side by side, and the
//! records behind the one in hand prepared while it is applied.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use saga::consumer::{self, ConsumerSettings};
use saga::{Envelope, Outcome};
use saga_testkit::TestKafka;
use tokio::sync::{Semaphore, watch};

use crate::recorder::Recorder;
use crate::run::{batched, event, settings, start, start_with, transactions};

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
