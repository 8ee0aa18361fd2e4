//! A container's probes, run as the kubelet runs them: against the pod IP, on the port the
//! probe names (a number or one of the container's port names), with the probe's timeout.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::net::TcpStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::manifest::{PodPlan, str_at};

/// One probe of a container, with its schedule.
#[derive(Debug, Clone)]
pub struct Probe {
    pub what: String,
    action: Action,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
}

#[derive(Debug, Clone)]
enum Action {
    Grpc { addr: SocketAddr, service: String },
    Http { addr: SocketAddr, path: String },
    Tcp { addr: SocketAddr },
}

fn secs(probe: &Value, key: &str, default: u64) -> Duration {
    Duration::from_secs(probe.get(key).and_then(Value::as_u64).unwrap_or(default))
}

impl Probe {
    /// The probe `kind` (`startupProbe`, …) of `container` in a pod at `ip`, if declared.
    pub fn of(container: &Value, kind: &str, ip: IpAddr) -> Result<Option<Self>> {
        let Some(p) = container.get(kind) else {
            return Ok(None);
        };
        let port = |handler: &Value| -> Result<SocketAddr> {
            let port = PodPlan::resolve_port(container, &handler["port"])?;
            Ok(SocketAddr::new(ip, port))
        };
        let action = if let Some(g) = p.get("grpc") {
            Action::Grpc {
                addr: port(g)?,
                service: str_at(g, "/service").to_owned(),
            }
        } else if let Some(h) = p.get("httpGet") {
            anyhow::ensure!(
                str_at(h, "/scheme").is_empty() || str_at(h, "/scheme") == "HTTP",
                "only plain HTTP probes are rehearsed"
            );
            Action::Http {
                addr: port(h)?,
                path: str_at(h, "/path").to_owned(),
            }
        } else if let Some(t) = p.get("tcpSocket") {
            Action::Tcp { addr: port(t)? }
        } else {
            bail!("{kind}: only grpc, httpGet and tcpSocket probes are rehearsed: {p}");
        };
        let what = match &action {
            Action::Grpc { addr, service } => format!("{kind} grpc {addr} service {service:?}"),
            Action::Http { addr, path } => format!("{kind} GET http://{addr}{path}"),
            Action::Tcp { addr } => format!("{kind} tcp {addr}"),
        };
        Ok(Some(Self {
            what,
            action,
            initial_delay: secs(p, "initialDelaySeconds", 0),
            period: secs(p, "periodSeconds", 10),
            timeout: secs(p, "timeoutSeconds", 1),
            failure_threshold: u32::try_from(
                p.get("failureThreshold")
                    .and_then(Value::as_u64)
                    .unwrap_or(3),
            )
            .unwrap_or(3),
        }))
    }

    /// One attempt: `Ok` if the probe succeeds, else why not.
    pub async fn run(&self) -> Result<()> {
        match tokio::time::timeout(self.timeout, self.attempt()).await {
            Ok(result) => result,
            Err(_) => bail!("timed out after {:?}", self.timeout),
        }
    }

    async fn attempt(&self) -> Result<()> {
        match &self.action {
            Action::Grpc { addr, service } => {
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
                    .connect()
                    .await
                    .with_context(|| format!("connecting to {addr}"))?;
                let status = HealthClient::new(channel)
                    .check(HealthCheckRequest {
                        service: service.clone(),
                    })
                    .await?
                    .into_inner()
                    .status;
                anyhow::ensure!(
                    status == ServingStatus::Serving as i32,
                    "status {:?}",
                    ServingStatus::try_from(status)
                );
                Ok(())
            }
            Action::Http { addr, path } => {
                let r = ferrite_cluster_tests::http::get(*addr, path).await?;
                anyhow::ensure!((200..400).contains(&r.status), "HTTP {}", r.status);
                Ok(())
            }
            Action::Tcp { addr } => {
                TcpStream::connect(addr).await?;
                Ok(())
            }
        }
    }
}
