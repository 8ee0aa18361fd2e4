//! `Registration`: a worker's keys, kept alive under a lease for as long as the
//! handle lives, through etcd outages.
//!
//! The keys and the lease are owned by one task (an actor); the handle talks to
//! it over a channel, so there is no shared mutable state. The task's loop:
//!
//! - no lease: grant one, put every entry under it → `Registered`;
//! - lease: every ttl/3, one keep-alive. `Ok(true)`: fine (and re-put entries
//!   whose last write failed). `Ok(false)`: the lease expired while etcd was
//!   unreachable (or it was revoked), so the keys are gone → grant a new lease
//!   and put everything again, at once;
//! - any error (etcd down, timeout): retry soon, with backoff capped at
//!   min(1 s, ttl/3), forever. A registration started while etcd is down
//!   therefore registers as soon as etcd answers.
//!
//! `deregister()` revokes the lease (keys vanish at once); dropping the handle
//! stops the task without revoking, so the keys vanish after the TTL, exactly
//! as if the process had crashed.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::lease::ttl_secs;
use crate::retry::Backoff;
use crate::watch::AbortOnDrop;
use crate::{LeaseId, PlacementError, Store};

/// Where a [`Registration`] stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistrationState {
    /// Trying to (re-)register: etcd not reachable yet, or the lease was lost
    /// and the keys are (or soon will be) absent.
    Registering,
    /// All entries were written under this lease and it was alive at the last
    /// keep-alive.
    Registered(LeaseId),
    /// Deregistered, or the task ended.
    Stopped,
}

/// Handle of a running registration (see the module doc).
#[derive(Debug)]
pub struct Registration {
    commands: mpsc::Sender<Command>,
    state: watch::Receiver<RegistrationState>,
    _task: AbortOnDrop,
}

type Reply = oneshot::Sender<Result<(), PlacementError>>;

#[derive(Debug)]
enum Command {
    Update {
        key: String,
        value: Vec<u8>,
        done: Reply,
    },
    Deregister {
        done: Reply,
    },
}

impl Registration {
    /// Starts registering `entries` (key, value) under a lease of `ttl` (whole
    /// seconds, rounded up). Returns at once; the task keeps trying until it
    /// succeeds (watch [`Registration::state`]). Call inside a Tokio runtime.
    pub fn start(store: Store, ttl: Duration, entries: Vec<(String, Vec<u8>)>) -> Self {
        let (commands, rx) = mpsc::channel(16);
        let (state_tx, state) = watch::channel(RegistrationState::Registering);
        let ttl = Duration::from_secs(ttl_secs(ttl).unsigned_abs());
        let keeper = Keeper {
            store,
            ttl,
            entries: entries.into_iter().collect(),
            lease: None,
            dirty: true,
            failures: 0,
            state: state_tx,
        };
        let task = tokio::spawn(keeper.run(rx));
        Self {
            commands,
            state,
            _task: AbortOnDrop(task),
        }
    }

    pub fn state(&self) -> RegistrationState {
        *self.state.borrow()
    }

    pub fn is_registered(&self) -> bool {
        matches!(self.state(), RegistrationState::Registered(_))
    }

    /// A receiver that sees every state change (e.g. to log re-registrations).
    pub fn subscribe(&self) -> watch::Receiver<RegistrationState> {
        self.state.clone()
    }

    /// Waits until registered; returns the lease. Never returns while etcd is
    /// down: wrap it in a timeout if the caller must give up.
    pub async fn registered(&self) -> Result<LeaseId, PlacementError> {
        let mut rx = self.state.clone();
        let state = rx
            .wait_for(|s| *s != RegistrationState::Registering)
            .await
            .map(|s| *s)
            .map_err(|_| PlacementError::Stopped)?;
        match state {
            RegistrationState::Registered(lease) => Ok(lease),
            _ => Err(PlacementError::Stopped),
        }
    }

    /// Sets `key` (new or one of the entries) and writes it under the current
    /// lease. Returns once written; while not registered, once recorded (it is
    /// written with the others on registration). An `Err` means a write failed;
    /// the value is kept and re-written once etcd answers again.
    pub async fn update(
        &self,
        key: impl Into<String>,
        value: Vec<u8>,
    ) -> Result<(), PlacementError> {
        let (done, reply) = oneshot::channel();
        let key = key.into();
        self.send(Command::Update { key, value, done }, reply).await
    }

    /// Revokes the lease: every entry disappears at once. If etcd is
    /// unreachable this fails and the keys disappear after the TTL instead.
    pub async fn deregister(self) -> Result<(), PlacementError> {
        let (done, reply) = oneshot::channel();
        self.send(Command::Deregister { done }, reply).await
    }

    async fn send(
        &self,
        command: Command,
        reply: oneshot::Receiver<Result<(), PlacementError>>,
    ) -> Result<(), PlacementError> {
        self.commands
            .send(command)
            .await
            .map_err(|_| PlacementError::Stopped)?;
        reply.await.map_err(|_| PlacementError::Stopped)?
    }
}

/// The task's state: the only owner of the entries and the lease.
struct Keeper {
    store: Store,
    ttl: Duration,
    entries: BTreeMap<String, Vec<u8>>,
    lease: Option<LeaseId>,
    /// Some entry may not be in the store under `lease` (a write failed, or
    /// there is no lease yet).
    dirty: bool,
    /// Consecutive failed ticks, to log the first one loudly and the rest quietly.
    failures: u32,
    state: watch::Sender<RegistrationState>,
}

impl Keeper {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let interval = self.ttl / 3;
        let mut backoff = Backoff::new(
            Duration::from_millis(100),
            interval.min(Duration::from_secs(1)),
        );
        let mut next_tick = Instant::now();
        loop {
            tokio::select! {
                // Commands first: an update should not wait behind a tick.
                biased;
                command = commands.recv() => match command {
                    // Handle gone without deregistering (normally it aborts us
                    // first): stop, leave the keys to the TTL.
                    None => break,
                    Some(Command::Update { key, value, done }) => {
                        let result = self.update(key, value).await;
                        if self.lease.is_none() {
                            next_tick = Instant::now();
                        }
                        let _ = done.send(result);
                    }
                    Some(Command::Deregister { done }) => {
                        let result = self.deregister().await;
                        let _ = done.send(result);
                        break;
                    }
                },
                _ = tokio::time::sleep_until(next_tick) => {
                    next_tick = match self.tick().await {
                        Ok(()) => {
                            backoff.reset();
                            Instant::now() + interval
                        }
                        Err(e) => {
                            self.log_failure(&e);
                            Instant::now() + backoff.next_delay()
                        }
                    };
                }
            }
        }
        self.state.send_replace(RegistrationState::Stopped);
    }

    /// One round: keep the lease alive (or notice it is gone) and make sure every
    /// entry is written under a live lease.
    async fn tick(&mut self) -> Result<(), PlacementError> {
        if let Some(lease) = self.lease
            && !self.store.keep_alive_once(lease).await?
        {
            tracing::warn!(%lease, "registration lease expired; registering again");
            self.lost_lease();
        }
        let lease = match self.lease {
            Some(lease) => lease,
            None => {
                let lease = self.store.grant_lease(self.ttl).await?;
                self.lease = Some(lease);
                self.dirty = true;
                lease
            }
        };
        if self.dirty {
            self.put_all(lease).await?;
        }
        if self.failures > 0 || *self.state.borrow() != RegistrationState::Registered(lease) {
            tracing::info!(%lease, keys = self.entries.len(), "registered");
        }
        self.failures = 0;
        self.state
            .send_replace(RegistrationState::Registered(lease));
        Ok(())
    }

    async fn put_all(&mut self, lease: LeaseId) -> Result<(), PlacementError> {
        for (key, value) in &self.entries {
            if let Err(e) = self.store.put(key, value.clone(), Some(lease)).await {
                if matches!(e, PlacementError::LeaseNotFound(_)) {
                    self.lost_lease();
                }
                return Err(e);
            }
        }
        self.dirty = false;
        Ok(())
    }

    async fn update(&mut self, key: String, value: Vec<u8>) -> Result<(), PlacementError> {
        self.entries.insert(key.clone(), value.clone());
        let Some(lease) = self.lease else {
            return Ok(());
        };
        let result = self.store.put(&key, value, Some(lease)).await;
        match &result {
            Ok(()) => {}
            Err(PlacementError::LeaseNotFound(_)) => self.lost_lease(),
            Err(_) => self.dirty = true,
        }
        result
    }

    async fn deregister(&mut self) -> Result<(), PlacementError> {
        match self.lease.take() {
            Some(lease) => self.store.revoke_lease(lease).await,
            None => Ok(()),
        }
    }

    fn lost_lease(&mut self) {
        self.lease = None;
        self.dirty = true;
        self.state.send_replace(RegistrationState::Registering);
    }

    fn log_failure(&mut self, e: &PlacementError) {
        if self.failures == 0 {
            tracing::warn!(error = %e, kind = e.kind(), "registration keep-alive failed; retrying");
        } else {
            tracing::debug!(error = %e, failures = self.failures, "registration retry failed");
        }
        self.failures = self.failures.saturating_add(1);
    }
}
