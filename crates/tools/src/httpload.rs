//! An open-loop HTTP/1.1 load client for latency by request type (`vectorlb-tools http-load`).
//!
//! Requests are due at fixed intervals (`--rate`), whatever the server does: a scheduler
//! thread issues each at its intended time into its type's queue, which `--connections`
//! threads of that type, each with its own keep-alive connection, take from. Each type has
//! its own connections (its own population of users), so a backlog of slow responses of one
//! type cannot hold the requests of another in the client. A request's latency runs from its intended
//! time to the end of its response, so time spent waiting for a free connection (the server
//! being slow) counts, which closed-loop clients hide (coordinated omission). With `--rate 0`
//! every connection sends back to back instead (closed loop: the capacity).
//!
//! Request types are `NAME=PATH:WEIGHT`, drawn at random by weight; latency percentiles are
//! reported per type and overall, from HDR histograms (1 µs to 60 s, 3 significant digits).

use hdrhistogram::Histogram;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct HttpLoadArgs {
    /// The server, ADDRESS:PORT.
    #[arg(long)]
    pub target: SocketAddr,
    /// A request type, NAME=PATH:WEIGHT (repeat for a mix), e.g. small=/o/1k.bin?prio=high:40.
    #[arg(long = "request", required = true)]
    pub requests: Vec<String>,
    /// Requests per second in all, open loop; 0: closed loop (every connection back to back).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Connections per request type.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Seconds at the start whose requests are sent but not counted.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Random seed of the request mix.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RequestType {
    pub name: String,
    pub path: String,
    pub weight: u32,
}

/// Parses NAME=PATH:WEIGHT.
pub fn parse_request(s: &str) -> Result<RequestType, String> {
    let (name, rest) = s.split_once('=').ok_or_else(|| format!("--request '{s}': expected NAME=PATH:WEIGHT"))?;
    let (path, weight) = rest.rsplit_once(':').ok_or_else(|| format!("--request '{s}': expected NAME=PATH:WEIGHT"))?;
    let weight: u32 = weight.parse().map_err(|_| format!("--request '{s}': weight '{weight}' is not a whole number"))?;
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(format!("--request '{s}': name '{name}' is not letters, digits, _ and -"));
    }
    if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("--request '{s}': path '{path}' does not start with / or holds spaces"));
    }
    if weight == 0 {
        return Err(format!("--request '{s}': weight 0"));
    }
    Ok(RequestType { name: name.into(), path: path.into(), weight })
}

/// The next number of a xorshift sequence (the request mix; `state` must not be 0).
pub(crate) fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The type `x` (below the total weight) falls on.
fn pick_by(weights: &[u64], mut x: u64) -> usize {
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return i;
        }
        x -= w;
    }
    weights.len() - 1
}

/// One request due at `due`, of type `kind`.
struct Token {
    kind: usize,
    due: Instant,
}

/// What one connection thread recorded.
struct Tally {
    /// Made when first needed (a connection of the open loop records one type only).
    latency: Vec<Option<Histogram<u64>>>,
    errors: Vec<u64>,
    /// Non-2xx responses by type.
    bad_status: Vec<u64>,
}

/// A latency histogram: 1 µs to 60 s, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

impl Tally {
    fn record(&mut self, kind: usize, us: u64) {
        let _ = self.latency[kind].get_or_insert_with(histogram).record(us.min(60_000_000));
    }

    fn new(n: usize) -> Tally {
        Tally { latency: (0..n).map(|_| None).collect(), errors: vec![0; n], bad_status: vec![0; n] }
    }
}

/// A keep-alive HTTP/1.1 connection.
struct Conn {
    addr: SocketAddr,
    s: Option<TcpStream>,
    buf: Vec<u8>,
    /// The current request's: every connect, read and write waits at most until then.
    deadline: Instant,
}

impl Conn {
    fn stream(&mut self) -> std::io::Result<&mut TcpStream> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request's time is up"));
        }
        if self.s.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, left.min(Duration::from_secs(5)))?;
            s.set_nodelay(true)?;
            self.s = Some(s);
        }
        let s = self.s.as_mut().expect("just set");
        s.set_read_timeout(Some(left))?;
        s.set_write_timeout(Some(left))?;
        Ok(s)
    }

    /// Sends GET `path` and reads the whole response by `deadline`; its status.
    fn get(&mut self, path: &str, deadline: Instant) -> std::io::Result<u16> {
        self.deadline = deadline;
        let r = self.exchange(path);
        if r.is_err() {
            self.s = None;
        }
        r
    }

    fn exchange(&mut self, path: &str) -> std::io::Result<u16> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        let req = format!("GET {path} HTTP/1.1\r\nHost: load\r\n\r\n");
        self.stream()?.write_all(req.as_bytes())?;
        // Headers: read until the blank line (the body's first bytes may come with them).
        self.buf.clear();
        let mut chunk = [0u8; 16384];
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if self.buf.len() > 65536 {
                return Err(bad("response headers above 64 KiB"));
            }
            let n = self.stream()?.read(&mut chunk)?;
            if n == 0 {
                return Err(bad("connection closed in the headers"));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let head = std::str::from_utf8(&self.buf[..end]).map_err(|_| bad("headers are not text"))?;
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad("no status"))?;
        let mut len = None;
        let mut close = false;
        for line in head.split("\r\n").skip(1) {
            if let Some((k, v)) = line.split_once(':') {
                let k = k.trim().to_ascii_lowercase();
                if k == "content-length" {
                    len = v.trim().parse::<u64>().ok();
                } else if k == "connection" && v.trim().eq_ignore_ascii_case("close") {
                    close = true;
                } else if k == "transfer-encoding" {
                    return Err(bad("chunked responses are not supported"));
                }
            }
        }
        let len = len.ok_or_else(|| bad("no content-length"))?;
        let mut left = len.saturating_sub((self.buf.len() - end) as u64);
        while left > 0 {
            let want = chunk.len().min(left as usize);
            let n = self.stream()?.read(&mut chunk[..want])?;
            if n == 0 {
                return Err(bad("connection closed in the body"));
            }
            left -= n as u64;
        }
        if close {
            self.s = None;
        }
        Ok(status)
    }
}

/// Runs the load; one JSON object.
pub fn run(a: &HttpLoadArgs) -> Result<serde_json::Value, String> {
    let types: Vec<RequestType> = a.requests.iter().map(|r| parse_request(r)).collect::<Result<_, _>>()?;
    if !(a.rate.is_finite() && a.rate >= 0.0 && a.rate <= 10_000_000.0) {
        return Err(format!("--rate {}: not in 0..=10000000", a.rate));
    }
    if !(a.seconds.is_finite() && a.seconds > 0.0 && a.seconds <= 3600.0 && a.warmup.is_finite() && a.warmup >= 0.0 && a.warmup < a.seconds) {
        return Err("--seconds must be in (0, 3600] and --warmup in [0, seconds)".into());
    }
    if !(1..=4096).contains(&a.connections) || a.connections * types.len() > 16384 {
        return Err(format!("--connections {}: not in 1..=4096 (and at most 16384 in all)", a.connections));
    }
    let n = types.len();
    let total_weight: u64 = types.iter().map(|t| t.weight as u64).sum();
    let start = Instant::now() + Duration::from_millis(200);
    let end = start + Duration::from_secs_f64(a.seconds);
    let counted_from = start + Duration::from_secs_f64(a.warmup);
    // After the schedule ends, requests still queued or in flight get this long.
    let grace = Duration::from_secs(10);
    let open = a.rate > 0.0;
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel::<Token>()).unzip();
    let rxs: Vec<_> = rxs.into_iter().map(|rx| Arc::new(Mutex::new(rx))).collect();
    let weights: Arc<[u64]> = types.iter().map(|t| t.weight as u64).collect();
    let paths: Arc<[String]> = types.iter().map(|t| t.path.clone()).collect();
    let mut seq = a.seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1;
    let mut threads = Vec::new();
    for c in 0..a.connections * n {
        // Connection c serves type c % n (open loop); closed loop draws types by weight.
        let rx = rxs[c % n].clone();
        let (paths, weights) = (paths.clone(), weights.clone());
        let addr = a.target;
        // Closed loop: each connection draws its own sequence of types.
        let mut own = (a.seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
        threads.push(std::thread::spawn(move || {
            let mut t = Tally::new(n);
            let mut conn = Conn { addr, s: None, buf: Vec::new(), deadline: end };
            loop {
                let (kind, due) = if open {
                    let tok = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                        Ok(tok) => tok,
                        Err(_) => break,
                    };
                    if Instant::now() > end + grace {
                        t.errors[tok.kind] += 1;
                        continue;
                    }
                    (tok.kind, tok.due)
                } else {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    if now < start {
                        std::thread::sleep(start - now);
                        continue;
                    }
                    (pick_by(&weights, xorshift(&mut own) % total_weight), Instant::now())
                };
                // A request may take 30 s, and none goes on past the grace after the end.
                let r = conn.get(&paths[kind], (Instant::now() + Duration::from_secs(30)).min(end + grace));
                let done = Instant::now();
                if r.is_err() && !open {
                    // Closed loop against a server that refuses: do not spin.
                    std::thread::sleep(Duration::from_millis(10));
                }
                if due < counted_from {
                    continue;
                }
                match r {
                    Ok(s) if (200..300).contains(&s) => {
                        let us = done.saturating_duration_since(due).as_micros().max(1) as u64;
                        t.record(kind, us);
                    }
                    Ok(_) => t.bad_status[kind] += 1,
                    Err(_) => t.errors[kind] += 1,
                }
            }
            t
        }));
    }
    // The schedule (open loop).
    let mut scheduled = 0u64;
    if open {
        let interval = 1.0 / a.rate;
        loop {
            let due = start + Duration::from_secs_f64(scheduled as f64 * interval);
            if due >= end {
                break;
            }
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let kind = pick_by(&weights, xorshift(&mut seq) % total_weight);
            if txs[kind].send(Token { kind, due }).is_err() {
                break;
            }
            scheduled += 1;
        }
    } else {
        // Closed loop: the connections stop themselves at the end.
        let now = Instant::now();
        if end > now {
            std::thread::sleep(end - now);
        }
    }
    drop(txs);
    let mut all: Vec<Histogram<u64>> = (0..n).map(|_| histogram()).collect();
    let mut errors_by = vec![0u64; n];
    let mut bad_by = vec![0u64; n];
    for t in threads {
        let t = t.join().map_err(|_| "a connection thread panicked".to_string())?;
        for k in 0..n {
            if let Some(h) = &t.latency[k] {
                all[k].add(h).map_err(|e| e.to_string())?;
            }
            errors_by[k] += t.errors[k];
            bad_by[k] += t.bad_status[k];
        }
    }
    let measured = a.seconds - a.warmup;
    let mut total = histogram();
    let mut per = serde_json::Map::new();
    for (k, ty) in types.iter().enumerate() {
        let h = &all[k];
        total.add(h).map_err(|e| e.to_string())?;
        per.insert(ty.name.clone(), summary(h, measured, errors_by[k], bad_by[k]));
    }
    let ok = total.len();
    let errors: u64 = errors_by.iter().sum();
    let bad: u64 = bad_by.iter().sum();
    Ok(serde_json::json!({
        "bench": "http_load",
        "mode": if open { "open" } else { "closed" },
        "rate": a.rate,
        "achieved_rps": (ok as f64 / measured * 10.0).round() / 10.0,
        "seconds": a.seconds,
        "warmup": a.warmup,
        "connections_per_type": a.connections,
        "scheduled": scheduled,
        "errors": errors,
        "non_2xx": bad,
        "total": summary(&total, measured, errors, bad),
        "types": per,
    }))
}

fn summary(h: &Histogram<u64>, seconds: f64, errors: u64, bad: u64) -> serde_json::Value {
    let q = |p: f64| if h.is_empty() { serde_json::Value::Null } else { serde_json::json!(h.value_at_quantile(p)) };
    serde_json::json!({
        "requests": h.len(),
        "rps": (h.len() as f64 / seconds * 10.0).round() / 10.0,
        "errors": errors,
        "non_2xx": bad,
        "p50_us": q(0.5),
        "p99_us": q(0.99),
        "p999_us": q(0.999),
        "max_us": if h.is_empty() { serde_json::Value::Null } else { serde_json::json!(h.max()) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A keep-alive HTTP/1.1 server answering every request with `body`; its address.
    fn server(body: &'static [u8]) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..i + 4);
                            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                            if s.write_all(head.as_bytes()).and_then(|_| s.write_all(body)).is_err() {
                                return;
                            }
                        }
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        addr
    }

    fn args(target: SocketAddr, rate: f64) -> HttpLoadArgs {
        HttpLoadArgs { target, requests: vec!["a=/a:3".into(), "b=/b:1".into()], rate, seconds: 1.5, connections: 4, warmup: 0.5, seed: 7, json: true }
    }

    #[test]
    fn open_loop_sends_at_the_rate_and_counts_by_type() {
        let r = run(&args(server(b"hello"), 400.0)).unwrap();
        assert_eq!(r["mode"], "open");
        assert_eq!(r["scheduled"], 600, "1.5 s at 400/s");
        assert_eq!(r["errors"], 0);
        // The counted second holds 400 requests, split about 3:1.
        let (a, b) = (r["types"]["a"]["requests"].as_u64().unwrap(), r["types"]["b"]["requests"].as_u64().unwrap());
        assert!((395..=405).contains(&(a + b)), "{a} + {b}");
        assert!(a > 2 * b && b > 50, "{a} : {b}");
        assert!(r["total"]["p99_us"].as_u64().unwrap() >= 1);
    }

    #[test]
    fn closed_loop_runs_for_its_seconds_and_a_dead_server_counts_errors() {
        let r = run(&args(server(b"x"), 0.0)).unwrap();
        assert_eq!(r["mode"], "closed");
        assert!(r["total"]["requests"].as_u64().unwrap() > 100, "{r}");
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let r = run(&args(dead, 100.0)).unwrap();
        assert_eq!(r["total"]["requests"], 0);
        assert!(r["errors"].as_u64().unwrap() >= 90, "{r}");
    }

    #[test]
    fn request_types_parse_or_say_why() {
        assert_eq!(parse_request("small=/o/1k.bin?prio=high:40").unwrap(), RequestType { name: "small".into(), path: "/o/1k.bin?prio=high".into(), weight: 40 });
        for bad in ["small", "small=/o:x", "=/o:1", "s=o:1", "s=/o:0", "s=/a b:1", "s t=/o:1"] {
            assert!(parse_request(bad).is_err(), "{bad}");
        }
    }
}
