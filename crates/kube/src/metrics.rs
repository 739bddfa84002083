//! The controller's metrics (Prometheus text on `/metrics` of `metrics = ADDRESS:PORT`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use vectorlb_http::prom::{esc, head};

/// Every watch of the controller, started again (listed anew) at once when the controller
/// has reason to think kube-apiserver went away and came back (its Lease could not be
/// renewed and then could, or was taken again): a watch's connection to the old process may
/// otherwise stall silently until the read deadline.
pub struct Restarts {
    generation: tokio::sync::watch::Sender<u64>,
    count: AtomicU64,
}

impl Default for Restarts {
    fn default() -> Restarts {
        Restarts { generation: tokio::sync::watch::Sender::new(0), count: AtomicU64::new(0) }
    }
}

impl Restarts {
    /// Starts every watch again.
    pub fn restart(&self, why: &str) {
        self.count.fetch_add(1, Ordering::Relaxed);
        tracing::info!(reason = why, "every watch starts again (a new list)");
        self.generation.send_modify(|g| *g += 1);
    }

    /// How many times [`Restarts::restart`] was called.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Changes at every restart (what each watch waits on).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

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
    pub watches: Restarts,
    /// When the controller's loop last went round (ms since 1970; 0 before the first): its
    /// liveness (`/healthz`).
    progress_ms: AtomicU64,
    /// daemon → (ok rounds, failed rounds, services put, services deleted)
    daemons: Mutex<BTreeMap<String, [u64; 4]>>,
}

/// A loop that has not gone round for this long is stalled: `/healthz` answers 503 and the
/// Deployment's liveness probe restarts the container.
pub const STALLED_AFTER: Duration = Duration::from_secs(90);

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Metrics {
    /// The loop went round (waiting for the Lease, or leading: at least once a second).
    pub fn tick(&self) {
        self.progress_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// How long the loop has not gone round, at `now_ms` (None before its first round: the
    /// caches are still filling).
    pub fn stalled_for(&self, now_ms: u64) -> Option<Duration> {
        match self.progress_ms.load(Ordering::Relaxed) {
            0 => None,
            t => Some(Duration::from_millis(now_ms.saturating_sub(t))),
        }
    }

    /// `/healthz`: 200 while the loop goes round, 503 once it has not for [`STALLED_AFTER`].
    pub fn health(&self) -> (u16, String) {
        match self.stalled_for(now_ms()) {
            Some(d) if d >= STALLED_AFTER => (503, format!("stalled: the controller's loop has not gone round for {} s\n", d.as_secs())),
            _ => (200, "ok\n".into()),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_that_stops_going_round_is_unhealthy() {
        let m = Metrics::default();
        assert_eq!(m.stalled_for(1_000), None, "before the first round: starting, not stalled");
        assert_eq!(m.health().0, 200);
        m.tick();
        assert_eq!(m.health().0, 200);
        let t = m.progress_ms.load(Ordering::Relaxed);
        assert_eq!(m.stalled_for(t + 5_000), Some(Duration::from_secs(5)));
        // Ninety seconds without a round.
        m.progress_ms.store(now_ms() - STALLED_AFTER.as_millis() as u64 - 1_000, Ordering::Relaxed);
        let (code, text) = m.health();
        assert_eq!(code, 503);
        assert!(text.contains("stalled"), "{text}");
    }
}
