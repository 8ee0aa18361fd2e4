//! The responses a gateway keeps for the Responses API (`store`, true unless a request says
//! false, as OpenAI's): the last [`CAPACITY`], in this gateway's memory, for a later request's
//! `previous_response_id` and for `GET`/`DELETE /v1/responses/{id}`. A gateway that restarts,
//! or another replica behind the same address, does not have them: such a request is told so.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use serde_json::Value;

/// Responses kept; the oldest go first.
pub const CAPACITY: usize = 1024;

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
    entries: HashMap<String, Stored>,
}

impl ResponseStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn put(&self, id: String, stored: Stored) {
        let mut inner = self.lock();
        if inner.entries.insert(id.clone(), stored).is_none() {
            inner.order.push_back(id);
        }
        while inner.order.len() > CAPACITY {
            if let Some(old) = inner.order.pop_front() {
                inner.entries.remove(&old);
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.lock().entries.get(id).cloned()
    }

    /// Whether it was there.
    pub fn remove(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let found = inner.entries.remove(id).is_some();
        inner.order.retain(|k| k != id);
        found
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
    }
}
