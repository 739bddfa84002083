//! `vectorlb_proxy::Config::parse` on arbitrary text (invalid UTF-8 is replaced, lossily).
//!
//! Parsing must never panic; errors are fine. On `Ok`, what the proxy relies on must hold:
//! every route names an existing cluster and listener (or answers with a valid status), every
//! cluster has an endpoint that takes requests, timeouts are positive and health checks fit
//! their interval, the worker count and TLS versions are sane, static routes have a dispatch
//! pool whose classes they name, and routing a request or classifying it does not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_proxy::config::Action;
use vectorlb_proxy::Config;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(c) = Config::parse(&text) else { return };
    // No listener only for a proxy that waits for its configuration on the admin API.
    assert!(!c.listeners.is_empty() || c.admin.is_some());
    assert!(c.listeners.is_empty() || !c.routes.is_empty());
    for l in &c.listeners {
        assert!(l.limits.reset_window >= std::time::Duration::from_millis(100) && l.limits.body_timeout >= std::time::Duration::from_millis(1));
    }
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
            Action::Static { root, max_bytes, .. } => {
                assert!(root.is_absolute() && (1..=1 << 32).contains(max_bytes));
                let d = c.dispatch.as_ref().expect("a static route has a dispatch pool");
                let p = &r.priority;
                assert!(p.class < d.classes.len() && p.sizes.iter().all(|(_, k)| *k < d.classes.len()));
                assert!(p.sizes.windows(2).all(|w| w[0].0 < w[1].0));
            }
            Action::Split(split) => assert!(split.iter().all(|(to, _)| match to {
                vectorlb_proxy::config::SplitTo::Cluster(i) => *i < c.clusters.len(),
                vectorlb_proxy::config::SplitTo::Status(s) => (400..=599).contains(s),
            })),
            Action::Redirect(_) => {}
        }
        assert!(r.listeners.iter().all(|l| c.listeners.iter().any(|x| &x.name == l)));
        assert!(r.matches.path.matched().starts_with('/'));
        assert!(r.matches.host.as_deref().is_none_or(|h| h == h.to_ascii_lowercase() && !h.ends_with('.')), "a route host in canonical form");
    }
    for cl in &c.clusters {
        assert!(cl.endpoints.iter().any(|e| e.weight > 0));
        assert!(!cl.connect_timeout.is_zero() && !cl.response_timeout.is_zero());
        assert!(cl.client_share > 0.0 && cl.client_share <= 1.0);
        if let Some(h) = &cl.health {
            assert!(!h.timeout.is_zero() && h.timeout <= h.interval && (1..=100).contains(&h.rise) && (1..=100).contains(&h.fall));
        }
    }
    if let Some(d) = &c.dispatch {
        assert!(!d.classes.is_empty() && (1..=1024).contains(&d.workers) && (1..=1_000_000).contains(&d.queue_limit));
        assert!(d.classes[0].share == 0 && d.classes.iter().map(|k| k.share).sum::<u32>() < 100);
        assert!(!d.max_wait.is_zero() && d.lifo_above <= d.queue_limit);
    }
    for uri in ["/", "http://a.example/x", "/api/v1?q=1", "/o/a?prio=0", "/o/b?prio=low&prio=99"] {
        let req = hyper::Request::builder().uri(uri).header("host", "www.example.com").header("x-canary", "1").header("x-priority", "1").body(()).unwrap();
        let (parts, _) = req.into_parts();
        for l in &c.listeners {
            if let Some(i) = vectorlb_proxy::route::find(&c.routes, &l.name, &parts) {
                assert!(i < c.routes.len());
                if let (Action::Static { .. }, Some(d)) = (&c.routes[i].action, &c.dispatch) {
                    for size in [None, Some(0), Some(1 << 20), Some(u64::MAX)] {
                        assert!(vectorlb_proxy::objects::class_of(&c.routes[i].priority, &parts, size, d) < d.classes.len());
                    }
                }
            }
        }
    }
});
