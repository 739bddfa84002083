//! `vectorlb proxy` attacked again (round two): each test here is an attack that succeeded
//! against the proxy before the fix it names, run against the real binary on loopback, bounded
//! in count and time. `make attack-proxy` runs it with `attack_proxy.rs`; `VECTORLB_BIN` points
//! it at another build (the previous commit's, to see the attacks succeed).
//!
//! * host names: a trailing dot (Host, `:authority`, SNI) and `Connection: host` cannot reach
//!   what a host route keeps out, and the upstream sees the canonical host;
//! * 480 slow body senders and 480 slow readers under a 1,024-descriptor limit: curl (plain and
//!   TLS) keeps being served;
//! * request bodies sent a byte per TCP segment by 1,000 clients, and 200 buffered HTTP/2
//!   streams of one connection, stay within the memory budgets;
//! * 100 downloads of 10 MiB under a flood of half-sent heads at the connection limit all
//!   complete, and keep-alive clients keep being served;
//! * zero-window streams of 3 HTTP/2 connections leave the endpoint to the others; streams over
//!   the reset budget never go upstream; 10 reloads leave one cap per endpoint;
//! * an upstream's 101 never reaches a client; a listener as its own endpoint, a reset budget
//!   that cannot fire and limits past the descriptors are refused.

// This crate's link flags route BoringSSL's X25519 through the proxy's wrappers (build.rs):
// the TLS client here links BoringSSL, so the wrappers must be linked too.
extern crate vectorlb_proxy;

mod common;

use bytes::Bytes;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn rt(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().unwrap()
}

fn sighup(p: &Proc) {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(p.child.id() as i32, libc::SIGHUP) };
}

/// Waits until the proxy's stats say `reloads` (ok) reloads, or 10 s.
fn wait_reloads(admin: &Path, reloads: u64) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let s = stats(admin);
        if s["reloads"].as_u64() == Some(reloads) || t.elapsed() > Duration::from_secs(10) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The quantile `q` of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
}

// ---- 1. host names in one form ------------------------------------------------------------

/// The CN of the certificate the proxy presents for SNI `name`, and the status of a request for
/// `host` on that connection.
fn tls_exchange(port: u16, sni: &str, host: &str) -> (String, u16) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut b = boring::ssl::SslConnector::builder(boring::ssl::SslMethod::tls()).unwrap();
        b.set_verify(boring::ssl::SslVerifyMode::NONE);
        let mut cfg = b.build().configure().unwrap();
        cfg.set_verify_hostname(false);
        let mut s = tokio_boring::connect(cfg, sni, tcp).await.unwrap();
        let cert = s.ssl().peer_certificate().unwrap();
        let cn = cert.subject_name().entries_by_nid(boring::nid::Nid::COMMONNAME).next().map(|e| e.data().as_utf8().unwrap().to_string()).unwrap_or_default();
        s.write_all(format!("GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        (cn, text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0))
    })
}

#[test]
fn a_trailing_dot_or_connection_host_cannot_get_past_a_host_route() {
    let _one = one();
    let dir = tmp("hosts");
    let up = upstream();
    let (port, tls_port) = (free_port(), free_port());
    let (dc, dk) = self_signed(&dir);
    let (ic, ik) = self_signed_for(&dir, "internal.example");
    let mut p = Proc::proxy(
        &dir,
        &format!(
            "[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n\
             [[listeners]]\nname = \"tls\"\naddress = \"127.0.0.1:{tls_port}\"\n\
             tls = {{ certificates = [{{ cert = \"{}\", key = \"{}\" }}, {{ cert = \"{}\", key = \"{}\" }}] }}\n\
             [[routes]]\nhost = \"internal.example\"\nrespond = {{ status = 403, body = \"internal\" }}\n\
             [[routes]]\ncluster = \"public\"\n\
             [[clusters]]\nname = \"public\"\nendpoints = [\"127.0.0.1:{}\"]\n",
            dc.display(),
            dk.display(),
            ic.display(),
            ik.display(),
            up.port
        ),
        None,
    );
    wait_tcp(port);
    wait_tcp(tls_port);
    let req = |head: &str| raw(port, format!("GET /x HTTP/1.1\r\n{head}\r\nConnection: close\r\n\r\n").as_bytes());
    // The protected host however it is spelt.
    for head in ["Host: internal.example.", "Host: INTERNAL.Example.", &format!("Host: internal.example.:{port}")] {
        let (code, text) = req(head);
        println!("{head}: {code}");
        assert_eq!(code, 403, "{head} got past the route for internal.example: {text}");
    }
    let (code, text) = raw(port, b"GET http://internal.example./x HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n");
    assert_eq!(code, 403, "an absolute-form target with a trailing dot: {text}");
    let st = h2_status(port, &format!("http://internal.example.:{port}/x"));
    println!("h2c :authority internal.example.: {st:?}");
    assert_eq!(st, Some(403), "h2c :authority with a trailing dot");
    // SNI with a trailing dot chooses the certificate of the name without it.
    let (cn, code) = tls_exchange(tls_port, "internal.example.", "internal.example.");
    println!("TLS SNI internal.example.: certificate {cn}, status {code}");
    assert_eq!((cn.as_str(), code), ("internal.example", 403));
    // Disguised names are not names.
    let (code, _) = req("Host: internal%2eexample");
    assert_eq!(code, 400, "a percent-encoded host name");
    // The upstream sees the canonical host, and Connection cannot take it away.
    let (code, text) = req("Host: Public.Example.");
    assert!(code == 200 && text.ends_with("host=public.example body=0"), "{text}");
    let (code, text) = req("Host: public.example\r\nConnection: host, keep-alive");
    println!("Connection: host -> {}", text.lines().last().unwrap_or(""));
    assert!(code == 200 && text.ends_with("host=public.example body=0"), "Connection: host stripped the routing host: {text}");
    p.assert_alive("host names");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 2. 480 slow body senders and 480 slow readers ------------------------------------------

/// Keeps `n` slow clients of one kind on `port` until `until`, reconnecting half a second after
/// the proxy closes one: "body" POSTs a body of 1 MB (streamed upstream) a byte every 2 s,
/// "reader" GETs 1 MiB with a 4 KiB receive buffer and reads a byte every 2 s.
async fn slow_peers(kind: &'static str, port: u16, n: usize, until: Instant, opened: Arc<AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tasks = Vec::new();
    for i in 0..n {
        let opened = opened.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis((i * 2000 / n) as u64)).await;
            while Instant::now() < until {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                if kind == "reader" {
                    let _ = sock.set_recv_buffer_size(4096);
                }
                let Ok(mut s) = sock.connect(([127, 0, 0, 1], port).into()).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                let head = if kind == "body" { "POST /post HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n" } else { "GET /big HTTP/1.1\r\nHost: a\r\n\r\n" };
                if s.write_all(head.as_bytes()).await.is_ok() {
                    let mut b = [0u8; 1];
                    while Instant::now() < until {
                        let ok = if kind == "body" { s.write_all(b"z").await.is_ok() } else { matches!(s.read(&mut b).await, Ok(1)) };
                        if !ok {
                            break;
                        }
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

#[test]
fn slow_bodies_and_slow_readers_past_a_1024_descriptor_limit_do_not_keep_curl_out() {
    let _one = one();
    raise_own_nofile();
    let dir = tmp("slowio");
    let up = upstream();
    let (cert, key) = self_signed(&dir);
    let (port, tls_port) = (free_port(), free_port());
    let admin = dir.join("admin.sock");
    // The deadlines as shipped (60 s): only making room can serve curl here.
    let mut p = Proc::proxy(
        &dir,
        &format!(
            "workers = 2\n[admin]\naddress = \"unix:{}\"\n\
             [[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n\
             [[listeners]]\nname = \"tls\"\naddress = \"127.0.0.1:{tls_port}\"\ntls = {{ certificates = [{{ cert = \"{}\", key = \"{}\" }}] }}\n\
             [[routes]]\npath_exact = \"/\"\nrespond = {{ status = 200, body = \"ok\" }}\n\
             [[routes]]\ncluster = \"up\"\n\
             [[clusters]]\nname = \"up\"\nendpoints = [\"127.0.0.1:{}\"]\n",
            admin.display(),
            cert.display(),
            key.display(),
            up.port
        ),
        Some(1024),
    );
    wait_tcp(port);
    wait_unix(&admin);
    let seconds = 30;
    let until = Instant::now() + Duration::from_secs(seconds);
    let opened = Arc::new(AtomicU64::new(0));
    let attack = {
        let opened = opened.clone();
        std::thread::spawn(move || {
            rt(1).block_on(async move {
                tokio::join!(slow_peers("body", port, 480, until, opened.clone()), slow_peers("reader", port, 480, until, opened.clone()));
            })
        })
    };
    std::thread::sleep(Duration::from_secs(6));
    let during = stats(&admin);
    println!("during: {} client connections of {}; upstream connections open {}", during["client_connections"], during["max_client_connections"], up.counts.open());
    let (mut times, mut failures, mut n) = (Vec::new(), Vec::new(), 0);
    while Instant::now() + Duration::from_secs(2) < until {
        let t = Instant::now();
        let r = match n % 3 {
            0 => curl(&["--max-time", "3"], &format!("http://127.0.0.1:{port}/")),
            1 => curl(&["--max-time", "3"], &format!("http://127.0.0.1:{port}/small")),
            _ => curl(&["--max-time", "3", "-k"], &format!("https://127.0.0.1:{tls_port}/")),
        };
        match r {
            Ok((200, b)) if b == "ok" || b.starts_with("host=") => times.push(t.elapsed().as_secs_f64() * 1e3),
            r => failures.push(format!("{r:?}")),
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = up.counts.max_open.load(Ordering::SeqCst);
    attack.join().unwrap();
    p.assert_alive("slow bodies and readers");
    times.sort_by(|a, b| a.total_cmp(b));
    let s = stats(&admin);
    let l = &s["listeners"][0];
    println!(
        "slow bodies and readers: {} connections opened by 960 attackers in {seconds} s; curl {} ok of {n} ({:.1} %), p50 {:.1} ms, p99 {:.1} ms; \
         at most {held} upstream connections; evicted {}, refused {}, send_timeouts {}, body_timeouts {}; RSS {} kB",
        opened.load(Ordering::Relaxed),
        times.len(),
        100.0 * times.len() as f64 / n.max(1) as f64,
        quantile(&times, 0.5),
        quantile(&times, 0.99),
        l["evicted"],
        l["refused"],
        l["send_timeouts"],
        l["body_timeouts"],
        p.rss_kb()
    );
    assert!(failures.is_empty(), "curl failed {} of {n} times: {:?}", failures.len(), &failures[..failures.len().min(5)]);
    assert!(opened.load(Ordering::Relaxed) >= 960, "the attack did not run");
    assert!(held <= 512, "{held} upstream connections (the endpoint's cap is 512)");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 3. memory: bodies a byte per segment, HTTP/2 streams buffered --------------------------

#[test]
fn bodies_sent_a_byte_per_segment_cost_their_bytes_within_the_budgets() {
    let _one = one();
    raise_own_nofile();
    // buffer_memory as shipped.
    let budget = 256 << 20;
    let Setup { dir, up, port, admin, mut p } = proxy_to_upstream("segments", "", "", "max_connections = 1100\nqueue_timeout = 10");
    let len = 64512;
    let (clients, drip) = (1000, 256);
    let rt = rt(2);
    // Warm up (the runtime's and allocator's first pages), then the baseline.
    for _ in 0..20 {
        let _ = curl(&["-d", "x"], &format!("http://127.0.0.1:{port}/warm"));
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = p.rss_kb();
    let (go_on, _) = tokio::sync::watch::channel(false);
    let dripped = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let mut go = go_on.subscribe();
            let dripped = dripped.clone();
            rt.spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                tokio::time::sleep(Duration::from_millis((i % 100) as u64 * 10)).await;
                let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
                s.set_nodelay(true).ok()?;
                s.write_all(format!("POST /post HTTP/1.1\r\nHost: a\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n").as_bytes()).await.ok()?;
                // A byte per segment, each after the last one was surely read.
                for _ in 0..drip {
                    s.write_all(b"z").await.ok()?;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                dripped.fetch_add(1, Ordering::SeqCst);
                let _ = go.wait_for(|g| *g).await;
                s.write_all(&vec![b'z'; len - drip]).await.ok()?;
                let mut out = Vec::new();
                tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await.ok()?.ok()?;
                Some(String::from_utf8_lossy(&out).to_string())
            })
        })
        .collect();
    // And 4 clients that send 16 KiB of their bodies a byte per segment as fast as they can
    // (the proxy then reads each segment alone).
    let (fast, fast_drip) = (4, 16384);
    let go_fast = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fast_clients: Vec<_> = (0..fast)
        .map(|_| {
            let (dripped, go) = (dripped.clone(), go_fast.clone());
            std::thread::spawn(move || -> Option<String> {
                let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
                s.set_nodelay(true).ok()?;
                s.write_all(format!("POST /post HTTP/1.1\r\nHost: a\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
                for _ in 0..fast_drip {
                    s.write_all(b"z").ok()?;
                    std::thread::sleep(Duration::from_micros(50));
                }
                dripped.fetch_add(1, Ordering::SeqCst);
                while !go.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                s.write_all(&vec![b'z'; len - fast_drip]).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
                let mut out = Vec::new();
                s.read_to_end(&mut out).ok()?;
                Some(String::from_utf8_lossy(&out).to_string())
            })
        })
        .collect();
    let t = Instant::now();
    while dripped.load(Ordering::SeqCst) < clients + fast && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let during = p.rss_kb();
    let s = stats(&admin);
    let buffered = s["buffered_bytes"].as_u64();
    println!(
        "{clients} clients with {drip} one-byte segments of a {len}-byte body each and {fast} with {fast_drip}: RSS {before} -> {during} kB (+{} MiB; buffer_memory {} MiB), buffered {buffered:?} bytes",
        (during.saturating_sub(before)) >> 10,
        budget >> 20
    );
    assert_eq!(dripped.load(Ordering::SeqCst), clients + fast, "the attack did not run");
    // What the bodies hold, and per connection what it takes to serve one (hyper's read and
    // write buffers, the task, the allocator's pages): 48 KiB (about 32 measured).
    let bound = buffered.unwrap_or(0) / 1024 + (clients + fast) as u64 * 48;
    assert!(during.saturating_sub(before) <= bound, "RSS grew by {} kB (bound {bound} kB)", during - before);
    assert!(buffered.is_some_and(|b| b <= budget), "buffered {buffered:?} bytes, over buffer_memory {budget}");
    // Every body then completes whole, buffered or (over the budget) streamed.
    go_on.send_replace(true);
    go_fast.store(true, Ordering::SeqCst);
    let mut answers: Vec<Option<String>> = rt.block_on(futures_join(tasks));
    answers.extend(fast_clients.into_iter().map(|t| t.join().unwrap()));
    let whole = answers.iter().filter(|a| a.as_deref().is_some_and(|t| t.starts_with("HTTP/1.1 200") && t.ends_with(&format!("body={len}")))).count();
    println!("then {whole} of {} bodies reached the upstream whole; buffered now {}", clients + fast, stats(&admin)["buffered_bytes"]);
    assert_eq!(whole, clients + fast, "{:?}", answers.iter().find(|a| !a.as_deref().is_some_and(|t| t.starts_with("HTTP/1.1 200"))));
    // One HTTP/2 connection with 200 bodies of 64 KiB, 16 KiB of each sent: at most
    // connection_buffer (1 MiB) of them buffered, the others streamed.
    let before_requests = up.counts.requests.load(Ordering::SeqCst);
    let (buffered, streamed, codes) = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        let mut sends = Vec::new();
        let mut client = client;
        for _ in 0..200 {
            client = client.ready().await.unwrap();
            let req = http::Request::post(format!("http://a:{port}/post")).header("content-length", "65536").body(()).unwrap();
            let (resp, mut body) = client.send_request(req, false).unwrap();
            body.reserve_capacity(16384);
            let _ = body.send_data(Bytes::from(vec![b'z'; 16384]), false);
            sends.push((resp, body));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = stats(&admin);
        let streamed = up.counts.requests.load(Ordering::SeqCst) - before_requests;
        let mut codes = Vec::new();
        for (resp, mut body) in sends {
            let _ = body.send_data(Bytes::from(vec![b'z'; 65536 - 16384]), true);
            codes.push(tokio::time::timeout(Duration::from_secs(20), resp).await.ok().and_then(|r| r.ok()).map(|r| r.status().as_u16()));
        }
        (s["buffered_bytes"].as_u64(), streamed, codes)
    });
    let ok = codes.iter().filter(|c| **c == Some(200)).count();
    println!(
        "one HTTP/2 connection, 200 bodies of 64 KiB with 16 KiB sent: buffered {buffered:?} bytes, {streamed} streamed upstream before they were whole; then {ok} answered 200"
    );
    assert!(buffered.is_some_and(|b| b <= 1 << 20), "one connection buffered {buffered:?} bytes (connection_buffer 1 MiB)");
    assert!(streamed > 0, "nothing was streamed: every body was buffered");
    assert_eq!(ok, 200, "{codes:?}");
    p.assert_alive("one-byte segments");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 4. downloads and keep-alive clients under a connection flood at the limit -------------

#[test]
fn downloads_and_keep_alive_clients_survive_a_flood_of_half_sent_heads_at_the_limit() {
    let _one = one();
    raise_own_nofile();
    let Setup { dir, up: _up, port, admin, mut p } = proxy_to_upstream("flood", "max_connections = 32", "", "");
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rt = rt(1);
    // The flood: 48 clients that send half a head and wait to be closed, again and again.
    let flooded = Arc::new(AtomicU64::new(0));
    let flood: Vec<_> = (0..48)
        .map(|_| {
            let (done, flooded) = (done.clone(), flooded.clone());
            rt.spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                while !done.load(Ordering::Relaxed) {
                    if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                        flooded.fetch_add(1, Ordering::Relaxed);
                        if s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nX-Half: ").await.is_ok() {
                            let mut b = [0u8; 64];
                            let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut b)).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    // 20 keep-alive clients, a request every 2 s each, on one connection while it lasts.
    let keepalive: Vec<_> = (0..20)
        .map(|i| {
            let done = done.clone();
            rt.spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let (mut ok, mut failed, mut reconnects) = (0u32, 0u32, 0u32);
                tokio::time::sleep(Duration::from_millis(i * 100)).await;
                let mut conn: Option<tokio::net::TcpStream> = None;
                while !done.load(Ordering::Relaxed) {
                    if conn.is_none() {
                        conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok();
                        reconnects += 1;
                    }
                    let good = match conn.as_mut() {
                        None => false,
                        Some(s) => {
                            let exchange = async {
                                s.write_all(b"GET /small HTTP/1.1\r\nHost: a\r\n\r\n").await.ok()?;
                                let mut buf = Vec::new();
                                let mut b = [0u8; 1024];
                                loop {
                                    let n = s.read(&mut b).await.ok()?;
                                    if n == 0 {
                                        return None;
                                    }
                                    buf.extend_from_slice(&b[..n]);
                                    let text = String::from_utf8_lossy(&buf);
                                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                                        let len: usize =
                                            head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.trim().parse().unwrap_or(0)))?;
                                        if body.len() >= len {
                                            return Some(head.starts_with("HTTP/1.1 200"));
                                        }
                                    }
                                }
                            };
                            tokio::time::timeout(Duration::from_secs(3), exchange).await.ok().flatten() == Some(true)
                        }
                    };
                    if good {
                        ok += 1;
                    } else {
                        failed += 1;
                        conn = None;
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                (ok, failed, reconnects)
            })
        })
        .collect();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    // 100 downloads of 10 MiB: 4 curls at a time, 40 MB/s each.
    let want = huge();
    let incomplete = Arc::new(Mutex::new(Vec::new()));
    let dl: Vec<_> = (0..4)
        .map(|k| {
            let (dir, want, incomplete) = (dir.clone(), want.clone(), incomplete.clone());
            std::thread::spawn(move || {
                for j in 0..25 {
                    let out = dir.join(format!("dl-{k}-{j}"));
                    let o = Command::new("curl")
                        .args(["-sS", "--max-time", "20", "--limit-rate", "40M", "-o"])
                        .arg(&out)
                        .arg(format!("http://127.0.0.1:{port}/huge"))
                        .output()
                        .unwrap();
                    let got = std::fs::read(&out).unwrap_or_default();
                    if !o.status.success() || got != want[..] {
                        incomplete.lock().unwrap().push(format!("{} of {} bytes, curl: {}", got.len(), want.len(), String::from_utf8_lossy(&o.stderr).trim()));
                    }
                    let _ = std::fs::remove_file(&out);
                }
            })
        })
        .collect();
    for d in dl {
        d.join().unwrap();
    }
    // At least 14 s of keep-alive requests (7 of each client).
    std::thread::sleep(Duration::from_secs(14).saturating_sub(started.elapsed()).max(Duration::from_secs(1)));
    done.store(true, Ordering::Relaxed);
    let ka: Vec<(u32, u32, u32)> = rt.block_on(futures_join(keepalive));
    rt.block_on(futures_join(flood));
    p.assert_alive("the flood");
    let (ok, failed): (u32, u32) = ka.iter().fold((0, 0), |(a, b), (o, f, _)| (a + o, b + f));
    let rate = 100.0 * ok as f64 / (ok + failed).max(1) as f64;
    let s = stats(&admin);
    let incomplete = incomplete.lock().unwrap();
    println!(
        "flood of half-sent heads at max_connections = 32: {} flood connections; downloads of 10 MiB: {} of 100 whole; keep-alive requests {ok} ok, {failed} failed ({rate:.1} %), reconnects {}; evicted {}, refused {}",
        flooded.load(Ordering::Relaxed),
        100 - incomplete.len(),
        ka.iter().map(|k| k.2).sum::<u32>(),
        s["listeners"][0]["evicted"],
        s["listeners"][0]["refused"]
    );
    assert!(incomplete.is_empty(), "{} downloads incomplete: {:?}", incomplete.len(), &incomplete[..incomplete.len().min(3)]);
    assert!(rate >= 99.0 && ok >= 100, "keep-alive clients served {rate:.1} % ({ok} ok)");
    assert!(flooded.load(Ordering::Relaxed) >= 1000, "the flood did not run");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 5. an endpoint's connections: zero windows, resets, reloads ----------------------------

#[test]
fn zero_window_streams_of_three_connections_leave_the_endpoint_to_the_others() {
    let _one = one();
    raise_own_nofile();
    let Setup { dir, up, port, admin, mut p } = proxy_to_upstream("share", "", "", "");
    let rt = rt(2);
    let held = rt.block_on(zero_window_clients(port, 3, 200));
    std::thread::sleep(Duration::from_secs(2));
    let pinned = up.counts.open();
    // 200 other clients, 10 at a time.
    let codes: Vec<u16> = rt.block_on(async {
        let mut out = Vec::new();
        for _ in 0..20 {
            let batch: Vec<_> = (0..10).map(|_| tokio::task::spawn_blocking(move || raw(port, b"GET /small HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").0)).collect();
            out.extend(futures_join(batch).await);
        }
        out
    });
    let served = codes.iter().filter(|c| **c == 200).count();
    let s = stats(&admin);
    println!(
        "3 connections x 200 zero-window streams pinned {pinned} upstream connections (cap 512); then {served} of 200 other clients served; share_timeouts {}",
        s["clusters"][0]["endpoints"][0]["share_timeouts"]
    );
    for h in held {
        h.abort();
    }
    assert!(served >= 190, "{served} of 200 served while 3 connections held zero-window streams: {:?}", &codes[..10]);
    p.assert_alive("zero-window streams");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn streams_over_the_reset_budget_never_go_upstream() {
    let _one = one();
    let Setup { dir, up, port, mut p, .. } = proxy_to_upstream("rapid", "", "reset_budget = 100", "");
    // A hostile client: it ignores GOAWAY and PING, and resets each stream 20 ms after it sent
    // it (its request upstream by then), 100 at a time, a new one every 0.5 ms, for 3 s.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut reader = s.try_clone().unwrap();
    // What the server says: its GOAWAY's error code, if any.
    let drain = std::thread::spawn(move || {
        let mut head = [0u8; 9];
        let mut goaway = None;
        while reader.read_exact(&mut head).is_ok() {
            let mut payload = vec![0u8; (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize];
            if reader.read_exact(&mut payload).is_err() {
                break;
            }
            if head[3] == 7 && payload.len() >= 8 {
                goaway = Some(u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]));
            }
        }
        goaway
    });
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    s.write_all(&out).unwrap();
    let t = Instant::now();
    let (mut id, mut sent) = (1u32, 0);
    let mut open: std::collections::VecDeque<(u32, Instant)> = Default::default();
    while t.elapsed() < Duration::from_secs(3) {
        let mut frames = Vec::new();
        while open.front().is_some_and(|(_, at)| at.elapsed() >= Duration::from_millis(100)) || open.len() >= 100 {
            let (old, _) = open.pop_front().unwrap();
            frames.extend(h2_reset_frame(old));
        }
        frames.extend(h2_headers_frame(id, "a", "/sleep/200"));
        open.push_back((id, Instant::now()));
        if s.write_all(&frames).is_err() {
            break;
        }
        sent += 1;
        id += 2;
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = t.elapsed();
    let _ = s.shutdown(std::net::Shutdown::Both);
    let goaway = drain.join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let reached = up.counts.requests.load(Ordering::SeqCst);
    println!("delayed rapid reset ignoring GOAWAY: {sent} streams sent in {:.1} s, {reached} reached the upstream (budget 100); GOAWAY error code {goaway:?}", took.as_secs_f64());
    // The budget, and the streams in flight when it was exceeded (100 here).
    assert!(reached <= 100 + 100 + 20, "{reached} requests reached the upstream with a reset budget of 100");
    p.assert_alive("delayed rapid reset");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ten_reloads_leave_one_cap_per_endpoint() {
    let _one = one();
    let dir = tmp("reloadcap");
    let up = upstream();
    let port = free_port();
    let admin = dir.join("admin.sock");
    let config = |queue: u32| {
        format!(
            "workers = 2\n[admin]\naddress = \"unix:{}\"\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n\
             [[routes]]\ncluster = \"up\"\n[[clusters]]\nname = \"up\"\nendpoints = [\"127.0.0.1:{}\"]\nmax_connections = 20\nqueue_timeout = {queue}\n",
            admin.display(),
            up.port
        )
    };
    let mut p = Proc::proxy(&dir, &config(10), None);
    wait_tcp(port);
    wait_unix(&admin);
    let rt = rt(2);
    // A client connection under each of 11 configurations: the first, and after each reload
    // (the first five reload the same file, the sixth changes the cluster, the rest reload that).
    let mut clients = Vec::new();
    for k in 0..=10u64 {
        let c = rt.block_on(async {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let (client, conn) = h2::client::handshake(tcp).await.unwrap();
            tokio::spawn(conn);
            client
        });
        clients.push(c);
        if k < 10 {
            std::fs::write(dir.join("proxy.toml"), config(if k < 5 { 10 } else { 9 })).unwrap();
            sighup(&p);
            let s = wait_reloads(&admin, k + 1);
            assert_eq!(s["reloads"].as_u64(), Some(k + 1), "reload {k}: {}", s["last_reload_error"]);
        }
    }
    // Every connection asks for 10 slow answers at once.
    let codes: Vec<Option<u16>> = rt.block_on(async {
        let mut calls = Vec::new();
        for c in &clients {
            for _ in 0..10 {
                let mut c = c.clone();
                calls.push(tokio::spawn(async move {
                    c = c.ready().await.ok()?;
                    let (resp, _) = c.send_request(http::Request::get(format!("http://a:{port}/sleep/1000")).body(()).unwrap(), true).ok()?;
                    Some(tokio::time::timeout(Duration::from_secs(30), resp).await.ok()?.ok()?.status().as_u16())
                }));
            }
        }
        futures_join(calls).await
    });
    let s = stats(&admin);
    let most = up.counts.max_in_flight.load(Ordering::SeqCst);
    println!(
        "after 10 reloads, 11 connections x 10 requests: at most {most} at the upstream at once, {} upstream connections at most (cap 20); {} answered 200; stats: cap {} ",
        up.counts.max_open.load(Ordering::SeqCst),
        codes.iter().filter(|c| **c == Some(200)).count(),
        s["clusters"][0]["endpoints"][0]["max_connections"]
    );
    assert!(most <= 20 && up.counts.max_open.load(Ordering::SeqCst) <= 20, "{most} requests at once at an endpoint whose cap is 20");
    assert_eq!(s["clusters"][0]["endpoints"][0]["max_connections"].as_u64(), Some(20));
    p.assert_alive("reloads");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 6. an upstream's 101; nonsense refused at load -----------------------------------------

#[test]
fn an_upstreams_101_never_reaches_a_client() {
    let _one = one();
    let dir = tmp("101");
    let port = free_port();
    // An upstream that switches protocols whatever it is asked.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut b = [0u8; 4096];
                let _ = s.read(&mut b);
                let _ = s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nnot http");
                std::thread::sleep(Duration::from_secs(2));
            });
        }
    });
    let mut p = Proc::proxy(
        &dir,
        &format!("[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n[[routes]]\ncluster = \"up\"\n[[clusters]]\nname = \"up\"\nendpoints = [\"127.0.0.1:{up}\"]\n"),
        None,
    );
    wait_tcp(port);
    let st = h2_status(port, &format!("http://a:{port}/"));
    let (code, _) = raw(port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    println!("an upstream's 101: HTTP/2 client {st:?}, HTTP/1.1 client {code}");
    assert_eq!(st, Some(502));
    assert_eq!(code, 502);
    p.assert_alive("101");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_listener_as_its_own_endpoint_and_limits_that_cannot_work_are_refused() {
    let _one = one();
    let dir = tmp("nonsense");
    let port = free_port();
    let start = |extra_top: &str, extra_listener: &str, endpoint: &str, nofile: Option<u64>| {
        let mut p = Proc::proxy(
            &dir,
            &format!("{extra_top}\n[[listeners]]\nname = \"web\"\naddress = \"0.0.0.0:{port}\"\n{extra_listener}\n[[routes]]\ncluster = \"up\"\n[[clusters]]\nname = \"up\"\nendpoints = [\"{endpoint}\"]\n"),
            nofile,
        );
        let status = p.wait_exit(Duration::from_secs(5));
        (status, p.log())
    };
    for (top, listener, endpoint, nofile, want) in [
        ("", "", format!("127.0.0.1:{port}"), None, "requests would loop"),
        ("", "reset_window = 1e-9", "127.0.0.1:9".to_string(), None, "reset_window"),
        ("max_connections = 100000", "", "127.0.0.1:9".to_string(), Some(1024), "descriptors"),
    ] {
        let (status, log) = start(top, listener, &endpoint, nofile);
        println!("{top}{listener} endpoint {endpoint}: {status:?}: {}", log.lines().last().unwrap_or(""));
        assert!(status.is_some_and(|s| !s.success()), "started anyway ({top}{listener}, endpoint {endpoint})");
        assert!(log.contains(want), "{log}");
    }
    // A reload to such a file is refused, and the proxy keeps serving.
    let admin = dir.join("admin.sock");
    let good = format!(
        "[admin]\naddress = \"unix:{}\"\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n[[routes]]\nrespond = {{ status = 200, body = \"ok\" }}\n",
        admin.display()
    );
    let mut p = Proc::proxy(&dir, &good, None);
    wait_tcp(port);
    wait_unix(&admin);
    std::fs::write(dir.join("proxy.toml"), format!("{good}[[routes]]\ncluster = \"up\"\n[[clusters]]\nname = \"up\"\nendpoints = [\"127.0.0.1:{port}\"]\n")).unwrap();
    sighup(&p);
    let t = Instant::now();
    while stats(&admin)["reload_failures"].as_u64() != Some(1) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = stats(&admin);
    println!("reload with the listener as an endpoint: {}", s["last_reload_error"]);
    assert!(s["last_reload_error"].as_str().is_some_and(|e| e.contains("requests would loop")));
    assert_eq!(curl(&[], &format!("http://127.0.0.1:{port}/")).unwrap().0, 200);
    p.assert_alive("a refused reload");
    let _ = std::fs::remove_dir_all(&dir);
}
