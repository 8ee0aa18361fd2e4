//! TLS for ferrite's listeners and clients, with certificates from PEM files.
//!
//! # Layout
//!
//! - [`ServerTls`]: a listener's certificate, key and (for mutual TLS) the CA its clients'
//!   certificates must chain to. The files are checked at most every [`RECHECK`] (a `stat`
//!   each, at a handshake) and re-read when they changed, so a renewed certificate is served
//!   without a restart; a renewal that does not load (a half-written file) keeps the last good
//!   one, says why, and is tried again only when the files change again.
//! - [`incoming`]: a TCP listener's connections after their handshakes, for tonic's and axum's
//!   servers. Handshakes run on their own tasks, so one slow client holds up no other, at most
//!   [`MAX_HANDSHAKES`] at a time (more wait in the listen queue). A client that speaks
//!   plaintext to a TLS port gets a plain `400` saying so, rather than a reset.
//! - [`client_config`], [`ClientTlsFiles`]: what a client (the gateway calling workers,
//!   anything calling etcd) trusts and presents; the files' [`ClientTlsFiles::stamp`] tells a
//!   long-lived client when to load them again.
//! - `testing` (feature): certificates made on the spot for tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// A listener's PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate chaining to this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The certificates of a PEM file (at least one).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: format!("not PEM certificates: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            reason: "no certificate in it".into(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read(path)?).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        reason: format!("no private key in it: {e}"),
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A root store of the certificates in `ca`.
fn roots(ca: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca)? {
        roots.add(cert).map_err(|e| TlsError::Pem {
            path: ca.to_owned(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

fn server_config(files: &TlsFiles, alpn: &[&[u8]]) -> Result<rustls::ServerConfig, TlsError> {
    let config = |e: rustls::Error| TlsError::Config(e.to_string());
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config)?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::Config(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(certificates(&files.cert)?, private_key(&files.key)?)
        .map_err(|e| {
            TlsError::Config(format!(
                "{} and {}: {e}",
                files.cert.display(),
                files.key.display()
            ))
        })?;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(cfg)
}

/// When each file last changed (and its length), to notice a renewal.
pub type Stamp = Vec<Option<(SystemTime, u64)>>;

fn stamp_of<'a>(paths: impl Iterator<Item = &'a Path>) -> Stamp {
    paths
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

/// How often a listener looks at its files for a renewal (at most; at a handshake).
pub const RECHECK: Duration = Duration::from_secs(1);

/// What a listener serves with now.
#[derive(Debug)]
struct Loaded {
    /// The files as last looked at (loaded or not).
    stamp: Stamp,
    config: Arc<rustls::ServerConfig>,
    checked: Instant,
}

/// A listener's TLS, re-read when its files change.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    alpn: Vec<&'static [u8]>,
    // A std mutex: held for a stat of each file now and then, and a reload when they changed.
    current: Mutex<Loaded>,
}

/// The ALPN protocols of a gRPC listener.
pub const ALPN_GRPC: &[&[u8]] = &[b"h2"];
/// The ALPN protocols of an HTTP listener.
pub const ALPN_HTTP: &[&[u8]] = &[b"h2", b"http/1.1"];

impl ServerTls {
    /// Loads `files` (an error here is a start-up error) for a listener offering `alpn`.
    pub fn new(files: TlsFiles, alpn: &[&'static [u8]]) -> Result<Arc<Self>, TlsError> {
        let loaded = Loaded {
            stamp: stamp_of(files.paths()),
            config: Arc::new(server_config(&files, alpn)?),
            checked: Instant::now(),
        };
        Ok(Arc::new(Self {
            files,
            alpn: alpn.to_vec(),
            current: Mutex::new(loaded),
        }))
    }

    /// The configuration to handshake with: re-read first if a file changed (looked at no
    /// more than every [`RECHECK`]).
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.checked.elapsed() < RECHECK {
            return current.config.clone();
        }
        current.checked = Instant::now();
        let now = stamp_of(self.files.paths());
        if current.stamp != now {
            // Looked at either way: a renewal that does not load is tried again only once
            // the files change again, not at every handshake.
            current.stamp = now;
            match server_config(&self.files, &self.alpn) {
                Ok(cfg) => {
                    tracing::info!(cert = %self.files.cert.display(), "TLS files changed: reloaded");
                    current.config = Arc::new(cfg);
                }
                // Keep serving the last good certificate.
                Err(e) => tracing::warn!(
                    "TLS files changed but do not load ({e}): keeping the previous ones"
                ),
            }
        }
        current.config.clone()
    }
}

/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a plaintext client gets from a TLS port.
const PLAINTEXT_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 62\r\n\r\nThis port speaks TLS: connect with https:// (or gRPC with TLS)\n";

/// Handshakes one connection (once its client spoke, holding one of `computing`), or answers
/// a plaintext client and gives up.
async fn handshake(
    tcp: TcpStream,
    tls: &ServerTls,
    computing: &tokio::sync::Semaphore,
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    tcp.peek(&mut first).await?;
    let _computing = computing.acquire().await.map_err(std::io::Error::other)?;
    // Every TLS connection opens with a handshake record (content type 22).
    if first[0] != 22 {
        let mut tcp = tcp;
        tcp.write_all(PLAINTEXT_ANSWER).await?;
        tcp.shutdown().await?;
        return Err(std::io::Error::other("a plaintext client on the TLS port"));
    }
    TlsAcceptor::from(tls.config()).accept(tcp).await
}

/// A listener's connections after their handshakes. Dropping it stops accepting.
#[derive(Debug)]
pub struct TlsIncoming {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl TlsIncoming {
    /// The next connection (`None` once the listener failed).
    pub async fn next(&mut self) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
        self.rx.recv().await
    }
}

/// The connections, as the stream tonic's `serve_with_incoming` takes.
impl tokio_stream::Stream for TlsIncoming {
    type Item = std::io::Result<TlsStream<TcpStream>>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx
            .poll_recv(cx)
            .map(|c| c.map(|(stream, _)| Ok(stream)))
    }
}

/// Connections accepted and not yet through their handshake, at most, on one listener;
/// further connections wait in the kernel's listen queue.
pub const MAX_PENDING_HANDSHAKES: usize = 1024;
/// Handshakes computing at once, at most, on one listener (a connection holds one of these
/// only once its client spoke: idle connections cost no CPU and hold up no one).
pub const MAX_HANDSHAKES: usize = 64;

/// Accepts on `listener` and handshakes each connection with `tls` (within the caps above).
/// Failed handshakes are logged (at debug: port scanners and plaintext clients are routine)
/// and dropped.
pub fn incoming(listener: TcpListener, tls: Arc<ServerTls>) -> TlsIncoming {
    let (tx, rx) = mpsc::channel(64);
    let pending = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES));
    let computing = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let accept = tokio::spawn(async move {
        loop {
            let Ok(slot) = pending.clone().acquire_owned().await else {
                return;
            };
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (tx, tls, computing) = (tx.clone(), tls.clone(), computing.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let shake = handshake(tcp, &tls, &computing);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, shake).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send((stream, peer)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    TlsIncoming { rx, accept }
}

/// A client's TLS files: the CA its servers' certificates must chain to, and optionally its
/// own certificate and key (for servers that require mutual TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTlsFiles {
    pub ca: PathBuf,
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClientTlsFiles {
    /// The client configuration the files make now.
    pub fn load(&self) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
        let identity = self
            .identity
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()));
        client_config(&self.ca, identity)
    }

    /// When the files last changed: load them again when this differs.
    pub fn stamp(&self) -> Stamp {
        let identity = self.identity.iter().flat_map(|(c, k)| [c, k]);
        stamp_of(
            std::iter::once(&self.ca)
                .chain(identity)
                .map(PathBuf::as_path),
        )
    }
}

/// A client's TLS: the CA its servers' certificates must chain to, and optionally its own
/// certificate and key (for servers that require mutual TLS).
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
    let mut cfg = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
    if let Some((cert, key)) = identity {
        cfg = cfg.identity(tonic::transport::Identity::from_pem(
            read(cert)?,
            read(key)?,
        ));
    }
    Ok(cfg)
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;
