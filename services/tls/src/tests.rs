//! A TLS listener against a rustls client: trusted, untrusted, expired, plaintext, mutual TLS,
//! and a certificate renewed on disk while serving.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::*;
use crate::testing::{Leaf, TestCa};

/// A listener that writes `hello` on each connection, and the directory of its files.
struct Server {
    addr: SocketAddr,
    dir: PathBuf,
    _incoming: tokio::task::JoinHandle<()>,
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-tls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

async fn serve(name: &str, ca: &TestCa, leaf: &Leaf, mutual: bool) -> Server {
    let dir = temp_dir(name);
    let (cert, key) = leaf.write(&dir, "server");
    let client_ca = mutual.then(|| ca.write(&dir, "ca"));
    let tls = ServerTls::new(
        TlsFiles {
            cert,
            key,
            client_ca,
        },
        ALPN_HTTP,
    )
    .expect("server TLS");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut incoming = incoming(listener, tls);
    let task = tokio::spawn(async move {
        while let Some((mut s, _)) = incoming.next().await {
            let _ = s.write_all(b"hello").await;
            let _ = s.shutdown().await;
        }
    });
    Server {
        addr,
        dir,
        _incoming: task,
    }
}

/// Connects trusting `ca` (nothing if `None`), presenting `client` if given; returns what the
/// server wrote and the certificate it presented.
async fn fetch(
    addr: SocketAddr,
    ca: Option<&TestCa>,
    client: Option<&Leaf>,
) -> std::io::Result<(String, Vec<u8>)> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        for c in CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
            roots.add(c.expect("CA pem")).expect("CA");
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let config = match client {
        Some(leaf) => {
            let certs = CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("client cert");
            let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key");
            builder
                .with_client_auth_cert(certs, key)
                .expect("client auth")
        }
        None => builder.with_no_client_auth(),
    };
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let presented = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let mut got = String::new();
    tls.read_to_string(&mut got).await?;
    Ok((got, presented))
}

fn der(leaf: &Leaf) -> Vec<u8> {
    CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes())
        .expect("der")
        .to_vec()
}

#[tokio::test]
async fn trusted_untrusted_and_expired_certificates() {
    let ca = TestCa::new("test CA");
    let server = serve("trust", &ca, &ca.issue("server", false), false).await;
    let (got, _) = fetch(server.addr, Some(&ca), None).await.expect("trusted");
    assert_eq!(got, "hello");
    let other = TestCa::new("another CA");
    let err = fetch(server.addr, Some(&other), None)
        .await
        .expect_err("untrusted");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");

    let expired = serve("expired", &ca, &ca.issue("server", true), false).await;
    let err = fetch(expired.addr, Some(&ca), None)
        .await
        .expect_err("expired");
    assert!(err.to_string().contains("certificate expired"), "{err}");
    let _ = std::fs::remove_dir_all(&server.dir);
    let _ = std::fs::remove_dir_all(&expired.dir);
}

#[tokio::test]
async fn a_plaintext_client_is_told_the_port_speaks_tls() {
    let ca = TestCa::new("test CA");
    let server = serve("plain", &ca, &ca.issue("server", false), false).await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut got = String::new();
    tcp.read_to_string(&mut got).await.expect("read");
    assert!(got.starts_with("HTTP/1.1 400"), "{got}");
    assert!(got.contains("This port speaks TLS"), "{got}");
    let _ = std::fs::remove_dir_all(&server.dir);
}

#[tokio::test]
async fn mutual_tls_wants_a_client_certificate_of_the_ca() {
    let ca = TestCa::new("test CA");
    let server = serve("mutual", &ca, &ca.issue("server", false), true).await;
    let client = ca.issue("gateway", false);
    let (got, _) = fetch(server.addr, Some(&ca), Some(&client))
        .await
        .expect("with a client certificate");
    assert_eq!(got, "hello");
    // TLS 1.3 finishes the client's side first: the refusal arrives on the first read.
    let without = fetch(server.addr, Some(&ca), None).await;
    assert!(without.is_err(), "{without:?}");
    let stranger = TestCa::new("another CA").issue("stranger", false);
    let foreign = fetch(server.addr, Some(&ca), Some(&stranger)).await;
    assert!(foreign.is_err(), "{foreign:?}");
    let _ = std::fs::remove_dir_all(&server.dir);
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let ca = TestCa::new("test CA");
    let (first, second) = (ca.issue("first", false), ca.issue("second", false));
    let server = serve("renew", &ca, &first, false).await;
    let (_, presented) = fetch(server.addr, Some(&ca), None).await.expect("first");
    assert_eq!(presented, der(&first));

    // A half-written renewal (a key that does not match) keeps the last good pair.
    std::fs::write(server.dir.join("server.pem"), &second.cert_pem).expect("write");
    tokio::time::sleep(RECHECK).await;
    let (_, presented) = fetch(server.addr, Some(&ca), None).await.expect("kept");
    assert_eq!(presented, der(&first));

    let (cert, key) = second.write(&server.dir, "server");
    // A later modification time than the first write, whatever the clock's resolution.
    let later = SystemTime::now() + Duration::from_secs(5);
    for path in [cert, key] {
        let f = std::fs::File::options()
            .append(true)
            .open(&path)
            .expect("open");
        f.set_modified(later).expect("touch");
    }
    tokio::time::sleep(RECHECK).await;
    let (_, presented) = fetch(server.addr, Some(&ca), None).await.expect("second");
    assert_eq!(presented, der(&second));
    let _ = std::fs::remove_dir_all(&server.dir);
}

/// Clients that connect and say nothing (a slow-loris crowd, past the handshake cap) hold up
/// no one: a real client still gets its handshake at once.
#[tokio::test]
async fn idle_connections_do_not_hold_up_a_handshake() {
    let ca = TestCa::new("test CA");
    let leaf = ca.issue("server", false);
    let server = serve("idle", &ca, &leaf, false).await;
    let mut idle = Vec::new();
    for _ in 0..(MAX_HANDSHAKES * 2) {
        idle.push(
            tokio::net::TcpStream::connect(server.addr)
                .await
                .expect("connect"),
        );
    }
    let started = std::time::Instant::now();
    let (_, presented) =
        tokio::time::timeout(Duration::from_secs(5), fetch(server.addr, Some(&ca), None))
            .await
            .expect("handshake within 5 s")
            .expect("fetch");
    assert_eq!(presented, der(&leaf));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
    let _ = std::fs::remove_dir_all(&server.dir);
}
