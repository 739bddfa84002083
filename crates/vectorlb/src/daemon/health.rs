//! Health checks: one thread per (service, backend) checks it every `interval` through the
//! host's own network stack (TCP connect, HTTP GET, UDP request/answer, or a command). After
//! `fall` consecutive failures a backend is down: the published configuration gives it weight 0
//! (`on_down = "keep"`: its sessions continue) or leaves it out (`"reset"`: they end, and
//! TCP clients get a reset on their next packet); after
//! `rise` consecutive successes it is up again. Backends start up.

use super::{lock, Event};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
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
        State {
            up: true,
            successes: 0,
            failures: 0,
            checks: 0,
            failed_checks: 0,
            transitions: 0,
            since: Instant::now(),
            last_duration: Duration::ZERO,
            last_error: None,
            on_down,
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "state": if self.up { "up" } else { "down" },
            "since_seconds": self.since.elapsed().as_secs_f64(),
            "consecutive_successes": self.successes, "consecutive_failures": self.failures,
            "checks": self.checks, "failed_checks": self.failed_checks, "transitions": self.transitions,
            "last_check_ms": self.last_duration.as_secs_f64() * 1000.0, "last_error": self.last_error,
        })
    }
}

struct Runner {
    spec: HealthSpec,
    stop: Arc<AtomicBool>,
}

pub struct Health {
    states: Mutex<HashMap<Target, State>>,
    runners: Mutex<HashMap<Target, Runner>>,
    events: Mutex<Sender<Event>>,
}

impl Health {
    pub fn new(events: Sender<Event>) -> Arc<Health> {
        Arc::new(Health { states: Mutex::new(HashMap::new()), runners: Mutex::new(HashMap::new()), events: Mutex::new(events) })
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
    pub fn reconcile(self: &Arc<Self>, c: &Config) {
        let mut want: HashMap<Target, HealthSpec> = HashMap::new();
        for (i, s) in c.spec.services.iter().enumerate() {
            let Some(Some(h)) = c.health.get(i) else { continue };
            for b in &s.backends {
                let t = Target { proto: s.proto, vip: s.vip, vport: s.port, addr: b.addr, port: b.port };
                want.insert(t, h.clone());
            }
        }
        let mut runners = lock(&self.runners);
        let mut states = lock(&self.states);
        runners.retain(|t, r| {
            let keep = want.get(t) == Some(&r.spec);
            if !keep {
                r.stop.store(true, Ordering::SeqCst);
                states.remove(t);
            }
            keep
        });
        for (t, spec) in want {
            if runners.contains_key(&t) {
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            states.insert(t, State::new(spec.on_down));
            runners.insert(t, Runner { spec: spec.clone(), stop: stop.clone() });
            let me = self.clone();
            let _ = std::thread::Builder::new().name("vlb-health".into()).spawn(move || me.run(t, spec, stop));
        }
    }

    pub fn stop_all(&self) {
        for r in lock(&self.runners).values() {
            r.stop.store(true, Ordering::SeqCst);
        }
    }

    fn run(&self, t: Target, spec: HealthSpec, stop: Arc<AtomicBool>) {
        let port = if spec.port != 0 { spec.port } else if t.port != 0 { t.port } else { t.vport };
        let addr = SocketAddr::new(t.addr, port);
        let timeout = Duration::from_millis(spec.timeout as u64);
        let interval = Duration::from_millis(spec.interval as u64);
        while !stop.load(Ordering::SeqCst) {
            let start = Instant::now();
            let r = check(&spec.kind, addr, &t, timeout);
            let took = start.elapsed();
            let changed = {
                let mut states = lock(&self.states);
                let Some(s) = states.get_mut(&t) else { return };
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
                        s.last_error = Some(e);
                        if s.up && s.failures >= spec.fall {
                            s.up = false;
                        }
                    }
                }
                if s.up != before {
                    s.transitions += 1;
                    s.since = Instant::now();
                    eprintln!(
                        "vectorlb: health: backend {} of {}/{} is {}{}",
                        SocketAddr::new(t.addr, t.port),
                        if t.proto == vectorlb_packet::proto::UDP { "udp" } else { "tcp" },
                        SocketAddr::new(t.vip, t.vport),
                        if s.up { "up" } else { "down" },
                        s.last_error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
                    );
                }
                s.up != before
            };
            if changed {
                let _ = lock(&self.events).send(Event::HealthChanged);
            }
            // Sleep out the interval in short steps, so that a stop is seen quickly.
            while start.elapsed() < interval && !stop.load(Ordering::SeqCst) {
                std::thread::sleep((interval - start.elapsed().min(interval)).min(Duration::from_millis(50)));
            }
        }
    }
}

/// One check of `addr`. The error says what failed.
pub fn check(kind: &CheckKind, addr: SocketAddr, t: &Target, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    match kind {
        CheckKind::Tcp => TcpStream::connect_timeout(&addr, timeout).map(|_| ()).map_err(|e| format!("connect: {e}")),
        CheckKind::Http { path, host, expect_status, tls } => {
            let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
            s.set_write_timeout(Some(left())).ok();
            s.set_read_timeout(Some(left())).ok();
            let host = host.clone().unwrap_or_else(|| addr.ip().to_string());
            let req = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: vectorlb-health\r\nConnection: close\r\n\r\n");
            let line = if *tls {
                let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|_| format!("tls: '{host}' is not a server name"))?;
                let conn = rustls::ClientConnection::new(tls_config(), name).map_err(|e| format!("tls: {e}"))?;
                let mut stream = rustls::StreamOwned::new(conn, s);
                status_line(&mut stream, req.as_bytes())?
            } else {
                let mut s = s;
                status_line(&mut s, req.as_bytes())?
            };
            let status: u16 = line.split_whitespace().nth(1).and_then(|x| x.parse().ok()).ok_or("no HTTP status line")?;
            if status != *expect_status {
                return Err(format!("status {status}, expected {expect_status}"));
            }
            Ok(())
        }
        CheckKind::Udp { send, expect } => {
            let bind: SocketAddr = if addr.is_ipv6() { "[::]:0".parse().unwrap() } else { "0.0.0.0:0".parse().unwrap() };
            let s = UdpSocket::bind(bind).map_err(|e| format!("bind: {e}"))?;
            s.connect(addr).map_err(|e| format!("connect: {e}"))?;
            s.send(send).map_err(|e| format!("send: {e}"))?;
            let mut buf = [0u8; 2048];
            s.set_read_timeout(Some(left())).ok();
            let n = s.recv(&mut buf).map_err(|e| format!("no answer: {e}"))?;
            if !expect.is_empty() && !buf[..n].windows(expect.len()).any(|w| w == &expect[..]) {
                return Err("answer does not contain the expected bytes".into());
            }
            Ok(())
        }
        CheckKind::Exec { command } => {
            let mut child = Command::new("/bin/sh")
                .arg("-c")
                .arg(command)
                .env("VLB_BACKEND_ADDR", addr.ip().to_string())
                .env("VLB_BACKEND_PORT", addr.port().to_string())
                .env("VLB_VIP", t.vip.to_string())
                .env("VLB_VPORT", t.vport.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("spawn: {e}"))?;
            loop {
                match child.try_wait() {
                    Ok(Some(st)) if st.success() => return Ok(()),
                    Ok(Some(st)) => return Err(format!("command exited with {st}")),
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err("command timed out".into());
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                    Err(e) => return Err(format!("wait: {e}")),
                }
            }
        }
    }
}

/// Sends `req` and reads the response's first line.
fn status_line<S: Read + Write>(s: &mut S, req: &[u8]) -> Result<String, String> {
    s.write_all(req).map_err(|e| format!("send: {e}"))?;
    s.flush().map_err(|e| format!("send: {e}"))?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// A TLS client that does not verify the server's certificate (a health check asks whether the
/// backend serves, not who it is), with the ring provider's algorithms for the handshake.
fn tls_config() -> Arc<rustls::ClientConfig> {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};
    use std::sync::OnceLock;

    #[derive(Debug)]
    struct AnyCert(Arc<CryptoProvider>);
    impl ServerCertVerifier for AnyCert {
        fn verify_server_cert(&self, _: &CertificateDer<'_>, _: &[CertificateDer<'_>], _: &ServerName<'_>, _: &[u8], _: UnixTime) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(&self, m: &[u8], c: &CertificateDer<'_>, d: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
        }
        fn verify_tls13_signature(&self, m: &[u8], c: &CertificateDer<'_>, d: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("the ring provider supports TLS 1.2 and 1.3")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
                .with_no_client_auth();
            Arc::new(cfg)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn target(addr: SocketAddr) -> Target {
        Target { proto: 6, vip: "10.0.0.100".parse().unwrap(), vport: 80, addr: addr.ip(), port: addr.port() }
    }

    fn http_server(status: u16) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming().flatten().take(4) {
                let mut c = c;
                let mut b = [0u8; 1024];
                let _ = c.read(&mut b);
                let _ = c.write_all(format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n").as_bytes());
            }
        });
        a
    }

    #[test]
    fn checks_pass_and_fail_for_the_right_reasons() {
        let t = Duration::from_millis(500);
        // TCP: a listener passes, a closed port fails.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = l.local_addr().unwrap();
        assert_eq!(check(&CheckKind::Tcp, open, &target(open), t), Ok(()));
        drop(l);
        assert!(check(&CheckKind::Tcp, open, &target(open), t).unwrap_err().starts_with("connect:"));
        // HTTP: the expected status passes, another fails.
        let ok = http_server(200);
        let http = |st| CheckKind::Http { path: "/healthz".into(), host: None, expect_status: st, tls: false };
        assert_eq!(check(&http(200), ok, &target(ok), t), Ok(()));
        let bad = http_server(503);
        assert_eq!(check(&http(200), bad, &target(bad), t).unwrap_err(), "status 503, expected 200");
        // UDP: an echo passes (with the expected bytes), silence and a refusal fail.
        let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
        let ea = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            while let Ok((n, from)) = echo.recv_from(&mut b) {
                let mut out = b"pong ".to_vec();
                out.extend_from_slice(&b[..n]);
                let _ = echo.send_to(&out, from);
            }
        });
        let udp = |e: &[u8]| CheckKind::Udp { send: b"ping".to_vec(), expect: e.to_vec() };
        assert_eq!(check(&udp(b"pong"), ea, &target(ea), t), Ok(()));
        assert!(check(&udp(b"nope"), ea, &target(ea), t).is_err());
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sa = silent.local_addr().unwrap();
        assert!(check(&udp(b""), sa, &target(sa), Duration::from_millis(100)).unwrap_err().starts_with("no answer"));
        drop(silent);
        assert!(check(&udp(b""), sa, &target(sa), t).is_err(), "a closed port fails");
        // Exec: exit status and timeout, with the backend in the environment.
        let ex = |c: &str| CheckKind::Exec { command: c.into() };
        assert_eq!(check(&ex("test \"$VLB_BACKEND_PORT\" = 4242 && test \"$VLB_VPORT\" = 80"), "127.0.0.1:4242".parse().unwrap(), &target(open), t), Ok(()));
        assert!(check(&ex("exit 3"), open, &target(open), t).unwrap_err().contains("exit status: 3"));
        assert_eq!(check(&ex("sleep 5"), open, &target(open), Duration::from_millis(100)).unwrap_err(), "command timed out");
    }
}
