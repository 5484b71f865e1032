//! HTTPS for the servers that need it here: the card provider stand-in, serving as a real
//! processor does, and the tests' trace receiver. A listener for `axum::serve` that does
//! each connection's TLS handshake with OpenSSL (the library PostgreSQL's and Kafka's
//! clients here use), or none when it has no certificate.
//!
//! And the other side's one question at start-up: does a server we will call over HTTPS
//! present a certificate we trust? [`refusal`] picks a TLS refusal out of a failed
//! call, so that a wrong CA stops a service at once with what OpenSSL said, rather than
//! every call failing later as if the server were away.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_openssl::SslStream;

/// The longest a client may take over its handshake: the listener accepts one connection
/// at a time, and a client that never finishes must not hold the others back.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections, over TLS if it has a certificate.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<Arc<SslAcceptor>>,
}

impl Listener {
    pub fn plain(tcp: TcpListener) -> Self {
        Self { tcp, tls: None }
    }

    /// Serves TLS with the certificate chain in `cert_file` and its key in `key_file`
    /// (both PEM), with Mozilla's intermediate settings (TLS 1.2 and 1.3).
    pub fn tls(tcp: TcpListener, cert_file: &Path, key_file: &Path) -> anyhow::Result<Self> {
        let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
        acceptor
            .set_certificate_chain_file(cert_file)
            .with_context(|| format!("TLS certificate {}", cert_file.display()))?;
        acceptor
            .set_private_key_file(key_file, SslFiletype::PEM)
            .with_context(|| format!("TLS key {}", key_file.display()))?;
        acceptor.check_private_key().with_context(|| {
            format!(
                "{} is not the key of {}",
                key_file.display(),
                cert_file.display()
            )
        })?;
        Ok(Self {
            tcp,
            tls: Some(Arc::new(acceptor.build())),
        })
    }

    /// `https` or `http`, for the base URL a client is given.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }
}

impl axum::serve::Listener for Listener {
    type Io = Stream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Stream, SocketAddr) {
        loop {
            let (tcp, addr) = axum::serve::Listener::accept(&mut self.tcp).await;
            let Some(acceptor) = &self.tls else {
                return (Stream::Plain(tcp), addr);
            };
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(acceptor, tcp)).await {
                Ok(Ok(stream)) => return (Stream::Tls(Box::new(stream)), addr),
                // The client's to fix (it does not trust us, or speaks plain HTTP): it
                // hears of it from its own library.
                Ok(Err(error)) => tracing::debug!(%addr, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

async fn handshake(acceptor: &SslAcceptor, tcp: TcpStream) -> anyhow::Result<SslStream<TcpStream>> {
    let mut stream = SslStream::new(Ssl::new(acceptor.context())?, tcp)?;
    Pin::new(&mut stream).accept().await?;
    Ok(stream)
}

/// A connection, plain or over TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The CA certificates in a PEM file (one or more), for a client to trust beside the
/// system's own.
pub fn ca_certificates(file: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("{} holds no PEM certificate", file.display()))?;
    anyhow::ensure!(
        !certificates.is_empty(),
        "{} holds no PEM certificate",
        file.display()
    );
    Ok(certificates)
}

/// What OpenSSL said, if `error` (a failed call) is a TLS refusal: the server's
/// certificate not trusted or not for its name, or a handshake that failed. `None` for
/// anything else, such as a server not answering, which waiting may cure.
pub fn refusal(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(error);
    let mut found = None;
    while let Some(error) = source {
        let text = error.to_string();
        let lower = text.to_ascii_lowercase();
        if lower.contains("certificate") || lower.contains("ssl") || lower.contains("tls") {
            found = Some(text);
        }
        source = error.source();
    }
    found
}
