//! The control API: HTTP/JSON on 127.0.0.1 or a unix socket, described by `docs/openapi.json`
//! (served at `/openapi.json`). Every change goes through [`Shared::edit`]: it is validated
//! and published as a whole, or refused with a 4xx whose message names the bad field.

use crate::daemon::{self, lock, Shared};
use crate::http::{self, Request};
use crate::metrics;
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use vectorlb_config::Config;
use vectorlb_lb::service::{backend_slot, key};
use vectorlb_lb::{BackendSpec, Mode, ServiceSpec, Timeouts};
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");
const MAX_CONNECTIONS: usize = 32;

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

pub struct Server {
    listener: Listener,
    shared: Arc<Shared>,
}

pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// The methods a path takes (sent as `Allow` with 405).
    pub allow: Option<&'static str>,
}

fn reply(status: u16, v: Value) -> Reply {
    let mut body = serde_json::to_vec_pretty(&v).unwrap_or_default();
    body.push(b'\n');
    Reply { status, content_type: "application/json", body, allow: None }
}

fn error(status: u16, msg: impl Into<String>) -> Reply {
    reply(status, json!({ "error": msg.into() }))
}

impl Server {
    pub fn bind(addr: &str, shared: Arc<Shared>) -> Result<Server, String> {
        let listener = if let Some(path) = addr.strip_prefix("unix:") {
            let _ = std::fs::remove_file(path);
            Listener::Unix(UnixListener::bind(path).map_err(|e| format!("runtime.api: cannot listen on {path}: {e}"))?)
        } else {
            let a: SocketAddr = addr.parse().map_err(|_| format!("runtime.api: '{addr}' is not ADDRESS:PORT"))?;
            Listener::Tcp(TcpListener::bind(a).map_err(|e| format!("runtime.api: cannot listen on {a}: {e} (another vectorlb running?)"))?)
        };
        Ok(Server { listener, shared })
    }

    pub fn run(self) {
        let active = Arc::new(AtomicUsize::new(0));
        loop {
            let conn: Box<dyn Conn> = match &self.listener {
                Listener::Tcp(l) => match l.accept() {
                    Ok((s, _)) => with_timeouts(s, |s| (s.set_read_timeout(Some(http::IO_TIMEOUT)), s.set_write_timeout(Some(http::IO_TIMEOUT)))),
                    Err(_) => continue,
                },
                Listener::Unix(l) => match l.accept() {
                    Ok((s, _)) => with_timeouts(s, |s| (s.set_read_timeout(Some(http::IO_TIMEOUT)), s.set_write_timeout(Some(http::IO_TIMEOUT)))),
                    Err(_) => continue,
                },
            };
            if self.shared.stopping() {
                return;
            }
            let mut conn = conn;
            if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                let _ = http::write_response(&mut conn, 503, "application/json", b"{\"error\":\"too many API connections\"}\n", None);
                continue;
            }
            active.fetch_add(1, Ordering::SeqCst);
            let shared = self.shared.clone();
            let active2 = active.clone();
            let spawned = std::thread::Builder::new().name("vlb-api-conn".into()).spawn(move || {
                serve(&shared, &mut conn);
                active2.fetch_sub(1, Ordering::SeqCst);
            });
            if spawned.is_err() {
                active.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

fn with_timeouts<S: Conn + 'static>(s: S, set: impl FnOnce(&S) -> (std::io::Result<()>, std::io::Result<()>)) -> Box<dyn Conn> {
    let _ = set(&s);
    Box::new(s)
}

trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

fn serve(shared: &Arc<Shared>, conn: &mut Box<dyn Conn>) {
    let r = match http::read_request(conn) {
        Ok(req) => handle(shared, &req),
        Err(e) => error(e.status, e.message),
    };
    let _ = http::write_response(conn, r.status, r.content_type, &r.body, r.allow);
}

fn ha_json(shared: &Shared) -> Value {
    use crate::daemon::ha;
    json!({
        "state": ha::name(shared.ha.state()),
        "since_seconds": shared.ha.since().as_secs_f64(),
        "transitions": shared.ha.transitions.load(Ordering::Relaxed),
        "announcements": shared.ha.announcements.load(Ordering::Relaxed),
    })
}

fn set_ha(shared: &Arc<Shared>, req: &Request) -> R {
    let m = body(req)?;
    known(&m, &["state"], "")?;
    let st = get_str(&m, "state", "")?.ok_or((400, "state: required".to_string()))?;
    let new = crate::daemon::ha::parse(st).ok_or_else(|| (400, format!("state: '{st}' is not master, backup or standalone")))?;
    let old = shared.set_ha(new);
    Ok(reply(200, json!({ "state": st, "previous": crate::daemon::ha::name(old) })))
}

/// Routes one request. Public for the fuzz target and tests.
pub fn handle(shared: &Arc<Shared>, req: &Request) -> Reply {
    let segs: Vec<&str> = req.path.trim_end_matches('/').split('/').skip(1).collect();
    let m = req.method.as_str();
    let r = match (m, segs.as_slice()) {
        ("GET", ["metrics"]) => {
            return Reply { status: 200, content_type: "text/plain; version=0.0.4", body: metrics::render(shared).into_bytes(), allow: None }
        }
        ("GET", ["openapi.json"]) => return Reply { status: 200, content_type: "application/json", body: OPENAPI.as_bytes().to_vec(), allow: None },
        ("GET", ["v1", "health"]) => Ok(reply(200, json!({ "status": "ok", "generation": shared.control.generation() }))),
        ("GET", ["v1", "services"]) => Ok(reply(200, Value::Array(list_services(shared)))),
        ("POST", ["v1", "services"]) => add_service(shared, req),
        ("GET", ["v1", "services", p, vip, port]) => find(shared, p, vip, port).map(|i| reply(200, list_services(shared).swap_remove(i))),
        ("PATCH", ["v1", "services", p, vip, port]) => edit_service(shared, req, p, vip, port),
        ("DELETE", ["v1", "services", p, vip, port]) => del_service(shared, p, vip, port),
        ("POST", ["v1", "services", p, vip, port, "backends"]) => add_backend(shared, req, p, vip, port),
        ("PATCH", ["v1", "services", p, vip, port, "backends", addr, bport]) => edit_backend(shared, req, p, vip, port, addr, bport),
        ("DELETE", ["v1", "services", p, vip, port, "backends", addr, bport]) => del_backend(shared, p, vip, port, addr, bport),
        ("GET", ["v1", "sessions"]) => sessions(shared, req),
        ("GET", ["v1", "stats"]) => Ok(reply(200, stats(shared))),
        ("GET", ["v1", "ports"]) => Ok(reply(200, ports(shared))),
        ("GET", ["v1", "neighbors"]) => Ok(reply(200, neighbors(shared))),
        ("GET", ["v1", "config"]) => Ok(Reply { status: 200, content_type: "application/toml", body: lock(&shared.config).to_toml().into_bytes(), allow: None }),
        ("POST", ["v1", "reload"]) => daemon::reload(shared).map(|g| reply(200, json!({ "reloaded": true, "generation": g }))).map_err(|e| (422, e)),
        ("POST", ["v1", "save"]) => save(shared),
        ("GET", ["v1", "ha"]) => Ok(reply(200, ha_json(shared))),
        ("GET", ["v1", "sync"]) => Ok(reply(200, shared.sync.as_ref().map(|s| s.stats.json()).unwrap_or(json!({ "configured": false })))),
        ("POST", ["v1", "ha"]) => set_ha(shared, req),
        _ => match allowed(&segs) {
            Some(allow) => {
                let mut r = error(405, format!("method {m} is not allowed on {} (allowed: {allow})", req.path));
                r.allow = Some(allow);
                return r;
            }
            None => Err((404, format!("no such endpoint: {} (see /openapi.json)", req.path))),
        },
    };
    r.unwrap_or_else(|(s, msg)| error(s, msg))
}

/// The methods a known path takes.
fn allowed(segs: &[&str]) -> Option<&'static str> {
    Some(match segs {
        ["metrics"] | ["openapi.json"] => "GET",
        ["v1", "health" | "sessions" | "stats" | "ports" | "neighbors" | "config"] => "GET",
        ["v1", "reload" | "save"] => "POST",
        ["v1", "ha"] => "GET, POST",
        ["v1", "sync"] => "GET",
        ["v1", "services"] => "GET, POST",
        ["v1", "services", _, _, _] => "GET, PATCH, DELETE",
        ["v1", "services", _, _, _, "backends"] => "POST",
        ["v1", "services", _, _, _, "backends", _, _] => "PATCH, DELETE",
        _ => return None,
    })
}

type R = Result<Reply, (u16, String)>;

fn proto_of(s: &str) -> Result<u8, (u16, String)> {
    match s {
        "tcp" => Ok(proto::TCP),
        "udp" => Ok(proto::UDP),
        _ => Err((400, format!("proto: '{s}' is not tcp or udp"))),
    }
}

fn proto_name(p: u8) -> &'static str {
    if p == proto::UDP {
        "udp"
    } else {
        "tcp"
    }
}

fn ip_of(field: &str, s: &str) -> Result<IpAddr, (u16, String)> {
    s.trim_matches(|c| c == '[' || c == ']').parse().map_err(|_| (400, format!("{field}: '{s}' is not an IP address")))
}

fn port_of(field: &str, s: &str) -> Result<u16, (u16, String)> {
    s.parse().map_err(|_| (400, format!("{field}: '{s}' is not a port number (0..=65535)")))
}

/// Index of the service (proto, vip, port) in the running configuration.
fn find(shared: &Shared, p: &str, vip: &str, port: &str) -> Result<usize, (u16, String)> {
    let (p, vip, port) = (proto_of(p)?, ip_of("vip", vip)?, port_of("port", port)?);
    lock(&shared.config)
        .spec
        .services
        .iter()
        .position(|s| s.proto == p && s.vip == vip && s.port == port)
        .ok_or_else(|| (404, format!("no {} service {}", proto_name(p), SocketAddr::new(vip, port))))
}

fn index_in(c: &Config, p: u8, vip: IpAddr, port: u16) -> Result<usize, String> {
    c.spec.services.iter().position(|s| s.proto == p && s.vip == vip && s.port == port).ok_or_else(|| format!("no {} service {} (changed meanwhile)", proto_name(p), SocketAddr::new(vip, port)))
}

fn body(req: &Request) -> Result<Map<String, Value>, (u16, String)> {
    if req.body.is_empty() {
        return Err((400, "body: a JSON object is required".into()));
    }
    match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err((400, "body: must be a JSON object".into())),
        Err(e) => Err((400, format!("body: invalid JSON: {e}"))),
    }
}

fn known(m: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), (u16, String)> {
    for k in m.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err((400, format!("{what}{k}: unknown field (allowed: {})", allowed.join(", "))));
        }
    }
    Ok(())
}

fn get_str<'a>(m: &'a Map<String, Value>, k: &str, what: &str) -> Result<Option<&'a str>, (u16, String)> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err((400, format!("{what}{k}: must be a string"))),
    }
}

fn get_u64(m: &Map<String, Value>, k: &str, what: &str, max: u64) -> Result<Option<u64>, (u16, String)> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= max => Ok(Some(n)),
            _ => Err((400, format!("{what}{k}: must be an integer in 0..={max}"))),
        },
    }
}

fn get_bool(m: &Map<String, Value>, k: &str, what: &str) -> Result<Option<bool>, (u16, String)> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err((400, format!("{what}{k}: must be true or false"))),
    }
}

fn scheduler(m: &Map<String, Value>, cur: Option<Algorithm>) -> Result<Option<Algorithm>, (u16, String)> {
    let name = get_str(m, "scheduler", "")?;
    let size = get_u64(m, "table_size", "", u32::MAX as u64)?;
    let mut a = match (name, cur) {
        (Some(n), _) => Algorithm::parse(n).ok_or_else(|| (400, format!("scheduler: '{n}' is not one of rr, wrr, wlc, sh, maglev")))?,
        (None, Some(c)) => c,
        (None, None) => Algorithm::parse("wrr").unwrap(),
    };
    if let Some(n) = size {
        match &mut a {
            Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => *table_size = n as u32,
            _ => return Err((422, "table_size: only sh and maglev have a table".into())),
        }
    }
    Ok(if name.is_some() || size.is_some() || cur.is_none() { Some(a) } else { None })
}

fn parse_backend(v: &Value, what: &str) -> Result<BackendSpec, (u16, String)> {
    let Value::Object(m) = v else { return Err((400, format!("{what}: must be an object"))) };
    known(m, &["addr", "port", "weight"], &format!("{what}."))?;
    let w = format!("{what}.");
    let addr = get_str(m, "addr", &w)?.ok_or_else(|| (400, format!("{w}addr: required")))?;
    Ok(BackendSpec {
        addr: ip_of(&format!("{w}addr"), addr)?,
        port: get_u64(m, "port", &w, 65535)?.unwrap_or(0) as u16,
        weight: get_u64(m, "weight", &w, 1_000_000)?.unwrap_or(1) as u32,
    })
}

fn map_err(e: String) -> (u16, String) {
    if e.contains("needs a restart") {
        (409, e)
    } else {
        (422, e)
    }
}

fn add_service(shared: &Shared, req: &Request) -> R {
    let m = body(req)?;
    known(&m, &["vip", "port", "proto", "mode", "scheduler", "table_size", "local_addrs", "toa", "backends"], "")?;
    let vip = ip_of("vip", get_str(&m, "vip", "")?.ok_or((400, "vip: required".to_string()))?)?;
    let port = get_u64(&m, "port", "", 65535)?.unwrap_or(0) as u16;
    let p = proto_of(get_str(&m, "proto", "")?.unwrap_or("tcp"))?;
    let mode_s = get_str(&m, "mode", "")?.unwrap_or("fnat");
    let mode = Mode::parse(mode_s).ok_or_else(|| (400, format!("mode: '{mode_s}' is not one of nat, fnat, dr, tun")))?;
    let sched = scheduler(&m, None)?.unwrap();
    let mut local_addrs = Vec::new();
    match m.get("local_addrs") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for (i, x) in a.iter().enumerate() {
                let s = x.as_str().ok_or_else(|| (400, format!("local_addrs[{i}]: must be a string")))?;
                local_addrs.push(ip_of(&format!("local_addrs[{i}]"), s)?);
            }
        }
        Some(_) => return Err((400, "local_addrs: must be an array of addresses".into())),
    }
    let mut backends = Vec::new();
    match m.get("backends") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for (i, b) in a.iter().enumerate() {
                backends.push(parse_backend(b, &format!("backends[{i}]"))?);
            }
        }
        Some(_) => return Err((400, "backends: must be an array".into())),
    }
    let toa = get_bool(&m, "toa", "")?.unwrap_or(false);
    if toa && (mode != Mode::Fnat || p != proto::TCP) {
        return Err((422, "toa: only tcp fnat services can insert the TOA option".into()));
    }
    if mode != Mode::Fnat && !local_addrs.is_empty() {
        return Err((422, "local_addrs: only fnat services use local addresses".into()));
    }
    shared
        .edit(|c| {
            if c.spec.services.iter().any(|s| s.proto == p && s.vip == vip && s.port == port) {
                return Err(format!("exists: {} service {} is already defined", proto_name(p), SocketAddr::new(vip, port)));
            }
            let timeouts = c.spec.services.first().map(|s| s.timeouts).unwrap_or_else(Timeouts::default);
            c.spec.services.push(ServiceSpec { vip, port, proto: p, mode, scheduler: sched, backends, local_addrs, toa, timeouts });
            Ok(())
        })
        .map_err(|e| if e.starts_with("exists:") { (409, e) } else { map_err(e) })?;
    Ok(reply(201, json!({ "created": format!("{}/{}/{}", proto_name(p), vip, port) })))
}

fn edit_service(shared: &Shared, req: &Request, p: &str, vip: &str, port: &str) -> R {
    find(shared, p, vip, port)?;
    let (p, vip, port) = (proto_of(p)?, ip_of("vip", vip)?, port_of("port", port)?);
    let m = body(req)?;
    known(&m, &["scheduler", "table_size", "toa"], "")?;
    let toa = get_bool(&m, "toa", "")?;
    let cur = lock(&shared.config).spec.services.iter().find(|s| s.proto == p && s.vip == vip && s.port == port).map(|s| s.scheduler);
    let sched = scheduler(&m, cur)?;
    shared
        .edit(|c| {
            let i = index_in(c, p, vip, port)?;
            let s = &mut c.spec.services[i];
            if let Some(a) = sched {
                s.scheduler = a;
            }
            if let Some(t) = toa {
                if t && (s.mode != Mode::Fnat || s.proto != proto::TCP) {
                    return Err("toa: only tcp fnat services can insert the TOA option".into());
                }
                s.toa = t;
            }
            Ok(())
        })
        .map_err(map_err)?;
    Ok(reply(200, json!({ "updated": true })))
}

fn del_service(shared: &Shared, p: &str, vip: &str, port: &str) -> R {
    find(shared, p, vip, port)?;
    let (p, vip, port) = (proto_of(p)?, ip_of("vip", vip)?, port_of("port", port)?);
    shared
        .edit(|c| {
            let i = index_in(c, p, vip, port)?;
            c.spec.services.remove(i);
            Ok(())
        })
        .map_err(map_err)?;
    Ok(reply(200, json!({ "deleted": true })))
}

fn add_backend(shared: &Shared, req: &Request, p: &str, vip: &str, port: &str) -> R {
    find(shared, p, vip, port)?;
    let (p, vip, port) = (proto_of(p)?, ip_of("vip", vip)?, port_of("port", port)?);
    let b = parse_backend(&Value::Object(body(req)?), "body")?;
    shared
        .edit(|c| {
            let i = index_in(c, p, vip, port)?;
            let s = &mut c.spec.services[i];
            if s.backends.iter().any(|x| x.addr == b.addr && x.port == b.port) {
                return Err(format!("exists: backend {} is already in the service", SocketAddr::new(b.addr, b.port)));
            }
            s.backends.push(b.clone());
            Ok(())
        })
        .map_err(|e| if e.starts_with("exists:") { (409, e) } else { map_err(e) })?;
    Ok(reply(201, json!({ "created": SocketAddr::new(b.addr, b.port).to_string() })))
}

fn backend_index(c: &Config, i: usize, addr: IpAddr, port: u16) -> Result<usize, String> {
    c.spec.services[i]
        .backends
        .iter()
        .position(|b| b.addr == addr && b.port == port)
        .ok_or_else(|| format!("missing: no backend {} in the service", SocketAddr::new(addr, port)))
}

fn edit_backend(shared: &Shared, req: &Request, p: &str, vip: &str, port: &str, addr: &str, bport: &str) -> R {
    find(shared, p, vip, port)?;
    let (p, vip, port) = (proto_of(p)?, ip_of("vip", vip)?, port_of("port", port)?);
    let (addr, bport) = (ip_of("backend address", addr)?, port_of("backend port", bport)?);
    let m = body(req)?;
    known(&m, &["weight"], "")?;
    let w = get_u64(&m, "weight", "", 1_000_000)?.ok_or((400, "weight: required".to_string()))? as u32;
    shared
        .edit(|c| {
            let i = index_in(c, p, vip, port)?;
            let j = backend_index(c, i, addr, bport)?;
            c.spec.services[i].backends[j].weight = w;
            Ok(())
        })
        .map_err(|e| if e.starts_with("missing:") { (404, e) } else { map_err(e) })?;
    Ok(reply(200, json!({ "updated": true, "weight": w })))
}

fn del_backend(shared: &Shared, p: &str, vip: &str, port: &str, addr: &str, bport: &str) -> R {
    find(shared, p, vip, port)?;
    let (p, vip, port) = (proto_of(p)?, ip_of("vip", vip)?, port_of("port", port)?);
    let (addr, bport) = (ip_of("backend address", addr)?, port_of("backend port", bport)?);
    shared
        .edit(|c| {
            let i = index_in(c, p, vip, port)?;
            let j = backend_index(c, i, addr, bport)?;
            c.spec.services[i].backends.remove(j);
            Ok(())
        })
        .map_err(|e| if e.starts_with("missing:") { (404, e) } else { map_err(e) })?;
    Ok(reply(200, json!({ "deleted": true })))
}

/// Every service with its backends and counters.
pub fn list_services(shared: &Shared) -> Vec<Value> {
    let snap = shared.control.snapshot();
    let t = shared.totals();
    let rates = lock(&shared.rates).clone();
    let mut out = Vec::new();
    let cfg = lock(&shared.config).spec.services.clone();
    for s in &cfg {
        let id = snap.lookup_service(key(s.vip), s.port, s.proto);
        let sc = id.and_then(|i| t.counters.services.get(i as usize)).copied().unwrap_or_default();
        let mut backends = Vec::new();
        for b in &s.backends {
            let found = id.and_then(|i| snap.backends().find(|x| x.svc == i && x.addr == b.addr && x.port == b.port));
            let slot = found.map(|x| backend_slot(x.id) as usize);
            let bc = slot.and_then(|k| t.counters.backends.get(k)).copied().unwrap_or_default();
            let active = slot.and_then(|k| t.active.get(k)).copied().unwrap_or(0);
            let target = crate::daemon::health::Target { proto: s.proto, vip: s.vip, vport: s.port, addr: b.addr, port: b.port };
            let health = shared.health.state(&target).map(|h| h.json()).unwrap_or(Value::Null);
            backends.push(json!({
                "addr": b.addr.to_string(), "port": b.port, "weight": b.weight,
                "resolved": found.is_some_and(|x| x.hop.is_some()),
                "active_sessions": active, "packets": bc.packets, "bytes": bc.bytes,
                "health": health,
            }));
        }
        let mut v = json!({
            "vip": s.vip.to_string(), "port": s.port, "proto": proto_name(s.proto), "mode": s.mode.name(),
            "scheduler": s.scheduler.name(), "local_addrs": s.local_addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            "toa": s.toa, "backends": backends,
            "stats": { "packets": sc.packets, "bytes": sc.bytes, "new_sessions": sc.new_sessions,
                       "new_sessions_per_second": id.and_then(|i| rates.get(i as usize)).copied().unwrap_or(0.0) },
        });
        if let Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } = s.scheduler {
            v["table_size"] = json!(table_size);
        }
        out.push(v);
    }
    out
}

fn sessions(shared: &Shared, req: &Request) -> R {
    let num = |k: &str, d: usize, max: usize| -> Result<usize, (u16, String)> {
        match req.query(k) {
            None => Ok(d),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n <= max => Ok(n),
                _ => Err((400, format!("{k}: '{v}' is not an integer in 0..={max}"))),
            },
        }
    };
    let worker = num("worker", 0, 65535)?;
    let cursor = num("cursor", 0, u32::MAX as usize)?;
    let limit = num("limit", 100, 10_000)?;
    if limit == 0 || limit > 10_000 {
        return Err((400, "limit: must be in 1..=10000".into()));
    }
    let v6 = match req.query("family") {
        None | Some("4") => false,
        Some("6") => true,
        Some(f) => return Err((400, format!("family: '{f}' is not 4 or 6"))),
    };
    if worker >= shared.workers.len() {
        return Err((404, format!("worker: {worker} does not exist (0..{})", shared.workers.len())));
    }
    let page = shared.sessions(worker, cursor, limit, v6).map_err(|e| (503, e))?;
    Ok(reply(200, json!({ "worker": worker, "family": if v6 { 6 } else { 4 }, "sessions": page.sessions, "next_cursor": page.next })))
}

pub fn stats(shared: &Shared) -> Value {
    let t = shared.totals();
    let c = &t.counters;
    let drops: Map<String, Value> =
        vectorlb_lb::DropReason::ALL.iter().map(|r| (r.name().to_string(), json!(c.dropped(*r)))).collect();
    json!({
        "uptime_seconds": shared.started.elapsed().as_secs_f64(),
        "generation": shared.control.generation(),
        "workers": shared.workers.len(),
        "rx": c.rx, "tx": c.tx, "to_kernel": c.kernel, "drops": drops,
        "sessions": t.sessions, "sessions_created": c.sessions_created,
        "icmp_echo_replies": c.icmp_echo_replies, "icmp_errors_sent": c.icmp_errors_sent,
        "icmp_errors_translated": c.icmp_errors_translated,
        "toa_inserted": c.toa_inserted, "tcp_resets_sent": c.tcp_resets_sent,
        "io": { "tx_full": t.io.tx_full, "multi_segment": t.io.multi_segment, "handed_off": t.io.handed_off,
                "neighbour_replies": t.io.neighbour_replies, "not_ours": t.io.not_ours,
                "polls": t.io.polls, "idle_sleeps": t.io.idle_sleeps },
        "reloads": shared.reloads.load(Ordering::Relaxed), "reload_failures": shared.reload_failures.load(Ordering::Relaxed),
        "mbufs_available": shared.pool.available(),
        "ha": ha_json(shared),
        "sync": shared.sync.as_ref().map(|s| s.stats.json()),
    })
}

fn ports(shared: &Shared) -> Value {
    let cfg = lock(&shared.config);
    Value::Array(
        shared
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let s = p.port.stats();
                let l = p.port.link();
                let mac = cfg.spec.ports.get(i).map(|x| vectorlb_config::format_mac(&x.mac)).unwrap_or_default();
                json!({
                    "name": p.name, "device": p.device, "port_id": p.port.id, "mac": mac,
                    "link_up": l.up, "speed_mbps": l.speed_mbps, "xdp_interface": p.xdp_iface,
                    "ipackets": s.ipackets, "opackets": s.opackets, "ibytes": s.ibytes, "obytes": s.obytes,
                    "imissed": s.imissed, "ierrors": s.ierrors, "oerrors": s.oerrors, "rx_nombuf": s.rx_nombuf,
                })
            })
            .collect(),
    )
}

fn neighbors(shared: &Shared) -> Value {
    let cfg = lock(&shared.config);
    let mut v: Vec<Value> = cfg
        .spec
        .neighbors
        .iter()
        .map(|(a, m)| json!({ "ip": a.to_string(), "mac": vectorlb_config::format_mac(m), "static": true }))
        .collect();
    for (a, n) in lock(&shared.learned).iter() {
        v.push(json!({ "ip": a.to_string(), "mac": vectorlb_config::format_mac(&n.mac), "static": false,
                        "port": n.port, "age_seconds": n.seen.elapsed().as_secs_f64() }));
    }
    Value::Array(v)
}

fn save(shared: &Shared) -> R {
    let text = lock(&shared.config).to_toml();
    let tmp = shared.path.with_extension("toml.tmp");
    std::fs::write(&tmp, &text)
        .and_then(|_| std::fs::rename(&tmp, &shared.path))
        .map_err(|e| (500, format!("saving to {}: {e}", shared.path.display())))?;
    Ok(reply(200, json!({ "saved": shared.path.display().to_string(), "bytes": text.len() })))
}
