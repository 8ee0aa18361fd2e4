//! Binding and serving the gateway's two listeners (gRPC and OpenAI HTTP), each in plaintext
//! or, with the gateway's TLS files, TLS (certificates re-read when they change).

use std::net::SocketAddr;
use std::sync::Arc;

use ferrite_proto::v1 as api;
use ferrite_tls::{ServerTls, TlsIncoming};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::{Gateway, grpc, http};

/// Where a running gateway listens.
#[derive(Debug, Clone, Copy)]
pub struct GatewayAddrs {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

/// The largest header list a gRPC request may carry.
const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

/// An HTTP listener's connections after their TLS handshakes, as axum takes them.
struct TlsListener {
    incoming: TlsIncoming,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.next().await {
            Some(c) => c,
            // The accept task ended (the listener failed): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// The gRPC router: health, both reflection packages, and the Inference service behind the
/// API-key check. `ferrite.v1.Inference` reports SERVING (what readiness probes ask) once
/// placement has answered: before that the gateway cannot tell which models exist.
async fn grpc_router(gateway: &Gateway) -> std::io::Result<tonic::transport::server::Router> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_not_serving::<api::inference_server::InferenceServer<grpc::InferenceService>>()
        .await;
    let mut synced = gateway.pools.subscribe_synced();
    tokio::spawn(async move {
        if synced.wait_for(|s| *s).await.is_ok() {
            health
                .set_serving::<api::inference_server::InferenceServer<grpc::InferenceService>>()
                .await;
        }
    });
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ferrite_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    let v1 = reflection.build_v1().map_err(std::io::Error::other)?;
    // The older package name too: grpcio-reflection's default module and many GUI clients
    // still speak only v1alpha.
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ferrite_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(std::io::Error::other)?;
    let inference =
        api::inference_server::InferenceServer::new(grpc::InferenceService::new(gateway.clone()))
            .max_decoding_message_size(http::MAX_BODY_BYTES);
    Ok(tonic::transport::Server::builder()
        // Header lists past 16 KiB are refused.
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .add_service(health_service)
        .add_service(v1)
        .add_service(v1alpha)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            inference,
            grpc::key_check(gateway.keys.clone()),
        )))
}

fn tls_for(gateway: &Gateway, alpn: &[&'static [u8]]) -> std::io::Result<Option<Arc<ServerTls>>> {
    gateway
        .tls
        .clone()
        .map(|files| ServerTls::new(files, alpn).map_err(std::io::Error::other))
        .transpose()
}

async fn serve_grpc(
    gateway: &Gateway,
    listener: TcpListener,
    mut stop: broadcast::Receiver<()>,
) -> std::io::Result<JoinHandle<Result<(), tonic::transport::Error>>> {
    let router = grpc_router(gateway).await?;
    let stopped = async move {
        let _ = stop.recv().await;
    };
    Ok(match tls_for(gateway, ferrite_tls::ALPN_GRPC)? {
        Some(tls) => tokio::spawn(
            router.serve_with_incoming_shutdown(ferrite_tls::incoming(listener, tls), stopped),
        ),
        // Deltas go out as small frames: without TCP_NODELAY, Nagle holds them for an ACK.
        None => tokio::spawn(router.serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            stopped,
        )),
    })
}

fn serve_http(
    gateway: &Gateway,
    listener: TcpListener,
    mut stop: broadcast::Receiver<()>,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    let app = http::router(gateway.clone());
    let stopped = async move {
        let _ = stop.recv().await;
    };
    Ok(match tls_for(gateway, ferrite_tls::ALPN_HTTP)? {
        Some(tls) => {
            let addr = listener.local_addr()?;
            let incoming = ferrite_tls::incoming(listener, tls);
            let listener = TlsListener { incoming, addr };
            tokio::spawn(
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .into_future(),
            )
        }
        None => tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .into_future(),
        ),
    })
}

/// Binds both listeners and serves until `shutdown` resolves.
pub async fn serve(
    gateway: Gateway,
    grpc_listen: SocketAddr,
    http_listen: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(GatewayAddrs, JoinHandle<()>)> {
    let grpc_listener = TcpListener::bind(grpc_listen).await?;
    let http_listener = TcpListener::bind(http_listen).await?;
    let addrs = GatewayAddrs {
        grpc: grpc_listener.local_addr()?,
        http: http_listener.local_addr()?,
    };
    let (stop_tx, _) = broadcast::channel::<()>(1);
    let grpc = serve_grpc(&gateway, grpc_listener, stop_tx.subscribe()).await?;
    let http = serve_http(&gateway, http_listener, stop_tx.subscribe())?;
    let task = tokio::spawn(async move {
        let stopper = tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(());
        });
        let (g, h) = tokio::join!(grpc, http);
        match g {
            Ok(Err(e)) => tracing::error!("gRPC server: {e}"),
            Err(e) => tracing::error!("gRPC server task: {e}"),
            Ok(Ok(())) => {}
        }
        match h {
            Ok(Err(e)) => tracing::error!("HTTP server: {e}"),
            Err(e) => tracing::error!("HTTP server task: {e}"),
            Ok(Ok(())) => {}
        }
        stopper.abort();
    });
    Ok((addrs, task))
}
