//! `vectorlb proxy` starting with the `cryptomb` provider where crypto_mb cannot run
//! (`VECTORLB_CRYPTO_MB=off` stands in for a CPU without AVX-512 IFMA): it says so, and then
//! signs inline or refuses to start, as configured.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn config(dir: &std::path::Path, fallback: &str) -> std::path::PathBuf {
    let (c, k) = (dir.join("t.crt"), dir.join("t.key"));
    if !c.exists() {
        let o = Command::new("openssl")
            .args(["req", "-x509", "-nodes", "-days", "2", "-subj", "/CN=t.test", "-newkey", "rsa:2048", "-keyout"])
            .arg(&k)
            .arg("-out")
            .arg(&c)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let p = dir.join(format!("{fallback}.toml"));
    std::fs::write(
        &p,
        format!(
            "[[listeners]]\nname = \"tls\"\naddress = \"127.0.0.1:{port}\"\n\
             tls = {{ certificates = [{{ cert = \"{}\", key = \"{}\" }}], provider = \"cryptomb\", cryptomb_fallback = \"{fallback}\" }}\n\
             [[routes]]\ncluster = \"c\"\n[[clusters]]\nname = \"c\"\nendpoints = [\"127.0.0.1:9\"]\n",
            c.display(),
            k.display()
        ),
    )
    .unwrap();
    p
}

/// Runs the proxy for at most `wait`; its exit status (None: still running, then stopped) and
/// its standard error.
fn run(cfg: &std::path::Path, wait: Duration) -> (Option<std::process::ExitStatus>, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vectorlb"))
        .args(["proxy", "--config"])
        .arg(cfg)
        .env("VECTORLB_CRYPTO_MB", "off")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > wait {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status, err)
}

#[test]
fn cryptomb_without_crypto_mb_falls_back_to_inline_or_refuses_as_configured() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let (status, err) = run(&config(&dir, "refuse"), Duration::from_secs(10));
    let status = status.expect("refused at once, not running");
    assert!(!status.success());
    assert!(err.contains("listeners[0].tls.provider: cryptomb cannot run: crypto_mb is turned off"), "{err}");

    let (status, err) = run(&config(&dir, "inline"), Duration::from_secs(2));
    assert!(status.is_none(), "with the fallback it runs: {err}");
    assert!(err.contains("the cryptomb provider cannot run: crypto_mb is turned off") && err.contains("signing inline"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn curl(args: &[&str]) -> (bool, String) {
    let o = Command::new("curl").args(["-sS", "--max-time", "5"]).args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).to_string())
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_and_the_admin_api_reload_a_second_start_is_refused_and_kill_9_leaves_nothing_stale() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let sock = dir.join("admin.sock");
    let cfg = dir.join("p.toml");
    let write = |body: &str| {
        std::fs::write(
            &cfg,
            format!(
                "[admin]\naddress = \"unix:{}\"\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n[[routes]]\nrespond = {{ status = 200, body = \"{body}\" }}\n",
                sock.display()
            ),
        )
        .unwrap()
    };
    write("A");
    let start = || Command::new(env!("CARGO_BIN_EXE_vectorlb")).args(["proxy", "--config"]).arg(&cfg).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let url = format!("http://127.0.0.1:{port}/");
    let admin = |path: &str, method: &str| curl(&["--unix-socket", sock.to_str().unwrap(), "-X", method, &format!("http://admin{path}")]).1;
    let mut p = start();
    wait_for("the proxy answers", || curl(&[&url]).1 == "A");
    // SIGHUP reloads the file.
    write("B");
    Command::new("kill").args(["-HUP", &p.id().to_string()]).status().unwrap();
    wait_for("the reload is served", || curl(&[&url]).1 == "B");
    // A bad file through the admin API: 400 naming the field; the running configuration stays.
    write("C");
    std::fs::write(&cfg, std::fs::read_to_string(&cfg).unwrap().replace("status = 200", "status = 7")).unwrap();
    let r = admin("/v1/reload", "POST");
    assert!(r.contains("routes[0].respond.status"), "{r}");
    assert_eq!(curl(&[&url]).1, "B");
    let m = admin("/metrics", "GET");
    assert!(m.contains("vectorlb_proxy_reloads_total{outcome=\"ok\"} 1") && m.contains("vectorlb_proxy_reloads_total{outcome=\"refused\"} 1"), "{m}");
    // A second start: refused (the admin socket is served), the first unharmed.
    write("B");
    let (status, err) = run(&cfg, Duration::from_secs(10));
    assert!(status.is_some_and(|s| !s.success()), "{err}");
    assert!(err.contains("another vectorlb is serving it"), "{err}");
    assert_eq!(curl(&[&url]).1, "B");
    // kill -9, then a start: the stale socket is replaced, the port bound again.
    p.kill().unwrap();
    p.wait().unwrap();
    write("D");
    let mut p = start();
    wait_for("the restarted proxy answers", || curl(&[&url]).1 == "D");
    // SIGTERM: drains and exits cleanly, removing its socket.
    Command::new("kill").args(["-TERM", &p.id().to_string()]).status().unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = p.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "still running after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    assert!(!sock.exists(), "the admin socket is removed at exit");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The production binary is linked for the batched X25519 key exchange (its build.rs passes
/// the --wrap flags): with crypto_mb available, a `cryptomb` listener turns the batches on; a
/// binary that forgot the flags would say why they are off, and this test fails.
#[test]
fn the_binary_batches_its_key_exchanges_under_cryptomb() {
    if let Err(why) = vectorlb_proxy::cryptomb::crypto_mb_available() {
        eprintln!("skipped: crypto_mb cannot run here: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-wrap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = config(&dir, "refuse");
    let sock = dir.join("admin.sock");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("[admin]\naddress = \"unix:{}\"\n{text}", sock.display())).unwrap();
    let mut p = Command::new(env!("CARGO_BIN_EXE_vectorlb")).args(["proxy", "--config"]).arg(&cfg).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for("the admin API answers", || curl(&["--unix-socket", sock.to_str().unwrap(), "http://admin/v1/health"]).0);
    let stats = curl(&["--unix-socket", sock.to_str().unwrap(), "http://admin/v1/stats"]).1;
    let _ = Command::new("kill").args(["-TERM", &p.id().to_string()]).status();
    let _ = p.wait();
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(v["x25519_keypairs"]["batches_on"], true, "{}", v["x25519_keypairs"]);
    let _ = std::fs::remove_dir_all(&dir);
}
