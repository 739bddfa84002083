//! The configuration file: TOML, documented in `docs/configuration.md`.
//!
//! Unknown keys are errors (a misspelt key must not silently fall back to a default), and every
//! error names the field it is about. [`Config::parse`] returns the service model
//! ([`vectorlb_lb::LbSpec`]) plus the engine settings that size each worker.

use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use vectorlb_lb::{BackendSpec, LbSpec, Mode, PortSpec, RouteSpec, ServiceSpec, SnatSpec, Timeouts};
use vectorlb_packet::ethernet::Mac;
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

macro_rules! bail {
    ($($t:tt)*) => { return Err(Error(format!($($t)*))) };
}

/// Settings that size and tune each worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub max_sessions: u32,
    pub index_entries: u32,
    pub batch: usize,
    pub local_port_min: u16,
    pub local_port_max: u16,
    pub sweep_budget: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub engine: Engine,
    pub spec: LbSpec,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGlobal {
    max_sessions: Option<u32>,
    index_entries: Option<u32>,
    batch: Option<usize>,
    icmp_rate: Option<u32>,
    local_port_min: Option<u16>,
    local_port_max: Option<u16>,
    sweep_budget: Option<u32>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    syn: Option<f64>,
    established: Option<f64>,
    fin: Option<f64>,
    time_wait: Option<f64>,
    close: Option<f64>,
    udp: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    name: String,
    mac: String,
    #[serde(default)]
    addrs: Vec<String>,
    vlan: Option<u16>,
    mtu: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    prefix: String,
    via: String,
    port: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNeighbor {
    ip: String,
    mac: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    addr: String,
    #[serde(default)]
    port: u16,
    weight: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    vip: String,
    #[serde(default)]
    port: u16,
    proto: String,
    mode: String,
    scheduler: Option<String>,
    table_size: Option<u32>,
    #[serde(default)]
    local_addrs: Vec<String>,
    #[serde(default)]
    toa: bool,
    timeouts: Option<RawTimeouts>,
    #[serde(default)]
    backends: Vec<RawBackend>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSnat {
    source: String,
    addrs: Vec<String>,
    timeouts: Option<RawTimeouts>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    global: RawGlobal,
    #[serde(default)]
    timeouts: RawTimeouts,
    #[serde(default)]
    ports: Vec<RawPort>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    neighbors: Vec<RawNeighbor>,
    #[serde(default)]
    services: Vec<RawService>,
    #[serde(default)]
    snat: Vec<RawSnat>,
}

pub fn parse_mac(s: &str) -> Option<Mac> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut m = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return None;
        }
        m[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(m)
}

pub fn format_mac(m: &Mac) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn ip(field: &str, s: &str) -> Result<IpAddr, Error> {
    s.parse().map_err(|_| Error(format!("{field}: '{s}' is not an IP address")))
}

/// "10.0.0.0/24" or "2001:db8::/64"; a bare address is a host prefix.
pub fn prefix(field: &str, s: &str) -> Result<(IpAddr, u8), Error> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr = ip(field, a)?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match l {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => bail!("{field}: '{s}' has an invalid prefix length (0..={max})"),
        },
    };
    Ok((addr, len))
}

fn ms(field: &str, v: Option<f64>, default: u32) -> Result<u32, Error> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (0.0..=1_000_000.0).contains(&x) => Ok((x * 1000.0).round() as u32),
        Some(x) => bail!("{field}: {x} is not a number of seconds in 0..=1000000"),
    }
}

fn timeouts(field: &str, r: &RawTimeouts, base: &Timeouts) -> Result<Timeouts, Error> {
    let t = Timeouts {
        syn: ms(&format!("{field}.syn"), r.syn, base.syn)?,
        established: ms(&format!("{field}.established"), r.established, base.established)?,
        fin: ms(&format!("{field}.fin"), r.fin, base.fin)?,
        time_wait: ms(&format!("{field}.time_wait"), r.time_wait, base.time_wait)?,
        close: ms(&format!("{field}.close"), r.close, base.close)?,
        udp: ms(&format!("{field}.udp"), r.udp, base.udp)?,
    };
    for (n, v) in [("syn", t.syn), ("established", t.established), ("fin", t.fin), ("udp", t.udp)] {
        if v == 0 {
            bail!("{field}.{n}: must be above 0 (only time_wait and close may be 0)");
        }
    }
    Ok(t)
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error(format!("{}: {e}", path.display())))?;
        Config::parse(&text).map_err(|e| Error(format!("{}: {e}", path.display())))
    }

    pub fn parse(text: &str) -> Result<Config, Error> {
        let raw: Raw = toml::from_str(text).map_err(|e| Error(e.to_string().trim_end().to_string()))?;
        let g = &raw.global;
        let base = timeouts("timeouts", &raw.timeouts, &Timeouts::default())?;

        let mut port_ids = HashMap::new();
        let mut ports = Vec::new();
        for (i, p) in raw.ports.iter().enumerate() {
            let f = format!("ports[{i}]");
            if p.name.is_empty() {
                bail!("{f}.name: must not be empty");
            }
            if port_ids.insert(p.name.clone(), i as u16).is_some() {
                bail!("{f}.name: '{}' is used twice", p.name);
            }
            let mac = parse_mac(&p.mac).ok_or_else(|| Error(format!("{f}.mac: '{}' is not a MAC address", p.mac)))?;
            let addrs =
                p.addrs.iter().map(|a| prefix(&format!("{f}.addrs"), a)).collect::<Result<Vec<_>, _>>()?;
            let mtu = p.mtu.unwrap_or(1500);
            if !(576..=9216).contains(&mtu) {
                bail!("{f}.mtu: {mtu} is out of range 576..=9216");
            }
            ports.push(PortSpec { name: p.name.clone(), mac, addrs, vlan: p.vlan, mtu });
        }
        let mut routes = Vec::new();
        for (i, r) in raw.routes.iter().enumerate() {
            let f = format!("routes[{i}]");
            let (pfx, len) = prefix(&format!("{f}.prefix"), &r.prefix)?;
            let via = ip(&format!("{f}.via"), &r.via)?;
            let Some(&port) = port_ids.get(&r.port) else {
                bail!("{f}.port: no port named '{}'", r.port);
            };
            routes.push(RouteSpec { prefix: pfx, len, port, via });
        }
        let mut neighbors = Vec::new();
        for (i, n) in raw.neighbors.iter().enumerate() {
            let f = format!("neighbors[{i}]");
            let a = ip(&format!("{f}.ip"), &n.ip)?;
            let mac = parse_mac(&n.mac).ok_or_else(|| Error(format!("{f}.mac: '{}' is not a MAC address", n.mac)))?;
            neighbors.push((a, mac));
        }
        let mut services = Vec::new();
        for (i, s) in raw.services.iter().enumerate() {
            let f = format!("services[{i}]");
            let vip = ip(&format!("{f}.vip"), &s.vip)?;
            let protocol = match s.proto.as_str() {
                "tcp" => proto::TCP,
                "udp" => proto::UDP,
                p => bail!("{f}.proto: '{p}' is not tcp or udp"),
            };
            let mode = Mode::parse(&s.mode)
                .ok_or_else(|| Error(format!("{f}.mode: '{}' is not one of nat, fnat, dr, tun", s.mode)))?;
            let sched_name = s.scheduler.as_deref().unwrap_or("wrr");
            let mut scheduler = Algorithm::parse(sched_name).ok_or_else(|| {
                Error(format!("{f}.scheduler: '{sched_name}' is not one of rr, wrr, wlc, sh, maglev"))
            })?;
            if let Some(n) = s.table_size {
                match &mut scheduler {
                    Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => *table_size = n,
                    _ => bail!("{f}.table_size: only sh and maglev have a table"),
                }
            }
            let local_addrs = s
                .local_addrs
                .iter()
                .map(|a| ip(&format!("{f}.local_addrs"), a))
                .collect::<Result<Vec<_>, _>>()?;
            if mode != Mode::Fnat && !local_addrs.is_empty() {
                bail!("{f}.local_addrs: only fnat services use local addresses");
            }
            if s.toa && (mode != Mode::Fnat || protocol != proto::TCP) {
                bail!("{f}.toa: only tcp fnat services can insert the TOA option");
            }
            let mut backends = Vec::new();
            for (j, b) in s.backends.iter().enumerate() {
                let bf = format!("{f}.backends[{j}]");
                backends.push(BackendSpec {
                    addr: ip(&format!("{bf}.addr"), &b.addr)?,
                    port: b.port,
                    weight: b.weight.unwrap_or(1),
                });
            }
            let t = match &s.timeouts {
                Some(r) => timeouts(&format!("{f}.timeouts"), r, &base)?,
                None => base,
            };
            services.push(ServiceSpec {
                vip,
                port: s.port,
                proto: protocol,
                mode,
                scheduler,
                backends,
                local_addrs,
                toa: s.toa,
                timeouts: t,
            });
        }
        let mut snat = Vec::new();
        for (i, r) in raw.snat.iter().enumerate() {
            let f = format!("snat[{i}]");
            let (source, prefix_len) = prefix(&format!("{f}.source"), &r.source)?;
            let addrs = r.addrs.iter().map(|a| ip(&format!("{f}.addrs"), a)).collect::<Result<Vec<_>, _>>()?;
            let t = match &r.timeouts {
                Some(x) => timeouts(&format!("{f}.timeouts"), x, &base)?,
                None => base,
            };
            snat.push(SnatSpec { source, prefix_len, addrs, timeouts: t });
        }
        let max_sessions = g.max_sessions.unwrap_or(1_000_000);
        if max_sessions == 0 {
            bail!("global.max_sessions: must be above 0");
        }
        let has_nat = services.iter().any(|s| s.mode == Mode::Nat);
        let index_entries = g.index_entries.unwrap_or(if has_nat { max_sessions.saturating_mul(2) } else { max_sessions });
        if index_entries < max_sessions {
            bail!("global.index_entries: {index_entries} is below max_sessions ({max_sessions})");
        }
        let batch = g.batch.unwrap_or(256);
        if !(1..=4096).contains(&batch) {
            bail!("global.batch: {batch} is out of range 1..=4096");
        }
        let local_port_min = g.local_port_min.unwrap_or(1024);
        let local_port_max = g.local_port_max.unwrap_or(65535);
        if local_port_min == 0 || local_port_min > local_port_max {
            bail!("global.local_port_min/local_port_max: need 1 <= min <= max");
        }
        let spec = LbSpec { ports, routes, neighbors, services, snat, icmp_rate: g.icmp_rate.unwrap_or(1000) };
        // Build once to report semantic errors (families, routes, tables) at load time.
        vectorlb_lb::Control::new(&spec).map_err(|e| Error(e.to_string()))?;
        Ok(Config {
            engine: Engine {
                max_sessions,
                index_entries,
                batch,
                local_port_min,
                local_port_max,
                sweep_budget: g.sweep_budget.unwrap_or(64).max(1),
            },
            spec,
        })
    }

    /// Worker settings for core `core` of `cores`.
    pub fn worker_config(&self, core: u16, cores: u16) -> vectorlb_lb::WorkerConfig {
        let shift = (cores.max(1) as u32).next_power_of_two().trailing_zeros() as u8;
        let mut w = vectorlb_lb::WorkerConfig::new(self.engine.max_sessions);
        w.batch = self.engine.batch;
        w.table.index_entries = self.engine.index_entries;
        w.table.core = core;
        w.table.core_shift = shift;
        w.table.port_min = self.engine.local_port_min;
        w.table.port_max = self.engine.local_port_max;
        w.table.sweep_budget = self.engine.sweep_budget;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[global]
max_sessions = 1000

[[ports]]
name = "eth0"
mac = "02:00:00:00:00:01"
addrs = ["10.0.0.1/24"]

[[neighbors]]
ip = "10.0.0.11"
mac = "02:00:00:00:00:11"

[[services]]
vip = "10.0.0.100"
port = 80
proto = "tcp"
mode = "fnat"
scheduler = "maglev"
local_addrs = ["10.0.0.200"]
backends = [{ addr = "10.0.0.11", port = 8080, weight = 2 }]
"#;

    #[test]
    fn parses_a_good_file() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.engine.max_sessions, 1000);
        assert_eq!(c.spec.services[0].backends[0].weight, 2);
        assert_eq!(c.spec.services[0].mode, Mode::Fnat);
    }

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().0
    }

    #[test]
    fn errors_name_the_field() {
        assert!(err(&GOOD.replace("\"fnat\"", "\"xnat\"")).contains("services[0].mode"));
        assert!(err(&GOOD.replace("10.0.0.11\", port", "10.0.0.311\", port")).contains("services[0].backends[0].addr"));
        assert!(err(&GOOD.replace("max_sessions", "max_sesions")).contains("unknown field"));
        assert!(err(&GOOD.replace("02:00:00:00:00:01", "02:00:00:00:01")).contains("ports[0].mac"));
        assert!(err(&GOOD.replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\ntable_size = 65536"))
            .contains("not prime"));
        assert!(err(&GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = []")).contains("local address"));
        assert!(err(&GOOD.replace("port = 8080", "port = 8080000")).contains("port"));
    }
}
