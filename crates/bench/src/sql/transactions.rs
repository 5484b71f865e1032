//! The transactions the benchmark runs under pgbench: which handler function each is,
//! and the values each of its statements is run with.

use notification_service::notify_customer;
use order_service::{apply_payment_result, orders};
use payment_provider::charges;
use payment_service::{charge_order, payment};
use saga::{inbox, outbox};

use super::extract::{
    APPLY_PAYMENT_RESULT, CHARGE_ORDER, Extracted, NOTIFY_CUSTOMER, ORDERS, OUTBOX,
    PROVIDER_CHARGES, Source, extract,
};

/// One statement's values: the handler's constant it binds, and an SQL expression per `$n`.
pub struct Binding {
    pub statement: &'static str,
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

impl Database {
    /// The run's four databases.
    pub const ALL: [Database; 4] = [
        Database::Orders,
        Database::Payments,
        Database::Notifications,
        Database::Provider,
    ];
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
    /// What the handler runs before its transaction opens: ChargeOrder's intent.
    pub ahead: Option<Ahead>,
    /// Statements of the function that this transaction does not run: those of another
    /// path through it (with a key or without, a replay).
    pub skips: Vec<&'static str>,
    pub bindings: Vec<Binding>,
}

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
        statement: outbox::INSERT_EVENT,
        values: vec![
            event_id,
            text(topic),
            format!("{ORDER_ID}::text"),
            text(event_type),
            payload,
            caused_by,
            // The trace context: none, as with traces off.
            "NULL".into(),
            "NULL".into(),
        ],
    }
}

/// The setting that spares the outbox's trigger its NOTIFY: a handler writes it before
/// its row, as the services' handlers run beside their active relay, which they wake in
/// memory.
fn without_notify() -> Binding {
    Binding {
        statement: outbox::SKIP_NOTIFY,
        values: Vec::new(),
    }
}

/// Guard 1's claim of `event_id`, read from `topic` at a partition and offset of the
/// same width as a real one's.
fn claim(event_id: String, topic: &str) -> Binding {
    Binding {
        statement: inbox::CLAIM_EVENT,
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
const KEY_STATEMENTS: [&str; 3] = [orders::KEY_WAIT, orders::CLAIM_KEY, orders::STORED_ANSWER];

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
            skips: vec![orders::STORED_ANSWER],
            bindings: vec![
                Binding {
                    statement: orders::PRICES,
                    values: vec![format!("ARRAY['{PRODUCT}']::uuid[]")],
                },
                Binding {
                    statement: orders::KEY_WAIT,
                    values: vec![text("2000ms")],
                },
                Binding {
                    statement: orders::CLAIM_KEY,
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
                    statement: orders::INSERT_ORDER,
                    values: vec![
                        ORDER_ID.into(),
                        text("bench-ceiling"),
                        (PRICE_CENTS * i64::from(QUANTITY)).to_string(),
                        "now()".into(),
                    ],
                },
                Binding {
                    statement: orders::INSERT_ITEMS,
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
            .retain(|b| !KEY_STATEMENTS.contains(&b.statement));
        self
    }

    /// payment-service's ChargeOrder, what it runs in its own database for an event: the
    /// charge's intent (guard 1 read ahead, and the payment inserted `charging`, committed
    /// on its own before the provider is called), then inbox, the answer over the intent,
    /// `payment.succeeded` in the outbox. The provider's side of the call is
    /// [`Transaction::provider`]. The intent finds no payment, as for every new order.
    pub fn charge() -> Self {
        Self {
            name: "charge",
            what: "ChargeOrder: intent, then inbox + payment + outbox",
            ahead: Some(Ahead {
                function: "intend",
                bindings: vec![Binding {
                    statement: charge_order::INTENT_TO_CHARGE,
                    values: vec![
                        format!("{ORDER_ID}::text"),
                        ORDER_ID.into(),
                        (PRICE_CENTS * i64::from(QUANTITY)).to_string(),
                        // `<order id>:charge`, its length kept; `-` for the `:` pgbench
                        // would misread.
                        format!("{ORDER_ID}::text || '-charge'"),
                    ],
                }],
            }),
            ..Self::charge_without_call()
        }
    }

    /// ChargeOrder's transaction alone, without the intent and the provider's charge: its
    /// SQL after the call. Its update finds no intent to record over, and so costs a
    /// little less than in the service: the ceiling's side of the comparison.
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
                    statement: payment::RECORD_CHARGE,
                    values: vec![
                        ORDER_ID.into(),
                        text("succeeded"),
                        // The provider's ids: `ch_` and 32 hex digits.
                        format!("'ch_' || md5({ORDER_ID}::text)"),
                        "NULL".into(),
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
            "amount_cents": amount_cents, "currency": payment_service::payment::CURRENCY,
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
            skips: vec![charges::STORED_ANSWER],
            bindings: vec![
                Binding {
                    statement: charges::KEY_WAIT,
                    // The provider's default IDEMPOTENCY_KEY_WAIT.
                    values: vec![text("2000ms")],
                },
                Binding {
                    statement: charges::CLAIM_KEY,
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
                    statement: charges::INSERT_CHARGE,
                    values: vec![
                        charge_id,
                        format!("{ORDER_ID}::text"),
                        amount_cents.to_string(),
                        text(payment_service::payment::CURRENCY),
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
                    statement: apply_payment_result::LOCK_ORDER,
                    values: vec![PENDING_ORDER_ID.into()],
                },
                Binding {
                    statement: apply_payment_result::SET_OUTCOME,
                    values: vec![PENDING_ORDER_ID.into(), text("confirmed"), "NULL".into()],
                },
                without_notify(),
                Binding {
                    statement: outbox::INSERT_EVENT,
                    values: vec![
                        format!("{ORDER_ID}::text || '-outcome'"),
                        text("orders"),
                        format!("{PENDING_ORDER_ID}::text"),
                        text(saga::events::ORDER_CONFIRMED),
                        jsonb(&payload),
                        format!("{ORDER_ID}::text || '-payment'"),
                        "NULL".into(),
                        "NULL".into(),
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
        let message = notify_customer::message(
            outcome.order_id,
            outcome.amount_cents,
            None,
            notify_customer::Kind::Confirmed,
        );
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
                    statement: notify_customer::INSERT_NOTIFICATION,
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
            skips: vec![outbox::MARK_PUBLISHED],
            bindings: vec![Binding {
                statement: outbox::MARK_AND_READ,
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
}
