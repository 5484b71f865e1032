//! The workspace's binaries, and what each reads, as its `--help` says.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::LazyLock;

use regex::Regex;
use saga_e2e::workspace_root;

use crate::read;

/// Every environment variable `binary` reads: its settings, as its `--help` lists them
/// (clap prints `[env: NAME=]`, or `[env: NAME]` where it hides the value), and those the logging setup reads itself.
pub(crate) fn variables_read_by(binary: &str) -> BTreeSet<String> {
    static ENV: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\[env: ([A-Z][A-Z0-9_]*)[=\]]").unwrap());
    let help = help(binary);
    let mut read: BTreeSet<String> = ENV.captures_iter(&help).map(|c| c[1].to_owned()).collect();
    assert!(
        !read.is_empty(),
        "{binary} --help names no variable:\n{help}"
    );
    read.extend(logging_variables());
    read
}

/// The prefixes of the variables `binary` reads a family of, as its `--help` lists them:
/// `KAFKA_CLIENT_` for `KAFKA_CLIENT_<PROPERTY>` (saga::kafka::client).
pub(crate) fn prefixes_read_by(binary: &str) -> BTreeSet<String> {
    static PREFIX: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\b([A-Z][A-Z0-9_]*_)<[A-Z]+>").unwrap());
    PREFIX
        .captures_iter(&help(binary))
        .map(|c| c[1].to_owned())
        .collect()
}

/// The variables that `saga::telemetry` reads outside clap: `std::env::var("NAME")`,
/// `RUST_LOG` when it builds its filter from tracing-subscriber's default variable, and
/// the standard OpenTelemetry ones once the saga library exports spans over OTLP (the
/// exporter reads the endpoint itself, the SDK the service's name).
fn logging_variables() -> Vec<String> {
    static VAR: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r#"env::var\("([A-Z][A-Z0-9_]*)"\)"#).unwrap());
    let source = read(&workspace_root().join("crates/saga/src/telemetry.rs"));
    let mut variables: Vec<String> = VAR
        .captures_iter(&source)
        .map(|c| c[1].to_owned())
        .collect();
    if source.contains("from_default_env") {
        variables.push("RUST_LOG".to_owned());
    }
    if exports_over_otlp() {
        variables.extend(["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"].map(str::to_owned));
    }
    variables
}

/// Whether some file of the saga library uses the OTLP exporter.
fn exports_over_otlp() -> bool {
    fn any_file_uses(dir: &std::path::Path) -> bool {
        std::fs::read_dir(dir).unwrap().any(|entry| {
            let path = entry.unwrap().path();
            if path.is_dir() {
                any_file_uses(&path)
            } else {
                path.extension().is_some_and(|e| e == "rs")
                    && read(&path).contains("opentelemetry_otlp")
            }
        })
    }
    any_file_uses(&workspace_root().join("crates/saga/src"))
}

/// The `[default: ...]` that `binary --help` shows for the setting read from `variable`.
pub(crate) fn help_default(binary: &str, variable: &str) -> String {
    let help = help(binary);
    let pattern = Regex::new(&format!(
        r"\[env: {}=[^\]]*\]\s*\[default: ([^\]]*)\]",
        regex::escape(variable)
    ))
    .unwrap();
    pattern
        .captures(&help)
        .map(|c| c[1].to_owned())
        .unwrap_or_else(|| panic!("{binary} --help shows no default for {variable}:\n{help}"))
}

fn help(binary: &str) -> String {
    let path = binary_path(binary);
    // A clean environment: clap would print the values of any variables set here.
    let output = Command::new(&path)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        output.status.success(),
        "{} --help failed: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("--help prints UTF-8")
}

/// The built binary next to this test's own target folder.
fn binary_path(binary: &str) -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> -> target/<profile>/<binary>
    let path = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps")
        .join(binary);
    assert!(
        path.exists(),
        "{} not found: build the services first (`cargo build --bins`, as scripts/test does)",
        path.display()
    );
    path
}

/// The workspace's binary crates: `crates/<name>` with a `src/main.rs`, whose package
/// (and so binary) name is the folder's.
pub(crate) fn workspace_binaries() -> Vec<String> {
    let crates = workspace_root().join("crates");
    let mut binaries = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let folder = entry.unwrap().path();
        if !folder.join("src/main.rs").exists() {
            continue;
        }
        let name = folder.file_name().unwrap().to_str().unwrap().to_owned();
        let manifest = read(&folder.join("Cargo.toml"));
        assert!(
            manifest.contains(&format!("\nname = \"{name}\"\n")),
            "{}: the package is not named after its folder {name}",
            folder.display()
        );
        binaries.push(name);
    }
    binaries
}
