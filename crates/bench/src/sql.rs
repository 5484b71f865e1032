//! The handlers' SQL, read out of their source files, and the pgbench scripts that run it.
//!
//! The ceiling the benchmark compares against must be the *same* transactions the services
//! commit, not a retyped copy that drifts. So the source files are compiled in
//! (`include_str!`) and parsed with `syn`: every string literal passed to `execute`,
//! `query`, `query_one`, … inside a handler's function is one statement, in source order,
//! and a call to `outbox::enqueue` stands for the outbox's statements in
//! `crates/saga/src/outbox.rs`.
//! The handlers keep their SQL at the call site, where a reader of the guards sees it.
//!
//! An order's cost is not only its transactions: ChargeOrder reads ahead before it calls
//! the card provider (autocommitted, outside its transaction), and the provider commits a
//! transaction of its own for every charge, in its own database on the same server. So the
//! `charge` script runs the read-ahead before its `BEGIN`, and the provider's charge is a
//! transaction here like the handlers' (`provider`), part of every order's cost in the
//! end-to-end ceiling and of ChargeOrder's own. `charge without call` is the transaction
//! alone, the whole of ChargeOrder's SQL before the call, measured in the same run so that
//! what the call adds can be told from what the machine does that day.
//!
//! What the code cannot say is which values a statement is run with; each transaction
//! below gives one binding per statement, checked against the extracted statement (its
//! opening words and its number of `$n` parameters). A statement added, removed or
//! changed in a handler makes [`Transaction::pgbench_script`] fail, and the tests with it.

use std::fmt::Write as _;

use anyhow::{Context as _, bail};
use syn::visit::Visit;

/// A source file the benchmark reads SQL from, by its path in the workspace.
pub struct Source {
    pub path: &'static str,
    pub text: &'static str,
}

pub const ORDERS: Source = Source {
    path: "crates/order-service/src/orders.rs",
    text: include_str!("../../order-service/src/orders.rs"),
};
pub const APPLY_PAYMENT_RESULT: Source = Source {
    path: "crates/order-service/src/apply_payment_result.rs",
    text: include_str!("../../order-service/src/apply_payment_result.rs"),
};
pub const CHARGE_ORDER: Source = Source {
    path: "crates/payment-service/src/charge_order.rs",
    text: include_str!("../../payment-service/src/charge_order.rs"),
};
pub const NOTIFY_CUSTOMER: Source = Source {
    path: "crates/notification-service/src/notify_customer.rs",
    text: include_str!("../../notification-service/src/notify_customer.rs"),
};
pub const OUTBOX: Source = Source {
    path: "crates/saga/src/outbox.rs",
    text: include_str!("../../saga/src/outbox.rs"),
};
pub const PROVIDER_CHARGES: Source = Source {
    path: "crates/payment-provider/src/charges.rs",
    text: include_str!("../../payment-provider/src/charges.rs"),
};

/// Every source file above, for the drift check.
pub const SOURCES: [&Source; 6] = [
    &ORDERS,
    &APPLY_PAYMENT_RESULT,
    &CHARGE_ORDER,
    &NOTIFY_CUSTOMER,
    &OUTBOX,
    &PROVIDER_CHARGES,
];

/// Functions in those files whose SQL is deliberately not benchmarked, and why.
pub const NOT_BENCHMARKED: [(&str, &str); 4] = [
    (
        "find_order",
        "GET /v1/orders/{id}: a read, not a step of the saga",
    ),
    (
        "session",
        "the relay's advisory lock, taken once per session, not per batch",
    ),
    (
        "list_charges",
        "GET /v1/charges: the provider's list for a person counting an order's charges",
    ),
    (
        "get_charge",
        "GET /v1/charges/{id}: a read at the provider, not a step of the saga",
    ),
];

/// Client methods whose first argument is a statement.
const QUERY_METHODS: [&str; 9] = [
    "execute",
    "query",
    "query_one",
    "query_opt",
    "query_raw",
    "execute_raw",
    "prepare",
    "prepare_cached",
    "batch_execute",
];

/// What one function of a source file does with the database, in source order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// The statements, each as written in the source.
    pub statements: Vec<String>,
    /// Whether it runs in a transaction: opens one (`client.transaction()`) or is handed
    /// one (a `&Transaction` parameter: a handler's, opened by the consumer's `Applier`).
    pub transactional: bool,
}

struct Collector {
    statements: Vec<String>,
    transactional: bool,
    /// The outbox insert, spliced in where a handler calls `outbox::enqueue`.
    enqueue: Option<Vec<String>>,
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        // Receiver first: `client.transaction().await?.execute(…)` reads left to right.
        self.visit_expr(&call.receiver);
        let method = call.method.to_string();
        if method == "transaction" {
            self.transactional = true;
        }
        if QUERY_METHODS.contains(&method.as_str())
            && let Some(syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(sql),
                ..
            })) = call.args.first()
        {
            self.statements.push(sql.value());
        }
        for arg in &call.args {
            self.visit_expr(arg);
        }
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(path) = &*call.func {
            let segments: Vec<String> = path
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            // `saga::Transaction::begin(&client)` opens one, like `client.transaction()`.
            if segments.ends_with(&["Transaction".to_owned(), "begin".to_owned()]) {
                self.transactional = true;
            }
            if segments.ends_with(&["outbox".to_owned(), "enqueue".to_owned()])
                && let Some(enqueue) = &self.enqueue
            {
                self.statements.extend(enqueue.iter().cloned());
            }
        }
        syn::visit::visit_expr_call(self, call);
    }
}

/// A function of a source file: its name, whether it is handed a transaction, its body.
struct Function {
    name: String,
    handed_transaction: bool,
    block: syn::Block,
}

impl Function {
    fn new(sig: &syn::Signature, block: syn::Block) -> Self {
        let handed_transaction = sig.inputs.iter().any(|input| match input {
            syn::FnArg::Typed(typed) => is_transaction(&typed.ty),
            syn::FnArg::Receiver(_) => false,
        });
        Self {
            name: sig.ident.to_string(),
            handed_transaction,
            block,
        }
    }
}

/// `Transaction<'_>`, `&Transaction<'_>`, `&deadpool_postgres::Transaction<'_>`, …
fn is_transaction(ty: &syn::Type) -> bool {
    match ty {
        syn::Type::Reference(reference) => is_transaction(&reference.elem),
        syn::Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "Transaction"),
        _ => false,
    }
}

/// Every function of `source` (free functions and methods).
fn functions(source: &Source) -> anyhow::Result<Vec<Function>> {
    let file = syn::parse_file(source.text).with_context(|| format!("parsing {}", source.path))?;
    let mut found = Vec::new();
    for item in file.items {
        match item {
            syn::Item::Fn(function) => found.push(Function::new(&function.sig, *function.block)),
            syn::Item::Impl(implementation) => {
                for item in implementation.items {
                    if let syn::ImplItem::Fn(method) = item {
                        found.push(Function::new(&method.sig, method.block));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(found)
}

fn find(source: &Source, name: &str) -> anyhow::Result<Function> {
    functions(source)?
        .into_iter()
        .find(|function| function.name == name)
        .with_context(|| format!("no function `{name}` in {}", source.path))
}

fn collect(function: &Function, enqueue: Option<Vec<String>>) -> Extracted {
    let mut collector = Collector {
        statements: Vec::new(),
        transactional: function.handed_transaction,
        enqueue,
    };
    collector.visit_block(&function.block);
    Extracted {
        statements: collector.statements,
        transactional: collector.transactional,
    }
}

/// The SQL of function `name` in `source`, with `outbox::enqueue` calls expanded.
pub fn extract(source: &Source, name: &str) -> anyhow::Result<Extracted> {
    let enqueue = extract_plain(&OUTBOX, "enqueue")?.statements;
    Ok(collect(&find(source, name)?, Some(enqueue)))
}

fn extract_plain(source: &Source, name: &str) -> anyhow::Result<Extracted> {
    Ok(collect(&find(source, name)?, None))
}

/// Every function of `source` that runs SQL of its own, with that SQL.
pub fn functions_with_sql(source: &Source) -> anyhow::Result<Vec<(String, Extracted)>> {
    Ok(functions(source)?
        .into_iter()
        .map(|function| (function.name.clone(), collect(&function, None)))
        .filter(|(_, extracted)| !extracted.statements.is_empty())
        .collect())
}

/// The advisory lock the active outbox relay holds (`RELAY_LOCK` in outbox.rs). The
/// benchmark takes it to hold a relay back while a backlog builds up.
pub fn relay_lock() -> anyhow::Result<i64> {
    match outbox_constant("RELAY_LOCK")? {
        syn::Lit::Int(value) => Ok(value.base10_parse()?),
        _ => bail!("`RELAY_LOCK` in {} is not an integer", OUTBOX.path),
    }
}

/// The relay's session's `synchronous_commit` (`RELAY_SYNCHRONOUS_COMMIT` in outbox.rs),
/// which pgbench's relay run is given too, so the ceiling commits its marks as the relay
/// does.
pub fn relay_synchronous_commit() -> anyhow::Result<String> {
    match outbox_constant("RELAY_SYNCHRONOUS_COMMIT")? {
        syn::Lit::Str(value) => Ok(value.value()),
        _ => bail!(
            "`RELAY_SYNCHRONOUS_COMMIT` in {} is not a string",
            OUTBOX.path
        ),
    }
}

/// The relay's session's `plan_cache_mode` (`RELAY_PLAN_CACHE_MODE` in outbox.rs), which
/// pgbench's relay run is given too: its statements are prepared, as the relay's are, and
/// planned as the relay's are.
pub fn relay_plan_cache_mode() -> anyhow::Result<String> {
    match outbox_constant("RELAY_PLAN_CACHE_MODE")? {
        syn::Lit::Str(value) => Ok(value.value()),
        _ => bail!("`RELAY_PLAN_CACHE_MODE` in {} is not a string", OUTBOX.path),
    }
}

/// The literal value of `const <name>` in outbox.rs.
fn outbox_constant(name: &str) -> anyhow::Result<syn::Lit> {
    let file = syn::parse_file(OUTBOX.text).context("parsing outbox.rs")?;
    for item in file.items {
        if let syn::Item::Const(constant) = item
            && constant.ident == name
            && let syn::Expr::Lit(syn::ExprLit { lit, .. }) = *constant.expr
        {
            return Ok(lit);
        }
    }
    bail!("no `const {name}: … = <literal>` in {}", OUTBOX.path)
}

/// Collapses runs of whitespace, so statements compare and print on one line.
pub fn one_line(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The highest `$n` in a statement: how many parameters it takes.
fn parameter_count(sql: &str) -> usize {
    let bytes = sql.as_bytes();
    let mut highest = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let digits: String = sql[i + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(n) = digits.parse::<usize>() {
                highest = highest.max(n);
            }
            i += 1 + digits.len();
        } else {
            i += 1;
        }
    }
    highest
}

/// Replaces `$1`, `$2`, … (longest number first, so `$1` does not eat `$10`).
fn bind(sql: &str, values: &[String]) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits: String = rest[at + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        match digits.parse::<usize>() {
            Ok(n) if (1..=values.len()).contains(&n) => out.push_str(&values[n - 1]),
            _ => {
                out.push('$');
                out.push_str(&digits);
            }
        }
        rest = &rest[at + 1 + digits.len()..];
    }
    out.push_str(rest);
    out
}

/// One statement's values: the words it must start with, and an SQL expression per `$n`.
pub struct Binding {
    pub starts_with: &'static str,
    pub values: Vec<String>,
}

/// Which database a transaction runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Database {
    Orders,
    Payments,
    Notifications,
    /// payment-provider's: charges and keys, no inbox and no outbox.
    Provider,
}

/// Statements of another function of the same source that run before a transaction,
/// each on its own (autocommitted), with their values.
pub struct Ahead {
    pub function: &'static str,
    pub bindings: Vec<Binding>,
}

/// One handler transaction, as the benchmark runs it under pgbench.
pub struct Transaction {
    /// Short name used in reports: `create`, `charge`, `apply`, `notify`, `relay`.
    pub name: &'static str,
    pub what: &'static str,
    pub database: Database,
    pub source: &'static Source,
    pub function: &'static str,
    /// pgbench `\set` lines run before it (random ids).
    pub variables: Vec<String>,
    /// What the handler runs before its transaction opens: ChargeOrder's read-ahead.
    pub ahead: Option<Ahead>,
    /// Statements of the function that this transaction does not run, by their opening
    /// words: those of another path through it (with a key or without, a replay).
    pub skips: Vec<&'static str>,
    pub bindings: Vec<Binding>,
}

/// Variables the scripts may use; anything else after a `:` would be taken by pgbench
/// for a variable it does not have.
const VARIABLES: [&str; 3] = ["client_id", "r", "i"];

/// Orders the `apply` script finds pending (see [`Transaction::apply`]).
pub const PENDING_ORDERS: u32 = 100_000;

/// The relay reads and marks this many rows per round trip (`batch_size` in outbox.rs).
pub const RELAY_BATCH: u32 = 100;

const PRODUCT: &str = "8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21";
const PRICE_CENTS: i64 = 1299;
const QUANTITY: i32 = 2;
/// A fresh order id per transaction: unique across clients and runs in practice.
const ORDER_ID: &str = "md5(:client_id::text || '-' || :r::text)::uuid";
/// One of the pending orders the `apply` setup made.
const PENDING_ORDER_ID: &str = "md5('pending-' || :i::text)::uuid";

fn text(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// A value as a text literal of its JSON. Pretty-printed, because pgbench would read the
/// `:1299` of compact JSON as a variable.
fn json_text(payload: &impl serde::Serialize) -> String {
    let mut bytes = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"");
    let mut serializer = serde_json::Serializer::with_formatter(&mut bytes, formatter);
    payload
        .serialize(&mut serializer)
        .expect("payloads serialize");
    text(&String::from_utf8(bytes).expect("JSON is UTF-8"))
}

/// A payload as a jsonb literal; jsonb stores the same value however it was printed.
fn jsonb(payload: &impl serde::Serialize) -> String {
    format!("{}::jsonb", json_text(payload))
}

fn sample_order_id() -> uuid::Uuid {
    uuid::Uuid::parse_str("ed30fc90-1111-4c9d-b2a5-0c1e3f4a9b21").expect("a valid uuid")
}

/// The outbox row of an event with `event_id`, caused by the event `caused_by` (SQL;
/// `NULL` for none).
fn outbox(
    event_id: String,
    topic: &str,
    event_type: &str,
    payload: String,
    caused_by: String,
) -> Binding {
    Binding {
        starts_with: "INSERT INTO outbox",
        values: vec![
            event_id,
            text(topic),
            format!("{ORDER_ID}::text"),
            text(event_type),
            payload,
            caused_by,
        ],
    }
}

/// The setting that spares the outbox's trigger its NOTIFY: a handler writes it before
/// its row, as the services' handlers run beside their active relay, which they wake in
/// memory.
fn without_notify() -> Binding {
    Binding {
        starts_with: "SELECT set_config('saga.outbox_notify'",
        values: Vec::new(),
    }
}

/// Guard 1's claim of `event_id`, read from `topic` at a partition and offset of the
/// same width as a real one's.
fn claim(event_id: String, topic: &str) -> Binding {
    Binding {
        starts_with: "INSERT INTO processed_events",
        values: vec![
            event_id,
            text(topic),
            "2".into(),
            ":r::bigint % 1000000".into(),
        ],
    }
}

/// What `POST /v1/orders` runs for its `Idempotency-Key` alone, by their opening words:
/// the key's wait (not the outbox's `set_config`, which the unkeyed request sends too),
/// its claim, and the replay's read.
const KEY_STATEMENTS: [&str; 3] = [
    "SELECT set_config('lock_timeout'",
    "INSERT INTO idempotency_keys",
    "SELECT fingerprint",
];

impl Transaction {
    /// `POST /v1/orders` without a key: price lookup, order, items, `order.created` in the
    /// outbox.
    pub fn create() -> Self {
        Self {
            name: "create",
            what: "POST /v1/orders: order + items + outbox",
            skips: KEY_STATEMENTS.to_vec(),
            ..Self::create_keyed()
        }
        .without_key_bindings()
    }

    /// `POST /v1/orders` with an `Idempotency-Key` seen for the first time: the key
    /// claimed with the answer it will give, then the order as [`Transaction::create`].
    pub fn create_keyed() -> Self {
        use saga::events::{OrderCreated, OrderItem};
        let payload = OrderCreated {
            order_id: sample_order_id(),
            customer_id: "bench-ceiling".into(),
            amount_cents: PRICE_CENTS * i64::from(QUANTITY),
            items: vec![OrderItem {
                product_id: PRODUCT.parse().expect("a valid uuid"),
                quantity: QUANTITY,
                unit_price_cents: PRICE_CENTS,
            }],
        };
        // About the size of the order's real 201 body (no colons in its times: pgbench
        // would read `:34` as a variable).
        let answer = serde_json::json!({ "id": sample_order_id(), "customer_id": "bench-ceiling",
            "status": "pending", "amount_cents": PRICE_CENTS * i64::from(QUANTITY),
            "items": payload.items, "created_at": "2026-12-01T09 34 33.155518Z",
            "updated_at": "2026-12-01T09 34 33.155518Z" });
        let key = "'bench-' || :client_id::text || '-' || :r::text";
        Self {
            name: "create keyed",
            what: "POST /v1/orders with an Idempotency-Key: key and answer + order + items + outbox",
            database: Database::Orders,
            source: &ORDERS,
            function: "place_order",
            ahead: None,
            variables: vec![r"\set r random(1, 9000000000000000000)".into()],
            // Only a replay reads the stored answer back.
            skips: vec!["SELECT fingerprint"],
            bindings: vec![
                Binding {
                    starts_with: "SELECT id, price_cents",
                    values: vec![format!("ARRAY['{PRODUCT}']::uuid[]")],
                },
                Binding {
                    starts_with: "SELECT set_config('lock_timeout'",
                    values: vec![text("2000ms")],
                },
                Binding {
                    starts_with: "INSERT INTO idempotency_keys",
                    values: vec![
                        key.into(),
                        "sha256((:r::text)::bytea)".into(),
                        ORDER_ID.into(),
                        "201".into(),
                        json_text(&answer),
                        "86400.0".into(),
                    ],
                },
                Binding {
                    starts_with: "INSERT INTO orders",
                    values: vec![
                        ORDER_ID.into(),
                        text("bench-ceiling"),
                        (PRICE_CENTS * i64::from(QUANTITY)).to_string(),
                        "now()".into(),
                    ],
                },
                Binding {
                    starts_with: "INSERT INTO order_items",
                    values: vec![
                        ORDER_ID.into(),
                        format!("ARRAY['{PRODUCT}']"),
                        format!("ARRAY[{QUANTITY}]"),
                        format!("ARRAY[{PRICE_CENTS}]"),
                    ],
                },
                without_notify(),
                outbox(
                    format!("{ORDER_ID}::text"),
                    "orders",
                    saga::events::ORDER_CREATED,
                    jsonb(&payload),
                    "NULL".into(),
                ),
            ],
        }
    }

    /// These bindings without the key's statements.
    fn without_key_bindings(mut self) -> Self {
        self.bindings
            .retain(|b| !KEY_STATEMENTS.iter().any(|s| b.starts_with.starts_with(s)));
        self
    }

    /// payment-service's ChargeOrder, what it runs in its own database for an event: the
    /// read-ahead (has this event, or this order, been handled?), which decides whether
    /// the provider is called, then inbox, payment, `payment.succeeded` in the outbox.
    /// The provider's side of the call is [`Transaction::provider`]. Both lookups of the
    /// read-ahead miss, as they do for every new order.
    pub fn charge() -> Self {
        Self {
            name: "charge",
            what: "ChargeOrder: read-ahead, then inbox + payment + outbox",
            ahead: Some(Ahead {
                function: "already_handled",
                bindings: vec![Binding {
                    starts_with: "SELECT EXISTS (SELECT 1 FROM processed_events",
                    values: vec![format!("{ORDER_ID}::text"), ORDER_ID.into()],
                }],
            }),
            ..Self::charge_without_call()
        }
    }

    /// ChargeOrder's transaction alone, without the read-ahead and the provider's charge:
    /// all of its SQL before it called the provider, and so the ceiling the runs made
    /// before then were measured against.
    pub fn charge_without_call() -> Self {
        let payload = saga::events::PaymentResult {
            order_id: sample_order_id(),
            amount_cents: PRICE_CENTS * i64::from(QUANTITY),
            reason: None,
        };
        Self {
            name: "charge without call",
            what: "ChargeOrder's transaction alone: inbox + payment + outbox",
            database: Database::Payments,
            source: &CHARGE_ORDER,
            function: "charge_order",
            variables: vec![r"\set r random(1, 9000000000000000000)".into()],
            ahead: None,
            skips: Vec::new(),
            bindings: vec![
                claim(format!("{ORDER_ID}::text"), "orders"),
                Binding {
                    starts_with: "INSERT INTO payments",
                    values: vec![
                        ORDER_ID.into(),
                        format!("{ORDER_ID}::text"),
                        text("succeeded"),
                        (PRICE_CENTS * i64::from(QUANTITY)).to_string(),
                        "NULL".into(),
                        // The provider's ids: `ch_` and 32 hex digits.
                        format!("'ch_' || md5({ORDER_ID}::text)"),
                    ],
                },
                without_notify(),
                outbox(
                    // Ids keep their length; `-` for the `:` pgbench would misread.
                    format!("{ORDER_ID}::text || '-payment'"),
                    "payments",
                    saga::events::PAYMENT_SUCCEEDED,
                    jsonb(&payload),
                    format!("{ORDER_ID}::text"),
                ),
            ],
        }
    }

    /// payment-provider's charge for a key it has not seen, as `POST /v1/charges` makes it
    /// for every order payment-service asks about: the key claimed with the answer it
    /// will give, the charge, one commit, in the provider's own database on the same
    /// server as the saga's. Run at the consumer's connections: a transaction per event,
    /// payment-service makes one call per partition at a time.
    pub fn provider() -> Self {
        let amount_cents = PRICE_CENTS * i64::from(QUANTITY);
        let charge_id = format!("'ch_' || md5({ORDER_ID}::text)");
        // The answer's fields as the provider stores them (no colons in its time: pgbench
        // would read `:34` as a variable).
        let answer = serde_json::json!({ "id": format!("ch_{}", sample_order_id().simple()),
            "amount_cents": amount_cents, "currency": payment_service::charge_order::CURRENCY,
            "reference": sample_order_id(), "status": "succeeded",
            "created_at": "2026-12-01T09 34 33.155518Z" });
        Self {
            name: "provider",
            what: "payment-provider's charge: key and answer + charge",
            database: Database::Provider,
            source: &PROVIDER_CHARGES,
            function: "charge",
            variables: vec![r"\set r random(1, 9000000000000000000)".into()],
            ahead: None,
            // Only a replay reads the stored answer back.
            skips: vec!["SELECT fingerprint"],
            bindings: vec![
                Binding {
                    starts_with: "SELECT now(), set_config('lock_timeout'",
                    // The provider's default IDEMPOTENCY_KEY_WAIT.
                    values: vec![text("2000ms")],
                },
                Binding {
                    starts_with: "INSERT INTO idempotency_keys",
                    values: vec![
                        // `<order id>:charge`, its length kept; `-` for the `:` pgbench
                        // would misread.
                        format!("{ORDER_ID}::text || '-charge'"),
                        "sha256((:r::text)::bytea)".into(),
                        charge_id.clone(),
                        "201".into(),
                        json_text(&answer),
                        "86400.0".into(),
                    ],
                },
                Binding {
                    starts_with: "INSERT INTO charges",
                    values: vec![
                        charge_id,
                        format!("{ORDER_ID}::text"),
                        amount_cents.to_string(),
                        text(payment_service::charge_order::CURRENCY),
                        text("succeeded"),
                        "NULL".into(),
                        "NULL".into(),
                        "now()".into(),
                    ],
                },
            ],
        }
    }

    /// order-service's ApplyPaymentResult on one of [`PENDING_ORDERS`] pending orders,
    /// picked at random: inbox, `SELECT … FOR UPDATE`, status, `order.confirmed`. Picking
    /// an order twice updates it once more, which costs the same as the first time.
    pub fn apply() -> Self {
        let payload = saga::events::OrderOutcome {
            order_id: sample_order_id(),
            customer_id: "bench-ceiling".into(),
            amount_cents: PRICE_CENTS * i64::from(QUANTITY),
            reason: None,
        };
        Self {
            name: "apply",
            what: "ApplyPaymentResult: inbox + FOR UPDATE + status + outbox",
            database: Database::Orders,
            source: &APPLY_PAYMENT_RESULT,
            function: "apply_payment_result",
            ahead: None,
            variables: vec![
                r"\set r random(1, 9000000000000000000)".into(),
                format!(r"\set i random(1, {PENDING_ORDERS})"),
            ],
            skips: Vec::new(),
            bindings: vec![
                claim(format!("{ORDER_ID}::text || '-payment'"), "payments"),
                Binding {
                    starts_with: "SELECT status, customer_id, amount_cents FROM orders",
                    values: vec![PENDING_ORDER_ID.into()],
                },
                Binding {
                    starts_with: "UPDATE orders SET status",
                    values: vec![PENDING_ORDER_ID.into(), text("confirmed"), "NULL".into()],
                },
                without_notify(),
                Binding {
                    starts_with: "INSERT INTO outbox",
                    values: vec![
                        format!("{ORDER_ID}::text || '-outcome'"),
                        text("orders"),
                        format!("{PENDING_ORDER_ID}::text"),
                        text(saga::events::ORDER_CONFIRMED),
                        jsonb(&payload),
                        format!("{ORDER_ID}::text || '-payment'"),
                    ],
                },
            ],
        }
    }

    /// notification-service's NotifyCustomer: inbox, notification, `notification.sent`.
    pub fn notify() -> Self {
        let outcome = saga::events::OrderOutcome {
            order_id: sample_order_id(),
            customer_id: "bench-ceiling".into(),
            amount_cents: PRICE_CENTS * i64::from(QUANTITY),
            reason: None,
        };
        let message = notification_service::notify_customer::message(&outcome, true);
        let payload = saga::events::NotificationSent {
            order_id: outcome.order_id,
            customer_id: outcome.customer_id.clone(),
            message: message.clone(),
        };
        Self {
            name: "notify",
            what: "NotifyCustomer: inbox + notification + outbox",
            database: Database::Notifications,
            source: &NOTIFY_CUSTOMER,
            function: "notify_customer",
            ahead: None,
            variables: vec![r"\set r random(1, 9000000000000000000)".into()],
            skips: Vec::new(),
            bindings: vec![
                claim(format!("{ORDER_ID}::text || '-outcome'"), "orders"),
                Binding {
                    starts_with: "INSERT INTO notifications",
                    values: vec![
                        ORDER_ID.into(),
                        format!("{ORDER_ID}::text || '-outcome'"),
                        text("bench-ceiling"),
                        text("confirmed"),
                        text(&message),
                    ],
                },
                without_notify(),
                outbox(
                    format!("{ORDER_ID}::text || '-outcome-notification'"),
                    "notifications",
                    saga::events::NOTIFICATION_SENT,
                    jsonb(&payload),
                    format!("{ORDER_ID}::text || '-outcome'"),
                ),
            ],
        }
    }

    /// The relay's bookkeeping for one full batch under a backlog: mark the
    /// [`RELAY_BATCH`] rows the last look read, read the next ones. The ids the relay
    /// has from its last look are, here, the oldest unpublished rows read again for the
    /// statement's parameter (twice, as the statement uses it twice). Run against a
    /// backlog the setup made.
    pub fn relay() -> Self {
        let last_look = format!(
            "ARRAY(SELECT id FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT {RELAY_BATCH})"
        );
        Self {
            name: "relay",
            what: "outbox relay: mark a batch of 100 rows published, read the next 100",
            database: Database::Orders,
            source: &OUTBOX,
            // `RelayStatements::prepare`: the relay prepares its statements once per
            // session, and runs the look from `session`.
            function: "prepare",
            ahead: None,
            variables: Vec::new(),
            // Only before a session ends, not per look.
            skips: vec!["UPDATE outbox SET published_at"],
            bindings: vec![Binding {
                starts_with: "WITH marked AS ( UPDATE outbox SET published_at",
                values: vec![last_look, RELAY_BATCH.to_string()],
            }],
        }
    }

    pub fn all() -> Vec<Self> {
        vec![
            Self::create(),
            Self::create_keyed(),
            Self::charge(),
            Self::charge_without_call(),
            Self::provider(),
            Self::apply(),
            Self::notify(),
            Self::relay(),
        ]
    }

    /// The statements of the handler, from its source.
    pub fn extracted(&self) -> anyhow::Result<Extracted> {
        extract(self.source, self.function)
    }

    /// The pgbench script: the statements the handler runs ahead of its transaction, each
    /// autocommitted, then its own statements with their bindings, inside `BEGIN …
    /// COMMIT` when the handler opens a transaction. Fails, naming the statement, when
    /// the source and the bindings no longer fit each other.
    pub fn pgbench_script(&self) -> anyhow::Result<String> {
        let mut extracted = self.extracted()?;
        let place = format!("{} `{}`", self.source.path, self.function);
        for skip in &self.skips {
            let before = extracted.statements.len();
            extracted
                .statements
                .retain(|statement| !one_line(statement).starts_with(skip));
            if extracted.statements.len() == before {
                bail!(
                    "{place} has no statement starting `{skip}` to leave out: update crates/bench/src/sql.rs"
                );
            }
        }
        let ahead = match &self.ahead {
            Some(ahead) => {
                let place = format!("{} `{}`", self.source.path, ahead.function);
                let extracted = extract(self.source, ahead.function)?;
                if extracted.transactional {
                    bail!(
                        "{place} runs in a transaction, the benchmark runs it autocommitted: update crates/bench/src/sql.rs"
                    );
                }
                bound(&place, &extracted.statements, &ahead.bindings)?
            }
            None => Vec::new(),
        };
        let statements = bound(&place, &extracted.statements, &self.bindings)?;
        let functions = match &self.ahead {
            Some(ahead) => format!("`{}`, then `{}`", ahead.function, self.function),
            None => format!("`{}`", self.function),
        };
        let mut script = format!(
            "-- {}: {} ({} {functions}), generated by `loadgen pgbench-scripts`\n",
            self.name, self.what, self.source.path
        );
        for line in &self.variables {
            writeln!(script, "{line}").expect("writing to a String");
        }
        for statement in &ahead {
            writeln!(script, "{statement};").expect("writing to a String");
        }
        if extracted.transactional {
            script.push_str("BEGIN;\n");
        }
        for statement in &statements {
            writeln!(script, "{statement};").expect("writing to a String");
        }
        if extracted.transactional {
            script.push_str("COMMIT;\n");
        }
        check_variables(&script)?;
        Ok(script)
    }
}

/// `statements` (of the function at `place`) on one line each, with `bindings`' values in
/// place of their parameters; an error when the two no longer fit each other.
fn bound(place: &str, statements: &[String], bindings: &[Binding]) -> anyhow::Result<Vec<String>> {
    if statements.len() != bindings.len() {
        bail!(
            "{place} runs {} statements, the benchmark binds {}: update crates/bench/src/sql.rs\n{}",
            statements.len(),
            bindings.len(),
            statements
                .iter()
                .map(|s| format!("  {}", one_line(s)))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    statements
        .iter()
        .zip(bindings)
        .map(|(statement, binding)| {
            let sql = one_line(statement);
            if !sql.starts_with(binding.starts_with) {
                bail!(
                    "{place}: expected a statement starting `{}`, the code has `{sql}`: update crates/bench/src/sql.rs",
                    binding.starts_with
                );
            }
            let parameters = parameter_count(&sql);
            if parameters != binding.values.len() {
                bail!(
                    "{place}: `{sql}` takes {parameters} parameters, the benchmark binds {}: update crates/bench/src/sql.rs",
                    binding.values.len()
                );
            }
            Ok(bind(&sql, &binding.values))
        })
        .collect()
}

/// The start of the statement by which a transaction's first outbox row turns the
/// NOTIFY off for the rest of it (`crates/saga/src/outbox.rs`).
const NOTIFY_OFF: &str = "SELECT set_config('saga.outbox_notify'";

/// A transaction's `script` as a consumer applies it in batches: `events` events in one
/// transaction, each event's statements in turn with values of its own (each variable
/// `\set` once per event, `r` becoming `r_1` … `r_16`), between one `BEGIN` and one
/// `COMMIT`. What runs before the transaction (ChargeOrder's read-ahead) runs once per
/// event, as the consumer prepares each; the statement that turns the outbox's NOTIFY
/// off runs once, as it does for the first row of a transaction.
pub fn batched(script: &str, events: u32) -> anyhow::Result<String> {
    let mut header = String::new();
    let mut variables: Vec<(&str, &str)> = Vec::new();
    let (mut ahead, mut body) = (Vec::new(), Vec::new());
    let mut begun = false;
    let mut statement = String::new();
    for line in script.lines() {
        if statement.is_empty() && line.starts_with("--") {
            writeln!(header, "{line} ({events} events a transaction)")?;
            continue;
        }
        if statement.is_empty()
            && let Some(set) = line.strip_prefix(r"\set ")
        {
            let (name, expression) = set.split_once(' ').context("a `\\set` without a value")?;
            variables.push((name, expression));
            continue;
        }
        statement.push_str(line);
        statement.push('\n');
        if !line.ends_with(';') {
            continue;
        }
        match std::mem::take(&mut statement).trim_end() {
            "BEGIN;" => begun = true,
            "COMMIT;" => {}
            done if begun => body.push(done.to_owned()),
            done => ahead.push(done.to_owned()),
        }
    }
    if !begun {
        bail!("only a transaction's script can be batched:\n{script}");
    }
    if !body
        .iter()
        .any(|statement| statement.starts_with(NOTIFY_OFF))
    {
        bail!(
            "no `{NOTIFY_OFF}` in the transaction, to run once a batch: update crates/bench/src/sql.rs\n{script}"
        );
    }
    let event = |statement: &str, k: u32| {
        variables
            .iter()
            .fold(statement.to_owned(), |text, (name, _)| {
                rename_variable(&text, name, &format!("{name}_{k}"))
            })
    };
    let mut out = header;
    for k in 1..=events {
        for (name, expression) in &variables {
            writeln!(out, r"\set {name}_{k} {expression}")?;
        }
    }
    for k in 1..=events {
        for statement in &ahead {
            writeln!(out, "{}", event(statement, k))?;
        }
    }
    out.push_str("BEGIN;\n");
    for k in 1..=events {
        for statement in &body {
            if k > 1 && statement.starts_with(NOTIFY_OFF) {
                continue;
            }
            writeln!(out, "{}", event(statement, k))?;
        }
    }
    out.push_str("COMMIT;\n");
    Ok(out)
}

/// `text` with pgbench's variable `:from` read as `:to`; casts (`::uuid`) and longer
/// names that begin the same way are left alone.
fn rename_variable(text: &str, from: &str, to: &str) -> String {
    let pattern = format!(":{from}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&pattern) {
        let after = &rest[at + pattern.len()..];
        let cast = rest[..at].ends_with(':');
        let longer = after
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&rest[..at]);
        out.push(':');
        out.push_str(if cast || longer { from } else { to });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Every `:name` pgbench would substitute must be one of [`VARIABLES`].
fn check_variables(script: &str) -> anyhow::Result<()> {
    for line in script.lines().filter(|l| !l.starts_with("--")) {
        let bytes = line.as_bytes();
        for (i, _) in line.match_indices(':') {
            let previous = i.checked_sub(1).map(|p| bytes[p]);
            if previous == Some(b':') || bytes.get(i + 1) == Some(&b':') {
                continue; // a `::type` cast
            }
            let name: String = line[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && !VARIABLES.contains(&name.as_str()) {
                bail!("pgbench would read `:{name}` as a variable in: {line}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batched_script_applies_each_event_with_values_of_its_own_in_one_transaction() {
        let charge = Transaction::all()
            .into_iter()
            .find(|t| t.name == "charge")
            .unwrap();
        let script = charge.pgbench_script().unwrap();
        let per_event = |text: &str, needle: &str| text.matches(needle).count();
        let batched = batched(&script, 3).unwrap();
        println!("{batched}");
        assert_eq!(per_event(&batched, "BEGIN;"), 1);
        assert_eq!(per_event(&batched, "COMMIT;"), 1);
        // The read-ahead once per event, before the transaction.
        let read_ahead = "SELECT EXISTS";
        assert_eq!(per_event(&batched, read_ahead), 3);
        assert!(batched.rfind(read_ahead).unwrap() < batched.find("BEGIN;").unwrap());
        for k in 1..=3 {
            assert!(
                batched.contains(&format!(r"\set r_{k} random(")),
                "{batched}"
            );
            assert_eq!(
                per_event(&batched, &format!(":r_{k}::")),
                per_event(&script, ":r::"),
                "event {k} uses its own value wherever the script used `:r`"
            );
        }
        assert!(
            !batched.contains(":r:") && !batched.contains(":r)"),
            "{batched}"
        );
        // Every statement of the transaction once per event, but the NOTIFY switched off
        // once.
        assert_eq!(per_event(&batched, "INSERT INTO payments"), 3);
        assert_eq!(per_event(&batched, "INSERT INTO outbox"), 3);
        assert_eq!(per_event(&batched, "saga.outbox_notify"), 1);
        // Casts stay casts.
        assert_eq!(
            per_event(&batched, "::uuid"),
            3 * per_event(&script, "::uuid")
        );
        assert!(
            super::batched("\\set r random(1, 2)\nSELECT :r;\n", 2).is_err(),
            "a script with no transaction"
        );
        assert!(
            super::batched("BEGIN;\nSELECT 1;\nCOMMIT;\n", 2).is_err(),
            "a transaction whose NOTIFY switch the batch cannot find"
        );
        for (of, _) in crate::pgbench::BATCHED {
            let transaction = Transaction::all()
                .into_iter()
                .find(|t| t.name == of)
                .unwrap();
            super::batched(&transaction.pgbench_script().unwrap(), 16)
                .unwrap_or_else(|e| panic!("{of}: {e:#}"));
        }
    }

    #[test]
    fn every_handler_transaction_renders_from_its_source() {
        for transaction in Transaction::all() {
            let script = transaction
                .pgbench_script()
                .unwrap_or_else(|e| panic!("{}: {e:#}", transaction.name));
            assert!(
                !script.contains('$'),
                "{}: unbound parameter",
                transaction.name
            );
        }
    }

    #[test]
    fn the_handlers_statements_are_the_ones_the_scripts_run() {
        // The outbox's statements (the NOTIFY's setting, the insert) are spliced in where
        // the handlers call outbox::enqueue.
        let enqueue = extract_plain(&OUTBOX, "enqueue").unwrap().statements;
        assert_eq!(enqueue.len(), 2);
        assert!(enqueue[0].contains("saga.outbox_notify"), "{enqueue:?}");
        let charge = Transaction::charge().extracted().unwrap();
        assert!(charge.transactional);
        assert_eq!(charge.statements.last(), enqueue.last());
        assert!(one_line(&charge.statements[0]).starts_with("INSERT INTO processed_events"));
        let relay = Transaction::relay().extracted().unwrap();
        assert!(!relay.transactional, "the relay's bookkeeping autocommits");
        // Every transaction that writes the outbox spares the trigger its NOTIFY, as the
        // handlers do beside their relay.
        for transaction in Transaction::all() {
            let script = transaction.pgbench_script().unwrap();
            assert_eq!(
                script.contains("INSERT INTO outbox"),
                script.contains("set_config('saga.outbox_notify', 'off', true)"),
                "{}:\n{script}",
                transaction.name
            );
        }
    }

    #[test]
    fn the_charge_reads_ahead_outside_its_transaction() {
        let script = Transaction::charge().pgbench_script().unwrap();
        let read_ahead = script.find("SELECT EXISTS").expect("the read-ahead is run");
        let begin = script.find("BEGIN;").expect("the transaction is run");
        assert!(read_ahead < begin, "{script}");
        let alone = Transaction::charge_without_call().pgbench_script().unwrap();
        assert!(!alone.contains("SELECT EXISTS"), "{alone}");
        assert_eq!(
            script.lines().filter(|l| !l.starts_with("--")).count(),
            alone.lines().filter(|l| !l.starts_with("--")).count() + 1
        );
    }

    #[test]
    fn the_providers_charge_claims_the_key_and_inserts_the_charge_in_one_transaction() {
        let provider = Transaction::provider();
        assert!(provider.extracted().unwrap().transactional);
        let script = provider.pgbench_script().unwrap();
        // A statement may span lines (the stored answer's JSON); each ends with `;`.
        let ends = script.lines().filter(|l| l.ends_with(';')).count();
        assert_eq!(ends, 5, "BEGIN, three statements, COMMIT:\n{script}");
        let at = |text: &str| {
            script
                .find(text)
                .unwrap_or_else(|| panic!("{text}: {script}"))
        };
        assert!(at("BEGIN;") < at("INSERT INTO idempotency_keys"));
        assert!(at("INSERT INTO idempotency_keys") < at("INSERT INTO charges"));
        assert!(at("INSERT INTO charges") < at("COMMIT;"));
        assert!(!script.contains("SELECT fingerprint"), "a replay's read");
    }

    #[test]
    fn every_function_with_sql_in_those_files_is_benchmarked_or_said_not_to_be() {
        let benchmarked: Vec<&str> = Transaction::all()
            .iter()
            .flat_map(|t| [Some(t.function), t.ahead.as_ref().map(|a| a.function)])
            .flatten()
            .collect();
        for source in SOURCES {
            for (name, extracted) in functions_with_sql(source).unwrap() {
                let known = benchmarked.contains(&name.as_str())
                    || name == "enqueue"
                    || NOT_BENCHMARKED.iter().any(|(n, _)| *n == name);
                assert!(
                    known,
                    "{} `{name}` runs SQL the benchmark does not know ({:?}): add it to a \
                     Transaction or to NOT_BENCHMARKED in crates/bench/src/sql.rs",
                    source.path, extracted.statements
                );
            }
        }
    }

    #[test]
    fn the_relay_lock_is_read_from_the_outbox() {
        relay_lock().unwrap();
        assert_eq!(relay_synchronous_commit().unwrap(), "off");
        assert_eq!(relay_plan_cache_mode().unwrap(), "force_custom_plan");
    }

    #[test]
    fn parameters_bind_longest_number_first() {
        let sql = "VALUES ($1, $10, $2::uuid[])";
        let values: Vec<String> = (1..=10).map(|n| format!("v{n}")).collect();
        assert_eq!(parameter_count(sql), 10);
        assert_eq!(bind(sql, &values), "VALUES (v1, v10, v2::uuid[])");
    }

    #[test]
    fn a_colon_pgbench_would_misread_is_refused() {
        assert!(check_variables("SELECT '{\"a\":1299}'::jsonb;").is_err());
        assert!(check_variables("SELECT md5(:client_id::text || :r::text)::uuid;").is_ok());
    }
}
