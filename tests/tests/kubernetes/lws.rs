//! A LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`) expanded into the pods and the Service its
//! controller and webhook would make, following kubernetes-sigs/lws:
//!
//! - `pkg/controllers/leaderworkerset_controller.go` (`constructLeaderStatefulSetApplyConfiguration`):
//!   a leader StatefulSet named after the set, `replicas` pods `<lws>-<g>` from the leader
//!   template (the worker template if there is none), labelled `worker-index: "0"`, `name` and
//!   `template-revision-hash`, annotated with `size`, its `serviceName` the set's name; and
//!   (`reconcileHeadlessServices`, subdomain policy Shared) a headless Service of that name,
//!   selecting `name: <lws>`, publishing not-ready addresses;
//! - `pkg/controllers/pod_controller.go` (`constructWorkerStatefulSetApplyConfiguration`): per
//!   leader pod a StatefulSet `<lws>-<g>` of `size - 1` pods with ordinals from 1, so
//!   `<lws>-<g>-<i>`, from the worker template, labelled `group-index`, `name`, `group-key`
//!   (the leader's) and the revision hash, annotated with `size` and `leader-name`;
//! - `pkg/webhooks/pod_webhook.go` (`Default`): a leader gets `group-index` (its ordinal) and
//!   `group-key` (sha1 of `<namespace>/<pod name>`, hex); a worker gets `worker-index` (its
//!   ordinal); then `pkg/utils/pod/pod_utils.go` (`AddLWSVariables`) puts `LWS_LEADER_ADDRESS`
//!   (`<lws>-<g>.<subdomain>.<namespace>`), `LWS_GROUP_SIZE` and `LWS_WORKER_INDEX` at the
//!   front of every container's and init container's env, replacing any of the same name.
//!   (Those three are all it injects; `LWS_NAME` or `LWS_GROUP_INDEX` a manifest takes from
//!   the labels through the downward API itself. TPU variables only come with TPU requests.)
//!
//! Not rehearsed: subGroupPolicy, exclusive placement, volumeClaimTemplates (refused).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::manifest::{PodPlan, ServicePlan, kind_name, str_at};

pub const NAME: &str = "leaderworkerset.sigs.k8s.io/name";
pub const GROUP_INDEX: &str = "leaderworkerset.sigs.k8s.io/group-index";
pub const WORKER_INDEX: &str = "leaderworkerset.sigs.k8s.io/worker-index";
pub const GROUP_KEY: &str = "leaderworkerset.sigs.k8s.io/group-key";
const REVISION: &str = "leaderworkerset.sigs.k8s.io/template-revision-hash";
const SIZE: &str = "leaderworkerset.sigs.k8s.io/size";
const LEADER_NAME: &str = "leaderworkerset.sigs.k8s.io/leader-name";
/// A stand-in for the controller's revision hash of the templates.
const REVISION_HASH: &str = "6b8f4c7d9";

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The pods of `lws` (leaders and workers, group by group) with addresses from `next_ip` on,
/// and the headless Service the controller creates for them.
pub fn expand(lws: &Value, next_ip: &mut u32) -> Result<(Vec<PodPlan>, ServicePlan)> {
    let name = str_at(lws, "/metadata/name").to_owned();
    let namespace = str_at(lws, "/metadata/namespace").to_owned();
    let spec = lws.get("spec").context("a LeaderWorkerSet without spec")?;
    let replicas = spec.get("replicas").and_then(Value::as_u64).unwrap_or(1);
    let lwt = spec
        .get("leaderWorkerTemplate")
        .context("no leaderWorkerTemplate")?;
    let size = lwt.get("size").and_then(Value::as_u64).unwrap_or(1);
    anyhow::ensure!(
        lwt.get("volumeClaimTemplates").is_none() && lwt.get("subGroupPolicy").is_none(),
        "{}: volumeClaimTemplates and subGroupPolicy are not rehearsed",
        kind_name(lws)
    );
    let worker_template = lwt.get("workerTemplate").context("no workerTemplate")?;
    let leader_template = lwt.get("leaderTemplate").unwrap_or(worker_template);
    let mut pods = Vec::new();
    for g in 0..replicas {
        let leader_name = format!("{name}-{g}");
        let group_key = sha1_hex(format!("{namespace}/{leader_name}").as_bytes());
        let group = [
            (NAME, name.clone()),
            (GROUP_INDEX, g.to_string()),
            (GROUP_KEY, group_key),
            (REVISION, REVISION_HASH.to_owned()),
        ];
        for i in 0..size {
            let (template, pod_name) = if i == 0 {
                (leader_template, leader_name.clone())
            } else {
                (worker_template, format!("{leader_name}-{i}"))
            };
            let mut labels = string_map(template.pointer("/metadata/labels"));
            labels.extend(group.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
            labels.insert(WORKER_INDEX.to_owned(), i.to_string());
            let mut annotations = string_map(template.pointer("/metadata/annotations"));
            annotations.insert(SIZE.to_owned(), size.to_string());
            if i > 0 {
                annotations.insert(LEADER_NAME.to_owned(), leader_name.clone());
            }
            let mut pod_spec = template.get("spec").cloned().unwrap_or(Value::Null);
            // The StatefulSets' serviceName (the set's name, subdomain policy Shared).
            pod_spec["hostname"] = json!(pod_name);
            pod_spec["subdomain"] = json!(name);
            let injected = [
                (
                    "LWS_LEADER_ADDRESS",
                    format!("{leader_name}.{name}.{namespace}"),
                ),
                ("LWS_GROUP_SIZE", size.to_string()),
                ("LWS_WORKER_INDEX", i.to_string()),
            ];
            for key in ["containers", "initContainers"] {
                if let Some(list) = pod_spec.get_mut(key).and_then(Value::as_array_mut) {
                    for c in list {
                        inject_env(c, &injected);
                    }
                }
            }
            pods.push(PodPlan {
                name: pod_name,
                namespace: namespace.clone(),
                owner: kind_name(lws),
                component: labels
                    .get("app.kubernetes.io/component")
                    .cloned()
                    .unwrap_or_default(),
                ip: Ipv4Addr::from(*next_ip),
                labels,
                annotations,
                spec: pod_spec,
            });
            *next_ip += 1;
        }
    }
    let service = ServicePlan {
        name: name.clone(),
        namespace,
        headless: true,
        publish_not_ready: true,
        selector: json!({ NAME: name }),
        ports: Vec::new(),
    };
    Ok((pods, service))
}

/// `addEnvVarsIfNotExists`: the injected variables first, in order, then the container's own
/// but those of the same names.
fn inject_env(container: &mut Value, injected: &[(&str, String)]) {
    let own = container
        .get("env")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut env: Vec<Value> = injected
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    env.extend(
        own.into_iter()
            .filter(|e| !injected.iter().any(|(k, _)| str_at(e, "/name") == *k)),
    );
    container["env"] = Value::Array(env);
}

/// The pods of group `g` of LeaderWorkerSet `lws` (what RecreateGroupOnPodRestart recreates).
pub fn group_of<'a>(pods: &'a [PodPlan], lws: &str, g: u64) -> Vec<&'a PodPlan> {
    pods.iter()
        .filter(|p| {
            p.labels.get(NAME).map(String::as_str) == Some(lws)
                && p.labels.get(GROUP_INDEX) == Some(&g.to_string())
        })
        .collect()
}

/// SHA-1 (FIPS 180-4) of `data`, as lowercase hex: the LWS webhook's group key.
pub fn sha1_hex(data: &[u8]) -> String {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in chunk.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_matches_the_standard_vectors() {
        assert_eq!(sha1_hex(b""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(sha1_hex(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(
            sha1_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
    }

    #[test]
    fn a_set_expands_like_the_controller() -> Result<()> {
        let lws = json!({
            "kind": "LeaderWorkerSet",
            "metadata": {"name": "set", "namespace": "ns"},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {
                "size": 3,
                "leaderTemplate": {"metadata": {"labels": {"role": "leader"}},
                    "spec": {"containers": [{"name": "c", "env": [
                        {"name": "A", "value": "1"}, {"name": "LWS_GROUP_SIZE", "value": "9"}]}]}},
                "workerTemplate": {"metadata": {"labels": {"role": "rank"}},
                    "spec": {"containers": [{"name": "c"}]}},
            }},
        });
        let mut ip = u32::from(Ipv4Addr::new(127, 1, 0, 1));
        let (pods, svc) = expand(&lws, &mut ip)?;
        let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["set-0", "set-0-1", "set-0-2", "set-1", "set-1-1", "set-1-2"]
        );
        let w = &pods[4];
        assert_eq!(w.labels["role"], "rank");
        assert_eq!(w.labels[WORKER_INDEX], "1");
        assert_eq!(w.labels[GROUP_INDEX], "1");
        assert_eq!(w.labels[GROUP_KEY], sha1_hex(b"ns/set-1"));
        assert_eq!(w.labels[GROUP_KEY], pods[3].labels[GROUP_KEY]);
        assert_eq!(w.annotations[LEADER_NAME], "set-1");
        let env: Vec<(String, String)> = w.spec["containers"][0]["env"]
            .as_array()
            .context("no env")?
            .iter()
            .map(|e| (str_at(e, "/name").into(), str_at(e, "/value").into()))
            .collect();
        assert_eq!(
            env,
            [
                ("LWS_LEADER_ADDRESS".into(), "set-1.set.ns".into()),
                ("LWS_GROUP_SIZE".into(), "3".into()),
                ("LWS_WORKER_INDEX".into(), "1".into()),
            ]
        );
        // The leader's own LWS_GROUP_SIZE gives way to the injected one; A stays, after.
        let leader_env = pods[0].spec["containers"][0]["env"]
            .as_array()
            .context("no env")?;
        assert_eq!(leader_env.len(), 4);
        assert_eq!(str_at(&leader_env[1], "/value"), "3");
        assert_eq!(str_at(&leader_env[3], "/name"), "A");
        assert!(svc.headless && svc.publish_not_ready);
        assert_eq!(group_of(&pods, "set", 0).len(), 3);
        Ok(())
    }
}
