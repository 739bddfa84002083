//! `vectorlb_proxy::Config::parse` on arbitrary text (invalid UTF-8 is replaced, lossily).
//!
//! Parsing must never panic; errors are fine. On `Ok`, what the proxy relies on must hold:
//! every route names an existing cluster and listener (or answers with a valid status), every
//! cluster has an endpoint that takes requests, timeouts are positive and health checks fit
//! their interval, the worker count and TLS versions are sane, and routing a request does not
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_proxy::config::Action;
use vectorlb_proxy::Config;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(c) = Config::parse(&text) else { return };
    assert!(!c.listeners.is_empty() && !c.routes.is_empty());
    assert!((1..=1024).contains(&c.workers));
    for l in &c.listeners {
        if let Some(t) = &l.tls {
            assert!(!t.certificates.is_empty() && t.min_version <= t.max_version);
        }
    }
    for r in &c.routes {
        match &r.action {
            Action::Cluster(i) => assert!(*i < c.clusters.len()),
            Action::Respond { status, body } => assert!((200..=599).contains(status) && body.len() <= 65536),
        }
        assert!(r.listeners.iter().all(|l| c.listeners.iter().any(|x| &x.name == l)));
        assert!(r.matches.path_prefix.starts_with('/'));
    }
    for cl in &c.clusters {
        assert!(cl.endpoints.iter().any(|e| e.weight > 0));
        assert!(!cl.connect_timeout.is_zero() && !cl.response_timeout.is_zero());
        if let Some(h) = &cl.health {
            assert!(!h.timeout.is_zero() && h.timeout <= h.interval && (1..=100).contains(&h.rise) && (1..=100).contains(&h.fall));
        }
    }
    for uri in ["/", "http://a.example/x", "/api/v1?q=1"] {
        let req = hyper::Request::builder().uri(uri).header("host", "www.example.com").header("x-canary", "1").body(()).unwrap();
        let (parts, _) = req.into_parts();
        for l in &c.listeners {
            if let Some(i) = vectorlb_proxy::route::find(&c.routes, &l.name, &parts) {
                assert!(i < c.routes.len());
            }
        }
    }
});
