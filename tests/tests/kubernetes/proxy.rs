//! Services as kube-proxy makes them: one local port per Service port, forwarding each new
//! connection to the Service's targetPort on one of the pods its selector picks, among those
//! that are Ready (and not terminating), round robin. No ready pod: the connection is refused.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};

use crate::manifest::{PodPlan, ServicePlan};

/// What the endpoints controller knows of a pod.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodState {
    pub ready: bool,
    pub terminating: bool,
}

/// Pod states by pod name, shared by the pods (which set them) and the proxies (which read).
pub type States = Arc<Mutex<BTreeMap<String, PodState>>>;

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One Service port's forwarder.
#[derive(Debug)]
pub struct ServicePort {
    pub service: String,
    pub port: u16,
    pub local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ServicePort {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ServicePort {
    /// Listens on a free loopback port for `service`'s port `port` → `target`.
    pub async fn start(
        service: &ServicePlan,
        port: u16,
        target: &serde_json::Value,
        pods: &[PodPlan],
        states: States,
    ) -> Result<Self> {
        // (pod name, address of the targetPort on it) for every pod the selector picks.
        let backends: Vec<(String, SocketAddr)> = pods
            .iter()
            .filter(|p| p.selected_by(&service.selector))
            .filter_map(|p| {
                p.target_port(target)
                    .map(|t| (p.name.clone(), SocketAddr::new(IpAddr::V4(p.ip), t)))
            })
            .collect();
        anyhow::ensure!(
            !backends.is_empty(),
            "Service {} port {port}: no pod it selects declares targetPort {target}",
            service.name
        );
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding a Service port")?;
        let local = listener.local_addr()?;
        let publish_not_ready = service.publish_not_ready;
        let next = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let up: Vec<SocketAddr> = {
                    let states = lock(&states);
                    backends
                        .iter()
                        .filter(|(name, _)| {
                            states
                                .get(name)
                                .is_some_and(|s| !s.terminating && (s.ready || publish_not_ready))
                        })
                        .map(|(_, addr)| *addr)
                        .collect()
                };
                if up.is_empty() {
                    continue; // dropped: refused, as with no endpoints
                }
                let to = up[next.fetch_add(1, Ordering::Relaxed) % up.len()];
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(to).await {
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Self {
            service: service.name.clone(),
            port,
            local,
            task,
        })
    }
}

/// Forwards every connection to `at` to `to` (a stand-in container's port).
pub async fn forward(at: SocketAddr, to: SocketAddr) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(at)
        .await
        .with_context(|| format!("binding {at}"))?;
    Ok(tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    }))
}
