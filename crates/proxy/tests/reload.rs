//! Reload and drain under load, with h2load and curl (not written here) as the clients.
//! * Reloads while h2load runs keep-alive connections and new connections: no request fails,
//!   the new configuration answers afterwards, a new listener starts, a bad file is refused
//!   whole and the running configuration stays.
//! * The drain: requests in flight when the stop comes all complete; then nothing is accepted.

mod common;

use common::free_port;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vectorlb_proxy::serve::{bind, start, Proxy};
use vectorlb_proxy::Config;

fn config(port: u16, body: &str, extra: Option<u16>) -> String {
    let mut c = format!("[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n");
    if let Some(e) = extra {
        c += &format!("[[listeners]]\nname = \"extra\"\naddress = \"127.0.0.1:{e}\"\n");
    }
    c + &format!("[[routes]]\nrespond = {{ status = 200, body = \"{body}\" }}\n")
}

fn get(port: u16) -> String {
    let o = Command::new("curl").args(["-sS", "--max-time", "5", &format!("http://127.0.0.1:{port}/")]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// h2load's "N succeeded, F failed, E errored, T timeout" as (succeeded, failed + errored + timeout).
fn h2load(args: &[String]) -> (u64, u64, String) {
    let o = Command::new("h2load").args(args).output().expect("h2load (apt-get install nghttp2-client)");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let line = out.lines().find(|l| l.starts_with("requests:")).unwrap_or_else(|| panic!("{out}")).to_string();
    let n: Vec<u64> = line.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    (n[3], n[4] + n[5] + n[6], line)
}

#[test]
fn reloads_under_load_lose_no_request_and_a_bad_file_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("proxy.toml");
    let (port, extra) = (free_port(), free_port());
    std::fs::write(&path, config(port, "A", None)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cur = rt.block_on(async {
        let p = Arc::new(Proxy::new(Config::load(&path).unwrap()).unwrap());
        let b = bind(&p.config).await.unwrap();
        start(p, b, Some(path.clone()))
    });
    assert_eq!(get(port), "A");
    let url = format!("http://127.0.0.1:{port}/");
    // Keep-alive connections, and a new connection per request, both while reloading.
    let ka = {
        let url = url.clone();
        std::thread::spawn(move || h2load(&["--h1".into(), "-c".into(), "16".into(), "-n".into(), "60000".into(), url]))
    };
    let fresh = {
        let url = url.clone();
        std::thread::spawn(move || h2load(&["--h1".into(), "-c".into(), "8".into(), "-n".into(), "6000".into(), "-H".into(), "Connection: close".into(), url]))
    };
    let t = Instant::now();
    let mut n = 0;
    while !(ka.is_finished() && fresh.is_finished()) && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
        let next = if n % 2 == 0 { config(port, "B", Some(extra)) } else { config(port, "A", None) };
        std::fs::write(&path, next).unwrap();
        rt.block_on(cur.reload()).unwrap();
        n += 1;
    }
    let (ok, failed, line) = ka.join().unwrap();
    assert_eq!((ok, failed), (60000, 0), "keep-alive: {line}");
    let (ok, failed, line) = fresh.join().unwrap();
    assert_eq!((ok, failed), (6000, 0), "new connections: {line}");
    assert!(n >= 4, "reloaded {n} times during the load");

    // The last reload is served: a new listener, a new answer.
    std::fs::write(&path, config(port, "C", Some(extra))).unwrap();
    rt.block_on(cur.reload()).unwrap();
    assert_eq!(get(port), "C");
    assert_eq!(get(extra), "C");
    // A bad file: refused whole, naming the field; everything stays.
    std::fs::write(&path, config(port, "D", Some(extra)).replace("status = 200", "status = 2000")).unwrap();
    let e = rt.block_on(cur.reload()).unwrap_err();
    assert!(e.contains("routes[0]"), "{e}");
    assert_eq!(get(port), "C");
    assert_eq!(cur.reload_failures.load(std::sync::atomic::Ordering::Relaxed), 1);
    // A new listener that cannot be bound refuses the reload before anything changes.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tport = taken.local_addr().unwrap().port();
    std::fs::write(&path, config(port, "E", Some(tport))).unwrap();
    let e = rt.block_on(cur.reload()).unwrap_err();
    assert!(e.contains("cannot listen on") && e.contains("extra"), "{e}");
    assert_eq!(get(port), "C");
    assert_eq!(get(extra), "C", "the listener it would have replaced still serves");
    rt.block_on(cur.drain(Duration::from_secs(2)));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_drain_lets_requests_in_flight_finish_and_then_accepts_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // An upstream that answers after 600 ms.
    let up = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else { return };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nslow\n").await;
                });
            }
        });
        port
    });
    let port = free_port();
    let cfg =
        format!("[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n[[routes]]\ncluster = \"slow\"\n[[clusters]]\nname = \"slow\"\nendpoints = [\"127.0.0.1:{up}\"]\n");
    let cur = rt.block_on(async {
        let p = Arc::new(Proxy::new(Config::parse(&cfg).unwrap()).unwrap());
        let b = bind(&p.config).await.unwrap();
        start(p, b, None)
    });
    // 20 requests in flight, then the stop.
    let inflight: Vec<_> = (0..20)
        .map(|_| {
            std::process::Command::new("curl")
                .args(["-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", &format!("http://127.0.0.1:{port}/")])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    rt.block_on(cur.drain(Duration::from_secs(5)));
    assert!(t.elapsed() < Duration::from_secs(3), "the drain ends when the last request does");
    for c in inflight {
        let o = c.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "200", "a request in flight completed");
    }
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "nothing is accepted after the drain");
}
