//! Offsets, failures and membership: what is committed when, what is retried, what is
//! dead-lettered, and what a stop or a rebalance does to the records in flight.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use saga::consumer;
use saga::{Applier, HandlerError, Outcome};
use saga_testkit::{TestDatabase, TestKafka, eventually, header};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::recorder::Recorder;
use crate::run::{
    Run, SERVICE, WAIT, dead_letters, event, produce_next, settings, start, transient,
};

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

/// A header as a test compares it: its name, and its value byte for byte (or none).
type RawHeader = (String, Option<Vec<u8>>);

fn raw(name: &str, value: Option<&[u8]>) -> RawHeader {
    (name.to_owned(), value.map(<[u8]>::to_vec))
}

const DEAD_LETTER_HEADERS: [&str; 8] = [
    "dlq.reason",
    "dlq.original.topic",
    "dlq.original.partition",
    "dlq.original.offset",
    "dlq.group",
    "dlq.attempts",
    "dlq.first.failure",
    "dlq.last.failure",
];

/// Runs a consumer that rejects the record `poison`, produces it with `headers` on
/// partition 0, and returns the headers of its dead letter, in order.
async fn dead_letter_headers(headers: &[RawHeader]) -> Vec<RawHeader> {
    let handler = Recorder::new(|event, _| {
        Box::pin(async move {
            if event.id == "poison" {
                return Err(HandlerError::rejected("order 42 does not exist"));
            }
            Ok(Outcome::Applied)
        })
    });
    let run = start(TestKafka::new().await, handler).await;
    let topics = &run.kafka.topics;
    let mut owned = OwnedHeaders::new();
    for (key, value) in headers {
        owned = owned.insert(Header {
            key,
            value: value.as_deref(),
        });
    }
    let value = event("poison");
    let record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topics.orders)
        .partition(0)
        .payload(value.as_slice())
        .headers(owned);
    dead_letters(&run.kafka)
        .send(record, WAIT)
        .await
        .map_err(|(e, _)| e)
        .expect("the broker acknowledges");
    run.caught_up().await;

    let dead = run
        .kafka
        .read_all(&topics.dead_letter(&topics.orders, SERVICE))
        .await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].payload(),
        Some(value.as_slice()),
        "the original bytes"
    );
    let got = dead[0]
        .headers()
        .into_iter()
        .flat_map(Headers::iter)
        .map(|h| raw(h.key, h.value))
        .collect();
    run.stop().await;
    got
}

#[tokio::test]
async fn a_dead_letter_keeps_every_header_of_its_record_byte_for_byte_before_the_dlq_ones() {
    let own = vec![
        raw("event_id", Some(b"o-1:outcome")),
        raw("causation_id", Some(b"o-1:payment")),
        raw(
            "traceparent",
            Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ),
        raw(
            "tracestate",
            Some(b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
        ),
        // Not text, and a header without a value: kept as they are all the same.
        raw("x-anything", Some(&[0xff, 0x00, 0xfe, b'a'])),
        raw("x-no-value", None),
    ];

    let dead = dead_letter_headers(&own).await;

    assert_eq!(dead[..own.len()], own[..], "the record's own headers first");
    let after: Vec<&str> = dead[own.len()..].iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(after, DEAD_LETTER_HEADERS, "then why it is here");
}

/// A record redriven and dead-lettered again: its dead letter tells of this failure
/// alone, once per header, and keeps every header of the record that is not a `dlq.` one.
#[tokio::test]
async fn a_record_dead_lettered_again_keeps_its_own_headers_and_only_this_failures_dlq_ones() {
    let own = [
        raw("causation_id", Some(b"o-1:payment")),
        raw(
            "traceparent",
            Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ),
    ];
    let earlier_trip = vec![
        raw("dlq.reason", Some(b"an earlier failure")),
        raw("dlq.original.offset", Some(b"418")),
        raw("dlq.redriven.from", Some(b"orders.payment-service.dlq/2/3")),
    ];
    let sent = [own[..1].to_vec(), earlier_trip, own[1..].to_vec()].concat();

    let dead = dead_letter_headers(&sent).await;

    assert_eq!(
        dead[..own.len()],
        own[..],
        "the record's own headers, in order"
    );
    let after: Vec<&str> = dead[own.len()..].iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        after, DEAD_LETTER_HEADERS,
        "each dlq. header once, none of the earlier trip"
    );
    let value = |name: &str| dead.iter().find(|(k, _)| k == name).unwrap().1.clone();
    assert_eq!(
        value("dlq.reason").as_deref(),
        Some(&b"order 42 does not exist"[..])
    );
    assert_eq!(value("dlq.original.offset").as_deref(), Some(&b"0"[..]));
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
