//! The file as TOML has it (`Raw*`): what serde reads and writes. Unknown keys are errors. The
//! sections' modules turn these into the model and back.

use crate::memif::MemifSpec;
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQueueSet {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) services: Vec<String>,
    pub(crate) workers: Vec<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<RawRate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) busy_poll: Option<bool>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) burst_ms: Option<u32>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDefaultSet {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ingress: Option<RawRate>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGlobal {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_sessions: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) index_entries: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) batch: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) icmp_rate: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) local_port_min: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) local_port_max: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sweep_budget: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) half_open_share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) continuation_share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cluster_key: Option<String>,
}

#[derive(Deserialize, Serialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTimeouts {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) syn: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) established: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fin: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) time_wait: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) close: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) udp: Option<f64>,
}

/// A string or a list of strings (`runtime.api`).
#[derive(Deserialize, Serialize, Clone)]
#[serde(untagged, expecting = "an endpoint (\"unix:PATH\" or \"ADDRESS:PORT\") or a list of them")]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRuntime {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) workers: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpus: Option<Vec<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) eal: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mbufs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queue_desc: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) api: Option<OneOrMany>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) api_token_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) api_group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) memory_budget_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) idle_sleep_us: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) neighbor_timeout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) run_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ha_state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dma_devices: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dma_threshold: Option<u32>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPort {
    pub(crate) name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mac: Option<String>,
    #[serde(default)]
    pub(crate) addrs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) vlan: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mtu: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) memif: Option<MemifSpec>,
    /// The port of this node's pods (tun interfaces attached at run time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pods: Option<crate::pods::PodsSpec>,
    /// The device's peer may be trusted with memory the data plane maps (net_memif devices).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) trust_peer: bool,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub(crate) prefix: String,
    pub(crate) via: String,
    pub(crate) port: String,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNeighbor {
    pub(crate) ip: String,
    pub(crate) mac: String,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    pub(crate) addr: String,
    #[serde(default)]
    pub(crate) port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) quic_id: Option<u32>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawService {
    pub(crate) vip: String,
    #[serde(default)]
    pub(crate) port: u16,
    pub(crate) proto: String,
    pub(crate) mode: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) scheduler: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) table_size: Option<u32>,
    #[serde(default)]
    pub(crate) local_addrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) keep_source: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) peer_local_addrs: Vec<String>,
    #[serde(default)]
    pub(crate) toa: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) synproxy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) synproxy_half_open: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) continuation: Option<bool>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) quic: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) affinity_timeout_s: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) timeouts: Option<RawTimeouts>,
    #[serde(default)]
    pub(crate) backends: Vec<RawBackend>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) health: Option<RawHealth>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBgp {
    pub(crate) asn: u64,
    pub(crate) router_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_hop: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hold_time: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bfd: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bfd_interval_ms: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bfd_multiplier: Option<u8>,
    #[serde(default)]
    pub(crate) communities: Vec<String>,
    #[serde(default)]
    pub(crate) neighbors: Vec<RawBgpNeighbor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) import: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) import_length4: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) import_length6: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) import_limit: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bird: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) birdc: Option<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBgpNeighbor {
    pub(crate) address: String,
    pub(crate) asn: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) password: Option<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHa {
    pub(crate) sync_listen: String,
    pub(crate) sync_peers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) sync_sources: Vec<String>,
    pub(crate) sync_key: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) group: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_rate: Option<u32>,
}

/// A health check as the file (and the control API) gives it, before it is checked.
#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rise: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fall: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_down: Option<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSnat {
    pub(crate) source: String,
    pub(crate) addrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) except: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) outbound_only: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) timeouts: Option<RawTimeouts>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Raw {
    #[serde(default)]
    pub(crate) global: RawGlobal,
    #[serde(default)]
    pub(crate) runtime: RawRuntime,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ha: Option<RawHa>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bgp: Option<RawBgp>,
    #[serde(default)]
    pub(crate) timeouts: RawTimeouts,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) ports: Vec<RawPort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) routes: Vec<RawRoute>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) neighbors: Vec<RawNeighbor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) services: Vec<RawService>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) snat: Vec<RawSnat>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) queue_sets: Vec<RawQueueSet>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) default_set: Option<RawDefaultSet>,
}
