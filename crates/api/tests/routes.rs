//! The control API's HTTP behaviour over an in-memory `LbControl`: status codes, field-named
//! errors, 405 with Allow, and the document it serves (which must be the generated one, and the
//! one checked in as docs/openapi.json).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tower::ServiceExt;
use vectorlb_api::model::*;
use vectorlb_api::{ApiError, LbControl};

#[derive(Default)]
struct Fake {
    services: Mutex<Vec<NewService>>,
}

impl LbControl for Fake {
    fn health(&self) -> Health {
        Health { status: "ok".into(), generation: 7 }
    }
    fn services(&self) -> Vec<ServiceStatus> {
        self.services
            .lock()
            .unwrap()
            .iter()
            .map(|s| ServiceStatus {
                vip: s.vip.to_string(),
                port: s.port,
                proto: s.proto,
                mode: s.mode,
                scheduler: s.scheduler.unwrap_or(SchedulerName::Wrr),
                table_size: s.table_size,
                local_addrs: vec![],
                toa: s.toa,
                backends: vec![],
                stats: ServiceStats::default(),
            })
            .collect()
    }
    fn add_service(&self, s: NewService) -> Result<(), ApiError> {
        let mut v = self.services.lock().unwrap();
        if v.iter().any(|x| x.vip == s.vip && x.port == s.port && x.proto == s.proto) {
            return Err(ApiError::Conflict("exists".into()));
        }
        v.push(s);
        Ok(())
    }
    fn edit_service(&self, _: ServiceKey, _: ServicePatch) -> Result<(), ApiError> {
        Err(ApiError::NotFound("no such service".into()))
    }
    fn delete_service(&self, _: ServiceKey) -> Result<(), ApiError> {
        Err(ApiError::NotFound("no such service".into()))
    }
    fn add_backend(&self, _: ServiceKey, _: NewBackend) -> Result<(), ApiError> {
        Err(ApiError::Unprocessable("backend of the other family".into()))
    }
    fn set_weight(&self, _: ServiceKey, _: SocketAddr, _: u32) -> Result<(), ApiError> {
        Ok(())
    }
    fn delete_backend(&self, _: ServiceKey, _: SocketAddr) -> Result<(), ApiError> {
        Ok(())
    }
    fn sessions(&self, q: SessionQuery) -> Result<SessionPage, ApiError> {
        if q.worker > 0 {
            return Err(ApiError::NotFound(format!("worker: {} does not exist (0..1)", q.worker)));
        }
        Ok(SessionPage { worker: 0, family: if q.v6 { 6 } else { 4 }, sessions: vec![], next_cursor: None })
    }
    fn stats(&self) -> Stats {
        Stats {
            uptime_seconds: 1.0,
            generation: 7,
            workers: 1,
            packets: [("rx".to_string(), 5)].into(),
            drops: Default::default(),
            sessions: 0,
            io: Default::default(),
            reloads: 0,
            reload_failures: 0,
            mbufs_available: 100,
            ha: self.ha(),
            sync: SyncStatus::default(),
        }
    }
    fn ports(&self) -> Vec<PortStatus> {
        vec![]
    }
    fn neighbors(&self) -> Vec<Neighbor> {
        vec![]
    }
    fn config_toml(&self) -> String {
        "[global]\n".into()
    }
    fn reload(&self) -> Result<u64, ApiError> {
        Err(ApiError::Conflict("ports changed: adding, removing or re-pointing a port needs a restart".into()))
    }
    fn save(&self) -> Result<Saved, ApiError> {
        Ok(Saved { saved: "/tmp/x.toml".into(), bytes: 9 })
    }
    fn ha(&self) -> HaStatus {
        HaStatus { state: HaState::Standalone, since_seconds: 0.0, transitions: 0, announcements: 0 }
    }
    fn set_ha(&self, _: HaState) -> HaState {
        HaState::Standalone
    }
    fn sync(&self) -> SyncStatus {
        SyncStatus::default()
    }
    fn metrics(&self) -> String {
        "vectorlb_rx_total 5\n".into()
    }
}

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
