//! API keys: `Authorization: Bearer KEY` on the HTTP API and the same metadata on the gRPC
//! API. Keys come from a file (one per line; blank lines and `#` comments skipped) or a
//! comma-separated list, and are held as SHA-256 digests compared in constant time, so neither
//! a key's length nor a matching prefix shows in the time an answer takes.
//!
//! Health, reflection and `/metrics` stay open: probes and scrapers carry no key.

use std::path::Path;

use sha2::{Digest, Sha256};

/// The accepted keys. No keys means no check.
#[derive(Clone, Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys, not even their digests.
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

/// Who a request came from, for rate limits: the key it bore (by its place in the list), or
/// everyone alike when the gateway has no keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Caller {
    #[default]
    Anonymous,
    Key(usize),
}

/// Why a request was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer …`.
    Missing,
    /// A key that is not one of ours.
    Wrong,
}

impl Denied {
    pub fn message(self) -> &'static str {
        match self {
            Denied::Missing => "no API key: send `Authorization: Bearer <key>`",
            Denied::Wrong => "the API key is not valid",
        }
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equal in time independent of where the first difference lies.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl ApiKeys {
    /// Keys from `list`, trimmed; empty entries skipped.
    pub fn from_keys<'a>(list: impl IntoIterator<Item = &'a str>) -> Self {
        let digests = list
            .into_iter()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(digest)
            .collect();
        Self { digests }
    }

    /// Keys from a file of one key per line (`#` starts a comment line).
    pub fn from_file(path: &Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        Ok(Self::from_keys(
            text.lines().filter(|l| !l.trim_start().starts_with('#')),
        ))
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Checks an `Authorization` header value and says whose key it is. Every key is
    /// compared, whichever matches.
    pub fn check(&self, authorization: Option<&str>) -> Result<Caller, Denied> {
        if self.is_empty() {
            return Ok(Caller::Anonymous);
        }
        let key = authorization
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or(Denied::Missing)?;
        let d = digest(key);
        let matches: Vec<bool> = self.digests.iter().map(|k| same(k, &d)).collect();
        matches
            .iter()
            .position(|&m| m)
            .map(Caller::Key)
            .ok_or(Denied::Wrong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listed_key_after_bearer_gets_in() {
        let keys = ApiKeys::from_keys("k1, k2 ,,".split(','));
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.check(Some("Bearer k1")), Ok(Caller::Key(0)));
        assert_eq!(keys.check(Some("Bearer k2")), Ok(Caller::Key(1)));
        assert_eq!(keys.check(Some("Bearer k3")), Err(Denied::Wrong));
        assert_eq!(keys.check(Some("Bearer k")), Err(Denied::Wrong));
        assert_eq!(keys.check(Some("Bearer k1x")), Err(Denied::Wrong));
        assert_eq!(keys.check(Some("k1")), Err(Denied::Missing));
        assert_eq!(keys.check(Some("Bearer ")), Err(Denied::Missing));
        assert_eq!(keys.check(None), Err(Denied::Missing));
        assert!(!format!("{keys:?}").contains("k1"));
    }

    #[test]
    fn no_keys_means_no_check() {
        assert_eq!(ApiKeys::default().check(None), Ok(Caller::Anonymous));
    }

    #[test]
    fn a_key_file_skips_comments_and_blank_lines() {
        let path = std::env::temp_dir().join(format!("ferrite-keys-{}", std::process::id()));
        std::fs::write(&path, "# team a\nalpha\n\n  beta  \n#gamma\n").expect("write");
        let keys = ApiKeys::from_file(&path).expect("read");
        let _ = std::fs::remove_file(&path);
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.check(Some("Bearer beta")), Ok(Caller::Key(1)));
        assert_eq!(keys.check(Some("Bearer gamma")), Err(Denied::Wrong));
    }
}
