//! The etcd key schema (DESIGN.md, "etcd keys") and the JSON records stored under it.
//!
//! ```text
//! {prefix}/nodes/{node}               node inventory          lease of the node agent
//! {prefix}/pools/{pool}               PoolRecord              lease of rank 0
//! {prefix}/pools/{pool}/ranks/{rank}  RankRecord              lease of that rank
//! {prefix}/pools/{pool}/nccl          NCCL unique id (bytes)  lease of rank 0
//! {prefix}/models/{model}             desired state (intent)  no lease
//! ```
//!
//! Pool and node names must not contain `/` (they are path segments); model names
//! may (`org/name` Hugging Face ids), since `models/` has nothing below the name.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::PlacementError;

/// The prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "/ferrite/v1";

/// Builds and parses keys under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySchema {
    /// Without a trailing `/`, so `root()` can add exactly one.
    prefix: String,
}

/// A parsed key (see [`KeySchema::parse`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Pool(String),
    Rank(String, u32),
    Node(String),
    Nccl(String),
    Model(String),
}

impl Default for KeySchema {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX)
    }
}

impl KeySchema {
    /// `prefix` like `/ferrite/v1`; trailing slashes are ignored.
    pub fn new(prefix: impl Into<String>) -> Self {
        let mut prefix = prefix.into();
        while prefix.ends_with('/') {
            prefix.pop();
        }
        Self { prefix }
    }

    /// The configured prefix, without a trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `{prefix}/`: watch this for everything. The trailing `/` matters: a bare
    /// `/ferrite/v1` prefix range would also match `/ferrite/v10/...`.
    pub fn root(&self) -> String {
        format!("{}/", self.prefix)
    }

    pub fn pool(&self, pool: &str) -> String {
        format!("{}/pools/{pool}", self.prefix)
    }

    pub fn rank(&self, pool: &str, rank: u32) -> String {
        format!("{}/pools/{pool}/ranks/{rank}", self.prefix)
    }

    pub fn nccl(&self, pool: &str) -> String {
        format!("{}/pools/{pool}/nccl", self.prefix)
    }

    pub fn node(&self, node: &str) -> String {
        format!("{}/nodes/{node}", self.prefix)
    }

    pub fn model(&self, model: &str) -> String {
        format!("{}/models/{model}", self.prefix)
    }

    /// `{prefix}/pools/`: pools, their ranks and NCCL ids (what the gateway watches).
    pub fn pools_prefix(&self) -> String {
        format!("{}/pools/", self.prefix)
    }

    /// `{prefix}/pools/{pool}/`: the ranks and NCCL id of one pool (not the pool key).
    pub fn pool_children_prefix(&self, pool: &str) -> String {
        format!("{}/pools/{pool}/", self.prefix)
    }

    pub fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }

    pub fn models_prefix(&self) -> String {
        format!("{}/models/", self.prefix)
    }

    /// The inverse of the builders; `None` for keys outside the prefix or not in
    /// the schema (so a consumer can ignore keys written by newer versions).
    pub fn parse(&self, key: &str) -> Option<Key> {
        let rest = key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')?;
        let (kind, rest) = rest.split_once('/')?;
        if rest.is_empty() {
            return None;
        }
        match kind {
            "models" => Some(Key::Model(rest.to_owned())),
            "nodes" if !rest.contains('/') => Some(Key::Node(rest.to_owned())),
            "pools" => {
                let mut parts = rest.split('/');
                let pool = parts.next().filter(|p| !p.is_empty())?.to_owned();
                match (parts.next(), parts.next(), parts.next()) {
                    (None, _, _) => Some(Key::Pool(pool)),
                    (Some("nccl"), None, _) => Some(Key::Nccl(pool)),
                    (Some("ranks"), Some(rank), None) => {
                        // Only the canonical spelling: "01" or "+1" would be a
                        // second key for the same rank.
                        let n: u32 = rank.parse().ok()?;
                        (n.to_string() == rank).then_some(Key::Rank(pool, n))
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The key a parsed [`Key`] came from.
    pub fn key(&self, key: &Key) -> String {
        match key {
            Key::Pool(p) => self.pool(p),
            Key::Rank(p, r) => self.rank(p, *r),
            Key::Node(n) => self.node(n),
            Key::Nccl(p) => self.nccl(p),
            Key::Model(m) => self.model(m),
        }
    }
}

/// Lifecycle of a pool as its leader announces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolState {
    /// Registered but still loading / capturing graphs: do not route.
    Starting,
    /// Serving: route here.
    Ready,
    /// Finishing in-flight requests before shutdown: route no new requests.
    Draining,
}

/// Value of `pools/{pool}`, written by rank 0 under its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct PoolRecord {
    pub model: String,
    /// Tensor-parallel degree = number of ranks.
    pub tp: u32,
    /// `http://host:port` of rank 0's worker gRPC service.
    pub leader_addr: String,
    pub state: PoolState,
    pub max_model_len: u32,
    /// The digest of the pool's text side (`ModelInfo.text_digest`): a gateway refetches the
    /// tokenizer when it changes, and sends a request only to pools with the digest it was
    /// tokenized under. Absent in records of older workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_digest: Option<String>,
    /// The LoRA adapters the pool serves beside `model` (`ModelInfo.lora`): requests for
    /// these names go to it too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lora: Vec<String>,
}

impl PoolRecord {
    /// Whether the pool serves requests for `name`: its model, or one of its adapters.
    pub fn serves(&self, name: &str) -> bool {
        self.model == name || self.lora.iter().any(|l| l == name)
    }
}

/// Value of `pools/{pool}/ranks/{rank}`, written by that rank under its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct RankRecord {
    /// `http://host:port` of this rank's worker gRPC service.
    pub addr: String,
    /// `GPU-…` UUID; `None` on the CPU backend.
    pub gpu_uuid: Option<String>,
    pub node: String,
}

/// Value of `pools/{pool}/nccl`, written by rank 0 under its lease: how the ranks of this
/// incarnation (epoch) of the pool reach each other.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct CommRecord {
    /// Changes with every start of rank 0; a rank joining with another epoch is refused.
    pub epoch: u64,
    /// `tcp` (the CPU backend); `nccl` with the GPU pools.
    pub backend: String,
    /// `host:port` of rank 0's collective listener (`tcp`).
    pub address: String,
    /// Ranks in the pool.
    pub world: u32,
}

/// Serializes a record for [`crate::Store::put`].
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    // Our records are plain structs with string keys, which serde_json cannot
    // fail on; an empty value would be rejected by `decode` rather than trusted.
    serde_json::to_vec(record).unwrap_or_default()
}

/// Parses the record stored under `key`.
pub fn decode<T: DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, PlacementError> {
    serde_json::from_slice(value).map_err(|source| PlacementError::Decode {
        key: key.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_and_parse_round_trip() {
        let s = KeySchema::new("/ferrite/v1/");
        let keys = [
            Key::Pool("p0".into()),
            Key::Rank("p0".into(), 3),
            Key::Nccl("p0".into()),
            Key::Node("gpu-node-1".into()),
            Key::Model("HuggingFaceTB/SmolLM2-135M".into()),
        ];
        for k in keys {
            let full = s.key(&k);
            assert!(full.starts_with("/ferrite/v1/"), "{full}");
            assert_eq!(s.parse(&full), Some(k));
        }
        assert_eq!(s.rank("p", 7), "/ferrite/v1/pools/p/ranks/7");
        assert!(s.rank("p", 7).starts_with(&s.pools_prefix()));
    }

    #[test]
    fn parse_rejects_foreign_and_malformed_keys() {
        let s = KeySchema::default();
        for bad in [
            "/ferrite/v10/pools/p",
            "/other/pools/p",
            "/ferrite/v1/pools/",
            "/ferrite/v1/pools/p/ranks/x",
            "/ferrite/v1/pools/p/ranks/01",
            "/ferrite/v1/pools/p/ranks/1/extra",
            "/ferrite/v1/pools/p/other",
            "/ferrite/v1/nodes/a/b",
            "/ferrite/v1/unknown/x",
            "/ferrite/v1",
        ] {
            assert_eq!(s.parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn records_are_snake_case_json() {
        let rec = PoolRecord {
            model: "m".into(),
            tp: 2,
            leader_addr: "http://127.0.0.1:1".into(),
            state: PoolState::Ready,
            max_model_len: 4096,
            text_digest: Some("0123456789abcdef".into()),
            lora: vec!["sql".into()],
        };
        let json = String::from_utf8(encode(&rec)).expect("utf8");
        assert!(json.contains(r#""state":"ready""#), "{json}");
        assert!(json.contains(r#""leader_addr""#), "{json}");
        assert_eq!(
            decode::<PoolRecord>("k", json.as_bytes()).expect("decode"),
            rec
        );
        let err = decode::<RankRecord>("k", b"{").expect_err("bad json");
        assert_eq!(err.kind(), "decode");
    }
}
