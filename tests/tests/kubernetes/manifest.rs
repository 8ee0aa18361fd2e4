//! The rendered manifests, read the way a cluster would: workloads become pods (each with its
//! own loopback IP, standing for the pod IP), Services become addresses, and a container's
//! `env`, `envFrom`, `command` and `args` become what its process is started with.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

/// The node name the downward API reports (`spec.nodeName`).
pub const NODE_NAME: &str = "rehearsal-node";

/// One object of the rendering.
pub fn kind_name(obj: &Value) -> String {
    format!("{}/{}", str_at(obj, "/kind"), str_at(obj, "/metadata/name"))
}

pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

pub fn labels_of(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// A pod as its workload would create it.
#[derive(Debug, Clone)]
pub struct PodPlan {
    pub name: String,
    pub namespace: String,
    /// `Deployment/ferrite-worker`, …
    pub owner: String,
    /// `app.kubernetes.io/component`, for the timings table.
    pub component: String,
    pub ip: Ipv4Addr,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The pod template's `spec`.
    pub spec: Value,
}

impl PodPlan {
    pub fn grace_period_s(&self) -> u64 {
        self.spec
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(30)
    }

    pub fn containers(&self) -> Vec<Value> {
        array(&self.spec, "containers")
    }

    pub fn init_containers(&self) -> Vec<Value> {
        array(&self.spec, "initContainers")
    }

    /// The container port `port` names (a name or a number) in `container`.
    pub fn resolve_port(container: &Value, port: &Value) -> Result<u16> {
        if let Some(n) = port.as_u64() {
            return u16::try_from(n).context("port out of range");
        }
        let name = port.as_str().unwrap_or("");
        for p in array(container, "ports") {
            if str_at(&p, "/name") == name {
                let n = p.get("containerPort").and_then(Value::as_u64).unwrap_or(0);
                return u16::try_from(n).context("port out of range");
            }
        }
        bail!(
            "container {} declares no port named {name:?}",
            str_at(container, "/name")
        )
    }

    /// The port `target` (a Service's targetPort) on this pod, if one of its containers has it.
    pub fn target_port(&self, target: &Value) -> Option<u16> {
        if let Some(n) = target.as_u64() {
            return u16::try_from(n).ok();
        }
        self.containers()
            .iter()
            .find_map(|c| Self::resolve_port(c, target).ok())
    }

    /// The downward API's value of `fieldPath`.
    pub fn field(&self, path: &str) -> Result<String> {
        if let Some(label) = path
            .strip_prefix("metadata.labels['")
            .and_then(|s| s.strip_suffix("']"))
        {
            return self
                .labels
                .get(label)
                .cloned()
                .ok_or_else(|| anyhow!("pod {} has no label {label}", self.name));
        }
        if let Some(key) = path
            .strip_prefix("metadata.annotations['")
            .and_then(|s| s.strip_suffix("']"))
        {
            return self
                .annotations
                .get(key)
                .cloned()
                .ok_or_else(|| anyhow!("pod {} has no annotation {key}", self.name));
        }
        Ok(match path {
            "metadata.name" => self.name.clone(),
            "metadata.namespace" => self.namespace.clone(),
            "metadata.uid" => format!("rehearsal-{}", self.name),
            "spec.nodeName" => NODE_NAME.to_owned(),
            "spec.serviceAccountName" => str_at(&self.spec, "/serviceAccountName").to_owned(),
            "status.podIP" => self.ip.to_string(),
            "status.hostIP" => Ipv4Addr::LOCALHOST.to_string(),
            other => bail!("the rehearsal knows no downward API field {other}"),
        })
    }

    pub fn selected_by(&self, selector: &Value) -> bool {
        let wanted = labels_of(selector.get("matchLabels").or(Some(selector)));
        !wanted.is_empty() && wanted.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

pub fn array(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// A Service of the rendering.
#[derive(Debug, Clone)]
pub struct ServicePlan {
    pub name: String,
    pub namespace: String,
    pub headless: bool,
    pub publish_not_ready: bool,
    pub selector: Value,
    /// (port, targetPort) pairs.
    pub ports: Vec<(u16, Value)>,
}

impl ServicePlan {
    /// The DNS names a pod of the same namespace may use for this Service.
    pub fn dns_names(&self) -> Vec<String> {
        let (n, ns) = (&self.name, &self.namespace);
        vec![
            format!("{n}.{ns}.svc.cluster.local"),
            format!("{n}.{ns}.svc"),
            format!("{n}.{ns}"),
            n.clone(),
        ]
    }
}

/// A PodMonitor's scrape endpoints: (port name, path) on the pods its selector picks.
#[derive(Debug, Clone)]
pub struct MonitorPlan {
    pub name: String,
    pub selector: Value,
    pub endpoints: Vec<(String, String)>,
}

/// Everything of a rendering the rehearsal acts on.
#[derive(Debug, Clone)]
pub struct Plan {
    pub pods: Vec<PodPlan>,
    pub services: Vec<ServicePlan>,
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
    pub monitors: Vec<MonitorPlan>,
}

impl Plan {
    /// Reads the objects; pods get consecutive addresses from `first_ip` on.
    pub fn new(objects: &[Value], first_ip: Ipv4Addr) -> Result<Self> {
        let mut pods = Vec::new();
        let mut services = Vec::new();
        let mut config_maps = BTreeMap::new();
        let mut monitors = Vec::new();
        let mut next_ip = u32::from(first_ip);
        for obj in objects {
            let namespace = str_at(obj, "/metadata/namespace").to_owned();
            let name = str_at(obj, "/metadata/name").to_owned();
            match str_at(obj, "/kind") {
                "Deployment" | "StatefulSet" => {
                    let replicas = obj
                        .pointer("/spec/replicas")
                        .and_then(Value::as_u64)
                        .unwrap_or(1);
                    let template = obj
                        .pointer("/spec/template")
                        .with_context(|| format!("{} has no pod template", kind_name(obj)))?;
                    let labels = labels_of(template.pointer("/metadata/labels"));
                    let claim_templates: Vec<String> = obj
                        .pointer("/spec/volumeClaimTemplates")
                        .and_then(Value::as_array)
                        .map(|ts| {
                            ts.iter()
                                .map(|t| str_at(t, "/metadata/name").to_owned())
                                .collect()
                        })
                        .unwrap_or_default();
                    for i in 0..replicas {
                        // StatefulSet pods are `name-N` (their DNS names depend on it); a
                        // Deployment's get a stand-in for the ReplicaSet hash.
                        let pod_name = if str_at(obj, "/kind") == "StatefulSet" {
                            format!("{name}-{i}")
                        } else {
                            format!("{name}-5f7c9d-{i}")
                        };
                        // A StatefulSet's claim templates become volumes of that name, bound
                        // to the pod's own claim (`template-pod`).
                        let mut spec = template.get("spec").cloned().unwrap_or(Value::Null);
                        if let Some(list) = spec
                            .as_object_mut()
                            .map(|s| {
                                s.entry("volumes")
                                    .or_insert_with(|| Value::Array(Vec::new()))
                            })
                            .and_then(Value::as_array_mut)
                        {
                            for t in &claim_templates {
                                list.push(serde_json::json!({
                                    "name": t,
                                    "persistentVolumeClaim": {"claimName": format!("{t}-{pod_name}")},
                                }));
                            }
                        }
                        pods.push(PodPlan {
                            name: pod_name,
                            namespace: namespace.clone(),
                            owner: kind_name(obj),
                            component: labels
                                .get("app.kubernetes.io/component")
                                .cloned()
                                .unwrap_or_default(),
                            ip: Ipv4Addr::from(next_ip),
                            labels: labels.clone(),
                            annotations: labels_of(template.pointer("/metadata/annotations")),
                            spec,
                        });
                        next_ip += 1;
                    }
                }
                "LeaderWorkerSet" => {
                    let (group_pods, service) = crate::lws::expand(obj, &mut next_ip)?;
                    pods.extend(group_pods);
                    services.push(service);
                }
                "PodMonitor" => monitors.push(MonitorPlan {
                    name,
                    selector: obj.pointer("/spec/selector").cloned().unwrap_or_default(),
                    endpoints: array(&obj["spec"], "podMetricsEndpoints")
                        .iter()
                        .map(|e| {
                            let path = match str_at(e, "/path") {
                                "" => "/metrics",
                                p => p,
                            };
                            (str_at(e, "/port").to_owned(), path.to_owned())
                        })
                        .collect(),
                }),
                "Service" => {
                    let ports = array(&obj["spec"], "ports")
                        .iter()
                        .map(|p| {
                            let port = p.get("port").and_then(Value::as_u64).unwrap_or(0);
                            let target = p.get("targetPort").cloned().unwrap_or(port.into());
                            Ok((u16::try_from(port)?, target))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    services.push(ServicePlan {
                        name,
                        namespace,
                        headless: str_at(obj, "/spec/clusterIP") == "None",
                        publish_not_ready: obj
                            .pointer("/spec/publishNotReadyAddresses")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                        selector: obj.pointer("/spec/selector").cloned().unwrap_or_default(),
                        ports,
                    });
                }
                "ConfigMap" => {
                    let data = obj
                        .get("data")
                        .and_then(Value::as_object)
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                                .collect()
                        })
                        .unwrap_or_default();
                    config_maps.insert(name, data);
                }
                _ => {}
            }
        }
        Ok(Self {
            pods,
            services,
            config_maps,
            monitors,
        })
    }

    pub fn pods_of(&self, owner: &str) -> Vec<&PodPlan> {
        self.pods.iter().filter(|p| p.owner == owner).collect()
    }
}

/// What an image's Dockerfile stage says about how its containers start.
#[derive(Debug, Clone, Default)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Reads stage `stage` of `dockerfile`: its ENTRYPOINT, CMD (JSON form) and ENV.
pub fn image_config(dockerfile: &Path, stage: &str) -> Result<ImageConfig> {
    let text = std::fs::read_to_string(dockerfile)
        .with_context(|| format!("reading {}", dockerfile.display()))?;
    // Join continuation lines, drop comments.
    let mut lines = Vec::new();
    let mut current = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if line.starts_with('#') && current.is_empty() {
            continue;
        }
        if let Some(body) = line.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
        } else {
            current.push_str(line);
            lines.push(std::mem::take(&mut current));
        }
    }
    let mut config = ImageConfig::default();
    let mut in_stage = false;
    let mut found = false;
    for line in lines {
        let (instruction, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match instruction.to_ascii_uppercase().as_str() {
            "FROM" => {
                in_stage = rest
                    .to_ascii_lowercase()
                    .ends_with(&format!(" as {}", stage.to_ascii_lowercase()));
                found |= in_stage;
            }
            "ENTRYPOINT" if in_stage => config.entrypoint = serde_json::from_str(rest.trim())?,
            "CMD" if in_stage => config.cmd = serde_json::from_str(rest.trim())?,
            "ENV" if in_stage => {
                for pair in rest.split_whitespace() {
                    let (k, v) = pair
                        .split_once('=')
                        .with_context(|| format!("ENV {pair}: only KEY=VALUE is read"))?;
                    config
                        .env
                        .push((k.to_owned(), v.trim_matches('"').to_owned()));
                }
            }
            _ => {}
        }
    }
    anyhow::ensure!(found, "{} has no stage {stage}", dockerfile.display());
    Ok(config)
}

/// Kubernetes' `$(VAR)` expansion: references to variables in `vars` are replaced, `$$` is
/// a literal `$`, and anything else is left as written.
pub fn expand(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) if vars.contains_key(&body[..end]) => {
                    out.push_str(&vars[&body[..end]]);
                    rest = &body[end + 1..];
                }
                _ => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// How names inside a pod's strings map to this machine: Service names (with a port) to the
/// local address of that Service's port, pod DNS names to pod IPs, the wildcard address to the
/// pod's own IP, and mount paths to the local directories standing for the volumes.
#[derive(Debug, Clone, Default)]
pub struct Rewrites {
    /// (`host:port` as written, local `ip:port`), longest first.
    pub service_ports: Vec<(String, String)>,
    /// (host, ip), longest first.
    pub hosts: Vec<(String, String)>,
}

impl Rewrites {
    pub fn sort(&mut self) {
        self.service_ports
            .sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
        self.hosts.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    }

    /// `s` with every mapped name replaced (a name counts only between delimiters, so
    /// `ferrite-etcd` never matches inside `ferrite-etcd-peer`).
    pub fn apply(&self, s: &str, pod_ip: &str, mounts: &[(String, PathBuf)]) -> String {
        let mut s = s.to_owned();
        for (from, to) in &self.service_ports {
            s = replace_delimited(&s, from, to, is_host_boundary, |c| {
                c != ':' && !c.is_ascii_digit()
            });
        }
        for (from, to) in &self.hosts {
            s = replace_delimited(&s, from, to, is_host_boundary, |c| {
                c == ':' || c == '/' || c == ','
            });
        }
        s = replace_delimited(&s, "0.0.0.0", pod_ip, is_host_boundary, |c| c == ':');
        for (path, local) in mounts {
            let local = local.to_string_lossy();
            s = replace_delimited(
                &s,
                path,
                &local,
                |c| matches!(c, '=' | ',' | ':'),
                |c| c == '/',
            );
        }
        s
    }
}

fn is_host_boundary(c: char) -> bool {
    matches!(c, '/' | '=' | ',' | '@' | ' ')
}

/// Replaces each `from` in `s` that starts the string or follows a `before` character, and
/// ends it or precedes an `after` character.
fn replace_delimited(
    s: &str,
    from: &str,
    to: &str,
    before: impl Fn(char) -> bool,
    after: impl Fn(char) -> bool,
) -> String {
    let mut out = String::new();
    let mut i = 0;
    while let Some(found) = s[i..].find(from) {
        let at = i + found;
        let end = at + from.len();
        let ok_before = s[..at].chars().next_back().is_none_or(&before);
        let ok_after = s[end..].chars().next().is_none_or(&after);
        out.push_str(&s[i..at]);
        if ok_before && ok_after {
            out.push_str(to);
        } else {
            out.push_str(from);
        }
        i = end;
    }
    out.push_str(&s[i..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_kubernetes() {
        let vars: BTreeMap<String, String> = [("A".into(), "x".into())].into();
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &vars), "x-$(B)-$(A)-$");
    }

    #[test]
    fn names_are_replaced_between_delimiters_only() {
        let mut r = Rewrites {
            service_ports: vec![("ferrite-etcd:2379".into(), "127.0.0.1:4000".into())],
            hosts: vec![(
                "ferrite-etcd-0.ferrite-etcd-peer".into(),
                "127.9.0.2".into(),
            )],
        };
        r.sort();
        let mounts = [("/var/cache/ferrite".to_owned(), PathBuf::from("/tmp/m"))];
        assert_eq!(
            r.apply(
                "http://ferrite-etcd:2379,http://ferrite-etcd-0.ferrite-etcd-peer:2380",
                "127.9.0.5",
                &mounts
            ),
            "http://127.0.0.1:4000,http://127.9.0.2:2380"
        );
        assert_eq!(
            r.apply("ferrite-etcd-peer:2379", "1", &mounts),
            "ferrite-etcd-peer:2379"
        );
        assert_eq!(
            r.apply("0.0.0.0:50061", "127.9.0.5", &mounts),
            "127.9.0.5:50061"
        );
        assert_eq!(
            r.apply("--data-dir=/var/cache/ferrite/x", "1", &mounts),
            "--data-dir=/tmp/m/x"
        );
        assert_eq!(
            r.apply("/var/cache/ferrite-kernels", "1", &mounts),
            "/var/cache/ferrite-kernels"
        );
    }
}
