//! `vectorlb mesh`: a node's mesh proxy as a process, run inside its own network namespace (a
//! pod interface on the daemon's pods port, docs/mesh.md).
//!
//! * **Steering** (`steer`): the namespace delivers every address that arrives on the pod
//!   interface locally (a routing rule, `iif <interface> lookup 15008`, and that table's
//!   `local default` routes: routes, not iptables), and a socket lookup program hands each new TCP
//!   connection to the outbound listener, or to the inbound one for the tunnel port.
//! * **What it knows** (`state`, JSON, [`StateFile`]): the meshed pods (every node's), their
//!   identities and labels, and the authorization policies; re-read when the file changes.
//! * **Its certificates** (`certs`, a directory): `bundle.pem` (the trust anchors) and, per
//!   identity it holds, `<namespace>.<account>.pem` (the chain, leaf first) and
//!   `<namespace>.<account>.key`; re-read when a file changes (a rotation).
//! * **Metrics**: `GET /metrics` on `metrics` (Prometheus text); the mesh's edges seen here as
//!   JSON (`GET /v1/edges`) and as a page (`GET /`).

use super::authz::{Authz, Policy};
use super::ca::{Bundle, Svid};
use super::hbone::{Node, State, Workload, HBONE_PORT};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The routing table the steering rule looks up (any free number; this one is easy to find).
pub const TABLE: u32 = 15008;

/// The node proxy's options (the command line's).
#[derive(Clone, Debug)]
pub struct Options {
    pub node: String,
    pub trust_domain: String,
    pub state: PathBuf,
    pub certs: PathBuf,
    /// Where the outbound and inbound listeners bind (any port for the outbound one: the
    /// steering hands connections to it whatever they were for).
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub metrics: Option<SocketAddr>,
    /// The pod interface meshed connections arrive on; None: no steering set up here.
    pub steer: Option<String>,
    pub original_source: bool,
    /// Where handshakes sign (the proxy's providers).
    pub provider: Option<crate::config::Provider>,
    /// A tunnel per connection, each with a full handshake (a benchmark's knob).
    pub no_pool: bool,
    /// Threads serving connections (0: one per CPU; 1: all on one thread, no hand-offs).
    pub threads: usize,
}

/// A meshed pod, as the state file lists it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WorkloadEntry {
    pub ip: IpAddr,
    pub namespace: String,
    pub account: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub node: String,
    /// Where tunnels to it go (default: its address, port 15008).
    #[serde(default)]
    pub hbone: Option<SocketAddr>,
}

/// An AuthorizationPolicy as the state file carries it (its `spec` as the API server has it).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyEntry {
    pub namespace: String,
    pub name: String,
    pub spec: serde_json::Value,
}

/// What a node proxy knows of the mesh.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    #[serde(default)]
    pub workloads: Vec<WorkloadEntry>,
    #[serde(default)]
    pub policies: Vec<PolicyEntry>,
    /// Policies here apply in every namespace (default `istio-system`, Istio's).
    #[serde(default)]
    pub root_namespace: Option<String>,
}

/// The largest state file read (a cluster's meshed pods and policies).
pub const MAX_STATE: u64 = 256 << 20;

fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads and checks a state file into a node's state.
pub fn load_state(path: &Path, node: &str, trust_domain: &str) -> io::Result<State> {
    let meta = std::fs::metadata(path)?;
    if meta.len() > MAX_STATE {
        return Err(bad(format!("{}: {} bytes, at most {MAX_STATE}", path.display(), meta.len())));
    }
    let f: StateFile = serde_json::from_slice(&std::fs::read(path)?).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let mut workloads = HashMap::new();
    for (i, w) in f.workloads.into_iter().enumerate() {
        super::identity::SpiffeId::new(trust_domain, &w.namespace, &w.account).map_err(|e| bad(format!("{}: workloads[{i}]: {e}", path.display())))?;
        let hbone = w.hbone.unwrap_or(SocketAddr::new(w.ip, HBONE_PORT));
        if workloads.insert(w.ip, Workload { ip: w.ip, namespace: w.namespace, account: w.account, labels: w.labels, node: w.node, hbone }).is_some() {
            return Err(bad(format!("{}: workloads[{i}]: {} is listed twice", path.display(), w.ip)));
        }
    }
    let mut policies = Vec::new();
    for p in &f.policies {
        match Policy::compile(&p.namespace, &p.name, &p.spec).map_err(|e| bad(format!("{}: {e}", path.display())))? {
            Ok(p) => {
                for w in &p.warnings {
                    tracing::warn!("mesh: policy {}/{}: {w}", p.namespace, p.name);
                }
                policies.push(p)
            }
            Err(why) => tracing::warn!("mesh: {why}"),
        }
    }
    let root = f.root_namespace.unwrap_or_else(|| "istio-system".into());
    Ok(State { node: node.into(), trust_domain: trust_domain.into(), workloads, authz: Authz::new(&root, policies) })
}

/// Reads the certificates directory: the bundle and every identity's key and chain.
pub fn load_certs(dir: &Path, trust_domain: &str) -> io::Result<(Vec<Svid>, Bundle)> {
    let bundle = Bundle::from_pem(trust_domain, &std::fs::read(dir.join("bundle.pem"))?).map_err(|e| bad(format!("{}/bundle.pem: {e}", dir.display())))?;
    let mut svids = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "key")).collect();
    names.sort();
    for key in names {
        let chain = key.with_extension("pem");
        let k = boring::pkey::PKey::private_key_from_pem(&std::fs::read(&key)?).map_err(|e| bad(format!("{}: {e}", key.display())))?;
        let c = boring::x509::X509::stack_from_pem(&std::fs::read(&chain)?).map_err(|e| bad(format!("{}: {e}", chain.display())))?;
        svids.push(Svid::new(k, c).map_err(|e| bad(format!("{}: {e}", chain.display())))?);
    }
    Ok((svids, bundle))
}

/// The files' names, sizes and times: what changes when one is rewritten.
fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    for p in paths {
        let entries: Vec<PathBuf> =
            if p.is_dir() { std::fs::read_dir(p).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default() } else { vec![p.clone()] };
        for e in entries {
            let m = std::fs::metadata(&e).ok();
            out.push((e, m.as_ref().map_or(0, |m| m.len()), m.and_then(|m| m.modified().ok())));
        }
    }
    out.sort();
    out
}

/// Runs `cmd`, failing with its output.
fn sh(cmd: &[&str]) -> io::Result<String> {
    let out = std::process::Command::new(cmd[0]).args(&cmd[1..]).output().map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", cmd[0])))?;
    if !out.status.success() {
        return Err(io::Error::other(format!("{}: {}", cmd.join(" "), String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The routing that makes every address arriving on `iface` local (idempotent).
pub fn setup_routing(iface: &str) -> io::Result<()> {
    let table = TABLE.to_string();
    for fam in ["-4", "-6"] {
        let rules = sh(&["ip", fam, "rule", "show"])?;
        if !rules.lines().any(|l| l.contains(&format!("iif {iface} lookup {table}"))) {
            sh(&["ip", fam, "rule", "add", "iif", iface, "lookup", &table, "pref", &table])?;
        }
        let default = if fam == "-4" { "0.0.0.0/0" } else { "::/0" };
        sh(&["ip", fam, "route", "replace", "local", default, "dev", "lo", "table", &table])?;
    }
    Ok(())
}

/// Runs the node proxy until the process is stopped.
pub fn run(opts: Options) -> io::Result<()> {
    let rt = match opts.threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        0 => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build()?,
    };
    rt.block_on(serve(opts))
}

pub async fn serve(opts: Options) -> io::Result<()> {
    let state = load_state(&opts.state, &opts.node, &opts.trust_domain)?;
    let signer = opts.provider.as_ref().map(|p| crate::tls::KeySigner::new("mesh", p)).transpose().map_err(bad)?;
    let node = Node::with_signer(state, opts.original_source, signer);
    node.set_pooling(!opts.no_pool);
    let (svids, bundle) = load_certs(&opts.certs, &opts.trust_domain)?;
    node.set_identities(svids, bundle)?;
    let steering = opts.steer.is_some();
    let outbound = super::hbone::listener(opts.outbound, steering).map_err(|e| io::Error::new(e.kind(), format!("--outbound {}: {e}", opts.outbound)))?;
    let inbound = super::hbone::listener(opts.inbound, steering).map_err(|e| io::Error::new(e.kind(), format!("--inbound {}: {e}", opts.inbound)))?;
    let _steer = match &opts.steer {
        Some(iface) => {
            setup_routing(iface)?;
            use std::os::fd::AsRawFd;
            let netns = std::fs::File::open("/proc/thread-self/ns/net")?;
            let name = std::ffi::CString::new(iface.as_str()).map_err(|_| bad("--steer: an interface name"))?;
            // SAFETY: a NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if ifindex == 0 {
                return Err(bad(format!("--steer {iface}: no such interface in this namespace")));
            }
            Some(vectorlb_dpdk::sklookup::SkLookup::attach(&netns, outbound.as_raw_fd(), inbound.as_raw_fd(), opts.inbound.port(), ifindex)?)
        }
        None => None,
    };
    tracing::info!("mesh: node {} proxy: outbound {}, inbound {}, {} identities", opts.node, outbound.local_addr()?, inbound.local_addr()?, node.identities().len());
    if let Some(addr) = opts.metrics {
        let (n, e) = (node.clone(), node.clone());
        let name = opts.node.clone();
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let n = n.clone();
                    async move { n.stats.render() }
                }),
            )
            .route(
                "/v1/edges",
                axum::routing::get(move || {
                    let (e, name) = (e.clone(), name.clone());
                    async move { axum::Json(status(&name, &e)) }
                }),
            )
            .route("/", axum::routing::get(|| async { page(STATUS_HTML, "text/html; charset=utf-8") }))
            .route("/status.js", axum::routing::get(|| async { page(STATUS_JS, "text/javascript; charset=utf-8") }));
        let l = tokio::net::TcpListener::bind(addr).await?;
        tokio::spawn(async move { axum::serve(l, app).await });
    }
    // Re-read the state and the certificates when their files change.
    let watch = node.clone();
    let o = opts.clone();
    tokio::spawn(async move {
        let mut last_state = fingerprint(std::slice::from_ref(&o.state));
        let mut last_certs = fingerprint(std::slice::from_ref(&o.certs));
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let s = fingerprint(std::slice::from_ref(&o.state));
            if s != last_state {
                match load_state(&o.state, &o.node, &o.trust_domain) {
                    Ok(st) => {
                        watch.set_state(st);
                        last_state = s;
                    }
                    Err(e) => tracing::warn!("mesh: state not changed: {e}"),
                }
            }
            let c = fingerprint(std::slice::from_ref(&o.certs));
            if c != last_certs {
                match load_certs(&o.certs, &o.trust_domain).and_then(|(v, b)| watch.set_identities(v, b)) {
                    Ok(()) => {
                        tracing::info!("mesh: certificates reloaded: {:?}", watch.identities());
                        last_certs = c;
                    }
                    Err(e) => tracing::warn!("mesh: certificates not changed: {e}"),
                }
            }
        }
    });
    let i = tokio::spawn(node.clone().serve_inbound(inbound));
    let o = tokio::spawn(node.clone().serve_outbound(outbound));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = i => r.map_err(io::Error::other)?,
        r = o => r.map_err(io::Error::other)?,
        _ = term.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// The node proxy's status: its node, the identities it holds, the edges it carried.
fn status(node: &str, n: &Node) -> serde_json::Value {
    let ids: Vec<serde_json::Value> = n.identities().into_iter().map(|(id, serial)| serde_json::json!({"identity": id.to_string(), "serial": serial})).collect();
    serde_json::json!({
        "node": node,
        "identities": ids,
        "handshakes": n.stats.handshakes.load(std::sync::atomic::Ordering::Relaxed),
        "handshake_failures": n.stats.handshake_failures.load(std::sync::atomic::Ordering::Relaxed),
        "edges": n.stats.edges(),
    })
}

/// A static part of the status page, with headers that keep it to this origin.
fn page(body: &'static str, kind: &'static str) -> axum::response::Response {
    use axum::http::header;
    axum::response::IntoResponse::into_response((
        [(header::CONTENT_TYPE, kind), (header::CONTENT_SECURITY_POLICY, "default-src 'self'"), (header::CACHE_CONTROL, "no-store")],
        body,
    ))
}

const STATUS_HTML: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vectorlb mesh</title></head>
<body>
<h1>vectorlb mesh: <span id="node"></span></h1>
<p id="summary"></p>
<h2>Edges</h2>
<table id="edges" border="1" cellpadding="4">
<thead><tr><th>direction</th><th>source</th><th>destination</th><th>connections</th><th>bytes sent</th><th>bytes received</th><th>denied</th><th>failed</th></tr></thead>
<tbody></tbody></table>
<h2>Identities held</h2>
<ul id="ids"></ul>
<script src="/status.js"></script>
</body></html>
"#;

const STATUS_JS: &str = r#"'use strict';
// The node proxy's edges, from /v1/edges every two seconds; text only (no markup from data).
function cell(row, text) { const td = document.createElement('td'); td.textContent = String(text); row.appendChild(td); }
async function refresh() {
  try {
    const r = await fetch('/v1/edges', { cache: 'no-store' });
    const s = await r.json();
    document.getElementById('node').textContent = s.node;
    document.getElementById('summary').textContent = `${s.handshakes} handshakes, ${s.handshake_failures} failed; ${s.edges.length} edges`;
    const body = document.querySelector('#edges tbody');
    body.replaceChildren();
    for (const e of s.edges) {
      const row = document.createElement('tr');
      for (const v of [e.direction, e.source, e.destination, e.streams, e.sent_bytes, e.received_bytes, e.denied, e.failed]) cell(row, v);
      body.appendChild(row);
    }
    const ids = document.getElementById('ids');
    ids.replaceChildren();
    for (const i of s.identities) { const li = document.createElement('li'); li.textContent = `${i.identity} (serial ${i.serial})`; ids.appendChild(li); }
  } catch (err) {
    document.getElementById('summary').textContent = `cannot read /v1/edges: ${err}`;
  }
}
refresh();
setInterval(refresh, 2000);
"#;
