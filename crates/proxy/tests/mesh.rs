//! The mesh's tunnels between two node proxies in one process, on loopback addresses standing
//! for pods (no root needed): mutual TLS by workload identity, the server seeing its client's
//! address, authorization, identities a node does not run, certificate and CA rotation under
//! load, malformed tunnel requests.

use boring::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
use bytes::Bytes;
use http_body_util::Empty;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use vectorlb_proxy::config::{CryptoMbBackend, CryptoMbFallback, Provider};
use vectorlb_proxy::mesh::authz::{Authz, Policy};
use vectorlb_proxy::mesh::ca::{new_key, request, Authority, Bundle, Placement, Svid};
use vectorlb_proxy::mesh::hbone::{Node, State, Workload};
use vectorlb_proxy::mesh::identity::SpiffeId;
use vectorlb_proxy::tls::KeySigner;

const TD: &str = "cluster.local";
const WEB: &str = "127.0.0.11";
const BATCH: &str = "127.0.0.12";
const DB: &str = "127.0.0.21";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn id(ns: &str, sa: &str) -> SpiffeId {
    SpiffeId::new(TD, ns, sa).unwrap()
}

/// Answers each connection with the address it came from, then echoes lines.
async fn echo(at: &str) -> SocketAddr {
    let l = TcpListener::bind((ip(at), 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, peer)) = l.accept().await else { return };
            tokio::spawn(async move {
                let _ = s.write_all(format!("peer={peer}\n").as_bytes()).await;
                let (r, mut w) = s.split();
                let _ = tokio::io::copy(&mut BufReader::new(r), &mut w).await;
            });
        }
    });
    addr
}

/// Passes bytes between its listener and `to`, keeping what the client side sent.
async fn tap(at: &str, to: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind((ip(at), 0)).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (addr, s2) = (l.local_addr().unwrap(), seen.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = l.accept().await else { return };
            let seen = s2.clone();
            tokio::spawn(async move {
                let Ok(mut up) = TcpStream::connect(to).await else { return };
                let (mut cr, mut cw) = c.split();
                let (mut ur, mut uw) = up.split();
                let a = async {
                    let mut buf = [0u8; 16384];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 || uw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        seen.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = uw.shutdown().await;
                };
                let b = async {
                    let _ = tokio::io::copy(&mut ur, &mut cw).await;
                    let _ = cw.shutdown().await;
                };
                tokio::join!(a, b);
            });
        }
    });
    (addr, seen)
}

struct Mesh {
    ca: Authority,
    placement: Placement,
    a: Arc<Node>,
    b: Arc<Node>,
    echo: SocketAddr,
    outbound: SocketAddr,
    workloads: HashMap<IpAddr, Workload>,
}

fn workload(at: &str, ns: &str, sa: &str, node: &str, hbone: SocketAddr, app: &str) -> Workload {
    Workload { ip: ip(at), namespace: ns.into(), account: sa.into(), labels: BTreeMap::from([("app".into(), app.into())]), node: node.into(), hbone }
}

/// Certificates for what `node` runs, each through a signing request and the placement check.
fn issue(ca: &Authority, placement: &Placement, node: &str, ids: &[SpiffeId], ttl: Duration) -> Vec<Svid> {
    ids.iter()
        .map(|i| {
            placement.authorize(node, i).unwrap();
            let key = new_key().unwrap();
            let cert = ca.sign_request(i, request(i, &key).unwrap().as_bytes(), ttl, SystemTime::now()).unwrap();
            Svid::new(key, vec![cert]).unwrap()
        })
        .collect()
}

fn state(node: &str, workloads: &HashMap<IpAddr, Workload>, policies: Vec<Policy>) -> State {
    State { node: node.into(), trust_domain: TD.into(), workloads: workloads.clone(), authz: Authz::new("istio-system", policies) }
}

/// Node A runs web and batch, node B runs db (an echo server); B's tunnels arrive through `tap`
/// when asked, so the test sees the bytes between the nodes.
async fn mesh(policies: Vec<Policy>, tapped: bool) -> (Mesh, Option<Arc<Mutex<Vec<u8>>>>) {
    mesh_with(policies, tapped, None).await
}

async fn mesh_with(policies: Vec<Policy>, tapped: bool, provider: Option<Provider>) -> (Mesh, Option<Arc<Mutex<Vec<u8>>>>) {
    let signer = |node: &str| provider.map(|p| KeySigner::new(node, &p).unwrap());
    let ca = Authority::generate(TD, Duration::from_secs(86_400)).unwrap();
    let mut placement = Placement::default();
    placement.insert("node-a", "shop", "web");
    placement.insert("node-a", "jobs", "batch");
    placement.insert("node-b", "shop", "db");
    let echo = echo(DB).await;
    let inbound = TcpListener::bind((ip(DB), 0)).await.unwrap();
    let mut hbone = inbound.local_addr().unwrap();
    let mut seen = None;
    if tapped {
        let (t, s) = tap("127.0.0.41", hbone).await;
        hbone = t;
        seen = Some(s);
    }
    let unused: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let workloads = HashMap::from([
        (ip(WEB), workload(WEB, "shop", "web", "node-a", unused, "web")),
        (ip(BATCH), workload(BATCH, "jobs", "batch", "node-a", unused, "batch")),
        (ip(DB), workload(DB, "shop", "db", "node-b", hbone, "db")),
    ]);
    let bundle = Bundle::new(TD, vec![ca.certificate().clone()]).unwrap();
    let a = Node::with_signer(state("node-a", &workloads, vec![]), true, signer("node-a"));
    a.set_identities(issue(&ca, &placement, "node-a", &[id("shop", "web"), id("jobs", "batch")], Duration::from_secs(3600)), bundle.clone()).unwrap();
    let b = Node::with_signer(state("node-b", &workloads, policies), true, signer("node-b"));
    b.set_identities(issue(&ca, &placement, "node-b", &[id("shop", "db")], Duration::from_secs(3600)), bundle).unwrap();
    tokio::spawn(b.clone().serve_inbound(inbound));
    let out = TcpListener::bind("127.0.0.31:0").await.unwrap();
    let outbound = out.local_addr().unwrap();
    // The data plane steers a pod's connection with its destination intact; here every
    // connection to the outbound listener is for the echo server.
    tokio::spawn(a.clone().serve_outbound_with(out, move |_| Ok(echo)));
    (Mesh { ca, placement, a, b, echo, outbound, workloads }, seen)
}

/// A connection from the pod at `from` through node A: the peer address the server saw, and
/// whether a line came back.
async fn call(m: &Mesh, from: &str, line: &str) -> Result<String, String> {
    let s = TcpSocket::new_v4().unwrap();
    s.bind((ip(from), 0).into()).unwrap();
    let mut c = s.connect(m.outbound).await.map_err(|e| e.to_string())?;
    c.write_all(format!("{line}\n").as_bytes()).await.map_err(|e| e.to_string())?;
    let mut r = BufReader::new(c);
    let mut peer = String::new();
    let mut back = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        r.read_line(&mut peer).await?;
        r.read_line(&mut back).await
    })
    .await
    .map_err(|_| "timed out".to_string())?
    .map_err(|e| e.to_string())?;
    if back.trim_end() != line {
        return Err(format!("closed (peer line {peer:?}, echo {back:?})"));
    }
    Ok(peer.trim_end().trim_start_matches("peer=").to_string())
}

fn metric(text: &str, line_start: &str) -> u64 {
    text.lines().find(|l| l.starts_with(line_start)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshed_pods_talk_over_mutual_tls_and_the_server_sees_the_client() {
    let (m, seen) = mesh(vec![], true).await;
    for i in 0..3 {
        let peer = call(&m, WEB, &format!("secret-{i}")).await.unwrap();
        assert!(peer.starts_with(&format!("{WEB}:")), "the server saw {peer}");
    }
    // One TLS connection between the nodes, its streams multiplexed.
    assert_eq!(m.a.stats.tunnels_opened.load(Ordering::Relaxed), 1);
    assert_eq!(m.b.stats.handshakes.load(Ordering::Relaxed), 1);
    let wire = seen.unwrap().lock().unwrap().clone();
    assert_eq!(&wire[..2], &[0x16, 0x03], "the nodes' connection opens with a TLS handshake record");
    assert!(!wire.windows(6).any(|w| w == b"secret"), "plain text between the nodes");
    assert!(!wire.windows(7).any(|w| w == b"CONNECT"), "the tunnel request in the clear");
    let pair = "{source=\"cluster.local/ns/shop/sa/web\",destination=\"cluster.local/ns/shop/sa/db\"}";
    // Bytes are counted when a stream ends (the last one may still be closing).
    let sent = format!("vectorlb_mesh_inbound_sent_bytes_total{pair}");
    for _ in 0..100 {
        if metric(&m.b.stats.render(), &sent) == 3 * "secret-0\n".len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = m.b.stats.render();
    assert_eq!(metric(&text, &format!("vectorlb_mesh_inbound_streams_total{pair}")), 3);
    assert_eq!(metric(&text, &sent), 3 * "secret-0\n".len() as u64);
    assert!(metric(&m.a.stats.render(), &format!("vectorlb_mesh_outbound_received_bytes_total{pair}")) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_sign_through_the_cryptomb_provider_on_both_sides() {
    // The portable lanes run on every CPU; crypto_mb's own where AVX-512 IFMA is (else inline).
    for backend in [CryptoMbBackend::Portable, CryptoMbBackend::CryptoMb] {
        let p = Provider::CryptoMb { poll_delay: Duration::from_millis(1), backend, fallback: CryptoMbFallback::Inline };
        let (m, _) = mesh_with(vec![], false, Some(p)).await;
        let peer = call(&m, WEB, "signed").await.unwrap();
        assert!(peer.starts_with(&format!("{WEB}:")), "{peer}");
        assert_eq!(m.b.stats.handshakes.load(Ordering::Relaxed), 1);
        for node in [&m.a, &m.b] {
            let s = node.signer_stats().unwrap();
            if s.fallback_reason.is_none() {
                assert_eq!(s.offloaded.load(Ordering::Relaxed), 1, "{backend:?}: one signature each side (server and client certificate)");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pooling_each_connection_has_a_tunnel_and_a_full_handshake() {
    let (m, _) = mesh(vec![], false).await;
    m.a.set_pooling(false);
    for i in 0..3 {
        call(&m, WEB, &format!("x{i}")).await.unwrap();
    }
    assert_eq!(m.a.stats.tunnels_opened.load(Ordering::Relaxed), 3);
    assert_eq!(m.b.stats.handshakes.load(Ordering::Relaxed), 3);
    // Each side checked the other's chain once; the two later handshakes found the same bytes
    // already verified (each still proved its key).
    for n in [&m.a, &m.b] {
        assert_eq!((n.stats.chains_verified.load(Ordering::Relaxed), n.stats.chains_cached.load(Ordering::Relaxed)), (1, 2));
    }
    // New certificates (a rotation) start new caches: checked in full once more.
    let bundle = Bundle::new(TD, vec![m.ca.certificate().clone()]).unwrap();
    m.b.set_identities(issue(&m.ca, &m.placement, "node-b", &[id("shop", "db")], Duration::from_secs(3600)), bundle).unwrap();
    call(&m, WEB, "z").await.unwrap();
    assert_eq!(m.b.stats.chains_verified.load(Ordering::Relaxed), 2);
    assert_eq!(m.a.stats.chains_verified.load(Ordering::Relaxed), 2, "db's new certificate is new bytes");
    m.a.set_pooling(true);
    for i in 0..3 {
        call(&m, WEB, &format!("y{i}")).await.unwrap();
    }
    assert_eq!(m.a.stats.tunnels_opened.load(Ordering::Relaxed), 5, "four unpooled, then one for three");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_identity_is_refused_and_counted() {
    let only_web = Policy::compile(
        "shop",
        "db-from-web",
        &serde_json::json!({"selector": {"matchLabels": {"app": "db"}}, "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/web"]}}]}]}),
    )
    .unwrap()
    .unwrap();
    let (m, _) = mesh(vec![only_web], false).await;
    assert!(call(&m, WEB, "hi").await.is_ok());
    assert!(call(&m, BATCH, "hi").await.is_err(), "batch is not allowed to db");
    let e = m.a.connect(format!("{BATCH}:4000").parse().unwrap(), m.echo).await.err().unwrap();
    assert!(e.to_string().contains("authorization policy"), "{e}");
    let text = m.b.stats.render();
    assert_eq!(metric(&text, "vectorlb_mesh_inbound_denied_total{source=\"cluster.local/ns/jobs/sa/batch\""), 2);
    assert_eq!(metric(&text, "vectorlb_mesh_inbound_denied_total{source=\"cluster.local/ns/shop/sa/web\""), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cannot_speak_for_identities_it_does_not_run() {
    let (m, _) = mesh(vec![], false).await;
    // The authority's check: node A runs no pod as shop/db.
    assert!(m.placement.authorize("node-a", &id("shop", "db")).is_err());
    // A node lying about who a pod is: it holds web's certificate and claims batch's address
    // is web. Node B knows batch's address is jobs/batch: 400.
    let mut lie = m.workloads.clone();
    lie.get_mut(&ip(BATCH)).unwrap().namespace = "shop".into();
    lie.get_mut(&ip(BATCH)).unwrap().account = "web".into();
    let rogue = Node::new(state("node-a", &lie, vec![]), false);
    let bundle = Bundle::new(TD, vec![m.ca.certificate().clone()]).unwrap();
    rogue.set_identities(issue(&m.ca, &m.placement, "node-a", &[id("shop", "web")], Duration::from_secs(3600)), bundle.clone()).unwrap();
    let e = rogue.connect(format!("{BATCH}:4000").parse().unwrap(), m.echo).await.err().unwrap();
    assert!(e.to_string().contains("400"), "{e}");
    // The same node speaking for its own pod's address is served.
    let e = rogue.connect(format!("{WEB}:4000").parse().unwrap(), m.echo).await;
    assert!(e.is_ok(), "web's own address is fine: {:?}", e.err());
    // A server presenting another identity than the destination's: the client refuses.
    let impostor = Node::new(state("node-b", &m.workloads, vec![]), false);
    let mut wrong = Placement::default();
    wrong.insert("node-b", "shop", "cache");
    impostor.set_identities(issue(&m.ca, &wrong, "node-b", &[id("shop", "cache")], Duration::from_secs(3600)), bundle).unwrap();
    // (Serving as db's address, with cache's certificate: swap its state so it serves it.)
    let mut as_cache = m.workloads.clone();
    as_cache.get_mut(&ip(DB)).unwrap().account = "cache".into();
    impostor.set_state(state("node-b", &as_cache, vec![]));
    let l = TcpListener::bind((ip(DB), 0)).await.unwrap();
    let at = l.local_addr().unwrap();
    tokio::spawn(impostor.clone().serve_inbound(l));
    let mut to_impostor = m.workloads.clone();
    to_impostor.get_mut(&ip(DB)).unwrap().hbone = at;
    m.a.set_state(state("node-a", &to_impostor, vec![]));
    let e = m.a.connect(format!("{WEB}:4000").parse().unwrap(), m.echo).await.err().unwrap();
    assert!(e.to_string().contains("presented spiffe://cluster.local/ns/shop/sa/cache, not spiffe://cluster.local/ns/shop/sa/db"), "{e}");
    // A node whose certificates come from another authority: no handshake.
    let other = Authority::generate(TD, Duration::from_secs(86_400)).unwrap();
    let stranger = Node::new(state("node-a", &m.workloads, vec![]), false);
    stranger
        .set_identities(issue(&other, &m.placement, "node-a", &[id("shop", "web")], Duration::from_secs(3600)), Bundle::new(TD, vec![other.certificate().clone()]).unwrap())
        .unwrap();
    let failures = m.b.stats.handshake_failures.load(Ordering::Relaxed);
    assert!(stranger.connect(format!("{WEB}:4000").parse().unwrap(), m.echo).await.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(m.b.stats.handshake_failures.load(Ordering::Relaxed), failures + 1);
    // A connection from an address that is no pod of this node gets no tunnel at all.
    let e = m.a.connect("127.0.0.99:4000".parse().unwrap(), m.echo).await.err().unwrap();
    assert!(e.to_string().contains("no meshed pod of this node"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_and_the_authority_rotate_under_load_without_failing_a_request() {
    let (m, _) = mesh(vec![], false).await;
    let m = Arc::new(m);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (m, stop, ok, failed, errors) = (m.clone(), stop.clone(), ok.clone(), failed.clone(), errors.clone());
        clients.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                match call(&m, WEB, &format!("c{c}-{i}")).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        errors.lock().unwrap().push(e);
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                i += 1;
            }
        }));
    }
    let ids_a = [id("shop", "web"), id("jobs", "batch")];
    let ids_b = [id("shop", "db")];
    let old = Bundle::new(TD, vec![m.ca.certificate().clone()]).unwrap();
    let serials = m.a.identities();
    // Workload certificates renewed, several times.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        m.a.set_identities(issue(&m.ca, &m.placement, "node-a", &ids_a, Duration::from_secs(3600)), old.clone()).unwrap();
        m.b.set_identities(issue(&m.ca, &m.placement, "node-b", &ids_b, Duration::from_secs(3600)), old.clone()).unwrap();
    }
    assert_ne!(m.a.identities(), serials);
    // The authority's key replaced: both trusted, then certificates from the new one, then the
    // old one dropped.
    let new_ca = Authority::generate(TD, Duration::from_secs(86_400)).unwrap();
    let both = Bundle::new(TD, vec![m.ca.certificate().clone(), new_ca.certificate().clone()]).unwrap();
    m.b.set_identities(issue(&m.ca, &m.placement, "node-b", &ids_b, Duration::from_secs(3600)), both.clone()).unwrap();
    m.a.set_identities(issue(&m.ca, &m.placement, "node-a", &ids_a, Duration::from_secs(3600)), both.clone()).unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    m.a.set_identities(issue(&new_ca, &m.placement, "node-a", &ids_a, Duration::from_secs(3600)), both.clone()).unwrap();
    m.b.set_identities(issue(&new_ca, &m.placement, "node-b", &ids_b, Duration::from_secs(3600)), both).unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let new = Bundle::new(TD, vec![new_ca.certificate().clone()]).unwrap();
    m.a.set_identities(issue(&new_ca, &m.placement, "node-a", &ids_a, Duration::from_secs(3600)), new.clone()).unwrap();
    m.b.set_identities(issue(&new_ca, &m.placement, "node-b", &ids_b, Duration::from_secs(3600)), new).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert_eq!(failed, 0, "{:?}", errors.lock().unwrap());
    assert!(ok > 20, "only {ok} requests ran");
    // New tunnels were opened for the new certificates.
    assert!(m.a.stats.tunnels_opened.load(Ordering::Relaxed) >= 4, "{}", m.a.stats.tunnels_opened.load(Ordering::Relaxed));
    // The old authority's certificates are no longer accepted.
    let stale = Node::new(state("node-a", &m.workloads, vec![]), false);
    stale.set_identities(issue(&m.ca, &m.placement, "node-a", &ids_a, Duration::from_secs(3600)), old).unwrap();
    assert!(stale.connect(format!("{WEB}:4000").parse().unwrap(), m.echo).await.is_err());
}

/// A tunnel client speaking to node B directly, as web.
async fn raw_tunnel(m: &Mesh) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    let svid = issue(&m.ca, &m.placement, "node-a", &[id("shop", "web")], Duration::from_secs(3600)).remove(0);
    let mut c = SslConnector::builder(SslMethod::tls()).unwrap();
    c.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    c.set_certificate(&svid.chain[0]).unwrap();
    c.set_private_key(&svid.key).unwrap();
    c.set_verify(SslVerifyMode::NONE);
    c.set_alpn_protos(b"\x02h2").unwrap();
    let c = c.build();
    let tcp = TcpStream::connect(m.workloads[&ip(DB)].hbone).await.unwrap();
    let tls = tokio_boring::connect(c.configure().unwrap().verify_hostname(false).use_server_name_indication(false), "", tcp).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    sender
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_tunnel_requests_get_clear_answers() {
    let (m, _) = mesh(vec![], false).await;
    let mut s = raw_tunnel(&m).await;
    let dead = {
        let l = TcpListener::bind((ip(DB), 0)).await.unwrap();
        l.local_addr().unwrap()
    };
    for (method, uri, forwarded, want) in [
        (Method::GET, "http://x/".to_string(), None, StatusCode::BAD_REQUEST),
        (Method::CONNECT, "example.com:80".to_string(), None, StatusCode::BAD_REQUEST),
        (Method::CONNECT, format!("{WEB}:80"), None, StatusCode::BAD_REQUEST),
        (Method::CONNECT, m.echo.to_string(), Some("for=nonsense"), StatusCode::BAD_REQUEST),
        (Method::CONNECT, m.echo.to_string(), Some("for=\"10.9.9.9:1\""), StatusCode::BAD_REQUEST),
        (Method::CONNECT, dead.to_string(), Some("for=\"127.0.0.11:1\""), StatusCode::SERVICE_UNAVAILABLE),
        (Method::CONNECT, m.echo.to_string(), Some("for=\"127.0.0.11:1\""), StatusCode::OK),
    ] {
        let mut r = Request::builder().method(method.clone()).uri(&uri);
        if let Some(f) = forwarded {
            r = r.header("forwarded", f);
        }
        s.ready().await.unwrap();
        let resp = s.send_request(r.body(Empty::new()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), want, "{method} {uri} {forwarded:?}");
    }
    assert_eq!(m.b.stats.bad_requests.load(Ordering::Relaxed), 5);
    // Plain text to the tunnel port: no handshake, counted, nothing else.
    let mut c = TcpStream::connect(m.workloads[&ip(DB)].hbone).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf)).await.unwrap();
    assert!(!String::from_utf8_lossy(&buf).contains("HTTP/1.1 200"));
}

/// Runs tests/hbone_peer.py (Debian's Python, which has the `h2` package: scripts/setup.sh) as
/// the pod `sa` of namespace `ns` on node A, against node B.
fn python_peer(m: &Mesh, ns: &str, sa: &str, forwarded: &str) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("vectorlb-hbone-peer-{}-{sa}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svid = issue(&m.ca, &m.placement, "node-a", &[id(ns, sa)], Duration::from_secs(3600)).remove(0);
    std::fs::write(dir.join("cert.pem"), svid.chain[0].to_pem().unwrap()).unwrap();
    std::fs::write(dir.join("key.pem"), svid.key.private_key_to_pem_pkcs8().unwrap()).unwrap();
    std::fs::write(dir.join("ca.pem"), m.ca.cert_pem().unwrap()).unwrap();
    let path = |f: &str| dir.join(f).display().to_string();
    let script = format!("{}/tests/hbone_peer.py", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("/usr/bin/python3")
        .args([script, m.workloads[&ip(DB)].hbone.to_string(), path("cert.pem"), path("key.pem"), path("ca.pem"), m.echo.to_string(), forwarded.into(), "interop".into()])
        .output()
        .expect("/usr/bin/python3");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "hbone_peer.py: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_http2_and_tls_client_opens_tunnels_as_ours_do() {
    let only_web =
        Policy::compile("shop", "db-from-web", &serde_json::json!({"rules": [{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/web"]}}]}]})).unwrap().unwrap();
    let (m, _) = mesh(vec![only_web], false).await;
    let m = Arc::new(m);
    let run = |ns: &'static str, sa: &'static str, fwd: &'static str| {
        let m = m.clone();
        tokio::task::spawn_blocking(move || python_peer(&m, ns, sa, fwd))
    };
    let ok = run("shop", "web", "127.0.0.11:5555").await.unwrap();
    assert_eq!(ok["alpn"], "h2");
    assert_eq!(ok["server_uris"], serde_json::json!(["spiffe://cluster.local/ns/shop/sa/db"]), "OpenSSL verified db's certificate as a server's");
    assert_eq!(ok["status"], 200, "{ok}");
    let data = ok["data"].as_str().unwrap();
    assert!(data.starts_with("peer=127.0.0.11:") && data.ends_with("interop\n"), "{data:?}");
    let denied = run("jobs", "batch", "127.0.0.12:5555").await.unwrap();
    assert_eq!(denied["status"], 401, "{denied}");
    let lying = run("shop", "web", "127.0.0.12:5555").await.unwrap();
    assert_eq!(lying["status"], 400, "web may not speak for batch's address: {lying}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_past_the_limit_are_closed_at_once_and_counted() {
    let (m, _) = mesh(vec![], false).await;
    let capped = Node::with_limit(state("node-b", &m.workloads, vec![]), false, None, 2);
    capped
        .set_identities(issue(&m.ca, &m.placement, "node-b", &[id("shop", "db")], Duration::from_secs(3600)), Bundle::new(TD, vec![m.ca.certificate().clone()]).unwrap())
        .unwrap();
    let l = TcpListener::bind((ip(DB), 0)).await.unwrap();
    let at = l.local_addr().unwrap();
    tokio::spawn(capped.clone().serve_inbound(l));
    // Two connections that never start a handshake hold both slots; a third is closed at once.
    let _held: Vec<TcpStream> = vec![TcpStream::connect(at).await.unwrap(), TcpStream::connect(at).await.unwrap()];
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(at).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf)).await.expect("closed at once, not held");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert_eq!(capped.stats.over_limit.load(Ordering::Relaxed), 1);
    assert_eq!(capped.stats.handshake_failures.load(Ordering::Relaxed), 0, "the two held are still waiting for their handshakes");
    assert_eq!(metric(&capped.stats.render(), "vectorlb_mesh_over_limit_total"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_one_node_talk_without_a_tunnel_under_the_same_policy() {
    let no_batch = Policy::compile("shop", "no-batch", &serde_json::json!({"action": "DENY", "rules": [{"from": [{"source": {"namespaces": ["jobs"]}}]}]})).unwrap().unwrap();
    let (m, _) = mesh(vec![], false).await;
    // cache (127.0.0.22) runs on node a beside web and batch.
    let cache = echo("127.0.0.22").await;
    let mut w = m.workloads.clone();
    w.insert(ip("127.0.0.22"), workload("127.0.0.22", "shop", "cache", "node-a", "127.0.0.1:9".parse().unwrap(), "cache"));
    m.a.set_state(state("node-a", &w, vec![no_batch]));
    let l = TcpListener::bind("127.0.0.33:0").await.unwrap();
    let at = l.local_addr().unwrap();
    tokio::spawn(m.a.clone().serve_outbound_with(l, move |_| Ok(cache)));
    let call_at = |from: &'static str| async move {
        let s = TcpSocket::new_v4().unwrap();
        s.bind((ip(from), 0).into()).unwrap();
        let mut c = BufReader::new(s.connect(at).await.unwrap());
        let mut line = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_line(&mut line)).await;
        line
    };
    assert!(call_at(WEB).await.starts_with(&format!("peer={WEB}:")));
    assert_eq!(call_at(BATCH).await, "", "batch is denied on its own node too");
    assert_eq!(m.a.stats.tunnels_opened.load(Ordering::Relaxed), 0, "no tunnel inside a node");
    let text = m.a.stats.render();
    assert_eq!(metric(&text, "vectorlb_mesh_inbound_streams_total{source=\"cluster.local/ns/shop/sa/web\",destination=\"cluster.local/ns/shop/sa/cache\"}"), 1);
    assert_eq!(metric(&text, "vectorlb_mesh_inbound_denied_total{source=\"cluster.local/ns/jobs/sa/batch\",destination=\"cluster.local/ns/shop/sa/cache\"}"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meshed_pods_connection_outside_the_mesh_passes_as_it_came() {
    let (m, _) = mesh(vec![], false).await;
    let outside = echo("127.0.0.51").await;
    let l = TcpListener::bind("127.0.0.32:0").await.unwrap();
    let at = l.local_addr().unwrap();
    tokio::spawn(m.a.clone().serve_outbound_with(l, move |_| Ok(outside)));
    let s = TcpSocket::new_v4().unwrap();
    s.bind((ip(WEB), 0).into()).unwrap();
    let mut c = BufReader::new(s.connect(at).await.unwrap());
    let mut line = String::new();
    c.read_line(&mut line).await.unwrap();
    assert!(line.starts_with(&format!("peer={WEB}:")), "{line}");
    assert_eq!(m.a.stats.passthrough.load(Ordering::Relaxed), 1);
    assert_eq!(m.a.stats.tunnels_opened.load(Ordering::Relaxed), 0);
}
