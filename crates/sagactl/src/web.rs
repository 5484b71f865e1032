//! `sagactl serve`: the story as a web page. A list of recent orders with a search by
//! id, and one order's timeline in lanes (one per service, one for the topics), which
//! updates itself while it is open: the page listens on a server-sent event stream that
//! sends the timeline again whenever it changed. Server-rendered HTML (askama templates,
//! in `templates/`), a few lines of script, no build step.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use futures::Stream;
use uuid::Uuid;

use crate::story::{self, Databases, Kind, Step, Story, money};
use crate::{Listed, Sources, clock, render};

/// How often an open page's story is told again.
const LIVE_INTERVAL: Duration = Duration::from_secs(1);

/// The lanes, left to right, in the order an order travels through them.
const LANES: [&str; 5] = [
    "order-service",
    "kafka",
    "payment-service",
    "payment-provider",
    "notification-service",
];

pub struct Web {
    sources: Sources,
    databases: Databases,
}

impl Web {
    pub async fn connect(sources: Sources) -> anyhow::Result<Arc<Self>> {
        let databases = Databases::connect(&sources).await?;
        Ok(Arc::new(Self { sources, databases }))
    }
}

pub fn router(web: Arc<Web>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/orders/{id}", get(order))
        .route("/orders/{id}/live", get(live))
        .with_state(web)
}

#[derive(serde::Deserialize)]
struct Search {
    id: Option<String>,
}

#[derive(Template)]
#[template(path = "index.html")]
struct IndexPage {
    orders: Vec<Row>,
    error: Option<String>,
}

struct Row {
    id: Uuid,
    status: String,
    amount: String,
    placed: String,
}

impl From<&Listed> for Row {
    fn from(order: &Listed) -> Self {
        Self {
            id: order.id,
            status: order.status.clone(),
            amount: money(order.amount_cents),
            placed: clock(order.created_at),
        }
    }
}

async fn index(State(web): State<Arc<Web>>, Query(search): Query<Search>) -> Response {
    let mut error = None;
    if let Some(id) = search
        .id
        .as_deref()
        .map(str::trim)
        .filter(|id| !id.is_empty())
    {
        match id.parse::<Uuid>() {
            Ok(id) => return Redirect::to(&format!("/orders/{id}")).into_response(),
            Err(_) => error = Some(format!("{id:?} is not an order id (a UUID)")),
        }
    }
    let orders = match crate::orders(&web.databases, &crate::Filter::default(), 30).await {
        Ok(orders) => orders.iter().map(Row::from).collect(),
        Err(e) => return failure(e),
    };
    let status = if error.is_some() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    page(status, IndexPage { orders, error })
}

#[derive(Template)]
#[template(path = "order.html")]
struct OrderPage {
    view: View,
}

/// The story as the templates lay it out.
#[derive(Template)]
#[template(path = "story.html")]
struct View {
    id: Uuid,
    status: String,
    amount: String,
    customer: String,
    cancel_reason: Option<String>,
    refund: Option<&'static str>,
    open: bool,
    lanes: [&'static str; 5],
    steps: Vec<Card>,
}

struct Card {
    clock: String,
    since: String,
    lane: usize,
    kind: &'static str,
    class: &'static str,
    text: String,
    detail: Option<String>,
}

impl View {
    fn of(story: &Story) -> Self {
        // The order's id is in the heading; in the cards its first group is enough.
        let id = story.order.id.to_string();
        let short = format!("{}…", &id[..8]);
        let shorten = |text: &str| text.replace(&id, &short);
        let card = |step: &Step| Card {
            clock: clock(step.at),
            since: render::since(story.order.created_at, step.at),
            lane: LANES.iter().position(|l| *l == step.actor).unwrap_or(0),
            kind: step.kind.label(),
            class: match step.kind {
                Kind::Applied | Kind::Charged | Kind::Notified | Kind::Placed => "good",
                Kind::Guard1 => "guard1",
                Kind::Guard2 => "guard2",
                Kind::DeadLettered | Kind::Declined | Kind::RefundFailed => "bad",
                Kind::Waiting | Kind::Unknown => "waiting",
                Kind::Cancelled => "cancel",
                Kind::Refunded => "refund",
                Kind::Tombstone => "tombstone",
                Kind::Ignored | Kind::Forgotten => "quiet",
                Kind::Record => "record",
                Kind::Written | Kind::Published => "plain",
            },
            text: shorten(&step.text),
            detail: step.detail.as_deref().map(shorten),
        };
        Self {
            id: story.order.id,
            status: story.order.status.clone(),
            amount: money(story.order.amount_cents),
            customer: story.order.customer_id.clone(),
            cancel_reason: story.order.cancel_reason.clone(),
            refund: story.order.refund,
            open: story.open,
            lanes: LANES,
            steps: story.steps.iter().map(card).collect(),
        }
    }
}

async fn order(State(web): State<Arc<Web>>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<Uuid>() else {
        return Redirect::to(&format!("/?id={id}")).into_response();
    };
    match story::tell(&web.sources, &web.databases, id).await {
        Ok(Some(story)) => page(
            StatusCode::OK,
            OrderPage {
                view: View::of(&story),
            },
        ),
        Ok(None) => page(
            StatusCode::NOT_FOUND,
            IndexPage {
                orders: Vec::new(),
                error: Some(format!("order-service has no order {id}")),
            },
        ),
        Err(e) => failure(e),
    }
}

/// `timeline` events, each the whole story fragment, sent when it differs from the last
/// one sent; the first one at once. Runs for as long as the page stays open: a copy of
/// an event can be produced by hand long after the order settled.
async fn live(
    State(web): State<Arc<Web>>,
    Path(id): Path<Uuid>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures::stream::unfold(
        (web, String::new(), true),
        move |(web, last, first)| async move {
            let mut last = last;
            let mut wait = !first;
            loop {
                if wait {
                    tokio::time::sleep(LIVE_INTERVAL).await;
                }
                wait = true;
                let html = match story::tell(&web.sources, &web.databases, id).await {
                    Ok(Some(story)) => View::of(&story).render().unwrap_or_else(|e| e.to_string()),
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(error = format!("{e:#}"), "cannot tell the story");
                        continue;
                    }
                };
                if html != last {
                    let event = Event::default().event("timeline").data(&html);
                    return Some((Ok(event), (web, html, false)));
                }
                last = html;
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

fn page(status: StatusCode, template: impl Template) -> Response {
    match template.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => failure(e.into()),
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    message: String,
}

fn failure(error: anyhow::Error) -> Response {
    tracing::warn!(error = format!("{error:#}"), "page failed");
    let html = ErrorPage {
        message: format!("{error:#}"),
    }
    .render()
    .unwrap_or_else(|_| "cannot read the saga".into());
    (StatusCode::SERVICE_UNAVAILABLE, Html(html)).into_response()
}
