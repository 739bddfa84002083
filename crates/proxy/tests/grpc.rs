//! gRPC through the proxy over TLS, with the `grpcio` package's client and servers (not written
//! here): unary, server-, client- and bidirectional streaming, a deadline, an error with its
//! trailers, an unknown method; and 300 unary calls on one client connection reaching all three
//! backends (balanced per request, not per connection).

mod common;

use common::{cert, free_port, proxy_with};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};

/// Where scripts/setup.sh puts the Python packages the tests use.
const PYLIB: &str = "/opt/vectorlb/pylib";

struct Peer(Child);
impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python() -> Command {
    let mut c = Command::new("python3");
    c.env("PYTHONPATH", PYLIB);
    c
}

fn script() -> String {
    format!("{}/tests/grpc_peer.py", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn grpc_calls_of_every_kind_through_tls_and_spread_per_request() {
    let ok = python().args(["-c", "import grpc"]).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "python3 cannot import grpc from {PYLIB} (scripts/setup.sh installs grpcio there)");
    let dir = std::env::temp_dir().join(format!("vectorlb-proxy-grpc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (crt, key) = cert(&dir, "grpc.test", &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]);
    let mut peers = Vec::new();
    let mut ports = Vec::new();
    for name in ["be1", "be2", "be3"] {
        let port = free_port();
        let mut c = python().args([&script(), "server", name, &port.to_string()]).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "{name}");
        peers.push(Peer(c));
        ports.push(port);
    }
    let eps: Vec<String> = ports.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    let cfg = format!(
        "[[listeners]]\nname = \"grpc\"\naddress = \"127.0.0.1:0\"\n\
         tls = {{ certificates = [{{ cert = \"{}\", key = \"{}\" }}], provider = \"cryptomb\", cryptomb_backend = \"portable\" }}\n\
         [[routes]]\ncluster = \"echo\"\n[[clusters]]\nname = \"echo\"\nprotocol = \"http2\"\nendpoints = [{}]\n",
        crt,
        key,
        eps.join(", ")
    );
    let (addrs, p) = proxy_with(&cfg);
    let o = python().args([&script(), "client", &format!("127.0.0.1:{}", addrs[0].port()), &crt, "grpc.test"]).output().unwrap();
    assert!(o.status.success(), "client: {}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));

    // One channel (one TLS connection, one handshake): every backend got a share.
    let per = v["unary_backends"].as_object().unwrap();
    assert_eq!(per.len(), 3, "{v}");
    assert_eq!(per.values().map(|n| n.as_u64().unwrap()).sum::<u64>(), 300);
    assert!(per.values().all(|n| n.as_u64().unwrap() >= 50), "round robin spreads evenly: {v}");
    let tls = &p.tls[0].as_ref().unwrap().1;
    assert_eq!(tls.handshakes.load(std::sync::atomic::Ordering::Relaxed), 1, "one client connection");

    let ss: Vec<String> = v["server_stream"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect();
    assert_eq!(ss.len(), 5);
    let be = ss[0].split(':').next().unwrap().to_string();
    assert_eq!(ss, (0..5).map(|i| format!("{be}:{i}")).collect::<Vec<_>>(), "one stream stays on one backend");
    assert!(v["client_stream"].as_str().unwrap().ends_with(":a,b,c"), "{v}");
    let bidi: Vec<&str> = v["bidi"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
    assert_eq!(bidi.len(), 4);
    assert!(bidi.iter().zip(["x", "y", "z", "w"]).all(|(m, want)| m.ends_with(&format!(":{want}"))), "{v}");
    assert_eq!(v["deadline"], "DEADLINE_EXCEEDED", "{v}");
    assert!(v["deadline_after_s"].as_f64().unwrap() < 1.5, "the deadline, not the backend's 2 s: {v}");
    // The error travels in the trailers: status, message and the backend's metadata.
    assert_eq!(v["fail"], "NOT_FOUND", "{v}");
    assert!(v["fail_details"].as_str().unwrap().ends_with(": no such thing"), "{v}");
    assert_eq!(v["fail_trailers"]["x-why"], "because", "{v}");
    assert_eq!(v["unimplemented"], "UNIMPLEMENTED", "{v}");
    drop(peers);
    let _ = std::fs::remove_dir_all(&dir);
}
