//! The responses a gateway keeps for the Responses API (`store`, true unless a request says
//! false, as OpenAI's): the last [`CAPACITY`] (and no more than [`MAX_BYTES`] of JSON), in this
//! gateway's memory, for a later request's
//! `previous_response_id` and for `GET`/`DELETE /v1/responses/{id}`. A gateway that restarts,
//! or another replica behind the same address, does not have them: such a request is told so.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use serde_json::Value;

/// Responses kept; the oldest go first.
pub const CAPACITY: usize = 1024;
/// The JSON text of the kept responses and their conversations, at most: long conversations
/// cannot grow the gateway without bound.
pub const MAX_BYTES: usize = 64 << 20;

/// A kept response: the whole conversation as input items (what came before it, its input,
/// its output), to continue from, and the response object, to show.
#[derive(Debug, Clone)]
pub struct Stored {
    pub items: Vec<Value>,
    pub response: Value,
}

#[derive(Debug, Default)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    order: VecDeque<String>,
    /// Each response with the size of its JSON text.
    entries: HashMap<String, (Stored, usize)>,
    bytes: usize,
}

impl Stored {
    fn size(&self) -> usize {
        let items: usize = self.items.iter().map(|v| v.to_string().len()).sum();
        items + self.response.to_string().len()
    }
}

impl ResponseStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn put(&self, id: String, stored: Stored) {
        let size = stored.size();
        let mut inner = self.lock();
        inner.forget(&id);
        inner.entries.insert(id.clone(), (stored, size));
        inner.order.push_back(id);
        inner.bytes += size;
        while inner.order.len() > CAPACITY || inner.bytes > MAX_BYTES {
            let Some(old) = inner.order.front().cloned() else {
                break;
            };
            inner.forget(&old);
        }
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.lock().entries.get(id).map(|(s, _)| s.clone())
    }

    /// Whether it was there.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().forget(id)
    }
}

impl Inner {
    fn forget(&mut self, id: &str) -> bool {
        let Some((_, size)) = self.entries.remove(id) else {
            return false;
        };
        self.bytes -= size;
        self.order.retain(|k| k != id);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_and_removed_ones_are_gone() {
        let store = ResponseStore::default();
        let stored = |n: usize| Stored {
            items: Vec::new(),
            response: Value::from(n),
        };
        for n in 0..CAPACITY + 2 {
            store.put(format!("resp_{n}"), stored(n));
        }
        assert!(store.get("resp_0").is_none() && store.get("resp_1").is_none());
        assert_eq!(
            store.get("resp_2").map(|s| s.response),
            Some(Value::from(2))
        );
        assert!(store.remove("resp_2") && !store.remove("resp_2"));
        assert!(store.get("resp_2").is_none());
        // A conversation of 40 MB pushes out what came before it once both exceed the cap.
        let big = |tag: &str| Stored {
            items: vec![Value::from("x".repeat(40 << 20))],
            response: Value::from(tag),
        };
        store.put("resp_big1".into(), big("1"));
        store.put("resp_big2".into(), big("2"));
        assert!(store.get("resp_big1").is_none() && store.get("resp_3").is_none());
        assert!(store.get("resp_big2").is_some());
    }
}
