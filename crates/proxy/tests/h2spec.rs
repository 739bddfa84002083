//! h2spec, the HTTP/2 conformance suite (a Go module, not written here), against the proxy's
//! HTTP/2 listeners: prior knowledge (h2c) and TLS with ALPN, forwarding to nginx.
//!
//! One exception and three races:
//! * "3.5 #2, Sends invalid connection preface" (h2c only) expects the connection closed and
//!   sees it reset. The proxy does terminate the connection, as the RFC requires; the kernel
//!   sends RST instead of FIN because the client's bytes after the bad preface are still unread
//!   in the socket when it is closed. Over TLS the same case passes.
//! * "5.1 #8 / #9, closed: Sends a DATA / HEADERS frame after sending RST_STREAM frame" (#8
//!   failed once in CI with the fast upstream) and "6.9.1 #3, Sends
//!   multiple WINDOW_UPDATE frames ... on a stream" race the upstream. h2spec writes its frames
//!   one by one; when nginx on loopback (~0.1 ms away) answers the first HEADERS before the proxy
//!   has read the frames after it, the stream is already answered: in 5.1 #8 and #9 the answer's DATA
//!   frame is on its way before the RST_STREAM is read, in 6.9.1 #3 the proxy has finished the
//!   response and ended the stream with RST_STREAM(NO_ERROR) (RFC 9113 §8.1) before the
//!   WINDOW_UPDATEs arrive. Most runs pass both. The test runs both cases again against an
//!   upstream that answers after 300 ms, where the frames always arrive first: there they must
//!   pass.

mod common;

use common::{cert, free_port, nginx, proxy_with};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

const H2SPEC: &str = "/opt/vectorlb/bin/h2spec";

/// Runs h2spec against `port`; (passed, skipped, failed, descriptions of the failures).
/// `cases` are h2spec's test ids (all when empty).
fn h2spec(port: u16, tls: bool, cases: &[&str]) -> (u32, u32, u32, Vec<String>, String) {
    let mut c = Command::new(H2SPEC);
    c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-o", "5"]);
    if tls {
        c.args(["-t", "-k"]);
    }
    c.args(cases);
    let o = c.output().unwrap_or_else(|e| panic!("{H2SPEC}: {e} (scripts/setup.sh installs it)"));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let summary = out.lines().rev().find(|l| l.contains(" tests, ")).unwrap_or_else(|| panic!("no summary:\n{out}")).to_string();
    // "145 tests, 144 passed, 1 skipped, 0 failed"
    let n: Vec<u32> = summary.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    let failures = out
        .split_once("Failures:")
        .map(|(_, f)| f.lines().filter_map(|l| l.trim().strip_prefix("× ")).map(|l| l.split_once(": ").map(|x| x.1).unwrap_or(l).to_string()).collect())
        .unwrap_or_default();
    (n[1], n[2], n[3], failures, summary)
}

/// The cases whose outcome depends on how fast the upstream answers (see the module comment).
const RACES: [(&str, &str); 3] = [
    ("http2/5.1/8", "closed: Sends a DATA frame after sending RST_STREAM frame"),
    ("http2/5.1/9", "closed: Sends a HEADERS frame after sending RST_STREAM frame"),
    ("http2/6.9.1/3", "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1 on a stream"),
];

/// An HTTP/1.1 upstream that answers every request 300 ms after its headers arrived.
fn slow_upstream() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut b = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&b[..n]),
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nslow\n");
            });
        }
    });
    port
}

#[test]
fn h2spec_on_the_h2c_and_tls_listeners() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-h2spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (crt, key) = cert(&dir, "h2spec.test", &["-newkey", "rsa:2048"]);
    let up = free_port();
    let _ng = nginx(&dir, "be1", up);
    let config = |up: u16| {
        format!(
            "[[listeners]]\nname = \"h2c\"\naddress = \"127.0.0.1:0\"\nprotocols = \"http2\"\n\
             [[listeners]]\nname = \"tls\"\naddress = \"127.0.0.1:0\"\ntls = {{ certificates = [{{ cert = \"{crt}\", key = \"{key}\" }}] }}\n\
             [[routes]]\ncluster = \"web\"\n[[clusters]]\nname = \"web\"\nendpoints = [\"127.0.0.1:{up}\"]\n"
        )
    };
    let (addrs, _p) = proxy_with(&config(up));
    let race = |f: &String| RACES.iter().any(|(_, d)| d == f);
    for (i, tls, name) in [(0, false, "h2c"), (1, true, "tls")] {
        let (passed, skipped, failed, failures, summary) = h2spec(addrs[i].port(), tls, &[]);
        eprintln!("h2spec {name}: {summary}");
        let exception = |f: &String| !tls && f == "Sends invalid connection preface";
        assert!(failures.iter().all(|f| exception(f) || race(f)), "{name}: {failures:?}");
        assert!(failed as usize == failures.len() && passed >= 140 && skipped <= 2, "{name}: {summary}");
    }
    // Where the frames surely arrive before the answer, the racing cases must pass.
    let (addrs, _p) = proxy_with(&config(slow_upstream()));
    let ids: Vec<&str> = RACES.iter().map(|(id, _)| *id).collect();
    for (i, tls, name) in [(0, false, "h2c"), (1, true, "tls")] {
        let (passed, _, failed, failures, summary) = h2spec(addrs[i].port(), tls, &ids);
        eprintln!("h2spec {name}, the racing cases against a slow upstream: {summary}");
        assert!(failed == 0 && passed == RACES.len() as u32, "{name} with a slow upstream: {failures:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
