//! Static objects through the dispatch pool, with curl as the client: bodies and headers, bad
//! paths, the class from the query / header / size, and back-pressure (a full class queue
//! answers 503 at once; an item that waited past max_wait answers 503) while the pool's only
//! thread is held by a job of the test's own.

mod common;

use common::proxy_with;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// curl's status code and body for `path`.
fn get(addr: SocketAddr, path: &str, args: &[&str]) -> (u16, Vec<u8>) {
    let o =
        Command::new("curl").args(["-sS", "--path-as-is", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"]).args(args).arg(format!("http://{addr}{path}")).output().unwrap();
    assert!(o.status.success(), "curl {path}: {}", String::from_utf8_lossy(&o.stderr));
    let out = o.stdout;
    let nl = out.iter().rposition(|b| *b == b'\n').unwrap();
    (String::from_utf8_lossy(&out[nl + 1..]).parse().unwrap(), out[..nl].to_vec())
}

fn objects_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vectorlb-objects-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    dir
}

/// The `[dispatch]` lines that select a backend: the software queue, or the event device
/// through DPDK's `event_sw` (every test below runs on both).
const SOFTWARE: &str = "";
const EVENT_SW: &str = "backend = \"eventdev\"\neventdev = \"event_sw\"";

#[test]
fn objects_are_served_by_class_and_bad_paths_refused() {
    serve_by_class(SOFTWARE);
}

#[test]
fn objects_are_served_by_class_and_bad_paths_refused_event_sw() {
    serve_by_class(EVENT_SW);
}

fn serve_by_class(backend: &str) {
    let dir = objects_dir(if backend.is_empty() { "serve" } else { "serve-ev" });
    let small: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 13 + i / 256) as u8).collect();
    std::fs::write(dir.join("small.bin"), &small).unwrap();
    std::fs::write(dir.join("sub/big.bin"), &big).unwrap();
    std::fs::write(dir.join("page.html"), "<p>hi</p>").unwrap();
    std::fs::write(dir.join("four.bin"), vec![7u8; 4096]).unwrap();
    let (addrs, p) = proxy_with(&format!(
        r#"
[dispatch]
{backend}
workers = 2
queue_limit = 500
classes = [{{ name = "high" }}, {{ name = "mid", share = 10 }}, {{ name = "low", share = 5 }}]

[[listeners]]
name = "web"
address = "127.0.0.1:0"

[[routes]]
path_prefix = "/o/"
static = {{ root = "{}", max_bytes = 150000 }}
priority = {{ query = "prio", header = "x-priority", sizes = [{{ up_to = 2048, class = "high" }}] }}
"#,
        dir.display()
    ));
    let want_backend = if backend.is_empty() { "software" } else { "eventdev" };
    let addr = addrs[0];
    assert_eq!(get(addr, "/o/small.bin", &[]), (200, small.clone()));
    // Larger than max_bytes: refused, not truncated.
    assert_eq!(get(addr, "/o/sub/big.bin", &[]).0, 500);
    let o = Command::new("curl").args(["-sS", "-I", &format!("http://{addr}/o/page.html")]).output().unwrap();
    let head = String::from_utf8_lossy(&o.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200") && head.contains("content-length: 9") && head.contains("content-type: text/html"), "{head}");
    for (path, status) in [("/o/../../etc/passwd", 400), ("/o/sub/../small.bin", 400), ("/o/%2e%2e/x", 400), ("/o/", 400), ("/o/missing", 404), ("/o/sub", 404)] {
        assert_eq!(get(addr, path, &[]).0, status, "{path}");
    }
    assert_eq!(get(addr, "/o/small.bin", &["-X", "POST"]).0, 405);
    // Classes: size (up to 2 KiB: high), query, header (the query first), else the least
    // urgent (four.bin: 4 KiB).
    let d = p.dispatch.as_ref().unwrap();
    let served = |c: usize| d.class_stats()[c].served.load(Ordering::Relaxed);
    let before = [served(0), served(1), served(2)];
    get(addr, "/o/small.bin", &[]);
    get(addr, "/o/page.html?prio=mid", &[]);
    get(addr, "/o/page.html", &["-H", "x-priority: 1"]);
    get(addr, "/o/page.html?prio=2", &["-H", "x-priority: 0"]);
    assert_eq!(get(addr, "/o/four.bin", &[]), (200, vec![7u8; 4096]));
    assert_eq!([served(0) - before[0], served(1) - before[1], served(2) - before[2]], [1, 2, 2]);
    // The same in the metrics and the stats.
    let m = vectorlb_proxy::admin::metrics(&p);
    for c in ["high", "mid", "low"] {
        let i = ["high", "mid", "low"].iter().position(|x| *x == c).unwrap();
        let line = format!("vectorlb_proxy_dispatch_items_total{{class=\"{c}\",outcome=\"served\"}} {}", served(i));
        assert!(m.contains(&line), "{line} not in:\n{m}");
        assert!(m.contains(&format!("vectorlb_proxy_dispatch_queue_depth{{class=\"{c}\"}} 0")));
        assert!(m.contains(&format!("vectorlb_proxy_dispatch_wait_seconds_count{{class=\"{c}\"}} {}", served(i))));
    }
    assert!(m.contains("vectorlb_proxy_dispatch_busy_seconds_total{worker=\"1\"}"));
    let st = serde_json::to_value(vectorlb_proxy::admin::stats(&p)).unwrap();
    assert_eq!(st["dispatch"]["mode"], "priority");
    assert_eq!(st["dispatch"]["backend"], want_backend);
    assert_eq!(st["dispatch"]["classes"][1]["name"], "mid");
    assert_eq!(st["dispatch"]["classes"][1]["served"], served(1));
    assert_eq!(st["dispatch"]["workers"].as_array().unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_queue_answers_503_at_once_and_stale_items_expire() {
    full_queue_and_expiry(SOFTWARE);
}

#[test]
fn a_full_queue_answers_503_at_once_and_stale_items_expire_event_sw() {
    full_queue_and_expiry(EVENT_SW);
}

fn full_queue_and_expiry(backend: &str) {
    let dir = objects_dir(if backend.is_empty() { "full" } else { "full-ev" });
    std::fs::write(dir.join("a.txt"), "a").unwrap();
    // A named pipe under the root is opened without waiting for a writer: 404, no thread held.
    assert!(Command::new("mkfifo").arg(dir.join("pipe")).status().unwrap().success());
    let (addrs, p) = proxy_with(&format!(
        r#"
[dispatch]
{backend}
workers = 1
queue_limit = 2
max_wait = 0.3

[[listeners]]
name = "web"
address = "127.0.0.1:0"

[[routes]]
path_prefix = "/o/"
static = {{ root = "{}" }}
"#,
        dir.display()
    ));
    let addr = addrs[0];
    let t = Instant::now();
    assert_eq!(get(addr, "/o/pipe", &[]).0, 404);
    assert!(t.elapsed() < Duration::from_secs(2));
    let d = p.dispatch.as_ref().unwrap().clone();
    // Hold the only pool thread with a job of our own.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (started, running) = std::sync::mpsc::channel();
    d.submit(0, move |_| {
        started.send(()).unwrap();
        let _ = held.recv();
    })
    .unwrap();
    running.recv().unwrap();
    // Two requests wait (the queue's limit); the third is refused at once.
    let waiting: Vec<_> = (0..2).map(|_| std::thread::spawn(move || get(addr, "/o/a.txt", &[]))).collect();
    while d.depths()[0] < 2 {
        assert!(t.elapsed() < Duration::from_secs(5), "the waiting requests never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let t3 = Instant::now();
    let (status, body) = get(addr, "/o/a.txt", &[]);
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(t3.elapsed() < Duration::from_secs(1), "the refusal waited {:?}", t3.elapsed());
    assert_eq!(d.class_stats()[0].rejected_full.load(Ordering::Relaxed), 1);
    // Past max_wait, release the thread: the two waiting ones expire (503).
    std::thread::sleep(Duration::from_millis(500));
    release.send(()).unwrap();
    for w in waiting {
        assert_eq!(w.join().unwrap().0, 503);
    }
    assert_eq!(d.class_stats()[0].expired.load(Ordering::Relaxed), 2);
    // And the pool serves again.
    assert_eq!(get(addr, "/o/a.txt", &[]), (200, b"a".to_vec()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn large_objects_stream_and_a_stalled_client_holds_no_thread() {
    stream_and_stall(SOFTWARE);
}

#[test]
fn large_objects_stream_and_a_stalled_client_holds_no_thread_event_sw() {
    stream_and_stall(EVENT_SW);
}

fn stream_and_stall(backend: &str) {
    let dir = objects_dir(if backend.is_empty() { "stream" } else { "stream-ev" });
    let big: Vec<u8> = (0..24_000_000u32).map(|i| (i ^ (i >> 11)) as u8).collect();
    std::fs::write(dir.join("big.bin"), &big).unwrap();
    std::fs::write(dir.join("a.txt"), "a").unwrap();
    let (addrs, p) = proxy_with(&format!(
        r#"
[dispatch]
{backend}
workers = 1

[[listeners]]
name = "web"
address = "127.0.0.1:0"

[[routes]]
path_prefix = "/o/"
static = {{ root = "{0}", max_bytes = 100000000 }}

[[routes]]
path_prefix = "/d/"
static = {{ root = "{0}", max_bytes = 100000000, direct_io = true }}
"#,
        dir.display()
    ));
    let addr = addrs[0];
    // Through the page cache and past it (O_DIRECT; the size is not a multiple of a block).
    for prefix in ["/o/", "/d/"] {
        let (status, body) = get(addr, &format!("{prefix}big.bin"), &[]);
        assert_eq!(status, 200);
        assert!(body == big, "{prefix}: the streamed body differs ({} bytes of {})", body.len(), big.len());
    }
    assert_eq!(get(addr, "/d/a.txt", &[]), (200, b"a".to_vec()));
    // A client that asks for the object and reads nothing: the socket buffers fill and no
    // further chunk is read for it; the only pool thread serves others at once.
    use std::io::Write;
    let mut stalled = std::net::TcpStream::connect(addr).unwrap();
    stalled.write_all(b"GET /o/big.bin HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let d = p.dispatch.as_ref().unwrap();
    let t = Instant::now();
    while d.class_stats()[0].submitted.load(Ordering::Relaxed) < 4 {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    assert_eq!(get(addr, "/o/a.txt", &[]), (200, b"a".to_vec()));
    let waited = t.elapsed();
    assert!(waited < Duration::from_secs(1), "the next request waited {waited:?}");
    drop(stalled);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reuseport_lets_two_proxies_share_a_port_and_only_then() {
    let dir = objects_dir("reuseport");
    std::fs::write(dir.join("a.txt"), "a").unwrap();
    let port = common::free_port();
    let cfg = |reuse: bool| {
        format!(
            "[dispatch]\nmode = \"inline\"\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\nreuseport = {reuse}\n[[routes]]\npath_prefix = \"/o/\"\nstatic = {{ root = \"{}\" }}\n",
            dir.display()
        )
    };
    let (a, pa) = proxy_with(&cfg(true));
    let (_, pb) = proxy_with(&cfg(true));
    for _ in 0..20 {
        assert_eq!(get(a[0], "/o/a.txt", &[]), (200, b"a".to_vec()));
    }
    let served = |p: &vectorlb_proxy::serve::Proxy| p.dispatch.as_ref().unwrap().class_stats()[0].served.load(Ordering::Relaxed);
    assert_eq!(served(&pa) + served(&pb), 20, "inline mode serves every request on its connection's thread");
    // Without reuseport the port is taken: the start fails, naming the listener.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let c = vectorlb_proxy::Config::parse(&cfg(false)).unwrap();
    let e = rt.block_on(vectorlb_proxy::serve::bind(&c)).err().expect("a second bind without reuseport must fail").to_string();
    assert!(e.contains("listeners[0] (web): cannot listen on"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reload_keeps_the_dispatch_pool_unless_its_configuration_changes() {
    use vectorlb_proxy::serve::Proxy;
    let text = |threads: usize| format!("[dispatch]\nworkers = {threads}\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:0\"\n[[routes]]\nstatic = {{ root = \"/srv\" }}\n");
    let old = Proxy::new(vectorlb_proxy::Config::parse(&text(2)).unwrap()).unwrap();
    let same = Proxy::reusing(vectorlb_proxy::Config::parse(&text(2)).unwrap(), Some(&old)).unwrap();
    assert!(std::sync::Arc::ptr_eq(old.dispatch.as_ref().unwrap(), same.dispatch.as_ref().unwrap()));
    let other = Proxy::reusing(vectorlb_proxy::Config::parse(&text(3)).unwrap(), Some(&old)).unwrap();
    assert!(!std::sync::Arc::ptr_eq(old.dispatch.as_ref().unwrap(), other.dispatch.as_ref().unwrap()));
    assert_eq!(other.dispatch.as_ref().unwrap().worker_stats().len(), 3);
}
