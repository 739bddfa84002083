//! `vectorlb ctl`: the API's command line, with verbs and a listing that feel like ipvsadm.

use clap::Args;
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};

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
    #[error("--api: {0}")]
    Target(vectorlb_client::Error),
    #[error("cannot reach the API at {api}: {source} (is `vectorlb run` up?)")]
    Unreachable { api: String, source: vectorlb_client::Error },
    #[error("the API at {api} did not answer properly: {source}")]
    BadAnswer { api: String, source: vectorlb_client::Error },
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

/// One API call: returns (status, body).
pub fn call(api: &str, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Vec<u8>), CtlError> {
    call_with(api, None, method, path, body)
}

/// One API call with a bearer token: returns (status, body).
pub fn call_with(api: &str, bearer: Option<&str>, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Vec<u8>), CtlError> {
    let target: vectorlb_client::Target = api.parse().map_err(CtlError::Target)?;
    let method = vectorlb_client::Method::from_bytes(method.as_bytes()).map_err(|_| usage(format!("'{method}' is not an HTTP method")))?;
    let req = vectorlb_client::Request {
        method,
        path: path.to_string(),
        host: "vectorlb".into(),
        body: body.map(|b| b.to_string().into_bytes()),
        content_type: "application/json",
        bearer: bearer.map(str::to_string),
    };
    let r = vectorlb_client::request_blocking(&target, &req, &vectorlb_client::Options::default()).map_err(|source| {
        let api = api.to_string();
        match source {
            vectorlb_client::Error::Connect(_) | vectorlb_client::Error::ConnectTimeout(_) => CtlError::Unreachable { api, source },
            _ => CtlError::BadAnswer { api, source },
        }
    })?;
    Ok((r.status.as_u16(), r.body.to_vec()))
}

/// Where the API is, and the token it needs.
struct Api {
    target: String,
    token: Option<String>,
}

fn ok(api: &Api, method: &str, path: &str, body: Option<&Value>) -> Result<Value, CtlError> {
    let (status, b) = call_with(&api.target, api.token.as_deref(), method, path, body)?;
    let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
    if status >= 300 {
        let message = v.get("error").and_then(|e| e.as_str()).map(str::to_string).unwrap_or_else(|| String::from_utf8_lossy(&b).into_owned());
        return Err(CtlError::Refused { status, message });
    }
    Ok(v)
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
    let api = &Api { target: a.api.clone(), token: token(a)? };
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
        let body = match a.raw.get(2) {
            Some(b) => Some(serde_json::from_str::<Value>(b).map_err(CtlError::Body)?),
            None => None,
        };
        let (status, b) = call_with(&api.target, api.token.as_deref(), &a.raw[0], &a.raw[1], body.as_ref())?;
        print!("{}", String::from_utf8_lossy(&b));
        return if status < 300 { Ok(()) } else { Err(CtlError::Refused { status, message: "see the answer above".into() }) };
    }
    if a.add_service {
        let (_, ip, port, p) = svc_path(a)?;
        let mut body = json!({ "vip": ip.to_string(), "port": port, "proto": p, "mode": a.mode.as_deref().unwrap_or("fnat") });
        if let Some(s) = &a.scheduler {
            body["scheduler"] = json!(s);
        }
        if !a.laddrs.is_empty() {
            body["local_addrs"] = json!(a.laddrs);
        }
        if a.toa {
            body["toa"] = json!(true);
        }
        if let Some(p) = &a.synproxy {
            body["synproxy"] = json!(p);
        }
        ok(api, "POST", "/v1/services", Some(&body))?;
    } else if a.edit_service {
        let (path, ..) = svc_path(a)?;
        let s = a.scheduler.as_deref().ok_or_else(|| usage("-E needs -s SCHEDULER"))?;
        ok(api, "PATCH", &path, Some(&json!({ "scheduler": s })))?;
    } else if a.delete_service {
        let (path, ..) = svc_path(a)?;
        ok(api, "DELETE", &path, None)?;
    } else if a.add_server {
        let (path, ..) = svc_path(a)?;
        let (ip, port) = real(a)?;
        ok(api, "POST", &format!("{path}/backends"), Some(&json!({ "addr": ip.to_string(), "port": port, "weight": a.weight.unwrap_or(1) })))?;
    } else if a.edit_server {
        let (path, ..) = svc_path(a)?;
        let (ip, port) = real(a)?;
        let w = a.weight.ok_or_else(|| usage("-e needs -w WEIGHT"))?;
        ok(api, "PATCH", &format!("{path}/backends/{ip}/{port}"), Some(&json!({ "weight": w })))?;
    } else if a.delete_server {
        let (path, ..) = svc_path(a)?;
        let (ip, port) = real(a)?;
        ok(api, "DELETE", &format!("{path}/backends/{ip}/{port}"), None)?;
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
        let v = ok(api, "POST", "/v1/reload", None)?;
        println!("reloaded (generation {})", v["generation"]);
    } else if let Some(st) = &a.ha_state {
        let v = ok(api, "POST", "/v1/ha", Some(&json!({ "state": st })))?;
        println!("ha state {} (was {})", st, v["previous"].as_str().unwrap_or("?"));
    } else if a.ha {
        // keepalived's track script: a data plane that does not work fails it, whatever the
        // HA state, so that the VIPs move to the other node.
        let (status, b) = call_with(&api.target, api.token.as_deref(), "GET", "/v1/health", None)?;
        if status == 503 {
            let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
            let problems: Vec<String> = v["problems"].as_array().into_iter().flatten().filter_map(|p| p.as_str().map(str::to_string)).collect();
            return Err(CtlError::Degraded(problems.join("; ")));
        }
        println!("{}", serde_json::to_string_pretty(&ok(api, "GET", "/v1/ha", None)?).unwrap_or_default());
    } else if a.save {
        let v = ok(api, "POST", "/v1/save", None)?;
        println!("saved to {}", v["saved"].as_str().unwrap_or("?"));
    } else {
        let path = if a.global_stats {
            "/v1/stats"
        } else if a.ports {
            "/v1/ports"
        } else {
            "/v1/neighbors"
        };
        println!("{}", serde_json::to_string_pretty(&ok(api, "GET", path, None)?).unwrap_or_default());
    }
    Ok(())
}

/// `ctl bgp`, `ctl drain`, `ctl undrain`.
fn bgp(api: &Api, verb: &str, deadline: Option<u32>, wait: bool) -> Result<(), CtlError> {
    if verb != "drain" && (deadline.is_some() || wait) {
        return Err(usage("--deadline and --wait go with drain"));
    }
    let mut v = match verb {
        "bgp" => ok(api, "GET", "/v1/bgp", None)?,
        "drain" => {
            let mut body = json!({ "drain": true });
            if let Some(d) = deadline {
                body["deadline_seconds"] = json!(d);
            }
            ok(api, "POST", "/v1/drain", Some(&body))?
        }
        _ => ok(api, "POST", "/v1/drain", Some(&json!({ "drain": false })))?,
    };
    if wait {
        let mut last = None;
        while v["state"] == "draining" {
            let left = v["drain"]["sessions"].as_u64();
            if left != last {
                println!("draining: {} sessions left, deadline in {:.0} s", left.unwrap_or(0), v["drain"]["deadline_in_seconds"].as_f64().unwrap_or(0.0));
                last = left;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
            v = ok(api, "GET", "/v1/bgp", None)?;
        }
    }
    print_bgp(&v);
    Ok(())
}

fn print_bgp(v: &Value) {
    let words = |k: &str| v[k].as_array().into_iter().flatten().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", ");
    println!(
        "bgp {}: BIRD {} (started again {} times), {} changes announced",
        v["state"].as_str().unwrap_or("?"),
        if v["bird_running"] == true { "up" } else { "DOWN" },
        v["bird_restarts"],
        v["changes"]
    );
    println!("  announced: {}", words("announced"));
    if !words("announced_backup").is_empty() {
        println!("  backup:    {} (the peers' local addresses, longer AS path)", words("announced_backup"));
    }
    if !words("withheld").is_empty() {
        println!("  withheld:  {}", words("withheld"));
    }
    for r in v["reasons"].as_array().into_iter().flatten() {
        println!("  why: {}", r.as_str().unwrap_or(""));
    }
    if let Some(e) = v["error"].as_str() {
        println!("  error: {e}");
    }
    if let Some(d) = v.get("drain").filter(|d| d.is_object()) {
        println!(
            "  drain: {} sessions left, {:.0} s since, deadline in {:.0} s{}",
            d["sessions"],
            d["since_seconds"].as_f64().unwrap_or(0.0),
            d["deadline_in_seconds"].as_f64().unwrap_or(0.0),
            if d["done"] == true { " (done)" } else { "" }
        );
    }
    for n in v["neighbors"].as_array().into_iter().flatten() {
        println!("  neighbor {} AS {}: {} {}", n["address"].as_str().unwrap_or("?"), n["asn"], n["state"].as_str().unwrap_or("?"), n["info"].as_str().unwrap_or(""));
    }
}

fn sock(ip: &Value, port: &Value) -> String {
    let ip: IpAddr = ip.as_str().and_then(|s| s.parse().ok()).unwrap_or(IpAddr::from([0, 0, 0, 0]));
    SocketAddr::new(ip, port.as_u64().unwrap_or(0) as u16).to_string()
}

fn mode_word(m: &str) -> &'static str {
    match m {
        "nat" => "Masq",
        "fnat" => "FullNat",
        "dr" => "Route",
        "tun" => "Tunnel",
        _ => "?",
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Columns {
    Plain,
    Stats,
    Rate,
}

fn list(api: &Api, cols: Columns) -> Result<(), CtlError> {
    let v = ok(api, "GET", "/v1/services", None)?;
    // A degraded data plane still lists (and says so).
    let (_, hb) = call_with(&api.target, api.token.as_deref(), "GET", "/v1/health", None)?;
    let h: Value = serde_json::from_slice(&hb).unwrap_or(Value::Null);
    for p in h["problems"].as_array().into_iter().flatten() {
        eprintln!("vectorlb: degraded: {}", p.as_str().unwrap_or(""));
    }
    println!("vectorlb {} (configuration generation {})", env!("CARGO_PKG_VERSION"), h["generation"]);
    match cols {
        Columns::Stats => println!("Prot LocalAddress:Port               Conns/s    Packets      Bytes\n  -> RemoteAddress:Port             ActiveConn Packets      Bytes"),
        Columns::Rate => println!(
            "Prot LocalAddress:Port               CPS        PPS          BPS          (per second, last 10 s)\n  -> RemoteAddress:Port             CPS        PPS          BPS"
        ),
        Columns::Plain => println!("Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn"),
    }
    let rates = |r: &Value| {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        format!("{:<10.1} {:<12.1} {:.1}", f("new_sessions_per_second"), f("packets_per_second"), f("bytes_per_second"))
    };
    for s in v.as_array().into_iter().flatten() {
        let proto = s["proto"].as_str().unwrap_or("?").to_uppercase();
        let vip = sock(&s["vip"], &s["port"]);
        match cols {
            Columns::Stats => {
                let st = &s["stats"];
                println!("{proto:<4} {vip:<32} {:<10.1} {:<12} {}", st["new_sessions_per_second"].as_f64().unwrap_or(0.0), st["packets"], st["bytes"]);
            }
            Columns::Rate => println!("{proto:<4} {vip:<32} {}", rates(&s["stats"]["rates"])),
            Columns::Plain => {
                let mut flags = s["mode"].as_str().unwrap_or("").to_string();
                if s["toa"].as_bool() == Some(true) {
                    flags.push_str(",toa");
                }
                if let Some(p) = s["synproxy"].as_str().filter(|p| *p != "off") {
                    flags.push_str(&format!(",synproxy={p}"));
                }
                println!("{proto:<4} {vip} {} {flags}", s["scheduler"].as_str().unwrap_or("?"));
            }
        }
        for b in s["backends"].as_array().into_iter().flatten() {
            let rs = sock(&b["addr"], &b["port"]);
            match cols {
                Columns::Stats => println!("  -> {rs:<30} {:<10} {:<12} {}", b["active_sessions"], b["packets"], b["bytes"]),
                Columns::Rate => println!("  -> {rs:<30} {}", rates(&b["rates"])),
                Columns::Plain => {
                    let fwd = mode_word(s["mode"].as_str().unwrap_or(""));
                    println!("  -> {rs:<28} {fwd:<7} {:<6} {}", b["weight"], b["active_sessions"]);
                }
            }
        }
    }
    Ok(())
}

fn list_sessions(api: &Api) -> Result<(), CtlError> {
    let st = ok(api, "GET", "/v1/stats", None)?;
    let workers = st["workers"].as_u64().unwrap_or(1);
    println!("{:<5} {:<10} {:<44} {:<44} {:<30} Expires", "Pro", "State", "Source", "Virtual", "Destination");
    for w in 0..workers {
        for fam in [4, 6] {
            let mut cursor = Some(0u64);
            while let Some(c) = cursor {
                let v = ok(api, "GET", &format!("/v1/sessions?worker={w}&family={fam}&cursor={c}&limit=1000"), None)?;
                for s in v["sessions"].as_array().into_iter().flatten() {
                    println!(
                        "{:<5} {:<10} {:<44} {:<44} {:<30} {:.1}s",
                        s["proto"].as_str().unwrap_or(""),
                        s["state"].as_str().unwrap_or(""),
                        s["client"].as_str().unwrap_or(""),
                        s["vip"].as_str().unwrap_or(""),
                        s["backend"].as_str().unwrap_or(""),
                        s["expires_ms"].as_i64().unwrap_or(0) as f64 / 1000.0
                    );
                }
                cursor = v["next_cursor"].as_u64();
            }
        }
    }
    Ok(())
}
