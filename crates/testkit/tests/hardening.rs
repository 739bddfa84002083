//! The hardened L4 end to end, with real kernels (Linux TCP with window scaling, SACK and
//! timestamps; the kernel's own IP fragmentation) talking through `vectorlb run`:
//!
//! * the SYN proxy (`synproxy = "on"`): curl, wrk and the probe's HTTP client through NAT and
//!   full NAT over IPv4 and IPv6, and a 10 MB download through a client link that loses 1 % of
//!   its packets (nftables), compared byte for byte;
//! * SYN floods: 1,000,000 spoofed SYNs while keep-alive and new connections run, with the proxy
//!   on, and off with the half-open budget;
//! * IP fragments: 3,000-byte UDP datagrams through a 1,500-byte MTU, both ways.
//!
//! Run as root.

use serde_json::json;
use std::time::Duration;
use vectorlb_testkit::*;

const VIP4: &str = "10.0.0.100";
const VIP6: &str = "2001:db8::100";
/// Bytes of the file downloaded through the lossy link.
const FILE: usize = 10 << 20;

fn url(vip: &str, port: u16, path: &str) -> String {
    if vip.contains(':') {
        format!("http://[{vip}]:{port}{path}")
    } else {
        format!("http://{vip}:{port}{path}")
    }
}

/// A file of pseudo-random bytes (reproducible) and its path.
fn make_file(t: &Topo) -> std::path::PathBuf {
    let dir = t.dir.join("files");
    std::fs::create_dir_all(&dir).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..FILE / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    std::fs::write(dir.join("blob"), &data).unwrap();
    dir
}

fn config(t: &Topo, mode: &str) -> String {
    let mut c = t.base_config(None);
    for (vip, v6) in [(VIP4, false), (VIP6, true)] {
        let laddr = (mode == "fnat").then_some(if v6 { "2001:db8:1::200" } else { "10.1.0.200" });
        for port in [80, 8000] {
            let s = service(vip, port, "tcp", mode, "rr", laddr, &backends(v6, port));
            // The proxy on, for every connection.
            c += &s.replacen("backends = [", "synproxy = \"on\"\nbackends = [", 1);
        }
    }
    c
}

fn run_mode(prefix: &str, mode: &str) {
    let mut t = Topo::new(prefix, Shape::TwoArm, 1500);
    t.nginx();
    let files = make_file(&t);
    for i in 1..=3 {
        // A plain file server (Python's, dual stack) on 8000 in each backend.
        t.spawn(&format!("be{i}"), &["/usr/bin/python3", "-m", "http.server", "8000", "--bind", "::", "--directory", files.to_str().unwrap()]);
    }
    std::thread::sleep(Duration::from_millis(800));
    t.start_lb(&config(&t, mode));
    let svcs = t.get("/v1/services");
    assert!(svcs.as_array().unwrap().iter().all(|s| s["synproxy"] == "on"), "{svcs}");
    for vip in [VIP4, VIP6] {
        let o = t.run("cl", &["curl", "-s", "-m", "5", &url(vip, 80, "/")]);
        let body = stdout(&o);
        assert!(o.status.success() && body.starts_with("be"), "{mode} curl {vip}: {body:?} {}", String::from_utf8_lossy(&o.stderr));
        let r = t.http(&url(vip, 80, "/"), 200, 4);
        assert_eq!(r["errors"], 0, "{mode} http {vip}: {r}");
        assert_eq!(spread(&r).len(), 3, "{mode} http {vip}: every backend serves: {r}");
        let o = t.run("cl", &["wrk", "-t1", "-c8", "-d2s", &url(vip, 80, "/")]);
        let w = stdout(&o);
        assert!(o.status.success() && w.contains("Requests/sec"), "{mode} wrk {vip}: {w}");
        assert!(!w.contains("Socket errors") && !w.contains("Non-2xx"), "{mode} wrk {vip} saw errors:\n{w}");
    }
    // Every connection went through the proxy: cookies sent and checked, halves spliced.
    let st = t.stats();
    let ev = &st;
    let n = |k: &str| ev[k].as_u64().unwrap_or_else(|| panic!("{k} in {st}"));
    let (sent, valid, spliced) = (n("syncookies_sent"), n("syncookies_valid"), n("synproxy_spliced"));
    assert!(sent >= 400 && valid >= 400 && spliced >= 400, "{mode}: {ev}");
    assert_eq!(st["drops"]["bad_syncookie"], 0, "{mode}: {st}");
    // Requests sent before the backend answered were held and delivered, not retransmitted.
    let (held, pending) = (n("synproxy_held_sent"), st["drops"]["synproxy_pending"].as_u64().unwrap());
    eprintln!("{mode}: held and delivered {held}, dropped while pending {pending}");
    assert!(held > 0 && pending * 10 < spliced, "{mode}: {st}");
    // 1 % of the packets reaching the client are lost: SACK blocks and timestamps come back
    // through the translation, and the file arrives whole.
    let nft = |rules: &str| {
        let mut c = t.cmd("cl", &["nft", "-f", "-"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
        use std::io::Write;
        c.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
        assert!(c.wait().unwrap().success(), "nft: {rules}");
    };
    nft("table inet lossy {\n chain input {\n  type filter hook input priority 0;\n  meta l4proto tcp numgen random mod 100 0 counter drop\n }\n}\n");
    let want = std::fs::read(files.join("blob")).unwrap();
    for vip in [VIP4, VIP6] {
        let out = t.dir.join("got");
        let o = t.run("cl", &["curl", "-s", "-m", "60", "-o", out.to_str().unwrap(), &url(vip, 8000, "/blob")]);
        assert!(o.status.success(), "{mode} download {vip}: {}", String::from_utf8_lossy(&o.stderr));
        let got = std::fs::read(&out).unwrap();
        assert!(got.len() == want.len() && got == want, "{mode} download {vip}: {} of {} bytes, or different", got.len(), want.len());
    }
    let counted = stdout(&t.run("cl", &["nft", "list", "table", "inet", "lossy"]));
    let lost: u64 = counted.split("packets ").nth(1).and_then(|s| s.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(lost > 0, "the link lost nothing: {counted}");
    eprintln!("{mode}: {sent} cookies, {spliced} spliced; downloads intact with {lost} packets lost");
    nft("delete table inet lossy\n");
    t.stop_lb();
}

#[test]
fn synproxy_nat_v4_v6_with_curl_wrk_and_a_lossy_download() {
    run_mode("sn", "nat");
}

#[test]
fn synproxy_fnat_v4_v6_with_curl_wrk_and_a_lossy_download() {
    run_mode("sf", "fnat");
}

/// Spoofed SYNs the flood tests send (from 198.18.0.0/15, as `hping3 -S --rand-source`).
const FLOOD: u64 = 1_000_000;

/// The LB's MAC on the client side, from the client's neighbour table.
fn lb_mac(t: &Topo) -> String {
    t.run("cl", &["ping", "-c", "1", "-W", "1", VIP4]);
    let n = stdout(&t.run("cl", &["ip", "neigh", "show", "10.0.0.1"]));
    n.split_whitespace().skip_while(|w| *w != "lladdr").nth(1).unwrap_or_else(|| panic!("no MAC for the LB: {n}")).to_string()
}

/// One million spoofed SYNs at the generator's full rate (AF_PACKET on the client's link, so
/// the client's own kernel keeps its traffic) while keep-alive connections (wrk) and 2,000 new
/// connections (the probe) run: the keep-alive connections see no error, every new connection
/// is served, no local port runs out. `synproxy`: the service's setting.
fn flood(prefix: &str, synproxy: &str) -> serde_json::Value {
    let mut t = Topo::new(prefix, Shape::TwoArm, 1500);
    t.nginx();
    let mut c = t.base_config(None);
    // The flood's sources are answered toward the client's link (where they are dropped).
    c += "[[routes]]\nprefix = \"198.18.0.0/15\"\nvia = \"10.0.0.2\"\nport = \"ext\"\n\n";
    let s = service(VIP4, 80, "tcp", "fnat", "rr", Some("10.1.0.200"), &backends(false, 80));
    c += &s.replacen("backends = [", &format!("synproxy = \"{synproxy}\"\nbackends = ["), 1);
    t.start_lb(&c);
    let mac = lb_mac(&t);
    let u = url(VIP4, 80, "/");
    // Keep-alive connections open before the flood and through it.
    let wrk = t.cmd("cl", &["wrk", "-t1", "-c4", "-d8s", &u]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let flood = gen_from_client(&mac, VIP4, 80, &["--syn-flood", "--count", &FLOOD.to_string(), "--seconds", "30"]);
    let gen = t.cmd("cl", &flood.iter().map(String::as_str).collect::<Vec<_>>()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // On two shared cores the ports' rings overflow during the flood (with the proxy off all
    // the more: the LB forwards the flood to the backends and their answers back): a
    // legitimate SYN may be lost there and retransmitted by its client (1 s, 3 s later), so the
    // new connections get 10 s, and must all be served.
    let timeout = "10000";
    let r = t.probe(&["http", "--url", &u, "--requests", "2000", "--concurrency", "8", "--timeout-ms", timeout, "--json"]);
    let g = gen.wait_with_output().unwrap();
    let gj: serde_json::Value = stdout(&g)
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("generator: {} {}", stdout(&g), String::from_utf8_lossy(&g.stderr)));
    let w = wrk.wait_with_output().unwrap();
    let w = String::from_utf8_lossy(&w.stdout).to_string();
    let st = t.stats();
    assert_eq!(gj["sent"], FLOOD, "{gj}");
    if synproxy == "on" {
        assert_eq!(r["errors"], 0, "{synproxy}: new connections during the flood: {r}\n{st}");
    } else {
        // Without the proxy the flood reaches the backends, and a local port freed by an
        // evicted half-open session can be handed out again (the cursor wraps within a second at
        // this rate) while a backend still holds that connection's embryonic state: the backend
        // resets the new one. A few in a thousand; the proxy has none of this.
        let e = r["errors"].as_u64().unwrap();
        assert!(e * 100 <= 2000, "{synproxy}: new connections during the flood: {r}\n{st}");
    }
    // wrk's "Socket errors: connect C, read R, write W, timeout T": the keep-alive connections
    // must see no connect, read or write error (no reset, no lost session). The flood overflows
    // the ports' rings on these two shared cores (with the proxy off all the more: the LB also
    // forwards the flood and the backends' answers), so a few of the keep-alive connections'
    // segments are lost and retransmitted, and their responses arrive after wrk's 2 s: those
    // count as `timeout`, and may be a few in ten thousand either way (one CI run with the
    // proxy on: 4 of 149,365).
    assert!(w.contains("Requests/sec") && !w.contains("Non-2xx"), "{synproxy}: keep-alive connections during the flood:\n{w}");
    let errs: Vec<u64> = w
        .lines()
        .find(|l| l.contains("Socket errors"))
        .map(|l| l.split(|c: char| !c.is_ascii_digit()).filter(|x| !x.is_empty()).map(|x| x.parse().unwrap()).collect())
        .unwrap_or_else(|| vec![0, 0, 0, 0]);
    let done: u64 = w.split(" requests in ").next().and_then(|x| x.split_whitespace().last()).and_then(|x| x.parse().ok()).unwrap_or(0);
    assert!(done > 0 && errs[..3] == [0, 0, 0], "{synproxy}: keep-alive connections during the flood:\n{w}");
    assert!(errs[3] * 1000 <= done, "{synproxy}: keep-alive connections during the flood:\n{w}\n{st}");
    if synproxy == "on" {
        assert_eq!(st["drops"]["no_local_port"], 0, "{synproxy}: {st}");
    }
    eprintln!(
        "flood synproxy={synproxy}: {} SYNs at {:.3} Mpps; http {r}; cookies {} evicted {} no_local_port {} sessions {}",
        gj["sent"],
        gj["tx_mpps"].as_f64().unwrap_or(0.0),
        st["syncookies_sent"],
        st["half_open_evicted"],
        st["drops"]["no_local_port"],
        st["sessions"]
    );
    t.stop_lb();
    json!({"flood": FLOOD, "tx_mpps": gj["tx_mpps"], "http": r, "stats": st})
}

#[test]
fn a_syn_flood_against_the_proxy_opens_nothing_and_serves_everyone() {
    let v = flood("sy", "on");
    let st = &v["stats"];
    // The LB was flooded (how much of the flood the veth's rings pass depends on the rate the
    // generator reaches on these shared cores: 99.97 % at 0.39 Mpps, 75 % at 0.69, 46 % at 0.74
    // in one CI run, with the debug build); every SYN it saw was answered with a cookie and
    // stored nothing.
    assert!(st["syncookies_sent"].as_u64().unwrap() >= FLOOD / 4, "{st}");
    assert_eq!(st["half_open_evicted"], 0, "{st}");
}

#[test]
fn a_syn_flood_with_the_proxy_off_stays_within_the_half_open_budget() {
    let v = flood("sb", "off");
    let st = &v["stats"];
    // The budget was reached and held: the oldest half-open session evicted for a new SYN while
    // one still waits for its backend (SYN_SENT), else the SYN dropped. Which of the two depends
    // on how fast the backends answer the flood (their SYN-ACKs make sessions SYN_RECV, which
    // are never evicted): on an Intel Xeon at 1.02 Mpps every one had been answered (0
    // evicted, 907,593 dropped at the limit), in earlier CI runs at 0.4-0.7 Mpps some had not.
    let (evicted, dropped) = (st["half_open_evicted"].as_u64().unwrap(), st["drops"]["half_open_limit"].as_u64().unwrap());
    assert!(evicted + dropped > 0, "the half-open budget was never reached: {st}");
}

/// UDP datagrams of 3,000 bytes through a 1,500-byte MTU: the client's kernel sends each in
/// three fragments, the backend's answers the same way; through NAT and full NAT, IPv4 and IPv6,
/// every datagram comes back whole.
#[test]
fn fragmented_udp_datagrams_echo_intact_through_nat_and_full_nat() {
    let mut t = Topo::new("fr", Shape::TwoArm, 1500);
    for i in 1..=3 {
        let n = format!("be{i}");
        t.spawn(&n, &[tools(), "probe", "serve-udp", "--listen", "[::]:5454", "--name", &n, "--full"]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut c = t.base_config(None);
    for (vip, v6) in [(VIP4, false), (VIP6, true)] {
        let laddr = if v6 { "2001:db8:1::200" } else { "10.1.0.200" };
        c += &service(vip, 5454, "udp", "fnat", "rr", Some(laddr), &backends(v6, 5454));
        c += &service(vip, 5455, "udp", "nat", "rr", None, &backends(v6, 5454));
    }
    t.start_lb(&c);
    for vip in [VIP4, VIP6] {
        for (port, mode) in [(5454, "fnat"), (5455, "nat")] {
            let target = if vip.contains(':') { format!("[{vip}]:{port}") } else { format!("{vip}:{port}") };
            let u = t.probe(&["udp", "--target", &target, "--flows", "20", "--per-flow", "3", "--size", "3000", "--verify"]);
            assert_eq!((u["sent"].as_u64(), u["lost"].as_u64(), u["corrupt"].as_u64()), (Some(60), Some(0), Some(0)), "{mode} {vip}: {u}");
            assert_eq!(spread(&u).len(), 3, "{mode} {vip}: {u}");
        }
    }
    let st = t.stats();
    // 240 datagrams, each way in three fragments: two later fragments per datagram per way.
    assert!(st["fragments_forwarded"].as_u64().unwrap() >= 960, "{st}");
    assert_eq!(st["drops"]["fragment_no_first"], 0, "{st}");
    t.stop_lb();
}
