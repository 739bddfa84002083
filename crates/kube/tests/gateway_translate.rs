//! The Gateway API translation, without a cluster: listeners, routes, precedence, conditions,
//! and a proxy configuration the proxy itself accepts.

use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use vectorlb_kube::gateway::{self as translate, Action, Cond, GatewayIn, PathKind, RouteIn, World};
use vectorlb_kube::gateway_types::{Gateway, GrpcRoute, HttpRoute};

fn gateway(v: serde_json::Value) -> Gateway {
    serde_json::from_value(v).unwrap()
}

fn cond<'a>(c: &'a [Cond], t: &str) -> (&'a str, bool) {
    let c = c.iter().find(|c| c.type_ == t).unwrap_or_else(|| panic!("no {t} in {c:?}"));
    (c.reason.as_str(), c.status)
}

fn self_signed() -> (String, String) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("vectorlb-gw-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (c, k) = (dir.join("c.pem"), dir.join("k.pem"));
    let o = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=shop.example",
            "-addext",
            "subjectAltName=DNS:shop.example",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-keyout", k.to_str().unwrap(), "-out", c.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success());
    let r = (std::fs::read_to_string(&c).unwrap(), std::fs::read_to_string(&k).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn world() -> World {
    world_with(self_signed())
}

/// The test world with this certificate and key for `shop/tls`.
fn world_with(tls: (String, String)) -> World {
    let mut w = World::default();
    w.services.insert("shop/web-v1".into(), vec![80]);
    w.services.insert("shop/web-v2".into(), vec![80]);
    w.services.insert("shop/empty".into(), vec![80]);
    w.services.insert("shop/grpc".into(), vec![50051]);
    let ep = |a: &str| vec![a.parse::<SocketAddr>().unwrap()];
    w.endpoints.insert(("shop/web-v1".into(), 80), ep("10.2.0.1:8080"));
    w.endpoints.insert(("shop/web-v2".into(), 80), ep("10.2.0.2:8080"));
    w.endpoints.insert(("shop/grpc".into(), 50051), ep("10.2.0.3:50051"));
    w.secrets.insert("shop/tls".into(), Ok(tls));
    w.secrets.insert("shop/broken".into(), Err("tls.crt: not a PEM certificate".into()));
    for p in [80u16, 443, 8443] {
        w.proxy_ports.insert(("shop/gw".into(), p), 30000 + p);
    }
    w
}

fn http_in(r: &HttpRoute) -> RouteIn<'_> {
    RouteIn {
        kind: translate::HTTP_ROUTE,
        namespace: r.metadata.namespace.clone().unwrap(),
        name: r.metadata.name.clone().unwrap(),
        created: r.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
        parent_refs: &r.spec.parent_refs,
        hostnames: &r.spec.hostnames,
        rules: translate::http_rules(&r.spec.rules),
    }
}

/// The shop: a Gateway with HTTP, HTTPS, a broken certificate and a TCP listener; a split
/// route with a header modifier and a timeout, an exact match on a header, a gRPC route, and
/// routes that are refused (another namespace, a mirror, a port the Gateway has not).
struct Shop {
    gw: Gateway,
    http: Vec<HttpRoute>,
    grpc: GrpcRoute,
}

fn shop() -> Shop {
    let gw = gateway(json!({
        "metadata": {"name": "gw", "namespace": "shop"},
        "spec": {"gatewayClassName": "vectorlb", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "shop.example",
             "tls": {"certificateRefs": [{"name": "tls"}]}},
            {"name": "bad-cert", "port": 8443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "broken"}]}},
            {"name": "tcp", "port": 9000, "protocol": "TCP"},
        ]}
    }));
    let split: HttpRoute = serde_json::from_value(json!({
        "metadata": {"name": "split", "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["shop.example", "other.example"], "rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/app"}}],
             "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-env", "value": "prod"}]}}],
             "backendRefs": [{"name": "web-v1", "port": 80, "weight": 90}, {"name": "web-v2", "port": 80, "weight": 10}],
             "timeouts": {"request": "2s500ms"}},
            {"matches": [{"path": {"type": "Exact", "value": "/app/login"}, "headers": [{"name": "X-Canary", "value": "1"}]}],
             "backendRefs": [{"name": "web-v2", "port": 80}, {"name": "missing", "port": 80}, {"name": "empty", "port": 80}]},
        ]}
    }))
    .unwrap();
    let grpc: GrpcRoute = serde_json::from_value(json!({
        "metadata": {"name": "rpc", "namespace": "shop", "creationTimestamp": "2026-01-02T00:00:00Z"},
        "spec": {"parentRefs": [{"name": "gw", "sectionName": "http"}], "rules": [
            {"matches": [{"method": {"service": "grpc.health.v1.Health", "method": "Check"}}], "backendRefs": [{"name": "grpc", "port": 50051}]}]}
    }))
    .unwrap();
    let other_ns: HttpRoute =
        serde_json::from_value(json!({"metadata": {"name": "intruder", "namespace": "elsewhere"}, "spec": {"parentRefs": [{"name": "gw", "namespace": "shop"}], "rules": [{}]}}))
            .unwrap();
    let mirror: HttpRoute = serde_json::from_value(
        json!({"metadata": {"name": "mirror", "namespace": "shop"}, "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"filters": [{"type": "RequestMirror"}]}]}}),
    )
    .unwrap();
    let no_port: HttpRoute = serde_json::from_value(json!({"metadata": {"name": "np", "namespace": "shop"}, "spec": {"parentRefs": [{"name": "gw", "port": 81}]}})).unwrap();
    Shop { gw, http: vec![split, other_ns, mirror, no_port], grpc }
}

impl Shop {
    fn translate(&self, w: &World) -> translate::Out {
        let gws = [GatewayIn { gw: &self.gw, key: "shop/gw".into(), address: Ok("10.100.0.50".parse().unwrap()) }];
        let mut routes: Vec<RouteIn> = self.http.iter().map(http_in).collect();
        routes.push(RouteIn {
            kind: translate::GRPC_ROUTE,
            namespace: "shop".into(),
            name: "rpc".into(),
            created: "2026-01-02T00:00:00Z".into(),
            parent_refs: &self.grpc.spec.parent_refs,
            hostnames: &self.grpc.spec.hostnames,
            rules: translate::grpc_rules(&self.grpc.spec.rules),
        });
        translate::translate(&gws, &routes, w)
    }
}

#[test]
fn a_gateway_and_its_routes_become_a_proxy_configuration_with_the_right_conditions() {
    let out = shop().translate(&world());

    // The Gateway and its listeners.
    let g = &out.gateways["shop/gw"];
    assert_eq!(cond(&g.conditions, "Accepted"), ("Accepted", true));
    assert_eq!(cond(&g.conditions, "Programmed"), ("Programmed", true));
    let l = |n: &str| g.listeners.iter().find(|l| l.name == n).unwrap();
    assert_eq!(cond(&l("http").conditions, "Programmed"), ("Programmed", true));
    assert_eq!(cond(&l("https").conditions, "ResolvedRefs"), ("ResolvedRefs", true));
    assert_eq!(cond(&l("bad-cert").conditions, "ResolvedRefs"), ("InvalidCertificateRef", false));
    assert_eq!(cond(&l("bad-cert").conditions, "Programmed"), ("Invalid", false));
    assert_eq!(cond(&l("tcp").conditions, "Accepted"), ("UnsupportedProtocol", false));
    // split attaches to http and https (its hostname shop.example); the gRPC route to http only.
    // A listener whose certificate is broken still counts the routes attached to it (the
    // specification: attachment does not depend on the listener's own references).
    assert_eq!((l("http").attached_routes, l("https").attached_routes, l("bad-cert").attached_routes), (2, 1, 1));
    assert_eq!(l("http").supported_kinds, vec!["HTTPRoute", "GRPCRoute"]);
    assert_eq!(out.l4["shop/gw"], vec![(80, 30080), (443, 30443)], "only servable listeners reach the L4 tier");

    // The routes' conditions.
    let rs = |k: &'static str, n: &str| out.route_status[&(k, n.to_string())][0].1.clone();
    let (h, g2) = (translate::HTTP_ROUTE, translate::GRPC_ROUTE);
    assert_eq!(cond(&rs(h, "shop/split"), "Accepted"), ("Accepted", true));
    assert_eq!(cond(&rs(h, "shop/split"), "ResolvedRefs"), ("BackendNotFound", false), "shop/missing");
    assert_eq!(cond(&rs(g2, "shop/rpc"), "Accepted"), ("Accepted", true));
    assert_eq!(cond(&rs(g2, "shop/rpc"), "ResolvedRefs"), ("ResolvedRefs", true));
    assert_eq!(cond(&rs(h, "elsewhere/intruder"), "Accepted"), ("NotAllowedByListeners", false));
    assert_eq!(cond(&rs(h, "shop/mirror"), "Accepted"), ("UnsupportedValue", false));
    assert_eq!(cond(&rs(h, "shop/np"), "Accepted"), ("NoMatchingParent", false));

    // Precedence on the http listener: exact hosts (longer first), exact path before prefix,
    // each host closed by its 404; the gRPC route (no host) last.
    let on_http: Vec<(Option<&str>, &PathKind, &Action)> = out.routes.iter().filter(|r| r.listener == "gw:shop/gw:80").map(|r| (r.host.as_deref(), &r.path, &r.action)).collect();
    let hosts: Vec<Option<&str>> = on_http.iter().map(|r| r.0).collect();
    assert_eq!(
        hosts,
        vec![Some("other.example"), Some("other.example"), Some("other.example"), Some("shop.example"), Some("shop.example"), Some("shop.example"), None],
        "{on_http:?}"
    );
    assert_eq!(on_http[0].1, &PathKind::Exact("/app/login".into()));
    assert_eq!(on_http[1].1, &PathKind::Segments("/app".into()));
    assert_eq!(on_http[2].2, &Action::Respond(404));
    assert_eq!(on_http[6].1, &PathKind::Exact("/grpc.health.v1.Health/Check".into()));
    match on_http[0].2 {
        Action::Split(s) => assert_eq!(s, &vec![(Ok("shop/web-v2:80".to_string()), 1), (Err(500), 1), (Err(503), 1)]),
        a => panic!("{a:?}"),
    }

    // The proxy accepts what is made, with the certificate inline on the HTTPS listener.
    let base = "workers = 1\n[admin]\naddress = \"unix:/run/vectorlb/gw-proxy.sock\"\n";
    let text = out.proxy_toml(base, IpAddr::from([0, 0, 0, 0]));
    let c = vectorlb_proxy::Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(c.listeners.len(), 2);
    assert!(c.listeners.iter().any(|l| l.tls.is_some() && l.address.port() == 30443));
    assert!(c.clusters.iter().any(|c| c.name == "shop/grpc:50051+h2"), "{text}");
    assert_eq!(out.proxy_toml(base, IpAddr::from([0, 0, 0, 0])), text, "deterministic");
}

#[test]
fn hostnames_intersect_as_the_specification_says() {
    let h = |l: Option<&str>, r: &[&str]| translate::hosts(l, &r.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(h(None, &[]), vec![None]);
    assert_eq!(h(Some("*.example.com"), &[]), vec![Some("*.example.com".to_string())]);
    assert_eq!(h(Some("*.example.com"), &["a.example.com", "b.other.com"]), vec![Some("a.example.com".to_string())]);
    assert_eq!(h(Some("a.example.com"), &["*.example.com"]), vec![Some("a.example.com".to_string())]);
    assert_eq!(h(Some("*.example.com"), &["*.a.example.com"]), vec![Some("*.a.example.com".to_string())]);
    assert!(h(Some("a.example.com"), &["b.example.com"]).is_empty());
    assert!(h(Some("*.example.com"), &["example.com"]).is_empty(), "a wildcard needs a label before its suffix");
}

#[test]
fn durations() {
    assert_eq!(translate::duration("2s500ms"), Ok(Some(2.5)));
    assert_eq!(translate::duration("1h"), Ok(Some(3600.0)));
    assert_eq!(translate::duration("2h"), Ok(Some(3600.0)), "the proxy's bound");
    assert_eq!(translate::duration("0s"), Ok(None), "zero: no timeout");
    for bad in ["", "10", "1d", "s", "123456s", "1s1s1s1s1s"] {
        assert!(translate::duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn no_address_no_programmed_gateway() {
    let gw = gateway(json!({"metadata": {"name": "gw", "namespace": "shop"}, "spec": {"listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}));
    let out = translate::translate(&[GatewayIn { gw: &gw, key: "shop/gw".into(), address: Err("address 10.9.9.9 is in no pool".into()) }], &[], &world());
    let g = &out.gateways["shop/gw"];
    assert_eq!(cond(&g.conditions, "Programmed"), ("AddressNotAssigned", false));
    assert_eq!(cond(&g.listeners[0].conditions, "Programmed"), ("Pending", false));
}

#[test]
fn a_configuration_without_routes_or_clusters_is_still_one_the_proxy_takes() {
    // A Gateway whose only route points at nothing: no cluster at all (the proxy refused the
    // `clusters = []` that once landed inside the base's `[admin]` table).
    let gw = gateway(
        json!({"metadata": {"name": "gw", "namespace": "shop"}, "spec": {"gatewayClassName": "vectorlb", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}),
    );
    let route: HttpRoute = serde_json::from_value(json!({"metadata": {"name": "r", "namespace": "shop"},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "nope", "port": 80}]}]}}))
    .unwrap();
    let base = "workers = 1\n[admin]\naddress = \"unix:/run/vectorlb/gw-proxy.sock\"\n";
    for (gws, routes) in [(vec![], vec![]), (vec![&gw], vec![http_in(&route)])] {
        let gws: Vec<GatewayIn> = gws.into_iter().map(|g| GatewayIn { gw: g, key: "shop/gw".into(), address: Ok("10.100.0.50".parse().unwrap()) }).collect();
        let out = translate::translate(&gws, &routes, &world());
        let text = out.proxy_toml(base, IpAddr::from([0, 0, 0, 0]));
        let c = vectorlb_proxy::Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(c.clusters.is_empty(), "{text}");
    }
}

#[test]
fn reference_grants_allow_exactly_what_they_name() {
    use vectorlb_kube::gateway_types::ReferenceGrantSpec;
    let mut w = world();
    w.services.insert("backends/api".into(), vec![80]);
    w.endpoints.insert(("backends/api".into(), 80), vec!["10.2.0.9:8080".parse().unwrap()]);
    w.secrets.insert("certs/shop".into(), Ok(self_signed()));
    let gw = gateway(json!({
        "metadata": {"name": "gw", "namespace": "shop"},
        "spec": {"gatewayClassName": "vectorlb", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "https", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "shop", "namespace": "certs"}]}}]}
    }));
    let route: HttpRoute = serde_json::from_value(json!({
        "metadata": {"name": "r", "namespace": "shop"},
        "spec": {"parentRefs": [{"name": "gw", "sectionName": "http"}], "rules": [{"backendRefs": [{"name": "api", "namespace": "backends", "port": 80}]}]}
    }))
    .unwrap();
    let run = |w: &World| {
        let gws = [GatewayIn { gw: &gw, key: "shop/gw".into(), address: Ok("10.100.0.50".parse().unwrap()) }];
        let out = translate::translate(&gws, &[http_in(&route)], w);
        let l = out.gateways["shop/gw"].listeners.iter().find(|l| l.name == "https").unwrap().conditions.clone();
        let r = out.route_status[&(translate::HTTP_ROUTE, "shop/r".to_string())][0].1.clone();
        (cond(&l, "ResolvedRefs").0.to_string(), cond(&r, "ResolvedRefs").0.to_string())
    };
    let grant = |ns: &str, v: serde_json::Value| (ns.to_string(), serde_json::from_value::<ReferenceGrantSpec>(v).unwrap());
    // No grant: both references refused.
    assert_eq!(run(&w), ("RefNotPermitted".into(), "RefNotPermitted".into()));
    // Grants in the wrong namespace, from the wrong kind or namespace, to another name: still refused.
    w.grants = vec![
        grant("shop", json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop"}], "to": [{"group": "", "kind": "Service"}]})),
        grant("backends", json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "GRPCRoute", "namespace": "shop"}], "to": [{"group": "", "kind": "Service"}]})),
        grant("backends", json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "other"}], "to": [{"group": "", "kind": "Service"}]})),
        grant(
            "backends",
            json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop"}], "to": [{"group": "", "kind": "Service", "name": "db"}]}),
        ),
        grant("certs", json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop"}], "to": [{"group": "", "kind": "Secret"}]})),
    ];
    assert_eq!(run(&w), ("RefNotPermitted".into(), "RefNotPermitted".into()));
    // The right grants: by name for the Service, all Secrets for the Gateway.
    w.grants.push(grant(
        "backends",
        json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop"}], "to": [{"group": "", "kind": "Service", "name": "api"}]}),
    ));
    w.grants.push(grant("certs", json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "shop"}], "to": [{"group": "", "kind": "Secret"}]})));
    assert_eq!(run(&w), ("ResolvedRefs".into(), "ResolvedRefs".into()));
}

#[test]
fn request_redirects_take_the_listener_scheme_and_port_unless_given() {
    use translate::ProxyRedirect;
    let gw = gateway(json!({"metadata": {"name": "gw", "namespace": "shop"}, "spec": {"gatewayClassName": "vectorlb", "listeners": [
        {"name": "http", "port": 8080, "protocol": "HTTP"}]}}));
    let route: HttpRoute = serde_json::from_value(json!({"metadata": {"name": "r", "namespace": "shop"}, "spec": {"parentRefs": [{"name": "gw"}], "rules": [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/host"}}], "filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "Example.org", "statusCode": 301}}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/secure"}}], "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}], "filters": [{"type": "RequestRedirect", "requestRedirect": {"port": 9090, "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}]}]}}))
    .unwrap();
    let gws = [GatewayIn { gw: &gw, key: "shop/gw".into(), address: Ok("10.100.0.50".parse().unwrap()) }];
    let mut w = world();
    w.proxy_ports.insert(("shop/gw".into(), 8080), 38080);
    let out = translate::translate(&gws, &[http_in(&route)], &w);
    let redirects: Vec<ProxyRedirect> = out.routes.iter().filter_map(|r| if let Action::Redirect(rd) = &r.action { Some(rd.clone()) } else { None }).collect();
    let rd = |status, scheme: &str, host: Option<&str>, port, path: Option<(bool, &str)>| ProxyRedirect {
        status,
        scheme: scheme.into(),
        host: host.map(str::to_string),
        port,
        path: path.map(|(f, p)| (f, p.to_string())),
    };
    assert_eq!(
        redirects,
        vec![rd(302, "https", None, 443, None), rd(301, "http", Some("example.org"), 8080, None), rd(302, "http", None, 9090, Some((false, "/new")))],
        "{:?}",
        out.routes
    );
    let text = out.proxy_toml("workers = 1\n", IpAddr::from([0, 0, 0, 0]));
    vectorlb_proxy::Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    // Refused: a redirect with backends, a bad status, ReplacePrefixMatch on an exact match.
    for (rule, why) in [
        (json!({"filters": [{"type": "RequestRedirect", "requestRedirect": {}}], "backendRefs": [{"name": "web-v1", "port": 80}]}), "cannot also have backendRefs"),
        (json!({"filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 307}}]}), "is not 301 or 302"),
        (
            json!({"matches": [{"path": {"type": "Exact", "value": "/x"}}], "filters": [{"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/y"}}}]}),
            "needs PathPrefix",
        ),
    ] {
        let rules: Vec<vectorlb_kube::gateway_types::HttpRule> = serde_json::from_value(json!([rule])).unwrap();
        let e = translate::http_rules(&rules).unwrap_err();
        assert!(e.contains(why), "{e}");
    }
}

/// The proxy configuration the shop translates to, whole, against
/// `crates/kube/tests/golden/gateway-proxy.toml` (`VECTORLB_UPDATE_GOLDEN=1` writes it): a
/// change to any listener, route, match, filter, split, timeout or cluster shows.
#[test]
fn the_proxy_configuration_is_the_golden_one() {
    let cert = ("-----BEGIN CERTIFICATE-----\ngolden\n-----END CERTIFICATE-----\n".to_string(), "-----BEGIN PRIVATE KEY-----\ngolden\n-----END PRIVATE KEY-----\n".to_string());
    let mut w = world_with(cert);
    w.proxy_ports.insert(("shop/gw".into(), 8080), 38080);
    let mut shop = shop();
    // Redirects too, with every setting.
    shop.http.push(
        serde_json::from_value(json!({"metadata": {"name": "moved", "namespace": "shop"}, "spec": {"parentRefs": [{"name": "gw", "sectionName": "http"}], "hostnames": ["old.example"], "rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/host"}}], "filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "new.example", "statusCode": 301}}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/secure"}}], "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}], "filters": [
                {"type": "RequestRedirect", "requestRedirect": {"port": 9090, "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/page"}}], "filters": [
                {"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/index.html"}}}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}], "filters": [
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "x-served-by", "value": "vectorlb"}], "remove": ["server"]}}],
             "backendRefs": [{"name": "web-v1", "port": 80}], "timeouts": {"request": "1m"}}]}}))
        .unwrap(),
    );
    let base = "workers = 1\n[admin]\naddress = \"unix:/run/vectorlb/gw-proxy.sock\"\n";
    let got = shop.translate(&w).proxy_toml(base, IpAddr::from([0, 0, 0, 0]));
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/gateway-proxy.toml");
    if std::env::var_os("VECTORLB_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (VECTORLB_UPDATE_GOLDEN=1 writes it)", path.display()));
    if let Some((i, (w, g))) = want.lines().zip(got.lines()).enumerate().find(|(_, (w, g))| w != g) {
        panic!(
            "the proxy configuration differs from the golden file at line {}:\n  golden: {w}\n  now:    {g}\n(if the change is meant, VECTORLB_UPDATE_GOLDEN=1 writes it)",
            i + 1
        );
    }
    assert_eq!(want.lines().count(), got.lines().count(), "the golden file and the output differ in length");
}

/// The Gateway API for meshes: a route whose parent is a Service is served on a proxy listener
/// per HTTP port of the Service (its own port when the parent names one), without a host, and
/// the Service's routed ports are reported for the L4 tier; consumer routes (another
/// namespace's Service), missing Services and ports are refused; nothing of it without `mesh`.
#[test]
fn routes_with_a_service_parent_are_served_on_the_services_http_ports() {
    assert!(translate::carries_http(Some("http"), Some("x")) && translate::carries_http(None, Some("http-alt")) && translate::carries_http(None, Some("grpc")));
    assert!(!translate::carries_http(Some("tcp"), Some("http")) && !translate::carries_http(None, Some("tcp")) && !translate::carries_http(None, Some("https")));
    let mut w = world();
    w.mesh = true;
    w.services.insert("shop/echo".into(), vec![80, 8080, 9090]);
    w.http_ports.insert("shop/echo".into(), [80u16, 8080].into_iter().collect());
    for (p, pp) in [(80u16, 31001u16), (8080, 31002)] {
        w.proxy_ports.insert((translate::mesh_port_key("shop/echo"), p), pp);
    }
    let route = |name: &str, ns: &str, parent: serde_json::Value| -> HttpRoute {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-01-03T00:00:00Z"},
            "spec": {"parentRefs": [parent], "hostnames": ["ignored.example"], "rules": [
                {"matches": [{"path": {"type": "Exact", "value": "/v1"}}], "backendRefs": [{"name": "web-v1", "port": 80}]},
                {"matches": [{"path": {"type": "Exact", "value": "/v2"}}], "backendRefs": [{"name": "web-v2", "port": 80}]}]}}))
        .unwrap()
    };
    let all_ports = route("split", "shop", json!({"group": "", "kind": "Service", "name": "echo"}));
    let one_port = route("alt", "shop", json!({"group": "", "kind": "Service", "name": "echo", "port": 8080}));
    let consumer = route("consumer", "elsewhere", json!({"group": "", "kind": "Service", "name": "echo", "namespace": "shop"}));
    let missing = route("missing", "shop", json!({"group": "", "kind": "Service", "name": "nope"}));
    let bad_port = route("bad-port", "shop", json!({"group": "", "kind": "Service", "name": "echo", "port": 81}));
    let routes = [&all_ports, &one_port, &consumer, &missing, &bad_port];
    let ins: Vec<RouteIn> = routes.iter().map(|r| http_in(r)).collect();
    assert_eq!(translate::mesh_targets(&ins[0], &w).unwrap(), [("shop/echo".to_string(), 80u16), ("shop/echo".to_string(), 8080)].into_iter().collect());
    let out = translate::translate(&[], &ins, &w);
    let names: Vec<(&str, u16)> = out.listeners.iter().map(|l| (l.name.as_str(), l.port)).collect();
    assert_eq!(names, vec![("mesh:31001", 31001), ("mesh:31002", 31002)]);
    assert_eq!(out.mesh.get("shop/echo").unwrap().iter().map(|(a, b)| (*a, *b)).collect::<Vec<_>>(), vec![(80, 31001), (8080, 31002)]);
    let on_80: Vec<_> = out.routes.iter().filter(|r| r.listener == "mesh:31001").collect();
    assert_eq!(on_80.len(), 2, "{on_80:?}");
    assert!(on_80.iter().all(|r| r.host.is_none()), "a Service's routes have no host");
    assert!(matches!(&on_80[0].path, PathKind::Exact(p) if p == "/v1"));
    assert_eq!(out.routes.iter().filter(|r| r.listener == "mesh:31002").count(), 4, "both routes on the port named and on all ports");
    let status = |n: &str| out.route_status.get(&(translate::HTTP_ROUTE, n.to_string())).map(|v| v[0].1.clone()).unwrap_or_default();
    assert_eq!(cond(&status("shop/split"), "Accepted"), ("Accepted", true));
    assert_eq!(cond(&status("shop/split"), "ResolvedRefs"), ("ResolvedRefs", true));
    assert_eq!(cond(&status("elsewhere/consumer"), "Accepted"), ("UnsupportedValue", false));
    assert_eq!(cond(&status("shop/missing"), "Accepted"), ("NoMatchingParent", false));
    assert_eq!(cond(&status("shop/bad-port"), "Accepted"), ("NoMatchingParent", false));
    let text = out.proxy_toml("workers = 1", "0.0.0.0".parse::<IpAddr>().unwrap());
    vectorlb_proxy::Config::parse(&text).unwrap_or_else(|e| panic!("the proxy takes it: {e}\n{text}"));
    w.mesh = false;
    let out = translate::translate(&[], &ins, &w);
    assert!(out.listeners.is_empty() && out.mesh.is_empty() && out.route_status.is_empty(), "not ours without mesh");
}
