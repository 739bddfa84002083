//! `vectorlb proxy --config FILE`: the process: its runtime, its admin API, its signals.

use crate::config::Config;
use crate::serve::{bind, start, Proxy, ServeError};
use std::sync::Arc;
use std::time::Duration;

/// `vectorlb proxy --config FILE`: runs until SIGTERM or SIGINT, then drains; SIGHUP reloads
/// the file.
pub fn run(path: &std::path::Path) -> Result<(), ServeError> {
    let config = Config::load(path)?;
    // One worker: everything on this thread, without the work-stealing scheduler's cross-thread
    // bookkeeping (about 3 % of a core in the TLS handshake benchmark).
    let mut builder = if config.workers == 1 { tokio::runtime::Builder::new_current_thread() } else { tokio::runtime::Builder::new_multi_thread() };
    if config.workers > 1 {
        builder.worker_threads(config.workers);
    }
    let rt = builder.thread_name("vlb-proxy").enable_all().build().map_err(ServeError::Runtime)?;
    rt.block_on(async move {
        let proxy = Arc::new(Proxy::new(config)?);
        // The admin API first: a start that cannot serve it binds no listener.
        let admin = match &proxy.config.admin {
            None => None,
            Some(a) => {
                let token = match &a.token_file {
                    Some(f) => Some(vectorlb_http::server::read_token(f).map_err(|e| ServeError::Admin(format!("token_file: {f}: {e}")))?),
                    None => None,
                };
                let endpoint: vectorlb_http::Endpoint = a.address.parse().map_err(|e: vectorlb_client::Error| ServeError::Admin(e.to_string()))?;
                let l = vectorlb_http::server::Listener::bind(&endpoint, &vectorlb_http::Access { group: a.group.clone() }).await.map_err(|e| ServeError::Admin(e.to_string()))?;
                tracing::info!("admin API on {}", a.address);
                Some((l, token))
            }
        };
        let bound = bind(&proxy.config).await?;
        for (l, a) in proxy.config.listeners.iter().zip(bound.addresses()) {
            tracing::info!("listener {} on {a}", l.name);
        }
        let cur = start(proxy, bound, Some(path.to_path_buf()));
        let (stopped_tx, stopped_rx) = tokio::sync::watch::channel(false);
        let admin_task = admin.map(|(l, token)| {
            let mut rx = stopped_rx.clone();
            tokio::spawn(vectorlb_http::server::serve(l, crate::admin::router(cur.clone()), token, async move {
                let _ = rx.wait_for(|s| *s).await;
            }))
        });
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(ServeError::Runtime)?;
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(ServeError::Runtime)?;
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading {}", path.display());
                    let _ = cur.reload().await;
                }
            }
        }
        tracing::info!("stopping: draining connections");
        let _ = stopped_tx.send(true);
        if let Some(t) = admin_task {
            let _ = t.await;
        }
        cur.drain(Duration::from_secs(10)).await;
        Ok(())
    })
}
