//! The controller's metrics (Prometheus text on `/metrics` of `metrics = ADDRESS:PORT`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use vectorlb_http::prom::{esc, head};

#[derive(Default)]
pub struct Metrics {
    pub leader: AtomicBool,
    rounds: AtomicU64,
    round_seconds_sum: Mutex<f64>,
    last_round_seconds: Mutex<f64>,
    services: AtomicU64,
    max_backends: AtomicU64,
    status_writes: AtomicU64,
    watch_errors: AtomicU64,
    /// Every watch, started again when kube-apiserver seems to have come back.
    pub watches: crate::watch::Restarts,
    /// daemon → (ok rounds, failed rounds, services put, services deleted)
    daemons: Mutex<BTreeMap<String, [u64; 4]>>,
}

impl Metrics {
    pub fn round(&self, took: Duration, services: u64, max_backends: u64) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        *self.round_seconds_sum.lock().unwrap() += took.as_secs_f64();
        *self.last_round_seconds.lock().unwrap() = took.as_secs_f64();
        self.services.store(services, Ordering::Relaxed);
        self.max_backends.store(max_backends, Ordering::Relaxed);
    }

    pub fn status_written(&self) {
        self.status_writes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn watch_error(&self) {
        self.watch_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn daemon_ok(&self, name: &str, put: u64, deleted: u64) {
        let mut m = self.daemons.lock().unwrap();
        let e = m.entry(name.to_string()).or_default();
        e[0] += 1;
        e[2] += put;
        e[3] += deleted;
    }

    pub fn daemon_error(&self, name: &str) {
        self.daemons.lock().unwrap().entry(name.to_string()).or_default()[1] += 1;
    }

    pub fn render(&self) -> String {
        let mut o = String::new();
        head(&mut o, "vectorlb_kube_leader", "gauge", "1 while this replica holds the Lease and programs the daemons.");
        let _ = writeln!(o, "vectorlb_kube_leader {}", u8::from(self.leader.load(Ordering::Relaxed)));
        head(&mut o, "vectorlb_kube_rounds_total", "counter", "Reconciliation rounds run.");
        let _ = writeln!(o, "vectorlb_kube_rounds_total {}", self.rounds.load(Ordering::Relaxed));
        head(&mut o, "vectorlb_kube_round_seconds_total", "counter", "Time spent in rounds.");
        let _ = writeln!(o, "vectorlb_kube_round_seconds_total {}", self.round_seconds_sum.lock().unwrap());
        head(&mut o, "vectorlb_kube_last_round_seconds", "gauge", "Duration of the last round.");
        let _ = writeln!(o, "vectorlb_kube_last_round_seconds {}", self.last_round_seconds.lock().unwrap());
        head(&mut o, "vectorlb_kube_services", "gauge", "Services of type LoadBalancer this controller implements.");
        let _ = writeln!(o, "vectorlb_kube_services {}", self.services.load(Ordering::Relaxed));
        head(&mut o, "vectorlb_kube_backends", "gauge", "Backends programmed on the daemon with the most.");
        let _ = writeln!(o, "vectorlb_kube_backends {}", self.max_backends.load(Ordering::Relaxed));
        head(&mut o, "vectorlb_kube_status_writes_total", "counter", "Service status updates written.");
        let _ = writeln!(o, "vectorlb_kube_status_writes_total {}", self.status_writes.load(Ordering::Relaxed));
        head(&mut o, "vectorlb_kube_watch_errors_total", "counter", "Watch failures (each is retried with backoff).");
        let _ = writeln!(o, "vectorlb_kube_watch_errors_total {}", self.watch_errors.load(Ordering::Relaxed));
        head(&mut o, "vectorlb_kube_watch_restarts_total", "counter", "Times every watch was started again (listed anew) because kube-apiserver went away and came back.");
        let _ = writeln!(o, "vectorlb_kube_watch_restarts_total {}", self.watches.count());
        let d = self.daemons.lock().unwrap();
        for (i, (name, help)) in [
            ("vectorlb_kube_daemon_rounds_total", "Rounds that converged a daemon."),
            ("vectorlb_kube_daemon_errors_total", "Rounds that failed to reach or program a daemon."),
            ("vectorlb_kube_daemon_services_put_total", "Services added or changed on a daemon."),
            ("vectorlb_kube_daemon_services_deleted_total", "Services removed from a daemon."),
        ]
        .iter()
        .enumerate()
        {
            head(&mut o, name, "counter", help);
            for (daemon, v) in d.iter() {
                let _ = writeln!(o, "{name}{{daemon=\"{}\"}} {}", esc(daemon), v[i]);
            }
        }
        o
    }
}
