//! In-memory benchmarks of the load-balancer pipeline on one core.
//!
//! * [`pipeline`]: fills a session table with N flows, then pushes batches of packets drawn
//!   uniformly at random from those flows (the cache's worst case) through `Worker::process`,
//!   and measures packets per second and resident bytes per session.
//! * [`cps`]: complete TCP lifecycles (the HTTP/1.0 pattern of seed 003 §4.2) through the
//!   pipeline, sessions created and removed, and measures connections per second.
//!
//! The generator (building the frames a NIC would deliver) is timed separately from the
//! pipeline: results report the pipeline's time, and the whole loop's time alongside.

pub mod cps;
pub mod pipeline;
pub mod sync;
pub mod synflood;
pub mod topo;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An option out of range; the message names it.
    #[error("{0}")]
    Option(String),
    #[error("the benchmark's configuration: {0}")]
    Config(#[from] vectorlb_lb::ConfigError),
    #[error("cannot allocate the session table: {0}")]
    Table(#[from] std::io::Error),
    #[error("filled {filled} of {wanted} sessions ({drops})")]
    Fill { filled: u64, wanted: u64, drops: String },
    #[error("a benchmark thread panicked")]
    Panicked,
    #[error("the system gave no random bytes (a sync key salt)")]
    Random,
}

use vectorlb_lb::{HeapBuf, Verdict, Worker};

/// The timed work of both benchmarks, kept out of line so that a profiler can count it alone
/// (bench/profile.sh: callgrind --toggle-collect on this symbol).
#[inline(never)]
pub fn timed_process(w: &mut Worker, bufs: &mut [HeapBuf], verdicts: &mut [Verdict], now: u32) {
    w.process(bufs, verdicts, now);
}

/// The timed work of routed flows (`pipeline --routed`), out of line for the same reason.
#[inline(never)]
pub fn timed_route(w: &mut Worker, bufs: &mut [HeapBuf], verdicts: &mut [Verdict], now: u32) {
    for (b, v) in bufs.iter_mut().zip(verdicts.iter_mut()) {
        *v = w.route(b, now);
    }
}

/// Tests that allocate or free megabytes, or read the process's resident memory, take this lock:
/// resident memory is per process, and the test harness runs tests on parallel threads, so a
/// test freeing a large buffer would otherwise show up as a dip in another test's memory curve.
#[cfg(test)]
pub(crate) static MEMORY_TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Median of a non-empty list.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// xorshift64*: a small, fast PRNG for drawing flows.
pub struct Rng(pub u64);

impl Rng {
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() >> 32) * n) >> 32
    }
}
