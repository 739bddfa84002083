//! TLS termination between real peers: curl and `openssl s_client` (OpenSSL 3) as clients,
//! nginx as the upstream. TLS 1.2 and 1.3, an RSA-2048 and an ECDSA P-256 certificate chosen by
//! SNI, ALPN h2 and http/1.1, every private-key provider (inline, pool, cryptomb with its
//! portable backend and with crypto_mb where the CPU has it), resumption off.

mod common;

use common::{cert, free_port, nginx, proxy_with};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

/// The X25519 secret counters are global to the process and the tests of this file run on
/// parallel threads: a handshake of one test would be counted by another. Every test that
/// makes handshakes holds this lock.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// `openssl s_client` to `port` with `args`; its whole output.
fn s_client(port: u16, args: &[&str]) -> String {
    let mut c = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b"Q\n").unwrap();
    let o = c.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn curl(args: &[&str]) -> String {
    let o = Command::new("curl").args(["-sS", "--max-time", "10"]).args(args).output().unwrap();
    assert!(o.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn tls_12_and_13_rsa_and_ecdsa_by_sni_alpn_with_every_provider() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (rsa_c, rsa_k) = cert(&dir, "rsa.test", &["-newkey", "rsa:2048"]);
    let (ec_c, ec_k) = cert(&dir, "ec.test", &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]);
    let up = free_port();
    let _ng = nginx(&dir, "be1", up);
    let listener = |name: &str, provider: &str| {
        format!(
            "[[listeners]]\nname = \"{name}\"\naddress = \"127.0.0.1:0\"\n\
             tls = {{ certificates = [{{ cert = \"{rsa_c}\", key = \"{rsa_k}\" }}, {{ cert = \"{ec_c}\", key = \"{ec_k}\" }}], {provider} resumption = false }}\n\n"
        )
    };
    let cfg = format!(
        "{}{}[[routes]]\ncluster = \"web\"\n\n[[clusters]]\nname = \"web\"\nendpoints = [\"127.0.0.1:{up}\"]\n",
        listener("inline", "provider = \"inline\", inline_backend = \"boringssl\","),
        listener("pool", "provider = \"pool\", pool_threads = 2,"),
    ) + &listener("cryptomb-portable", "provider = \"cryptomb\", cryptomb_backend = \"portable\", poll_delay = 0.002,")
        + &listener("cryptomb", "provider = \"cryptomb\", cryptomb_fallback = \"inline\",")
        + &listener("inline-ippcp", "provider = \"inline\", inline_backend = \"ippcp\",")
        + &listener("inline-auto", "provider = \"inline\",");
    let (addrs, p) = proxy_with(&cfg);
    for (i, a) in addrs.iter().enumerate() {
        let port = a.port();
        let secrets_before = vectorlb_proxy::keyshare::secret_counts();
        for name in ["rsa.test", "ec.test"] {
            let resolve = format!("{name}:{port}:127.0.0.1");
            let url = format!("https://{name}:{port}/x");
            let ca = dir.join(format!("{name}.crt"));
            for v in [["--tlsv1.2", "--tls-max", "1.2"], ["--tlsv1.3", "--tls-max", "1.3"]] {
                // curl verifies the certificate against the name: SNI picked the right one.
                let body = curl(&[v[0], v[1], v[2], "--cacert", ca.to_str().unwrap(), "--resolve", &resolve, &url]);
                assert!(body.starts_with("be1 host=") && body.contains(name), "{name} {v:?}: {body}");
            }
            // ALPN: h2 when offered, http/1.1 otherwise; the response says which.
            let h2 = curl(&["--http2", "-o", "/dev/null", "-w", "%{http_version}", "--cacert", ca.to_str().unwrap(), "--resolve", &resolve, &url]);
            assert_eq!(h2, "2", "{name}");
            let h1 = curl(&["--http1.1", "-o", "/dev/null", "-w", "%{http_version}", "--cacert", ca.to_str().unwrap(), "--resolve", &resolve, &url]);
            assert_eq!(h1, "1.1", "{name}");
        }
        // openssl s_client: the key type by SNI, the ALPN chosen, the protocol version.
        let out = s_client(port, &["-servername", "ec.test", "-alpn", "h2,http/1.1", "-tls1_3"]);
        assert!(out.contains("New, TLSv1.3") && out.contains("ALPN protocol: h2") && out.contains("Peer signature type: ECDSA"), "{out}");
        let out = s_client(port, &["-servername", "rsa.test", "-alpn", "http/1.1", "-tls1_2"]);
        assert!(out.contains("New, TLSv1.2") && out.contains("ALPN protocol: http/1.1") && out.contains("Peer signature type: RSA"), "{out}");
        // TLS 1.2: the server's order of cipher suites wins over the client's (AES-128-GCM
        // first), and a suite without forward secrecy is refused.
        let out = s_client(port, &["-servername", "rsa.test", "-tls1_2", "-cipher", "ECDHE-RSA-CHACHA20-POLY1305:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-GCM-SHA256"]);
        assert!(out.contains("Cipher is ECDHE-RSA-AES128-GCM-SHA256"), "the client's order won: {out}");
        let out = s_client(port, &["-servername", "rsa.test", "-tls1_2", "-cipher", "AES128-GCM-SHA256"]);
        assert!(!out.contains("Cipher is AES128-GCM-SHA256"), "a suite without forward secrecy was accepted: {out}");
        // No SNI: the first certificate.
        let out = s_client(port, &["-noservername"]);
        assert!(out.contains("CN = rsa.test") || out.contains("CN=rsa.test"), "{out}");
        let (_, stats) = p.tls[i].as_ref().unwrap();
        assert!(stats.handshakes.load(Ordering::Relaxed) >= 11, "listener {i}: {stats:?}");
        let offloaded = stats.offloaded.load(Ordering::Relaxed);
        let expected = match i {
            0 => "inline",
            1 => "pool",
            2 => "cryptomb/portable",
            4 => match vectorlb_proxy::cryptomb::ippcp_available() {
                Ok(()) => "inline/ippcp",
                Err(why) => {
                    eprintln!("ippcp not tested end to end here: {why}");
                    "inline"
                }
            },
            // The default: IPP's RSA where it has IFMA code to run, BoringSSL elsewhere.
            5 => {
                if vectorlb_proxy::cryptomb::ippcp_available().is_ok() && std::is_x86_feature_detected!("avx512ifma") {
                    "inline/ippcp"
                } else {
                    "inline"
                }
            }
            // crypto_mb where this machine has it, else the configured fallback.
            _ => match vectorlb_proxy::cryptomb::crypto_mb_available() {
                Ok(()) => "cryptomb/crypto_mb",
                Err(why) => {
                    eprintln!("crypto_mb not tested end to end here: {why}");
                    assert_eq!(stats.fallback_reason.as_deref(), Some(why.as_str()));
                    "inline"
                }
            },
        };
        assert_eq!(stats.provider, expected, "listener {i}");
        // Under cryptomb on crypto_mb every X25519 secret (curl's and s_client's key exchanges
        // are X25519: TLS 1.2's ClientKeyExchange, TLS 1.3's key share) came from a batch; on
        // the other listeners BoringSSL computed them.
        let secrets = vectorlb_proxy::keyshare::secret_counts();
        let (batched, single) = (secrets.0 - secrets_before.0, secrets.1 - secrets_before.1);
        let handshakes = stats.handshakes.load(Ordering::Relaxed);
        if expected == "cryptomb/crypto_mb" {
            assert_eq!((batched, single), (handshakes, 0), "listener {i}: X25519 secrets batched, single");
            assert!(secrets.2 > secrets_before.2);
        } else {
            assert_eq!((batched, single), (0, handshakes), "listener {i}: X25519 secrets batched, single");
        }
        if expected == "inline" {
            assert_eq!(offloaded, 0, "inline signs inside the handshake");
        } else {
            // Resumption is off: every full handshake signed once through the provider.
            assert!(offloaded >= 11, "{expected}: {stats:?}");
            assert_eq!(stats.offload_failures.load(Ordering::Relaxed), 0);
        }
        if expected.starts_with("cryptomb") {
            // Both kinds of key went through the queues, every signature checked.
            assert!(stats.rsa_queue_sizes.count() >= 1 && stats.ecdsa_queue_sizes.count() >= 1, "{stats:?}");
            assert_eq!(stats.rsa_queue_sizes.sum() + stats.ecdsa_queue_sizes.sum(), offloaded as f64);
            assert_eq!(stats.failed_checks.load(Ordering::Relaxed), 0);
        }
        assert_eq!(stats.handshake_seconds.count(), stats.handshakes.load(Ordering::Relaxed));
    }
    // With crypto_mb the cryptomb listener also turned on the batched X25519 key pairs, which
    // every listener's key exchanges then used (curl's and s_client's handshakes above).
    let (batched, single) = vectorlb_proxy::keyshare::counts();
    if vectorlb_proxy::cryptomb::crypto_mb_available().is_ok() {
        assert!(vectorlb_proxy::keyshare::enabled());
        assert!(batched >= 40, "key pairs: {batched} batched, {single} single");
    } else {
        assert!(!vectorlb_proxy::keyshare::enabled());
        assert_eq!(batched, 0);
    }
    // The admin API's view of the same counters.
    let m = vectorlb_proxy::admin::metrics(&p);
    assert!(m.contains(&format!("vectorlb_proxy_tls_x25519_keypairs_total{{made=\"batched\"}} {}", vectorlb_proxy::keyshare::counts().0)), "{m}");
    assert!(m.contains(&format!("vectorlb_proxy_tls_x25519_secrets_total{{made=\"batched\"}} {}", vectorlb_proxy::keyshare::secret_counts().0)), "{m}");
    for want in [
        "vectorlb_proxy_tls_handshakes_total{listener=\"inline\",provider=\"inline\",outcome=\"ok\"}",
        "vectorlb_proxy_tls_rsa_queue_sizes_bucket{listener=\"cryptomb-portable\",le=\"8\"}",
        "vectorlb_proxy_tls_ecdsa_queue_sizes_count{listener=\"cryptomb-portable\"}",
        "vectorlb_proxy_tls_failed_checks_total{listener=\"cryptomb-portable\",provider=\"cryptomb/portable\"} 0",
        "vectorlb_proxy_tls_handshake_seconds_bucket{listener=\"pool\",provider=\"pool\",le=\"+Inf\"}",
        "vectorlb_proxy_requests_total{listener=\"pool\"}",
    ] {
        assert!(m.contains(want), "{want} not in\n{m}");
    }
    let st = vectorlb_proxy::admin::stats(&p);
    let t = st.listeners[2].tls.as_ref().unwrap();
    assert_eq!(t.provider, "cryptomb/portable");
    assert!(t.handshakes >= 11 && t.handshake_seconds.p50.is_some() && t.rsa_queue_sizes.count >= 1);
    assert!(st.listeners[2].requests >= 8, "curl's requests on that listener");

    // A plain-text client on a TLS port is a failed handshake, not a crash.
    let port = addrs[1].port();
    let o = Command::new("curl").args(["-sS", "--max-time", "5", &format!("http://127.0.0.1:{port}/")]).output().unwrap();
    assert!(!o.status.success());
    assert!(p.tls[1].as_ref().unwrap().1.handshake_failures.load(Ordering::Relaxed) >= 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_key_that_does_not_match_its_certificate_is_refused_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-tls-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a_c, _) = cert(&dir, "a.test", &["-newkey", "rsa:2048"]);
    let (_, b_k) = cert(&dir, "b.test", &["-newkey", "rsa:2048"]);
    let cfg = |cert: &str, key: &str| {
        vectorlb_proxy::Config::parse(&format!(
            "[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:0\"\ntls = {{ certificates = [{{ cert = \"{cert}\", key = \"{key}\" }}] }}\n\
             [[routes]]\ncluster = \"c\"\n[[clusters]]\nname = \"c\"\nendpoints = [\"127.0.0.1:9\"]\n"
        ))
        .unwrap()
    };
    let err = |c| vectorlb_proxy::serve::Proxy::new(c).err().expect("refused").to_string();
    let e = err(cfg(&a_c, &b_k));
    assert!(e.contains("listeners[0].tls.certificates[0]") && e.contains("does not belong"), "{e}");
    let e = err(cfg(&a_c, "/nonexistent.key"));
    assert!(e.contains("listeners[0].tls.certificates[0].key: /nonexistent.key"), "{e}");
    let e = err(cfg(&b_k, &b_k));
    assert!(e.contains("certificates[0].cert") && e.contains("no certificate in the file"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The proxy's `close_notify`: skipped once the client has closed (its own `close_notify` sent,
/// as nginx does, since the alert would only meet a closed socket), sent when the proxy closes
/// first (`Connection: close`). Seen from a BoringSSL client on the wire: a clean close
/// (`ZERO_RETURN`) only in the second case.
#[test]
fn close_notify_only_when_the_proxy_closes_first() {
    let _serial = serial();
    use boring::ssl::{ErrorCode, SslConnector, SslMethod, SslVerifyMode};
    use std::io::Read;
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-tls-close-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (c, k) = cert(&dir, "close.test", &["-newkey", "rsa:2048"]);
    let cfg = format!(
        "[[listeners]]\nname = \"t\"\naddress = \"127.0.0.1:0\"\ntls = {{ certificates = [{{ cert = \"{c}\", key = \"{k}\" }}], provider = \"inline\", resumption = false }}\n\n\
         [[routes]]\nrespond = {{ status = 200, body = \"ok\" }}\n"
    );
    let (addrs, _p) = proxy_with(&cfg);
    for version in [boring::ssl::SslVersion::TLS1_2, boring::ssl::SslVersion::TLS1_3] {
        let connect = || {
            let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
            b.set_verify(SslVerifyMode::NONE);
            b.set_min_proto_version(Some(version)).unwrap();
            b.set_max_proto_version(Some(version)).unwrap();
            let tcp = std::net::TcpStream::connect(addrs[0]).unwrap();
            tcp.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
            b.build().connect("close.test", tcp).unwrap()
        };
        // The client closes first: it sends its close_notify after the response; the proxy
        // closes the connection without one of its own.
        let mut s = connect();
        s.write_all(b"GET / HTTP/1.1\r\nHost: close.test\r\n\r\n").unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("\r\n\r\nok"), "{version:?}");
        s.shutdown().unwrap();
        let end = s.ssl_read(&mut buf).expect_err("the end of the stream");
        assert_ne!(end.code(), ErrorCode::ZERO_RETURN, "{version:?}: the proxy answered the client's close_notify");
        // The proxy closes first: its close_notify follows the response.
        let mut s = connect();
        s.write_all(b"GET / HTTP/1.1\r\nHost: close.test\r\nConnection: close\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let end = loop {
            match s.ssl_read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break e,
            }
        };
        assert!(String::from_utf8_lossy(&got).ends_with("\r\n\r\nok"), "{version:?}");
        assert_eq!(end.code(), ErrorCode::ZERO_RETURN, "{version:?}: a clean close_notify from the proxy");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
