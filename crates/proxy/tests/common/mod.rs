//! Helpers of the proxy's tests: nginx upstreams and the proxy on loopback.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;
use vectorlb_proxy::serve::{bind, serve, Proxy};
use vectorlb_proxy::Config;

pub struct Nginx {
    child: Child,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers at once (SIGKILL would orphan them).
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

/// A self-signed certificate for `name` with a key made by `newkey` (openssl req arguments).
pub fn cert(dir: &std::path::Path, name: &str, newkey: &[&str]) -> (String, String) {
    let (c, k) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    let mut args = vec!["req", "-x509", "-nodes", "-days", "2", "-subj"];
    let subj = format!("/CN={name}");
    let san = format!("subjectAltName=DNS:{name}");
    args.extend([subj.as_str(), "-addext", san.as_str()]);
    args.extend_from_slice(newkey);
    args.extend(["-keyout", k.to_str().unwrap(), "-out", c.to_str().unwrap()]);
    let o = Command::new("openssl").args(&args).output().unwrap();
    assert!(o.status.success(), "openssl req: {}", String::from_utf8_lossy(&o.stderr));
    (c.display().to_string(), k.display().to_string())
}

/// A port free now, below the kernel's ephemeral range (32768 and up by default): a port
/// from that range, free when asked, may meanwhile become the source port of one of the
/// thousands of client connections a load test opens, and a listener on it then fails with
/// "Address already in use" (seen in CI).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread over 20000-32000 by process, stepping within the process.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 1000) as u16 * 12;
    for _ in 0..12_000 {
        let port = 20_000 + (base - 20_000 + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// nginx on 127.0.0.1:`port`, answering with its name, the Host, X-Forwarded-For and X-Env it got.
pub fn nginx(dir: &std::path::Path, name: &str, port: u16) -> Nginx {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let d = d.display();
    let conf = format!(
        "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\n\
         http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n fastcgi_temp_path {d}/fcgi;\n\
         uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n default_type text/plain;\n keepalive_requests 10000;\n\
         server {{\n  listen 127.0.0.1:{port};\n  location / {{ return 200 \"{name} host=$http_host xff=$http_x_forwarded_for env=$http_x_env\\n\"; }}\n }}\n}}\n"
    );
    let path = format!("{d}/nginx.conf");
    std::fs::write(&path, conf).unwrap();
    // Owned by the guard at once, so a failed start still stops it.
    let ng = Nginx { child: Command::new("nginx").args(["-c", &path, "-p", &d.to_string()]).spawn().expect("nginx (apt-get install nginx-light)") };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return ng;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nginx {name} did not listen on {port}");
}

/// Starts the proxy on a thread; returns its listeners' addresses and the proxy.
pub fn proxy_with(config: &str) -> (Vec<SocketAddr>, Arc<Proxy>) {
    let cfg = Config::parse(config).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let p = Arc::new(Proxy::new(cfg).unwrap());
            let b = bind(&p.config).await.unwrap();
            tx.send((b.addresses(), p.clone())).unwrap();
            serve(p, b, std::future::pending(), Duration::from_secs(1)).await;
        });
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap()
}

/// Starts the proxy on a thread; returns its first listener's address.
pub fn proxy(config: &str) -> SocketAddr {
    proxy_with(config).0[0]
}
