//! Reload and drain under load, with h2load and curl (not written here) as the clients.
//! * Reloads while h2load runs keep-alive connections and new connections: no request fails,
//!   the new configuration answers afterwards, a new listener starts, a bad file is refused
//!   whole and the running configuration stays.
//! * The drain: requests in flight when the stop comes all complete; then nothing is accepted.
//! * A configuration pushed through `PUT /v1/config` (as `vectorlb kube` does for a Gateway):
//!   served at once, kept in the file, refused whole when bad; its routes split by weight,
//!   match exact paths, segments and several headers, and edit headers (curl and nginx).

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

/// The proxy serving the file at `path` (which reloads read).
fn from_file(rt: &tokio::runtime::Runtime, path: &std::path::Path) -> Arc<vectorlb_proxy::serve::Current> {
    rt.block_on(async {
        let p = Arc::new(Proxy::new(Config::load(path).unwrap()).unwrap());
        let b = bind(&p.config).await.unwrap();
        start(p, b, Some(path.to_path_buf()))
    })
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
    let cur = from_file(&rt, &path);
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

fn curl(args: &[&str]) -> (u16, String, String) {
    let o = Command::new("curl").args(["-sS", "--max-time", "5", "-D", "-"]).args(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.split_whitespace().nth(1).unwrap().parse().unwrap(), head.to_ascii_lowercase(), body.to_string())
}

#[test]
fn a_pushed_configuration_is_served_kept_and_refused_whole_when_bad() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-put-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("proxy.toml");
    let (port, tls_port, pa, pb) = (free_port(), free_port(), free_port(), free_port());
    let (_a, _b) = (common::nginx(&dir, "a", pa), common::nginx(&dir, "b", pb));
    std::fs::write(&path, config(port, "A", None)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cur = from_file(&rt, &path);
    assert_eq!(get(port), "A");
    assert_eq!(cur.config_digest(), vectorlb_proxy::serve::digest(&std::fs::read_to_string(&path).unwrap()));
    let (crt, key) = common::cert(&dir, "shop.example", &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]);
    let text = format!(
        r#"[[listeners]]
name = "web"
address = "127.0.0.1:{port}"
[[listeners]]
name = "tls"
address = "127.0.0.1:{tls_port}"
tls = {{ certificates = [{{ cert_pem = '''{}''', key_pem = '''{}''' }}] }}
[[routes]]
path_exact = "/exact"
respond = {{ status = 200, body = "exact" }}
[[routes]]
path_segments = "/app"
headers = [{{ name = "x-a", value = "1" }}, {{ name = "x-b", value = "2" }}]
cluster = "b"
request_headers = {{ set = [{{ name = "x-env", value = "prod" }}] }}
response_headers = {{ add = [{{ name = "x-served-by", value = "vectorlb" }}] }}
[[routes]]
path_segments = "/app"
clusters = [{{ name = "a", weight = 3 }}, {{ name = "b", weight = 1 }}]
[[routes]]
path_prefix = "/broken"
clusters = [{{ weight = 1 }}]
[[clusters]]
name = "a"
endpoints = ["127.0.0.1:{pa}"]
[[clusters]]
name = "b"
endpoints = ["127.0.0.1:{pb}"]
"#,
        std::fs::read_to_string(&crt).unwrap(),
        std::fs::read_to_string(&key).unwrap(),
    );
    rt.block_on(cur.put_config(text.clone())).unwrap();
    assert_eq!(cur.config_digest(), vectorlb_proxy::serve::digest(&text));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "kept in the file");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "it holds a private key");
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    assert_eq!(curl(&[&url("/exact")]).2, "exact");
    assert_eq!(curl(&[&url("/exact/")]).0, 404, "exact means exact");
    assert_eq!(curl(&[&url("/apps")]).0, 404, "whole segments: /apps is not /app");
    // Both headers: cluster b, with the request header set and the response header added.
    let (status, head, body) = curl(&["-H", "x-a: 1", "-H", "x-b: 2", "-H", "x-env: dev", &url("/app/x")]);
    assert_eq!(status, 200);
    assert!(body.starts_with("b ") && body.contains("env=prod"), "{body}");
    assert!(head.contains("x-served-by: vectorlb"), "{head}");
    // One of the two headers: the weighted split, 3 to 1.
    let mut n = [0u32; 2];
    for _ in 0..200 {
        let (_, _, body) = curl(&["-H", "x-a: 1", &url("/app")]);
        n[usize::from(body.starts_with("b "))] += 1;
    }
    assert!((120..=175).contains(&n[0]), "3:1 over 200 requests: {n:?}");
    assert_eq!(curl(&[&url("/broken")]).0, 500, "an unresolved backend answers 500");
    // The TLS listener serves the inline certificate.
    let (status, _, _) = curl(&["--cacert", &crt, "--resolve", &format!("shop.example:{tls_port}:127.0.0.1"), &format!("https://shop.example:{tls_port}/exact")]);
    assert_eq!(status, 200);
    // A bad configuration changes nothing, in force or on disk.
    let bad = text.replace("weight = 3", "weight = 3000000");
    let e = rt.block_on(cur.put_config(bad)).unwrap_err();
    assert!(e.contains("routes[2].clusters[0].weight"), "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    assert_eq!(cur.config_digest(), vectorlb_proxy::serve::digest(&text));
    assert_eq!(curl(&[&url("/exact")]).2, "exact");
    let broken_key = text.replace("-----BEGIN PRIVATE KEY-----\n", "-----BEGIN PRIVATE KEY-----\nAAAA");
    assert_ne!(broken_key, text);
    let e = rt.block_on(cur.put_config(broken_key)).unwrap_err();
    assert!(e.contains("listeners[1].tls.certificates[0].key") && e.contains("(inline PEM)"), "{e}");
    assert!(!e.contains("BEGIN"), "no key material in messages: {e}");
    let left = std::fs::read_dir(&dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".new.")).count();
    assert_eq!(left, 0, "no temporary file left");
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}
