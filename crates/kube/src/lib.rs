//! `vectorlb kube`: the Kubernetes controller. Services of type LoadBalancer (its
//! `loadBalancerClass`, and class-less ones when configured), their EndpointSlices and the
//! cluster's `AddressPool`s program every vectorlb daemon through its API; addresses and
//! problems are written back as the Services' status and Events. See docs/kubernetes.md.
//!
//! The pure parts (address allocation, what a daemon should serve) are kept free of the
//! Kubernetes types and tested alone; `controller` and `leader` do the talking.

pub mod annotation;
pub mod cnp;
pub mod config;
pub mod controller;
pub mod crd;
pub mod desired;
pub mod gateway;
pub mod gateway_run;
pub mod gateway_types;
pub mod health_port;
pub mod ipam;
pub mod leader;
pub mod mesh;
pub mod metrics;
pub mod netpol;
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
    #[error(transparent)]
    Start(#[from] controller::StartError),
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    #[error("mesh: {0}")]
    Mesh(String),
    #[error("metrics '{0}': ADDRESS:PORT")]
    MetricsAddress(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KubeError {
    let what = what.into();
    move |error| KubeError::Io { what, error }
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
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(io("cannot start the runtime"))?;
    rt.block_on(run_async(o, cfg))
}

async fn run_async(o: Opts, cfg: config::KubeConfig) -> Result<(), KubeError> {
    let client = client(&o.kubeconfig).await?;
    let id = identity(&o);
    let metrics = Arc::new(metrics::Metrics::default());
    if let Some(addr) = &cfg.metrics {
        serve_metrics(addr, metrics.clone()).await?;
    }
    let mut stop = stop_on_signal()?;
    // The caches are filled before the election: a follower that takes over starts warm.
    let notify = Arc::new(tokio::sync::Notify::new());
    let mut ctl = tokio::select! {
        c = controller::Controller::start(cfg.clone(), client.clone(), &id, metrics.clone(), notify.clone()) => c?,
        _ = stop.wait_for(|s| *s) => return Ok(()),
    };
    let elector = leader::Elector::new(client.clone(), &cfg.namespace, &cfg.lease, &id, cfg.lease_seconds);
    tracing::info!(identity = %id, lease = %format!("{}/{}", cfg.namespace, cfg.lease), "waiting for the lease");
    let resync = Duration::from_secs(cfg.resync_seconds.into());
    run_elected(elector, &mut ctl, &notify, resync, &metrics, stop).await;
    Ok(())
}

/// A flag that turns true at SIGTERM or SIGINT.
fn stop_on_signal() -> Result<tokio::sync::watch::Receiver<bool>, KubeError> {
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(io("SIGTERM"))?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        let _ = stop_tx.send(true);
    });
    Ok(stop)
}

/// `vectorlb kube mesh`: the mesh's authority and node agent, as its configuration has them
/// (docs/mesh.md), until SIGTERM or SIGINT. No Lease: one authority runs in the cluster (a
/// second one would sign the same way from the same Secret) and one node agent per node.
pub fn run_mesh(config: &std::path::Path, kubeconfig: &Option<PathBuf>) -> Result<(), KubeError> {
    let cfg = mesh::MeshConfig::load(config).map_err(KubeError::Mesh)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(io("cannot start the runtime"))?;
    rt.block_on(async move {
        let client = client(kubeconfig).await?;
        let stop = stop_on_signal()?;
        mesh::run(client, cfg, Arc::new(metrics::Metrics::default()), stop).await.map_err(KubeError::Mesh)
    })
}

/// What the leader does: the controller in production, a fake in the tests.
#[allow(async_fn_in_trait)]
pub trait Programmer {
    /// One round: read, compute and program everything; false: something failed (the next
    /// round comes in a second, with every daemon read again).
    async fn round(&mut self) -> bool;
    /// Whether a daemon's configuration changed under us (restarted, edited by hand).
    async fn daemons_changed(&mut self) -> bool;
    /// Forget what the daemons serve: the next round reads them again.
    fn invalidate(&mut self);
}

impl Programmer for controller::Controller {
    async fn round(&mut self) -> bool {
        controller::Controller::round(self).await
    }
    async fn daemons_changed(&mut self) -> bool {
        controller::Controller::daemons_changed(self).await
    }
    fn invalidate(&mut self) {
        controller::Controller::invalidate(self)
    }
}

/// Campaigns for the Lease and programs while it holds it, until `stop` turns true (then gives
/// the Lease up). A replica that loses the Lease stops programming at once and campaigns again
/// (its caches stay warm).
pub async fn run_elected<S: leader::LeaseStore + 'static, P: Programmer>(
    elector: leader::Elector<S>,
    ctl: &mut P,
    notify: &tokio::sync::Notify,
    resync: Duration,
    metrics: &Arc<metrics::Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let period = elector.period();
    let elector = Arc::new(tokio::sync::Mutex::new(elector));
    // Whether the last step of the Lease failed (kube-apiserver away): when one succeeds again,
    // every watch lists again rather than trust a connection to the process that went away.
    let away = Arc::new(AtomicBool::new(false));
    loop {
        if !campaign(&elector, period, metrics, &away, &mut stop).await {
            return;
        }
        metrics.leader.store(true, Ordering::Relaxed);
        tracing::info!("leading");
        // Whatever happened while another replica led: read every daemon again.
        ctl.invalidate();
        let stopped = lead(&elector, period, ctl, notify, resync, metrics, &away, &mut stop).await;
        metrics.leader.store(false, Ordering::Relaxed);
        if stopped {
            // A clean stop gives the Lease up at once: a successor need not wait for it to expire.
            elector.lock().await.release().await;
            tracing::info!("stopped; the lease is released");
            return;
        }
    }
}

fn came_back(away: &AtomicBool, metrics: &metrics::Metrics) {
    if away.swap(false, Ordering::Relaxed) {
        metrics.watches.restart("kube-apiserver answers again");
    }
}

/// Steps the election every `period` until this replica leads (true) or `stop` (false).
async fn campaign<S: leader::LeaseStore>(
    elector: &tokio::sync::Mutex<leader::Elector<S>>,
    period: Duration,
    metrics: &metrics::Metrics,
    away: &AtomicBool,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    loop {
        if *stop.borrow() {
            return false;
        }
        metrics.tick();
        let step = { tokio::time::timeout(period, elector.lock().await.step()).await };
        match step {
            Ok(Ok(leader::State::Leader)) => {
                came_back(away, metrics);
                return true;
            }
            Ok(Ok(leader::State::Follower(h))) => {
                came_back(away, metrics);
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
            _ = stop.wait_for(|s| *s) => return false,
        }
    }
}

/// Programs while the Lease is held. The Lease is renewed on its own task; when it is lost
/// (another replica holds it, or it could not be renewed within two thirds of its duration, as
/// when kube-apiserver is away), programming stops at once. True: stopped by `stop`.
#[allow(clippy::too_many_arguments)]
async fn lead<S: leader::LeaseStore + 'static, P: Programmer>(
    elector: &Arc<tokio::sync::Mutex<leader::Elector<S>>>,
    period: Duration,
    ctl: &mut P,
    notify: &tokio::sync::Notify,
    resync: Duration,
    metrics: &Arc<metrics::Metrics>,
    away: &Arc<AtomicBool>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
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
    let stopped = loop {
        metrics.tick();
        tokio::select! {
            // Losing the Lease comes first: no round starts once it is known lost.
            biased;
            m = lost_rx.recv() => {
                tracing::warn!(reason = %m.unwrap_or_default(), "no longer leading; programming stopped");
                break false;
            }
            _ = stop.wait_for(|s| *s) => break true,
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
        }
        if ctl.round().await {
            deadline = tokio::time::Instant::now() + resync;
        } else {
            ctl.invalidate();
            deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        }
    };
    renew.abort();
    let _ = renew.await;
    stopped
}

async fn serve_metrics(addr: &str, metrics: Arc<metrics::Metrics>) -> Result<(), KubeError> {
    use axum::routing::get;
    let a: std::net::SocketAddr = addr.parse().map_err(|_| KubeError::MetricsAddress(addr.to_string()))?;
    let l = tokio::net::TcpListener::bind(a).await.map_err(io(format!("metrics {a}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use leader::tests::MemLease;
    use leader::Elector;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// Each round: when, and who held the Lease then.
    type Rounds = Arc<Mutex<Vec<(Instant, Option<String>)>>>;

    struct FakeCtl {
        store: Arc<MemLease>,
        rounds: Rounds,
        invalidated: usize,
        /// As the controller's daemons: unknown after `invalidate`, until a round reads them.
        stale: bool,
    }

    impl Programmer for FakeCtl {
        async fn round(&mut self) -> bool {
            self.rounds.lock().unwrap().push((Instant::now(), self.store.holder()));
            self.stale = false;
            true
        }
        async fn daemons_changed(&mut self) -> bool {
            self.stale
        }
        fn invalidate(&mut self) {
            self.invalidated += 1;
            self.stale = true;
        }
    }

    /// A replica `a` on an in-memory Lease of 15 s, its fake controller, and what drives it.
    struct Fixture {
        store: Arc<MemLease>,
        ctl: FakeCtl,
        rounds: Rounds,
        elector: Elector<Arc<MemLease>>,
        stop_tx: tokio::sync::watch::Sender<bool>,
        stop: tokio::sync::watch::Receiver<bool>,
        notify: tokio::sync::Notify,
        metrics: Arc<metrics::Metrics>,
    }

    fn setup() -> Fixture {
        let store = Arc::new(MemLease::default());
        let rounds = Rounds::default();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        Fixture {
            elector: Elector::with(store.clone(), "vectorlb", "a", 15),
            ctl: FakeCtl { store: store.clone(), rounds: rounds.clone(), invalidated: 0, stale: false },
            store,
            rounds,
            stop_tx,
            stop,
            notify: tokio::sync::Notify::new(),
            metrics: Arc::new(metrics::Metrics::default()),
        }
    }

    /// Another replica writes the Lease as its own (a new version each time).
    fn write_as(store: &MemLease, who: &str) {
        let mut g = store.lease.lock().unwrap();
        let l = g.as_mut().unwrap();
        l.spec.as_mut().unwrap().holder_identity = Some(who.into());
        let v = l.metadata.resource_version.clone().unwrap_or_default().parse::<u64>().unwrap_or(0) + 1;
        l.metadata.resource_version = Some(v.to_string());
    }

    #[tokio::test(start_paused = true)]
    async fn the_leader_programs_on_changes_and_every_resync_and_stops_at_once_when_the_lease_is_lost() {
        let Fixture { store, mut ctl, rounds, elector, stop_tx, stop, notify, metrics } = setup();
        let t0 = Instant::now();
        let driver = async {
            tokio::time::sleep(Duration::from_secs(61)).await;
            notify.notify_one();
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(metrics.leader.load(Ordering::Relaxed));
            // Another replica takes the Lease (a's renewals were late) and keeps it.
            let taken = Instant::now();
            for _ in 0..10 {
                write_as(&store, "b");
                tokio::time::sleep(Duration::from_secs(4)).await;
            }
            notify.notify_one();
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(!metrics.leader.load(Ordering::Relaxed), "still leading with the Lease lost");
            stop_tx.send(true).unwrap();
            taken
        };
        let ((), taken) = tokio::join!(run_elected(elector, &mut ctl, &notify, Duration::from_secs(30), &metrics, stop), driver);
        let rounds = rounds.lock().unwrap().clone();
        let at: Vec<u64> = rounds.iter().map(|(t, _)| (*t - t0).as_secs()).collect();
        // At once on leading, at each resync (30 s), and on a change (61 s).
        assert_eq!(at, [0, 30, 60, 61], "{at:?}");
        assert!(rounds.iter().all(|(t, h)| *t < taken && h.as_deref() == Some("a")), "a round without the Lease: {rounds:?}");
        assert_eq!(ctl.invalidated, 1, "the daemons are read again on leading");
        assert_eq!(store.holder().as_deref(), Some("b"), "a's stop gave up b's Lease");
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_cut_off_from_kube_apiserver_stops_programming_and_leads_again_when_it_returns() {
        let Fixture { store, mut ctl, rounds, elector, stop_tx, stop, notify, metrics } = setup();
        let t0 = Instant::now();
        let driver = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store.down.store(true, Ordering::Relaxed);
            // Changes keep coming while it is away: no round may take them once the Lease is
            // unsure (two thirds of it, 10 s, without a renewal).
            for _ in 0..30 {
                notify.notify_one();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            assert!(!metrics.leader.load(Ordering::Relaxed));
            store.down.store(false, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(6)).await;
            assert!(metrics.leader.load(Ordering::Relaxed), "not leading again after kube-apiserver came back");
            stop_tx.send(true).unwrap();
        };
        tokio::join!(run_elected(elector, &mut ctl, &notify, Duration::from_secs(30), &metrics, stop), driver);
        let rounds = rounds.lock().unwrap().clone();
        let at: Vec<f64> = rounds.iter().map(|(t, _)| (*t - t0).as_secs_f64()).collect();
        // The last renewal was at 0 s: rounds until 15 s at most (the renewal that finds it
        // lost), none from then until it leads again at about 35 s.
        assert!(at.iter().all(|t| *t <= 15.1 || *t >= 30.0), "a round while the Lease was unsure: {at:?}");
        assert!(at.iter().any(|t| *t >= 30.0), "no round after leading again: {at:?}");
        assert_eq!(ctl.invalidated, 2, "the daemons are read again each time it leads");
        assert!(metrics.watches.count() >= 1, "the watches list again when kube-apiserver is back");
        assert_eq!(store.holder(), None, "the Lease is released on a clean stop");
    }
}
