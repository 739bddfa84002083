//! The health-check node ports of `externalTrafficPolicy: Local` LoadBalancer Services
//! (`spec.healthCheckNodePort`), served as kube-proxy serves them: on this node's addresses
//! (`[cluster_ips] node_addresses`), any path, `200` while the Service has a ready endpoint on
//! this node (`[cluster_ips] node_name`), `503` otherwise (terminating endpoints do not count),
//! with kube-proxy's JSON body, so that an external load balancer probing the node sends
//! traffic only to nodes that can answer it without leaving.
//!
//! The node's kernel hands the NodePort range of these addresses to the data plane
//! (`[ports.pods] node_port_addresses`); a port the data plane has no service on goes back to
//! the host's sockets, where these listen.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one health-check port reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub namespace: String,
    pub name: String,
    /// Ready endpoints on this node.
    pub local: usize,
}

/// The listeners, by port.
pub struct HealthPorts {
    addrs: Vec<IpAddr>,
    state: Arc<Mutex<BTreeMap<u16, Entry>>>,
    listeners: BTreeMap<u16, Vec<tokio::task::JoinHandle<()>>>,
}

/// The answer to a probe of `e` (none: the port has no Service any more): status and body.
pub fn answer(e: Option<&Entry>) -> (u16, String) {
    match e {
        Some(e) => (
            if e.local > 0 { 200 } else { 503 },
            serde_json::json!({"service": {"namespace": e.namespace, "name": e.name}, "localEndpoints": e.local, "serviceProxyHealthy": true}).to_string(),
        ),
        None => (503, serde_json::json!({"localEndpoints": 0, "serviceProxyHealthy": true}).to_string()),
    }
}

impl HealthPorts {
    pub fn new(addrs: Vec<IpAddr>) -> HealthPorts {
        HealthPorts { addrs, state: Arc::new(Mutex::new(BTreeMap::new())), listeners: BTreeMap::new() }
    }

    /// The ports served now.
    pub fn ports(&self) -> Vec<u16> {
        self.listeners.keys().copied().collect()
    }

    /// Serves exactly `want`: new ports get listeners (a port that cannot be bound now is
    /// tried again at the next call), gone ones are closed, the rest answer from `want`.
    pub fn update(&mut self, want: BTreeMap<u16, Entry>) {
        let gone: Vec<u16> = self.listeners.keys().filter(|p| !want.contains_key(p)).copied().collect();
        for p in gone {
            for h in self.listeners.remove(&p).unwrap_or_default() {
                h.abort();
            }
        }
        for (&port, e) in &want {
            if self.listeners.contains_key(&port) {
                continue;
            }
            let mut tasks = Vec::new();
            for a in &self.addrs {
                match bind(SocketAddr::new(*a, port)) {
                    Ok(l) => {
                        let state = self.state.clone();
                        tasks.push(tokio::spawn(serve(l, port, state)));
                    }
                    Err(err) => tracing::warn!("health-check node port {a}:{port} of {}/{}: {err}; tried again at the next round", e.namespace, e.name),
                }
            }
            if tasks.len() == self.addrs.len() {
                self.listeners.insert(port, tasks);
            } else {
                tasks.iter().for_each(|t| t.abort());
            }
        }
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = want;
    }
}

impl Drop for HealthPorts {
    fn drop(&mut self) {
        for h in self.listeners.values().flatten() {
            h.abort();
        }
    }
}

fn bind(a: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let s = if a.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    s.set_reuseaddr(true)?;
    s.bind(a)?;
    s.listen(128)
}

/// Probes answered at once by one listener; more are closed unanswered.
const MAX_OPEN: usize = 256;

async fn serve(l: tokio::net::TcpListener, port: u16, state: Arc<Mutex<BTreeMap<u16, Entry>>>) {
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if open.load(std::sync::atomic::Ordering::Relaxed) >= MAX_OPEN {
            continue;
        }
        open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (state, open) = (state.clone(), open.clone());
        tokio::spawn(async move {
            let _done = Dec(open);
            // The request's head (at most 4 KiB, within 5 s); its content does not matter.
            let mut buf = [0u8; 4096];
            let mut n = 0;
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while n < buf.len() {
                    match c.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return false,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        return true;
                    }
                }
                false
            })
            .await;
            if !matches!(read, Ok(true)) {
                return;
            }
            let (status, body) = answer(state.lock().unwrap_or_else(|p| p.into_inner()).get(&port));
            let reason = if status == 200 { "OK" } else { "Service Unavailable" };
            let head = format!(
                "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = tokio::time::timeout(Duration::from_secs(5), c.write_all([head.as_bytes(), body.as_bytes()].concat().as_slice())).await;
        });
    }
}

/// Counts a probe out when its task ends, however it ends.
struct Dec(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Dec {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(a: SocketAddr) -> String {
        let mut c = tokio::net::TcpStream::connect(a).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).await.unwrap();
        s
    }

    #[tokio::test]
    async fn answers_by_local_endpoints_and_follows_the_services() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut h = HealthPorts::new(vec!["127.0.0.1".parse().unwrap()]);
        let e = |local| Entry { namespace: "ns".into(), name: "web".into(), local };
        h.update([(free, e(2))].into());
        let a: SocketAddr = format!("127.0.0.1:{free}").parse().unwrap();
        let r = get(a).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.contains(r#""localEndpoints":2"#) && r.contains(r#""name":"web""#), "{r}");
        h.update([(free, e(0))].into());
        let r = get(a).await;
        assert!(r.starts_with("HTTP/1.1 503 ") && r.contains(r#""localEndpoints":0"#), "{r}");
        assert_eq!(h.ports(), [free]);
        h.update(BTreeMap::new());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(tokio::net::TcpStream::connect(a).await.is_err(), "closed with its Service");
        assert!(h.ports().is_empty());
    }
}
