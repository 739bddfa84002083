//! What the proxy's attack tests share: the `vectorlb` process under test, an upstream that
//! counts what reaches it, clients (curl, raw HTTP/1.1, h2c), and the proxy's statistics.

// Each test file uses a part of this.
#![allow(dead_code)]

use bytes::Bytes;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The tests below load the machine (thousands of sockets, timing): one at a time.
static ONE: Mutex<()> = Mutex::new(());

pub fn one() -> std::sync::MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn bin() -> String {
    std::env::var("VECTORLB_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_vectorlb").to_string())
}

pub fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vectorlb-attack-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// This process's own descriptor limit raised to its hard limit (the attacks open thousands).
pub fn raise_own_nofile() {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct owned by this frame.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// A `vectorlb` process (proxy or daemon) with its log in a file; stopped when dropped.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// `vectorlb ARGS`, optionally with its descriptor limit (soft and hard) set to `nofile`.
    pub fn spawn(args: &[&str], log: PathBuf, nofile: Option<u64>) -> Proc {
        let mut c = Command::new(bin());
        c.args(args).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
        if let Some(n) = nofile {
            // SAFETY: setrlimit is async-signal-safe and only touches the child being started.
            unsafe {
                c.pre_exec(move || {
                    let r = libc::rlimit { rlim_cur: n, rlim_max: n };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        Proc { child: c.spawn().unwrap(), log }
    }

    pub fn proxy(dir: &Path, config: &str, nofile: Option<u64>) -> Proc {
        let path = dir.join("proxy.toml");
        std::fs::write(&path, config).unwrap();
        Proc::spawn(&["proxy", "--config", path.to_str().unwrap()], dir.join("proxy.log"), nofile)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics, with the exit status and the log, if the process has ended.
    pub fn assert_alive(&mut self, after: &str) {
        if let Some(s) = self.child.try_wait().unwrap() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!("vectorlb ended after {after}: {s} (signal {:?})\n{}", std::os::unix::process::ExitStatusExt::signal(&s), tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
    }

    /// Waits for the process to end by itself (a refused start); its status.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let t = Instant::now();
        while t.elapsed() < within {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn rss_kb(&self) -> u64 {
        rss_kb(self.child.id())
    }
}

pub fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(12) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_tcp(port: u16) {
    for _ in 0..250 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {port}");
}

pub fn wait_unix(p: &Path) {
    for _ in 0..250 {
        if std::os::unix::net::UnixStream::connect(p).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {}", p.display());
}

/// curl's status and body (`args` before the URL), or its error.
pub fn curl(args: &[&str], url: &str) -> Result<(u16, String), String> {
    let o = Command::new("curl").args(["-sS", "--max-time", "5", "-o", "-", "-w", "\n%{http_code}"]).args(args).arg(url).output().unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
    }
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let (body, code) = out.rsplit_once('\n').unwrap();
    Ok((code.parse().unwrap(), body.to_string()))
}

/// The proxy's stats from its admin socket.
pub fn stats(admin: &Path) -> serde_json::Value {
    let o = Command::new("curl").args(["-sS", "--max-time", "5", "--unix-socket", admin.to_str().unwrap(), "http://x/v1/stats"]).output().unwrap();
    assert!(o.status.success(), "stats: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stats: {e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// A raw HTTP/1.1 exchange: sends `req`, reads until the server closes (or 5 s); the status.
pub fn raw(port: u16, req: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text)
}

// ---- an upstream written for the tests (hyper), counting its connections -----------------

#[derive(Default)]
pub struct Counts {
    pub accepted: AtomicUsize,
    pub open: AtomicUsize,
    pub max_open: AtomicUsize,
    pub requests: AtomicUsize,
    /// Requests being answered now, and the most at once.
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    /// The Host of the last request.
    pub last_host: Mutex<String>,
}

impl Counts {
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

pub struct Upstream {
    pub port: u16,
    pub counts: Arc<Counts>,
    _rt: tokio::runtime::Runtime,
}

pub const BIG: usize = 1 << 20;
pub const HUGE: usize = 10 << 20;

/// The body of `/huge`: 10 MiB that no shift or truncation leaves equal.
pub fn huge() -> Bytes {
    static HUGE_BODY: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    HUGE_BODY.get_or_init(|| Bytes::from((0..HUGE).map(|i| ((i * 131 + i / 65536) % 251) as u8).collect::<Vec<u8>>())).clone()
}

/// An HTTP/1.1 upstream: `/big` answers 1 MiB, `/huge` 10 MiB ([`huge`]), `/sleep/MS` waits MS
/// ms first, anything else `host=<Host> body=<length>` after reading the whole request body.
pub fn upstream() -> Upstream {
    use http_body_util::BodyExt;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let counts = Arc::new(Counts::default());
    let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = l.local_addr().unwrap().port();
    let c = counts.clone();
    rt.spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { continue };
            let c = c.clone();
            c.accepted.fetch_add(1, Ordering::SeqCst);
            let n = c.open.fetch_add(1, Ordering::SeqCst) + 1;
            c.max_open.fetch_max(n, Ordering::SeqCst);
            tokio::spawn(async move {
                let cc = c.clone();
                let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let c = cc.clone();
                    async move {
                        c.requests.fetch_add(1, Ordering::SeqCst);
                        let n = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        c.max_in_flight.fetch_max(n, Ordering::SeqCst);
                        let host = req.headers().get_all("host").iter().map(|h| String::from_utf8_lossy(h.as_bytes()).to_string()).collect::<Vec<_>>().join(",");
                        *c.last_host.lock().unwrap() = host.clone();
                        let path = req.uri().path().to_string();
                        if let Some(ms) = path.strip_prefix("/sleep/").and_then(|m| m.parse().ok()) {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        let body = req.into_body().collect().await.map(|b| b.to_bytes().len());
                        let out = match path.as_str() {
                            "/big" => Bytes::from(vec![b'x'; BIG]),
                            "/huge" => huge(),
                            _ => Bytes::from(format!("host={host} body={}", body.map(|n| n.to_string()).unwrap_or_else(|e| format!("error {e}")))),
                        };
                        c.in_flight.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(out)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(s), svc).await;
                c.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Upstream { port, counts, _rt: rt }
}

/// A proxy (2 workers, an admin socket) whose listener `web` forwards everything to cluster
/// `up` on an [`upstream`]: `top`, `listener` and `cluster` are more lines of the file's top,
/// the listener and the cluster. Started and answering when returned.
pub struct Setup {
    pub dir: PathBuf,
    pub up: Upstream,
    pub port: u16,
    pub admin: PathBuf,
    pub p: Proc,
}

pub fn proxy_to_upstream(tag: &str, top: &str, listener: &str, cluster: &str) -> Setup {
    let dir = tmp(tag);
    let up = upstream();
    let port = free_port();
    let admin = dir.join("admin.sock");
    let p = Proc::proxy(
        &dir,
        &format!(
            "{top}\nworkers = 2\n[admin]\naddress = \"unix:{}\"\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n{listener}\n\
             [[routes]]\ncluster = \"up\"\n[[clusters]]\nname = \"up\"\nendpoints = [\"127.0.0.1:{}\"]\n{cluster}\n",
            admin.display(),
            up.port
        ),
        None,
    );
    wait_tcp(port);
    wait_unix(&admin);
    Setup { dir, up, port, admin, p }
}

/// h2c: the preface, an empty SETTINGS and one HEADERS frame (GET `path`, end of stream) for
/// `authority`, with `extra` literal headers.
pub fn h2c_request(authority: &str, path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    let lit = |b: &mut Vec<u8>, name: &str, value: &str| {
        // Literal without indexing, new name; lengths below 127, no Huffman coding.
        b.push(0x00);
        b.push(name.len() as u8);
        b.extend_from_slice(name.as_bytes());
        b.push(value.len() as u8);
        b.extend_from_slice(value.as_bytes());
    };
    lit(&mut block, ":path", path);
    lit(&mut block, ":authority", authority);
    for (n, v) in extra {
        lit(&mut block, n, v);
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    let len = block.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, 1, 0x5, 0, 0, 0, 1]); // HEADERS, END_STREAM|END_HEADERS, stream 1
    out.extend_from_slice(&block);
    out
}

/// The status of `GET uri` over h2c (prior knowledge) from the h2 crate's client; None when
/// the stream or the connection failed first.
pub fn h2_status(port: u16, uri: &str) -> Option<u16> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let (client, conn) = h2::client::handshake(tcp).await.ok()?;
        tokio::spawn(conn);
        let mut client = client.ready().await.ok()?;
        let (resp, _) = client.send_request(http::Request::get(uri).body(()).unwrap(), true).ok()?;
        Some(tokio::time::timeout(Duration::from_secs(5), resp).await.ok()?.ok()?.status().as_u16())
    })
}

/// An HTTP/2 HEADERS frame on `stream` (GET `path` for `authority`, END_STREAM), its header
/// block literal without Huffman coding.
pub fn h2_headers_frame(stream: u32, authority: &str, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    for (name, value) in [(":path", path), (":authority", authority)] {
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    let len = block.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, 1, 0x5];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(&block);
    out
}

/// An HTTP/2 RST_STREAM frame (CANCEL) on `stream`.
pub fn h2_reset_frame(stream: u32) -> Vec<u8> {
    let mut out = vec![0, 0, 4, 3, 0];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(&8u32.to_be_bytes());
    out
}

/// The `:status` of stream 1 in an h2c exchange (reads frames until its HEADERS or 5 s), or
/// None when the connection ended first.
pub fn h2c_status(port: u16, req: &[u8]) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req).unwrap();
    let mut dec = Vec::new();
    let mut head = [0u8; 9];
    loop {
        s.read_exact(&mut head).ok()?;
        let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).ok()?;
        let stream = u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]);
        if head[3] == 4 && head[4] & 1 == 0 {
            s.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).ok()?; // SETTINGS ACK
        }
        if head[3] == 1 && stream == 1 {
            dec.extend_from_slice(&payload);
            // :status is the first field: an indexed static entry (8-14) or a literal.
            let b = *dec.first()?;
            // Indexed static entries only (the statuses these tests expect all have one).
            return match b {
                0x88 => Some(200),
                0x89 => Some(204),
                0x8c => Some(400),
                0x8d => Some(404),
                0x8e => Some(500),
                _ => Some(0),
            };
        }
        if head[3] == 3 && stream == 1 || head[3] == 7 {
            return None; // RST_STREAM or GOAWAY
        }
    }
}

pub fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    self_signed_for(dir, "t.test")
}

/// An ECDSA P-256 certificate for `name` (CN and DNS name) and its key, in `dir`.
pub fn self_signed_for(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (c, k) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    let o = Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "2", "-subj", &format!("/CN={name}"), "-addext", &format!("subjectAltName=DNS:{name}")])
        .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout"])
        .arg(&k)
        .arg("-out")
        .arg(&c)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (c, k)
}

/// `n` HTTP/2 clients (prior knowledge) that advertise a zero stream window, each opening
/// `streams` requests for `/big` and never reading.
pub async fn zero_window_clients(port: u16, n: usize, streams: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let mut held = Vec::new();
    for _ in 0..n {
        let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { continue };
        let Ok((client, conn)) = h2::client::Builder::new().initial_window_size(0).handshake::<_, Bytes>(tcp).await else { continue };
        held.push(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let mut client = client;
        for _ in 0..streams {
            let Ok(c) = client.clone().ready().await else { break };
            client = c;
            let req = http::Request::get(format!("http://public.example:{port}/big")).body(()).unwrap();
            let Ok((resp, _)) = client.send_request(req, true) else { break };
            // Hold the response (never read its body, so never open the window).
            held.push(tokio::spawn(async move {
                if let Ok(r) = resp.await {
                    let body = r.into_body();
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    drop(body);
                }
            }));
        }
    }
    held
}

pub async fn futures_join<T>(hs: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for h in hs {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}
