//! `vectorlb ctl`: the API's command line, with verbs and a listing that feel like ipvsadm.

use clap::Args;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use vectorlb_wire::call::Method;
use vectorlb_wire::model::{
    BackendPatch, BgpStatus, Created, Deleted, DrainChange, HaChange, HaChanged, HaStatus, Health, ModeName, Neighbor, NewBackend, NewService, PortStatus, Rates, Reloaded, Saved,
    ServicePatch, ServiceStatus, SessionPage, Stats, SynProxyName, Updated,
};
use vectorlb_wire::{Api as WireApi, CallError, Wire};

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  vectorlb ctl -A -t 10.0.0.100:80 -s maglev --mode fnat --laddr 10.1.0.200
  vectorlb ctl -a -t 10.0.0.100:80 -r 10.1.0.11:8080 -w 3
  vectorlb ctl -e -t 10.0.0.100:80 -r 10.1.0.11:8080 -w 0     (drain)
  vectorlb ctl -d -t 10.0.0.100:80 -r 10.1.0.11:8080
  vectorlb ctl -Ln            vectorlb ctl -L -c (sessions)      vectorlb ctl --save
  vectorlb ctl bgp            vectorlb ctl drain --deadline 60 --wait      vectorlb ctl undrain")]
pub struct CtlArgs {
    /// The daemon's API: unix:PATH or ADDRESS:PORT.
    #[arg(long, env = "VECTORLB_API", default_value = vectorlb_config::DEFAULT_API)]
    pub api: String,
    /// The token a TCP API needs (runtime.api_token_file): a file holding it.
    #[arg(long, env = "VECTORLB_API_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Add a virtual service.
    #[arg(short = 'A', long = "add-service")]
    pub add_service: bool,
    /// Edit a virtual service (scheduler).
    #[arg(short = 'E', long = "edit-service")]
    pub edit_service: bool,
    /// Delete a virtual service.
    #[arg(short = 'D', long = "delete-service")]
    pub delete_service: bool,
    /// Add a real server (backend) to a service.
    #[arg(short = 'a', long = "add-server")]
    pub add_server: bool,
    /// Edit a real server's weight (0 drains it).
    #[arg(short = 'e', long = "edit-server")]
    pub edit_server: bool,
    /// Delete a real server.
    #[arg(short = 'd', long = "delete-server")]
    pub delete_server: bool,
    /// List services and backends (or sessions with -c).
    #[arg(short = 'L', long = "list")]
    pub list: bool,
    /// Numeric output (always the case; accepted for ipvsadm habits).
    #[arg(short = 'n', long = "numeric")]
    pub numeric: bool,
    /// With -L: list sessions.
    #[arg(short = 'c', long = "connection")]
    pub connection: bool,
    /// With -L: counters per service and backend.
    #[arg(long)]
    pub stats: bool,
    /// With -L: rates per service and backend (per second over the last 10 s).
    #[arg(long, conflicts_with = "stats")]
    pub rate: bool,
    /// TCP service VIP:PORT ([v6]:port for IPv6).
    #[arg(short = 't', long = "tcp-service", value_name = "VIP:PORT")]
    pub tcp: Option<String>,
    /// UDP service VIP:PORT.
    #[arg(short = 'u', long = "udp-service", value_name = "VIP:PORT")]
    pub udp: Option<String>,
    /// Scheduler: rr, wrr, wlc, sh, maglev.
    #[arg(short = 's', long = "scheduler")]
    pub scheduler: Option<String>,
    /// Real server ADDRESS:PORT.
    #[arg(short = 'r', long = "real-server", value_name = "RS:PORT")]
    pub real: Option<String>,
    /// Weight of the real server.
    #[arg(short = 'w', long = "weight")]
    pub weight: Option<u32>,
    /// Forwarding mode of a new service: nat, fnat, dr, tun (default fnat).
    #[arg(long)]
    pub mode: Option<String>,
    /// Full-NAT local addresses of a new service (comma-separated).
    #[arg(long = "laddr", value_delimiter = ',')]
    pub laddrs: Vec<String>,
    /// Insert the TOA option (tcp fnat).
    #[arg(long)]
    pub toa: bool,
    /// SYN proxy of a new service: on, off, auto (tcp nat and fnat).
    #[arg(long, value_parser = ["on", "off", "auto"])]
    pub synproxy: Option<String>,
    /// Client affinity of a new service: a client keeps its backend while it opens a new
    /// connection within SECONDS of its last (1 to 86400; ipvsadm's persistence).
    #[arg(short = 'p', long = "persistent", value_name = "SECONDS")]
    pub persistent: Option<u32>,
    /// Re-read the configuration file.
    #[arg(long)]
    pub reload: bool,
    /// Write the running configuration back to its file.
    #[arg(long)]
    pub save: bool,
    /// Print global statistics (JSON).
    #[arg(long = "global-stats")]
    pub global_stats: bool,
    /// Print the ports (JSON).
    #[arg(long)]
    pub ports: bool,
    /// Print the neighbour table (JSON).
    #[arg(long)]
    pub neighbors: bool,
    /// Set the HA state: master, backup or standalone (keepalived's notify scripts call this).
    #[arg(long = "ha-state", value_name = "STATE")]
    pub ha_state: Option<String>,
    /// Print the HA state (JSON).
    #[arg(long)]
    pub ha: bool,
    /// `drain`: withdraw this node's VIPs from BGP and keep serving its flows until they end
    /// or --deadline passes; `undrain`: announce them again; `bgp`: the speaker's state.
    #[arg(value_parser = ["drain", "undrain", "bgp"], value_name = "drain|undrain|bgp")]
    pub verb: Option<String>,
    /// With drain: the seconds existing flows are given (default 300).
    #[arg(long, value_name = "SECONDS", requires = "verb")]
    pub deadline: Option<u32>,
    /// With drain: wait until the node is drained (no session left, or the deadline passed).
    #[arg(long, requires = "verb")]
    pub wait: bool,
    /// Raw request: METHOD PATH [JSON body], printing the answer.
    #[arg(long, num_args = 2..=3, value_names = ["METHOD", "PATH", "BODY"])]
    pub raw: Vec<String>,
}

/// Why a `ctl` command failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("{0}")]
    Usage(String),
    #[error("--api: '{0}' is not unix:PATH or ADDRESS:PORT")]
    Target(String),
    #[error("cannot reach the API at {api}: {source} (is `vectorlb run` up?)")]
    Unreachable { api: String, source: vectorlb_client::Error },
    #[error("the API at {api} did not answer properly: {why}")]
    BadAnswer { api: String, why: String },
    /// The API refused: its status and message.
    #[error("{status}: {message}")]
    Refused { status: u16, message: String },
    #[error("BODY: invalid JSON: {0}")]
    Body(serde_json::Error),
    #[error("--token-file {path}: {source}")]
    Token { path: String, source: std::io::Error },
    #[error("the data plane is degraded: {0}")]
    Degraded(String),
}

/// The token for `--token-file`, read once.
fn token(a: &CtlArgs) -> Result<Option<String>, CtlError> {
    match &a.token_file {
        None => Ok(None),
        Some(p) => std::fs::read_to_string(p).map(|t| Some(t.trim().to_string())).map_err(|source| CtlError::Token { path: p.display().to_string(), source }),
    }
}

fn usage(m: impl Into<String>) -> CtlError {
    CtlError::Usage(m.into())
}

/// Where the API is, and the token it needs.
struct Api {
    target: String,
    wire: WireApi,
}

impl Api {
    fn new(target: &str, token: Option<String>) -> Result<Api, CtlError> {
        let mut wire = WireApi::new(target, token).map_err(|_| CtlError::Target(target.to_string()))?;
        wire.options = vectorlb_client::Options::default();
        Ok(Api { target: target.to_string(), wire })
    }

    fn failed(&self, e: CallError) -> CtlError {
        let api = self.target.clone();
        match e {
            CallError::Unreachable { error: source @ (vectorlb_client::Error::Connect(_) | vectorlb_client::Error::ConnectTimeout(_)), .. } => {
                CtlError::Unreachable { api, source }
            }
            CallError::Unreachable { error: source, .. } => CtlError::BadAnswer { api, why: source.to_string() },
            CallError::Refused { status, body, .. } => CtlError::Refused { status, message: body.error },
            e @ CallError::Answer { .. } => CtlError::BadAnswer { api, why: e.to_string() },
            CallError::BadTarget(t) => CtlError::Target(t),
        }
    }

    /// A call whose answer is of type `R`.
    fn call<B: Serialize + Wire, R: DeserializeOwned + Wire>(&self, method: Method, path: &str, body: Option<&B>) -> Result<R, CtlError> {
        self.wire.call_blocking(method, path, body).map_err(|e| self.failed(e))
    }

    fn get<R: DeserializeOwned + Wire>(&self, path: &str) -> Result<R, CtlError> {
        self.call::<(), R>(Method::GET, path, None)
    }

    /// `GET /v1/health`: its report whether the data plane is well (200) or not (503).
    fn health(&self) -> Result<Health, CtlError> {
        self.wire.get_also_blocking("/v1/health", &[503]).map_err(|e| self.failed(e))
    }
}

/// A word of the API (a mode, a scheduler) read as the API reads it.
fn word<T: DeserializeOwned>(what: &str, s: &str) -> Result<T, CtlError> {
    use serde::de::IntoDeserializer;
    T::deserialize(s.into_deserializer()).map_err(|e: serde::de::value::Error| usage(format!("{what}: {e}")))
}

fn parse_sock(what: &str, s: &str) -> Result<(IpAddr, u16), CtlError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok((a.ip(), a.port()));
    }
    if let Ok(ip) = s.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
        return Ok((ip, 0));
    }
    Err(usage(format!("{what}: '{s}' is not ADDRESS:PORT (use [v6addr]:port for IPv6)")))
}

fn svc_path(a: &CtlArgs) -> Result<(String, IpAddr, u16, &'static str), CtlError> {
    let (s, p) = match (&a.tcp, &a.udp) {
        (Some(s), None) => (s, "tcp"),
        (None, Some(s)) => (s, "udp"),
        (Some(_), Some(_)) => return Err(usage("give -t or -u, not both")),
        (None, None) => return Err(usage("this command needs a service: -t VIP:PORT or -u VIP:PORT")),
    };
    let (ip, port) = parse_sock(if p == "tcp" { "-t" } else { "-u" }, s)?;
    Ok((format!("/v1/services/{p}/{ip}/{port}"), ip, port, p))
}

fn real(a: &CtlArgs) -> Result<(IpAddr, u16), CtlError> {
    parse_sock("-r", a.real.as_deref().ok_or_else(|| usage("this command needs a real server: -r ADDRESS:PORT"))?)
}

pub fn run(a: &CtlArgs) -> Result<(), CtlError> {
    let api = &Api::new(&a.api, token(a)?)?;
    let verbs = [
        a.add_service,
        a.edit_service,
        a.delete_service,
        a.add_server,
        a.edit_server,
        a.delete_server,
        a.list,
        a.reload,
        a.save,
        a.global_stats,
        a.ports,
        a.neighbors,
        !a.raw.is_empty(),
        a.ha_state.is_some(),
        a.ha,
        a.verb.is_some(),
    ];
    match verbs.iter().filter(|v| **v).count() {
        0 => return Err(usage("nothing to do: give a command such as -A, -a, -e, -d, -L (see --help)")),
        1 => {}
        _ => return Err(usage("give one command at a time")),
    }
    if let Some(verb) = a.verb.as_deref() {
        return bgp(api, verb, a.deadline, a.wait);
    }
    if !a.raw.is_empty() {
        return raw(a);
    }
    if a.add_service {
        let (_, vip, port, p) = svc_path(a)?;
        let local_addrs = a.laddrs.iter().map(|l| l.parse::<IpAddr>().map_err(|_| usage(format!("--laddr: '{l}' is not an IP address")))).collect::<Result<Vec<_>, _>>()?;
        let body = NewService {
            vip,
            port,
            proto: word("-t/-u", p)?,
            mode: word("--mode", a.mode.as_deref().unwrap_or("fnat"))?,
            scheduler: a.scheduler.as_deref().map(|s| word("-s", s)).transpose()?,
            table_size: None,
            local_addrs,
            keep_source: Vec::new(),
            peer_local_addrs: Vec::new(),
            toa: a.toa,
            synproxy: a.synproxy.as_deref().map(|s| word("--synproxy", s)).transpose()?,
            affinity_timeout_s: a.persistent,
            health: None,
            backends: Vec::new(),
        };
        let _: Created = api.call(Method::POST, "/v1/services", Some(&body))?;
    } else if a.edit_service {
        let (path, ..) = svc_path(a)?;
        let s = a.scheduler.as_deref().ok_or_else(|| usage("-E needs -s SCHEDULER"))?;
        let body = ServicePatch { scheduler: Some(word("-s", s)?), table_size: None, toa: None, synproxy: None };
        let _: Updated = api.call(Method::PATCH, &path, Some(&body))?;
    } else if a.delete_service {
        let (path, ..) = svc_path(a)?;
        let _: Deleted = api.call::<(), _>(Method::DELETE, &path, None)?;
    } else if a.add_server {
        let (path, ..) = svc_path(a)?;
        let (addr, port) = real(a)?;
        let _: Created = api.call(Method::POST, &format!("{path}/backends"), Some(&NewBackend { addr, port, weight: a.weight.unwrap_or(1) }))?;
    } else if a.edit_server {
        let (path, ..) = svc_path(a)?;
        let (ip, port) = real(a)?;
        let weight = a.weight.ok_or_else(|| usage("-e needs -w WEIGHT"))?;
        let _: Updated = api.call(Method::PATCH, &format!("{path}/backends/{ip}/{port}"), Some(&BackendPatch { weight }))?;
    } else if a.delete_server {
        let (path, ..) = svc_path(a)?;
        let (ip, port) = real(a)?;
        let _: Deleted = api.call::<(), _>(Method::DELETE, &format!("{path}/backends/{ip}/{port}"), None)?;
    } else if a.list && a.connection {
        list_sessions(api)?;
    } else if a.list {
        list(
            api,
            if a.rate {
                Columns::Rate
            } else if a.stats {
                Columns::Stats
            } else {
                Columns::Plain
            },
        )?;
    } else if a.reload {
        let r: Reloaded = api.call::<(), _>(Method::POST, "/v1/reload", None)?;
        println!("reloaded (generation {})", r.generation);
    } else if let Some(st) = &a.ha_state {
        let r: HaChanged = api.call(Method::POST, "/v1/ha", Some(&HaChange { state: word("--ha-state", st)? }))?;
        println!("ha state {} (was {})", r.state.name(), r.previous.name());
    } else if a.ha {
        // keepalived's track script: a data plane that does not work fails it, whatever the
        // HA state, so that the VIPs move to the other node.
        let h = api.health()?;
        if !h.problems.is_empty() {
            return Err(CtlError::Degraded(h.problems.join("; ")));
        }
        pretty(&api.get::<HaStatus>("/v1/ha")?);
    } else if a.save {
        let r: Saved = api.call::<(), _>(Method::POST, "/v1/save", None)?;
        println!("saved to {}", r.saved);
    } else if a.global_stats {
        pretty(&api.get::<Stats>("/v1/stats")?);
    } else if a.ports {
        pretty(&api.get::<Vec<PortStatus>>("/v1/ports")?);
    } else {
        pretty(&api.get::<Vec<Neighbor>>("/v1/neighbors")?);
    }
    Ok(())
}

/// `ctl bgp`, `ctl drain`, `ctl undrain`.
fn bgp(api: &Api, verb: &str, deadline: Option<u32>, wait: bool) -> Result<(), CtlError> {
    if verb != "drain" && (deadline.is_some() || wait) {
        return Err(usage("--deadline and --wait go with drain"));
    }
    let mut v: BgpStatus = match verb {
        "bgp" => api.get("/v1/bgp")?,
        "drain" => api.call(Method::POST, "/v1/drain", Some(&DrainChange { drain: true, deadline_seconds: deadline }))?,
        _ => api.call(Method::POST, "/v1/drain", Some(&DrainChange { drain: false, deadline_seconds: None }))?,
    };
    if wait {
        let mut last = None;
        while v.state == "draining" {
            let left = v.drain.as_ref().map(|d| d.sessions);
            if left != last {
                println!("draining: {} sessions left, deadline in {:.0} s", left.unwrap_or(0), v.drain.as_ref().map_or(0.0, |d| d.deadline_in_seconds));
                last = left;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
            v = api.get("/v1/bgp")?;
        }
    }
    print_bgp(&v);
    Ok(())
}

fn print_bgp(v: &BgpStatus) {
    println!("bgp {}: BIRD {} (started again {} times), {} changes announced", v.state, if v.bird_running { "up" } else { "DOWN" }, v.bird_restarts, v.changes);
    println!("  announced: {}", v.announced.join(", "));
    if !v.announced_backup.is_empty() {
        println!("  backup:    {} (the peers' local addresses, longer AS path)", v.announced_backup.join(", "));
    }
    if !v.withheld.is_empty() {
        println!("  withheld:  {}", v.withheld.join(", "));
    }
    for r in &v.reasons {
        println!("  why: {r}");
    }
    if let Some(e) = &v.error {
        println!("  error: {e}");
    }
    if let Some(d) = &v.drain {
        println!("  drain: {} sessions left, {:.0} s since, deadline in {:.0} s{}", d.sessions, d.since_seconds, d.deadline_in_seconds, if d.done { " (done)" } else { "" });
    }
    for n in &v.neighbors {
        println!("  neighbor {} AS {}: {} {}", n.address, n.asn, n.state, n.info);
    }
}

fn pretty<T: Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// `--raw METHOD PATH [BODY]`: the body goes as given (checked to be JSON), the answer is
/// printed as it came.
fn raw(a: &CtlArgs) -> Result<(), CtlError> {
    let target: vectorlb_client::Target = a.api.parse().map_err(|_| CtlError::Target(a.api.clone()))?;
    let method = Method::from_bytes(a.raw[0].as_bytes()).map_err(|_| usage(format!("'{}' is not an HTTP method", a.raw[0])))?;
    let body = match a.raw.get(2) {
        Some(b) => {
            serde_json::from_str::<serde::de::IgnoredAny>(b).map_err(CtlError::Body)?;
            Some(b.clone().into_bytes())
        }
        None => None,
    };
    let req = vectorlb_client::Request { method, path: a.raw[1].clone(), host: "vectorlb".into(), body, content_type: "application/json", bearer: token(a)? };
    let r = vectorlb_client::request_blocking(&target, &req, &vectorlb_client::Options::default()).map_err(|source| {
        let api = a.api.clone();
        match source {
            vectorlb_client::Error::Connect(_) | vectorlb_client::Error::ConnectTimeout(_) => CtlError::Unreachable { api, source },
            _ => CtlError::BadAnswer { api, why: source.to_string() },
        }
    })?;
    print!("{}", String::from_utf8_lossy(&r.body));
    let status = r.status.as_u16();
    if status < 300 {
        Ok(())
    } else {
        Err(CtlError::Refused { status, message: "see the answer above".into() })
    }
}

fn mode_word(m: ModeName) -> &'static str {
    match m {
        ModeName::Nat => "Masq",
        ModeName::Fnat => "FullNat",
        ModeName::Dr => "Route",
        ModeName::Tun => "Tunnel",
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Columns {
    Plain,
    Stats,
    Rate,
}

fn list(api: &Api, cols: Columns) -> Result<(), CtlError> {
    let services: Vec<ServiceStatus> = api.get("/v1/services")?;
    // A degraded data plane still lists (and says so).
    let h = api.health()?;
    for p in &h.problems {
        eprintln!("vectorlb: degraded: {p}");
    }
    println!("vectorlb {} (configuration generation {})", env!("CARGO_PKG_VERSION"), h.generation);
    match cols {
        Columns::Stats => println!("Prot LocalAddress:Port               Conns/s    Packets      Bytes\n  -> RemoteAddress:Port             ActiveConn Packets      Bytes"),
        Columns::Rate => println!(
            "Prot LocalAddress:Port               CPS        PPS          BPS          (per second, last 10 s)\n  -> RemoteAddress:Port             CPS        PPS          BPS"
        ),
        Columns::Plain => println!("Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn"),
    }
    let rates = |r: &Rates| format!("{:<10.1} {:<12.1} {:.1}", r.new_sessions_per_second, r.packets_per_second, r.bytes_per_second);
    let sock = |ip: &str, port: u16| SocketAddr::new(ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])), port).to_string();
    for s in &services {
        let proto = s.proto.name().to_uppercase();
        let vip = sock(&s.vip, s.port);
        match cols {
            Columns::Stats => println!("{proto:<4} {vip:<32} {:<10.1} {:<12} {}", s.stats.new_sessions_per_second, s.stats.packets, s.stats.bytes),
            Columns::Rate => println!("{proto:<4} {vip:<32} {}", rates(&s.stats.rates)),
            Columns::Plain => {
                let mut flags = s.mode.name().to_string();
                if s.toa {
                    flags.push_str(",toa");
                }
                if s.synproxy != SynProxyName::Off {
                    flags.push_str(&format!(",synproxy={}", s.synproxy.name()));
                }
                println!("{proto:<4} {vip} {} {flags}", s.scheduler.name());
            }
        }
        for b in &s.backends {
            let rs = sock(&b.addr, b.port);
            match cols {
                Columns::Stats => println!("  -> {rs:<30} {:<10} {:<12} {}", b.active_sessions, b.packets, b.bytes),
                Columns::Rate => println!("  -> {rs:<30} {}", rates(&b.rates)),
                Columns::Plain => println!("  -> {rs:<28} {:<7} {:<6} {}", mode_word(s.mode), b.weight, b.active_sessions),
            }
        }
    }
    Ok(())
}

fn list_sessions(api: &Api) -> Result<(), CtlError> {
    let st: Stats = api.get("/v1/stats")?;
    println!("{:<5} {:<10} {:<44} {:<44} {:<30} Expires", "Pro", "State", "Source", "Virtual", "Destination");
    for w in 0..st.workers.max(1) {
        for fam in [4, 6] {
            let mut cursor = Some(0u64);
            while let Some(c) = cursor {
                let page: SessionPage = api.get(&format!("/v1/sessions?worker={w}&family={fam}&cursor={c}&limit=1000"))?;
                for s in &page.sessions {
                    println!("{:<5} {:<10} {:<44} {:<44} {:<30} {:.1}s", s.proto.name(), s.state, s.client, s.vip, s.backend, s.expires_ms as f64 / 1000.0);
                }
                cursor = page.next_cursor;
            }
        }
    }
    Ok(())
}
