//! h2spec, the HTTP/2 conformance suite (a Go module, not written here), against the proxy's
//! HTTP/2 listeners: prior knowledge (h2c) and TLS with ALPN, forwarding to nginx.
//!
//! Two exceptions:
//! * "3.5 #2, Sends invalid connection preface" (h2c only) expects the connection closed and
//!   sees it reset. The proxy does terminate the connection, as the RFC requires; the kernel
//!   sends RST instead of FIN because the client's bytes after the bad preface are still unread
//!   in the socket when it is closed. Over TLS the same case passes.
//! * "5.1 #9, closed: Sends a HEADERS frame after sending RST_STREAM frame", sometimes: h2spec
//!   sends HEADERS, RST_STREAM and HEADERS on stream 1 back to back, and counts any frame on
//!   that stream as a failure. When the upstream (nginx on loopback, ~0.1 ms away) answers the
//!   first HEADERS before the proxy has read the RST_STREAM, the answer's DATA frame is already
//!   on its way. It is a race of the test's timing, not a frame sent on a stream known closed;
//!   most runs pass it.

mod common;

use common::{cert, free_port, nginx, proxy_with};
use std::process::Command;

const H2SPEC: &str = "/opt/vectorlb/bin/h2spec";

/// Runs h2spec against `port`; (passed, skipped, failed, descriptions of the failures).
fn h2spec(port: u16, tls: bool) -> (u32, u32, u32, Vec<String>, String) {
    let mut c = Command::new(H2SPEC);
    c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-o", "5"]);
    if tls {
        c.args(["-t", "-k"]);
    }
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

#[test]
fn h2spec_on_the_h2c_and_tls_listeners() {
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-h2spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (crt, key) = cert(&dir, "h2spec.test", &["-newkey", "rsa:2048"]);
    let up = free_port();
    let _ng = nginx(&dir, "be1", up);
    let cfg = format!(
        "[[listeners]]\nname = \"h2c\"\naddress = \"127.0.0.1:0\"\nprotocols = \"http2\"\n\
         [[listeners]]\nname = \"tls\"\naddress = \"127.0.0.1:0\"\ntls = {{ certificates = [{{ cert = \"{}\", key = \"{}\" }}] }}\n\
         [[routes]]\ncluster = \"web\"\n[[clusters]]\nname = \"web\"\nendpoints = [\"127.0.0.1:{up}\"]\n",
        crt,
        key
    );
    let (addrs, _p) = proxy_with(&cfg);
    let (passed, skipped, failed, failures, summary) = h2spec(addrs[0].port(), false);
    eprintln!("h2spec h2c: {summary}");
    let explained = |f: &String| f == "Sends invalid connection preface" || f == "closed: Sends a HEADERS frame after sending RST_STREAM frame";
    assert!(failures.iter().all(explained), "h2c: {failures:?}");
    assert!(failed as usize == failures.len() && passed >= 140 && skipped <= 2, "h2c: {summary}");
    let (passed, skipped, failed, failures, summary) = h2spec(addrs[1].port(), true);
    eprintln!("h2spec tls: {summary}");
    assert!(failures.iter().all(|f| f == "closed: Sends a HEADERS frame after sending RST_STREAM frame"), "tls: {failures:?}");
    assert!(failed as usize == failures.len(), "tls: {summary}");
    assert!(passed >= 140 && skipped <= 2, "tls: {summary}");
    let _ = std::fs::remove_dir_all(&dir);
}
