//! The proxy's admin API, with the load balancer's conventions (the same server: a unix socket
//! guarded by its mode, or TCP with a bearer token; JSON errors; bounded connections):
//!
//! * `GET /v1/stats`: listeners (requests, TLS handshakes by outcome, the provider that runs
//!   and why it fell back, handshake latency and queue-size histograms with quantiles), clusters
//!   (requests, connect failures and errors per endpoint);
//! * `GET /metrics`: the same in Prometheus's text format;
//! * `GET /v1/health`: `{"status":"ok"}` while the proxy serves.

use crate::serve::{Current, Proxy};
use crate::stats::{Histogram, TlsStats};
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
pub use vectorlb_wire::proxy::*;

impl From<&Histogram> for HistogramOut {
    fn from(h: &Histogram) -> HistogramOut {
        HistogramOut {
            count: h.count(),
            sum: h.sum(),
            p50: h.quantile(0.5),
            p90: h.quantile(0.9),
            p99: h.quantile(0.99),
            buckets: h.buckets().into_iter().map(|(b, c)| (b.is_finite().then_some(b), c)).collect(),
        }
    }
}

impl From<&TlsStats> for TlsOut {
    fn from(t: &TlsStats) -> TlsOut {
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        TlsOut {
            provider: t.provider.clone(),
            fallback_reason: t.fallback_reason.clone(),
            handshakes: n(&t.handshakes),
            handshake_failures: n(&t.handshake_failures),
            handshake_timeouts: n(&t.handshake_timeouts),
            handshake_seconds: (&t.handshake_seconds).into(),
            offloaded: n(&t.offloaded),
            offload_failures: n(&t.offload_failures),
            rsa_queue_sizes: (&t.rsa_queue_sizes).into(),
            ecdsa_queue_sizes: (&t.ecdsa_queue_sizes).into(),
            key_op_fallbacks: n(&t.key_op_fallbacks),
            failed_checks: n(&t.failed_checks),
        }
    }
}

fn dispatch_out(d: &crate::dispatch::Dispatcher) -> DispatchOut {
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let depths = d.depths();
    DispatchOut {
        mode: d.config().mode.name().into(),
        backend: d.config().backend.name().into(),
        eventdev: match &d.config().backend {
            crate::dispatch::Backend::Eventdev(dev) => Some(dev.clone()),
            crate::dispatch::Backend::Software => None,
        },
        classes: d
            .config()
            .classes
            .iter()
            .zip(d.class_stats())
            .zip(depths)
            .map(|((c, s), depth)| DispatchClassOut {
                name: c.name.clone(),
                share: c.share,
                depth,
                submitted: n(&s.submitted),
                served: n(&s.served),
                rejected_full: n(&s.rejected_full),
                expired: n(&s.expired),
                panicked: n(&s.panicked),
                wait_seconds: (&s.wait_seconds).into(),
                run_seconds: (&s.run_seconds).into(),
            })
            .collect(),
        workers: d.worker_stats().iter().map(|w| DispatchWorkerOut { items: n(&w.items), busy_seconds: n(&w.busy_ns) as f64 / 1e9 }).collect(),
        handoffs: d.handoffs(),
    }
}

pub fn stats(p: &Proxy) -> StatsOut {
    StatsOut {
        uptime_seconds: p.started.elapsed().as_secs_f64(),
        reloads: 0,
        reload_failures: 0,
        last_reload_error: None,
        workers: p.config.workers,
        client_connections: 0,
        max_client_connections: 0,
        buffered_bytes: 0,
        buffer_memory: p.config.buffer_memory,
        dispatch: p.dispatch.as_deref().map(dispatch_out),
        x25519_keypairs: {
            let (batched, single) = crate::keyshare::counts();
            KeyPairsOut { batches_on: crate::keyshare::enabled(), batches_off_reason: crate::keyshare::not_enabled_reason().map(str::to_string), batched, single }
        },
        x25519_secrets: {
            let (batched, single, batches) = crate::keyshare::secret_counts();
            SecretsOut { batched, single, batches }
        },
        listeners: p
            .config
            .listeners
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let c = &p.clients[i];
                let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                ListenerOut {
                    name: l.name.clone(),
                    address: l.address.to_string(),
                    requests: p.requests[i].load(Ordering::Relaxed),
                    connections: n(&c.connections),
                    refused: n(&c.refused),
                    evicted: n(&c.evicted),
                    header_timeouts: n(&c.header_timeouts),
                    idle_closed: n(&c.idle_closed),
                    body_timeouts: n(&c.body_timeouts),
                    send_timeouts: n(&c.send_timeouts),
                    reset_budget_exceeded: n(&c.reset_budget_exceeded),
                    client_errors: n(&c.client_errors),
                    tls: p.tls[i].as_ref().map(|(_, s)| (&**s).into()),
                }
            })
            .collect(),
        clusters: p
            .clusters
            .iter()
            .map(|c| ClusterOut {
                name: c.spec.name.clone(),
                endpoints: c
                    .spec
                    .endpoints
                    .iter()
                    .zip(c.stats.iter().zip(&c.slots))
                    .map(|(e, (s, slots))| EndpointOut {
                        address: e.address.to_string(),
                        weight: e.weight,
                        healthy: s.healthy.load(Ordering::Relaxed),
                        health_checks: s.health_checks.load(Ordering::Relaxed),
                        health_failures: s.health_failures.load(Ordering::Relaxed),
                        requests: s.requests.load(Ordering::Relaxed),
                        connect_failures: s.connect_failures.load(Ordering::Relaxed),
                        errors: s.errors.load(Ordering::Relaxed),
                        queue_timeouts: s.queue_timeouts.load(Ordering::Relaxed),
                        share_timeouts: s.share_timeouts.load(Ordering::Relaxed),
                        send_timeouts: s.send_timeouts.load(Ordering::Relaxed),
                        read_timeouts: s.read_timeouts.load(Ordering::Relaxed),
                        connections: slots.connections(),
                        in_flight: slots.in_flight(),
                        max_connections: slots.max(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

use vectorlb_http::prom::esc;

fn histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    vectorlb_http::prom::histogram(out, name, labels, h.buckets(), h.sum(), h.count());
}

/// Prometheus's text format.
pub fn metrics(p: &Proxy) -> String {
    let mut o = String::new();
    let head = vectorlb_http::prom::head;
    head(&mut o, "vectorlb_proxy_uptime_seconds", "gauge", "Seconds since the proxy started.");
    let _ = writeln!(o, "vectorlb_proxy_uptime_seconds {}", p.started.elapsed().as_secs_f64());
    if let Some(l) = &p.access_log {
        head(&mut o, "vectorlb_proxy_access_log_lines_total", "counter", "Access log lines written.");
        let _ = writeln!(o, "vectorlb_proxy_access_log_lines_total {}", l.written.load(Ordering::Relaxed));
        head(&mut o, "vectorlb_proxy_access_log_dropped_total", "counter", "Access log lines dropped because the writer was behind.");
        let _ = writeln!(o, "vectorlb_proxy_access_log_dropped_total {}", l.dropped.load(Ordering::Relaxed));
    }
    head(&mut o, "vectorlb_proxy_requests_total", "counter", "Requests received, by listener.");
    for (i, l) in p.config.listeners.iter().enumerate() {
        let _ = writeln!(o, "vectorlb_proxy_requests_total{{listener=\"{}\"}} {}", esc(&l.name), p.requests[i].load(Ordering::Relaxed));
    }
    head(&mut o, "vectorlb_proxy_client_connections_total", "counter", "Client connections accepted, by listener.");
    for (i, l) in p.config.listeners.iter().enumerate() {
        let _ = writeln!(o, "vectorlb_proxy_client_connections_total{{listener=\"{}\"}} {}", esc(&l.name), p.clients[i].connections.load(Ordering::Relaxed));
    }
    head(&mut o, "vectorlb_proxy_client_closed_total", "counter", "Client connections closed by the proxy, by listener and cause: refused (no room), evicted (made room), header_timeout, idle, send_timeout (responses released), reset_budget (GOAWAY).");
    for (i, l) in p.config.listeners.iter().enumerate() {
        let c = &p.clients[i];
        for (cause, v) in [
            ("refused", &c.refused),
            ("evicted", &c.evicted),
            ("header_timeout", &c.header_timeouts),
            ("idle", &c.idle_closed),
            ("send_timeout", &c.send_timeouts),
            ("reset_budget", &c.reset_budget_exceeded),
        ] {
            let _ = writeln!(o, "vectorlb_proxy_client_closed_total{{listener=\"{}\",cause=\"{cause}\"}} {}", esc(&l.name), v.load(Ordering::Relaxed));
        }
    }
    head(&mut o, "vectorlb_proxy_client_errors_total", "counter", "Requests answered 400 or 408 for the client's fault (bad authority or framing, body_timeout), by listener.");
    for (i, l) in p.config.listeners.iter().enumerate() {
        let _ = writeln!(o, "vectorlb_proxy_client_errors_total{{listener=\"{}\"}} {}", esc(&l.name), p.clients[i].client_errors.load(Ordering::Relaxed));
    }
    let tls: Vec<(String, &TlsStats)> = p.config.listeners.iter().zip(&p.tls).filter_map(|(l, t)| t.as_ref().map(|(_, s)| (esc(&l.name), &**s))).collect();
    head(&mut o, "vectorlb_proxy_tls_handshakes_total", "counter", "TLS handshakes by provider and outcome (ok, failed, timeout).");
    for (l, s) in &tls {
        let pr = esc(&s.provider);
        for (outcome, v) in [("ok", &s.handshakes), ("failed", &s.handshake_failures), ("timeout", &s.handshake_timeouts)] {
            let _ = writeln!(o, "vectorlb_proxy_tls_handshakes_total{{listener=\"{l}\",provider=\"{pr}\",outcome=\"{outcome}\"}} {}", v.load(Ordering::Relaxed));
        }
    }
    head(&mut o, "vectorlb_proxy_tls_handshake_seconds", "histogram", "Time from accept to the end of the TLS handshake.");
    for (l, s) in &tls {
        histogram(&mut o, "vectorlb_proxy_tls_handshake_seconds", &format!("listener=\"{l}\",provider=\"{}\"", esc(&s.provider)), &s.handshake_seconds);
    }
    head(&mut o, "vectorlb_proxy_tls_rsa_queue_sizes", "histogram", "RSA operations per multi-buffer run (cryptomb).");
    for (l, s) in &tls {
        histogram(&mut o, "vectorlb_proxy_tls_rsa_queue_sizes", &format!("listener=\"{l}\""), &s.rsa_queue_sizes);
    }
    head(&mut o, "vectorlb_proxy_tls_ecdsa_queue_sizes", "histogram", "ECDSA operations per multi-buffer run (cryptomb).");
    for (l, s) in &tls {
        histogram(&mut o, "vectorlb_proxy_tls_ecdsa_queue_sizes", &format!("listener=\"{l}\""), &s.ecdsa_queue_sizes);
    }
    for (name, help, get) in [
        (
            "vectorlb_proxy_tls_key_ops_offloaded_total",
            "Private-key operations handed to the provider.",
            (|s: &TlsStats| s.offloaded.load(Ordering::Relaxed)) as fn(&TlsStats) -> u64,
        ),
        ("vectorlb_proxy_tls_key_op_failures_total", "Offloaded private-key operations that failed (their handshakes failed).", |s| s.offload_failures.load(Ordering::Relaxed)),
        ("vectorlb_proxy_tls_key_op_fallbacks_total", "Lanes the multi-buffer backend did not compute, signed alone instead.", |s| s.key_op_fallbacks.load(Ordering::Relaxed)),
        ("vectorlb_proxy_tls_failed_checks_total", "Signatures that did not verify with the public key (never sent).", |s| s.failed_checks.load(Ordering::Relaxed)),
    ] {
        head(&mut o, name, "counter", help);
        for (l, s) in &tls {
            let _ = writeln!(o, "{name}{{listener=\"{l}\",provider=\"{}\"}} {}", esc(&s.provider), get(s));
        }
    }
    head(
        &mut o,
        "vectorlb_proxy_tls_x25519_keypairs_total",
        "counter",
        "Ephemeral X25519 key pairs of TLS key exchanges, made eight at a time (batched) or one at a time (single).",
    );
    let (batched, single) = crate::keyshare::counts();
    let _ = writeln!(o, "vectorlb_proxy_tls_x25519_keypairs_total{{made=\"batched\"}} {batched}");
    let _ = writeln!(o, "vectorlb_proxy_tls_x25519_keypairs_total{{made=\"single\"}} {single}");
    head(
        &mut o,
        "vectorlb_proxy_tls_x25519_secrets_total",
        "counter",
        "X25519 shared secrets of TLS key exchanges, computed ahead in batches of up to eight (batched) or by BoringSSL (single).",
    );
    let (batched, single, batches) = crate::keyshare::secret_counts();
    let _ = writeln!(o, "vectorlb_proxy_tls_x25519_secrets_total{{made=\"batched\"}} {batched}");
    let _ = writeln!(o, "vectorlb_proxy_tls_x25519_secrets_total{{made=\"single\"}} {single}");
    head(&mut o, "vectorlb_proxy_tls_x25519_secret_batches_total", "counter", "crypto_mb calls that computed the batched X25519 shared secrets.");
    let _ = writeln!(o, "vectorlb_proxy_tls_x25519_secret_batches_total {batches}");
    head(&mut o, "vectorlb_proxy_tls_provider_fallback", "gauge", "1 when the configured provider could not run and inline runs instead.");
    for (l, s) in &tls {
        let _ = writeln!(
            o,
            "vectorlb_proxy_tls_provider_fallback{{listener=\"{l}\",reason=\"{}\"}} {}",
            esc(s.fallback_reason.as_deref().unwrap_or("")),
            s.fallback_reason.is_some() as u8
        );
    }
    for (name, help, get) in [
        (
            "vectorlb_proxy_upstream_requests_total",
            "Requests sent to an endpoint (a retry counts again).",
            (|s: &crate::forward::EndpointStats| s.requests.load(Ordering::Relaxed)) as fn(&crate::forward::EndpointStats) -> u64,
        ),
        ("vectorlb_proxy_upstream_connect_failures_total", "Connections to an endpoint that could not be made.", |s| s.connect_failures.load(Ordering::Relaxed)),
        ("vectorlb_proxy_upstream_errors_total", "Requests sent whose response did not come (errors, timeouts) or came broken.", |s| s.errors.load(Ordering::Relaxed)),
        ("vectorlb_proxy_upstream_queue_timeouts_total", "Requests answered 503 because every connection to the endpoint stayed busy for queue_timeout.", |s| {
            s.queue_timeouts.load(Ordering::Relaxed)
        }),
        ("vectorlb_proxy_upstream_share_timeouts_total", "Of those, requests whose own client connection held its client_share of the endpoint's connections.", |s| {
            s.share_timeouts.load(Ordering::Relaxed)
        }),
        ("vectorlb_proxy_upstream_send_timeouts_total", "Writes to the endpoint that waited send_timeout.", |s| s.send_timeouts.load(Ordering::Relaxed)),
        ("vectorlb_proxy_upstream_read_timeouts_total", "Response bodies from the endpoint that stalled for read_timeout.", |s| s.read_timeouts.load(Ordering::Relaxed)),
        ("vectorlb_proxy_upstream_healthy", "1 while the endpoint takes requests (its health check passes, or it has none).", |s| s.healthy.load(Ordering::Relaxed) as u64),
        ("vectorlb_proxy_upstream_health_check_failures_total", "Health checks of the endpoint that failed.", |s| s.health_failures.load(Ordering::Relaxed)),
    ] {
        head(&mut o, name, if name.ends_with("_healthy") { "gauge" } else { "counter" }, help);
        for c in &p.clusters {
            for (e, s) in c.spec.endpoints.iter().zip(&c.stats) {
                let _ = writeln!(o, "{name}{{cluster=\"{}\",endpoint=\"{}\"}} {}", esc(&c.spec.name), e.address, get(s));
            }
        }
    }
    head(&mut o, "vectorlb_proxy_upstream_connections", "gauge", "Connections open to an endpoint (idle ones included).");
    for c in &p.clusters {
        for (e, slots) in c.spec.endpoints.iter().zip(&c.slots) {
            let _ = writeln!(o, "vectorlb_proxy_upstream_connections{{cluster=\"{}\",endpoint=\"{}\"}} {}", esc(&c.spec.name), e.address, slots.connections());
        }
    }
    if let Some(d) = &p.dispatch {
        let cfg = d.config();
        let names: Vec<String> = cfg.classes.iter().map(|c| esc(&c.name)).collect();
        head(&mut o, "vectorlb_proxy_dispatch_queue_depth", "gauge", "Items (requests and later chunks) waiting for a dispatch thread, by class.");
        for (c, depth) in names.iter().zip(d.depths()) {
            let _ = writeln!(o, "vectorlb_proxy_dispatch_queue_depth{{class=\"{c}\"}} {depth}");
        }
        head(&mut o, "vectorlb_proxy_dispatch_items_total", "counter", "Items by class and outcome: served, rejected (queue full), expired (waited past max_wait), panicked.");
        for (c, s) in names.iter().zip(d.class_stats()) {
            for (outcome, v) in [("served", &s.served), ("rejected", &s.rejected_full), ("expired", &s.expired), ("panicked", &s.panicked)] {
                let _ = writeln!(o, "vectorlb_proxy_dispatch_items_total{{class=\"{c}\",outcome=\"{outcome}\"}} {}", v.load(Ordering::Relaxed));
            }
        }
        head(&mut o, "vectorlb_proxy_dispatch_wait_seconds", "histogram", "Time from a request's submission to a thread taking its first item, by class.");
        for (c, s) in names.iter().zip(d.class_stats()) {
            histogram(&mut o, "vectorlb_proxy_dispatch_wait_seconds", &format!("class=\"{c}\""), &s.wait_seconds);
        }
        head(&mut o, "vectorlb_proxy_dispatch_run_seconds", "histogram", "Time a request's first item took (a static object: opening it and reading its first chunk), by class.");
        for (c, s) in names.iter().zip(d.class_stats()) {
            histogram(&mut o, "vectorlb_proxy_dispatch_run_seconds", &format!("class=\"{c}\""), &s.run_seconds);
        }
        head(&mut o, "vectorlb_proxy_dispatch_busy_seconds_total", "counter", "Seconds each dispatch thread spent running items (its utilisation, by rate).");
        for (w, s) in d.worker_stats().iter().enumerate() {
            let _ = writeln!(o, "vectorlb_proxy_dispatch_busy_seconds_total{{worker=\"{w}\"}} {}", s.busy_ns.load(Ordering::Relaxed) as f64 / 1e9);
        }
        head(&mut o, "vectorlb_proxy_dispatch_worker_items_total", "counter", "Items each dispatch thread ran.");
        for (w, s) in d.worker_stats().iter().enumerate() {
            let _ = writeln!(o, "vectorlb_proxy_dispatch_worker_items_total{{worker=\"{w}\"}} {}", s.items.load(Ordering::Relaxed));
        }
        head(&mut o, "vectorlb_proxy_dispatch_handoffs_total", "counter", "Items the eventdev backend handed straight to an idle dispatch thread.");
        let _ = writeln!(o, "vectorlb_proxy_dispatch_handoffs_total {}", d.handoffs());
    }
    o
}

type P = State<Arc<Current>>;

async fn get_stats(State(c): P) -> Json<StatsOut> {
    let mut s = stats(&c.load());
    s.reloads = c.reloads.load(Ordering::Relaxed);
    s.reload_failures = c.reload_failures.load(Ordering::Relaxed);
    s.last_reload_error = c.last_reload_error.lock().unwrap_or_else(|e| e.into_inner()).clone();
    s.client_connections = c.admission.open();
    s.max_client_connections = c.admission.max();
    s.buffered_bytes = c.admission.memory.used();
    Json(s)
}

async fn get_metrics(State(c): P) -> impl IntoResponse {
    let mut m = metrics(&c.load());
    let _ = writeln!(m, "# HELP vectorlb_proxy_client_connections Client connections open now, and the limit over all listeners.\n# TYPE vectorlb_proxy_client_connections gauge");
    let _ = writeln!(m, "vectorlb_proxy_client_connections {}", c.admission.open());
    let _ = writeln!(m, "# HELP vectorlb_proxy_client_connections_max The limit of client connections over all listeners.\n# TYPE vectorlb_proxy_client_connections_max gauge");
    let _ = writeln!(m, "vectorlb_proxy_client_connections_max {}", c.admission.max());
    let _ = writeln!(
        m,
        "# HELP vectorlb_proxy_buffered_bytes Request bodies buffered now (request_buffer), in bytes, against buffer_memory.\n# TYPE vectorlb_proxy_buffered_bytes gauge"
    );
    let _ = writeln!(m, "vectorlb_proxy_buffered_bytes {}", c.admission.memory.used());
    let _ = writeln!(m, "# HELP vectorlb_proxy_reloads_total Reloads of the configuration (SIGHUP, POST /v1/reload), by outcome.\n# TYPE vectorlb_proxy_reloads_total counter");
    let _ = writeln!(m, "vectorlb_proxy_reloads_total{{outcome=\"ok\"}} {}", c.reloads.load(Ordering::Relaxed));
    let _ = writeln!(m, "vectorlb_proxy_reloads_total{{outcome=\"refused\"}} {}", c.reload_failures.load(Ordering::Relaxed));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m)
}

/// `POST /v1/reload`: as SIGHUP; 200 when the new file is served, 400 naming the problem
/// when it is refused (the running configuration stays).
async fn post_reload(State(c): P) -> Result<Json<Reloaded>, vectorlb_http::ApiError> {
    match c.reload().await {
        Ok(()) => Ok(Json(Reloaded { reloaded: true })),
        Err(e) => Err(vectorlb_http::ApiError::BadRequest(e)),
    }
}

/// `PUT /v1/config`: the whole configuration (TOML) in the body, served as a reload serves
/// the file and kept in the file; 400 naming the problem when refused (nothing changes).
async fn put_config(State(c): P, body: String) -> Result<Json<ConfigApplied>, vectorlb_http::ApiError> {
    match c.put_config(body).await {
        Ok(()) => Ok(Json(ConfigApplied { applied: true, digest: c.config_digest() })),
        Err(e) => Err(vectorlb_http::ApiError::BadRequest(e)),
    }
}

/// `GET /v1/config`: the digest of the configuration in force (not its text: it may hold keys).
async fn get_config(State(c): P) -> Json<ConfigDigest> {
    Json(ConfigDigest { digest: c.config_digest() })
}

async fn get_health() -> Json<ProxyHealth> {
    Json(ProxyHealth { status: "ok".into() })
}

/// The largest configuration `PUT /v1/config` takes (inline certificates included).
pub const MAX_CONFIG: usize = 16 << 20;

pub fn router(c: Arc<Current>) -> Router {
    Router::new()
        .route("/v1/stats", get(get_stats))
        .route("/metrics", get(get_metrics))
        .route("/v1/health", get(get_health))
        .route("/v1/reload", axum::routing::post(post_reload))
        .route("/v1/config", get(get_config).put(put_config).layer(axum::extract::DefaultBodyLimit::max(MAX_CONFIG)))
        .with_state(c)
}
