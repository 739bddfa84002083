//! A queue of operations run together: up to eight, or `poll_delay` after the first, whichever
//! comes first (the private-key signatures of `cryptomb` and the X25519 secrets of `keyshare`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Operations per multi-buffer call (AVX-512's eight 64-bit lanes).
pub const LANES: usize = 8;

/// Operations gathered for one multi-buffer call: run when [`LANES`] are queued, or by a timer
/// armed when the first one came ([`Batch::submit`]).
pub(crate) struct Batch<T> {
    ops: Vec<T>,
    /// Bumped at every run, so that a timer armed for an earlier batch leaves a later one.
    generation: u64,
}

impl<T> Default for Batch<T> {
    fn default() -> Self {
        Batch { ops: Vec::new(), generation: 0 }
    }
}

impl<T: Send + 'static> Batch<T> {
    /// Queues `op` on `q`; runs the batch with `run` when it is full, or `delay` after its
    /// first operation (at once where there is no tokio runtime).
    pub(crate) fn submit(q: &Arc<Mutex<Batch<T>>>, op: T, delay: Duration, run: impl Fn(Vec<T>) + Send + 'static) {
        fn lock<T>(q: &Mutex<Batch<T>>) -> std::sync::MutexGuard<'_, Batch<T>> {
            q.lock().unwrap_or_else(|e| e.into_inner())
        }
        let (full, armed) = {
            let mut g = lock(q);
            g.ops.push(op);
            if g.ops.len() >= LANES {
                g.generation += 1;
                (Some(std::mem::take(&mut g.ops)), None)
            } else {
                (None, (g.ops.len() == 1).then_some(g.generation))
            }
        };
        if let Some(batch) = full {
            return run(batch);
        }
        let Some(generation) = armed else { return };
        let take = move |q: &Mutex<Batch<T>>, check: bool| {
            let mut g = lock(q);
            if check && g.generation != generation {
                return Vec::new();
            }
            g.generation += 1;
            std::mem::take(&mut g.ops)
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                let q = q.clone();
                h.spawn(async move {
                    tokio::time::sleep(delay).await;
                    let batch = take(&q, true);
                    if !batch.is_empty() {
                        run(batch);
                    }
                });
            }
            Err(_) => run(take(q, false)),
        }
    }
}
