//! Health checks: one async task per (service, backend) on the daemon's runtime checks it every
//! `interval` through the host's own network stack (TCP connect, HTTP or HTTPS GET, UDP
//! request/answer, or a command). After `fall` consecutive failures a backend is down: the
//! published configuration gives it weight 0 (`on_down = "keep"`: its sessions continue) or
//! leaves it out (`"reset"`: they end, and TCP clients get a reset on their next packet); after
//! `rise` consecutive successes it is up again. Backends start up.

use crate::lock;
use crate::workers::Event;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vectorlb_config::{CheckKind, Config, HealthSpec, OnDown};

/// A checked backend: service (protocol, VIP, port) and backend (address, port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    pub proto: u8,
    pub vip: IpAddr,
    pub vport: u16,
    pub addr: IpAddr,
    pub port: u16,
}

#[derive(Debug, Clone)]
pub struct State {
    pub up: bool,
    /// Consecutive successes / failures (the other is 0).
    pub successes: u32,
    pub failures: u32,
    pub checks: u64,
    pub failed_checks: u64,
    pub transitions: u64,
    pub since: Instant,
    pub last_duration: Duration,
    pub last_error: Option<String>,
    pub on_down: OnDown,
}

impl State {
    fn new(on_down: OnDown) -> State {
        State { up: true, successes: 0, failures: 0, checks: 0, failed_checks: 0, transitions: 0, since: Instant::now(), last_duration: Duration::ZERO, last_error: None, on_down }
    }
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Http(#[from] vectorlb_client::Error),
    #[error("status {got}, expected {expected}")]
    Status { got: u16, expected: u16 },
    #[error("{what}: {source}")]
    Udp { what: &'static str, source: std::io::Error },
    #[error("answer does not contain the expected bytes")]
    UnexpectedAnswer,
    #[error("spawn: {0}")]
    Spawn(std::io::Error),
    #[error("wait: {0}")]
    Wait(std::io::Error),
    #[error("command exited with {0}")]
    Exit(std::process::ExitStatus),
    #[error("command timed out")]
    CommandTimeout,
}

struct Runner {
    spec: HealthSpec,
    task: tokio::task::JoinHandle<()>,
}

pub struct Health {
    states: Mutex<HashMap<Target, State>>,
    runners: Mutex<HashMap<Target, Runner>>,
    events: Sender<Event>,
    rt: tokio::runtime::Handle,
}

impl Health {
    /// Checks run as tasks on `rt`; changes are reported on `events`.
    pub fn new(events: Sender<Event>, rt: tokio::runtime::Handle) -> Arc<Health> {
        Arc::new(Health { states: Mutex::default(), runners: Mutex::default(), events, rt })
    }

    pub fn state(&self, t: &Target) -> Option<State> {
        lock(&self.states).get(t).cloned()
    }

    pub fn all(&self) -> Vec<(Target, State)> {
        lock(&self.states).iter().map(|(t, s)| (*t, s.clone())).collect()
    }

    /// Backends that are down, with what happens to their sessions.
    pub fn down(&self) -> Vec<(Target, OnDown)> {
        lock(&self.states).iter().filter(|(_, s)| !s.up).map(|(t, s)| (*t, s.on_down)).collect()
    }

    /// Starts checks for new targets, restarts changed ones, stops the ones that went.
    /// Returns whether a backend that was down lost its check (removed, or replaced by another
    /// check, which starts up): then what is published must be made again.
    pub fn reconcile(self: &Arc<Self>, c: &Config) -> bool {
        let mut want: HashMap<Target, HealthSpec> = HashMap::new();
        for (i, s) in c.spec.services.iter().enumerate() {
            let Some(Some(h)) = c.health.get(i) else { continue };
            for b in &s.backends {
                want.insert(Target { proto: s.proto, vip: s.vip, vport: s.port, addr: b.addr, port: b.port }, h.clone());
            }
        }
        let mut runners = lock(&self.runners);
        let mut states = lock(&self.states);
        let mut was_down = false;
        runners.retain(|t, r| {
            let keep = want.get(t) == Some(&r.spec);
            if !keep {
                r.task.abort();
                was_down |= states.remove(t).is_some_and(|s| !s.up);
            }
            keep
        });
        for (t, spec) in want {
            if runners.contains_key(&t) {
                continue;
            }
            states.insert(t, State::new(spec.on_down));
            let me = self.clone();
            let task = self.rt.spawn(me.clone().run(t, spec.clone()));
            runners.insert(t, Runner { spec, task });
        }
        was_down
    }

    pub fn stop_all(&self) {
        for (_, r) in lock(&self.runners).drain() {
            r.task.abort();
        }
    }

    async fn run(self: Arc<Self>, t: Target, spec: HealthSpec) {
        let port = if spec.port != 0 {
            spec.port
        } else if t.port != 0 {
            t.port
        } else {
            t.vport
        };
        let addr = SocketAddr::new(t.addr, port);
        let timeout = Duration::from_millis(spec.timeout as u64);
        let mut tick = tokio::time::interval(Duration::from_millis(spec.interval as u64));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let start = Instant::now();
            let r = check(&spec.kind, addr, &t, timeout).await;
            if self.record(&t, &spec, r, start.elapsed()) {
                let _ = self.events.send(Event::HealthChanged);
            }
        }
    }

    /// Counts a check's result; true when the backend went up or down.
    fn record(&self, t: &Target, spec: &HealthSpec, r: Result<(), CheckError>, took: Duration) -> bool {
        let mut states = lock(&self.states);
        let Some(s) = states.get_mut(t) else { return false };
        s.checks += 1;
        s.last_duration = took;
        let before = s.up;
        match r {
            Ok(()) => {
                s.successes += 1;
                s.failures = 0;
                s.last_error = None;
                if !s.up && s.successes >= spec.rise {
                    s.up = true;
                }
            }
            Err(e) => {
                s.failed_checks += 1;
                s.failures += 1;
                s.successes = 0;
                s.last_error = Some(e.to_string());
                if s.up && s.failures >= spec.fall {
                    s.up = false;
                }
            }
        }
        if s.up == before {
            return false;
        }
        s.transitions += 1;
        s.since = Instant::now();
        tracing::warn!(
            backend = %SocketAddr::new(t.addr, t.port),
            service = %format!("{}/{}", vectorlb_api::model::Proto::of(t.proto).name(), SocketAddr::new(t.vip, t.vport)),
            error = s.last_error.as_deref().unwrap_or(""),
            "health: backend is {}",
            if s.up { "up" } else { "down" }
        );
        true
    }
}

async fn within<T>(timeout: Duration, f: impl std::future::Future<Output = Result<T, CheckError>>) -> Result<T, CheckError> {
    tokio::time::timeout(timeout, f).await.map_err(|_| CheckError::Timeout(timeout))?
}

/// One check of `addr`. The error says what failed.
pub async fn check(kind: &CheckKind, addr: SocketAddr, t: &Target, timeout: Duration) -> Result<(), CheckError> {
    match kind {
        CheckKind::Tcp => within(timeout, async { tokio::net::TcpStream::connect(addr).await.map(drop).map_err(CheckError::Connect) }).await,
        CheckKind::Http { path, host, expect_status, tls } => {
            let host = host.clone().unwrap_or_else(|| addr.ip().to_string());
            let o = vectorlb_client::Options { connect_timeout: timeout, timeout, tls_server_name: tls.then(|| host.clone()), read_body: false, ..Default::default() };
            let r = vectorlb_client::request(&vectorlb_client::Target::Tcp(addr), &vectorlb_client::Request::get(path.clone(), host), &o).await?;
            if r.status.as_u16() != *expect_status {
                return Err(CheckError::Status { got: r.status.as_u16(), expected: *expect_status });
            }
            Ok(())
        }
        CheckKind::Udp { send, expect } => {
            within(timeout, async {
                let udp = |what| move |source| CheckError::Udp { what, source };
                let bind: SocketAddr = if addr.is_ipv6() { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() } else { (std::net::Ipv4Addr::UNSPECIFIED, 0).into() };
                let s = tokio::net::UdpSocket::bind(bind).await.map_err(udp("bind"))?;
                s.connect(addr).await.map_err(udp("connect"))?;
                s.send(send).await.map_err(udp("send"))?;
                let mut buf = [0u8; 2048];
                let n = s.recv(&mut buf).await.map_err(udp("no answer"))?;
                if !expect.is_empty() && !buf[..n].windows(expect.len()).any(|w| w == &expect[..]) {
                    return Err(CheckError::UnexpectedAnswer);
                }
                Ok(())
            })
            .await
        }
        CheckKind::Exec { command } => {
            let mut child = tokio::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(command)
                .env("VLB_BACKEND_ADDR", addr.ip().to_string())
                .env("VLB_BACKEND_PORT", addr.port().to_string())
                .env("VLB_VIP", t.vip.to_string())
                .env("VLB_VPORT", t.vport.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .map_err(CheckError::Spawn)?;
            match tokio::time::timeout(timeout, child.wait()).await {
                Ok(Ok(st)) if st.success() => Ok(()),
                Ok(Ok(st)) => Err(CheckError::Exit(st)),
                Ok(Err(e)) => Err(CheckError::Wait(e)),
                Err(_) => {
                    let _ = child.kill().await;
                    Err(CheckError::CommandTimeout)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn target(addr: SocketAddr) -> Target {
        Target { proto: 6, vip: "10.0.0.100".parse().unwrap(), vport: 80, addr: addr.ip(), port: addr.port() }
    }

    async fn http_server(status: u16) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                let mut b = [0u8; 1024];
                let _ = c.read(&mut b).await;
                let _ = c.write_all(format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
            }
        });
        a
    }

    #[tokio::test]
    async fn checks_pass_and_fail_for_the_right_reasons() {
        let t = Duration::from_millis(500);
        // TCP: a listener passes, a closed port fails.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = l.local_addr().unwrap();
        assert!(check(&CheckKind::Tcp, open, &target(open), t).await.is_ok());
        drop(l);
        // A port bound but not listening stays closed: another test of this process cannot be
        // handed it (a port merely freed could be, and then the check passed).
        let closed_sock = tokio::net::TcpSocket::new_v4().unwrap();
        closed_sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let closed = closed_sock.local_addr().unwrap();
        assert!(check(&CheckKind::Tcp, closed, &target(closed), t).await.unwrap_err().to_string().starts_with("connect:"));
        // HTTP: the expected status passes, another fails.
        let ok = http_server(200).await;
        let http = |st| CheckKind::Http { path: "/healthz".into(), host: None, expect_status: st, tls: false };
        assert!(check(&http(200), ok, &target(ok), t).await.is_ok());
        let bad = http_server(503).await;
        assert_eq!(check(&http(200), bad, &target(bad), t).await.unwrap_err().to_string(), "status 503, expected 200");
        // UDP: an echo passes (with the expected bytes), silence and a refusal fail.
        let echo = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let ea = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let mut b = [0u8; 64];
            while let Ok((n, from)) = echo.recv_from(&mut b).await {
                let mut out = b"pong ".to_vec();
                out.extend_from_slice(&b[..n]);
                let _ = echo.send_to(&out, from).await;
            }
        });
        let udp = |e: &[u8]| CheckKind::Udp { send: b"ping".to_vec(), expect: e.to_vec() };
        assert!(check(&udp(b"pong"), ea, &target(ea), t).await.is_ok());
        assert!(check(&udp(b"nope"), ea, &target(ea), t).await.is_err());
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let sa = silent.local_addr().unwrap();
        assert!(matches!(check(&udp(b""), sa, &target(sa), Duration::from_millis(100)).await, Err(CheckError::Timeout(_))));
        drop(silent);
        assert!(check(&udp(b""), sa, &target(sa), t).await.is_err(), "a closed port fails");
        // Exec: exit status and timeout, with the backend in the environment.
        let ex = |c: &str| CheckKind::Exec { command: c.into() };
        let be: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        assert!(check(&ex("test \"$VLB_BACKEND_PORT\" = 4242 && test \"$VLB_VPORT\" = 80"), be, &target(open), t).await.is_ok());
        assert!(check(&ex("exit 3"), open, &target(open), t).await.unwrap_err().to_string().contains("exit status: 3"));
        assert_eq!(check(&ex("sleep 5"), open, &target(open), Duration::from_millis(100)).await.unwrap_err().to_string(), "command timed out");
    }
}
