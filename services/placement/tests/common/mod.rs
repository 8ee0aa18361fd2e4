//! Shared fixtures: a store per backend, and helpers to follow a watch.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::time::Duration;

use ferrite_placement::testing::EtcdServer;
use ferrite_placement::{Store, Watch, WatchEvent};

/// A store plus whatever keeps it alive (the etcd process).
pub struct Backend {
    pub store: Store,
    pub etcd: Option<EtcdServer>,
}

pub fn embedded() -> Backend {
    Backend {
        store: Store::embedded(),
        etcd: None,
    }
}

pub async fn etcd() -> Backend {
    let etcd = EtcdServer::start();
    let store = Store::connect(&etcd.endpoints(), "/ferrite/test")
        .await
        .expect("connect");
    Backend {
        store,
        etcd: Some(etcd),
    }
}

/// Runs one async test body against each backend, as `embedded` and `etcd`
/// tests in a module named after the body.
#[macro_export]
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                super::$name(super::common::embedded()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                super::$name(super::common::etcd().await).await;
            }
        }
    };
}

/// The next event, or a panic after `within`.
pub async fn next_event(watch: &mut Watch, within: Duration) -> WatchEvent {
    tokio::time::timeout(within, watch.recv())
        .await
        .expect("no watch event in time")
        .expect("watch closed")
}

/// A consumer's mirror of the watched prefix, with the events that built it.
#[derive(Default, Debug)]
pub struct Mirror {
    pub state: BTreeMap<String, Vec<u8>>,
    pub events: Vec<WatchEvent>,
}

impl Mirror {
    /// Applies events until `done(state)` holds; panics after `within`.
    pub async fn until(
        &mut self,
        watch: &mut Watch,
        within: Duration,
        done: impl Fn(&BTreeMap<String, Vec<u8>>) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + within;
        while !done(&self.state) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let event = tokio::time::timeout(left, watch.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "condition not reached within {within:?}; state keys {:?}; events {:?}",
                        self.state.keys().collect::<Vec<_>>(),
                        self.events
                    )
                })
                .expect("watch closed");
            self.events.push(event.clone());
            event.apply(&mut self.state);
        }
    }
}
