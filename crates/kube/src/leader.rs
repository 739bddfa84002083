//! Leader election on a `coordination.k8s.io/v1` Lease: one replica programs the daemons, the
//! others wait. The holder renews every third of the lease; another replica takes the Lease
//! only once it has gone unrenewed for its whole duration, and every write names the
//! resourceVersion it read, so two replicas can never both believe they hold it. A holder
//! that cannot renew in time stops (the process exits and is restarted).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use std::time::{Duration, Instant};

pub struct Elector {
    api: Api<Lease>,
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

impl Elector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, seconds: u32) -> Elector {
        Elector { api: Api::namespaced(client, namespace), name: name.into(), identity: identity.into(), seconds, renewed: None, observed: None }
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
    pub async fn step(&mut self) -> Result<State, kube::Error> {
        let cur = match self.api.get_opt(&self.name).await? {
            Some(l) => l,
            None => {
                let l = Lease { metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() }, spec: Some(self.spec(0, None)) };
                return match self.api.create(&PostParams::default(), &l).await {
                    Ok(_) => {
                        self.renewed = Some(Instant::now());
                        Ok(State::Leader)
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(State::Follower(None)),
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
        match self.api.replace(&self.name, &PostParams::default(), &next).await {
            Ok(_) => {
                self.renewed = Some(Instant::now());
                self.observed = None;
                Ok(State::Leader)
            }
            // Someone wrote it since we read it: they hold it.
            Err(kube::Error::Api(e)) if e.code == 409 => {
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
        if let Ok(Some(mut l)) = self.api.get_opt(&self.name).await {
            if l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.identity.as_str()) {
                if let Some(s) = l.spec.as_mut() {
                    s.holder_identity = None;
                    s.renew_time = None;
                }
                let _ = self.api.replace(&self.name, &PostParams::default(), &l).await;
            }
        }
    }
}
