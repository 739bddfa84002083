//! Leader election on a `coordination.k8s.io/v1` Lease: one replica programs the daemons, the
//! others wait. The holder renews every third of the lease; another replica takes the Lease
//! only once it has gone unrenewed for its whole duration, and every write names the
//! resourceVersion it read, so two replicas can never both believe they hold it. A holder
//! that cannot renew within two thirds of the lease stops programming at once and waits to be
//! elected again (`run_async` in lib.rs); the process goes on.
//!
//! The Lease is read and written through [`LeaseStore`] (kube-apiserver in production, memory
//! in the tests) and time is tokio's, so the tests run the election on a paused clock.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// Why a read or write of the Lease failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone wrote it since we read it (409).
    #[error("the lease changed since it was read")]
    Conflict,
    #[error("{0}")]
    Api(String),
}

/// Where the Lease is kept.
pub trait LeaseStore: Send + Sync {
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, LeaseError>> + Send;
    /// Fails with [`LeaseError::Conflict`] when it exists.
    fn create(&self, l: &Lease) -> impl Future<Output = Result<(), LeaseError>> + Send;
    /// Fails with [`LeaseError::Conflict`] when its resourceVersion is not the stored one.
    fn replace(&self, l: &Lease) -> impl Future<Output = Result<(), LeaseError>> + Send;
}

/// The Lease in kube-apiserver.
pub struct KubeLease {
    api: Api<Lease>,
    name: String,
}

fn lease_error(e: kube::Error) -> LeaseError {
    match e {
        kube::Error::Api(s) if s.code == 409 => LeaseError::Conflict,
        e => LeaseError::Api(e.to_string()),
    }
}

impl LeaseStore for KubeLease {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        self.api.get_opt(&self.name).await.map_err(lease_error)
    }
    async fn create(&self, l: &Lease) -> Result<(), LeaseError> {
        self.api.create(&PostParams::default(), l).await.map(drop).map_err(lease_error)
    }
    async fn replace(&self, l: &Lease) -> Result<(), LeaseError> {
        self.api.replace(&self.name, &PostParams::default(), l).await.map(drop).map_err(lease_error)
    }
}

pub struct Elector<S: LeaseStore = KubeLease> {
    store: S,
    name: String,
    identity: String,
    seconds: u32,
    /// When we last renewed (our clock), while we hold the Lease.
    renewed: Option<Instant>,
    /// Someone else's Lease as last seen: (its resourceVersion, its renewTime), and when we
    /// first saw that version (our clock; their clock is not trusted).
    observed: Option<(String, Instant)>,
}

pub enum State {
    Leader,
    Follower(Option<String>),
}

impl Elector<KubeLease> {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, seconds: u32) -> Elector<KubeLease> {
        Elector::with(KubeLease { api: Api::namespaced(client, namespace), name: name.into() }, name, identity, seconds)
    }
}

impl<S: LeaseStore> Elector<S> {
    pub fn with(store: S, name: &str, identity: &str, seconds: u32) -> Elector<S> {
        Elector { store, name: name.into(), identity: identity.into(), seconds, renewed: None, observed: None }
    }

    pub fn period(&self) -> Duration {
        Duration::from_secs(u64::from(self.seconds)) / 3
    }

    /// Whether a holder that last renewed at `renewed` must stop: it cannot be sure of the
    /// Lease any more (two thirds of it gone without a renewal).
    pub fn lost(&self) -> bool {
        self.renewed.is_some_and(|r| r.elapsed() > Duration::from_secs(u64::from(self.seconds)) * 2 / 3)
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.seconds as i32),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to acquire or renew.
    pub async fn step(&mut self) -> Result<State, LeaseError> {
        let cur = match self.store.get().await? {
            Some(l) => l,
            None => {
                let l = Lease { metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() }, spec: Some(self.spec(0, None)) };
                return match self.store.create(&l).await {
                    Ok(()) => {
                        self.renewed = Some(Instant::now());
                        Ok(State::Leader)
                    }
                    Err(LeaseError::Conflict) => Ok(State::Follower(None)),
                    Err(e) => Err(e),
                };
            }
        };
        let spec = cur.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let version = cur.metadata.resource_version.clone().unwrap_or_default();
        let mine = holder.as_deref() == Some(self.identity.as_str());
        if !mine && holder.is_some() {
            // Expired only when the same version has stood for its whole duration by our clock.
            let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(self.seconds as i32).max(1) as u64);
            let first_seen = match &self.observed {
                Some((v, t)) if *v == version => *t,
                _ => {
                    self.observed = Some((version.clone(), Instant::now()));
                    Instant::now()
                }
            };
            self.renewed = None;
            if first_seen.elapsed() < duration {
                return Ok(State::Follower(holder));
            }
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquired = if mine { spec.acquire_time.clone() } else { None };
        let mut next = cur.clone();
        next.spec = Some(self.spec(transitions, acquired));
        match self.store.replace(&next).await {
            Ok(()) => {
                self.renewed = Some(Instant::now());
                self.observed = None;
                Ok(State::Leader)
            }
            // Someone wrote it since we read it: they hold it.
            Err(LeaseError::Conflict) => {
                self.renewed = None;
                Ok(State::Follower(holder))
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up (on a clean stop), so a successor need not wait for it to expire.
    pub async fn release(&mut self) {
        if self.renewed.take().is_none() {
            return;
        }
        if let Ok(Some(mut l)) = self.store.get().await {
            if l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.identity.as_str()) {
                if let Some(s) = l.spec.as_mut() {
                    s.holder_identity = None;
                    s.renew_time = None;
                }
                let _ = self.store.replace(&l).await;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    /// A Lease in memory, with kube-apiserver's optimistic concurrency: a write must name the
    /// resourceVersion it read.
    #[derive(Default)]
    pub struct MemLease {
        pub lease: Mutex<Option<Lease>>,
        /// Answer nothing (kube-apiserver away).
        pub down: AtomicBool,
        /// Written by another replica between the next replace's read and its write.
        pub sneak: Mutex<Option<Lease>>,
    }

    impl MemLease {
        pub fn holder(&self) -> Option<String> {
            self.lease.lock().unwrap().as_ref().and_then(|l| l.spec.as_ref()?.holder_identity.clone())
        }
    }

    fn stored(l: &Lease, version: u64) -> Lease {
        let mut l = l.clone();
        l.metadata.resource_version = Some(version.to_string());
        l
    }

    impl LeaseStore for Arc<MemLease> {
        async fn get(&self) -> Result<Option<Lease>, LeaseError> {
            if self.down.load(Ordering::Relaxed) {
                return Err(LeaseError::Api("connection refused".into()));
            }
            Ok(self.lease.lock().unwrap().clone())
        }
        async fn create(&self, l: &Lease) -> Result<(), LeaseError> {
            if self.down.load(Ordering::Relaxed) {
                return Err(LeaseError::Api("connection refused".into()));
            }
            let mut cur = self.lease.lock().unwrap();
            if cur.is_some() {
                return Err(LeaseError::Conflict);
            }
            *cur = Some(stored(l, 1));
            Ok(())
        }
        async fn replace(&self, l: &Lease) -> Result<(), LeaseError> {
            if self.down.load(Ordering::Relaxed) {
                return Err(LeaseError::Api("connection refused".into()));
            }
            let mut cur = self.lease.lock().unwrap();
            if let Some(other) = self.sneak.lock().unwrap().take() {
                let v = cur.as_ref().and_then(|c| c.metadata.resource_version.clone()).unwrap_or_default().parse::<u64>().unwrap_or(0);
                *cur = Some(stored(&other, v + 1));
            }
            let have = cur.as_ref().and_then(|c| c.metadata.resource_version.clone()).unwrap_or_default();
            if l.metadata.resource_version.as_deref() != Some(have.as_str()) {
                return Err(LeaseError::Conflict);
            }
            let next = have.parse::<u64>().unwrap_or(0) + 1;
            *cur = Some(stored(l, next));
            Ok(())
        }
    }

    fn leader(s: &Result<State, LeaseError>) -> bool {
        matches!(s, Ok(State::Leader))
    }

    #[tokio::test(start_paused = true)]
    async fn one_replica_leads_and_another_takes_over_only_once_the_lease_has_expired() {
        let store = Arc::new(MemLease::default());
        let mut a = Elector::with(store.clone(), "vectorlb", "a", 15);
        let mut b = Elector::with(store.clone(), "vectorlb", "b", 15);
        assert!(leader(&a.step().await), "the first replica creates the Lease");
        assert!(matches!(b.step().await, Ok(State::Follower(Some(h))) if h == "a"));
        // a renews every period: b never takes it.
        for _ in 0..10 {
            tokio::time::advance(a.period()).await;
            assert!(leader(&a.step().await));
            assert!(!leader(&b.step().await));
        }
        // a stops renewing. b waits the whole duration by its own clock from the version it
        // last saw, not by the holder's renewTime.
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(!leader(&b.step().await), "taken before the lease's duration");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(leader(&b.step().await), "not taken after the lease's duration");
        assert_eq!(store.holder().as_deref(), Some("b"));
        // a comes back: it is a follower now.
        assert!(matches!(a.step().await, Ok(State::Follower(Some(h))) if h == "b"));
        let transitions = store.lease.lock().unwrap().as_ref().unwrap().spec.as_ref().unwrap().lease_transitions;
        assert_eq!(transitions, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_that_cannot_renew_knows_it_has_lost() {
        let store = Arc::new(MemLease::default());
        let mut a = Elector::with(store.clone(), "vectorlb", "a", 15);
        assert!(leader(&a.step().await));
        store.down.store(true, Ordering::Relaxed);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(a.step().await.is_err());
        assert!(!a.lost(), "9 s of 15: still safe");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(a.step().await.is_err());
        assert!(a.lost(), "past two thirds of the lease without a renewal");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_names_a_version_someone_else_replaced_loses() {
        let store = Arc::new(MemLease::default());
        let mut a = Elector::with(store.clone(), "vectorlb", "a", 15);
        assert!(leader(&a.step().await));
        let mut b = Elector::with(store.clone(), "vectorlb", "b", 15);
        assert!(!leader(&b.step().await));
        tokio::time::advance(Duration::from_secs(15)).await;
        // b and c both see a's Lease expire; c writes between b's read and b's write.
        let mut c_lease = store.lease.lock().unwrap().clone().unwrap();
        c_lease.spec.as_mut().unwrap().holder_identity = Some("c".into());
        *store.sneak.lock().unwrap() = Some(c_lease);
        assert!(!leader(&b.step().await), "b took a lease c had written since b read it");
        assert_eq!(store.holder().as_deref(), Some("c"));
        assert!(!b.lost() && matches!(b.step().await, Ok(State::Follower(Some(h))) if h == "c"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_is_taken_at_once() {
        let store = Arc::new(MemLease::default());
        let mut a = Elector::with(store.clone(), "vectorlb", "a", 15);
        let mut b = Elector::with(store.clone(), "vectorlb", "b", 15);
        assert!(leader(&a.step().await));
        assert!(!leader(&b.step().await));
        a.release().await;
        assert!(leader(&b.step().await), "a successor waited for a released lease");
    }
}
