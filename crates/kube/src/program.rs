//! Programs one daemon through its control API by difference: it compares what the daemon
//! serves with what it should and sends the changes as one batch (`POST /v1/batch`), so a
//! restarted controller or daemon converges without disturbing what is already right.

use crate::config::DaemonRef;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;
use vectorlb_api::model::{Batch, BatchOp, NewBackend, NewService, Proto, SchedulerName, ServiceRef, ServiceStatus, SynProxyName};
use vectorlb_client::{Method, Options, Request, Target};

/// A service's key on a daemon.
pub type Key = (Proto, IpAddr, u16);

pub fn key_of(s: &NewService) -> Key {
    (s.proto, s.vip, s.port)
}

/// Batches stay under the API's 1 MiB body limit.
const MAX_BATCH_BYTES: usize = 768 * 1024;

pub struct Daemon {
    pub cfg: DaemonRef,
    target: Target,
    token: Option<String>,
    /// What the daemon serves, as last read or written; None: read it again.
    known: Option<BTreeMap<Key, NewService>>,
    /// The daemon's configuration generation that `known` is of.
    generation: Option<u64>,
}

/// What one round did on one daemon.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub put: usize,
    pub deleted: usize,
    /// Services the daemon refused: key → its message.
    pub refused: BTreeMap<Key, String>,
}

impl Daemon {
    pub fn new(cfg: DaemonRef) -> Result<Daemon, String> {
        let target: Target = cfg.api.parse().map_err(|e| format!("daemon {}: {e}", cfg.name))?;
        let token = match &cfg.token_file {
            Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("daemon {}: token_file {}: {e}", cfg.name, p.display()))?.trim().to_string()),
            None => None,
        };
        Ok(Daemon { cfg, target, token, known: None, generation: None })
    }

    /// Forget what the daemon serves: the next round reads it again.
    pub fn invalidate(&mut self) {
        self.known = None;
    }

    async fn call(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<(u16, Vec<u8>), String> {
        let r = Request { method, path: path.into(), host: "vectorlb".into(), body, content_type: "application/json", bearer: self.token.clone() };
        let o = Options { connect_timeout: Duration::from_secs(2), timeout: Duration::from_secs(30), max_body: 256 * 1024 * 1024, ..Options::default() };
        let res = vectorlb_client::request(&self.target, &r, &o).await.map_err(|e| format!("daemon {} ({}): {e}", self.cfg.name, self.target))?;
        Ok((res.status.as_u16(), res.body.to_vec()))
    }

    /// The daemon's configuration generation (from `/v1/health`, which answers 503 with the
    /// same body when the daemon is unwell).
    async fn generation_now(&self) -> Result<u64, String> {
        let (_, body) = self.call(Method::GET, "/v1/health", None).await?;
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| format!("daemon {}: GET /v1/health: {e}", self.cfg.name))?;
        v["generation"].as_u64().ok_or_else(|| format!("daemon {}: GET /v1/health: no generation", self.cfg.name))
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
    pub async fn fetch(&mut self) -> Result<BTreeMap<Key, NewService>, String> {
        self.generation = Some(self.generation_now().await?);
        let (st, body) = self.call(Method::GET, "/v1/services", None).await?;
        if st != 200 {
            return Err(format!("daemon {}: GET /v1/services: {st} {}", self.cfg.name, String::from_utf8_lossy(&body)));
        }
        let list: Vec<ServiceStatus> = serde_json::from_slice(&body).map_err(|e| format!("daemon {}: GET /v1/services: {e}", self.cfg.name))?;
        let mut m = BTreeMap::new();
        for s in list {
            let Ok(vip) = s.vip.parse::<IpAddr>() else { continue };
            let mut backends: Vec<NewBackend> = s.backends.iter().filter_map(|b| Some(NewBackend { addr: b.addr.parse().ok()?, port: b.port, weight: b.weight })).collect();
            backends.sort_by_key(|b| (b.addr, b.port));
            let n = NewService {
                vip,
                port: s.port,
                proto: s.proto,
                mode: s.mode,
                scheduler: Some(s.scheduler),
                table_size: s.table_size,
                local_addrs: s.local_addrs.iter().filter_map(|a| a.parse().ok()).collect(),
                peer_local_addrs: s.peer_local_addrs.iter().filter_map(|a| a.parse().ok()).collect(),
                toa: s.toa,
                synproxy: Some(s.synproxy),
                health: s.health.clone(),
                backends,
            };
            m.insert(key_of(&n), n);
        }
        Ok(m)
    }

    /// Brings the daemon to `desired` for the services `owned` says are the controller's (its
    /// pools' addresses); others are left alone. `refresh`: read the daemon first even if
    /// nothing is known to have changed.
    pub async fn converge(&mut self, desired: &BTreeMap<Key, NewService>, owned: &(dyn Fn(&IpAddr) -> bool + Sync), refresh: bool) -> Result<Report, String> {
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
            if attempts > 64 {
                self.known = None;
                return Err(format!("daemon {}: too many refused operations", self.cfg.name));
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
            let body = serde_json::to_vec(&Batch { ops: chunk.clone() }).expect("a batch serializes");
            let (st, resp) = match self.call(Method::POST, "/v1/batch", Some(body)).await {
                Ok(r) => r,
                Err(e) => {
                    self.known = None;
                    return Err(e);
                }
            };
            if st == 200 {
                let done: Option<u64> = serde_json::from_slice::<serde_json::Value>(&resp).ok().and_then(|v| v["generation"].as_u64());
                // Our own change: the generation to compare with next (a change by someone
                // else in between is missed only until the next periodic read).
                self.generation = done;
                let known = self.known.as_mut().expect("read above");
                for op in chunk {
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
            let msg = serde_json::from_slice::<serde_json::Value>(&resp)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&resp).into_owned());
            // "ops[i]: why" names the refused one.
            let bad = msg.strip_prefix("ops[").and_then(|r| r.split_once(']')).and_then(|(i, _)| i.parse::<usize>().ok()).filter(|i| *i < chunk.len());
            match (st, bad) {
                (422 | 400 | 409, Some(i)) => {
                    let op = chunk.remove(i);
                    let k = match &op {
                        BatchOp::Put(s) => key_of(s),
                        BatchOp::Delete(r) => (r.proto, r.vip, r.port),
                    };
                    let why = msg.split_once("]: ").map(|(_, w)| w.to_string()).unwrap_or(msg);
                    report.refused.insert(k, why);
                    // The rest goes again, first.
                    for op in chunk.into_iter().rev() {
                        ops.insert(0, op);
                    }
                }
                _ => {
                    self.known = None;
                    return Err(format!("daemon {}: POST /v1/batch: {st} {msg}", self.cfg.name));
                }
            }
        }
        Ok(report)
    }
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
        && d.toa == h.toa
        && d.synproxy.unwrap_or(SynProxyName::Off) == h.synproxy.unwrap_or(SynProxyName::Off)
        && d.health == h.health
        && a == h.backends
}
