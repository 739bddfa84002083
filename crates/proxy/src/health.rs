//! Active health checks of the clusters' endpoints: one task per endpoint checks it every
//! `interval` (a TCP connection, or an HTTP/1.1 `GET` whose status must be `expect_status`),
//! each check bounded by `timeout`. After `fall` failures in a row the endpoint takes no
//! requests (the scheduler balances over the others); after `rise` successes it takes them
//! again. The tasks end with the proxy that started them (on reload, the new one starts its own).

use crate::config::{Health, HealthKind};
use crate::proxy::Proxy;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One check; the reason when it fails.
pub async fn check(addr: SocketAddr, h: &Health) -> Result<(), String> {
    let run = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let HealthKind::Http { path, expect_status } = &h.kind else { return Ok(()) };
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: vectorlb-proxy-health\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
        // The status line is all that is needed: "HTTP/1.1 200 ...".
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            let r = s.read(&mut buf[n..]).await.map_err(|e| format!("read: {e}"))?;
            if r == 0 {
                return Err("closed before the status line".into());
            }
            n += r;
        }
        let line = String::from_utf8_lossy(&buf[..n]);
        let status: Option<u16> = line.strip_prefix("HTTP/1.").and_then(|r| r.get(2..5)).and_then(|c| c.parse().ok());
        match status {
            Some(c) if c == *expect_status => Ok(()),
            Some(c) => Err(format!("status {c}, expected {expect_status}")),
            None => Err("not an HTTP response".into()),
        }
    };
    match tokio::time::timeout(h.timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer in {:?}", h.timeout)),
    }
}

/// Starts the checks of every cluster that has them; they stop when `proxy` is dropped or
/// retired.
pub fn spawn(proxy: &Arc<Proxy>) {
    for (ci, c) in proxy.clusters.iter().enumerate() {
        let Some(h) = c.spec.health.clone() else { continue };
        for (ei, e) in c.spec.endpoints.iter().enumerate() {
            let weak: Weak<Proxy> = Arc::downgrade(proxy);
            let addr = e.address;
            let h = h.clone();
            tokio::spawn(async move {
                let (mut ok_run, mut fail_run) = (0u32, 0u32);
                let mut tick = tokio::time::interval(h.interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let r = check(addr, &h).await;
                    let Some(p) = weak.upgrade() else { return };
                    if p.retired.load(Ordering::Relaxed) {
                        return;
                    }
                    let c = &p.clusters[ci];
                    let st = &c.stats[ei];
                    st.health_checks.fetch_add(1, Ordering::Relaxed);
                    match r {
                        Ok(()) => {
                            ok_run += 1;
                            fail_run = 0;
                            if ok_run >= h.rise {
                                c.set_healthy(ei, true);
                            }
                        }
                        Err(why) => {
                            st.health_failures.fetch_add(1, Ordering::Relaxed);
                            fail_run += 1;
                            ok_run = 0;
                            if fail_run >= h.fall && st.healthy.load(Ordering::Relaxed) {
                                tracing::warn!(cluster = %c.spec.name, endpoint = %addr, "health check: {why}");
                                c.set_healthy(ei, false);
                            }
                        }
                    }
                }
            });
        }
    }
}
