//! One writer per run: an exclusive lease in the run's store.
//!
//! `Run::create` and `Run::open` (what `sesa run` and `sesa resume` call) take the lease
//! before they write anything: `lease.json` in the run's directory, written only if absent (a
//! conditional create, which local directories and S3 both support, so of two processes
//! racing for it exactly one wins). It names its holder (host, pid, start time) and carries a
//! heartbeat, renewed every [`HEARTBEAT`] while the run executes, and it is deleted when the
//! run stops. A second writer is refused with who holds the lease, unless the holder is gone:
//! on the same host, when its pid is not alive; elsewhere, when its heartbeat is older than
//! [`STALE_AFTER`]. Then, or with `force`, the lease is taken over.
//!
//! Taking over is a delete then a create, so two processes taking over the same stale lease
//! at once could both believe they hold it. Two guards close that gap: the heartbeat re-reads
//! the lease before renewing it, and a writer that finds someone else's stops before its next
//! commit; and step commits are themselves created only if absent, so no step is ever
//! committed twice.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::RunError;
use crate::manifest::now;
use crate::store::ArtifactStore;

/// The lease's key in a run's directory.
pub const LEASE: &str = "lease.json";

/// How often a running writer renews its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// How old a heartbeat of another host may be before its lease counts as abandoned.
pub const STALE_AFTER: Duration = Duration::from_secs(120);

/// Who holds a run's lease, as written in `lease.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHolder {
    /// The host the writer runs on.
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// When it took the lease (RFC 3339).
    pub started_at: String,
    /// Its last heartbeat, in seconds since the Unix epoch.
    pub heartbeat_at: u64,
    /// Tells this holder's lease from a later one of the same process.
    pub token: String,
}

impl std::fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on {} since {}", self.pid, self.host, self.started_at)
    }
}

/// Whether a lease's holder is still writing, as far as this process can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// It is alive (same host: its pid is; elsewhere: its heartbeat is recent).
    Alive,
    /// It is gone, for the reason given.
    Gone(String),
}

impl LeaseHolder {
    fn mine() -> LeaseHolder {
        LeaseHolder {
            host: host_name(),
            pid: std::process::id(),
            started_at: now(),
            heartbeat_at: unix_now(),
            token: format!("{:016x}", rand::random::<u64>()),
        }
    }

    /// Whether this holder is alive, seen from this process.
    pub fn liveness(&self) -> Liveness {
        if self.host == host_name() {
            // A process never competes with itself: a lease of this pid was left by a run
            // this process dropped.
            if self.pid == std::process::id() {
                return Liveness::Gone("left by this process".into());
            }
            return if process_alive(self.pid) {
                Liveness::Alive
            } else {
                Liveness::Gone(format!("pid {} is not running on this host", self.pid))
            };
        }
        let age = unix_now().saturating_sub(self.heartbeat_at);
        if age > STALE_AFTER.as_secs() {
            Liveness::Gone(format!("its last heartbeat is {age} s old"))
        } else {
            Liveness::Alive
        }
    }
}

/// The lease of the run in `store`, if any.
pub async fn read_lease(store: &ArtifactStore) -> Result<Option<LeaseHolder>, RunError> {
    let Some(bytes) = store.get(LEASE).await? else { return Ok(None) };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| RunError::Corrupt { location: store.describe(LEASE), reason: e.to_string() })
}

/// A lease this process holds, renewed in the background while it lives.
pub(crate) struct Lease {
    store: ArtifactStore,
    holder: LeaseHolder,
    /// Set by the heartbeat when the lease is no longer ours: who holds it now.
    lost: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    /// How often to renew ([`HEARTBEAT`]; shorter in tests).
    interval: Duration,
}

impl Lease {
    /// Takes the lease of the run in `store`: refused while another live writer holds it,
    /// taken over from one that is gone (or from anyone with `force`).
    pub(crate) async fn acquire(store: &ArtifactStore, force: bool) -> Result<Lease, RunError> {
        let mine = LeaseHolder::mine();
        // A few times: a holder may release the lease between our create and our read.
        for _ in 0..3 {
            if store.create(LEASE, encode(&mine)?).await? {
                return Ok(Lease {
                    store: store.clone(),
                    holder: mine,
                    lost: Default::default(),
                    heartbeat: None,
                    interval: HEARTBEAT,
                });
            }
            let Some(current) = read_lease(store).await? else { continue };
            match current.liveness() {
                Liveness::Alive if !force => {
                    return Err(RunError::Held { location: store.describe(""), holder: current.to_string() });
                }
                Liveness::Alive => tracing::warn!("taking over the lease of {current} (--force)"),
                Liveness::Gone(why) => tracing::info!("taking over the lease of {current}: {why}"),
            }
            store.delete(LEASE).await?;
        }
        Err(RunError::Held { location: store.describe(""), holder: "writers that keep replacing the lease".into() })
    }

    /// Starts renewing the heartbeat (once the run executes).
    pub(crate) fn keep_alive(&mut self) {
        if self.heartbeat.is_some() {
            return;
        }
        let (store, mut holder, lost) = (self.store.clone(), self.holder.clone(), self.lost.clone());
        let interval = self.interval;
        self.heartbeat = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                match read_lease(&store).await {
                    Ok(Some(current)) if current.token == holder.token => {
                        holder.heartbeat_at = unix_now();
                        let renewed = match encode(&holder) {
                            Ok(bytes) => store.put(LEASE, bytes).await.map_err(|e| e.to_string()),
                            Err(e) => Err(e.to_string()),
                        };
                        if let Err(error) = renewed {
                            tracing::warn!("cannot renew the run's lease: {error}");
                        }
                    }
                    Ok(current) => {
                        let taker = current.map_or_else(|| "nobody (it was deleted)".into(), |c| c.to_string());
                        *lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(taker);
                        return;
                    }
                    Err(error) => tracing::warn!("cannot read the run's lease: {error}"),
                }
            }
        }));
    }

    /// Fails when another writer has taken the lease: the run must not commit any more.
    pub(crate) fn check(&self) -> Result<(), RunError> {
        match &*self.lost.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Ok(()),
            Some(taker) => Err(RunError::LeaseLost { location: self.store.describe(""), holder: taker.clone() }),
        }
    }

    /// Stops the heartbeat and deletes the lease if it is still ours.
    pub(crate) async fn release(mut self) -> Result<(), RunError> {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
        if read_lease(&self.store).await?.is_some_and(|current| current.token == self.holder.token) {
            self.store.delete(LEASE).await?;
        }
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
    }
}

fn encode(holder: &LeaseHolder) -> Result<Bytes, RunError> {
    serde_json::to_vec_pretty(holder).map(Bytes::from).map_err(|e| RunError::Internal(e.to_string()))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// This machine's name, as the kernel reports it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown-host".into())
}

/// Whether a process of this host is alive: it exists and is not a zombie (a killed process
/// its parent has not reaped yet).
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may hold anything.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

#[cfg(test)]
mod tests;
