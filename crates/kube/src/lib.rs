//! `vectorlb kube`: the Kubernetes controller. Services of type LoadBalancer (its
//! `loadBalancerClass`, and class-less ones when configured), their EndpointSlices and the
//! cluster's `AddressPool`s program every vectorlb daemon through its API; addresses and
//! problems are written back as the Services' status and Events. See docs/kubernetes.md.
//!
//! The pure parts (address allocation, what a daemon should serve) are kept free of the
//! Kubernetes types and tested alone; `controller` and `leader` do the talking.

pub mod config;
pub mod controller;
pub mod crd;
pub mod desired;
pub mod gateway;
pub mod gateway_run;
pub mod gateway_types;
pub mod ipam;
pub mod leader;
pub mod metrics;
pub mod program;
pub mod reason;
pub mod watch;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `vectorlb kube run`.
#[derive(Debug, Clone)]
pub struct Opts {
    pub config: PathBuf,
    /// A kubeconfig file; else the usual inference (KUBECONFIG, ~/.kube/config, in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// This replica's name in the Lease (default: POD_NAME, else host name and process id).
    pub identity: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("{0}")]
    Run(String),
}

async fn client(path: &Option<PathBuf>) -> Result<kube::Client, KubeError> {
    let mut config = match path {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p).map_err(|e| KubeError::Kubeconfig(format!("{}: {e}", p.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.map_err(|e| KubeError::Kubeconfig(format!("{}: {e}", p.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| KubeError::Kubeconfig(e.to_string()))?,
    };
    // No request may hang a round or the Lease's renewal: a kube-apiserver that restarts can
    // leave a connection that never answers. Watches end on the server's side before the read
    // deadline (watch::WATCH_SECONDS) and start again.
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(watch::READ_DEADLINE);
    config.write_timeout = Some(Duration::from_secs(15));
    kube::Client::try_from(config).map_err(|e| KubeError::Kubeconfig(e.to_string()))
}

fn identity(o: &Opts) -> String {
    if let Some(i) = &o.identity {
        return i.clone();
    }
    if let Ok(p) = std::env::var("POD_NAME") {
        if !p.is_empty() {
            return p;
        }
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

/// Runs the controller until SIGTERM or SIGINT (then gives the Lease up). A replica programs
/// only while it holds the Lease; one that loses it stops programming at once and waits to be
/// elected again (its caches stay warm).
pub fn run(o: Opts) -> Result<(), KubeError> {
    let cfg = config::KubeConfig::load(&o.config)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| KubeError::Run(format!("cannot start the runtime: {e}")))?;
    rt.block_on(run_async(o, cfg))
}

async fn run_async(o: Opts, cfg: config::KubeConfig) -> Result<(), KubeError> {
    let client = client(&o.kubeconfig).await?;
    let id = identity(&o);
    let metrics = Arc::new(metrics::Metrics::default());
    if let Some(addr) = &cfg.metrics {
        serve_metrics(addr, metrics.clone()).await?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| KubeError::Run(e.to_string()))?;
    // The caches are filled before the election: a follower that takes over starts warm.
    let notify = Arc::new(tokio::sync::Notify::new());
    let mut ctl = tokio::select! {
        c = controller::Controller::start(cfg.clone(), client.clone(), &id, metrics.clone(), notify.clone()) => c.map_err(KubeError::Run)?,
        _ = term.recv() => return Ok(()),
        _ = tokio::signal::ctrl_c() => return Ok(()),
    };
    let elector = Arc::new(tokio::sync::Mutex::new(leader::Elector::new(client.clone(), &cfg.namespace, &cfg.lease, &id, cfg.lease_seconds)));
    let period = elector.lock().await.period();
    let resync = Duration::from_secs(cfg.resync_seconds.into());
    // Whether the last step of the Lease failed (kube-apiserver away): when one succeeds again,
    // every watch lists again rather than trust a connection to the process that went away.
    let away = Arc::new(AtomicBool::new(false));
    let came_back = |away: &AtomicBool, metrics: &metrics::Metrics| {
        if away.swap(false, Ordering::Relaxed) {
            metrics.watches.restart("kube-apiserver answers again");
        }
    };
    loop {
        tracing::info!(identity = %id, lease = %format!("{}/{}", cfg.namespace, cfg.lease), "waiting for the lease");
        loop {
            metrics.tick();
            let step = { tokio::time::timeout(period, elector.lock().await.step()).await };
            match step {
                Ok(Ok(leader::State::Leader)) => {
                    came_back(&away, &metrics);
                    break;
                }
                Ok(Ok(leader::State::Follower(h))) => {
                    came_back(&away, &metrics);
                    tracing::debug!(holder = ?h, "another replica leads");
                }
                Ok(Err(e)) => {
                    away.store(true, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cannot read or take the lease");
                }
                Err(_) => {
                    away.store(true, Ordering::Relaxed);
                    tracing::warn!("cannot read or take the lease: no answer within {period:?}");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = term.recv() => return Ok(()),
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
        metrics.leader.store(true, Ordering::Relaxed);
        tracing::info!(identity = %id, "leading");
        // Whatever happened while another replica led: read every daemon again.
        ctl.invalidate();
        // The Lease is renewed on its own task; when it is lost (another replica holds it, or it
        // could not be renewed within two thirds of its duration, as when kube-apiserver is
        // away), this replica stops programming at once and goes back to waiting for it.
        let (lost_tx, mut lost_rx) = tokio::sync::mpsc::channel::<String>(1);
        let renewer = elector.clone();
        let (away2, metrics2) = (away.clone(), metrics.clone());
        let renew = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let mut e = renewer.lock().await;
                let step = match tokio::time::timeout(period, e.step()).await {
                    Ok(r) => r.map_err(|err| err.to_string()),
                    Err(_) => Err(format!("no answer within {period:?}")),
                };
                if step.is_err() {
                    away2.store(true, Ordering::Relaxed);
                }
                match step {
                    Ok(leader::State::Leader) => came_back(&away2, &metrics2),
                    Ok(leader::State::Follower(h)) => {
                        let _ = lost_tx.send(format!("lost the lease to {}", h.unwrap_or_default())).await;
                        return;
                    }
                    Err(err) if e.lost() => {
                        let _ = lost_tx.send(format!("cannot renew the lease in time: {err}")).await;
                        return;
                    }
                    Err(err) => tracing::warn!(error = %err, "cannot renew the lease; trying again"),
                }
            }
        });
        // The next round without a change: the periodic comparison, or a retry after an error.
        let mut deadline = tokio::time::Instant::now() + resync;
        let mut check = tokio::time::interval(Duration::from_secs(1));
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stop = loop {
            metrics.tick();
            tokio::select! {
                _ = notify.notified() => {
                    // Let a burst of changes arrive: one round takes them all.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                _ = tokio::time::sleep_until(deadline) => {}
                _ = check.tick() => {
                    if !ctl.daemons_changed().await {
                        continue;
                    }
                }
                m = lost_rx.recv() => {
                    tracing::warn!(reason = %m.unwrap_or_default(), "no longer leading; programming stopped");
                    break false;
                }
                _ = term.recv() => break true,
                _ = tokio::signal::ctrl_c() => break true,
            }
            if ctl.round().await {
                deadline = tokio::time::Instant::now() + resync;
            } else {
                ctl.invalidate();
                deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            }
        };
        metrics.leader.store(false, Ordering::Relaxed);
        renew.abort();
        let _ = renew.await;
        if stop {
            // A clean stop gives the Lease up at once: a successor need not wait for it to expire.
            elector.lock().await.release().await;
            tracing::info!("stopped; the lease is released");
            return Ok(());
        }
    }
}

async fn serve_metrics(addr: &str, metrics: Arc<metrics::Metrics>) -> Result<(), KubeError> {
    use axum::routing::get;
    let a: std::net::SocketAddr = addr.parse().map_err(|_| KubeError::Run(format!("metrics '{addr}': ADDRESS:PORT")))?;
    let l = tokio::net::TcpListener::bind(a).await.map_err(|e| KubeError::Run(format!("metrics {a}: {e}")))?;
    let m2 = metrics.clone();
    let router = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m2.clone();
                async move { m.render() }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let m = metrics.clone();
                async move {
                    let (code, text) = m.health();
                    (axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::SERVICE_UNAVAILABLE), text)
                }
            }),
        );
    tokio::spawn(vectorlb_http::server::serve(vectorlb_http::server::Listener::Tcp(l), router, None, std::future::pending()));
    Ok(())
}
