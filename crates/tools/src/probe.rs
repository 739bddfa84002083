//! Probes: small clients and servers that `make demo` and the end-to-end tests run inside
//! network namespaces. They report what real kernels' TCP/UDP stacks saw through the LB.
//!
//! - `http`: HTTP/1.0 GETs, one new connection per request, with a progress bar, the spread
//!   across backends (each backend's page names it) and latency percentiles;
//! - `serve-udp` / `serve-tcp`: echo servers that prefix their answers with their name;
//! - `serve-http`: an HTTP server whose every answer is its name;
//! - `udp` / `tcp`: clients of those (stickiness per flow, payload integrity, path MTU);
//! - `garbage`: malformed frames from a raw socket, at the LB's MAC.

use crate::{io, ToolError};
use clap::{Args, Subcommand};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vectorlb_bench::Rng;

#[derive(Subcommand, Debug)]
pub enum ProbeCmd {
    /// HTTP/1.0 GETs through a VIP, one connection per request.
    Http(HttpArgs),
    /// A UDP echo server that prefixes each answer with its name.
    ServeUdp {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        name: String,
        /// Echo the whole datagram (default: its first 64 bytes).
        #[arg(long)]
        full: bool,
    },
    /// A TCP echo server: sends its name and a newline, then echoes until EOF.
    ServeTcp {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        name: String,
        /// Seconds a connection may stay silent before the server closes it (0: never).
        #[arg(long, default_value_t = 30)]
        idle_timeout_s: u64,
    },
    /// An HTTP/1.x server answering every request with its name (one request per connection,
    /// as `http` sends them); a request head over 16 KiB or silent for 10 s is dropped.
    ServeHttp {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        name: String,
        /// Keep HTTP/1.1 connections open for more requests (unless the client asks to
        /// close); without it every answer closes its connection.
        #[arg(long)]
        keep_alive: bool,
    },
    /// UDP flows to a serve-udp service: spread, stickiness, loss, path MTU.
    Udp(UdpArgs),
    /// TCP connections to a serve-tcp service: each sends BYTES and checks the echo.
    Tcp(TcpArgs),
    /// Malformed frames from a raw socket on IFACE to DST_MAC (the LB).
    Garbage(GarbageArgs),
    /// Long-lived TCP connections to a serve-tcp service: some stream (a message every
    /// interval), the rest stay idle until the end; reports how many survive.
    Hold(HoldArgs),
    /// Sends session-sync messages to a node: valid, sealed under a wrong key, cut short,
    /// outdated, or a valid one twice (a replay). For testing the standby's checks.
    SyncInject(SyncInjectArgs),
}

#[derive(Args, Debug)]
pub struct SyncInjectArgs {
    #[arg(long)]
    pub to: SocketAddr,
    #[arg(long)]
    pub key: String,
    /// good, bad-mac (sealed under another key), truncated, outdated (sealed two minutes ago
    /// by its clock), bulk-done (the end of a bulk transfer nobody asked for), replay (the same
    /// message twice), or replay-new-port (again, from another socket: another source port).
    #[arg(long)]
    pub mode: String,
    /// Records in the message (sessions of 10.0.0.100:9000 from 10.0.0.2 to 10.1.0.11:9000
    /// through 10.1.0.200).
    #[arg(long, default_value_t = 4)]
    pub records: u16,
    /// First client port (and local port) of the records.
    #[arg(long, default_value_t = 30000)]
    pub first_port: u16,
}

#[derive(Args, Debug)]
pub struct HoldArgs {
    /// Where to connect; several (comma-separated) share the connections in turn.
    #[arg(long, value_delimiter = ',', required = true)]
    pub target: Vec<SocketAddr>,
    #[arg(long, default_value_t = 100)]
    pub connections: usize,
    /// How many of them send a message every --interval-ms.
    #[arg(long, default_value_t = 50)]
    pub streaming: usize,
    #[arg(long, default_value_t = 50)]
    pub interval_ms: u64,
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Written once every connection is open (a test waits for it before failing over).
    #[arg(long)]
    pub ready_file: Option<std::path::PathBuf>,
    /// Also open this many new connections a second, throughout (each: connect within 3 s,
    /// the greeting, one round trip, close), counted apart.
    #[arg(long, default_value_t = 0.0)]
    pub new_per_second: f64,
}

#[derive(Args, Debug)]
pub struct HttpArgs {
    /// http://HOST:PORT/PATH ([v6] for IPv6).
    #[arg(long)]
    pub url: String,
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 3000)]
    pub timeout_ms: u64,
    /// Run for this many seconds instead of a number of requests.
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Start at most this many requests a second, evenly spaced (default: as fast as the
    /// connections go). Full NAT through few local addresses reuses a local port on a
    /// backend within its TIME_WAIT above about 1,000 new connections a second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Close each connection only after the server has (read until its FIN), as HTTP/1.0
    /// clients that read a body to the end do: the TIME_WAIT stays with the server. Also
    /// reports how long after the body's last byte the FIN came (`close_after_body_ms`).
    /// (Without it the client closes as soon as it has the body, racing the server's close.)
    #[arg(long)]
    pub wait_close: bool,
    /// Draw a progress bar on stderr.
    #[arg(long)]
    pub progress: bool,
    /// Print one JSON line instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct UdpArgs {
    #[arg(long)]
    pub target: SocketAddr,
    /// Distinct flows (each its own source port).
    #[arg(long, default_value_t = 30)]
    pub flows: usize,
    /// Datagrams per flow.
    #[arg(long, default_value_t = 3)]
    pub per_flow: usize,
    /// Payload bytes.
    #[arg(long, default_value_t = 32)]
    pub size: usize,
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Set "don't fragment" and report the path MTU the kernel learnt.
    #[arg(long)]
    pub df: bool,
    /// Check that each answer carries the whole datagram sent (a `serve-udp --full` server):
    /// answers that differ count as `corrupt`.
    #[arg(long)]
    pub verify: bool,
}

#[derive(Args, Debug)]
pub struct TcpArgs {
    #[arg(long)]
    pub target: SocketAddr,
    #[arg(long, default_value_t = 10)]
    pub connections: usize,
    /// Bytes each connection sends and expects back.
    #[arg(long, default_value_t = 1000)]
    pub bytes: usize,
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

#[derive(Args, Debug)]
pub struct GarbageArgs {
    #[arg(long)]
    pub iface: String,
    #[arg(long)]
    pub dst_mac: String,
    /// An address of ours on that link (source of the crafted IP packets).
    #[arg(long)]
    pub src: IpAddr,
    /// A VIP to aim the crafted IP packets at.
    #[arg(long)]
    pub vip: IpAddr,
    #[arg(long, default_value_t = 5000)]
    pub count: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub fn run(cmd: &ProbeCmd) -> Result<(), ToolError> {
    match cmd {
        ProbeCmd::Http(a) => http(a),
        ProbeCmd::ServeUdp { listen, name, full } => serve_udp(*listen, name, *full),
        ProbeCmd::ServeTcp { listen, name, idle_timeout_s } => serve_tcp(*listen, name, *idle_timeout_s),
        ProbeCmd::ServeHttp { listen, name, keep_alive } => serve_http(*listen, name, *keep_alive),
        ProbeCmd::Udp(a) => udp(a),
        ProbeCmd::Tcp(a) => tcp(a),
        ProbeCmd::Garbage(a) => garbage(a),
        ProbeCmd::Hold(a) => hold(a),
        ProbeCmd::SyncInject(a) => sync_inject(a),
    }
}

/// Percentile of sorted microsecond samples, in milliseconds.
fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

fn bar(done: usize, total: usize, errors: usize) {
    let w = 40;
    let f = (done * w).checked_div(total).unwrap_or(w);
    eprint!("\r  [{}{}] {done}/{total} requests, {errors} errors ", "#".repeat(f), ".".repeat(w - f));
    let _ = std::io::stderr().flush();
}

fn parse_url(url: &str) -> Result<(SocketAddr, String, String), ToolError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| ToolError::Usage(format!("--url: '{url}' must start with http://")))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let hp = if hostport.contains(':') && !hostport.ends_with(']') && hostport.rfind(']').is_none_or(|i| hostport[i..].contains(':')) {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    let addr = hp.to_socket_addrs().map_err(io(format!("--url: {hostport}")))?.next().ok_or_else(|| ToolError::Usage("--url: no address".into()))?;
    Ok((addr, hostport.to_string(), path.to_string()))
}

/// One GET on a new connection (HTTP/1.0, as a browser's first request would be answered by
/// a backend without keep-alive): the first line of the body (the backend's name).
async fn get(addr: SocketAddr, host: &str, path: &str, timeout: Duration) -> Result<String, ToolError> {
    let o = vectorlb_client::Options { connect_timeout: timeout, timeout, version: vectorlb_client::Version::HTTP_10, max_body: 1 << 20, ..Default::default() };
    let r = vectorlb_client::request(&vectorlb_client::Target::Tcp(addr), &vectorlb_client::Request::get(path, host), &o).await?;
    if r.status != vectorlb_client::StatusCode::OK {
        return Err(ToolError::Failed(format!("status {}", r.status.as_u16())));
    }
    Ok(String::from_utf8_lossy(&r.body).lines().next().unwrap_or("").trim().to_string())
}

/// One HTTP/1.0 GET on a new connection, read to the server's close: the first line of the
/// body, and the time from the body's last byte to the FIN.
async fn get_until_close(addr: SocketAddr, host: &str, path: &str, timeout: Duration) -> Result<(String, Duration), ToolError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let failed = |what: &str, e: std::io::Error| ToolError::Failed(format!("{what}: {e}"));
    let work = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| failed("connect", e))?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: vectorlb-probe\r\n\r\n").as_bytes()).await.map_err(|e| failed("write", e))?;
        let (mut buf, mut chunk, mut body_at) = (Vec::with_capacity(1024), [0u8; 4096], None);
        loop {
            let n = s.read(&mut chunk).await.map_err(|e| failed("read", e))?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > 1 << 20 {
                return Err(ToolError::Failed("a response above 1 MiB".into()));
            }
            if body_at.is_none() && response_complete(&buf) {
                body_at = Some(Instant::now());
            }
        }
        let fin = Instant::now();
        let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| ToolError::Failed("closed before the response's head ended".into()))?;
        let status = std::str::from_utf8(&buf[..head_end]).ok().and_then(|h| h.split(' ').nth(1)).unwrap_or("");
        if status != "200" {
            return Err(ToolError::Failed(format!("status {status}")));
        }
        let body = String::from_utf8_lossy(&buf[head_end + 4..]).lines().next().unwrap_or("").trim().to_string();
        Ok((body, fin.duration_since(body_at.unwrap_or(fin))))
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| ToolError::Failed(format!("no close within {timeout:?}")))?
}

/// Whether `buf` holds a whole response by its Content-Length (without one: not until the
/// close).
fn response_complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&buf[..end]);
    let len = head.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length")).and_then(|(_, v)| v.trim().parse::<usize>().ok()));
    len.is_some_and(|l| buf.len() >= end + 4 + l)
}

fn http(a: &HttpArgs) -> Result<(), ToolError> {
    let (addr, host, path) = parse_url(&a.url)?;
    let timeout = Duration::from_millis(a.timeout_ms);
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let errs = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new((BTreeMap::<String, usize>::new(), Vec::<u64>::with_capacity(a.requests), BTreeMap::<String, usize>::new(), Vec::<u64>::new())));
    let start = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(io("async runtime"))?;
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency.clamp(1, 256) {
        let (next, done, errs, results) = (next.clone(), done.clone(), errs.clone(), results.clone());
        let (host, path) = (host.clone(), path.clone());
        let total = if a.duration_s.is_some() { usize::MAX } else { a.requests };
        let until = a.duration_s.map(|d| start + Duration::from_secs_f64(d));
        let (rate, wait_close) = (a.rate, a.wait_close);
        tasks.push(rt.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= total || until.is_some_and(|u| Instant::now() >= u) {
                    return;
                }
                if let Some(r) = rate.filter(|r| *r > 0.0) {
                    tokio::time::sleep_until((start + Duration::from_secs_f64(n as f64 / r)).into()).await;
                }
                let t = Instant::now();
                let r = if wait_close {
                    get_until_close(addr, &host, &path, timeout).await.map(|(n, c)| (n, Some(c)))
                } else {
                    get(addr, &host, &path, timeout).await.map(|n| (n, None))
                };
                let us = t.elapsed().as_micros() as u64;
                let mut g = results.lock().unwrap_or_else(|e| e.into_inner());
                match r {
                    Ok((name, close)) => {
                        *g.0.entry(name).or_default() += 1;
                        g.1.push(us);
                        if let Some(c) = close {
                            g.3.push(c.as_micros() as u64);
                        }
                    }
                    Err(e) => {
                        errs.fetch_add(1, Ordering::SeqCst);
                        *g.2.entry(e.to_string()).or_default() += 1;
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    if a.progress {
        while done.load(Ordering::SeqCst) < a.requests && tasks.iter().any(|t| !t.is_finished()) {
            bar(done.load(Ordering::SeqCst), a.requests, errs.load(Ordering::SeqCst));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for t in tasks {
        let _ = rt.block_on(t);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let requests = done.load(Ordering::SeqCst);
    if a.progress {
        bar(requests, requests, errs.load(Ordering::SeqCst));
        eprintln!();
    }
    let mut g = results.lock().unwrap_or_else(|e| e.into_inner());
    g.1.sort_unstable();
    g.3.sort_unstable();
    let lat = &g.1;
    let errors = errs.load(Ordering::SeqCst);
    let mut out = json!({
        "requests": requests, "ok": lat.len(), "errors": errors, "seconds": elapsed,
        "requests_per_second": requests as f64 / elapsed.max(1e-9),
        "backends": g.0, "error_kinds": g.2,
        "latency_ms": { "p50": pct(lat, 50.0), "p90": pct(lat, 90.0), "p99": pct(lat, 99.0), "p99_9": pct(lat, 99.9), "max": pct(lat, 100.0) },
    });
    if a.wait_close {
        let c = &g.3;
        out["close_after_body_ms"] = json!({ "p50": pct(c, 50.0), "p90": pct(c, 90.0), "p99": pct(c, 99.0), "max": pct(c, 100.0) });
    }
    if a.json {
        println!("{out}");
    } else {
        println!("  {requests} requests in {elapsed:.2} s ({:.0}/s), {errors} errors", requests as f64 / elapsed.max(1e-9));
        println!("  backend            requests  share");
        for (name, n) in &g.0 {
            let share = *n as f64 * 100.0 / requests.max(1) as f64;
            println!("  {name:<18} {n:>8}  {share:5.1}% {}", "#".repeat((share / 2.5).round() as usize));
        }
        for (e, n) in &g.2 {
            println!("  error: {e} x{n}");
        }
        println!("  latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}", pct(lat, 50.0), pct(lat, 90.0), pct(lat, 99.0), pct(lat, 99.9), pct(lat, 100.0));
        println!("result requests={requests} errors={errors} backends={}", g.0.len());
    }
    if errors > 0 {
        return Err(ToolError::Failed(format!("{errors} of {requests} requests failed")));
    }
    Ok(())
}

fn serve_udp(listen: SocketAddr, name: &str, full: bool) -> Result<(), ToolError> {
    let s = UdpSocket::bind(listen).map_err(io(format!("--listen {listen}")))?;
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, from)) = s.recv_from(&mut buf) else { continue };
        let mut out = Vec::with_capacity(n + name.len() + 1);
        out.extend_from_slice(name.as_bytes());
        out.push(b' ');
        out.extend_from_slice(&buf[..if full { n } else { n.min(64) }]);
        let _ = s.send_to(&out, from);
    }
}

fn serve_tcp(listen: SocketAddr, name: &str, idle_timeout_s: u64) -> Result<(), ToolError> {
    let l = TcpListener::bind(listen).map_err(io(format!("--listen {listen}")))?;
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        let name = name.to_string();
        std::thread::spawn(move || {
            c.set_read_timeout((idle_timeout_s > 0).then(|| Duration::from_secs(idle_timeout_s))).ok();
            if c.write_all(format!("{name}\n").as_bytes()).is_err() {
                return;
            }
            let mut buf = [0u8; 16384];
            loop {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if c.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    Ok(())
}

fn serve_http(listen: SocketAddr, name: &str, keep_alive: bool) -> Result<(), ToolError> {
    let l = TcpListener::bind(listen).map_err(io(format!("--listen {listen}")))?;
    let body = Arc::new(format!("{name}\n"));
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        // The client's address as this server sees it (`x-client`), for tests of who connects.
        let peer = c.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        let answer = |keep: bool| {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-client: {peer}\r\ncontent-length: {}\r\nconnection: {}\r\n\r\n{body}",
                body.len(),
                if keep { "keep-alive" } else { "close" }
            )
        };
        let (close, keep) = (answer(false), answer(true));
        std::thread::spawn(move || {
            c.set_read_timeout(Some(Duration::from_secs(10))).ok();
            let _ = c.set_nodelay(true);
            let mut pending: Vec<u8> = Vec::with_capacity(1024);
            let mut buf = [0u8; 4096];
            loop {
                // One request head (GETs: no body), possibly behind others already read.
                let end = loop {
                    if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) if pending.len() + n > 16384 => return,
                        Ok(n) => pending.extend_from_slice(&buf[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                pending.drain(..end);
                let again = keep_alive && head.lines().next().is_some_and(|l| l.trim_end().ends_with("http/1.1")) && !head.contains("\r\nconnection: close");
                if c.write_all(if again { keep.as_bytes() } else { close.as_bytes() }).is_err() || !again {
                    return;
                }
            }
        });
    }
    Ok(())
}

fn set_df(s: &UdpSocket, v6: bool) -> Result<(), ToolError> {
    use std::os::fd::AsRawFd;
    let (level, opt) = if v6 { (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER) } else { (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER) };
    let val: libc::c_int = 2; // IP_PMTUDISC_DO / IPV6_PMTUDISC_DO
                              // SAFETY: valid fd and a c_int option value.
    let r = unsafe { libc::setsockopt(s.as_raw_fd(), level, opt, &val as *const _ as *const libc::c_void, 4) };
    if r != 0 {
        return Err(ToolError::Io { context: "setsockopt(MTU_DISCOVER)".into(), source: std::io::Error::last_os_error() });
    }
    Ok(())
}

fn path_mtu(s: &UdpSocket, v6: bool) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let (level, opt) = if v6 { (libc::IPPROTO_IPV6, libc::IPV6_MTU) } else { (libc::IPPROTO_IP, libc::IP_MTU) };
    let mut val: libc::c_int = 0;
    let mut len: libc::socklen_t = 4;
    // SAFETY: valid fd and out pointers.
    let r = unsafe { libc::getsockopt(s.as_raw_fd(), level, opt, &mut val as *mut _ as *mut libc::c_void, &mut len) };
    (r == 0).then_some(val as u32)
}

fn udp(a: &UdpArgs) -> Result<(), ToolError> {
    let v6 = a.target.is_ipv6();
    let bind: SocketAddr = if v6 { "[::]:0".parse().unwrap() } else { "0.0.0.0:0".parse().unwrap() };
    let mut spread: BTreeMap<String, usize> = BTreeMap::new();
    let (mut sent, mut received, mut switched, mut too_big, mut refused, mut corrupt) = (0usize, 0usize, 0usize, 0usize, 0usize, 0usize);
    let mut mtu = None;
    let mut buf = vec![0u8; 65536];
    for f in 0..a.flows {
        let s = UdpSocket::bind(bind).map_err(io("bind"))?;
        s.connect(a.target).map_err(io("--target"))?;
        s.set_read_timeout(Some(Duration::from_millis(a.timeout_ms))).ok();
        if a.df {
            set_df(&s, v6)?;
        }
        let mut first: Option<String> = None;
        for k in 0..a.per_flow {
            let mut payload = format!("flow {f} seq {k} ").into_bytes();
            if a.verify {
                // Bytes that differ from offset to offset, so a misplaced fragment shows.
                let from = payload.len();
                payload.extend((from..a.size).map(|i| (i * 7 % 251) as u8));
            } else {
                payload.resize(a.size.max(payload.len()), b'x');
            }
            match s.send(&payload) {
                Ok(_) => sent += 1,
                Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                    too_big += 1;
                    mtu = path_mtu(&s, v6);
                    continue;
                }
                Err(e) => return Err(ToolError::Io { context: "send".into(), source: e }),
            }
            let r = s.recv(&mut buf);
            if let Err(e) = &r {
                // An ICMP port unreachable for a connected socket.
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    refused += 1;
                }
            }
            if let Ok(n) = r {
                received += 1;
                let name = String::from_utf8_lossy(&buf[..n]).split(' ').next().unwrap_or("").to_string();
                if a.verify && buf[..n].get(name.len() + 1..) != Some(&payload[..]) {
                    corrupt += 1;
                }
                match &first {
                    None => first = Some(name.clone()),
                    Some(x) if *x != name => switched += 1,
                    _ => {}
                }
                *spread.entry(name).or_default() += 1;
            }
            if a.df {
                std::thread::sleep(Duration::from_millis(50));
                mtu = path_mtu(&s, v6).or(mtu);
            }
        }
    }
    println!(
        "{}",
        json!({ "sent": sent, "received": received, "lost": sent - received - refused, "refused": refused, "flows": a.flows,
                 "flows_switched": switched, "backends": spread, "too_big": too_big, "path_mtu": mtu, "corrupt": corrupt })
    );
    Ok(())
}

fn tcp_one(target: SocketAddr, bytes: usize, timeout: Duration) -> Result<String, ToolError> {
    let mut s = TcpStream::connect_timeout(&target, timeout).map_err(io("connect"))?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_write_timeout(Some(timeout)).ok();
    let payload: Vec<u8> = (0..bytes).map(|i| (i * 7 % 251) as u8).collect();
    let mut r = s.try_clone().map_err(io("clone"))?;
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let res = r.read_to_end(&mut got);
        (res, got)
    });
    s.write_all(&payload).map_err(io("send"))?;
    s.shutdown(std::net::Shutdown::Write).map_err(io("shutdown"))?;
    let (res, got) = reader.join().map_err(|_| ToolError::Failed("reader panicked".into()))?;
    res.map_err(io("read"))?;
    let nl = got.iter().position(|&b| b == b'\n').ok_or_else(|| ToolError::Failed("no greeting".into()))?;
    let name = String::from_utf8_lossy(&got[..nl]).to_string();
    if got[nl + 1..] != payload[..] {
        return Err(ToolError::Failed(format!("echo mismatch: sent {} bytes, got {}", payload.len(), got.len() - nl - 1)));
    }
    Ok(name)
}

fn tcp(a: &TcpArgs) -> Result<(), ToolError> {
    let mut spread: BTreeMap<String, usize> = BTreeMap::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let start = Instant::now();
    for _ in 0..a.connections {
        match tcp_one(a.target, a.bytes, Duration::from_millis(a.timeout_ms)) {
            Ok(n) => *spread.entry(n).or_default() += 1,
            Err(e) => *errors.entry(e.to_string()).or_default() += 1,
        }
    }
    let n_err: usize = errors.values().sum();
    println!("{}", json!({ "connections": a.connections, "errors": n_err, "error_kinds": errors, "backends": spread, "bytes": a.bytes, "seconds": start.elapsed().as_secs_f64() }));
    Ok(())
}

/// A number in 0..n (0 when n is 0).
fn pick(r: &mut Rng, n: usize) -> usize {
    r.below(n as u64) as usize
}

/// A well-formed TCP SYN or UDP datagram from `src` to `vip`, to be mutated.
fn base_frame(r: &mut Rng, dst: [u8; 6], src: IpAddr, vip: IpAddr) -> Vec<u8> {
    let mut f = Vec::with_capacity(128);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&[0x02, 0x66, 0x66, 0x66, 0x66, 0x66]);
    let tcp = pick(r, 2) == 0;
    let mut l4 = vec![0u8; if tcp { 20 } else { 8 }];
    l4[0..2].copy_from_slice(&(1024 + pick(r, 60000) as u16).to_be_bytes());
    l4[2..4].copy_from_slice(&[0, 80]);
    if tcp {
        l4[12] = 0x50;
        l4[13] = [0x02, 0x10, 0x04, 0x01, 0x3f][pick(r, 5)];
    } else {
        let n = l4.len() as u16;
        l4[4..6].copy_from_slice(&n.to_be_bytes());
    }
    l4.extend((0..pick(r, 64)).map(|_| r.next_u64() as u8));
    match (src, vip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
            ip[8] = 64;
            ip[9] = if tcp { 6 } else { 17 };
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = vectorlb_packet::checksum::checksum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&ip);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd]);
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
            ip[6] = if tcp { 6 } else { 17 };
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            f.extend_from_slice(&ip);
        }
        _ => {}
    }
    f.extend_from_slice(&l4);
    f
}

fn mutate(r: &mut Rng, mut f: Vec<u8>) -> Vec<u8> {
    match pick(r, 8) {
        0 => f.truncate(pick(r, f.len() + 1)),
        1 => {
            for _ in 0..1 + pick(r, 6) {
                let i = pick(r, f.len());
                f[i] = r.next_u64() as u8;
            }
        }
        2 if f.len() > 18 => f[14] = r.next_u64() as u8, // version / IHL
        3 if f.len() > 18 => {
            f[16] = r.next_u64() as u8; // IPv4 total length / IPv6 payload length
            f[17] = r.next_u64() as u8;
        }
        4 if f.len() > 22 => {
            f[20] = 0x20 | (r.next_u64() as u8 & 0x1f); // IPv4 fragment flags; IPv6 next header
            f[21] = r.next_u64() as u8;
        }
        5 => f.extend((0..pick(r, 1400)).map(|_| r.next_u64() as u8)),
        6 => {
            // An ARP frame with random fields.
            f.truncate(12);
            f.extend_from_slice(&[0x08, 0x06]);
            f.extend((0..pick(r, 40)).map(|_| r.next_u64() as u8));
        }
        _ => {
            // VLAN tags stacked on top.
            let tag = [0x81, 0x00, 0x00, r.next_u64() as u8];
            for _ in 0..1 + pick(r, 3) {
                f.splice(12..12, tag);
            }
        }
    }
    f
}

fn garbage(a: &GarbageArgs) -> Result<(), ToolError> {
    let dst = vectorlb_config::parse_mac(&a.dst_mac).ok_or_else(|| ToolError::Usage(format!("--dst-mac: '{}' is not a MAC address", a.dst_mac)))?;
    let ifname = std::ffi::CString::new(a.iface.clone()).map_err(|_| ToolError::Usage("--iface: contains a NUL byte".into()))?;
    // SAFETY: plain libc calls with valid arguments; the socket is closed at the end.
    unsafe {
        let idx = libc::if_nametoindex(ifname.as_ptr());
        if idx == 0 {
            return Err(ToolError::Usage(format!("--iface: no interface '{}'", a.iface)));
        }
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        if fd < 0 {
            return Err(ToolError::Io { context: "raw socket (needs root)".into(), source: std::io::Error::last_os_error() });
        }
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = idx as i32;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&dst);
        let mut r = Rng(a.seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut sent = 0;
        for i in 0..a.count {
            let f = if i % 16 == 0 {
                let mut f = dst.to_vec();
                f.extend((0..pick(&mut r, 200)).map(|_| r.next_u64() as u8));
                f
            } else {
                let b = base_frame(&mut r, dst, a.src, a.vip);
                mutate(&mut r, b)
            };
            if f.len() < 14 {
                continue;
            }
            let n = libc::sendto(fd, f.as_ptr() as *const libc::c_void, f.len(), 0, &sll as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32);
            if n > 0 {
                sent += 1;
            }
            if i % 256 == 255 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        libc::close(fd);
        println!("{}", json!({ "garbage_frames_sent": sent }));
    }
    Ok(())
}

/// One round trip on a held connection: a line out, the same line back.
fn echo_line(s: &mut TcpStream, line: &[u8]) -> Result<(), ToolError> {
    s.write_all(line).map_err(io("send"))?;
    let mut got = vec![0u8; line.len()];
    s.read_exact(&mut got).map_err(io("read"))?;
    if got != line {
        return Err(ToolError::Failed("echo mismatch".into()));
    }
    Ok(())
}

/// Connects to `target` and reads the server's greeting (its name, one line).
fn greeted(target: &SocketAddr, timeout: Duration) -> Result<(TcpStream, String), ToolError> {
    let mut s = TcpStream::connect_timeout(target, Duration::from_secs(3)).map_err(io("connect"))?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_nodelay(true).ok();
    let mut name = Vec::new();
    let mut b = [0u8; 1];
    while b[0] != b'\n' {
        s.read_exact(&mut b).map_err(io("greeting"))?;
        if b[0] != b'\n' {
            name.push(b[0]);
        }
    }
    Ok((s, String::from_utf8_lossy(&name).into_owned()))
}

fn hold(a: &HoldArgs) -> Result<(), ToolError> {
    let timeout = Duration::from_secs(10);
    let mut conns = Vec::new();
    let mut backends: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..a.connections {
        let (s, name) = greeted(&a.target[i % a.target.len()], timeout).map_err(|e| ToolError::Failed(format!("connection {i}: {e}")))?;
        *backends.entry(name.clone()).or_default() += 1;
        conns.push((s, name));
    }
    if let Some(f) = &a.ready_file {
        std::fs::write(f, b"ready").map_err(io(format!("{}", f.display())))?;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(a.seconds);
    /// (connection, outcome, longest stall in ms)
    type Outcome = (usize, Result<(), ToolError>, u64);
    let results: Arc<Mutex<Vec<Outcome>>> = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for (i, (mut s, _)) in conns.into_iter().enumerate() {
        let streaming = i < a.streaming;
        let interval = Duration::from_millis(a.interval_ms);
        let results = results.clone();
        threads.push(std::thread::spawn(move || {
            let mut max_gap = 0u64;
            let mut last_ok = Instant::now();
            let mut k = 0u64;
            let r = (|| {
                while Instant::now() < end {
                    if streaming {
                        echo_line(&mut s, format!("conn {i} msg {k}\n").as_bytes())?;
                        max_gap = max_gap.max(last_ok.elapsed().as_millis() as u64);
                        last_ok = Instant::now();
                        k += 1;
                    }
                    std::thread::sleep(interval.min(end.saturating_duration_since(Instant::now())));
                }
                // Every connection, idle or not, must still carry a last round trip.
                echo_line(&mut s, format!("conn {i} last\n").as_bytes())
            })();
            results.lock().unwrap_or_else(|e| e.into_inner()).push((i, r, max_gap));
        }));
    }
    // New connections throughout, each on a thread of its own (a lost SYN waits for its
    // retransmission without holding up the next).
    /// (outcome, milliseconds to complete)
    type NewOutcome = (Result<(), ToolError>, u64);
    let fresh: Arc<Mutex<Vec<NewOutcome>>> = Arc::new(Mutex::new(Vec::new()));
    let mut opener = None;
    if a.new_per_second > 0.0 {
        let (targets, fresh, every) = (a.target.clone(), fresh.clone(), Duration::from_secs_f64(1.0 / a.new_per_second));
        opener = Some(std::thread::spawn(move || {
            let mut attempts = Vec::new();
            let mut n = 0usize;
            while Instant::now() < end {
                let (t, fresh) = (targets[n % targets.len()], fresh.clone());
                attempts.push(std::thread::spawn(move || {
                    let t0 = Instant::now();
                    let r = greeted(&t, Duration::from_secs(3)).and_then(|(mut s, _)| echo_line(&mut s, b"new\n"));
                    fresh.lock().unwrap_or_else(|e| e.into_inner()).push((r, t0.elapsed().as_millis() as u64));
                }));
                n += 1;
                std::thread::sleep(every);
            }
            for t in attempts {
                let _ = t.join();
            }
        }));
    }
    for t in threads.into_iter().chain(opener) {
        let _ = t.join();
    }
    let res = results.lock().unwrap_or_else(|e| e.into_inner());
    let survived = res.iter().filter(|(_, r, _)| r.is_ok()).count();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut broken_by_target: BTreeMap<String, usize> = BTreeMap::new();
    for (i, r, _) in res.iter() {
        if let Err(e) = r {
            *errors.entry(e.to_string()).or_default() += 1;
            *broken_by_target.entry(a.target[i % a.target.len()].to_string()).or_default() += 1;
        }
    }
    let max_stall = res.iter().map(|(_, _, g)| *g).max().unwrap_or(0);
    // Which service stalled: the longest stall per target.
    let mut stall_by_target: BTreeMap<String, u64> = BTreeMap::new();
    for (i, _, g) in res.iter() {
        let m = stall_by_target.entry(a.target[i % a.target.len()].to_string()).or_default();
        *m = (*m).max(*g);
    }
    let fresh = fresh.lock().unwrap_or_else(|e| e.into_inner());
    let mut new_errors: BTreeMap<String, usize> = BTreeMap::new();
    for (r, _) in fresh.iter() {
        if let Err(e) = r {
            *new_errors.entry(e.to_string()).or_default() += 1;
        }
    }
    let new = json!({
        "attempted": fresh.len(),
        "ok": fresh.iter().filter(|(r, _)| r.is_ok()).count(),
        "failed": fresh.iter().filter(|(r, _)| r.is_err()).count(),
        "slower_than_1s": fresh.iter().filter(|(r, ms)| r.is_ok() && *ms > 1000).count(),
        "errors": new_errors,
    });
    println!(
        "{}",
        json!({ "connections": a.connections, "survived": survived, "broken": a.connections - survived, "streaming": a.streaming,
                 "errors": errors, "max_stall_ms": max_stall, "max_stall_ms_by_target": stall_by_target, "broken_by_target": broken_by_target, "backends": backends, "new": new, "seconds": start.elapsed().as_secs_f64() })
    );
    Ok(())
}

fn sync_inject(a: &SyncInjectArgs) -> Result<(), ToolError> {
    use vectorlb_lb::sync::SyncRecord;
    use vectorlb_sync::{encode, Message, Sealer, Secret, KIND_BULK_DONE, KIND_RECORDS};
    let records = (0..a.records.min(16))
        .map(|i| {
            let p = a.first_port.wrapping_add(i);
            (
                0u8,
                SyncRecord {
                    proto: 6,
                    vip: "10.0.0.100".parse().unwrap(),
                    vport: 9000,
                    client: "10.0.0.2".parse().unwrap(),
                    cport: p,
                    backend: "10.1.0.11".parse().unwrap(),
                    bport: 9000,
                    local: Some(("10.1.0.200".parse().unwrap(), p)),
                    state: 3,
                    flags: 0,
                    expire_in: 600_000,
                    adj: Default::default(),
                },
            )
        })
        .collect();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let epoch = now.as_micros() as u64;
    // An outdated message: sealed (by the sender's clock) two minutes ago.
    let time_ms = now.as_millis() as u64 - if a.mode == "outdated" { 120_000 } else { 0 };
    // A BULK_DONE answering a request nobody made (what a replayed one is to its receiver).
    let msg = if a.mode == "bulk-done" {
        Message { kind: KIND_BULK_DONE, epoch, seq: 1, ack: 0, request: 0x5eed, time_ms, records: Vec::new() }
    } else {
        Message { kind: KIND_RECORDS, epoch, seq: 1, ack: 0, request: 0, time_ms, records }
    };
    let key = if a.mode == "bad-mac" { format!("{}-wrong", a.key) } else { a.key.clone() };
    let sealer = Sealer::new(&Secret::new(key.as_bytes())).map_err(|_| ToolError::Usage("no random bytes for a key salt".into()))?;
    let mut bytes = encode(&msg, &sealer);
    let bind: SocketAddr = if a.to.is_ipv6() { "[::]:0".parse().unwrap() } else { "0.0.0.0:0".parse().unwrap() };
    let s = UdpSocket::bind(bind).map_err(io("bind"))?;
    match a.mode.as_str() {
        "good" | "bad-mac" | "outdated" | "bulk-done" => {}
        // Shorter than a header and its tag.
        "truncated" => bytes.truncate(30),
        "replay" | "replay-new-port" => {
            s.send_to(&bytes, a.to).map_err(io("send"))?;
            std::thread::sleep(Duration::from_millis(100));
        }
        m => return Err(ToolError::Usage(format!("--mode: '{m}' is not good, bad-mac, truncated, outdated, bulk-done, replay or replay-new-port"))),
    }
    let again = if a.mode == "replay-new-port" { UdpSocket::bind(bind).map_err(io("bind"))? } else { s };
    again.send_to(&bytes, a.to).map_err(io("send"))?;
    println!("{}", json!({ "sent": a.mode, "bytes": bytes.len() }));
    Ok(())
}
