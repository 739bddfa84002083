//! Counters and histograms the admin API shows: a lock-free histogram with fixed buckets, and
//! a TLS listener's handshake and key-operation statistics.

use std::sync::atomic::{AtomicU64, Ordering};

/// A Prometheus histogram: cumulative buckets, a count and a sum, updated without locks.
#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// Per bucket (not cumulative), the last one for values above every bound.
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// The sum's f64 bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram { bounds: bounds.to_vec(), counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), count: AtomicU64::new(0), sum: AtomicU64::new(0f64.to_bits()) }
    }

    pub fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|b| v <= *b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self.sum.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| Some((f64::from_bits(old) + v).to_bits()));
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }

    /// (upper bound, cumulative count) per bucket, `+Inf` last.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c.load(Ordering::Relaxed);
            out.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        out
    }

    /// The value below which `q` of the observations fall, interpolated inside its bucket
    /// (as Prometheus's histogram_quantile does); `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let b = self.buckets();
        let total = b.last().map(|x| x.1).unwrap_or(0);
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut lower = (0.0, 0u64);
        for (bound, cum) in b {
            if cum as f64 >= rank {
                if bound.is_infinite() {
                    return Some(lower.0);
                }
                let inside = (cum - lower.1) as f64;
                let frac = if inside > 0.0 { (rank - lower.1 as f64) / inside } else { 1.0 };
                return Some(lower.0 + (bound - lower.0) * frac);
            }
            lower = (bound, cum);
        }
        Some(lower.0)
    }
}

/// Handshake latency buckets, seconds.
pub const HANDSHAKE_BUCKETS: [f64; 14] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0];

/// Handshake statistics of a listener, named like Envoy's where Envoy has them.
#[derive(Debug)]
pub struct TlsStats {
    /// The provider that runs: `inline`, `pool`, `cryptomb/crypto_mb`, `cryptomb/portable`.
    pub provider: String,
    /// Set when the configured provider could not run and `inline` runs instead.
    pub fallback_reason: Option<String>,
    pub handshakes: AtomicU64,
    pub handshake_failures: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    /// From accept to the end of the handshake, seconds.
    pub handshake_seconds: Histogram,
    /// Private-key operations handed to the provider (pool, cryptomb; inline ones run inside
    /// BoringSSL).
    pub offloaded: AtomicU64,
    pub offload_failures: AtomicU64,
    /// Operations per multi-buffer run (cryptomb).
    pub rsa_queue_sizes: Histogram,
    pub ecdsa_queue_sizes: Histogram,
    /// Lanes the multi-buffer backend did not compute, signed alone instead.
    pub key_op_fallbacks: AtomicU64,
    /// Signatures that did not verify with the public key (never sent).
    pub failed_checks: AtomicU64,
}

impl TlsStats {
    pub fn new(provider: &str, fallback_reason: Option<String>) -> TlsStats {
        TlsStats {
            provider: provider.into(),
            fallback_reason,
            handshakes: AtomicU64::new(0),
            handshake_failures: AtomicU64::new(0),
            handshake_timeouts: AtomicU64::new(0),
            handshake_seconds: Histogram::new(&HANDSHAKE_BUCKETS),
            offloaded: AtomicU64::new(0),
            offload_failures: AtomicU64::new(0),
            rsa_queue_sizes: queue_size_histogram(),
            ecdsa_queue_sizes: queue_size_histogram(),
            key_op_fallbacks: AtomicU64::new(0),
            failed_checks: AtomicU64::new(0),
        }
    }
}

impl Default for TlsStats {
    fn default() -> TlsStats {
        TlsStats::new("inline", None)
    }
}

/// Histogram of batch sizes (1..=8): Prometheus buckets.
pub fn queue_size_histogram() -> Histogram {
    Histogram::new(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
}
