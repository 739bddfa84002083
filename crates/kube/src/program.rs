//! Programs one daemon through its control API by difference: it compares what the daemon
//! serves with what it should and sends the changes as one batch (`POST /v1/batch`), so a
//! restarted controller or daemon converges without disturbing what is already right.

use crate::config::DaemonRef;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;
use vectorlb_api::model::{Batch, BatchDone, BatchOp, Health, NewBackend, NewService, PolicyChanges, PolicyStatus, Proto, SchedulerName, ServiceRef, ServiceStatus, SynProxyName};
use vectorlb_wire::call::Method;
use vectorlb_wire::{Api, CallError, ErrorKind};

/// A service's key on a daemon.
pub type Key = (Proto, IpAddr, u16);

pub fn key_of(s: &NewService) -> Key {
    (s.proto, s.vip, s.port)
}

/// Batches stay under the API's 1 MiB body limit.
const MAX_BATCH_BYTES: usize = 768 * 1024;
/// Batches sent in one round before the daemon is given up on (each refusal takes one
/// operation out and sends the rest again).
pub const MAX_ATTEMPTS: usize = 64;

/// What the controller needs of a daemon's API: the three calls it programs with. The daemon's
/// HTTP API ([`Api`]) in production; a fake in the tests.
pub trait Endpoint: Send + Sync {
    /// `GET /v1/health` (its report also when it answers 503).
    fn health(&self) -> impl Future<Output = Result<Health, CallError>> + Send;
    /// `GET /v1/services`.
    fn services(&self) -> impl Future<Output = Result<Vec<ServiceStatus>, CallError>> + Send;
    /// `POST /v1/batch`: all or nothing.
    fn batch(&self, b: &Batch) -> impl Future<Output = Result<BatchDone, CallError>> + Send;
    /// `GET /v1/policy`.
    fn policy(&self) -> impl Future<Output = Result<PolicyStatus, CallError>> + Send;
    /// `POST /v1/policy`: all or nothing.
    fn change_policy(&self, c: &PolicyChanges) -> impl Future<Output = Result<PolicyStatus, CallError>> + Send;
}

impl Endpoint for Api {
    async fn health(&self) -> Result<Health, CallError> {
        self.get_also("/v1/health", &[503]).await
    }
    async fn services(&self) -> Result<Vec<ServiceStatus>, CallError> {
        self.get("/v1/services").await
    }
    async fn batch(&self, b: &Batch) -> Result<BatchDone, CallError> {
        self.call(Method::POST, "/v1/batch", Some(b)).await
    }
    async fn policy(&self) -> Result<PolicyStatus, CallError> {
        self.get("/v1/policy").await
    }
    async fn change_policy(&self, c: &PolicyChanges) -> Result<PolicyStatus, CallError> {
        self.call(Method::POST, "/v1/policy", Some(c)).await
    }
}

/// Why a daemon could not be brought to what it should serve this round.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("daemon {daemon}: {error}")]
    Call { daemon: String, error: CallError },
    #[error("daemon {daemon}: token_file {path}: {error}")]
    Token { daemon: String, path: String, error: std::io::Error },
    #[error("daemon {0}: more than {MAX_ATTEMPTS} batches refused in one round")]
    TooManyRefused(String),
}

/// The most bytes of one `POST /v1/policy` body (the API takes up to 1 MiB).
pub const POLICY_PART_BYTES: usize = 512 * 1024;

pub struct Daemon<E: Endpoint = Api> {
    pub cfg: DaemonRef,
    api: E,
    /// What the daemon serves, as last read or written; None: read it again.
    known: Option<BTreeMap<Key, NewService>>,
    /// The daemon's configuration generation that `known` is of.
    generation: Option<u64>,
    /// The policy set the daemon holds, as last pushed, and its policy generation then.
    policy_known: Option<(crate::netpol::Compiled, u64)>,
}

/// What one round did on one daemon.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub put: usize,
    pub deleted: usize,
    /// Batches sent.
    pub batches: usize,
    /// Services the daemon refused: key → its message.
    pub refused: BTreeMap<Key, String>,
}

impl Daemon<Api> {
    pub fn new(cfg: DaemonRef) -> Result<Daemon<Api>, ProgramError> {
        let token = match &cfg.token_file {
            Some(p) => Some(std::fs::read_to_string(p).map_err(|error| ProgramError::Token { daemon: cfg.name.clone(), path: p.display().to_string(), error })?.trim().to_string()),
            None => None,
        };
        let mut api = Api::new(&cfg.api, token).map_err(|error| ProgramError::Call { daemon: cfg.name.clone(), error })?;
        api.options.connect_timeout = Duration::from_secs(2);
        Ok(Daemon::with(cfg, api))
    }
}

impl<E: Endpoint> Daemon<E> {
    pub fn with(cfg: DaemonRef, api: E) -> Daemon<E> {
        Daemon { cfg, api, known: None, generation: None, policy_known: None }
    }

    /// Forget what the daemon serves: the next round reads it again.
    pub fn invalidate(&mut self) {
        self.known = None;
        self.policy_known = None;
    }

    /// Brings the daemon's policy set to `want` by difference (from empty when the daemon's
    /// policy generation is not the one last pushed: it restarted, or another writer). Large
    /// changes go in parts under the API's body limit, removals of endpoints first and of
    /// identities last, so no part leaves a Pod less protected than the whole. Returns whether
    /// anything was sent.
    pub async fn push_policy(&mut self, want: &crate::netpol::Compiled) -> Result<bool, ProgramError> {
        if let Some((_, g)) = &self.policy_known {
            match self.api.policy().await {
                Ok(st) if st.generation == *g => {}
                Ok(_) => self.policy_known = None,
                Err(e) => {
                    self.policy_known = None;
                    return Err(self.failed(e));
                }
            }
        }
        let changes = crate::netpol::diff(self.policy_known.as_ref().map(|(c, _)| c), want);
        if crate::netpol::is_empty(&changes) {
            return Ok(false);
        }
        let mut generation = 0;
        for part in crate::netpol::parts(changes, POLICY_PART_BYTES) {
            match self.api.change_policy(&part).await {
                Ok(st) => generation = st.generation,
                Err(e) => {
                    self.policy_known = None;
                    return Err(self.failed(e));
                }
            }
        }
        self.policy_known = Some((want.clone(), generation));
        Ok(true)
    }

    fn failed(&self, error: CallError) -> ProgramError {
        ProgramError::Call { daemon: self.cfg.name.clone(), error }
    }

    /// The daemon's configuration generation.
    async fn generation_now(&self) -> Result<u64, ProgramError> {
        self.api.health().await.map(|h| h.generation).map_err(|e| self.failed(e))
    }

    /// Whether the daemon's configuration changed since it was last read or written here (the
    /// daemon restarted, reloaded its file, or was changed by hand): then it is read again at
    /// the next round. A daemon that does not answer counts as changed.
    pub async fn changed(&mut self) -> bool {
        if self.known.is_none() {
            return true;
        }
        match self.generation_now().await {
            Ok(g) if Some(g) == self.generation => false,
            _ => {
                self.known = None;
                true
            }
        }
    }

    /// What the daemon serves, and the generation it is of (read first: a change in between
    /// makes the next check read again).
    pub async fn fetch(&mut self) -> Result<BTreeMap<Key, NewService>, ProgramError> {
        self.generation = Some(self.generation_now().await?);
        let list = self.api.services().await.map_err(|e| self.failed(e))?;
        let mut m = BTreeMap::new();
        for s in &list {
            if let Some(n) = desired_of(s) {
                m.insert(key_of(&n), n);
            }
        }
        Ok(m)
    }

    /// Brings the daemon to `desired` for the services `owned` says are the controller's (its
    /// pools' addresses); others are left alone. `refresh`: read the daemon first even if
    /// nothing is known to have changed.
    pub async fn converge(&mut self, desired: &BTreeMap<Key, NewService>, owned: &(dyn Fn(&IpAddr) -> bool + Sync), refresh: bool) -> Result<Report, ProgramError> {
        if refresh || self.known.is_none() {
            self.known = None;
            self.known = Some(self.fetch().await?);
        }
        let known = self.known.as_ref().expect("read above");
        let mut ops = Vec::new();
        for (k, d) in desired {
            if !known.get(k).is_some_and(|h| same(d, h)) {
                ops.push(BatchOp::Put(d.clone()));
            }
        }
        for k in known.keys() {
            if owned(&k.1) && !desired.contains_key(k) {
                ops.push(BatchOp::Delete(ServiceRef { proto: k.0, vip: k.1, port: k.2 }));
            }
        }
        let mut report = Report::default();
        // A refused operation is taken out and the rest sent again (a batch is all or none).
        let mut attempts = 0;
        while !ops.is_empty() {
            attempts += 1;
            if attempts > MAX_ATTEMPTS {
                self.known = None;
                return Err(ProgramError::TooManyRefused(self.cfg.name.clone()));
            }
            let mut chunk = Vec::new();
            let mut bytes = 0;
            while let Some(op) = ops.first() {
                let n = serde_json::to_vec(op).map(|v| v.len()).unwrap_or(0) + 1;
                if !chunk.is_empty() && bytes + n > MAX_BATCH_BYTES {
                    break;
                }
                bytes += n;
                chunk.push(ops.remove(0));
            }
            report.batches += 1;
            let batch = Batch { ops: chunk };
            let refused = match self.api.batch(&batch).await {
                Ok(done) => {
                    // Our own change: the generation to compare with next (a change by someone
                    // else in between is missed only until the next periodic read).
                    self.generation = Some(done.generation);
                    let known = self.known.as_mut().expect("read above");
                    for op in batch.ops {
                        match op {
                            BatchOp::Put(s) => {
                                report.put += 1;
                                known.insert(key_of(&s), s);
                            }
                            BatchOp::Delete(r) => {
                                report.deleted += 1;
                                known.remove(&(r.proto, r.vip, r.port));
                            }
                        }
                    }
                    continue;
                }
                Err(e) => e,
            };
            // The body names the refused operation; one the daemon could not take is left out
            // and the rest sent again.
            let op = refused.refusal().and_then(|b| b.op.clone()).filter(|o| o.index < batch.ops.len());
            match (refused.kind(), op) {
                (Some(ErrorKind::Unprocessable | ErrorKind::BadRequest | ErrorKind::Conflict), Some(op)) => {
                    let mut chunk = batch.ops;
                    let k = match chunk.remove(op.index) {
                        BatchOp::Put(s) => key_of(&s),
                        BatchOp::Delete(r) => (r.proto, r.vip, r.port),
                    };
                    report.refused.insert(k, op.error);
                    // The rest goes again, first.
                    for op in chunk.into_iter().rev() {
                        ops.insert(0, op);
                    }
                }
                _ => {
                    self.known = None;
                    return Err(self.failed(refused));
                }
            }
        }
        Ok(report)
    }
}

/// A service as the daemon serves it, in the form the controller asks for it (`None`: a VIP
/// that is no address, which the daemon never answers).
pub fn desired_of(s: &ServiceStatus) -> Option<NewService> {
    let vip = s.vip.parse::<IpAddr>().ok()?;
    let mut backends: Vec<NewBackend> = s.backends.iter().filter_map(|b| Some(NewBackend { addr: b.addr.parse().ok()?, port: b.port, weight: b.weight })).collect();
    backends.sort_by_key(|b| (b.addr, b.port));
    Some(NewService {
        vip,
        port: s.port,
        proto: s.proto,
        mode: s.mode,
        scheduler: Some(s.scheduler),
        table_size: s.table_size,
        local_addrs: s.local_addrs.iter().filter_map(|a| a.parse().ok()).collect(),
        keep_source: s.keep_source.clone(),
        peer_local_addrs: s.peer_local_addrs.iter().filter_map(|a| a.parse().ok()).collect(),
        toa: s.toa,
        synproxy: Some(s.synproxy),
        affinity_timeout_s: s.affinity_timeout_s,
        health: s.health.clone(),
        backends,
    })
}

/// Whether the daemon's service `h` is what `d` asks for (an unset table size is the daemon's
/// choice; backends in any order; health checks written out whole on both sides).
pub fn same(d: &NewService, h: &NewService) -> bool {
    let mut a = d.backends.clone();
    a.sort_by_key(|b| (b.addr, b.port));
    let sorted = |v: &Vec<IpAddr>| {
        let mut v = v.clone();
        v.sort();
        v
    };
    d.mode == h.mode
        && d.scheduler.unwrap_or(SchedulerName::Wrr) == h.scheduler.unwrap_or(SchedulerName::Wrr)
        && (d.table_size.is_none() || d.table_size == h.table_size)
        && sorted(&d.local_addrs) == sorted(&h.local_addrs)
        && sorted(&d.peer_local_addrs) == sorted(&h.peer_local_addrs)
        && {
            let (mut a, mut b) = (d.keep_source.clone(), h.keep_source.clone());
            a.sort();
            b.sort();
            a == b
        }
        && d.toa == h.toa
        && d.synproxy.unwrap_or(SynProxyName::Off) == h.synproxy.unwrap_or(SynProxyName::Off)
        && d.affinity_timeout_s == h.affinity_timeout_s
        && d.health == h.health
        && a == h.backends
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    use vectorlb_api::model::{BackendStatus, ModeName, Rates, ServiceStats, ServiceTimeouts};
    use vectorlb_wire::{ErrorBody, OpError};

    /// A daemon's API in memory: batches all or nothing, refusals that name the operation.
    #[derive(Default)]
    pub struct FakeDaemon {
        pub state: Mutex<FakeState>,
    }

    #[derive(Default)]
    pub struct FakeState {
        pub services: BTreeMap<Key, NewService>,
        pub generation: u64,
        /// Puts of these are refused (422, the operation named).
        pub refuse: BTreeSet<Key>,
        /// The size of each batch's body, in bytes.
        pub batches: Vec<usize>,
        /// Answer nothing (a daemon that is restarting).
        pub down: bool,
        /// The policy set: endpoints and identities by key, its generation, the bodies' sizes.
        pub policy_endpoints: BTreeMap<String, vectorlb_api::model::PolicyEndpoint>,
        pub policy_identities: BTreeMap<IpAddr, u32>,
        pub policy_generation: u64,
        pub policy_posts: Vec<usize>,
    }

    fn down() -> CallError {
        CallError::Unreachable { target: "unix:/fake".into(), error: vectorlb_wire::call::ClientError::Timeout(Duration::from_secs(2)) }
    }

    pub fn status_of(n: &NewService) -> ServiceStatus {
        ServiceStatus {
            vip: n.vip.to_string(),
            port: n.port,
            proto: n.proto,
            mode: n.mode,
            scheduler: n.scheduler.unwrap_or(SchedulerName::Wrr),
            table_size: n.table_size,
            local_addrs: n.local_addrs.iter().map(|a| a.to_string()).collect(),
            keep_source: n.keep_source.clone(),
            peer_local_addrs: n.peer_local_addrs.iter().map(|a| a.to_string()).collect(),
            toa: n.toa,
            synproxy: n.synproxy.unwrap_or(SynProxyName::Off),
            affinity_timeout_s: n.affinity_timeout_s,
            timeouts: ServiceTimeouts { syn: 5.0, established: 900.0, fin: 120.0, time_wait: 120.0, close: 10.0, udp: 300.0 },
            health: n.health.clone(),
            backends: n
                .backends
                .iter()
                .map(|b| BackendStatus {
                    addr: b.addr.to_string(),
                    port: b.port,
                    weight: b.weight,
                    resolved: true,
                    active_sessions: 0,
                    packets: 0,
                    bytes: 0,
                    new_sessions: 0,
                    rates: Rates::default(),
                    health: None,
                })
                .collect(),
            stats: ServiceStats::default(),
        }
    }

    impl Endpoint for FakeDaemon {
        async fn health(&self) -> Result<Health, CallError> {
            let s = self.state.lock().unwrap();
            if s.down {
                return Err(down());
            }
            Ok(Health { status: "ok".into(), generation: s.generation, problems: Vec::new(), bgp: None })
        }
        async fn services(&self) -> Result<Vec<ServiceStatus>, CallError> {
            let s = self.state.lock().unwrap();
            if s.down {
                return Err(down());
            }
            Ok(s.services.values().map(status_of).collect())
        }
        async fn batch(&self, b: &Batch) -> Result<BatchDone, CallError> {
            let mut s = self.state.lock().unwrap();
            if s.down {
                return Err(down());
            }
            s.batches.push(serde_json::to_vec(b).unwrap().len());
            for (i, op) in b.ops.iter().enumerate() {
                if let BatchOp::Put(n) = op {
                    if s.refuse.contains(&key_of(n)) {
                        let error = format!("local_addrs: none of family {}", if n.vip.is_ipv4() { 4 } else { 6 });
                        let body = ErrorBody { error: format!("ops[{i}]: {error}"), kind: ErrorKind::Unprocessable, op: Some(OpError { index: i, error }) };
                        return Err(CallError::Refused { method: Method::POST, path: "/v1/batch".into(), status: 422, body: Box::new(body) });
                    }
                }
            }
            for op in &b.ops {
                match op {
                    BatchOp::Put(n) => {
                        s.services.insert(key_of(n), n.clone());
                    }
                    BatchOp::Delete(r) => {
                        s.services.remove(&(r.proto, r.vip, r.port));
                    }
                }
            }
            s.generation += 1;
            Ok(BatchDone { applied: b.ops.len(), generation: s.generation })
        }
        async fn policy(&self) -> Result<PolicyStatus, CallError> {
            let s = self.state.lock().unwrap();
            if s.down {
                return Err(down());
            }
            Ok(PolicyStatus { generation: s.policy_generation, endpoints: s.policy_endpoints.len(), identities: s.policy_identities.len(), ..Default::default() })
        }
        async fn change_policy(&self, c: &PolicyChanges) -> Result<PolicyStatus, CallError> {
            let mut s = self.state.lock().unwrap();
            if s.down {
                return Err(down());
            }
            s.policy_posts.push(serde_json::to_vec(c).unwrap().len());
            if c.reset {
                s.policy_endpoints.clear();
                s.policy_identities.clear();
            }
            for n in &c.endpoints_removed {
                s.policy_endpoints.remove(n);
            }
            for a in &c.identities_removed {
                s.policy_identities.remove(a);
            }
            for e in &c.endpoints {
                s.policy_endpoints.insert(e.name.clone(), e.clone());
            }
            for i in &c.identities {
                s.policy_identities.insert(i.addr, i.identity);
            }
            s.policy_generation += 1;
            Ok(PolicyStatus { generation: s.policy_generation, ..Default::default() })
        }
    }

    pub fn service(vip: &str, port: u16, backends: usize) -> NewService {
        NewService {
            vip: vip.parse().unwrap(),
            port,
            proto: Proto::Tcp,
            mode: ModeName::Fnat,
            scheduler: Some(SchedulerName::Maglev),
            table_size: None,
            local_addrs: vec!["10.1.0.200".parse().unwrap()],
            keep_source: Vec::new(),
            peer_local_addrs: Vec::new(),
            toa: false,
            synproxy: None,
            affinity_timeout_s: None,
            health: None,
            backends: (0..backends).map(|i| NewBackend { addr: format!("10.244.{}.{}", i / 250, i % 250 + 1).parse().unwrap(), port: 8080, weight: 1 }).collect(),
        }
    }

    fn daemon() -> Daemon<FakeDaemon> {
        let cfg = DaemonRef { name: "node-a".into(), api: "unix:/fake".into(), token_file: None, local_addrs: Vec::new(), peer_local_addrs: Vec::new() };
        Daemon::with(cfg, FakeDaemon::default())
    }

    fn want(list: &[NewService]) -> BTreeMap<Key, NewService> {
        list.iter().map(|n| (key_of(n), n.clone())).collect()
    }

    /// The controller's pool: 10.0.0.0/24.
    fn pool(a: &IpAddr) -> bool {
        matches!(a, IpAddr::V4(v) if v.octets()[..3] == [10, 0, 0])
    }

    #[tokio::test]
    async fn converging_puts_what_is_missing_removes_its_own_leftovers_and_leaves_the_rest() {
        let mut d = daemon();
        {
            let mut s = d.api.state.lock().unwrap();
            for n in [service("10.0.0.1", 80, 2), service("10.0.0.2", 80, 2), service("192.0.2.9", 53, 1)] {
                s.services.insert(key_of(&n), n);
            }
        }
        let mut changed = service("10.0.0.2", 80, 3);
        changed.scheduler = Some(SchedulerName::Wrr);
        let desired = want(&[service("10.0.0.1", 80, 2), changed.clone(), service("10.0.0.3", 443, 1)]);
        let r = d.converge(&desired, &pool, false).await.unwrap();
        // 10.0.0.1 is right already; 10.0.0.2 changed and 10.0.0.3 is new; nothing is the
        // pool's to remove, and 192.0.2.9 (the daemon's own file's) is not the controller's.
        assert_eq!((r.put, r.deleted, r.batches), (2, 0, 1), "{r:?}");
        let held: Vec<Key> = d.api.state.lock().unwrap().services.keys().copied().collect();
        assert_eq!(held.len(), 4);
        // The same again: nothing to send, and the daemon is not read again.
        let r = d.converge(&desired, &pool, false).await.unwrap();
        assert_eq!((r.put, r.deleted, r.batches), (0, 0, 0));
        assert!(!d.changed().await, "our own batch's generation was kept");
        // A Service gone: its leftover on the daemon goes, the foreign one stays.
        let desired = want(&[service("10.0.0.1", 80, 2), changed]);
        let r = d.converge(&desired, &pool, false).await.unwrap();
        assert_eq!((r.put, r.deleted), (0, 1));
        let held: BTreeSet<IpAddr> = d.api.state.lock().unwrap().services.keys().map(|k| k.1).collect();
        assert_eq!(held, ["10.0.0.1", "10.0.0.2", "192.0.2.9"].iter().map(|a| a.parse().unwrap()).collect());
    }

    #[tokio::test]
    async fn a_change_by_someone_else_is_read_again() {
        let mut d = daemon();
        let desired = want(&[service("10.0.0.1", 80, 2)]);
        d.converge(&desired, &pool, false).await.unwrap();
        // Someone removes it by hand (or the daemon restarts with its file): a new generation.
        {
            let mut s = d.api.state.lock().unwrap();
            s.services.clear();
            s.generation += 1;
        }
        assert!(d.changed().await);
        let r = d.converge(&desired, &pool, false).await.unwrap();
        assert_eq!(r.put, 1, "put back after the daemon was read again");
    }

    #[tokio::test]
    async fn batches_are_split_under_the_body_limit() {
        let mut d = daemon();
        let list: Vec<NewService> = (0..600).map(|i| service(&format!("10.0.0.{}", i % 250 + 1), 1000 + i as u16, 60)).collect();
        let r = d.converge(&want(&list), &pool, false).await.unwrap();
        let batches = d.api.state.lock().unwrap().batches.clone();
        assert_eq!(r.put, 600);
        assert!(batches.len() >= 2, "600 services of 60 backends in one batch: {batches:?}");
        assert!(batches.iter().all(|b| *b <= MAX_BATCH_BYTES + 64), "a batch over the limit: {batches:?}");
        assert_eq!(d.api.state.lock().unwrap().services.len(), 600);
    }

    #[tokio::test]
    async fn a_refused_operation_is_left_out_and_the_rest_applied() {
        let mut d = daemon();
        let bad = service("10.0.0.7", 80, 1);
        d.api.state.lock().unwrap().refuse.insert(key_of(&bad));
        let desired = want(&[service("10.0.0.1", 80, 1), bad.clone(), service("10.0.0.9", 80, 1)]);
        let r = d.converge(&desired, &pool, false).await.unwrap();
        assert_eq!((r.put, r.batches), (2, 2), "{r:?}");
        assert_eq!(r.refused.get(&key_of(&bad)).map(String::as_str), Some("local_addrs: none of family 4"), "why, without the ops[i]");
        assert!(!d.api.state.lock().unwrap().services.contains_key(&key_of(&bad)));
        // Next round it is tried again (the daemon may take it by then), alone.
        let r = d.converge(&desired, &pool, false).await.unwrap();
        assert_eq!((r.put, r.batches, r.refused.len()), (0, 1, 1));
    }

    #[tokio::test]
    async fn too_many_refusals_give_the_round_up_and_the_daemon_is_read_again() {
        let mut d = daemon();
        let list: Vec<NewService> = (0..(MAX_ATTEMPTS as u16 + 5)).map(|i| service("10.0.0.1", 1000 + i, 1)).collect();
        d.api.state.lock().unwrap().refuse = list.iter().map(key_of).collect();
        let e = d.converge(&want(&list), &pool, false).await.unwrap_err();
        assert!(matches!(e, ProgramError::TooManyRefused(_)), "{e}");
        assert_eq!(d.api.state.lock().unwrap().batches.len(), MAX_ATTEMPTS);
        assert!(d.changed().await, "after giving up, what the daemon serves is read again");
    }

    #[tokio::test]
    async fn a_daemon_that_does_not_answer_is_an_error_and_read_again_when_it_does() {
        let mut d = daemon();
        d.api.state.lock().unwrap().down = true;
        let desired = want(&[service("10.0.0.1", 80, 1)]);
        assert!(matches!(d.converge(&desired, &pool, false).await, Err(ProgramError::Call { .. })));
        assert!(d.changed().await);
        d.api.state.lock().unwrap().down = false;
        assert_eq!(d.converge(&desired, &pool, false).await.unwrap().put, 1);
    }

    #[test]
    fn what_the_daemon_serves_reads_back_as_what_was_asked() {
        let mut n = service("2001:db8::1", 443, 3);
        n.backends.reverse();
        let back = desired_of(&status_of(&n)).unwrap();
        assert!(same(&n, &back), "{n:?} / {back:?}");
    }

    fn compiled(n: usize) -> crate::netpol::Compiled {
        let mut c = crate::netpol::Compiled::default();
        for i in 0..n {
            let name = format!("ns/p{i}");
            c.identities.insert(format!("10.7.{}.{}", i / 250, i % 250 + 1).parse().unwrap(), i as u32 + 1);
            let padding = vectorlb_api::model::PolicyRule { peers: Some((0..40).collect()), ports: vec![], action: "allow".into(), policy: format!("NetworkPolicy/ns/{i}") };
            let ingress = vectorlb_api::model::PolicyDirection { isolated_by: Some(format!("NetworkPolicy/ns/{i}")), allow: vec![padding], ..Default::default() };
            c.endpoints.insert(
                name.clone(),
                vectorlb_api::model::PolicyEndpoint { name, addrs: vec![format!("10.7.{}.{}", i / 250, i % 250 + 1).parse().unwrap()], ingress, ..Default::default() },
            );
        }
        c
    }

    #[tokio::test]
    async fn policy_goes_by_difference_in_parts_and_again_whole_after_a_restart() {
        let mut d = daemon();
        let want = compiled(3000);
        assert!(d.push_policy(&want).await.unwrap());
        {
            let s = d.api.state.lock().unwrap();
            assert!(s.policy_posts.len() > 1 && s.policy_posts.iter().all(|&n| n <= POLICY_PART_BYTES + 4096), "{:?}", s.policy_posts);
            assert_eq!((s.policy_endpoints.len(), s.policy_identities.len()), (3000, 3000));
        }
        assert!(!d.push_policy(&want).await.unwrap(), "nothing to send");
        let mut less = want.clone();
        less.endpoints.remove("ns/p7");
        assert!(d.push_policy(&less).await.unwrap());
        assert_eq!(d.api.state.lock().unwrap().policy_endpoints.len(), 2999);
        // The daemon restarts: empty, generation 0. The next push starts from empty.
        {
            let mut s = d.api.state.lock().unwrap();
            s.policy_endpoints.clear();
            s.policy_identities.clear();
            s.policy_generation = 0;
        }
        assert!(d.push_policy(&less).await.unwrap());
        assert_eq!(d.api.state.lock().unwrap().policy_endpoints.len(), 2999);
        // A daemon that does not answer: an error, and a push from empty once it is back.
        d.api.state.lock().unwrap().down = true;
        assert!(d.push_policy(&want).await.is_err());
        d.api.state.lock().unwrap().down = false;
        assert!(d.push_policy(&want).await.unwrap());
        assert_eq!(d.api.state.lock().unwrap().policy_endpoints.len(), 3000);
    }
}
