//! PostgreSQL's roles and databases: each service its own, made by the same SQL as
//! natively, and logged in to with the native setup's password.

use std::sync::LazyLock;

use regex::Regex;
use saga_e2e::workspace_root;
use saphyr::YamlOwned;

use crate::lib_sh::LibSh;
use crate::read;
use crate::yaml::{Compose, Node, env_var, environment, strings};

const POSTGRES_INIT_FOLDER: &str = "deploy/postgres";
const POSTGRES_INIT_MOUNT: &str = "/docker-entrypoint-initdb.d";
const SERVICE_DATABASE_SQL: &str = "service-database.psql";

#[test]
fn postgres_makes_each_service_its_own_role_and_database_as_the_native_scripts_do() {
    let compose = Compose::load();
    let postgres = compose.service("postgres");
    let mounted = strings(postgres.at(&["volumes"])).iter().any(|volume| {
        volume.starts_with(&format!("./{POSTGRES_INIT_FOLDER}:{POSTGRES_INIT_MOUNT}"))
    });
    assert!(
        mounted,
        "postgres does not mount ./{POSTGRES_INIT_FOLDER} on {POSTGRES_INIT_MOUNT}"
    );

    // The same SQL as natively: scripts/infra-up feeds it to psql too.
    let init = read(
        &workspace_root()
            .join(POSTGRES_INIT_FOLDER)
            .join("init-databases.sh"),
    );
    assert!(
        init.contains(&format!("-f {POSTGRES_INIT_MOUNT}/{SERVICE_DATABASE_SQL}")),
        "init-databases.sh does not run {SERVICE_DATABASE_SQL}"
    );
    assert!(
        read(&workspace_root().join("scripts/infra-up")).contains(&format!(
            "$ROOT/{POSTGRES_INIT_FOLDER}/{SERVICE_DATABASE_SQL}"
        )),
        "scripts/infra-up does not run {POSTGRES_INIT_FOLDER}/{SERVICE_DATABASE_SQL}"
    );

    let lib = LibSh::load();
    let mut created = created_databases(&init);
    created.sort();
    let mut native: Vec<(String, String)> = lib
        .array("SERVICES")
        .iter()
        .map(|service| {
            (
                lib.case("service_role", service),
                lib.case("service_database", service),
            )
        })
        .collect();
    native.sort();
    assert_eq!(
        created, native,
        "(role, database) made by init-databases.sh vs service_role and service_database \
         in scripts/lib.sh"
    );
    let mut databases: Vec<String> = created.iter().map(|(_, db)| db.clone()).collect();
    let mut listed = lib.array("PG_DATABASES");
    databases.sort();
    listed.sort();
    assert_eq!(databases, listed, "init-databases.sh vs PG_DATABASES");

    let mut used: Vec<String> = compose
        .built_services()
        .map(|(name, service)| database_url(service, name).database)
        .collect();
    used.sort();
    assert_eq!(
        databases, used,
        "databases created by init-databases.sh vs those in the services' DATABASE_URL"
    );
}

#[test]
fn each_service_logs_in_as_its_own_role_with_the_native_setups_password() {
    let compose = Compose::load();
    let lib = LibSh::load();
    let postgres = environment(compose.service("postgres"));
    assert_eq!(
        env_var(&postgres, "postgres", "POSTGRES_USER"),
        lib.scalar("PG_USER"),
        "POSTGRES_USER (the administrator) vs PG_USER"
    );
    assert_eq!(
        env_var(&postgres, "postgres", "POSTGRES_PASSWORD"),
        lib.scalar("PG_PASSWORD"),
        "POSTGRES_PASSWORD vs PG_PASSWORD"
    );

    let mut roles = Vec::new();
    for (name, service) in compose.built_services() {
        let url = database_url(service, name);
        let role = lib.case("service_role", name);
        assert_eq!(
            url.database,
            lib.case("service_database", name),
            "{name}: DATABASE_URL's database vs service_database in scripts/lib.sh"
        );
        assert_eq!(
            url.user, role,
            "{name}: DATABASE_URL logs in as another role than service_role in scripts/lib.sh"
        );
        assert_eq!(
            url.host_port, "postgres:5432",
            "{name}: DATABASE_URL does not point at the postgres container"
        );
        assert_eq!(
            url.password,
            password_setting(&role),
            "{name}: DATABASE_URL's password is not its role's setting"
        );
        roles.push(role);
    }
    // postgres is given every role's password, readers' included, under the same setting.
    roles.extend(
        lib.array("PG_DATABASES")
            .iter()
            .map(|db| format!("{db}_reader")),
    );
    for role in roles {
        let variable = format!("PG_PASSWORD_{}", role.to_uppercase());
        assert_eq!(
            env_var(&postgres, "postgres", &variable),
            password_setting(&role),
            "postgres: {variable}"
        );
    }
}

/// `${PG_PASSWORD_<ROLE>:-<the native default>}`: overridable as natively, the same
/// password when not.
fn password_setting(role: &str) -> String {
    format!(
        "${{PG_PASSWORD_{}:-{}}}",
        role.to_uppercase(),
        saga_testkit::role_password(role)
    )
}

struct DatabaseUrl {
    user: String,
    password: String,
    host_port: String,
    database: String,
}

fn database_url(service: &YamlOwned, name: &str) -> DatabaseUrl {
    static URL: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^postgres(?:ql)?://([^:@/]+):([^@/]*)@([^/]+)/([^/?]+)$").unwrap()
    });
    let url = env_var(&environment(service), name, "DATABASE_URL");
    let parts = URL.captures(&url).unwrap_or_else(|| {
        panic!("{name}: DATABASE_URL {url} is not postgres://user:password@host:port/database")
    });
    DatabaseUrl {
        user: parts[1].to_owned(),
        password: parts[2].to_owned(),
        host_port: parts[3].to_owned(),
        database: parts[4].to_owned(),
    }
}

/// The (role, database) pairs init-databases.sh makes: `for pair in role:database ...; do`.
fn created_databases(init: &str) -> Vec<(String, String)> {
    static PAIR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b(\w+):(\w+)\b").unwrap());
    let list = init
        .split_once("for pair in ")
        .and_then(|(_, rest)| rest.split_once("; do"))
        .map(|(list, _)| list)
        .expect("init-databases.sh: `for pair in role:database ...; do`");
    PAIR.captures_iter(list)
        .map(|c| (c[1].to_owned(), c[2].to_owned()))
        .collect()
}
