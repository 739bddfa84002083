//! The API served for real (hyper, sockets): who may connect, the token of a TCP API, clients
//! that drip their requests, and requests that contradict themselves.

mod common;

use common::Fake;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vectorlb_api::{Access, Endpoint, Listener};

fn raw(conn: &mut dyn ReadWrite, req: &[u8]) -> String {
    conn.write_all(req).unwrap();
    let mut out = Vec::new();
    let _ = conn.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn status(answer: &str) -> u16 {
    answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Serves the fake daemon on `endpoint` in a runtime of its own thread.
fn serve(endpoint: Endpoint, token: Option<String>) -> std::thread::JoinHandle<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let l = Listener::bind(&endpoint, &Access::default()).await.unwrap();
            tx.send(()).unwrap();
            vectorlb_api::serve(l, vectorlb_api::router(Arc::new(Fake::default())), token, std::future::pending()).await;
        })
    });
    rx.recv().unwrap();
    h
}

#[test]
fn a_unix_socket_is_for_its_owner_and_a_tcp_api_needs_its_token() {
    let dir = std::env::temp_dir().join(format!("vectorlb-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("api.sock");
    serve(Endpoint::Unix(sock.clone()), None);
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only the daemon's user may connect");
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    assert_eq!(status(&raw(&mut c, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")), 200);
    // A second server on the same live socket is refused; the first keeps serving.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let e = rt.block_on(Listener::bind(&Endpoint::Unix(sock.clone()), &Access::default())).err().expect("in use").to_string();
    assert!(e.contains("another vectorlb is serving it"), "{e}");
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    assert_eq!(status(&raw(&mut c, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")), 200);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    serve(Endpoint::Tcp(port), Some("s3cret-token-of-32-characters-xx".into()));
    let ask = |req: &str| {
        let mut c = std::net::TcpStream::connect(port).unwrap();
        raw(&mut c, req.as_bytes())
    };
    let a = ask("DELETE /v1/services/tcp/10.0.0.100/80 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status(&a), 401, "{a}");
    assert!(a.contains("WWW-Authenticate") || a.contains("www-authenticate"), "{a}");
    assert_eq!(status(&ask("GET /v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n")), 401);
    assert_eq!(status(&ask("GET /v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token-of-32-characters-xx\r\n\r\n")), 200);
    // Contradictory framing is refused, not guessed at.
    let a = ask("POST /v1/services HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token-of-32-characters-xx\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}");
    assert_eq!(status(&a), 400, "{a}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_status_page_is_behind_the_token_and_a_browser_login_only_reads() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    serve(Endpoint::Tcp(port), Some("page-token".into()));
    let ask = |req: &str| {
        let mut c = std::net::TcpStream::connect(port).unwrap();
        raw(&mut c, req.as_bytes())
    };
    // Without credentials the page is refused, with a challenge a browser answers with a login.
    let a = ask("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status(&a), 401, "{a}");
    assert!(a.to_ascii_lowercase().contains("www-authenticate: basic realm=\"vectorlb\""), "{a}");
    // "admin:page-token" and "admin:wrong".
    let good = "Authorization: Basic YWRtaW46cGFnZS10b2tlbg==";
    let bad = "Authorization: Basic YWRtaW46d3Jvbmc=";
    let a = ask(&format!("GET / HTTP/1.1\r\nHost: x\r\n{good}\r\n\r\n"));
    assert_eq!(status(&a), 200, "{a}");
    let lower = a.to_ascii_lowercase();
    assert!(lower.contains("content-type: text/html"), "{a}");
    assert!(lower.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{a}");
    assert!(a.contains("<script src=\"/ui/status.js\""), "{a}");
    for (path, kind) in [("/ui/status.js", "text/javascript"), ("/ui/status.css", "text/css"), ("/v1/services", "application/json")] {
        let a = ask(&format!("GET {path} HTTP/1.1\r\nHost: x\r\n{good}\r\n\r\n"));
        assert_eq!(status(&a), 200, "{path}: {a}");
        assert!(a.to_ascii_lowercase().contains(&format!("content-type: {kind}")), "{path}: {a}");
    }
    assert_eq!(status(&ask(&format!("GET /v1/stats HTTP/1.1\r\nHost: x\r\n{bad}\r\n\r\n"))), 401);
    assert_eq!(status(&ask("GET /v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Basic !!!\r\n\r\n")), 401);
    // A login a browser would also attach to a forged cross-site request changes nothing.
    let a = ask(&format!("POST /v1/reload HTTP/1.1\r\nHost: x\r\n{good}\r\nContent-Length: 0\r\n\r\n"));
    assert_eq!(status(&a), 401, "{a}");
    assert!(a.contains("only reads"), "{a}");
    let a = ask(&format!("DELETE /v1/services/tcp/10.0.0.100/80 HTTP/1.1\r\nHost: x\r\n{good}\r\n\r\n"));
    assert_eq!(status(&a), 401, "{a}");
    // The bearer token still changes things.
    let a = ask("POST /v1/reload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer page-token\r\nContent-Length: 0\r\n\r\n");
    assert_ne!(status(&a), 401, "{a}");
}

#[test]
fn clients_that_drip_keep_no_one_out() {
    let dir = std::env::temp_dir().join(format!("vectorlb-api-drip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("api.sock");
    serve(Endpoint::Unix(sock.clone()), None);
    // 100 connections that send a byte a second.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut drips = Vec::new();
    for _ in 0..100 {
        let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        let stop = stop.clone();
        drips.push(std::thread::spawn(move || {
            for b in b"GET /v1/services HTTP/1.1\r\n".iter().cycle().take(10) {
                if stop.load(std::sync::atomic::Ordering::SeqCst) || c.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Meanwhile 30 ordinary requests all get their answers, promptly.
    let t = Instant::now();
    for _ in 0..30 {
        let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(status(&raw(&mut c, b"GET /v1/services HTTP/1.1\r\nHost: x\r\n\r\n")), 200);
    }
    assert!(t.elapsed() < Duration::from_secs(5), "30 requests took {:?}", t.elapsed());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for d in drips {
        let _ = d.join();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
