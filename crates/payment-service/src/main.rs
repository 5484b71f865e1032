use payment_service::Application;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    saga::binary::run(Application::build, Application::run_until_stopped).await
}
