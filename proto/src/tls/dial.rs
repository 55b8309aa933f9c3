//! Dialling another process of the deployment. With `[tls]` installed a
//! connection is TCP then a rustls handshake that presents this process's
//! certificate and accepts only a server certificate the CA signed, naming
//! [`SERVER_NAME`], that the revocation lists do not name (tonic's own TLS
//! client takes no revocation lists). Each connection takes the files as
//! they are then: a renewed certificate or a longer list applies to the
//! next one. Without `[tls]`, tonic's plain connector.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{SERVER_NAME, installed};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A TLS connection to `uri` with a client configuration: the installed
/// one as it is at each connection, or a fixed one.
#[derive(Clone)]
pub struct Dialer {
    fixed: Option<Arc<rustls::ClientConfig>>,
}

impl Dialer {
    /// With the installed `[tls]` (none installed: every connection fails).
    pub fn installed() -> Self {
        Self { fixed: None }
    }

    /// With `config` for every connection.
    pub fn with(config: Arc<rustls::ClientConfig>) -> Self {
        Self {
            fixed: Some(config),
        }
    }

    fn config(&self) -> Result<Arc<rustls::ClientConfig>, BoxError> {
        match &self.fixed {
            Some(config) => Ok(config.clone()),
            None => installed()
                .map(|tls| tls.material.get().client.clone())
                .ok_or_else(|| "no [tls] is installed in this process".into()),
        }
    }
}

impl tower::Service<Uri> for Dialer {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = self.config();
        Box::pin(async move {
            let config = config?;
            let host = uri.host().ok_or_else(|| format!("{uri} names no host"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from(SERVER_NAME)?;
            let tls = TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// How every channel to another process is made from an
/// [`super::endpoint`]: through [`Dialer`] when `[tls]` is installed.
pub trait Dial {
    /// Connects now.
    fn dial(self) -> impl Future<Output = Result<Channel, tonic::transport::Error>> + Send;
    /// Connects at the first call.
    fn dial_lazy(self) -> Channel;
}

impl Dial for Endpoint {
    async fn dial(self) -> Result<Channel, tonic::transport::Error> {
        match installed() {
            Some(_) => self.connect_with_connector(Dialer::installed()).await,
            None => self.connect().await,
        }
    }

    fn dial_lazy(self) -> Channel {
        match installed() {
            Some(_) => self.connect_with_connector_lazy(Dialer::installed()),
            None => self.connect_lazy(),
        }
    }
}
