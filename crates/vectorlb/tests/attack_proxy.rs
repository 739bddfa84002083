//! `vectorlb proxy` attacked as a hostile client, a hostile upstream and a careless operator
//! would, and the daemon's API where the same attacks apply. Every test runs the real binary
//! (its signal dispositions and descriptor limits are the process's own), on loopback, bounded
//! in count and time. `make attack-proxy` runs this file alone; `VECTORLB_BIN` points it at
//! another build (an installed one, or the previous commit's to see an attack succeed).
//!
//! * a client that closes right after sending (HTTP/1.1 pipelined, h2c, the admin socket)
//!   never stops the process (it used to die of SIGPIPE);
//! * an admin address naming a file that is not a socket is refused and the file kept;
//! * one authority per request: the absolute-form URI's, or Host; two Hosts, a Host that
//!   disagrees with `:authority` and HTTP/1.1 without Host get 400;
//! * 1,200 slow or silent clients under a 1,024-descriptor limit: curl keeps being served;
//! * zero-window HTTP/2 clients and slow request bodies hold no more upstream connections than
//!   the cluster allows, and give them back within the deadline;
//! * HTTP/2 streams reset 50 ms after their request went upstream end in GOAWAY within the
//!   reset budget;
//! * a client's bad chunk is its error (400), an upstream's double framing is the upstream's
//!   (502, and its connection is not used again).

// This crate's link flags route BoringSSL's X25519 through the proxy's wrappers (build.rs):
// the TLS client here links BoringSSL, so the wrappers must be linked too.
extern crate vectorlb_proxy;

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---- 1. a client closing right after sending -----------------------------------------------

fn close_hard(s: TcpStream) {
    // SO_LINGER 0: close sends a reset at once.
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on a socket this function owns, with a linger struct and its size.
    unsafe {
        libc::setsockopt(std::os::fd::AsRawFd::as_raw_fd(&s), libc::SOL_SOCKET, libc::SO_LINGER, (&l as *const libc::linger).cast(), std::mem::size_of::<libc::linger>() as u32);
    }
    drop(s);
}

#[test]
fn a_client_closing_right_after_sending_never_stops_the_proxy() {
    let _one = one();
    let dir = tmp("close");
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("obj.bin"), vec![7u8; 200_000]).unwrap();
    let port = free_port();
    let admin = dir.join("admin.sock");
    let body = "y".repeat(60_000);
    let mut p = Proc::proxy(
        &dir,
        &format!(
            "[admin]\naddress = \"unix:{}\"\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n\
             [[routes]]\npath_prefix = \"/static/\"\nstatic = {{ root = \"{}\" }}\n\
             [[routes]]\nrespond = {{ status = 200, body = \"{body}\" }}\n",
            admin.display(),
            www.display()
        ),
        None,
    );
    wait_tcp(port);
    wait_unix(&admin);
    let pipelined = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\nGET {path} HTTP/1.1\r\nHost: a\r\n\r\n");
    for (what, req) in [
        ("HTTP/1.1, a respond route", pipelined("/r").into_bytes()),
        ("HTTP/1.1, a static object", pipelined("/static/obj.bin").into_bytes()),
        ("h2c, one HEADERS frame", h2c_request("a", "/r", &[])),
    ] {
        for i in 0..30 {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(&req).unwrap();
            if i % 2 == 0 {
                drop(s);
            } else {
                close_hard(s);
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        p.assert_alive(what);
    }
    for i in 0..30 {
        let mut s = std::os::unix::net::UnixStream::connect(&admin).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        if i % 2 == 1 {
            // Leave the request unanswered and the socket unread: the answer meets a reset.
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        drop(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    p.assert_alive("admin socket clients closing after GET /metrics");
    let (code, b) = curl(&[], &format!("http://127.0.0.1:{port}/r")).unwrap();
    assert_eq!((code, b.len()), (200, 60_000));
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 2. an admin address naming a file ----------------------------------------------------

#[test]
fn an_admin_address_that_names_a_file_is_refused_and_the_file_kept() {
    let _one = one();
    let dir = tmp("admin-file");
    let port = free_port();
    let listener = format!("[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n[[routes]]\nrespond = {{ status = 204 }}\n");
    // The proxy's own configuration as its admin socket.
    let cfg = dir.join("proxy.toml");
    let text = format!("[admin]\naddress = \"unix:{}\"\n{listener}", cfg.display());
    let mut p = Proc::proxy(&dir, &text, None);
    let status = p.wait_exit(Duration::from_secs(10)).expect("the start is refused");
    assert!(!status.success());
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), text, "the file named by admin.address was changed");
    assert!(p.log().contains("not a socket"), "{}", p.log());
    // A directory, and a symbolic link to a file: the same.
    let d = dir.join("a-dir");
    std::fs::create_dir_all(&d).unwrap();
    let link = dir.join("link.sock");
    std::os::unix::fs::symlink(&cfg, &link).unwrap();
    for target in [&d, &link] {
        let sub = tmp(&format!("admin-file-{}", target.file_name().unwrap().to_string_lossy()));
        let mut p = Proc::proxy(&sub, &format!("[admin]\naddress = \"unix:{}\"\n{listener}", target.display()), None);
        assert!(!p.wait_exit(Duration::from_secs(10)).expect("refused").success());
        assert!(std::fs::symlink_metadata(target).is_ok(), "{} removed", target.display());
        let _ = std::fs::remove_dir_all(&sub);
    }
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), text);
    // A stale socket (nothing answers) is replaced; a live one refuses the second instance.
    let sock = dir.join("admin.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let sub = tmp("admin-file-live");
    let mut first = Proc::proxy(&sub, &format!("[admin]\naddress = \"unix:{}\"\n{listener}", sock.display()), None);
    wait_unix(&sock);
    first.assert_alive("replacing a stale socket");
    let sub2 = tmp("admin-file-second");
    let mut second = Proc::proxy(
        &sub2,
        &format!("[admin]\naddress = \"unix:{}\"\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:0\"\n[[routes]]\nrespond = {{ status = 204 }}\n", sock.display()),
        None,
    );
    assert!(!second.wait_exit(Duration::from_secs(10)).expect("refused").success());
    assert!(second.log().contains("another"), "{}", second.log());
    first.assert_alive("a second instance on its admin socket");
    wait_unix(&sock);
    // The daemon binds its API with the same code: a regular file is refused there too.
    let dsub = tmp("admin-file-daemon");
    let dcfg = dsub.join("lb.toml");
    let dtext = format!(
        "[runtime]\nworkers = 1\napi = \"unix:{}\"\nrun_dir = \"{}\"\neal = [\"-l\", \"0\", \"--in-memory\"]\n\
         [[ports]]\nname = \"ext\"\ndevice = \"net_null0\"\nmac = \"02:00:00:00:00:01\"\naddrs = [\"10.0.0.1/24\"]\n",
        dcfg.display(),
        dsub.display()
    );
    std::fs::write(&dcfg, &dtext).unwrap();
    let mut d = Proc::spawn(&["run", "--config", dcfg.to_str().unwrap()], dsub.join("lb.log"), None);
    assert!(!d.wait_exit(Duration::from_secs(20)).expect("the daemon's start is refused").success());
    assert_eq!(std::fs::read_to_string(&dcfg).unwrap(), dtext, "the daemon removed its configuration");
    assert!(d.log().contains("not a socket"), "{}", d.log());
    for s in [&sub, &sub2, &dsub, &dir] {
        let _ = std::fs::remove_dir_all(s);
    }
}

// ---- 3. one authority per request ------------------------------------------------------

#[test]
fn routing_and_the_upstream_see_one_authority() {
    let _one = one();
    let dir = tmp("authority");
    let up = upstream();
    let port = free_port();
    let mut p = Proc::proxy(
        &dir,
        &format!(
            "[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n\
             [[routes]]\nhost = \"internal.example\"\nrespond = {{ status = 204 }}\n\
             [[routes]]\nhost = \"public.example\"\ncluster = \"public\"\n\
             [[routes]]\nrespond = {{ status = 404, body = \"no host\" }}\n\
             [[clusters]]\nname = \"public\"\nendpoints = [\"127.0.0.1:{}\"]\n",
            up.port
        ),
        None,
    );
    wait_tcp(port);
    let h1 = |req: &str| raw(port, req.as_bytes());
    // The absolute form's authority wins (RFC 9112 3.2.2): routing and the upstream see it.
    let (code, text) = h1("GET http://public.example/a HTTP/1.1\r\nHost: internal.example\r\nConnection: close\r\n\r\n");
    assert_eq!(code, 200, "{text}");
    assert!(text.ends_with("host=public.example body=0"), "the upstream saw another host: {text}");
    let (code, text) = h1("GET http://internal.example/a HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n");
    assert_eq!(code, 204, "{text}");
    // Two Host lines, a missing Host on HTTP/1.1, a bad Host, userinfo: 400.
    for req in [
        "GET /a HTTP/1.1\r\nHost: public.example\r\nHost: internal.example\r\nConnection: close\r\n\r\n",
        "GET /a HTTP/1.1\r\nHost: public.example\r\nHost: public.example\r\nConnection: close\r\n\r\n",
        "GET /a HTTP/1.1\r\nConnection: close\r\n\r\n",
        "GET /a HTTP/1.1\r\nHost: public.example/x\r\nConnection: close\r\n\r\n",
        "GET /a HTTP/1.1\r\nHost: public.example:99999\r\nConnection: close\r\n\r\n",
        "GET http://user@public.example/a HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n",
    ] {
        let (code, text) = h1(req);
        assert_eq!(code, 400, "{req:?}: {text}");
    }
    // HTTP/1.0 may omit Host: routed without one.
    assert_eq!(h1("GET /a HTTP/1.0\r\n\r\n").0, 404);
    // Host with a port, in another case: the same host, forwarded in its canonical form.
    let (code, text) = h1("GET /a HTTP/1.1\r\nHost: PUBLIC.example:80\r\nConnection: close\r\n\r\n");
    assert_eq!(code, 200, "{text}");
    assert!(text.ends_with("host=public.example:80 body=0"), "{text}");
    // h2c: :authority and a Host that names another host: 400; the same host: served.
    assert_eq!(h2c_status(port, &h2c_request("public.example", "/a", &[("host", "internal.example")])), Some(400));
    assert_eq!(h2c_status(port, &h2c_request("public.example", "/a", &[("host", "PUBLIC.example")])), Some(200));
    assert_eq!(h2c_status(port, &h2c_request("public.example", "/a", &[])), Some(200));
    assert_eq!(h2c_status(port, &h2c_request("internal.example", "/a", &[])), Some(204));
    assert_eq!(up.counts.requests.load(Ordering::SeqCst), 4, "only the requests for public.example reached the upstream");
    p.assert_alive("the authority checks");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 4. 1,200 slow clients under a 1,024-descriptor limit ------------------------------

/// Keeps `n` connections of one kind open to `port` until `until`, reopening those the proxy
/// closes: "silent" sends nothing, "drip" a request head a byte every 3 s, "tls" the same
/// after a TLS handshake. Counts the connections it opened.
async fn slow_clients(kind: &'static str, port: u16, n: usize, until: Instant, opened: Arc<AtomicU64>) {
    use tokio::io::AsyncWriteExt;
    let mut tasks = Vec::new();
    for i in 0..n {
        let opened = opened.clone();
        tasks.push(tokio::spawn(async move {
            // Spread the starts over the first two seconds.
            tokio::time::sleep(Duration::from_millis((i * 2000 / n) as u64)).await;
            while Instant::now() < until {
                let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                let head = b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
                let drip = |mut w: Box<dyn tokio::io::AsyncWrite + Unpin + Send>| async move {
                    for b in head.iter() {
                        if Instant::now() >= until || w.write_all(&[*b]).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                };
                match kind {
                    "silent" => {
                        // Wait for the proxy to close it (or the end).
                        let mut s = s;
                        let mut buf = [0u8; 64];
                        let _ = tokio::time::timeout_at(until.into(), tokio::io::AsyncReadExt::read(&mut s, &mut buf)).await;
                    }
                    "drip" => drip(Box::new(s)).await,
                    _ => {
                        let mut b = boring::ssl::SslConnector::builder(boring::ssl::SslMethod::tls()).unwrap();
                        b.set_verify(boring::ssl::SslVerifyMode::NONE);
                        let cfg = b.build().configure().unwrap();
                        match tokio::time::timeout(Duration::from_secs(10), tokio_boring::connect(cfg, "t.test", s)).await {
                            Ok(Ok(t)) => drip(Box::new(t)).await,
                            _ => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

#[test]
fn slow_clients_past_a_1024_descriptor_limit_do_not_keep_curl_out() {
    let _one = one();
    raise_own_nofile();
    let dir = tmp("slow");
    let up = upstream();
    let (cert, key) = self_signed(&dir);
    let (port, tls_port) = (free_port(), free_port());
    let admin = dir.join("admin.sock");
    let mut p = Proc::proxy(
        &dir,
        &format!(
            "workers = 2\n[admin]\naddress = \"unix:{}\"\n\
             [[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n\
             [[listeners]]\nname = \"tls\"\naddress = \"127.0.0.1:{tls_port}\"\ntls = {{ certificates = [{{ cert = \"{}\", key = \"{}\" }}] }}\n\
             [[routes]]\npath_prefix = \"/up\"\ncluster = \"up\"\n\
             [[routes]]\nrespond = {{ status = 200, body = \"ok\" }}\n\
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
    let seconds = 25;
    let until = Instant::now() + Duration::from_secs(seconds);
    let opened = Arc::new(AtomicU64::new(0));
    let attack = {
        let opened = opened.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                tokio::join!(
                    slow_clients("drip", port, 500, until, opened.clone()),
                    slow_clients("silent", port, 300, until, opened.clone()),
                    slow_clients("tls", tls_port, 400, until, opened.clone()),
                );
            });
        })
    };
    // Let the attack fill up, then measure curl through it (and the admin API) until the end.
    std::thread::sleep(Duration::from_secs(5));
    let (mut times, mut failures, mut admin_failures) = (Vec::new(), Vec::new(), 0);
    let mut n = 0;
    while Instant::now() + Duration::from_secs(1) < until {
        if n == 3 {
            let o = Command::new("ss").args(["-Hltn", &format!("sport = :{port}")]).output().unwrap();
            println!("listener queue: {}", String::from_utf8_lossy(&o.stdout).trim());
            println!("during: {}", stats(&admin)["listeners"][0]);
        }
        let t = Instant::now();
        // Alternately answered by the proxy and forwarded (an upstream connection too).
        let path = if n % 2 == 0 { "/" } else { "/up" };
        match curl(&["--max-time", "3"], &format!("http://127.0.0.1:{port}{path}")) {
            Ok((200, b)) if b == "ok" || b.starts_with("host=") => times.push(t.elapsed().as_secs_f64() * 1e3),
            r => failures.push(format!("{r:?}")),
        }
        n += 1;
        if n % 10 == 0
            && Command::new("curl")
                .args(["-sS", "--max-time", "3", "--unix-socket", admin.to_str().unwrap(), "http://x/v1/health"])
                .output()
                .map(|o| !o.status.success())
                .unwrap_or(true)
        {
            admin_failures += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    attack.join().unwrap();
    p.assert_alive("1,200 slow clients");
    times.sort_by(|a, b| a.total_cmp(b));
    let q = |f: f64| times.get(((times.len() as f64 * f) as usize).min(times.len().saturating_sub(1))).copied().unwrap_or(f64::NAN);
    let log = p.log();
    let emfile = log.matches("Too many open files").count();
    println!(
        "slow clients: {} connections opened by the attack in {seconds} s; curl {} ok, {} failed, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; admin failures {admin_failures}; \"Too many open files\" lines {emfile}; RSS {} kB",
        opened.load(Ordering::Relaxed),
        times.len(),
        failures.len(),
        q(0.5),
        q(0.99),
        times.last().copied().unwrap_or(f64::NAN),
        p.rss_kb()
    );
    if let Some(s) = p.child.try_wait().ok().flatten().is_none().then(|| stats(&admin)) {
        println!("client connections {} of {}; {}\n{}", s["client_connections"], s["max_client_connections"], s["listeners"][0], s["listeners"][1]);
    }
    assert!(failures.is_empty(), "curl failed {} of {} times: {:?}", failures.len(), n, &failures[..failures.len().min(5)]);
    assert_eq!(admin_failures, 0, "the admin API did not answer");
    assert!(emfile <= 10, "{emfile} lines about open files in the log");
    assert!(opened.load(Ordering::Relaxed) >= 1200, "the attack did not run");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 5. stalled clients and upstream connections --------------------------------------------

/// Slow request bodies: `n` POSTs that send `chunk` every `every`; chunked, or with a
/// Content-Length of 100.
async fn slow_posts(port: u16, n: usize, chunked: bool, every: Duration, until: Instant) -> Vec<tokio::task::JoinHandle<Option<u16>>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
                let head = if chunked {
                    "POST /up HTTP/1.1\r\nHost: public.example\r\nTransfer-Encoding: chunked\r\n\r\n"
                } else {
                    "POST /up HTTP/1.1\r\nHost: public.example\r\nContent-Length: 100\r\n\r\n"
                };
                s.write_all(head.as_bytes()).await.ok()?;
                let mut sent = 0;
                let (mut r, mut w) = s.into_split();
                let reader = tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = tokio::time::timeout(Duration::from_secs(30), r.read(&mut buf)).await.ok()?.ok()?;
                    String::from_utf8_lossy(&buf[..n]).split(' ').nth(1)?.parse::<u16>().ok()
                });
                while Instant::now() < until && sent < 100 && !reader.is_finished() {
                    let ok = if chunked { w.write_all(b"1\r\nz\r\n").await } else { w.write_all(b"z").await };
                    if ok.is_err() {
                        break;
                    }
                    sent += 1;
                    tokio::time::sleep(every).await;
                }
                // A chunked body ends here; a body of a known length stays short (and meets
                // body_timeout).
                if chunked && !reader.is_finished() {
                    let _ = w.write_all(b"0\r\n\r\n").await;
                }
                tokio::time::timeout(Duration::from_secs(10), reader).await.ok()?.ok()?
            })
        })
        .collect()
}

#[test]
fn stalled_clients_cannot_hold_more_upstream_connections_than_allowed() {
    let _one = one();
    raise_own_nofile();
    let dir = tmp("stall");
    let up = upstream();
    let port = free_port();
    let admin = dir.join("admin.sock");
    let mut p = Proc::proxy(
        &dir,
        &format!(
            "workers = 2\n[admin]\naddress = \"unix:{}\"\n\
             [[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\nsend_timeout = 2\nbody_timeout = 3\n\
             [[routes]]\ncluster = \"public\"\n\
             [[clusters]]\nname = \"public\"\nendpoints = [\"127.0.0.1:{}\"]\nmax_connections = 16\nqueue_timeout = 0.5\nmax_idle = 4\n",
            admin.display(),
            up.port
        ),
        None,
    );
    wait_tcp(port);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let pid = p.child.id();
    let sample = |what: &str| {
        let m = up.counts.max_open.swap(up.counts.open(), Ordering::SeqCst);
        println!("{what}: at most {m} upstream connections at once, {} open now, proxy RSS {} kB", up.counts.open(), rss_kb(pid));
        m
    };
    // Zero-window HTTP/2 clients: 6 x 200 streams.
    let held = rt.block_on(zero_window_clients(port, 6, 200));
    std::thread::sleep(Duration::from_secs(1));
    let during = sample("6 zero-window clients x 200 streams");
    assert!(during <= 16, "{during} upstream connections held by zero-window clients (max_connections = 16)");
    // The bounded wait: a request beyond the limit gets its answer (503 while all are held, or
    // 200 once the deadline freed them) and never hangs.
    let r = curl(&["-H", "Host: public.example"], &format!("http://127.0.0.1:{port}/small"));
    assert!(matches!(r, Ok((200 | 503, _))), "{r:?}");
    // Within send_timeout (2 s) and a tick, the stalled streams give their connections back.
    let t = Instant::now();
    while up.counts.open() > 4 && t.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("stalled streams released after {:.1} s; {} upstream connections open", t.elapsed().as_secs_f64(), up.counts.open());
    assert!(up.counts.open() <= 4, "{} upstream connections still held after the send deadline", up.counts.open());
    for h in held {
        h.abort();
    }
    let (code, _) = curl(&["-H", "Host: public.example"], &format!("http://127.0.0.1:{port}/small")).unwrap();
    assert_eq!(code, 200);
    p.assert_alive("zero-window clients");
    // 100 slow chunked POSTs (a byte a second): at most 16 upstream connections; the others
    // answered 503 after the bounded wait; those 16 answered 408 for their rate.
    up.counts.max_open.store(up.counts.open(), Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(6);
    let posts = rt.block_on(slow_posts(port, 100, true, Duration::from_secs(1), until));
    std::thread::sleep(Duration::from_secs(3));
    let during = sample("100 slow chunked POSTs");
    let codes: Vec<Option<u16>> = rt.block_on(async { futures_join(posts).await });
    let n503 = codes.iter().filter(|c| **c == Some(503)).count();
    println!("slow chunked POSTs: {n503} answered 503, {} others: {:?}", codes.len() - n503, codes.iter().filter(|c| **c != Some(503)).take(5).collect::<Vec<_>>());
    assert!(during <= 16, "{during} upstream connections held by slow POSTs");
    assert_eq!(n503, 100 - 16, "the requests over the limit were not refused after the bounded wait");
    // A byte a second is below min_rate (500 bytes/s as shipped): the bodies that got a
    // connection fell behind it by body_timeout (3 s) and were answered 408, their upstream
    // connections given back.
    assert_eq!(codes.iter().filter(|c| **c == Some(408)).count(), 16, "the slow bodies that got a connection met min_rate: {codes:?}");
    // 100 slow POSTs with a small Content-Length: buffered, no upstream connection at all
    // while they trickle in.
    up.counts.max_open.store(up.counts.open(), Ordering::SeqCst);
    let before = up.counts.accepted.load(Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(4);
    let posts = rt.block_on(slow_posts(port, 100, false, Duration::from_secs(1), until));
    std::thread::sleep(Duration::from_secs(3));
    let opened = up.counts.accepted.load(Ordering::SeqCst) - before;
    println!("100 slow POSTs of 100 bytes: {opened} upstream connections opened while they trickled");
    assert_eq!(opened, 0, "slow bodies of a known small length reached the upstream before they were whole");
    let codes: Vec<Option<u16>> = rt.block_on(async { futures_join(posts).await });
    println!("slow 100-byte POSTs: answers {:?}", codes.iter().take(5).collect::<Vec<_>>());
    assert!(codes.iter().all(|c| *c == Some(408)), "bodies cut short must meet body_timeout (408): {codes:?}");
    p.assert_alive("slow POSTs");
    let s = stats(&admin);
    println!("stats: {}", s["listeners"][0]);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 6. rapid reset with a delay ----------------------------------------------------------

#[test]
fn streams_reset_after_their_request_went_upstream_end_in_goaway_within_the_budget() {
    let _one = one();
    let dir = tmp("reset");
    let up = upstream();
    let port = free_port();
    let mut p = Proc::proxy(
        &dir,
        &format!(
            "[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\nreset_budget = 50\nreset_window = 10\n\
             [[routes]]\ncluster = \"public\"\n[[clusters]]\nname = \"public\"\nendpoints = [\"127.0.0.1:{}\"]\n",
            up.port
        ),
        None,
    );
    wait_tcp(port);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (sent, goaway, took) = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
        let conn = tokio::spawn(conn);
        let t = Instant::now();
        let mut sent = 0;
        let mut goaway = false;
        while t.elapsed() < Duration::from_secs(20) {
            let c = match client.ready().await {
                Ok(c) => c,
                Err(e) => {
                    goaway = e.is_go_away() || e.is_io();
                    break;
                }
            };
            client = c;
            let req = http::Request::get(format!("http://public.example:{port}/big")).body(()).unwrap();
            let (_resp, mut stream) = match client.send_request(req, false) {
                Ok(r) => r,
                Err(e) => {
                    goaway = e.is_go_away() || e.is_io();
                    break;
                }
            };
            sent += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            stream.send_reset(h2::Reason::CANCEL);
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        (sent, goaway, t.elapsed())
    });
    let reached = up.counts.requests.load(Ordering::SeqCst);
    println!("delayed rapid reset: {sent} streams sent in {:.1} s, {reached} reached the upstream, GOAWAY {goaway}", took.as_secs_f64());
    assert!(goaway, "no GOAWAY after {sent} reset streams in {took:?}");
    assert!(reached <= 50 + 5, "{reached} requests reached the upstream with a budget of 50 resets");
    p.assert_alive("delayed rapid reset");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 7. framing errors: the client's and the upstream's -------------------------------------

#[test]
fn a_bad_chunk_is_the_clients_error_and_a_double_framed_answer_the_upstreams() {
    let _one = one();
    let dir = tmp("framing");
    let up = upstream();
    // An upstream answering with both Content-Length and chunked framing; counts connections.
    let bad = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bad_port = bad.local_addr().unwrap().port();
    let bad_accepts = Arc::new(AtomicUsize::new(0));
    {
        let n = bad_accepts.clone();
        std::thread::spawn(move || {
            for s in bad.incoming() {
                let Ok(mut s) = s else { continue };
                n.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut got = Vec::new();
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(k) => got.extend_from_slice(&buf[..k]),
                        }
                        while let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            got.drain(..i + 4);
                            if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n").is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
    }
    let port = free_port();
    let admin = dir.join("admin.sock");
    let mut p = Proc::proxy(
        &dir,
        &format!(
            "[admin]\naddress = \"unix:{}\"\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n\
             [[routes]]\npath_prefix = \"/double\"\ncluster = \"double\"\n[[routes]]\ncluster = \"public\"\n\
             [[clusters]]\nname = \"public\"\nendpoints = [\"127.0.0.1:{}\"]\n\
             [[clusters]]\nname = \"double\"\nendpoints = [\"127.0.0.1:{bad_port}\"]\n",
            admin.display(),
            up.port
        ),
        None,
    );
    wait_tcp(port);
    for req in [
        "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhelloXX0\r\n\r\n",
    ] {
        let (code, text) = raw(port, req.as_bytes());
        assert_eq!(code, 400, "{req:?}: {text}");
    }
    let s = stats(&admin);
    assert_eq!(s["clusters"][0]["endpoints"][0]["errors"], 0, "a client's bad chunk was counted as the upstream's error: {s}");
    assert!(s["listeners"][0]["client_errors"].as_u64().unwrap_or(0) >= 2, "client errors not counted: {}", s["listeners"][0]);
    for _ in 0..2 {
        let (code, text) = raw(port, b"GET /double HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        assert_eq!(code, 502, "a double-framed answer reached the client: {text}");
    }
    assert_eq!(bad_accepts.load(Ordering::SeqCst), 2, "the connection of a double-framed answer was used again");
    p.assert_alive("framing errors");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- the daemon's API under the same attacks ---------------------------------------------

#[test]
fn the_daemons_api_survives_clients_that_close_early_and_slow_clients() {
    let _one = one();
    raise_own_nofile();
    let dir = tmp("daemon-api");
    let api = dir.join("api.sock");
    let cfg = dir.join("lb.toml");
    std::fs::write(
        &cfg,
        format!(
            "[runtime]\nworkers = 1\napi = \"unix:{}\"\nrun_dir = \"{}\"\neal = [\"-l\", \"0\", \"--in-memory\", \"--log-level\", \"*:warning\"]\nmbufs = 4095\n\
             [[ports]]\nname = \"ext\"\ndevice = \"net_null0\"\nmac = \"02:00:00:00:00:01\"\naddrs = [\"10.0.0.1/24\"]\n",
            api.display(),
            dir.display()
        ),
    )
    .unwrap();
    let mut d = Proc::spawn(&["run", "--config", cfg.to_str().unwrap()], dir.join("lb.log"), None);
    for _ in 0..500 {
        if std::os::unix::net::UnixStream::connect(&api).is_ok() {
            break;
        }
        d.assert_alive("starting");
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in 0..30 {
        let mut s = std::os::unix::net::UnixStream::connect(&api).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        if i % 2 == 1 {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    d.assert_alive("API clients closing after GET /metrics");
    // 700 slow clients (more than the API serves at once): `vectorlb ctl` still gets in.
    let held: Vec<std::os::unix::net::UnixStream> = (0..700)
        .filter_map(|_| {
            let mut s = std::os::unix::net::UnixStream::connect(&api).ok()?;
            s.write_all(b"GET /v1/health HTTP/1.1\r\nX-Slow: a").ok()?;
            Some(s)
        })
        .collect();
    let mut failed = 0;
    for _ in 0..10 {
        let o = Command::new(bin()).args(["ctl", "--api", &format!("unix:{}", api.display()), "--raw", "GET", "/v1/health"]).output().unwrap();
        if !o.status.success() {
            failed += 1;
            eprintln!("ctl: {}", String::from_utf8_lossy(&o.stderr));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("daemon API: {} slow clients held, ctl failed {failed} of 10", held.len());
    drop(held);
    assert_eq!(failed, 0, "vectorlb ctl was kept out by slow clients");
    d.assert_alive("slow API clients");
    let _ = std::fs::remove_dir_all(&dir);
}
