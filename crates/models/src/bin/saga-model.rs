//! `saga-model`: checks one of the saga's models, with every guard or with some taken
//! away, and prints what the checker found; `scripts/model` runs it.

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use saga_models::{Guarded, check, consumer::Transaction, pivot::Pivot};

/// Checks a model of the saga in every order the world can deliver its events. With every
/// guard it prints the states explored and "no counterexample"; with a guard taken away,
/// the shortest sequence of steps that breaks a property.
#[derive(Parser)]
#[command(name = "scripts/model", bin_name = "scripts/model", after_help = guards_help())]
struct Args {
    /// The model: `consumer` (the consumer's transaction) or `pivot` (the payment pivot).
    model: Which,
    /// Take a guard away (repeat for more than one); the guards are listed below.
    #[arg(long = "without", value_name = "GUARD")]
    without: Vec<String>,
    /// Serve stateright's Explorer on this address instead, to step through the states by
    /// hand in a browser.
    #[arg(long, value_name = "ADDRESS", num_args = 0..=1, default_missing_value = "127.0.0.1:3000")]
    explore: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Which {
    Consumer,
    Pivot,
}

fn guards_help() -> String {
    let list = |title: &str, guards: &[(&str, &str)]| {
        let lines: Vec<String> = guards
            .iter()
            .map(|(name, what)| format!("  {name:<20} {what}"))
            .collect();
        format!("{title}:\n{}", lines.join("\n"))
    };
    format!(
        "{}\n\n{}",
        list("Guards of consumer", Transaction::GUARDS),
        list("Guards of pivot", Pivot::GUARDS)
    )
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.model {
        Which::Consumer => run(Transaction::default(), &args),
        Which::Pivot => run(Pivot::default(), &args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("scripts/model: {message}");
            ExitCode::from(2)
        }
    }
}

fn run<M>(mut model: M, args: &Args) -> Result<(), String>
where
    M: Guarded + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + PartialEq + Send + Sync,
    M::Action: Clone + std::fmt::Debug + PartialEq + Send + Sync,
{
    for name in &args.without {
        let names: Vec<&str> = M::GUARDS.iter().map(|(n, _)| *n).collect();
        model = model.without_named(name).ok_or_else(|| {
            format!(
                "no guard `{name}` in this model; its guards: {}",
                names.join(", ")
            )
        })?;
    }
    if let Some(address) = &args.explore {
        println!("Explorer on http://{address}/ (Ctrl-C ends it)");
        model.checker().serve(address.as_str());
        return Ok(());
    }
    // Piped into `head`, the reader has what it wanted: a closed pipe is no error.
    let _ = writeln!(std::io::stdout(), "{}", check(model));
    Ok(())
}
