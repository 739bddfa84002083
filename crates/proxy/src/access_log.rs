//! The access log: one JSON line per request, written by a thread of its own so that a slow
//! disk never holds a worker. The queue is bounded; lines that do not fit are dropped and
//! counted (`vectorlb_proxy_access_log_dropped_total`). The file is opened for appending at
//! start and again at each reload, so a rotated log is reopened with SIGHUP.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};

/// Lines waiting for the writer, at most.
pub const QUEUE: usize = 65536;

pub struct AccessLog {
    tx: SyncSender<String>,
    pub written: std::sync::Arc<AtomicU64>,
    pub dropped: AtomicU64,
}

/// One request as logged.
#[derive(serde::Serialize)]
pub struct Entry<'a> {
    /// Seconds since the epoch, with microseconds.
    pub time: f64,
    pub listener: &'a str,
    pub client: String,
    pub method: &'a str,
    pub authority: Option<&'a str>,
    pub path: &'a str,
    pub protocol: &'a str,
    pub status: u16,
    /// The endpoint that answered; none when the proxy answered itself.
    pub upstream: Option<String>,
    /// Until the response head, milliseconds (bodies stream after it).
    pub duration_ms: f64,
}

impl AccessLog {
    /// Opens `path` for appending ("-": standard output) and starts the writer.
    pub fn open(path: &str) -> Result<AccessLog, String> {
        let mut out: Box<dyn Write + Send> =
            if path == "-" { Box::new(std::io::stdout()) } else { Box::new(std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| format!("{path}: {e}"))?) };
        let (tx, rx) = sync_channel::<String>(QUEUE);
        let written = std::sync::Arc::new(AtomicU64::new(0));
        let w = written.clone();
        std::thread::Builder::new()
            .name("vlb-access-log".into())
            .spawn(move || {
                let mut buf = Vec::with_capacity(1 << 16);
                // Ends when every sender is gone (the proxy that owned the log was replaced).
                while let Ok(line) = rx.recv() {
                    buf.extend_from_slice(line.as_bytes());
                    let mut n = 1;
                    while let Ok(more) = rx.try_recv() {
                        buf.extend_from_slice(more.as_bytes());
                        n += 1;
                        if buf.len() > 1 << 16 {
                            break;
                        }
                    }
                    if out.write_all(&buf).and_then(|_| out.flush()).is_err() {
                        tracing::warn!("access log: write failed");
                    }
                    w.fetch_add(n, Ordering::Relaxed);
                    buf.clear();
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(AccessLog { tx, written, dropped: AtomicU64::new(0) })
    }

    pub fn log(&self, e: &Entry) {
        let Ok(mut line) = serde_json::to_string(e) else { return };
        line.push('\n');
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
