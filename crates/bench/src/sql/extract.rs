//! Reading the handlers' statements: the named constants each function runs, in the order
//! it runs them, parsed out of its source file with `syn`, and the outbox's constants the
//! relay runs with.

use anyhow::{Context as _, bail};
use syn::visit::Visit;

/// A source file the benchmark reads SQL from, by its path in the workspace.
pub struct Source {
    pub path: &'static str,
    pub text: &'static str,
}

pub const ORDERS: Source = Source {
    path: "crates/order-service/src/orders.rs",
    text: include_str!("../../../order-service/src/orders.rs"),
};
pub const APPLY_PAYMENT_RESULT: Source = Source {
    path: "crates/order-service/src/apply_payment_result.rs",
    text: include_str!("../../../order-service/src/apply_payment_result.rs"),
};
pub const CHARGE_ORDER: Source = Source {
    path: "crates/payment-service/src/charge_order.rs",
    text: include_str!("../../../payment-service/src/charge_order.rs"),
};
pub const PAYMENT: Source = Source {
    path: "crates/payment-service/src/payment.rs",
    text: include_str!("../../../payment-service/src/payment.rs"),
};
pub const NOTIFY_CUSTOMER: Source = Source {
    path: "crates/notification-service/src/notify_customer.rs",
    text: include_str!("../../../notification-service/src/notify_customer.rs"),
};
pub const INBOX: Source = Source {
    path: "crates/saga/src/inbox.rs",
    text: include_str!("../../../saga/src/inbox.rs"),
};
pub const OUTBOX: Source = Source {
    path: "crates/saga/src/outbox.rs",
    text: include_str!("../../../saga/src/outbox.rs"),
};
pub const PROVIDER_CHARGES: Source = Source {
    path: "crates/payment-provider/src/charges.rs",
    text: include_str!("../../../payment-provider/src/charges.rs"),
};

/// Every source file above, for the drift check.
pub const SOURCES: [&Source; 8] = [
    &ORDERS,
    &APPLY_PAYMENT_RESULT,
    &CHARGE_ORDER,
    &PAYMENT,
    &NOTIFY_CUSTOMER,
    &INBOX,
    &OUTBOX,
    &PROVIDER_CHARGES,
];

/// Functions in those files whose SQL is deliberately not benchmarked, and why.
pub const NOT_BENCHMARKED: [(&str, &str); 5] = [
    (
        "find_order",
        "GET /v1/orders/{id}: a read, not a step of the saga",
    ),
    (
        "session",
        "the relay's session settings and LISTEN, once per session (its lock is the lease's, lease.rs), not per batch",
    ),
    (
        "list_charges",
        "GET /v1/charges: the provider's list for a person counting an order's charges",
    ),
    (
        "get_charge",
        "GET /v1/charges/{id}: a read at the provider, not a step of the saga",
    ),
    (
        "with_refunds",
        "the refunds the provider's two charge reads show: a read, not a step of the saga",
    ),
];

/// The library's modules whose functions a handler calls to run their statements in its
/// transaction (`inbox::claim`, `outbox::enqueue`), and whose constants it may name; and
/// payment-service's `payment`, whose `record_charge` ChargeOrder's transaction calls
/// (and which itself calls `outbox::enqueue`).
const LIBRARY: [(&str, &Source); 3] = [
    ("inbox", &INBOX),
    ("outbox", &OUTBOX),
    ("payment", &PAYMENT),
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
    /// The statements, each the text of the constant (or literal) the code runs.
    pub statements: Vec<String>,
    /// Whether it runs in a transaction: opens one (`client.transaction()`) or is handed
    /// one (a `&Transaction` parameter: a handler's, opened by the consumer's `Applier`).
    pub transactional: bool,
    /// The functions of the same file whose statements were read where this one calls
    /// them.
    pub inlined: Vec<String>,
}

struct Collector<'s> {
    statements: Vec<String>,
    transactional: bool,
    /// The file's `const NAME: &str = "…"` items: the statements a call names.
    constants: &'s [(String, String)],
    /// Whether a call to the library's `inbox::claim` or `outbox::enqueue` is read as
    /// the statements it runs.
    library_calls: bool,
    /// The other functions of the same file. A call to one is read where it is made, so
    /// that a transaction keeps its statements in order when a helper runs some of them
    /// (`price` in `place_order`, say).
    siblings: &'s [Function],
    /// The functions being read, outermost first: none is read inside itself.
    reading: Vec<String>,
    inlined: Vec<String>,
}

impl Collector<'_> {
    /// Reads the statements of `name`, a function of the same file called here.
    fn inline(&mut self, name: &str) {
        let Some(sibling) = self.siblings.iter().find(|f| f.name == name) else {
            return;
        };
        if self.reading.iter().any(|reading| reading == name) {
            return;
        }
        let mut inner = Collector {
            statements: Vec::new(),
            transactional: false,
            constants: self.constants,
            library_calls: self.library_calls,
            siblings: self.siblings,
            reading: [self.reading.clone(), vec![name.to_owned()]].concat(),
            inlined: Vec::new(),
        };
        inner.visit_block(&sibling.block);
        if inner.statements.is_empty() {
            return;
        }
        self.statements.extend(inner.statements);
        self.inlined.push(name.to_owned());
        self.inlined.extend(inner.inlined);
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        // Receiver first: `client.transaction().await?.execute(…)` reads left to right.
        self.visit_expr(&call.receiver);
        let method = call.method.to_string();
        if method == "transaction" {
            self.transactional = true;
        }
        if QUERY_METHODS.contains(&method.as_str())
            && let Some(sql) = call.args.first().and_then(|arg| self.statement(arg))
        {
            self.statements.push(sql);
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
            if self.library_calls
                && let [.., module, function] = segments.as_slice()
                && let Some((_, source)) = LIBRARY.iter().find(|(name, _)| name == module)
            {
                let called = extract_library(source, function)
                    .map(|extracted| extracted.statements)
                    .unwrap_or_default();
                if !called.is_empty() {
                    self.inlined.push(function.clone());
                }
                self.statements.extend(called);
            }
            if let [name] = segments.as_slice() {
                self.inline(name);
            }
        }
        syn::visit::visit_expr_call(self, call);
    }
}

impl Collector<'_> {
    /// The statement `arg` is: a string literal, or a constant of this file or of the
    /// library's modules (`inbox::CLAIM_EVENT`); `None` for anything else (a statement
    /// prepared earlier and held in a variable).
    fn statement(&self, arg: &syn::Expr) -> Option<String> {
        match arg {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(sql),
                ..
            }) => Some(sql.value()),
            syn::Expr::Path(path) => {
                let segments: Vec<String> = path
                    .path
                    .segments
                    .iter()
                    .map(|s| s.ident.to_string())
                    .collect();
                match segments.as_slice() {
                    [name] => lookup(self.constants, name),
                    [.., module, name] => {
                        let (_, source) = LIBRARY.iter().find(|(m, _)| m == module)?;
                        lookup(&constants(source).ok()?, name)
                    }
                    [] => None,
                }
            }
            _ => None,
        }
    }
}

fn lookup(constants: &[(String, String)], name: &str) -> Option<String> {
    constants
        .iter()
        .find(|(constant, _)| constant == name)
        .map(|(_, value)| value.clone())
}

/// The `const NAME: &str = "…"` items of `source`, by name.
fn constants(source: &Source) -> anyhow::Result<Vec<(String, String)>> {
    let file = syn::parse_file(source.text).with_context(|| format!("parsing {}", source.path))?;
    Ok(file
        .items
        .into_iter()
        .filter_map(|item| match item {
            syn::Item::Const(constant) => match *constant.expr {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(value),
                    ..
                }) => Some((constant.ident.to_string(), value.value())),
                _ => None,
            },
            _ => None,
        })
        .collect())
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

fn find<'f>(
    functions: &'f [Function],
    source: &Source,
    name: &str,
) -> anyhow::Result<&'f Function> {
    functions
        .iter()
        .find(|function| function.name == name)
        .with_context(|| format!("no function `{name}` in {}", source.path))
}

fn collect(
    function: &Function,
    constants: &[(String, String)],
    library_calls: bool,
    siblings: &[Function],
) -> Extracted {
    let mut collector = Collector {
        statements: Vec::new(),
        transactional: function.handed_transaction,
        constants,
        library_calls,
        siblings,
        reading: vec![function.name.clone()],
        inlined: Vec::new(),
    };
    collector.visit_block(&function.block);
    Extracted {
        statements: collector.statements,
        transactional: collector.transactional,
        inlined: collector.inlined,
    }
}

/// The SQL of function `name` in `source`, with the library's `inbox::claim` and
/// `outbox::enqueue` read as the statements they run, and the statements of the same
/// file's functions it calls read where it calls them.
pub fn extract(source: &Source, name: &str) -> anyhow::Result<Extracted> {
    let all = functions(source)?;
    Ok(collect(
        find(&all, source, name)?,
        &constants(source)?,
        true,
        &all,
    ))
}

/// The SQL of the library's function `name` in `source`, with the library's functions it
/// calls in turn read as the statements they run.
pub(super) fn extract_library(source: &Source, name: &str) -> anyhow::Result<Extracted> {
    let all = functions(source)?;
    Ok(collect(
        find(&all, source, name)?,
        &constants(source)?,
        true,
        &[],
    ))
}

/// Every function of `source` that runs SQL of its own, with that SQL (without what the
/// functions it calls run).
pub fn functions_with_sql(source: &Source) -> anyhow::Result<Vec<(String, Extracted)>> {
    let constants = constants(source)?;
    Ok(functions(source)?
        .iter()
        .map(|function| {
            let extracted = collect(function, &constants, false, &[]);
            (function.name.clone(), extracted)
        })
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
