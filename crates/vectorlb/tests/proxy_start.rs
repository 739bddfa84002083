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
