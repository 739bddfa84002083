//! End-to-end tests: real kernels' TCP/UDP stacks talk through `vectorlb run` on AF_XDP ports
//! in network namespaces. Run as root (`make test` runs them one at a time).

use serde_json::json;
use std::time::Duration;
use vectorlb_testkit::*;

struct Vips {
    v4: &'static str,
    v6: &'static str,
}

fn vips(shape: Shape) -> Vips {
    match shape {
        Shape::TwoArm | Shape::Ha => Vips { v4: "10.0.0.100", v6: "2001:db8::100" },
        Shape::OneArm => Vips { v4: "10.1.0.100", v6: "2001:db8:1::100" },
        Shape::Scale => Vips { v4: "10.100.0.1", v6: "2001:db8:100::1" },
    }
}

fn url(vip: &str) -> String {
    if vip.contains(':') {
        format!("http://[{vip}]:80/")
    } else {
        format!("http://{vip}:80/")
    }
}

fn sock(vip: &str, port: u16) -> String {
    if vip.contains(':') {
        format!("[{vip}]:{port}")
    } else {
        format!("{vip}:{port}")
    }
}

/// TCP (HTTP on 80) and UDP (echo on 5353) services on both families in `mode`.
fn mode_config(t: &Topo, mode: &str, sched: &str) -> String {
    let v = vips(t.shape);
    let mut c = t.base_config(None);
    for (vip, v6) in [(v.v4, false), (v.v6, true)] {
        let laddr = (mode == "fnat").then_some(if v6 { "2001:db8:1::200" } else { "10.1.0.200" });
        c += &service(vip, 80, "tcp", mode, sched, laddr, &backends(v6, 80));
        c += &service(vip, 5353, "udp", mode, sched, laddr, &backends(v6, 5353));
    }
    c
}

fn assert_spread(v: &serde_json::Value, total: u64, what: &str) {
    let s = spread(v);
    assert_eq!(s.len(), 3, "{what}: every backend serves: {v}");
    for (name, n) in &s {
        assert!(*n * 100 >= total * 15, "{what}: {name} got {n} of {total}: {v}");
    }
}

/// HTTP with the probe, curl and wrk, UDP flows, a TCP echo, on both families.
fn traffic_checks(t: &Topo) {
    let v = vips(t.shape);
    for vip in [v.v4, v.v6] {
        let o = t.run("cl", &["curl", "-s", "-m", "3", &url(vip)]);
        let body = stdout(&o);
        assert!(o.status.success() && body.starts_with("be"), "curl {vip}: {body:?} {}", String::from_utf8_lossy(&o.stderr));

        let r = t.http(&url(vip), 300, 4);
        assert_eq!(r["errors"], 0, "http {vip}: {r}");
        assert_spread(&r, 300, &format!("http {vip}"));

        let o = t.run("cl", &["wrk", "-t1", "-c8", "-d2s", &url(vip)]);
        let w = stdout(&o);
        assert!(o.status.success(), "wrk {vip}: {w}");
        assert!(!w.contains("Socket errors") && !w.contains("Non-2xx"), "wrk {vip} saw errors:\n{w}");
        assert!(w.contains("Requests/sec"), "wrk {vip}: {w}");

        let u = t.probe(&["udp", "--target", &sock(vip, 5353), "--flows", "60", "--per-flow", "3"]);
        assert_eq!(u["lost"], 0, "udp {vip}: {u}");
        assert_eq!(u["flows_switched"], 0, "udp {vip}: every flow sticks to its backend: {u}");
        assert_spread(&u, 180, &format!("udp {vip}"));
    }
}

/// A two-arm topology with nginx and UDP echo servers behind the LB in `mode`, maglev, after
/// the traffic checks passed.
fn two_arm_serving(prefix: &str, mode: &str) -> Topo {
    let mut t = Topo::new(prefix, Shape::TwoArm, 1500);
    t.nginx();
    t.echo(5353);
    let c = mode_config(&t, mode, "maglev");
    t.start_lb(&c);
    traffic_checks(&t);
    t
}

#[test]
fn fnat_tcp_udp_v4_v6() {
    let mut t = two_arm_serving("vf", "fnat");
    // The XDP flow director passes what is not the LB's to the kernel: an address the host
    // itself holds on the same interface answers ping.
    sh(&["ip", "netns", "exec", &t.ns("lb"), "ip", "addr", "add", "10.0.0.50/24", "dev", "ext0"]);
    let o = t.run("cl", &["ping", "-c", "2", "-i", "0.2", "-W", "2", "10.0.0.50"]);
    assert!(o.status.success(), "the host's own address on the LB's interface: {}", stdout(&o));
    // Metrics per service and backend.
    let (s, _) = api_call(&t.api(), "GET", "/metrics", None).unwrap();
    assert_eq!(s, 200);
    let m = String::from_utf8(api_call(&t.api(), "GET", "/metrics", None).unwrap().1).unwrap();
    for want in [
        "vectorlb_backend_packets_total{vip=\"10.0.0.100\",port=\"80\",proto=\"tcp\",backend=\"10.1.0.11\",backend_port=\"80\"}",
        "vectorlb_service_new_sessions_total{vip=\"2001:db8::100\",port=\"5353\",proto=\"udp\"}",
        "vectorlb_drops_total{reason=\"no_session\"}",
        "vectorlb_port_packets_total{port=\"ext\",dir=\"rx\"}",
        "vectorlb_backend_active_sessions{",
    ] {
        assert!(m.contains(want), "metrics lack {want}");
    }
    // Backends see the local address, not the client (full NAT).
    let s = t.get("/v1/sessions?limit=10000");
    let sessions = s["sessions"].as_array().unwrap();
    assert!(!sessions.is_empty());
    assert!(sessions.iter().all(|x| x["local"].as_str().unwrap_or("").starts_with("10.1.0.200:")), "{s}");
    t.stop_lb();
}

#[test]
fn nat_tcp_udp_v4_v6() {
    two_arm_serving("vn", "nat").stop_lb();
}

fn dr_backends(t: &Topo) {
    let v = vips(Shape::OneArm);
    for i in 1..=3 {
        let n = format!("be{i}");
        sh(&["ip", "netns", "exec", &t.ns(&n), "ip", "addr", "add", &format!("{}/32", v.v4), "dev", "lo"]);
        sh(&["ip", "netns", "exec", &t.ns(&n), "ip", "-6", "addr", "add", &format!("{}/128", v.v6), "dev", "lo", "nodad"]);
        sh(&["ip", "netns", "exec", &t.ns(&n), "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2"]);
    }
}

#[test]
fn dr_tcp_udp_v4_v6() {
    let mut t = Topo::new("vd", Shape::OneArm, 1500);
    dr_backends(&t);
    t.nginx();
    // A UDP server answers from the address the client asked for only if it is bound to it.
    let v = vips(Shape::OneArm);
    t.echo_bound(5353, &[v.v4, v.v6]);
    let c = mode_config(&t, "dr", "maglev");
    t.start_lb(&c);
    traffic_checks(&t);
    t.stop_lb();
}

#[test]
fn tun_encapsulates_v4_v6_by_capture() {
    // The kernel here has no IPIP / IP6IP6 module, so backends cannot decapsulate: check the
    // packets the LB sends them instead.
    let mut t = Topo::new("vu", Shape::OneArm, 1500);
    let c = mode_config(&t, "tun", "rr");
    t.start_lb(&c);
    let cap = t.dir.join("be1.pcap");
    let mut dump = t
        .cmd("be1", &["tcpdump", "-i", "eth0", "-U", "--immediate-mode", "-w", cap.to_str().unwrap(), "ip proto 4 or ip6 proto 41"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let v = vips(Shape::OneArm);
    for vip in [v.v4, v.v6] {
        // rr over three backends: 9 flows give be1 three.
        t.probe(&["udp", "--target", &sock(vip, 5353), "--flows", "9", "--per-flow", "1", "--timeout-ms", "200"]);
    }
    std::thread::sleep(Duration::from_millis(500));
    let _ = dump.kill();
    let _ = dump.wait();
    let data = std::fs::read(&cap).unwrap();
    let mut r = vectorlb_pcap::Reader::new(&data[..]).unwrap();
    let (mut v4, mut v6) = (0, 0);
    while let Some(p) = r.next_record().unwrap() {
        let f = &p.data;
        match u16::from_be_bytes([f[12], f[13]]) {
            0x0800 => {
                assert_eq!(f[23], 4, "outer protocol IPIP");
                assert_eq!(&f[26..30], &[10, 1, 0, 1], "outer source: the LB's interface address");
                assert_eq!(&f[30..34], &[10, 1, 0, 11], "outer destination: the backend");
                let inner = &f[34..];
                assert_eq!(&inner[12..16], &[10, 1, 0, 2], "inner source: the client");
                assert_eq!(&inner[16..20], &[10, 1, 0, 100], "inner destination: the VIP");
                assert_eq!(inner[9], 17);
                v4 += 1;
            }
            0x86dd => {
                assert_eq!(f[20], 41, "outer next header IPv6-in-IPv6");
                let lb: std::net::Ipv6Addr = "2001:db8:1::1".parse().unwrap();
                let be: std::net::Ipv6Addr = "2001:db8:1::11".parse().unwrap();
                assert_eq!(&f[22..38], &lb.octets());
                assert_eq!(&f[38..54], &be.octets());
                let inner = &f[54..];
                let vip: std::net::Ipv6Addr = v.v6.parse().unwrap();
                assert_eq!(&inner[24..40], &vip.octets(), "inner destination: the VIP: {inner:02x?}");
                assert_eq!(inner[6], 17, "inner next header UDP: {inner:02x?}");
                v6 += 1;
            }
            e => panic!("unexpected ethertype {e:#x}"),
        }
    }
    assert_eq!((v4, v6), (3, 3), "be1 got its third of the flows, encapsulated");
    t.stop_lb();
}

#[test]
fn scheduler_distribution_and_weights() {
    let mut t = Topo::new("vw", Shape::TwoArm, 1500);
    t.nginx();
    let mut c = t.base_config(None);
    c += &service("10.0.0.100", 80, "tcp", "fnat", "wrr", Some("10.1.0.200"), &[("10.1.0.11", 80, 1), ("10.1.0.12", 80, 2), ("10.1.0.13", 80, 3)]);
    t.start_lb(&c);
    let r = t.http("http://10.0.0.100/", 600, 1);
    assert_eq!(r["errors"], 0, "{r}");
    // Smooth weighted round robin gives exactly weight/sum of the new sessions.
    assert_eq!(spread(&r), vec![("be1".into(), 100), ("be2".into(), 200), ("be3".into(), 300)], "{r}");
    t.stop_lb();
}

#[test]
fn drain_then_remove_under_load_and_reload() {
    let mut t = Topo::new("vr", Shape::TwoArm, 1500);
    t.nginx();
    let mut c = t.base_config(None);
    // Thousands of connections per second for 10 s: four local addresses, so that no (local
    // address, port) comes back to a backend while that backend still holds the previous
    // connection in TIME_WAIT (60 s; see docs/operations.md).
    let laddrs = "local_addrs = [\"10.1.0.200\", \"10.1.0.201\", \"10.1.0.202\", \"10.1.0.203\"]";
    c += &service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 80)).replace("local_addrs = [\"10.1.0.200\"]", laddrs);
    t.start_lb(&c);
    let api = t.api();
    let tools = tools();
    let ns = t.ns("cl");
    let load = std::thread::spawn(move || {
        let o = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, tools, "probe", "http", "--url", "http://10.0.0.100/", "--duration-s", "10", "--concurrency", "4", "--json"])
            .output()
            .unwrap();
        serde_json::from_str::<serde_json::Value>(stdout(&o).lines().last().unwrap_or("{}")).unwrap()
    });
    std::thread::sleep(Duration::from_millis(400));
    // Drain be1: no new sessions; then remove it once its short connections are done.
    let (s, v) = t.call("PATCH", "/v1/services/tcp/10.0.0.100/80/backends/10.1.0.11/80", Some(&json!({ "weight": 0 })));
    assert_eq!(s, 200, "{v}");
    // The graceful way: wait until the drained backend has no session left (its last ones
    // linger in TIME_WAIT for 2 s), then remove it. Removing it earlier would end sessions
    // that may still need a retransmission.
    let t0 = std::time::Instant::now();
    loop {
        let v = t.get("/v1/services/tcp/10.0.0.100/80");
        let be1 = v["backends"].as_array().unwrap().iter().find(|b| b["addr"] == "10.1.0.11").unwrap().clone();
        if be1["active_sessions"] == 0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "be1 still has sessions 10 s after its drain: {be1}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (s, v) = t.call("DELETE", "/v1/services/tcp/10.0.0.100/80/backends/10.1.0.11/80", None);
    assert_eq!(s, 200, "{v}");
    // A reload under load: the file gains be1 back with weight 2 (SIGHUP), sessions are kept.
    let mut c2 = t.base_config(None);
    c2 += &service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &[("10.1.0.12", 80, 1), ("10.1.0.13", 80, 1), ("10.1.0.11", 80, 2)])
        .replace("local_addrs = [\"10.1.0.200\"]", laddrs);
    std::fs::write(t.config_path(), &c2).unwrap();
    let gen_before = t.get("/v1/health")["generation"].as_u64().unwrap();
    sh(&["kill", "-HUP", &t.lb_pid().to_string()]);
    let t0 = std::time::Instant::now();
    while t.get("/v1/health")["generation"].as_u64().unwrap() == gen_before && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!load.is_finished(), "the reload happened under load (make the load longer if this fails)");
    let r = load.join().unwrap();
    assert_eq!(r["errors"], 0, "drain, removal and reload under load lost no request: {r}\n{}", t.stats());
    assert!(t.get("/v1/health")["generation"].as_u64().unwrap() > gen_before);
    assert_eq!(t.stats()["reloads"], 1);
    let after = t.http("http://10.0.0.100/", 300, 4);
    assert_eq!(after["errors"], 0, "{after}");
    assert_spread(&after, 300, "after reload");

    // ipvsadm-style CLI: a new service with a backend, listed, saved to the file.
    let ctl = |args: &[&str]| {
        let o = std::process::Command::new(bin()).arg("ctl").arg("--api").arg(&api).args(args).output().unwrap();
        assert!(o.status.success(), "ctl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        stdout(&o)
    };
    ctl(&["-A", "-t", "10.0.0.100:8080", "-s", "wrr", "--mode", "fnat", "--laddr", "10.1.0.200"]);
    ctl(&["-a", "-t", "10.0.0.100:8080", "-r", "10.1.0.12:80", "-w", "3"]);
    let list = ctl(&["-Ln"]);
    assert!(list.contains("TCP  10.0.0.100:8080 wrr fnat") && list.contains("-> 10.1.0.12:80"), "{list}");
    let o = std::process::Command::new(bin()).args(["ctl", "--api", &api, "-a", "-t", "10.0.0.100:8080", "-r", "10.1.0.12:80"]).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("409"), "adding it twice is a conflict");
    let r = t.http("http://10.0.0.100:8080/", 20, 2);
    assert_eq!(spread(&r), vec![("be2".into(), 20)], "{r}");
    ctl(&["--save"]);
    let saved = vectorlb_config::Config::load(&t.config_path()).expect("the saved file loads");
    assert_eq!(saved.spec.services.len(), 2);
    assert_eq!(saved.spec.services[1].backends[0].weight, 3);
    t.stop_lb();
}

#[test]
fn ping_vip_and_path_mtu_discovery() {
    // The backend link has MTU 1280 (IPv6's minimum): datagrams of 1400 bytes with DF set make
    // the LB send "fragmentation needed" / "packet too big", and the client's kernel learns the
    // path MTU.
    let mut t = Topo::new("vm", Shape::TwoArm, 1280);
    t.echo(5353);
    let mut c = t.base_config(Some(1280));
    c += &service("10.0.0.100", 5353, "udp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 5353));
    c += &service("2001:db8::100", 5353, "udp", "fnat", "maglev", Some("2001:db8:1::200"), &backends(true, 5353));
    c += &service("10.0.0.100", 7, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 5353));
    t.start_lb(&c);
    for (vip, flag) in [("10.0.0.100", "-4"), ("2001:db8::100", "-6")] {
        let o = t.run("cl", &["ping", flag, "-c", "3", "-i", "0.2", "-W", "2", vip]);
        assert!(o.status.success(), "ping {vip}: {}", stdout(&o));
    }
    let st = t.stats();
    assert!(st["icmp_echo_replies"].as_u64().unwrap() >= 6, "{st}");
    // A restarted LB has forgotten its neighbours, and the client still has the VIP's MAC in
    // its cache, so it will not ask again: the LB must resolve the client itself on demand.
    t.stop_lb();
    t.start_lb(&c);
    let o = t.run("cl", &["ping", "-4", "-c", "5", "-i", "0.2", "-W", "1", "10.0.0.100"]);
    let out = stdout(&o);
    assert!(out.contains(" 4 received") || out.contains(" 5 received"), "after a restart: {out}");
    for (vip, mtu) in [("10.0.0.100:5353", 1280), ("[2001:db8::100]:5353", 1280)] {
        let u = t.probe(&["udp", "--target", vip, "--flows", "1", "--per-flow", "4", "--size", "1400", "--df", "--timeout-ms", "300"]);
        assert_eq!(u["path_mtu"], mtu, "path MTU learnt through the LB for {vip}: {u}");
        assert!(u["too_big"].as_u64().unwrap() >= 1, "{u}");
    }
    assert!(t.stats()["icmp_errors_sent"].as_u64().unwrap() >= 2);
    // TCP across the small-MTU link: 200 kB each way through a full-NAT echo.
    let e = t.probe(&["tcp", "--target", "10.0.0.100:7", "--connections", "5", "--bytes", "200000"]);
    assert_eq!(e["errors"], 0, "{e}");
    t.stop_lb();
}

#[test]
fn survives_garbage_packets_api_abuse_and_dead_backend() {
    let mut t = Topo::new("vg", Shape::TwoArm, 1500);
    t.nginx();
    let mut c = t.base_config(None);
    c += &service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 80));
    c += &service("2001:db8::100", 80, "tcp", "nat", "rr", None, &backends(true, 80));
    t.start_lb(&c);
    let ports = t.get("/v1/ports");
    let ext_mac = ports[0]["mac"].as_str().unwrap().to_string();
    let int_mac = ports[1]["mac"].as_str().unwrap().to_string();

    // Malformed frames at both ports, IPv4 and IPv6.
    for seed in 1..=2 {
        let g = t.probe(&["garbage", "--iface", "cl0", "--dst-mac", &ext_mac, "--src", "10.0.0.2", "--vip", "10.0.0.100", "--count", "3000", "--seed", &seed.to_string()]);
        assert!(g["garbage_frames_sent"].as_u64().unwrap() > 2000, "{g}");
        let g = t.probe(&["garbage", "--iface", "cl0", "--dst-mac", &ext_mac, "--src", "2001:db8::2", "--vip", "2001:db8::100", "--count", "3000", "--seed", &seed.to_string()]);
        assert!(g["garbage_frames_sent"].as_u64().unwrap() > 2000, "{g}");
    }
    let o = t.run("be1", &[tools(), "probe", "garbage", "--iface", "eth0", "--dst-mac", &int_mac, "--src", "10.1.0.11", "--vip", "10.1.0.200", "--count", "3000"]);
    assert!(o.status.success());
    std::thread::sleep(Duration::from_millis(300));
    assert!(t.lb_alive(), "the LB survived malformed packets:\n{}", t.lb_log());
    let st = t.stats();
    let drops: u64 = st["drops"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert!(drops > 1000, "malformed frames are counted as drops: {st}");

    // Garbage on every API endpoint: 4xx, never a crash, nothing half-applied.
    let before = config_text(&t);
    let bad_bodies: [&[u8]; 8] = [b"", b"{", b"[]", b"null", b"\"x\"", b"{\"vip\": 5}", b"{\"weight\": -1}", &[0xff, 0xfe, 0x00]];
    let paths = [
        "/v1/services",
        "/v1/services/tcp/10.0.0.100/80",
        "/v1/services/tcp/10.0.0.100/80/backends",
        "/v1/services/tcp/10.0.0.100/80/backends/10.1.0.11/80",
        "/v1/services/xtp/10.0.0.999/99999",
        "/v1/services/tcp/10.0.0.100/80/backends/nonsense/80",
        "/v1/sessions?worker=9&limit=0&family=5",
        "/v1/stats",
        "/v1/reload",
        "/v1/save",
        "/v1/nothing",
        "/metrics",
        "/openapi.json",
    ];
    for p in paths {
        for m in ["GET", "POST", "PATCH", "DELETE", "PUT"] {
            // Skip the requests that are valid without a body (they would succeed).
            if (m, p) == ("POST", "/v1/reload") || (m, p) == ("POST", "/v1/save") || (m == "DELETE" && p.starts_with("/v1/services/tcp/10.0.0.100/80")) {
                continue;
            }
            for b in bad_bodies {
                let (s, body) = raw(&t, m, p, b);
                assert!(s < 500 || s == 503, "{m} {p} with {b:?} gave {s}: {body}");
            }
        }
    }
    for junk in [&b"\x00\x01\x02garbage\r\n\r\n"[..], b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"POST /v1/services HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"] {
        let _ = raw_bytes(&t, junk);
    }
    assert!(t.lb_alive(), "the LB survived API abuse:\n{}", t.lb_log());
    // The document the daemon serves is the one generated from the code.
    let generated = std::process::Command::new(bin()).arg("openapi").output().unwrap();
    let (s, served) = api_call(&t.api(), "GET", "/openapi.json", None).unwrap();
    assert_eq!((s, served), (200, generated.stdout), "served /openapi.json differs from `vectorlb openapi`");
    assert_eq!(config_text(&t), before, "rejected requests changed nothing");
    // Field-named errors.
    let (s, v) = t.call("POST", "/v1/services", Some(&json!({ "vip": "10.0.0.200", "port": 80, "mode": "xnat" })));
    assert_eq!(s, 400);
    assert!(v["error"].as_str().unwrap().starts_with("mode:"), "{v}");
    let (s, v) = t.call("POST", "/v1/services/tcp/10.0.0.100/80/backends", Some(&json!({ "addr": "10.1.0.14", "port": 80, "weight": "x" })));
    assert_eq!(s, 400);
    assert!(v["error"].as_str().unwrap().contains("weight"), "{v}");
    // A batch is all or none: its second operation is refused, so its first is not applied.
    let before = config_text(&t);
    let batch = json!({"ops": [
        {"put": {"vip": "10.0.0.201", "port": 80, "mode": "fnat", "local_addrs": ["10.1.0.200"], "backends": [{"addr": "10.1.0.11", "port": 80}]}},
        {"put": {"vip": "10.0.0.202", "port": 80, "mode": "dr", "local_addrs": ["10.1.0.200"]}},
    ]});
    let (s, v) = t.call("POST", "/v1/batch", Some(&batch));
    assert_eq!(s, 422, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("ops[1]: local_addrs"), "{v}");
    // What a program matches on: the kind and the operation, not the message.
    assert_eq!((v["kind"].as_str(), v["op"]["index"].as_u64()), (Some("unprocessable"), Some(1)), "{v}");
    assert!(v["op"]["error"].as_str().unwrap().starts_with("local_addrs"), "{v}");
    assert_eq!(config_text(&t), before, "a refused batch changed nothing");
    let (s, v) =
        t.call("POST", "/v1/batch", Some(&json!({"ops": [{"put": {"vip": "10.0.0.201", "port": 80, "backends": [{"addr": "10.1.0.11", "port": 80, "weight": 7000000}]}}]})));
    assert_eq!(s, 400);
    assert!(v["error"].as_str().unwrap().starts_with("ops[0]: put.backends[0].weight"), "{v}");
    // Health checks through the API: no commands for callers, and the file's bounds.
    let put_health =
        |h: serde_json::Value| t.call("POST", "/v1/batch", Some(&json!({"ops": [{"put": {"vip": "10.0.0.201", "port": 80, "local_addrs": ["10.1.0.200"], "health": h}}]})));
    let (s, v) = put_health(json!({"kind": "exec", "command": "touch /tmp/owned"}));
    assert_eq!(s, 400, "an exec check through the API: {v}");
    assert!(v["error"].as_str().unwrap().starts_with("ops[0].put.health"), "{v}");
    let (s, v) = put_health(json!({"kind": "http", "interval_ms": 1, "path": "/x"}));
    assert_eq!(s, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("health.interval"), "{v}");
    let (s, v) = put_health(json!({"kind": "tcp", "path": "/x"}));
    assert_eq!(s, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("health.path: only for kind http"), "{v}");
    assert!(!std::path::Path::new("/tmp/owned").exists());
    assert_eq!(config_text(&t), before, "refused checks changed nothing");
    // Put then put again (replaced in place), delete twice (absent is no error): one generation each.
    let g0 = t.get("/v1/health")["generation"].as_u64().unwrap();
    let (s, v) = t.call(
        "POST",
        "/v1/batch",
        Some(&json!({"ops": [{"put": batch["ops"][0]["put"]}, {"put": {"vip": "10.0.0.201", "port": 80, "mode": "fnat", "scheduler": "sh", "local_addrs": ["10.1.0.200"]}}]})),
    );
    assert_eq!((s, v["applied"].as_u64()), (200, Some(2)), "{v}");
    assert_eq!(v["generation"].as_u64(), Some(g0 + 1), "{v}");
    let svc = t.get("/v1/services/tcp/10.0.0.201/80");
    assert_eq!((svc["scheduler"].as_str(), svc["backends"].as_array().map(Vec::len)), (Some("sh"), Some(0)), "{svc}");
    let del = json!({"ops": [{"delete": {"proto": "tcp", "vip": "10.0.0.201", "port": 80}}, {"delete": {"proto": "tcp", "vip": "10.0.0.201", "port": 80}}]});
    let (s, v) = t.call("POST", "/v1/batch", Some(&del));
    assert_eq!(s, 200, "{v}");
    assert_eq!(config_text(&t), before);

    // A backend's server dies: the LB keeps running and the others keep serving.
    t.kill_nginx(2);
    let r = t.http("http://10.0.0.100/", 200, 4);
    assert!(t.lb_alive());
    let s = spread(&r);
    assert!(s.iter().any(|(n, _)| n == "be1") && s.iter().any(|(n, _)| n == "be3") && !s.iter().any(|(n, _)| n == "be2"), "{r}");
    assert_eq!(t.get("/v1/health")["status"], "ok");
    t.stop_lb();
}

fn raw_bytes(t: &Topo, req: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let path = t.api();
    let mut s = std::os::unix::net::UnixStream::connect(path.strip_prefix("unix:").unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(req);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

fn raw(t: &Topo, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    req.extend_from_slice(body);
    let out = raw_bytes(t, &req);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    assert!(status != 0, "no answer to {method} {path}: {text:?}");
    (status, text)
}

#[test]
fn two_workers_on_af_packet_hand_replies_to_their_owner() {
    // Two workers, each with its own queue (af_packet fans flows out by hash) and session
    // table. Full-NAT replies come back on whichever queue the hash picks; those for the other
    // worker's local ports are handed to it through a ring.
    let mut t = Topo::new("v2", Shape::TwoArm, 1500);
    t.nginx();
    let mut c = t
        .base_config(None)
        .replace("net_af_xdp0,iface=ext0", "net_af_packet0,iface=ext0,qpairs=2")
        .replace("net_af_xdp1,iface=int0", "net_af_packet1,iface=int0,qpairs=2")
        .replace("[runtime]\n", "[runtime]\nworkers = 2\n");
    c += &service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 80));
    c += &service("2001:db8::100", 80, "tcp", "fnat", "maglev", Some("2001:db8:1::200"), &backends(true, 80));
    t.start_lb(&c);
    for vip in ["10.0.0.100", "2001:db8::100"] {
        let r = t.http(&url(vip), 1000, 8);
        assert_eq!(r["errors"], 0, "{r}");
        assert_spread(&r, 1000, vip);
    }
    let st = t.stats();
    assert_eq!(st["workers"], 2);
    assert!(st["io"]["handed_off"].as_u64().unwrap() > 0, "some replies crossed workers: {st}");
    assert_eq!(st["drops"]["misdirected"], 0, "{st}");
    for w in 0..2 {
        let s = t.get(&format!("/v1/sessions?worker={w}&limit=10000"));
        assert!(s["sessions"].as_array().unwrap().len() > 100, "worker {w} owns sessions: {}", s["sessions"].as_array().unwrap().len());
    }
    t.stop_lb();
}

#[test]
fn a_queue_sets_service_is_served_by_its_worker_alone_and_a_reload_removes_the_set() {
    // Two workers on AF_PACKET queues that the kernel fills by flow hash, so both services'
    // packets arrive at both workers. The set "web" (port 80) has worker 1; port 8080 is the
    // default set's (worker 0).
    let mut t = Topo::new("vq", Shape::TwoArm, 1500);
    t.nginx();
    let base = t
        .base_config(None)
        .replace("net_af_xdp0,iface=ext0", "net_af_packet0,iface=ext0,qpairs=2")
        .replace("net_af_xdp1,iface=int0", "net_af_packet1,iface=int0,qpairs=2")
        .replace("[runtime]\n", "[runtime]\nworkers = 2\n")
        + &service("10.0.0.100", 80, "tcp", "fnat", "rr", Some("10.1.0.200"), &backends(false, 80))
        + &service("10.0.0.100", 8080, "tcp", "fnat", "rr", Some("10.1.0.201"), &backends(false, 80));
    let with_set = format!("{base}[[queue_sets]]\nname = \"web\"\nservices = [\"10.0.0.100:80/tcp\"]\nworkers = [1]\n");
    t.start_lb(&with_set);
    for port in [80, 8080] {
        let r = t.http(&format!("http://10.0.0.100:{port}/"), 600, 8);
        assert_eq!(r["errors"], 0, "port {port}: {r}");
    }
    // Each worker's sessions belong to its own group's service only.
    let vips = |w: u16| -> Vec<String> {
        let s = t.get(&format!("/v1/sessions?worker={w}&limit=10000"));
        s["sessions"].as_array().unwrap().iter().map(|x| x["vip"].as_str().unwrap().to_string()).collect()
    };
    let (w0, w1) = (vips(0), vips(1));
    assert!(w1.len() >= 300 && w1.iter().all(|v| v == "10.0.0.100:80"), "worker 1 (the set): {} sessions, {:?}", w1.len(), &w1[..w1.len().min(5)]);
    assert!(w0.len() >= 300 && w0.iter().all(|v| v == "10.0.0.100:8080"), "worker 0 (default): {} sessions", w0.len());
    let st = t.stats();
    let sets = st["queue_sets"].as_array().unwrap();
    assert_eq!((sets[0]["name"].as_str(), sets[1]["name"].as_str()), (Some("web"), Some("default")), "{st}");
    assert!(sets[0]["packets"]["rx"].as_u64().unwrap() > 0 && sets[0]["packets"]["dropped"] == 0, "{st}");
    assert!(st["io"]["steered"].as_u64().unwrap() > 0, "packets crossed to their group's worker: {st}");
    // AF_PACKET has no flow rules: the daemon says so and the workers steer instead.
    assert_eq!(sets[0]["flow_rules"], 0, "{st}");
    assert!(t.lb_log().contains("no flow rules for the queue sets"), "{}", t.lb_log());
    // Queue statistics: every packet the set's worker received was timed.
    let q = &sets[0]["queues"];
    assert!(q["packets"].as_u64().unwrap() > 0 && q["receives"].as_u64().unwrap() > 0 && q["wait_us"]["p50"].is_u64(), "{q}");
    // A reload without the set: new flows of port 80 open wherever they arrive.
    std::fs::write(t.config_path(), &base).unwrap();
    let (s, v) = t.call("POST", "/v1/reload", None);
    assert_eq!(s, 200, "{v}");
    assert!(t.stats()["queue_sets"].as_array().unwrap().is_empty());
    let r = t.http("http://10.0.0.100:80/", 600, 8);
    assert_eq!(r["errors"], 0, "{r}");
    assert!(vips(0).iter().any(|v| v == "10.0.0.100:80"), "without the set, worker 0 serves port 80 too");
    t.stop_lb();
}

#[test]
fn the_default_sets_ingress_limit_drops_a_flood_in_the_xdp_program_and_a_reload_lifts_it() {
    // One worker on AF_XDP ports (the program the driver loads is ours): the default set's
    // ingress is limited to 100 packets/s with a 10 ms burst, and ping floods the VIP (the LB
    // answers echo requests) with 200 requests sent at once.
    let mut t = Topo::new("vp", Shape::TwoArm, 1500);
    t.echo(5353);
    let base = t.base_config(None) + &service("10.0.0.100", 5353, "udp", "fnat", "rr", Some("10.1.0.200"), &backends(false, 5353));
    let limited = format!("{base}[default_set]\ningress = {{ pps = 100, burst_ms = 10 }}\n");
    t.start_lb(&limited);
    let flood = t.run("cl", &["ping", "-q", "-f", "-l", "200", "-c", "1000", "-w", "5", "10.0.0.100"]);
    let flood = stdout(&flood);
    let st = t.stats();
    let d = &st["queue_sets"][0];
    assert_eq!(d["name"], "default", "{st}");
    let (passed, policed) = (d["xdp"]["packets"].as_u64().unwrap(), d["xdp"]["policed"].as_u64().unwrap());
    assert!(policed > 0 && passed > 0, "the program passed {passed} and policed {policed}: {st}\n{flood}");
    assert_eq!(st["io"]["tx_full"], 0);
    let m = String::from_utf8(api_call(&t.api(), "GET", "/metrics", None).unwrap().1).unwrap();
    let series = "vectorlb_queue_set_xdp_packets_total{set=\"default\",kind=\"policed\"} ";
    let v: u64 = m.lines().find_map(|l| l.strip_prefix(series)).unwrap_or_else(|| panic!("no {series}in {m}")).parse().unwrap();
    assert!(v >= policed, "{v} < {policed}");
    // Lifted by a reload: nothing more is policed and every datagram is answered.
    std::fs::write(t.config_path(), &base).unwrap();
    let (s, v) = t.call("POST", "/v1/reload", None);
    assert_eq!(s, 200, "{v}");
    let u = t.probe(&["udp", "--target", "10.0.0.100:5353", "--flows", "30", "--per-flow", "3"]);
    assert_eq!(u["lost"], 0, "{u}");
    let ping = stdout(&t.run("cl", &["ping", "-q", "-c", "20", "-i", "0.01", "-w", "5", "10.0.0.100"]));
    assert!(ping.contains(" 0% packet loss"), "{ping}");
    assert!(t.stats()["queue_sets"].as_array().unwrap().is_empty());
    t.stop_lb();
}

#[test]
fn clear_errors_for_a_missing_interface_and_a_port_in_use() {
    let mut t = Topo::new("ve", Shape::TwoArm, 1500);
    let mut c = t.base_config(None);
    c += &service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 80));
    // A second daemon on the same interfaces while the first holds them.
    t.start_lb(&c);
    let second = t.dir.join("second.toml");
    std::fs::write(&second, c.replace("api.sock", "api2.sock")).unwrap();
    let o = t.run("lb", &[bin(), "run", "--config", second.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.lines().any(|l| l.starts_with("vectorlb: ports[0]: ext0 is in use by another vectorlb")), "{err}");
    assert!(t.lb_alive(), "the first daemon is unaffected");
    t.stop_lb();
    // An interface that does not exist.
    let bad = t.dir.join("bad.toml");
    std::fs::write(&bad, c.replace("iface=ext0", "iface=nosuch0")).unwrap();
    let o = t.run("lb", &[bin(), "run", "--config", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.lines().any(|l| l.starts_with("vectorlb: ports[0] (ext): device 'net_af_xdp0' did not become a DPDK port")), "{err}");
}

fn backend_health(t: &Topo, svc: &str, addr: &str) -> serde_json::Value {
    let v = t.get(svc);
    v["backends"].as_array().unwrap().iter().find(|b| b["addr"] == addr).unwrap()["health"].clone()
}

/// Waits until `addr`'s health state is `want`; returns how long it took.
fn wait_health(t: &Topo, svc: &str, addr: &str, want: &str, limit: Duration) -> Duration {
    let t0 = std::time::Instant::now();
    loop {
        let h = backend_health(t, svc, addr);
        if h["state"] == want {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{addr} not {want} after {limit:?}: {h}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn health_checks_take_a_failed_backend_out_and_bring_it_back() {
    let mut t = Topo::new("vh", Shape::TwoArm, 1500);
    t.nginx();
    t.echo(5353);
    let mut c = t.base_config(None);
    // HTTP checks every 200 ms, down after 2 failures, up after 2 successes.
    c += &service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 80))
        .replace("backends = [", "health = { kind = \"http\", path = \"/\", interval = 0.2, timeout = 0.2, rise = 2, fall = 2 }\nbackends = [");
    // UDP checks: a datagram must get an answer.
    c += &service("2001:db8::100", 5353, "udp", "fnat", "rr", Some("2001:db8:1::200"), &backends(true, 5353)).replace(
        "backends = [",
        "health = { kind = \"udp\", send = \"ping\", expect = \"ping\", interval = 0.2, timeout = 0.2, rise = 1, fall = 2, on_down = \"reset\" }\nbackends = [",
    );
    // HTTPS checks of the same backends (self-signed certificates), for a TLS service.
    c += &service("10.0.0.100", 443, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 443))
        .replace("backends = [", "health = { kind = \"https\", path = \"/\", interval = 0.2, timeout = 0.2, rise = 2, fall = 2 }\nbackends = [");
    t.start_lb(&c);
    let svc = "/v1/services/tcp/10.0.0.100/80";
    let tls = "/v1/services/tcp/10.0.0.100/443";
    for a in BE4 {
        wait_health(&t, svc, a, "up", Duration::from_secs(5));
        wait_health(&t, tls, a, "up", Duration::from_secs(5));
    }
    std::thread::sleep(Duration::from_millis(500));
    let h = backend_health(&t, tls, "10.1.0.11");
    assert!(h["checks"].as_u64().unwrap() >= 2 && h["failed_checks"] == 0, "HTTPS checks pass: {h}");
    let o = t.run("cl", &["curl", "-sk", "-m", "3", "https://10.0.0.100/"]);
    assert!(stdout(&o).starts_with("be"), "HTTPS through the VIP: {}", stdout(&o));
    assert!(backend_health(&t, svc, "10.1.0.12")["checks"].as_u64().unwrap() >= 1);
    let r = t.http("http://10.0.0.100/", 300, 4);
    assert_eq!(r["errors"], 0, "{r}");
    assert_spread(&r, 300, "all up");

    // be2's server dies: within fall x interval (+ one timeout) it is down and gets no new
    // connection.
    t.kill_nginx(2);
    let took = wait_health(&t, svc, "10.1.0.12", "down", Duration::from_secs(5));
    eprintln!("be2 down {took:?} after its server died (fall 2 x interval 0.2 s + timeout 0.2 s)");
    assert!(took < Duration::from_millis(2 * 200 + 200 + 1500), "{took:?}");
    let h = backend_health(&t, svc, "10.1.0.12");
    assert!(h["last_error"].as_str().unwrap().starts_with("connect:"), "{h}");
    wait_health(&t, tls, "10.1.0.12", "down", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(100));
    let r = t.http("http://10.0.0.100/", 300, 4);
    assert_eq!(r["errors"], 0, "no request reaches the dead backend: {r}");
    assert!(!spread(&r).iter().any(|(n, _)| n == "be2"), "{r}");
    let m = String::from_utf8(api_call(&t.api(), "GET", "/metrics", None).unwrap().1).unwrap();
    assert!(m.contains("vectorlb_backend_up{vip=\"10.0.0.100\",port=\"80\",proto=\"tcp\",backend=\"10.1.0.12\",backend_port=\"80\"} 0"), "{m}");

    // It comes back: within rise x interval it is up and serves again.
    t.start_nginx(2);
    let took = wait_health(&t, svc, "10.1.0.12", "up", Duration::from_secs(5));
    eprintln!("be2 up {took:?} after its server restarted (rise 2 x interval 0.2 s)");
    assert!(took < Duration::from_millis(2 * 200 + 1500), "{took:?}");
    assert_eq!(backend_health(&t, svc, "10.1.0.12")["transitions"], 2);
    std::thread::sleep(Duration::from_millis(100));
    let r = t.http("http://10.0.0.100/", 300, 4);
    assert_eq!(r["errors"], 0, "{r}");
    assert_spread(&r, 300, "be2 back");

    // UDP: be3's echo server is the only process in its namespace answering on 5353; stop it
    // by taking its address away, and the UDP check ends its sessions ("reset").
    let usvc = "/v1/services/udp/2001:db8::100/5353";
    for a in BE6 {
        wait_health(&t, usvc, a, "up", Duration::from_secs(5));
    }
    sh(&["ip", "netns", "exec", &t.ns("be3"), "ip", "-6", "addr", "del", "2001:db8:1::13/64", "dev", "eth0"]);
    wait_health(&t, usvc, "2001:db8:1::13", "down", Duration::from_secs(5));
    let u = t.probe(&["udp", "--target", "[2001:db8::100]:5353", "--flows", "30", "--per-flow", "2"]);
    assert_eq!(u["lost"], 0, "{u}");
    assert!(!spread(&u).iter().any(|(n, _)| n == "be3"), "{u}");
    t.stop_lb();
}

/// The running configuration as the daemon prints it (TOML).
fn config_text(t: &Topo) -> String {
    let (s, body) = api_call(&t.api(), "GET", "/v1/config", None).unwrap();
    assert_eq!(s, 200);
    String::from_utf8(body).unwrap()
}

/// Client affinity (`affinity_timeout_s`, Kubernetes' `sessionAffinity: ClientIP`): a client's
/// connections keep the backend it had until the timeout passes without a new one, then the
/// scheduler picks again; switched off and on by a reload. A service whose backends are gone
/// refuses at once: a TCP reset and, for UDP, an ICMP port unreachable (ECONNREFUSED), as
/// kube-proxy's reject rule does for a Service without endpoints.
#[test]
fn client_affinity_keeps_a_backend_until_its_timeout_and_a_service_without_backends_refuses() {
    let mut t = Topo::new("vaf", Shape::TwoArm, 1500);
    t.nginx();
    t.echo(5353);
    let affine = |c: String, s: u32| c.replace("backends = [", &format!("affinity_timeout_s = {s}\nbackends = ["));
    // rr: without affinity, consecutive connections go round the backends.
    let base = t.base_config(None);
    let config = |affinity: Option<u32>| {
        let mut c = base.clone();
        for (vip, v6) in [("10.0.0.100", false), ("2001:db8::100", true)] {
            let laddr = if v6 { "2001:db8:1::200" } else { "10.1.0.200" };
            let tcp = service(vip, 80, "tcp", "fnat", "rr", Some(laddr), &backends(v6, 80));
            let udp = service(vip, 5353, "udp", "fnat", "rr", Some(laddr), &backends(v6, 5353));
            c += &affinity.map_or(tcp.clone(), |s| affine(tcp, s));
            c += &affinity.map_or(udp.clone(), |s| affine(udp, s));
        }
        // Services that have no backend at all (a Kubernetes Service without endpoints).
        c += &service("10.0.0.101", 80, "tcp", "fnat", "rr", Some("10.1.0.200"), &[]);
        c += &service("10.0.0.101", 5353, "udp", "fnat", "rr", Some("10.1.0.200"), &[]);
        c += &service("2001:db8::101", 5353, "udp", "fnat", "rr", Some("2001:db8:1::200"), &[]);
        c
    };
    t.start_lb(&config(Some(2)));
    let svc = t.get("/v1/services/tcp/10.0.0.100/80");
    assert_eq!(svc["affinity_timeout_s"], 2, "{svc}");
    for vip in ["10.0.0.100", "2001:db8::100"] {
        let first = t.http(&url(vip), 30, 1);
        let s = spread(&first);
        assert_eq!(s.len(), 1, "{vip}: 30 connections of one client, one backend: {first}");
        let u = t.probe(&["udp", "--target", &sock(vip, 5353), "--flows", "20", "--per-flow", "2"]);
        assert_eq!((u["lost"].as_u64(), spread(&u).len()), (Some(0), 1), "{vip}: 20 UDP flows of one client, one backend: {u}");
        // 2.5 s without a new connection: the entry is gone and rr picks the next backend.
        std::thread::sleep(Duration::from_millis(2500));
        let again = t.http(&url(vip), 30, 1);
        let s2 = spread(&again);
        assert_eq!(s2.len(), 1, "{vip}: {again}");
        assert_ne!(s2[0].0, s[0].0, "{vip}: after the timeout the scheduler picks again (rr: the next backend)");
    }
    let kept = t.stats()["affinity_kept"].as_u64().unwrap_or(0);
    assert!(kept >= 4 * 29, "affinity_kept counts the flows sent back to their client's backend: {kept}");
    // Switched off by a reload: the client's connections go round again.
    std::fs::write(t.config_path(), config(None)).unwrap();
    let (s, v) = t.call("POST", "/v1/reload", None);
    assert_eq!(s, 200, "{v}");
    let r = t.http(&url("10.0.0.100"), 30, 1);
    assert_eq!(spread(&r).len(), 3, "no affinity: round robin: {r}");
    // And on again: one backend.
    std::fs::write(t.config_path(), config(Some(30))).unwrap();
    let (s, v) = t.call("POST", "/v1/reload", None);
    assert_eq!(s, 200, "{v}");
    let r = t.http(&url("10.0.0.100"), 30, 1);
    assert_eq!(spread(&r).len(), 1, "affinity again: {r}");
    // Absurd timeouts are refused by name.
    let (s, v) = t.call("POST", "/v1/services", Some(&json!({"vip": "10.0.0.102", "port": 80, "mode": "fnat", "local_addrs": ["10.1.0.200"], "affinity_timeout_s": 0})));
    assert_eq!(s, 422, "{v}");
    assert!(v.to_string().contains("affinity_timeout_s"), "{v}");
    let (s, v) = t.call("POST", "/v1/services", Some(&json!({"vip": "10.0.0.102", "port": 80, "mode": "fnat", "local_addrs": ["10.1.0.200"], "affinity_timeout_s": 86401})));
    assert_eq!(s, 422, "{v}");

    // No backend: refused at once, not left to time out.
    let o = t.run("cl", &["curl", "-s", "-m", "3", "-o", "/dev/null", "-w", "%{time_total}", "http://10.0.0.101/"]);
    assert_eq!(o.status.code(), Some(7), "curl: connection refused (exit 7): {}", String::from_utf8_lossy(&o.stderr));
    let secs: f64 = stdout(&o).trim().parse().unwrap_or(9.0);
    assert!(secs < 1.0, "refused in {secs} s");
    for vip in ["10.0.0.101", "2001:db8::101"] {
        let u = t.probe(&["udp", "--target", &sock(vip, 5353), "--flows", "3", "--per-flow", "1", "--timeout-ms", "1000"]);
        assert_eq!(u["refused"], 3, "{vip}: each datagram answered by port unreachable (ECONNREFUSED): {u}");
    }
    t.stop_lb();
}
