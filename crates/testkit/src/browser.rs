//! A headless Chromium for the page tests, driven through chromedriver (Debian's
//! `chromium` and `chromium-driver`, which `scripts/test` installs) with fantoccini.

use std::process::Stdio;
use std::time::Duration;

use fantoccini::ClientBuilder;
use serde_json::json;
use tokio::process::{Child, Command};

use crate::eventually;

/// How long chromedriver may take to accept a session.
const WAIT: Duration = Duration::from_secs(60);

/// A browser, and the chromedriver behind it, which is stopped when the [`Child`] drops.
pub async fn open() -> (Child, fantoccini::Client) {
    let driver_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free local port")
        .port();
    let driver = Command::new("chromedriver")
        .arg(format!("--port={driver_port}"))
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromedriver is installed (scripts/test installs chromium-driver)");
    let capabilities = json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1800"],
        }
    });
    let browser = eventually(WAIT, "chromedriver to accept a session", || {
        let capabilities = capabilities.as_object().unwrap().clone();
        async move {
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(capabilities)
                .connect(&format!("http://127.0.0.1:{driver_port}"))
                .await
                .ok()
        }
    })
    .await;
    (driver, browser)
}
