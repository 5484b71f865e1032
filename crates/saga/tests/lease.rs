//! The singletons' lease against a real PostgreSQL: a standby takes over from a frozen
//! holder within the bound, and the holder, thawed, can no longer act under it; a frozen
//! outbox relay, thawed, publishes nothing it read after losing its lease.
//!
//! A frozen holder is a lease held on a runtime of its own, on a thread of its own, whose
//! only thread is then blocked: its heartbeat and its connection are not polled, while
//! its socket stays open and its kernel keeps answering, as with SIGSTOP.

use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use saga::lease::Lease;
use saga::outbox::{self, NewEvent};
use saga::{OutboxRelay, Transaction};
use saga_testkit::{TestDatabase, TestKafka, eventually, header};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

const KEY: i64 = 0x7465_7374; // "test"
const LEASE: Duration = Duration::from_secs(2);
const ROUNDS: usize = 5;
/// Beyond the bound, what a loaded 2-core machine may add to a standby's try.
const SLACK: Duration = Duration::from_secs(1);

fn lease(db: &TestDatabase) -> Lease {
    let database = saga::db::parse_url(&db.url).unwrap();
    Lease::new(&database, KEY, "test singleton", LEASE)
}

/// What the holder finds once thawed.
struct Thawed {
    is_held: bool,
    /// Whether a statement on the lease's session still ran.
    session_works: bool,
}

/// A holder of `lease` on a thread of its own. It reports when it holds the lease, then
/// freezes when told and, when thawed, reports what it finds.
struct Holder {
    acquired: oneshot::Receiver<()>,
    freeze: std_mpsc::Sender<std_mpsc::Receiver<()>>,
    thawed: oneshot::Receiver<Thawed>,
    thread: std::thread::JoinHandle<()>,
}

impl Holder {
    fn start(lease: Lease) -> Self {
        let (acquired_tx, acquired) = oneshot::channel();
        let (freeze, frozen_by) = std_mpsc::channel::<std_mpsc::Receiver<()>>();
        let (thawed_tx, thawed) = oneshot::channel();
        let thread = on_a_thread_of_its_own(async move {
            let held = lease
                .acquire(&CancellationToken::new())
                .await
                .unwrap()
                .expect("no shutdown");
            acquired_tx.send(()).unwrap();
            // Lets the heartbeat run until told to freeze.
            let thaw = loop {
                match frozen_by.try_recv() {
                    Ok(thaw) => break thaw,
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            // Blocks the runtime's only thread: nothing of this holder runs.
            thaw.recv().unwrap();
            let is_held = held.is_held();
            let session_works = held.client().simple_query("SELECT 1").await.is_ok();
            thawed_tx
                .send(Thawed {
                    is_held,
                    session_works,
                })
                .unwrap_or_else(|_| panic!("the test waits"));
        });
        Self {
            acquired,
            freeze,
            thawed,
            thread,
        }
    }

    /// Freezes the holder; returns what thaws it.
    fn freeze(&self) -> std_mpsc::Sender<()> {
        let (thaw, thawed_by) = std_mpsc::channel();
        self.freeze.send(thawed_by).unwrap();
        thaw
    }
}

#[tokio::test]
async fn a_standby_takes_over_within_the_bound_from_a_frozen_holder_which_thawed_holds_nothing() {
    let db = TestDatabase::empty().await;
    let lease = lease(&db);
    let mut takeovers = Vec::new();
    for round in 1..=ROUNDS {
        let mut holder = Holder::start(lease.clone());
        (&mut holder.acquired)
            .await
            .expect("the holder takes the lease");
        let standby_lease = lease.clone();
        let standby = tokio::spawn(async move {
            let held = standby_lease
                .acquire(&CancellationToken::new())
                .await
                .unwrap()
                .expect("no shutdown");
            (Instant::now(), held)
        });

        let thaw = holder.freeze();
        let frozen_at = Instant::now();
        let (took_over_at, held) = tokio::time::timeout(lease.bound() + SLACK, standby)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "round {round}: no takeover within {:?}",
                    lease.bound() + SLACK
                )
            })
            .unwrap();
        let takeover = took_over_at - frozen_at;
        // The holder's last heartbeat was at most a third of the lease before the freeze.
        assert!(
            takeover >= LEASE * 2 / 3 - Duration::from_millis(100),
            "round {round}: taken over after {takeover:?}, before the lease could run out"
        );
        assert!(held.is_held(), "round {round}: the standby holds the lease");
        takeovers.push(takeover);

        thaw.send(()).unwrap();
        let thawed = (&mut holder.thawed).await.unwrap();
        assert!(
            !thawed.is_held,
            "round {round}: the thawed holder believes it holds"
        );
        assert!(
            !thawed.session_works,
            "round {round}: the thawed holder's session still runs statements"
        );
        holder.thread.join().unwrap();
        drop(held);
    }
    println!(
        "takeovers from a frozen holder (lease {LEASE:?}, bound {:?}): {takeovers:?}",
        lease.bound()
    );
}

#[tokio::test]
async fn a_live_holder_keeps_its_lease_for_many_leases_and_a_standby_waits() {
    let db = TestDatabase::empty().await;
    let lease = lease(&db);
    let held = lease
        .acquire(&CancellationToken::new())
        .await
        .unwrap()
        .unwrap();
    let standby_lease = lease.clone();
    let standby = tokio::spawn(async move {
        standby_lease
            .acquire(&CancellationToken::new())
            .await
            .unwrap()
    });

    // Three leases long, the holder's session would have idled out three times over
    // without its heartbeat.
    let waited = tokio::time::timeout(LEASE * 3, async {
        while !standby.is_finished() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_err(), "the standby took a live holder's lease");
    assert!(held.is_held());
    held.client().simple_query("SELECT 1").await.unwrap();

    // Released on drop: the standby holds it within a try.
    drop(held);
    let took = tokio::time::timeout(lease.retry_interval() + SLACK, standby)
        .await
        .expect("the standby takes a released lease within a try")
        .unwrap();
    assert!(took.is_some_and(|held| held.is_held()));
}

#[tokio::test]
async fn only_one_of_many_contenders_holds_the_lease_at_a_time() {
    let db = TestDatabase::empty().await;
    let lease = lease(&db);
    for _ in 0..ROUNDS {
        let tries = (0..8).map(|_| {
            let lease = lease.clone();
            tokio::spawn(async move { lease.try_acquire().await.unwrap() })
        });
        let held: Vec<_> = futures::future::join_all(tries)
            .await
            .into_iter()
            .filter_map(|held| held.unwrap())
            .collect();
        assert_eq!(held.len(), 1, "contenders holding the lease at once");
        held.into_iter().next().unwrap().release().await.unwrap();
    }
}

/// A singleton stopping ends its turn and asks for the lease again: it must not get it,
/// free as it is, or it would take it and end its turn for ever instead of stopping.
#[tokio::test]
async fn a_stopping_singleton_does_not_take_even_a_free_lease() {
    let db = TestDatabase::empty().await;
    let lease = lease(&db);
    let stopping = CancellationToken::new();
    stopping.cancel();
    assert!(lease.acquire(&stopping).await.unwrap().is_none());
    assert!(lease.hold(&stopping).await.is_none());
    let held = lease.try_acquire().await.unwrap();
    assert!(held.is_some(), "the lease was free all along");
}

/// Enqueues an `order.created` with `event_id` and commits it.
async fn enqueue(db: &TestDatabase, topic: &str, event_id: &str) {
    let client = db.client().await;
    let tx = Transaction::begin(&client);
    let event = NewEvent {
        event_id,
        topic,
        key: "k",
        event_type: "order.created",
        payload: &serde_json::json!({}),
        caused_by: None,
    };
    outbox::enqueue(&tx, &event).await.unwrap();
    tx.commit().await.unwrap();
}

async fn published(db: &TestDatabase) -> i64 {
    db.count(
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
        &[],
    )
    .await
}

/// What freezes the relay of [`frozen_relay`]: it says when it is frozen, then waits to
/// be thawed, then to be stopped.
struct Freeze {
    frozen: oneshot::Sender<()>,
    thaw: std_mpsc::Receiver<()>,
    stop: oneshot::Receiver<()>,
}

/// A relay run on a thread of its own until told to freeze, then to thaw, then to stop.
/// Its producer's threads are not frozen: what the relay handed them before the freeze
/// still goes out, as it would from a real frozen process's socket buffers.
fn frozen_relay(
    db: &TestDatabase,
    kafka: &TestKafka,
) -> (std_mpsc::Sender<Freeze>, std::thread::JoinHandle<()>) {
    let (url, brokers) = (db.url.clone(), kafka.brokers.clone());
    let (freeze, frozen_by) = std_mpsc::channel::<Freeze>();
    let thread = on_a_thread_of_its_own(async move {
        let relay = OutboxRelay::new(&url, &brokers, Duration::from_millis(100))
            .unwrap()
            .leased_for(LEASE);
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(relay.run(shutdown.clone()));
        let orders = loop {
            match frozen_by.try_recv() {
                Ok(orders) => break orders,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        // Nothing of this runtime runs from here until thawed.
        orders.frozen.send(()).unwrap();
        orders.thaw.recv().unwrap();
        orders.stop.await.unwrap();
        shutdown.cancel();
        run.await.unwrap().unwrap();
    });
    (freeze, thread)
}

/// Runs `task` on a thread of its own, on a runtime whose only thread that is: blocking
/// it in `task` freezes all `task` spawned, as SIGSTOP freezes a process.
fn on_a_thread_of_its_own(
    task: impl Future<Output = ()> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(task);
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_relay_is_taken_over_within_the_bound_and_thawed_publishes_nothing_it_read_after()
{
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = kafka.topics.orders.clone();
    let wait = Duration::from_secs(60);
    let (freeze, thread) = frozen_relay(&db, &kafka);
    for n in 0..10 {
        enqueue(&db, &topic, &format!("before-{n}")).await;
    }
    eventually(wait, "the first relay to publish", || async {
        (published(&db).await == 10).then_some(())
    })
    .await;
    let standby = OutboxRelay::new(&db.url, &kafka.brokers, Duration::from_millis(100))
        .unwrap()
        .leased_for(LEASE);
    let stop_standby = CancellationToken::new();
    let standby = tokio::spawn(standby.run(stop_standby.clone()));

    let (thaw, thawed_by) = std_mpsc::channel();
    let (stop, stopped_by) = oneshot::channel();
    let (frozen, frozen_now) = oneshot::channel();
    freeze
        .send(Freeze {
            frozen,
            thaw: thawed_by,
            stop: stopped_by,
        })
        .unwrap();
    frozen_now.await.unwrap();
    let frozen_at = Instant::now();
    for n in 0..20 {
        enqueue(&db, &topic, &format!("during-{n}")).await;
    }
    eventually(wait, "the standby to publish", || async {
        (published(&db).await == 30).then_some(())
    })
    .await;
    let takeover = frozen_at.elapsed();
    let bound = lease(&db).bound() + SLACK;
    assert!(
        takeover <= bound,
        "published by the standby after {takeover:?}"
    );

    thaw.send(()).unwrap();
    // Thawed, the relay finds its session ended and waits as a standby again.
    eventually(wait, "the thawed relay to wait as a standby", || async {
        let waiting = db
            .count(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()
                    AND query LIKE '%pg_try_advisory_lock%'",
                &[],
            )
            .await;
        (waiting >= 1).then_some(())
    })
    .await;
    for n in 0..20 {
        enqueue(&db, &topic, &format!("after-{n}")).await;
    }
    eventually(wait, "every row published", || async {
        (published(&db).await == 50).then_some(())
    })
    .await;
    stop.send(()).unwrap();
    thread.join().unwrap();
    stop_standby.cancel();
    standby.await.unwrap().unwrap();

    let mut times: BTreeMap<String, usize> = BTreeMap::new();
    for record in kafka.read_all(&topic).await {
        *times
            .entry(header(&record, "event_id").unwrap())
            .or_default() += 1;
    }
    let twice: Vec<_> = times
        .iter()
        .filter(|(id, n)| !id.starts_with("before-") && **n != 1)
        .collect();
    assert!(twice.is_empty(), "published other than once: {twice:?}");
    assert_eq!(times.len(), 50);
    println!("a frozen relay taken over, its rows published again, in {takeover:?}");
}
