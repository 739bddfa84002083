//! The load balancer's control API: what it asks of the daemon ([`LbControl`]), the routes,
//! and the OpenAPI document generated from them ([`LbApiDoc`]).
//!
//! Handlers parse and check the request (400 names the field), then call the daemon on a
//! blocking thread: the daemon's answers may wait on a worker (session listings) or a file.

use crate::error::{ApiError, JsonBody};
use crate::model::*;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post};
use axum::{Json, Router};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::Schema;
use utoipa::{IntoParams, OpenApi};

/// What the control API needs from the daemon. Every change is validated and published as a
/// whole, or refused with an [`ApiError`] naming the field; nothing is half-applied.
pub trait LbControl: Send + Sync + 'static {
    fn health(&self) -> Health;
    fn services(&self) -> Vec<ServiceStatus>;
    fn add_service(&self, s: NewService) -> Result<(), ApiError>;
    fn edit_service(&self, key: ServiceKey, patch: ServicePatch) -> Result<(), ApiError>;
    fn delete_service(&self, key: ServiceKey) -> Result<(), ApiError>;
    fn add_backend(&self, key: ServiceKey, b: NewBackend) -> Result<(), ApiError>;
    fn set_weight(&self, key: ServiceKey, backend: SocketAddr, weight: u32) -> Result<(), ApiError>;
    fn delete_backend(&self, key: ServiceKey, backend: SocketAddr) -> Result<(), ApiError>;
    /// Applies service changes as one edit (all or none); returns the new generation.
    fn batch(&self, ops: Vec<BatchOp>) -> Result<u64, ApiError>;
    /// A page of one worker's sessions (the worker answers between bursts).
    fn sessions(&self, q: SessionQuery) -> Result<SessionPage, ApiError>;
    fn stats(&self) -> Stats;
    fn ports(&self) -> Vec<PortStatus>;
    fn neighbors(&self) -> Vec<Neighbor>;
    /// The running configuration as a TOML file.
    fn config_toml(&self) -> String;
    /// Re-reads the configuration file; returns the new generation.
    fn reload(&self) -> Result<u64, ApiError>;
    /// Writes the running configuration back to its file.
    fn save(&self) -> Result<Saved, ApiError>;
    fn ha(&self) -> HaStatus;
    /// Sets the HA state; returns the previous one.
    fn set_ha(&self, state: HaState) -> HaState;
    fn sync(&self) -> SyncStatus;
    /// The BGP speaker, or None without `[bgp]`.
    fn bgp(&self) -> Option<BgpStatus>;
    /// Starts or ends a drain (`[bgp]` only).
    fn drain(&self, c: DrainChange) -> Result<BgpStatus, ApiError>;
    /// The last two minutes of rates per service and backend.
    fn history(&self) -> History;
    /// The pods port's interfaces (404 without a pods port).
    fn pods(&self) -> Result<Vec<PodStatus>, ApiError>;
    /// Attaches a pod's interface; the same one again is answered as it stands.
    fn add_pod(&self, p: NewPod) -> Result<PodStatus, ApiError>;
    /// Detaches a pod's interface and removes it; false when there was none.
    fn delete_pod(&self, container_id: &str, ifname: &str) -> Result<bool, ApiError>;
    /// The node's network policy set and what it denied.
    fn policy(&self) -> PolicyStatus;
    /// Applies network policy changes as one edit.
    fn change_policy(&self, c: PolicyChanges) -> Result<PolicyStatus, ApiError>;
    /// Denied flows logged after sequence number `after`.
    fn policy_denied(&self, after: u64) -> PolicyDeniedLog;
    /// The mesh's steering (docs/mesh.md).
    fn mesh(&self) -> MeshStatus;
    /// Replaces the mesh's steering.
    fn set_mesh(&self, m: MeshSteering) -> Result<MeshStatus, ApiError>;
    /// Stops the mesh's steering.
    fn clear_mesh(&self) -> MeshStatus;
    /// The Prometheus text exposition.
    fn metrics(&self) -> String;
}

type Lb = State<Arc<dyn LbControl>>;

/// Runs `f` on the daemon on a blocking thread.
async fn call<T: Send + 'static>(lb: Arc<dyn LbControl>, f: impl FnOnce(&dyn LbControl) -> T + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || f(lb.as_ref())).await.map_err(|e| ApiError::Internal(format!("the request handler failed: {e}")))
}

/// The API's routes over `lb`.
pub fn router(lb: Arc<dyn LbControl>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/health", get(health))
        .route("/v1/services", get(list_services).post(add_service))
        .route("/v1/services/{proto}/{vip}/{port}", get(get_service).patch(edit_service).delete(delete_service))
        .route("/v1/services/{proto}/{vip}/{port}/backends", post(add_backend))
        .route("/v1/services/{proto}/{vip}/{port}/backends/{addr}/{bport}", patch(edit_backend).delete(delete_backend))
        .route("/v1/batch", post(batch))
        .route("/v1/sessions", get(sessions))
        .route("/v1/stats", get(stats))
        .route("/v1/ports", get(ports))
        .route("/v1/neighbors", get(neighbors))
        .route("/v1/config", get(config))
        .route("/v1/reload", post(reload))
        .route("/v1/save", post(save))
        .route("/v1/ha", get(ha).post(set_ha))
        .route("/v1/sync", get(sync))
        .route("/v1/bgp", get(bgp))
        .route("/v1/drain", post(drain))
        .route("/v1/history", get(history))
        .route("/v1/pods", get(pods).post(add_pod))
        .route("/v1/pods/{container_id}/{ifname}", delete(delete_pod))
        .route("/v1/policy", get(policy).post(change_policy).layer(axum::extract::DefaultBodyLimit::max(vectorlb_http::error::MAX_POLICY_BODY)))
        .route("/v1/policy/denied", get(policy_denied))
        .route("/v1/mesh", get(mesh).put(set_mesh).delete(clear_mesh).layer(axum::extract::DefaultBodyLimit::max(vectorlb_http::error::MAX_POLICY_BODY)))
        .merge(crate::page::routes())
        .with_state(lb)
}

/// The OpenAPI document of the load balancer's API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "vectorlb control API",
        version = "1",
        description = "Local control API of the vectorlb daemon (`vectorlb run`). Listens on the unix socket unix:/run/vectorlb/api.sock by default, or on ADDRESS:PORT with a bearer token (runtime.api). Every change is validated and published as a whole, or refused with a 4xx whose message names the bad field; nothing is half-applied. Changes live in memory until POST /v1/save writes the running configuration back to the file. A TCP listener needs `Authorization: Bearer <token>` (401 without it); `Authorization: Basic` with the token as the password (any user name: a browser's login) may only read (GET, HEAD). The unix socket is guarded by its mode (0600, or 0660 for runtime.api_group) and needs none. GET / is a status page (HTML, its script and style under /ui/) over these endpoints. 401 without a valid token, 503 from /v1/health when the data plane is broken (its problems listed). Status codes: 400 when a request does not match this document (the message names the field), 404 for a missing service, backend, worker or endpoint, 405 with an Allow header for a method a path does not take, 409 for duplicates and for changes that need a restart, 422 for well-formed requests the configuration cannot take (a combination that does not apply, a table size that is not prime, a backend of the wrong family), 503 when a worker does not answer in time. This document is generated from the code (`vectorlb openapi` prints it)."
    ),
    servers((url = "http://127.0.0.1:9180")),
    modifiers(&BearerAuth),
    paths(
        health, list_services, add_service, get_service, edit_service, delete_service, add_backend, edit_backend,
        delete_backend, batch, sessions, stats, ports, neighbors, config, reload, save, ha, set_ha, sync, bgp, drain, history, pods, add_pod, delete_pod, policy, change_policy, policy_denied, mesh, set_mesh, clear_mesh, metrics, openapi
    )
)]
pub struct LbApiDoc;

/// A TCP API needs `Authorization: Bearer <token>` (runtime.api_token_file); a unix socket is
/// guarded by its permissions and needs none.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
        doc.components.get_or_insert_with(Default::default).add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        doc.security = Some(vec![SecurityRequirement::default(), SecurityRequirement::new("bearer", Vec::<String>::new())]);
    }
}

/// The document as served at `/openapi.json`.
pub fn openapi_json() -> String {
    LbApiDoc::openapi().to_pretty_json().expect("the generated document serialises") + "\n"
}

/// A required path parameter.
fn path_param(name: &str, desc: &str, schema: Schema) -> Parameter {
    ParameterBuilder::new().name(name).parameter_in(ParameterIn::Path).required(utoipa::openapi::Required::True).description(Some(desc)).schema(Some(schema)).build()
}

fn port_schema() -> Schema {
    Schema::Object(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0.0)).maximum(Some(65535.0)).build())
}

fn service_params() -> Vec<Parameter> {
    let proto = ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["tcp", "udp"])).build();
    vec![
        path_param("proto", "tcp or udp", Schema::Object(proto)),
        path_param("vip", "The service's virtual address", ip_schema()),
        path_param("port", "The service's port (0: every port)", port_schema()),
    ]
}

/// `/v1/services/{proto}/{vip}/{port}`.
struct ServicePath;

impl IntoParams for ServicePath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        service_params()
    }
}

/// `/v1/services/{proto}/{vip}/{port}/backends/{addr}/{bport}`.
struct BackendPath;

impl IntoParams for BackendPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let mut p = service_params();
        p.push(path_param("addr", "The backend's address", ip_schema()));
        p.push(path_param("bport", "The backend's port", port_schema()));
        p
    }
}

fn ip_of(field: &str, s: &str) -> Result<IpAddr, ApiError> {
    s.trim_matches(|c| c == '[' || c == ']').parse().map_err(|_| ApiError::BadRequest(format!("{field}: '{s}' is not an IP address")))
}

fn port_of(field: &str, s: &str) -> Result<u16, ApiError> {
    s.parse().map_err(|_| ApiError::BadRequest(format!("{field}: '{s}' is not a port number (0..=65535)")))
}

fn service_key(proto: &str, vip: &str, port: &str) -> Result<ServiceKey, ApiError> {
    Ok(ServiceKey {
        proto: Proto::parse(proto).ok_or_else(|| ApiError::BadRequest(format!("proto: '{proto}' is not tcp or udp")))?,
        vip: ip_of("vip", vip)?,
        port: port_of("port", port)?,
    })
}

fn check_weight(field: &str, w: u32) -> Result<(), ApiError> {
    if w > MAX_WEIGHT {
        return Err(ApiError::BadRequest(format!("{field}: {w} is above {MAX_WEIGHT}")));
    }
    Ok(())
}

fn check_table(t: Option<u32>) -> Result<(), ApiError> {
    match t {
        Some(n) if !TABLE_SIZE.contains(&n) => Err(ApiError::BadRequest(format!("table_size: {n} is outside {}..={}", TABLE_SIZE.start(), TABLE_SIZE.end()))),
        _ => Ok(()),
    }
}

/// Whether the data plane works, and the configuration generation.
#[utoipa::path(get, path = "/v1/health", responses(
    (status = 200, body = Health, description = "Every port has its XDP program and link, every worker runs"),
    (status = 503, body = Health, description = "Degraded: `problems` says what is wrong"),
))]
async fn health(State(lb): Lb) -> Result<Response, ApiError> {
    let h = call(lb, |lb| lb.health()).await?;
    let status = if h.problems.is_empty() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    Ok((status, Json(h)).into_response())
}

/// Services with their backends and counters.
#[utoipa::path(get, path = "/v1/services", responses((status = 200, body = Vec<ServiceStatus>)))]
async fn list_services(State(lb): Lb) -> Result<Json<Vec<ServiceStatus>>, ApiError> {
    Ok(Json(call(lb, |lb| lb.services()).await?))
}

/// Adds a service.
#[utoipa::path(post, path = "/v1/services", request_body = NewService, responses(
    (status = 201, body = Created),
    (status = 400, body = ErrorBody, description = "The request does not match this document; nothing changed"),
    (status = 409, body = ErrorBody, description = "The service exists already"),
    (status = 422, body = ErrorBody, description = "The configuration cannot take it; nothing changed"),
))]
async fn add_service(State(lb): Lb, JsonBody(s): JsonBody<NewService>) -> Result<Response, ApiError> {
    check_table(s.table_size)?;
    for (i, b) in s.backends.iter().enumerate() {
        check_weight(&format!("backends[{i}].weight"), b.weight)?;
    }
    let created = format!("{}/{}/{}", s.proto.name(), s.vip, s.port);
    call(lb, move |lb| lb.add_service(s)).await??;
    Ok((StatusCode::CREATED, Json(Created { created })).into_response())
}

/// One service.
#[utoipa::path(get, path = "/v1/services/{proto}/{vip}/{port}", params(ServicePath), responses(
    (status = 200, body = ServiceStatus),
    (status = 400, body = ErrorBody, description = "A malformed path"),
    (status = 404, body = ErrorBody, description = "No such service"),
))]
async fn get_service(State(lb): Lb, Path((p, vip, port)): Path<(String, String, String)>) -> Result<Json<ServiceStatus>, ApiError> {
    let k = service_key(&p, &vip, &port)?;
    let key_vip = k.vip.to_string();
    call(lb, move |lb| {
        lb.services().into_iter().find(|s| s.proto == k.proto && s.vip == key_vip && s.port == k.port).map(Json).ok_or_else(|| ApiError::NotFound(format!("no {k}")))
    })
    .await?
}

/// Changes a service's scheduler, table size or TOA.
#[utoipa::path(patch, path = "/v1/services/{proto}/{vip}/{port}", params(ServicePath), request_body = ServicePatch, responses(
    (status = 200, body = Updated),
    (status = 400, body = ErrorBody, description = "The request does not match this document"),
    (status = 404, body = ErrorBody, description = "No such service"),
    (status = 422, body = ErrorBody, description = "The configuration cannot take it; nothing changed"),
))]
async fn edit_service(State(lb): Lb, Path((p, vip, port)): Path<(String, String, String)>, JsonBody(patch): JsonBody<ServicePatch>) -> Result<Json<Updated>, ApiError> {
    let k = service_key(&p, &vip, &port)?;
    check_table(patch.table_size)?;
    call(lb, move |lb| lb.edit_service(k, patch)).await??;
    Ok(Json(Updated { updated: true, weight: None }))
}

/// Removes a service (its sessions end).
#[utoipa::path(delete, path = "/v1/services/{proto}/{vip}/{port}", params(ServicePath), responses(
    (status = 200, body = Deleted),
    (status = 400, body = ErrorBody, description = "A malformed path"),
    (status = 404, body = ErrorBody, description = "No such service"),
    (status = 422, body = ErrorBody, description = "The configuration cannot take it; nothing changed"),
))]
async fn delete_service(State(lb): Lb, Path((p, vip, port)): Path<(String, String, String)>) -> Result<Json<Deleted>, ApiError> {
    let k = service_key(&p, &vip, &port)?;
    call(lb, move |lb| lb.delete_service(k)).await??;
    Ok(Json(Deleted { deleted: true }))
}

/// Applies several service changes as one: all of them or none.
#[utoipa::path(post, path = "/v1/batch", request_body = Batch, responses(
    (status = 200, body = BatchDone),
    (status = 400, body = ErrorBody, description = "The request does not match this document, or has more than 100,000 operations"),
    (status = 422, body = ErrorBody, description = "An operation the configuration cannot take; the body's `op` names it (its index and why), and the message begins with ops[i]"),
))]
async fn batch(State(lb): Lb, JsonBody(b): JsonBody<Batch>) -> Result<Json<BatchDone>, ApiError> {
    if b.ops.len() > MAX_BATCH {
        return Err(ApiError::BadRequest(format!("ops: {} operations, at most {MAX_BATCH}", b.ops.len())));
    }
    for (i, op) in b.ops.iter().enumerate() {
        if let BatchOp::Put(s) = op {
            let at = |e: ApiError| ApiError::Op { index: i, error: Box::new(e) };
            check_table(s.table_size).map_err(|e| at(ApiError::BadRequest(format!("put.{e}"))))?;
            for (j, be) in s.backends.iter().enumerate() {
                check_weight(&format!("put.backends[{j}].weight"), be.weight).map_err(at)?;
            }
        }
    }
    let applied = b.ops.len();
    let generation = call(lb, move |lb| lb.batch(b.ops)).await??;
    Ok(Json(BatchDone { applied, generation }))
}

/// Adds a backend to a service.
#[utoipa::path(post, path = "/v1/services/{proto}/{vip}/{port}/backends", params(ServicePath), request_body = NewBackend, responses(
    (status = 201, body = Created),
    (status = 400, body = ErrorBody, description = "The request does not match this document"),
    (status = 404, body = ErrorBody, description = "No such service"),
    (status = 409, body = ErrorBody, description = "The backend is in the service already"),
    (status = 422, body = ErrorBody, description = "The configuration cannot take it (a backend of the other family, ...)"),
))]
async fn add_backend(State(lb): Lb, Path((p, vip, port)): Path<(String, String, String)>, JsonBody(b): JsonBody<NewBackend>) -> Result<Response, ApiError> {
    let k = service_key(&p, &vip, &port)?;
    check_weight("weight", b.weight)?;
    let created = SocketAddr::new(b.addr, b.port).to_string();
    call(lb, move |lb| lb.add_backend(k, b)).await??;
    Ok((StatusCode::CREATED, Json(Created { created })).into_response())
}

/// Sets a backend's weight (0 drains it: no new sessions, existing ones continue).
#[utoipa::path(patch, path = "/v1/services/{proto}/{vip}/{port}/backends/{addr}/{bport}", params(BackendPath), request_body = BackendPatch, responses(
    (status = 200, body = Updated),
    (status = 400, body = ErrorBody, description = "The request does not match this document"),
    (status = 404, body = ErrorBody, description = "No such service or backend"),
    (status = 422, body = ErrorBody, description = "The configuration cannot take it; nothing changed"),
))]
async fn edit_backend(
    State(lb): Lb,
    Path((p, vip, port, addr, bport)): Path<(String, String, String, String, String)>,
    JsonBody(patch): JsonBody<BackendPatch>,
) -> Result<Json<Updated>, ApiError> {
    let k = service_key(&p, &vip, &port)?;
    let be = SocketAddr::new(ip_of("backend address", &addr)?, port_of("backend port", &bport)?);
    check_weight("weight", patch.weight)?;
    let w = patch.weight;
    call(lb, move |lb| lb.set_weight(k, be, w)).await??;
    Ok(Json(Updated { updated: true, weight: Some(w) }))
}

/// Removes a backend from a service.
#[utoipa::path(delete, path = "/v1/services/{proto}/{vip}/{port}/backends/{addr}/{bport}", params(BackendPath), responses(
    (status = 200, body = Deleted),
    (status = 400, body = ErrorBody, description = "A malformed path"),
    (status = 404, body = ErrorBody, description = "No such service or backend"),
    (status = 422, body = ErrorBody, description = "The configuration cannot take it; nothing changed"),
))]
async fn delete_backend(State(lb): Lb, Path((p, vip, port, addr, bport)): Path<(String, String, String, String, String)>) -> Result<Json<Deleted>, ApiError> {
    let k = service_key(&p, &vip, &port)?;
    let be = SocketAddr::new(ip_of("backend address", &addr)?, port_of("backend port", &bport)?);
    call(lb, move |lb| lb.delete_backend(k, be)).await??;
    Ok(Json(Deleted { deleted: true }))
}

fn session_query(q: &HashMap<String, String>) -> Result<SessionQuery, ApiError> {
    let num = |k: &str, d: u64, min: u64, max: u64| -> Result<u64, ApiError> {
        match q.get(k) {
            None => Ok(d),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(n),
                _ => Err(ApiError::BadRequest(format!("{k}: '{v}' is not an integer in {min}..={max}"))),
            },
        }
    };
    let v6 = match q.get("family").map(String::as_str) {
        None | Some("4") => false,
        Some("6") => true,
        Some(f) => return Err(ApiError::BadRequest(format!("family: '{f}' is not 4 or 6"))),
    };
    Ok(SessionQuery { worker: num("worker", 0, 0, 65535)? as u16, v6, cursor: num("cursor", 0, 0, u32::MAX as u64)? as u32, limit: num("limit", 100, 1, 10_000)? as u32 })
}

/// A page of one worker's sessions.
#[utoipa::path(get, path = "/v1/sessions", params(SessionQuery), responses(
    (status = 200, body = SessionPage, description = "Sessions; next_cursor is null on the last page"),
    (status = 400, body = ErrorBody, description = "A query parameter out of range"),
    (status = 404, body = ErrorBody, description = "No such worker"),
    (status = 503, body = ErrorBody, description = "The worker did not answer in time"),
))]
async fn sessions(State(lb): Lb, Query(q): Query<HashMap<String, String>>) -> Result<Json<SessionPage>, ApiError> {
    let q = session_query(&q)?;
    Ok(Json(call(lb, move |lb| lb.sessions(q)).await??))
}

/// Global counters: the pipeline's, drops by reason, the worker loops', sessions.
#[utoipa::path(get, path = "/v1/stats", responses((status = 200, body = Stats)))]
async fn stats(State(lb): Lb) -> Result<Json<Stats>, ApiError> {
    Ok(Json(call(lb, |lb| lb.stats()).await?))
}

/// The DPDK ports with their counters and link state.
#[utoipa::path(get, path = "/v1/ports", responses((status = 200, body = Vec<PortStatus>)))]
async fn ports(State(lb): Lb) -> Result<Json<Vec<PortStatus>>, ApiError> {
    Ok(Json(call(lb, |lb| lb.ports()).await?))
}

/// The interfaces of this node's pods (the pods port, `[ports.pods]`).
#[utoipa::path(get, path = "/v1/pods", responses(
    (status = 200, body = Vec<PodStatus>),
    (status = 404, body = ErrorBody, description = "No pods port in the configuration"),
))]
async fn pods(State(lb): Lb) -> Result<Json<Vec<PodStatus>>, ApiError> {
    Ok(Json(call(lb, |lb| lb.pods()).await??))
}

/// Attaches a pod: a tun interface in its network namespace, configured with its addresses,
/// MTU and default routes, read and written by the data plane from then on (the CNI plugin's
/// ADD). Kept across restarts of the daemon. The same attachment again answers as it stands.
#[utoipa::path(post, path = "/v1/pods", request_body = NewPod, responses(
    (status = 201, body = PodStatus),
    (status = 400, body = ErrorBody, description = "A malformed body, id, name or address"),
    (status = 404, body = ErrorBody, description = "No pods port, or no such network namespace"),
    (status = 409, body = ErrorBody, description = "An address another pod has, or this attachment with other addresses"),
    (status = 422, body = ErrorBody, description = "An address outside the node's pod networks, or the port is full"),
))]
async fn add_pod(State(lb): Lb, JsonBody(p): JsonBody<NewPod>) -> Result<(StatusCode, Json<PodStatus>), ApiError> {
    Ok((StatusCode::CREATED, Json(call(lb, move |lb| lb.add_pod(p)).await??)))
}

/// Detaches a pod's interface and removes it from its namespace (the CNI plugin's DEL).
#[utoipa::path(delete, path = "/v1/pods/{container_id}/{ifname}", params(("container_id" = String, Path), ("ifname" = String, Path)), responses(
    (status = 200, body = Deleted),
    (status = 404, body = ErrorBody, description = "No pods port, or no such attachment"),
))]
async fn delete_pod(State(lb): Lb, Path((id, ifname)): Path<(String, String)>) -> Result<Json<Deleted>, ApiError> {
    let (i, n) = (id.clone(), ifname.clone());
    if call(lb, move |lb| lb.delete_pod(&i, &n)).await?? {
        Ok(Json(Deleted { deleted: true }))
    } else {
        Err(ApiError::NotFound(format!("no pod interface {ifname} of {id}")))
    }
}

/// The mesh's steering on this node: whether TCP between meshed pods goes to the node proxy.
#[utoipa::path(get, path = "/v1/mesh", responses((status = 200, body = MeshStatus)))]
async fn mesh(State(lb): Lb) -> Result<Json<MeshStatus>, ApiError> {
    Ok(Json(call(lb, |lb| lb.mesh()).await?))
}

/// Replaces the mesh's steering: the node proxy's pod attachment and every meshed pod's
/// address (docs/mesh.md). All or nothing.
#[utoipa::path(put, path = "/v1/mesh", request_body = MeshSteering, responses(
    (status = 200, body = MeshStatus),
    (status = 400, description = "A bad address or port, too many members", body = ErrorBody),
    (status = 404, description = "No pods port, or no such proxy attachment", body = ErrorBody)
))]
async fn set_mesh(State(lb): Lb, JsonBody(m): JsonBody<MeshSteering>) -> Result<Json<MeshStatus>, ApiError> {
    Ok(Json(call(lb, move |lb| lb.set_mesh(m)).await??))
}

/// Stops the mesh's steering (meshed pods' traffic goes where it is addressed again).
#[utoipa::path(delete, path = "/v1/mesh", responses((status = 200, body = MeshStatus)))]
async fn clear_mesh(State(lb): Lb) -> Result<Json<MeshStatus>, ApiError> {
    Ok(Json(call(lb, |lb| lb.clear_mesh()).await?))
}

/// The node's network policy set (what `vectorlb kube` compiled from NetworkPolicy and the
/// admin policies) and the flows it denied, by policy and by endpoint.
#[utoipa::path(get, path = "/v1/policy", responses((status = 200, body = PolicyStatus)))]
async fn policy(State(lb): Lb) -> Result<Json<PolicyStatus>, ApiError> {
    Ok(Json(call(lb, |lb| lb.policy()).await?))
}

/// Changes the node's network policy set by difference (identities, prefixes and endpoints
/// added, replaced or removed), as one edit: applied whole to new flows, or refused. Flows
/// allowed before go on.
#[utoipa::path(post, path = "/v1/policy", request_body = PolicyChanges, responses(
    (status = 200, body = PolicyStatus),
    (status = 400, body = ErrorBody, description = "A malformed body, prefix, port range, action or name; a set above the limits"),
))]
async fn change_policy(State(lb): Lb, JsonBody(c): JsonBody<PolicyChanges>) -> Result<Json<PolicyStatus>, ApiError> {
    Ok(Json(call(lb, move |lb| lb.change_policy(c)).await??))
}

/// Denied flows logged after `after` (a sequence number; 0 or none: all kept), oldest first. Ask
/// again with `after` = `next` to follow them.
#[utoipa::path(get, path = "/v1/policy/denied", params(("after" = Option<u64>, Query, description = "Entries after this sequence number")), responses(
    (status = 200, body = PolicyDeniedLog),
    (status = 400, body = ErrorBody, description = "after: not a number"),
))]
async fn policy_denied(State(lb): Lb, Query(q): Query<HashMap<String, String>>) -> Result<Json<PolicyDeniedLog>, ApiError> {
    let after = match q.get("after") {
        None => 0,
        Some(v) => v.parse::<u64>().map_err(|_| ApiError::BadRequest(format!("after: '{}' is not a sequence number", v.escape_debug())))?,
    };
    Ok(Json(call(lb, move |lb| lb.policy_denied(after)).await?))
}

/// Static and learned neighbours.
#[utoipa::path(get, path = "/v1/neighbors", responses((status = 200, body = Vec<Neighbor>)))]
async fn neighbors(State(lb): Lb) -> Result<Json<Vec<Neighbor>>, ApiError> {
    Ok(Json(call(lb, |lb| lb.neighbors()).await?))
}

/// The running configuration as a TOML file.
#[utoipa::path(get, path = "/v1/config", responses((status = 200, content_type = "application/toml", body = String)))]
async fn config(State(lb): Lb) -> Result<Response, ApiError> {
    let text = call(lb, |lb| lb.config_toml()).await?;
    Ok(([(header::CONTENT_TYPE, "application/toml")], text).into_response())
}

/// Re-reads the configuration file and applies it, all or nothing (as SIGHUP does).
#[utoipa::path(post, path = "/v1/reload", responses(
    (status = 200, body = Reloaded),
    (status = 409, body = ErrorBody, description = "The file changes what needs a restart (ports, [runtime], [global])"),
    (status = 422, body = ErrorBody, description = "The file is invalid; the running configuration is kept"),
))]
async fn reload(State(lb): Lb) -> Result<Json<Reloaded>, ApiError> {
    let generation = call(lb, |lb| lb.reload()).await??;
    Ok(Json(Reloaded { reloaded: true, generation }))
}

/// Writes the running configuration back to its file (atomically).
#[utoipa::path(post, path = "/v1/save", responses(
    (status = 200, body = Saved),
    (status = 500, body = ErrorBody, description = "The file could not be written"),
))]
async fn save(State(lb): Lb) -> Result<Json<Saved>, ApiError> {
    Ok(Json(call(lb, |lb| lb.save()).await??))
}

/// This node's HA state.
#[utoipa::path(get, path = "/v1/ha", responses((status = 200, body = HaStatus)))]
async fn ha(State(lb): Lb) -> Result<Json<HaStatus>, ApiError> {
    Ok(Json(call(lb, |lb| lb.ha()).await?))
}

/// Sets the HA state (keepalived's notify scripts). BACKUP stops answering ARP / ND for VIPs and
/// local addresses; MASTER announces them (gratuitous ARP, unsolicited neighbour advertisements).
#[utoipa::path(post, path = "/v1/ha", request_body = HaChange, responses(
    (status = 200, body = HaChanged),
    (status = 400, body = ErrorBody, description = "The request does not match this document"),
))]
async fn set_ha(State(lb): Lb, JsonBody(c): JsonBody<HaChange>) -> Result<Json<HaChanged>, ApiError> {
    let state = c.state;
    let previous = call(lb, move |lb| lb.set_ha(state)).await?;
    Ok(Json(HaChanged { state, previous }))
}

/// Session synchronisation counters.
#[utoipa::path(get, path = "/v1/sync", responses((status = 200, body = SyncStatus)))]
async fn sync(State(lb): Lb) -> Result<Json<SyncStatus>, ApiError> {
    Ok(Json(call(lb, |lb| lb.sync()).await?))
}

/// The BGP speaker: the VIPs announced and withheld (and why), BIRD, the neighbours' sessions,
/// a drain. 404 without `[bgp]`.
#[utoipa::path(get, path = "/v1/bgp", responses(
    (status = 200, body = BgpStatus),
    (status = 404, body = ErrorBody, description = "No [bgp] in the configuration"),
))]
async fn bgp(State(lb): Lb) -> Result<Json<BgpStatus>, ApiError> {
    call(lb, |lb| lb.bgp()).await?.map(Json).ok_or_else(|| ApiError::NotFound("no [bgp] in the configuration: nothing is announced by BGP".into()))
}

/// Drains this node (`vectorlb ctl drain`): withdraws every VIP at once and keeps serving the
/// flows that still arrive until they end or the deadline passes (state `draining`, then
/// `drained`); `drain: false` announces them again.
#[utoipa::path(post, path = "/v1/drain", request_body = DrainChange, responses(
    (status = 200, body = BgpStatus),
    (status = 400, body = ErrorBody, description = "The request does not match this document"),
    (status = 404, body = ErrorBody, description = "No [bgp] in the configuration"),
    (status = 422, body = ErrorBody, description = "A deadline out of range"),
))]
async fn drain(State(lb): Lb, JsonBody(c): JsonBody<DrainChange>) -> Result<Json<BgpStatus>, ApiError> {
    if let Some(d) = c.deadline_seconds {
        if !(1..=86_400).contains(&d) {
            return Err(ApiError::Unprocessable(format!("deadline_seconds: {d} is not within 1..=86400")));
        }
    }
    Ok(Json(call(lb, move |lb| lb.drain(c)).await??))
}

/// The last two minutes of new sessions, packets and bytes per second for every service and
/// backend, one point a second (each the 10 s sliding-window rate): the status page's charts.
#[utoipa::path(get, path = "/v1/history", responses((status = 200, body = History)))]
async fn history(State(lb): Lb) -> Result<Json<History>, ApiError> {
    Ok(Json(call(lb, |lb| lb.history()).await?))
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(get, path = "/metrics", responses((status = 200, content_type = "text/plain", body = String)))]
async fn metrics(State(lb): Lb) -> Result<Response, ApiError> {
    let text = call(lb, |lb| lb.metrics()).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, content_type = "application/json", body = Object)))]
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}
