use clap::Parser;
use payment_provider::{Application, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    saga::telemetry::init();
    let app = Application::build(config).await?;
    app.run_until_stopped(saga::shutdown::on_signal()).await
}
