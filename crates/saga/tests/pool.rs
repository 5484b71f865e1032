//! The services' connection pools against a real server: a transaction a frozen copy
//! left open is ended by the server, and the rows it locked are free again.

use std::time::Duration;

use saga_testkit::TestDatabase;
use tokio_postgres::error::SqlState;

/// A session that began a transaction, locked a row and said nothing more, as a copy
/// stopped (SIGSTOP) between two statements does, holds the row only until
/// `abandoned_after`: another session's update, willing to wait far longer, then goes
/// through, and the abandoned session is gone.
#[tokio::test]
async fn a_transaction_left_idle_is_ended_and_its_row_locks_released() {
    let db = TestDatabase::empty().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, note text NOT NULL);
             INSERT INTO t VALUES (1, 'placed')",
        )
        .await
        .unwrap();
    let pool = saga::db::pool(&db.url, 2, Duration::from_secs(1)).unwrap();
    let frozen = pool.get().await.unwrap();
    frozen
        .batch_execute("BEGIN; SELECT * FROM t WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();

    let other = pool.get().await.unwrap();
    let locked_by = other
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
              WHERE c.relname = 't' AND l.mode = 'RowShareLock' AND l.granted",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(locked_by, 1, "the frozen session holds the row");
    other
        .batch_execute("SET lock_timeout = '20s'; UPDATE t SET note = 'taken over' WHERE id = 1")
        .await
        .expect("the lock released long before lock_timeout");

    let error = frozen
        .query_one("SELECT 1", &[])
        .await
        .expect_err("the server ended the abandoned session");
    assert!(
        error.is_closed() || error.code() == Some(&SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT),
        "{error:?}"
    );
}
