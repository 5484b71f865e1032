//! The pipelined transaction against a real server: it is still one transaction, run in
//! the order written, and a pipelined write's error is never lost.

use saga::Transaction;
use saga_testkit::TestDatabase;
use tokio_postgres::error::SqlState;

async fn database() -> TestDatabase {
    let db = TestDatabase::empty().await;
    db.client()
        .await
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, note text NOT NULL)")
        .await
        .unwrap();
    db
}

async fn ids(db: &TestDatabase) -> Vec<i32> {
    db.client()
        .await
        .query("SELECT id FROM t ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn insert(tx: &Transaction<'_>, id: i32) {
    tx.pipeline(
        tx.prepare_cached("INSERT INTO t (id, note) VALUES ($1, $2)")
            .await
            .unwrap(),
        vec![Box::new(id), Box::new(format!("row {id}"))],
    );
}

#[tokio::test]
async fn statements_run_in_one_transaction_in_the_order_written() {
    let db = database().await;
    let client = db.client().await;
    let tx = Transaction::begin(&client);
    let first: i64 = tx
        .query_opt("SELECT txid_current()", &[])
        .await
        .unwrap()
        .unwrap()
        .get(0);
    insert(&tx, 1).await;
    insert(&tx, 2).await;
    // The pipelined inserts go out ahead of this query, so it sees them.
    let row = tx
        .query_opt("SELECT count(*), txid_current() FROM t", &[])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 2);
    assert_eq!(row.get::<_, i64>(1), first, "one transaction throughout");
    assert!(
        ids(&db).await.is_empty(),
        "nothing visible before the commit"
    );
    insert(&tx, 3).await;
    tx.commit().await.unwrap();
    assert_eq!(ids(&db).await, [1, 2, 3]);
}

#[tokio::test]
async fn a_pipelined_write_that_fails_is_the_error_of_the_next_statement_not_its_refusal() {
    let db = database().await;
    let client = db.client().await;
    let tx = Transaction::begin(&client);
    insert(&tx, 1).await;
    insert(&tx, 1).await;
    let error = tx.execute("SELECT 1", &[]).await.unwrap_err();
    // Not IN_FAILED_SQL_TRANSACTION, which is the server refusing the SELECT after it.
    assert_eq!(error.code(), Some(&SqlState::UNIQUE_VIOLATION));
    drop(tx);
    assert!(ids(&db).await.is_empty());
}

#[tokio::test]
async fn a_commit_after_a_failed_pipelined_write_fails_and_commits_nothing() {
    let db = database().await;
    let client = db.client().await;
    let tx = Transaction::begin(&client);
    tx.execute("INSERT INTO t VALUES (1, 'first')", &[])
        .await
        .unwrap();
    insert(&tx, 1).await;
    insert(&tx, 2).await;
    // The server answers this COMMIT with a rollback and no error of its own.
    let error = tx.commit().await.unwrap_err();
    assert_eq!(error.code(), Some(&SqlState::UNIQUE_VIOLATION));
    assert!(ids(&db).await.is_empty());
}

/// A dropped transaction's ROLLBACK is sent, not awaited: the next transaction on the
/// same connection must queue behind it, or it would run inside the dropped one. One
/// connection, transactions committed and dropped in turn, many times over.
#[tokio::test]
async fn a_dropped_transaction_is_rolled_back_before_the_connection_is_used_again() {
    let db = database().await;
    let pool = saga::db::pool(&db.url, 1, saga::lease::DEFAULT_LEASE).unwrap();
    let mut committed = Vec::new();
    for id in 0..300 {
        let client = pool.get().await.unwrap();
        let tx = Transaction::begin(&client);
        insert(&tx, id).await;
        let in_transaction: bool = tx
            .query_opt("SELECT txid_current_if_assigned() IS NOT NULL", &[])
            .await
            .unwrap()
            .unwrap()
            .get(0);
        assert!(in_transaction, "transaction {id} began");
        match id % 3 {
            0 => drop(tx),
            // A drop with writes still queued: they are never sent.
            1 => {
                insert(&tx, id + 10_000).await;
                drop(tx);
            }
            _ => {
                tx.commit().await.unwrap();
                committed.push(id);
            }
        }
    }
    assert_eq!(ids(&db).await, committed);
}

#[tokio::test]
async fn a_transaction_with_only_pipelined_writes_sends_them_with_its_commit() {
    let db = database().await;
    let client = db.client().await;
    let tx = Transaction::begin(&client);
    insert(&tx, 7).await;
    tx.commit().await.unwrap();
    assert_eq!(ids(&db).await, [7]);

    let unused = Transaction::begin(&client);
    unused.commit().await.unwrap();
    // Had that left a transaction open, this insert would not be visible elsewhere.
    client
        .execute("INSERT INTO t VALUES (8, 'after')", &[])
        .await
        .unwrap();
    assert_eq!(ids(&db).await, [7, 8]);
}
