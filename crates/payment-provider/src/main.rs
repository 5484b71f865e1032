use payment_provider::Application;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    saga::binary::run(Application::build, Application::run_until_stopped).await
}
