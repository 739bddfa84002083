//! The control API's HTTP behaviour over an in-memory `LbControl`: status codes, field-named
//! errors, 405 with Allow, and the document it serves (which must be the generated one, and the
//! one checked in as docs/openapi.json).

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::Fake;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

async fn call(app: &axum::Router, method: &str, path: &str, body: &str) -> (StatusCode, axum::http::HeaderMap, String) {
    let req = Request::builder().method(method).uri(path).body(Body::from(body.to_string())).unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    (parts.status, parts.headers, String::from_utf8_lossy(&bytes).into_owned())
}

fn app() -> axum::Router {
    vectorlb_api::server::with_conventions(vectorlb_api::router(Arc::new(Fake::default())))
}

#[tokio::test]
async fn statuses_and_field_named_errors() {
    let a = app();
    let (s, _, b) = call(&a, "POST", "/v1/services", r#"{"vip": "10.0.0.100", "port": 80}"#).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(serde_json::from_str::<Value>(&b).unwrap(), json!({ "created": "tcp/10.0.0.100/80" }));
    let (s, _, _) = call(&a, "POST", "/v1/services", r#"{"vip": "10.0.0.100", "port": 80}"#).await;
    assert_eq!(s, StatusCode::CONFLICT);
    for (body, field) in [
        (r#"{"vip": "10.0.0.300"}"#, "vip:"),
        (r#"{"vip": "10.0.0.1", "mode": "xnat"}"#, "mode:"),
        (r#"{"vip": "10.0.0.1", "table_size": 2}"#, "table_size:"),
        (r#"{"vip": "10.0.0.1", "backends": [{"addr": "10.1.0.1", "weight": 2000000}]}"#, "backends[0].weight:"),
        ("", "body:"),
    ] {
        let (s, _, b) = call(&a, "POST", "/v1/services", body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {b}");
        let e = serde_json::from_str::<Value>(&b).unwrap()["error"].as_str().unwrap().to_string();
        assert!(e.starts_with(field), "{body}: {e}");
    }
    let (s, _, b) = call(&a, "GET", "/v1/services/tcp/10.0.0.100/80/", "").await;
    assert_eq!(s, StatusCode::OK, "a trailing slash is ignored: {b}");
    let (s, _, b) = call(&a, "GET", "/v1/services/xtp/10.0.0.100/80", "").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(b.contains("proto: 'xtp'"), "{b}");
    let (s, _, _) = call(&a, "GET", "/v1/services/udp/10.0.0.100/80", "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = call(&a, "POST", "/v1/services/tcp/10.0.0.100/80/backends", r#"{"addr": "2001:db8::1"}"#).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _, b) = call(&a, "PATCH", "/v1/services/tcp/10.0.0.100/80/backends/10.1.0.1/80", r#"{"weight": 0}"#).await;
    assert_eq!((s, serde_json::from_str::<Value>(&b).unwrap()), (StatusCode::OK, json!({ "updated": true, "weight": 0 })));
    let (s, _, b) = call(&a, "GET", "/v1/sessions?limit=0", "").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(b.contains("limit:"), "{b}");
    let (s, _, _) = call(&a, "GET", "/v1/sessions?worker=3", "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, b) = call(&a, "GET", "/v1/sessions?family=6", "").await;
    assert_eq!((s, serde_json::from_str::<Value>(&b).unwrap()["family"].clone()), (StatusCode::OK, json!(6)));
    let (s, h, b) = call(&a, "PUT", "/v1/services", "").await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(h["allow"], "GET,HEAD,POST");
    assert!(b.contains("method PUT is not allowed on /v1/services"), "{b}");
    let (s, _, b) = call(&a, "GET", "/v1/nothing", "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(b.contains("no such endpoint: /v1/nothing"), "{b}");
    let (s, _, b) = call(&a, "POST", "/v1/reload", "").await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    let (s, _, b) = call(&a, "GET", "/v1/stats", "").await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["rx"], 5, "pipeline counters sit at the top level: {v}");
    let (s, h, _) = call(&a, "GET", "/metrics", "").await;
    assert_eq!((s, &h["content-type"]), (StatusCode::OK, &"text/plain; version=0.0.4".parse::<axum::http::HeaderValue>().unwrap()));
    let big = format!("{{\"vip\": \"10.0.0.1\", \"x\": \"{}\"}}", "a".repeat(2 << 20));
    let (s, _, _) = call(&a, "POST", "/v1/services", &big).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "bodies are bounded");
    // The policy set takes more (one endpoint's rules can pass a mebibyte), and is bounded too.
    let (s, _, b) = call(&a, "POST", "/v1/policy", &format!("{{\"reset\": true, \"x\": \"{}\"}}", "a".repeat(2 << 20))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "read whole, then refused for its unknown field: {}", &b[..b.len().min(200)]);
    let huge = format!("{{\"x\": \"{}\"}}", "a".repeat(vectorlb_http::error::MAX_POLICY_BODY));
    let (s, _, _) = call(&a, "POST", "/v1/policy", &huge).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn the_served_document_is_the_generated_one_and_the_checked_in_one() {
    let (s, _, served) = call(&app(), "GET", "/openapi.json", "").await;
    assert_eq!(s, StatusCode::OK);
    let generated = vectorlb_api::openapi_json();
    assert_eq!(served, generated);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    if std::env::var_os("VECTORLB_UPDATE_DOCS").is_some() {
        std::fs::write(path, &generated).unwrap();
        return;
    }
    let file = std::fs::read_to_string(path).unwrap_or_default();
    assert!(file == generated, "docs/openapi.json is stale: VECTORLB_UPDATE_DOCS=1 cargo test -p vectorlb-api (or `vectorlb openapi > docs/openapi.json`)");
    let doc: Value = serde_json::from_str(&generated).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in ["/v1/health", "/v1/services", "/v1/services/{proto}/{vip}/{port}", "/v1/sessions", "/v1/stats", "/v1/sync", "/metrics", "/openapi.json"] {
        assert!(paths.contains_key(p), "{p} is documented");
    }
}
