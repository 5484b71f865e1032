//! A listener whose connections a handler can cut, so the provider can make a charge and
//! then vanish without answering: the lost response a caller must survive.
//!
//! Each accepted stream is wrapped in [`Severable`]; the handler gets the stream's
//! [`Connection`] as axum's connect info. After [`Connection::sever`], every read and
//! write on the stream fails, so hyper writes nothing of the response and closes the
//! socket: the caller sees the connection end with no status line, exactly as if the
//! provider had crashed after its commit.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use saga::https::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Over HTTPS too, when the provider has a certificate: severing cuts the TLS stream.
pub struct SeverableListener(pub saga::https::Listener);

impl Listener for SeverableListener {
    type Io = Severable;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = Listener::accept(&mut self.0).await;
        (
            Severable {
                stream,
                connection: Connection(Arc::default()),
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A handle on one connection, for the requests it carries.
#[derive(Debug, Clone)]
pub struct Connection(Arc<AtomicBool>);

impl Connection {
    /// From now on the connection carries nothing, this request's response included.
    pub fn sever(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn severed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl Connected<IncomingStream<'_, SeverableListener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, SeverableListener>) -> Self {
        stream.io().connection.clone()
    }
}

pub struct Severable {
    stream: Stream,
    connection: Connection,
}

fn severed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "severed on purpose")
}

impl AsyncRead for Severable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.connection.severed() {
            return Poll::Ready(Err(severed()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Severable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.connection.severed() {
            return Poll::Ready(Err(severed()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.connection.severed() {
            return Poll::Ready(Err(severed()));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
