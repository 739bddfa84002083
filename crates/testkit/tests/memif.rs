//! A backend reached over memif, end to end: a client in a network namespace sends UDP through
//! the load balancer (an AF_XDP port outside, a memif port inside) to the UDP echo example,
//! which is a memif client of the data plane; ICMP comes back from it (port unreachable,
//! translated by the LB) and from the LB itself (echo to the VIP). Then the pod restarts, a
//! second pod is refused on the same interface, and the counters show in the API and /metrics.

use std::time::{Duration, Instant};
use vectorlb_testkit::*;

const POD_MAC: &str = "02:00:00:00:02:11";

fn config(t: &Topo, mode: &str, copy: &str) -> String {
    config_with(t, mode, copy, "ethernet")
}

fn config_with(t: &Topo, mode: &str, copy: &str, link: &str) -> String {
    let base = t.base_config(None);
    // The outside port only, then the memif port towards the pod.
    let ext_only = base.split("[[ports]]\nname = \"int\"").next().unwrap().to_string();
    let mut c = ext_only;
    c += &format!(
        "[[ports]]\nname = \"pod\"\nmac = \"02:00:00:00:02:01\"\naddrs = [\"10.2.0.1/24\"]\nmemif = {{ socket = \"{}/memif.sock\", id = 3, secret = \"pod-secret\", copy = \"{copy}\", mode = \"{link}\" }}\n\n",
        t.dir.display()
    );
    if link == "ethernet" {
        c += &format!("[[neighbors]]\nip = \"10.2.0.11\"\nmac = \"{POD_MAC}\"\n\n");
    }
    let laddr = (mode == "fnat").then_some("10.2.0.200");
    c += &service("10.0.0.100", 7, "udp", mode, "rr", laddr, &[("10.2.0.11", 7, 1)]);
    c += &service("10.0.0.100", 9, "udp", mode, "rr", laddr, &[("10.2.0.11", 9, 1)]);
    c
}

/// The pod's process; killed when dropped (a failed assertion must not leave it running).
struct Pod(std::process::Child);

impl Pod {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.kill();
    }
}

fn pod(t: &mut Topo, secret: &str) -> Pod {
    pod_with(t, secret, &[])
}

fn pod_with(t: &mut Topo, secret: &str, extra: &[&str]) -> Pod {
    let sock = format!("{}/memif.sock", t.dir.display());
    Pod(std::process::Command::new(example("udp_echo"))
        .args(["--socket", &sock, "--id", "3", "--secret", secret, "--mac", POD_MAC, "--ip", "10.2.0.11", "--port", "7"])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(t.dir.join(format!("pod-{secret}.log"))).unwrap())
        .spawn()
        .unwrap())
}

fn memif_status(t: &Topo) -> serde_json::Value {
    let ports = t.get("/v1/ports");
    ports.as_array().unwrap().iter().find(|p| p["name"] == "pod").unwrap().clone()
}

fn wait_reason(t: &Topo, want: &str) {
    let start = Instant::now();
    while memif_status(t)["memif"]["last_reason"] != want {
        assert!(start.elapsed() < Duration::from_secs(10), "want last_reason {want}: {}", memif_status(t));
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_connected(t: &Topo, want: u64) {
    let start = Instant::now();
    loop {
        let p = memif_status(t);
        if p["memif"]["connected"] == true && p["memif"]["connects"].as_u64() == Some(want) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "the pod did not connect: {p}\n{}", t.lb_log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn udp_and_icmp_through_the_lb_to_a_pod_on_memif() {
    for (mode, copy) in [("fnat", "cpu"), ("nat", "dma"), ("nat", "cpu"), ("fnat", "dma")] {
        let mut t = Topo::new("vm", Shape::TwoArm, 1500);
        let c = config(&t, mode, copy);
        t.start_lb(&c);
        let mut p = pod(&mut t, "pod-secret");
        wait_connected(&t, 1);

        let u = t.probe(&["udp", "--target", "10.0.0.100:7", "--flows", "50", "--per-flow", "4", "--size", "1000"]);
        assert_eq!(u["lost"], 0, "{mode}/{copy}: {u}\n{}", t.lb_log());
        assert_eq!(u["received"], 200, "{u}");
        // A port the pod does not serve: its ICMP port unreachable comes back through the LB.
        let r = t.probe(&["udp", "--target", "10.0.0.100:9", "--flows", "5", "--per-flow", "1", "--timeout-ms", "500"]);
        assert_eq!(r["refused"], 5, "ICMP port unreachable from the pod, translated: {r}\n{}", t.lb_log());
        // ICMP echo to the VIP is the LB's own.
        let ping = t.run("cl", &["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.0.0.100"]);
        assert!(ping.status.success(), "{}", stdout(&ping));
        let s = t.stats();
        assert!(s["icmp_errors_translated"].as_u64().unwrap() >= 5, "{s}");

        let st = memif_status(&t);
        let q = &st["memif"]["queues"][0];
        assert!(q["rx_packets"].as_u64().unwrap() >= 205 && q["tx_packets"].as_u64().unwrap() >= 205, "{st}");
        assert_eq!(q["bad_desc"], 0);
        let copies = if copy == "dma" { q["copies_dma"].as_u64().unwrap() + q["copies_cpu_fallback"].as_u64().unwrap() } else { q["copies_cpu"].as_u64().unwrap() };
        assert!(copies >= 400, "1000-byte frames copied by the {copy} engine: {st}");
        assert_eq!(st["link_up"], true);
        let metrics = String::from_utf8(api_call(&t.api(), "GET", "/metrics", None).unwrap().1).unwrap();
        assert!(metrics.contains("vectorlb_memif_connected{port=\"pod\"} 1"), "{metrics}");
        assert!(metrics.contains("vectorlb_memif_packets_total{port=\"pod\",queue=\"0\",dir=\"rx\"}"));

        // A second pod on the interface in use is refused, and the first keeps working.
        let mut second = pod(&mut t, "pod-secret");
        wait_reason(&t, "Already connected");
        second.kill();
        let u = t.probe(&["udp", "--target", "10.0.0.100:7", "--flows", "5", "--per-flow", "2"]);
        assert_eq!(u["lost"], 0, "the first pod still answers: {u}");

        // The pod dies; health stays ok (a pod is not the data plane). A pod with the wrong
        // secret is refused; the right one comes back.
        p.kill();
        let start = Instant::now();
        while memif_status(&t)["memif"]["connected"] == true {
            assert!(start.elapsed() < Duration::from_secs(10), "the pod's end was not noticed: {}\n{}", memif_status(&t), t.lb_log());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(t.get("/v1/health")["status"], "ok");
        let mut wrong = pod(&mut t, "wrong");
        wait_reason(&t, "Incorrect secret");
        wrong.kill();
        let mut p = pod(&mut t, "pod-secret");
        wait_connected(&t, 2);
        let u = t.probe(&["udp", "--target", "10.0.0.100:7", "--flows", "20", "--per-flow", "2"]);
        assert_eq!(u["lost"], 0, "after the pod restarted: {u}");
        p.kill();
        t.stop_lb();
    }
}

/// An IP-mode memif port: the pod sends and receives bare IPv4 packets; the port adds and takes
/// off the Ethernet header, the pod's address resolves without ARP, and what is not IP is
/// counted. A pod that asks for Ethernet mode is refused.
#[test]
fn an_ip_mode_pod() {
    let mut t = Topo::new("vi", Shape::TwoArm, 1500);
    let c = config_with(&t, "fnat", "cpu", "ip");
    t.start_lb(&c);
    let mut eth = pod(&mut t, "pod-secret");
    wait_reason(&t, "Mode mismatch: ethernet offered, ip configured");
    eth.kill();
    let mut p = pod_with(&mut t, "pod-secret", &["--ip-mode"]);
    wait_connected(&t, 1);
    let u = t.probe(&["udp", "--target", "10.0.0.100:7", "--flows", "50", "--per-flow", "4", "--size", "1000"]);
    // The first datagrams may wait for the next hop to be resolved (within a second).
    assert!(u["received"].as_u64().unwrap() >= 190, "{u}\n{}", t.lb_log());
    let u = t.probe(&["udp", "--target", "10.0.0.100:7", "--flows", "20", "--per-flow", "5", "--size", "300"]);
    assert_eq!(u["lost"], 0, "{u}\n{}", t.lb_log());
    let r = t.probe(&["udp", "--target", "10.0.0.100:9", "--flows", "5", "--per-flow", "1", "--timeout-ms", "500"]);
    assert_eq!(r["refused"], 5, "ICMP port unreachable from an IP-mode pod: {r}");
    let st = memif_status(&t);
    assert_eq!(st["memif"]["mode"], "ip", "{st}");
    assert_eq!(st["memif"]["queues"][0]["bad_desc"], 0, "{st}");
    let n = t.get("/v1/neighbors");
    assert!(n.to_string().contains("02:6d:65:6d:69:66"), "the pod resolved to the IP link's peer MAC: {n}");
    p.kill();
    t.stop_lb();
}
