//! An in-memory `LbControl` for the API's tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Mutex;
use vectorlb_api::model::*;
use vectorlb_api::{ApiError, LbControl};

#[derive(Default)]
pub struct Fake {
    services: Mutex<Vec<NewService>>,
}

impl LbControl for Fake {
    fn health(&self) -> Health {
        Health { status: "ok".into(), generation: 7, problems: vec![], bgp: None }
    }
    fn services(&self) -> Vec<ServiceStatus> {
        self.services
            .lock()
            .unwrap()
            .iter()
            .map(|s| ServiceStatus {
                vip: s.vip.to_string(),
                port: s.port,
                proto: s.proto,
                mode: s.mode,
                scheduler: s.scheduler.unwrap_or(SchedulerName::Wrr),
                table_size: s.table_size,
                local_addrs: vec![],
                keep_source: vec![],
                peer_local_addrs: vec![],
                toa: s.toa,
                synproxy: s.synproxy.unwrap_or(SynProxyName::Off),
                affinity_timeout_s: s.affinity_timeout_s,
                timeouts: ServiceTimeouts { syn: 30.0, established: 900.0, fin: 30.0, time_wait: 2.0, close: 2.0, udp: 300.0 },
                health: s.health.clone(),
                backends: vec![],
                stats: ServiceStats::default(),
            })
            .collect()
    }
    fn add_service(&self, s: NewService) -> Result<(), ApiError> {
        let mut v = self.services.lock().unwrap();
        if v.iter().any(|x| x.vip == s.vip && x.port == s.port && x.proto == s.proto) {
            return Err(ApiError::Conflict("exists".into()));
        }
        v.push(s);
        Ok(())
    }
    fn edit_service(&self, _: ServiceKey, _: ServicePatch) -> Result<(), ApiError> {
        Err(ApiError::NotFound("no such service".into()))
    }
    fn batch(&self, ops: Vec<BatchOp>) -> Result<u64, ApiError> {
        let mut v = self.services.lock().unwrap();
        for op in ops {
            match op {
                BatchOp::Put(s) => {
                    v.retain(|x| !(x.vip == s.vip && x.port == s.port && x.proto == s.proto));
                    v.push(s);
                }
                BatchOp::Delete(r) => v.retain(|x| !(x.vip == r.vip && x.port == r.port && x.proto == r.proto)),
            }
        }
        Ok(1)
    }
    fn delete_service(&self, _: ServiceKey) -> Result<(), ApiError> {
        Err(ApiError::NotFound("no such service".into()))
    }
    fn add_backend(&self, _: ServiceKey, _: NewBackend) -> Result<(), ApiError> {
        Err(ApiError::Unprocessable("backend of the other family".into()))
    }
    fn set_weight(&self, _: ServiceKey, _: SocketAddr, _: u32) -> Result<(), ApiError> {
        Ok(())
    }
    fn delete_backend(&self, _: ServiceKey, _: SocketAddr) -> Result<(), ApiError> {
        Ok(())
    }
    fn sessions(&self, q: SessionQuery) -> Result<SessionPage, ApiError> {
        if q.worker > 0 {
            return Err(ApiError::NotFound(format!("worker: {} does not exist (0..1)", q.worker)));
        }
        Ok(SessionPage { worker: 0, family: if q.v6 { 6 } else { 4 }, sessions: vec![], next_cursor: None })
    }
    fn stats(&self) -> Stats {
        Stats {
            uptime_seconds: 1.0,
            generation: 7,
            workers: 1,
            packets: [("rx".to_string(), 5)].into(),
            drops: Default::default(),
            sessions: 0,
            io: Default::default(),
            reloads: 0,
            reload_failures: 0,
            mbufs_available: 100,
            ha: self.ha(),
            sync: SyncStatus::default(),
            bgp: None,
            rates: GlobalRates::default(),
            queue_sets: vec![],
        }
    }
    fn history(&self) -> History {
        History { step_seconds: 1.0, services: vec![] }
    }
    fn ports(&self) -> Vec<PortStatus> {
        vec![]
    }
    fn neighbors(&self) -> Vec<Neighbor> {
        vec![]
    }
    fn config_toml(&self) -> String {
        "[global]\n".into()
    }
    fn reload(&self) -> Result<u64, ApiError> {
        Err(ApiError::Conflict("ports changed: adding, removing or re-pointing a port needs a restart".into()))
    }
    fn save(&self) -> Result<Saved, ApiError> {
        Ok(Saved { saved: "/tmp/x.toml".into(), bytes: 9 })
    }
    fn ha(&self) -> HaStatus {
        HaStatus { state: HaState::Standalone, since_seconds: 0.0, transitions: 0, announcements: 0 }
    }
    fn set_ha(&self, _: HaState) -> HaState {
        HaState::Standalone
    }
    fn bgp(&self) -> Option<BgpStatus> {
        None
    }

    fn drain(&self, _: DrainChange) -> Result<BgpStatus, ApiError> {
        Err(ApiError::NotFound("no [bgp] in the configuration: there is nothing to drain".into()))
    }

    fn sync(&self) -> SyncStatus {
        SyncStatus::default()
    }
    fn metrics(&self) -> String {
        "vectorlb_rx_total 5\n".into()
    }
    fn pods(&self) -> Result<Vec<PodStatus>, ApiError> {
        Err(ApiError::NotFound("no pods port in the configuration ([ports.pods])".into()))
    }
    fn add_pod(&self, _p: NewPod) -> Result<PodStatus, ApiError> {
        Err(ApiError::NotFound("no pods port in the configuration ([ports.pods])".into()))
    }
    fn delete_pod(&self, _id: &str, _ifname: &str) -> Result<bool, ApiError> {
        Err(ApiError::NotFound("no pods port in the configuration ([ports.pods])".into()))
    }
    fn policy(&self) -> PolicyStatus {
        PolicyStatus::default()
    }
    fn mesh(&self) -> MeshStatus {
        MeshStatus::default()
    }
    fn set_mesh(&self, m: MeshSteering) -> Result<MeshStatus, ApiError> {
        Ok(MeshStatus {
            enabled: !m.members.is_empty(),
            proxy: Some(format!("{}/{}", m.proxy_container_id, m.proxy_ifname)),
            members: m.members.len() as u64,
            tunnel_port: m.tunnel_port.unwrap_or(15008),
            ..Default::default()
        })
    }
    fn clear_mesh(&self) -> MeshStatus {
        MeshStatus::default()
    }
    fn policy_denied(&self, after: u64) -> PolicyDeniedLog {
        PolicyDeniedLog { next: after, ..Default::default() }
    }
    fn change_policy(&self, c: PolicyChanges) -> Result<PolicyStatus, ApiError> {
        if c.endpoints.iter().any(|e| e.name.is_empty()) {
            return Err(ApiError::BadRequest("endpoints: name: '' is not a name".into()));
        }
        Ok(PolicyStatus { generation: 1, endpoints: c.endpoints.len(), ..Default::default() })
    }
}
