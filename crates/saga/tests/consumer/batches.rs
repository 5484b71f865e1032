//! Batches: the records waiting for a partition applied in one transaction, and what a
//! poison record or a commit does to a batch.

use saga::{HandlerError, Outcome};
use saga_testkit::{eventually, header};

use crate::recorder::Recorder;
use crate::run::{SERVICE, WAIT, batched, start_with, transactions, waiting_records};

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
