//! sagactl: an order's story, stuck orders, dead letters. See `sagactl --help`.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sagactl::story::{self, Databases};
use sagactl::{Sources, render};
use uuid::Uuid;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "What the saga did with an order, and what is stuck",
    after_help = saga::kafka::client::HELP
)]
struct Cli {
    #[command(flatten)]
    sources: Sources,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every step of one order, in time order, with what each delivery of its events met.
    Order {
        id: Uuid,
        /// Also the records a service ignored because they are not its events.
        #[arg(long)]
        all: bool,
    },
    /// The newest orders, by status and age: `--unsettled --older-than 30s` finds stuck
    /// ones, a cancellation whose refund has not come back among them.
    Orders {
        #[arg(long, value_parser = ["pending", "confirmed", "cancelled"])]
        status: Option<String>,
        /// Only orders not settled: pending, or cancelled and not yet answered by
        /// payment-service (refunded or voided).
        #[arg(long)]
        unsettled: bool,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        older_than: Duration,
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// Each dead-letter topic: how many records, and why.
    DeadLetters,
    /// A cancelled order's refund, which the provider refused: `refund retry <order>`
    /// asks payment-service to try again.
    Refund {
        #[command(subcommand)]
        action: RefundAction,
    },
    /// The same as a web page: recent orders, a search by id, and each order's timeline,
    /// updated live.
    Serve {
        /// Where to listen; loopback unless told otherwise.
        #[arg(long, env = "SAGACTL_ADDR", default_value = "127.0.0.1:8090")]
        addr: std::net::SocketAddr,
    },
}

#[derive(Debug, Subcommand)]
enum RefundAction {
    /// Asks payment-service to refund the order's charge again, under a new idempotency
    /// key (the refused one keeps its refusal at the provider). Safe to repeat: a refund
    /// made is answered as it stands, one under way is asked again under its own key, and
    /// only one retry moves a failed refund to its next attempt.
    Retry {
        order_id: Uuid,
        /// payment-service's HTTP address (any copy of it).
        #[arg(
            long,
            env = "PAYMENT_SERVICE_URL",
            default_value = "http://127.0.0.1:8081"
        )]
        payment_service_url: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("sagactl: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    saga::kafka::client::init_from_env()?;
    let print = |text: String, json: serde_json::Value| {
        if cli.json {
            println!("{json:#}");
        } else {
            print!("{text}");
        }
    };
    match &cli.command {
        Command::Order { id, all } => {
            let databases = Databases::connect(&cli.sources).await?;
            let Some(story) = story::tell(&cli.sources, &databases, *id).await? else {
                eprintln!("sagactl: order-service has no order {id}");
                return Ok(ExitCode::from(2));
            };
            print(render::story(&story, *all), serde_json::to_value(&story)?);
        }
        Command::Orders {
            status,
            unsettled,
            older_than,
            limit,
        } => {
            let databases = Databases::connect(&cli.sources).await?;
            let filter = sagactl::Filter {
                status: status.clone(),
                unsettled: *unsettled,
                older_than: *older_than,
            };
            let orders = sagactl::orders(&databases, &filter, *limit).await?;
            print(render::orders(&orders), serde_json::to_value(&orders)?);
        }
        Command::Serve { addr } => {
            saga::telemetry::init();
            let web = sagactl::web::Web::connect(cli.sources.clone()).await?;
            let listener = tokio::net::TcpListener::bind(addr).await?;
            eprintln!("sagactl: serving http://{addr}");
            axum::serve(listener, sagactl::web::router(web))
                .with_graceful_shutdown(
                    saga::shutdown::on_signal(std::time::Duration::ZERO).cancelled_owned(),
                )
                .await?;
        }
        Command::Refund {
            action:
                RefundAction::Retry {
                    order_id,
                    payment_service_url,
                },
        } => {
            let (ok, answer) = sagactl::retry_refund(payment_service_url, *order_id).await?;
            print(sagactl::render_retry(&answer), answer);
            if !ok {
                return Ok(ExitCode::from(2));
            }
        }
        Command::DeadLetters => {
            let summaries = sagactl::dead_letters(&cli.sources).await?;
            print(
                render::dead_letters(&summaries),
                serde_json::to_value(&summaries)?,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
