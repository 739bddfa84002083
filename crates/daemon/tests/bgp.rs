//! The daemon's BIRD against a router that nobody here wrote: BIRD 2 in a router namespace
//! (Debian's bird2; the scale-out topology's top-of-rack router is FRR), a veth between them.
//! Announce and withdraw, BIRD killed and restarted by the supervisor, the node's link cut
//! (BFD's detection time printed), and a stop that withdraws first.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vectorlb_config::{BgpNeighbor, BgpSpec};
use vectorlb_daemon::bgp::{Bird, Prefix, Routes};

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two namespaces joined by a veth; removed on drop with everything running in them.
struct Net {
    node: String,
    rtr: String,
    dir: PathBuf,
    router: Option<Child>,
}

impl Net {
    fn new() -> Net {
        let id = std::process::id() % 100_000;
        let (node, rtr) = (format!("vlbbgp-n{id}"), format!("vlbbgp-r{id}"));
        let dir = std::env::temp_dir().join(format!("vectorlb-bgp-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let net = Net { node, rtr, dir, router: None };
        for ns in [&net.node, &net.rtr] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            run(&["ip", "netns", "add", ns]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        run(&["ip", "link", "add", "vlbbgp0", "netns", &net.node, "type", "veth", "peer", "name", "vlbbgp1", "netns", &net.rtr]);
        for (ns, dev, v4, v6) in [(&net.node, "vlbbgp0", "10.99.0.1/24", "fd99::1/64"), (&net.rtr, "vlbbgp1", "10.99.0.254/24", "fd99::fe/64")] {
            run(&["ip", "-n", ns, "addr", "add", v4, "dev", dev]);
            run(&["ip", "-n", ns, "addr", "add", v6, "dev", dev, "nodad"]);
            run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        net
    }

    /// A BIRD router: accepts the node's routes and installs them in its kernel table.
    fn start_router(&mut self) {
        let conf = self.dir.join("router.conf");
        std::fs::write(
            &conf,
            "router id 10.99.0.254;\nlog stderr all;\nprotocol device {}\nprotocol bfd { interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }\n\
             protocol kernel { ipv4 { export all; }; }\nprotocol kernel { ipv6 { export all; }; }\n\
             template bgp node { local as 65000; hold time 9; bfd on; connect retry time 2; error wait time 1, 5; }\n\
             protocol bgp node4 from node { neighbor 10.99.0.1 as 65001; password \"s3cret-pass\"; ipv4 { import all; export none; }; }\n\
             protocol bgp node6 from node { neighbor fd99::1 as 65001; ipv6 { import all; export none; }; }\n",
        )
        .unwrap();
        let sock = self.dir.join("router.ctl");
        let log = std::fs::File::create(self.dir.join("router.log")).unwrap();
        let c =
            Command::new("ip").args(["netns", "exec", &self.rtr, "/usr/sbin/bird", "-f", "-c"]).arg(&conf).arg("-s").arg(&sock).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        self.router = Some(c);
    }

    /// Whether the router's kernel has a route to `dst` learned from BIRD.
    fn router_has(&self, dst: &str) -> bool {
        let fam = if dst.contains(':') { "-6" } else { "-4" };
        let out = Command::new("ip").args([fam, "-n", &self.rtr, "route", "show", dst, "proto", "bird"]).output().unwrap();
        !String::from_utf8_lossy(&out.stdout).trim().is_empty()
    }

    /// Waits until the router has (or has not) the route; the time it took.
    fn wait_route(&self, dst: &str, present: bool, within: Duration) -> Duration {
        let t = Instant::now();
        while self.router_has(dst) != present {
            assert!(t.elapsed() < within, "{dst}: the router {} it after {within:?}\n{}", if present { "never learned" } else { "still has" }, self.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
        t.elapsed()
    }

    fn logs(&self) -> String {
        let r = std::fs::read_to_string(self.dir.join("router.log")).unwrap_or_default();
        let n = std::fs::read_to_string(self.dir.join("node/bird.log")).unwrap_or_default();
        format!("router's BIRD:\n{r}\nnode's BIRD:\n{n}")
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(mut c) = self.router.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.node, &self.rtr] {
            // Whatever still runs in them (a BIRD the test lost track of).
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).output();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A wrapper that runs BIRD in the node's namespace (the daemon runs it directly; here the
/// node is a namespace of the test's).
fn bird_in(ns: &str, dir: &Path) -> String {
    let p = dir.join("bird-in-ns");
    std::fs::write(&p, format!("#!/bin/sh\nexec ip netns exec {ns} /usr/sbin/bird \"$@\"\n")).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.display().to_string()
}

fn spec(bird: String) -> BgpSpec {
    let mut s = BgpSpec::new(
        65001,
        "10.99.0.1".parse().unwrap(),
        vec![
            BgpNeighbor { address: "10.99.0.254".parse().unwrap(), asn: 65000, password: Some("s3cret-pass".into()) },
            BgpNeighbor { address: "fd99::fe".parse().unwrap(), asn: 65000, password: None },
        ],
    );
    s.communities = vec![(65001, 100)];
    s.bird = bird;
    s
}

fn prefixes(p: &[(&str, u8)]) -> Routes {
    let primary: BTreeSet<Prefix> = p.iter().map(|(a, l)| (a.parse().unwrap(), *l)).collect();
    Routes { primary, backup: BTreeSet::new() }
}

#[test]
fn announces_withdraws_and_survives_bird_dying() {
    assert!(Path::new("/usr/sbin/bird").exists(), "BIRD 2 is missing (scripts/setup.sh installs bird2)");
    let mut net = Net::new();
    net.start_router();
    let mut bird = Bird::start(&spec(bird_in(&net.node, &net.dir)), &net.dir.join("node")).unwrap();
    // Sessions come up (IPv4 with its TCP MD5 password, IPv6).
    let t = Instant::now();
    while !bird.sessions().iter().all(|s| s.established()) {
        assert!(t.elapsed() < Duration::from_secs(20), "sessions: {:?}\n{}", bird.sessions(), net.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("{{\"bench\":\"bgp_sessions_up\",\"seconds\":{:.2}}}", t.elapsed().as_secs_f64());
    // Announce two VIPs, then withdraw one.
    bird.announce(&prefixes(&[("10.0.0.100", 32), ("2001:db8::100", 128)])).unwrap();
    let up = net.wait_route("10.0.0.100", true, Duration::from_secs(10));
    net.wait_route("2001:db8::100", true, Duration::from_secs(10));
    let route = run(&["ip", "-n", &net.rtr, "route", "show", "10.0.0.100"]);
    assert!(route.contains("via 10.99.0.1"), "next hop is the node: {route}");
    bird.announce(&prefixes(&[("2001:db8::100", 128)])).unwrap();
    let down = net.wait_route("10.0.0.100", false, Duration::from_secs(10));
    assert!(net.router_has("2001:db8::100"), "the other VIP stays");
    println!("{{\"bench\":\"bgp_announce\",\"announce_ms\":{},\"withdraw_ms\":{}}}", up.as_millis(), down.as_millis());
    // BIRD killed: the router drops the route; the supervisor starts BIRD again with the same
    // announcements, and the route comes back.
    bird.announce(&prefixes(&[("10.0.0.100", 32), ("2001:db8::100", 128)])).unwrap();
    net.wait_route("10.0.0.100", true, Duration::from_secs(10));
    let pid = std::fs::read_to_string(net.dir.join("node/bird.pid")).unwrap();
    run(&["kill", "-9", pid.trim()]);
    net.wait_route("10.0.0.100", false, Duration::from_secs(5));
    let t = Instant::now();
    while !bird.supervise() {
        assert!(t.elapsed() < Duration::from_secs(5), "not restarted: {:?}", bird.error);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(bird.restarts, 1);
    net.wait_route("10.0.0.100", true, Duration::from_secs(20));
    // The node goes silent as a dead machine would (every packet dropped, the link up, so
    // neither BIRD closes anything): the router's BFD notices (3 x 100 ms) and withdraws,
    // long before the 9 s hold time would.
    let silence = |on: bool| {
        let rules = if on {
            "table inet vlbdead {\n chain i { type filter hook input priority 0; policy drop; }\n chain o { type filter hook output priority 0; policy drop; }\n}\n"
        } else {
            "delete table inet vlbdead\n"
        };
        let mut c = Command::new("ip").args(["netns", "exec", &net.node, "nft", "-f", "-"]).stdin(Stdio::piped()).spawn().unwrap();
        std::io::Write::write_all(c.stdin.as_mut().unwrap(), rules.as_bytes()).unwrap();
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success(), "nft");
    };
    let t = Instant::now();
    silence(true);
    net.wait_route("10.0.0.100", false, Duration::from_secs(5));
    let detect = t.elapsed();
    println!("{{\"bench\":\"bgp_bfd_detection\",\"ms\":{}}}", detect.as_millis());
    assert!(detect < Duration::from_secs(1), "BFD detection took {detect:?}");
    silence(false);
    let back = net.wait_route("10.0.0.100", true, Duration::from_secs(30));
    println!("{{\"bench\":\"bgp_back_after_silence\",\"seconds\":{:.2}}}", back.as_secs_f64());
    // A stop withdraws before BIRD goes.
    bird.stop(Duration::from_millis(300));
    net.wait_route("10.0.0.100", false, Duration::from_secs(2));
    assert!(!net.router_has("2001:db8::100"));
}

#[test]
fn a_bad_binary_is_an_error_not_a_hang() {
    let dir = std::env::temp_dir().join(format!("vectorlb-bgp-bad-{}", std::process::id()));
    let mut s = spec("/nonexistent/bird".into());
    s.neighbors.truncate(1);
    let e = Bird::start(&s, &dir).err().expect("no such binary").to_string();
    assert!(e.contains("/nonexistent/bird"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
