//! A service's database behind a connection pooler: PgBouncer (Debian's, which
//! `scripts/test` installs) in transaction mode lends one server session to several
//! clients, which the leases, the relay's `LISTEN` and the migrations' lock cannot share;
//! `saga::db::refuse_shared_sessions`, run by every service at start, refuses it, and lets
//! a pooler in session mode and PostgreSQL itself through.
//!
//! Settings: `PGBOUNCER` (the `pgbouncer` on `PATH`, or Debian's `/usr/sbin/pgbouncer`),
//! and the server of `SAGA_TEST_POSTGRES_URL`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use saga::db::DbError;
use saga_testkit::{eventually, postgres_admin_url};

/// How often each URL is tried: a pooler that hands out another idle server connection
/// now and then must still be caught every time.
const ROUNDS: usize = 10;

/// A PgBouncer of the test's own, on a free port, with two databases in front of the
/// test server's `postgres`: `transaction` and `session`, named after their pool modes.
struct PgBouncer {
    child: Child,
    port: u16,
    user: String,
    password: String,
    _dir: TempDir,
}

impl PgBouncer {
    async fn start() -> Self {
        let server: tokio_postgres::Config = postgres_admin_url().parse().unwrap();
        let user = server.get_user().expect("a user").to_owned();
        let password =
            String::from_utf8(server.get_password().expect("a password").to_vec()).unwrap();
        let port = free_port();
        let dir = TempDir::new();
        // PgBouncer will not run as root: it is told to become postgres, who must read this.
        let root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
        let (host, server_port) = match (server.get_hosts(), server.get_ports()) {
            ([tokio_postgres::config::Host::Tcp(host), ..], [port, ..]) => (host.clone(), *port),
            _ => panic!("SAGA_TEST_POSTGRES_URL: a TCP host and port, for PgBouncer"),
        };
        let db = format!("host={host} port={server_port} dbname=postgres");
        dir.write(
            "pgbouncer.ini",
            &format!(
                "[databases]\n\
                 transaction = {db} pool_mode=transaction\n\
                 session = {db} pool_mode=session\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = scram-sha-256\n\
                 auth_file = {}\n\
                 ignore_startup_parameters = extra_float_digits\n",
                dir.0.join("users.txt").display()
            ),
        );
        dir.write("users.txt", &format!("\"{user}\" \"{password}\"\n"));
        let mut command = Command::new(std::env::var("PGBOUNCER").unwrap_or_else(|_| {
            let on_path = Command::new("sh")
                .args(["-c", "command -v pgbouncer"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
            on_path.unwrap_or_else(|| "/usr/sbin/pgbouncer".into())
        }));
        if root {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(dir.0.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer runs (scripts/test installs Debian's)");
        let pooler = Self {
            child,
            port,
            user,
            password,
            _dir: dir,
        };
        eventually(Duration::from_secs(20), "PgBouncer to listen", || async {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .await;
        pooler
    }

    fn url(&self, database: &str) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:{}/{database}?sslmode=disable",
            self.user, self.password, self.port
        )
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_pooler_in_transaction_mode_is_refused_naming_database_url() {
    let pooler = PgBouncer::start().await;

    for _ in 0..ROUNDS {
        let refused = saga::db::refuse_shared_sessions(&pooler.url("transaction")).await;

        let Err(error @ DbError::SharedSession { .. }) = refused else {
            panic!("not refused: {refused:?}");
        };
        assert!(
            error.to_string().starts_with(
                "DATABASE_URL reaches PostgreSQL through a pooler that lends one server \
                 session to several clients (transaction or statement mode): of two \
                 connections open at once, the second saw a setting the first made in its \
                 session"
            ),
            "{error}"
        );
    }
}

#[tokio::test]
async fn a_pooler_in_session_mode_and_postgres_itself_are_let_through() {
    let pooler = PgBouncer::start().await;

    for _ in 0..ROUNDS {
        saga::db::refuse_shared_sessions(&pooler.url("session"))
            .await
            .unwrap();
        saga::db::refuse_shared_sessions(&postgres_admin_url())
            .await
            .unwrap();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A directory anyone may read, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("saga-pgbouncer-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, content: &str) {
        std::fs::write(self.0.join(name), content).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
