//! The proxy between real peers: curl (HTTP/1.1 keep-alive) and nghttp (HTTP/2 with prior
//! knowledge) as clients, nginx as the upstreams, all on loopback. (curl 7.88's own HTTP/2
//! prior-knowledge mode fails its second request on a reused connection, against nginx as
//! well: "Error in the HTTP2 framing layer"; nghttp2's client does not.)

mod common;

use common::{free_port, nginx, proxy, Nginx};
use std::process::Command;
use std::time::Duration;

/// curl with `args`, fetching `url` `n` times on one connection; the bodies, in order.
fn curl(args: &[&str], url: &str, n: usize) -> Vec<String> {
    let mut c = Command::new("curl");
    c.args(["-sS", "--max-time", "10", "-H", "Host: shop.example"]).args(args);
    for _ in 0..n {
        c.arg(url);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().lines().map(String::from).collect()
}

/// nghttp (nghttp2-client) fetching `url` `n` times as streams of one HTTP/2 connection.
fn nghttp(url: &str, n: usize) -> Vec<String> {
    let mut c = Command::new("nghttp");
    c.args(["-H", ":authority: shop.example", "-t", "10"]);
    // (Distinct URIs: nghttp fetches a repeated one once.)
    for i in 0..n {
        c.arg(format!("{url}?n={i}"));
    }
    let o = c.output().expect("nghttp (apt-get install nghttp2-client)");
    assert!(o.status.success(), "nghttp: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().lines().map(String::from).collect()
}

fn count(lines: &[String], name: &str) -> usize {
    lines.iter().filter(|l| l.starts_with(&format!("{name} "))).count()
}

#[test]
fn requests_on_one_connection_spread_over_every_endpoint_http1_and_h2c() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-{}", std::process::id()));
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let _ng: Vec<Nginx> = ports.iter().enumerate().map(|(i, p)| nginx(&dir, &format!("be{}", i + 1), *p)).collect();
    let dead = free_port();
    let eps: Vec<String> = ports.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let _ = std::fs::remove_file(&log);
    let addr = proxy(&format!(
        r#"
access_log = "{}"

[[listeners]]
name = "web"
address = "127.0.0.1:0"

[[routes]]
path_prefix = "/shop"
cluster = "shop"

[[routes]]
path_prefix = "/flaky"
cluster = "flaky"

[[clusters]]
name = "shop"
endpoints = [{}]

[[clusters]]
name = "flaky"
endpoints = ["127.0.0.1:{dead}", "127.0.0.1:{}"]
connect_timeout = 0.5

[[routes]]
path_prefix = "/gone"
cluster = "gone"

[[clusters]]
name = "gone"
endpoints = ["127.0.0.1:{dead}"]
connect_timeout = 0.5
"#,
        log.display(),
        eps.join(", "),
        ports[0]
    ));
    let url = format!("http://{addr}/shop/item");
    // HTTP/1.1: 30 requests on one keep-alive connection reach all three (round robin).
    let h1 = curl(&["--http1.1"], &url, 30);
    assert_eq!(h1.len(), 30, "{h1:?}");
    for be in ["be1", "be2", "be3"] {
        assert_eq!(count(&h1, be), 10, "{be}: {h1:?}");
    }
    assert!(h1[0].contains("host=shop.example") && h1[0].contains("xff=127.0.0.1"), "{}", h1[0]);
    // HTTP/2 with prior knowledge: the streams of one connection spread the same way, and
    // the :authority becomes the upstream's Host.
    let h2 = nghttp(&url, 30);
    assert_eq!(h2.len(), 30, "{h2:?}");
    for be in ["be1", "be2", "be3"] {
        assert_eq!(count(&h2, be), 10, "{be}: {h2:?}");
    }
    assert!(h2.iter().all(|l| l.contains("host=shop.example")), "{h2:?}");
    // A refused connection is retried once on another endpoint; with none left, a 503.
    let t = std::time::Instant::now();
    let flaky = curl(&[], &format!("http://{addr}/flaky"), 4);
    assert!(flaky.len() == 4 && flaky.iter().all(|l| l.starts_with("be1 ")), "{flaky:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "the retries took {:?}", t.elapsed());
    let none = curl(&["-o", "/dev/null", "-w", "%{http_code}\n"], &format!("http://{addr}/other"), 1);
    assert_eq!(none, ["404"]);
    let gone = curl(&["-o", "/dev/null", "-w", "%{http_code}\n"], &format!("http://{addr}/gone"), 1);
    assert_eq!(gone, ["503"]);
    // The access log: one JSON line per request (66), written in the background.
    let mut lines = Vec::new();
    for _ in 0..50 {
        lines = std::fs::read_to_string(&log).unwrap_or_default().lines().map(String::from).collect();
        if lines.len() >= 66 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lines.len(), 66, "{lines:?}");
    let v: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let first = &v[0];
    assert_eq!(
        (first["listener"].as_str(), first["method"].as_str(), first["path"].as_str(), first["protocol"].as_str()),
        (Some("web"), Some("GET"), Some("/shop/item"), Some("HTTP/1.1"))
    );
    assert_eq!(first["status"], 200);
    assert!(first["upstream"].as_str().unwrap().starts_with("127.0.0.1:") && first["duration_ms"].as_f64().unwrap() >= 0.0);
    assert!(v.iter().any(|e| e["protocol"] == "HTTP/2" && e["authority"] == "shop.example"));
    assert!(v.iter().any(|e| e["status"] == 404 && e["upstream"].is_null()));
    assert!(v.iter().any(|e| e["status"] == 503 && e["path"] == "/gone"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_endpoint_that_fails_its_health_check_takes_no_requests_until_it_passes_again() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-health-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut ng: Vec<Option<Nginx>> = ["be1", "be2", "be3"].iter().zip(&ports).map(|(n, p)| Some(nginx(&dir, n, *p))).collect();
    let (addrs, p) = common::proxy_with(&format!(
        "[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:0\"\n[[routes]]\ncluster = \"web\"\n\
         [[clusters]]\nname = \"web\"\nendpoints = [\"127.0.0.1:{}\", \"127.0.0.1:{}\", \"127.0.0.1:{}\"]\n\
         health = {{ kind = \"http\", path = \"/\", interval = 0.1, timeout = 0.1, rise = 2, fall = 2 }}\n",
        ports[0], ports[1], ports[2]
    ));
    let url = format!("http://{}/", addrs[0]);
    let healthy = |i: usize| p.clusters[0].stats[i].healthy.load(std::sync::atomic::Ordering::Relaxed);
    let wait = |want: bool| {
        for _ in 0..50 {
            if healthy(1) == want {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("be2 still healthy={}", !want);
    };
    // be2 stops: after two failed checks (about 0.2 s) it is out.
    drop(ng[1].take());
    wait(false);
    let lines = curl(&[], &url, 30);
    assert_eq!(lines.len(), 30, "no request failed: {lines:?}");
    assert_eq!(count(&lines, "be2"), 0);
    assert_eq!(count(&lines, "be1") + count(&lines, "be3"), 30);
    let failures = p.clusters[0].stats[1].health_failures.load(std::sync::atomic::Ordering::Relaxed);
    assert!(failures >= 2);
    let m = vectorlb_proxy::admin::metrics(&p);
    assert!(m.contains(&format!("vectorlb_proxy_upstream_healthy{{cluster=\"web\",endpoint=\"127.0.0.1:{}\"}} 0", ports[1])), "{m}");
    // It comes back: after two good checks it takes its share again.
    ng[1] = Some(nginx(&dir, "be2", ports[1]));
    wait(true);
    let lines = curl(&[], &url, 30);
    assert_eq!(count(&lines, "be2"), 10, "{lines:?}");
    drop(ng);
    let _ = std::fs::remove_dir_all(&dir);
}
