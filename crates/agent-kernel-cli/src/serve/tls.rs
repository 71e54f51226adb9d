//! The console over TLS (`--tls-cert`, `--tls-key`): the certificate chain and key read
//! from PEM files at start, and a listener whose handshakes run each on a task of its own
//! (bounded in time), so that a client that stalls its handshake holds up no other.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

/// How long a client has to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How many finished handshakes may wait for the server to take them.
const TLS_READY_MAX: usize = 64;

/// The pause after a failed `accept` (out of file descriptors, say) before the next.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The server's TLS configuration from a PEM certificate chain and its PEM private key.
///
/// # Errors
///
/// What is wrong with either file, in words.
pub(crate) fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let read =
        |path: &Path| std::fs::read(path).map_err(|error| format!("{}: {error}", path.display()));
    let certs = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| {
            format!(
                "--tls-cert {}: not a PEM certificate chain ({error})",
                cert.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "--tls-cert {}: holds no certificate (`-----BEGIN CERTIFICATE-----`)",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|error| {
        format!(
            "--tls-key {}: not a PEM private key ({error})",
            key.display()
        )
    })?;
    let config = ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| format!("TLS: {error}"))?
    .with_no_client_auth()
    .with_single_cert(certs, private)
    .map_err(|error| {
        format!(
            "--tls-key {} does not go with --tls-cert {}: {error}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(Arc::new(config))
}

/// A listener that answers only over TLS: the server takes connections whose handshake
/// finished.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `tcp`, on this runtime.
    ///
    /// # Errors
    ///
    /// When the listener has no local address.
    pub(crate) fn start(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let (sender, ready) = mpsc::channel(TLS_READY_MAX);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "the console cannot accept a connection");
                        tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                        continue;
                    }
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "a TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "a TLS handshake took too long"),
                    }
                });
            }
        });
        Ok(Self { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accepting task never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
