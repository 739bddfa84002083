//! Test traffic stays on the machine: with the guard routes every topology installs
//! ([`vectorlb_testkit::contain_test_traffic`]), whatever the host's own namespace sends to an
//! address of a test range fails at once instead of leaving by the default route, and a capture
//! on the default route's interface sees none of it.

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;
use vectorlb_testkit::{contain_test_traffic, stdout, TEST_PREFIXES};

/// Addresses across each test range: its first, one in the middle, its last.
fn probes() -> Vec<IpAddr> {
    let mut out = Vec::new();
    for p in TEST_PREFIXES {
        let (a, len) = p.split_once('/').unwrap();
        let len: u32 = len.parse().unwrap();
        match a.parse::<IpAddr>().unwrap() {
            IpAddr::V4(v) => {
                let (base, span) = (u32::from(v), 1u32 << (32 - len));
                for off in [1, span / 2 + 7, span - 2] {
                    out.push(IpAddr::V4((base + off).into()));
                }
            }
            IpAddr::V6(v) => {
                let base = u128::from(v);
                for off in [1u128, 1 << (127 - len), (1 << (128 - len)) - 2] {
                    out.push(IpAddr::V6((base + off).into()));
                }
            }
        }
    }
    out
}

/// The interface of the host's default route of a family, if it has one.
fn default_dev(fam: &str) -> Option<String> {
    let o = Command::new("ip").args([fam, "route", "show", "default"]).output().ok()?;
    let s = stdout(&o);
    let mut w = s.split_whitespace();
    while let Some(x) = w.next() {
        if x == "dev" {
            return w.next().map(str::to_string);
        }
    }
    None
}

#[test]
fn nothing_sent_to_a_test_address_from_the_host_leaves_the_machine() {
    if !vectorlb_testkit::is_root() {
        panic!("needs root (routes in the host's namespace, a capture)");
    }
    contain_test_traffic();
    // Only the addresses whose route here is the guard (the machine's own routes for a test
    // range, a LAN in 10/8, are its business and are left out).
    let guarded: Vec<IpAddr> = probes()
        .into_iter()
        .filter(|a| {
            let o = Command::new("ip").args(["route", "get", &a.to_string()]).output().unwrap();
            let route = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
            // The guard shows as `unreachable`, or `ip route get` fails with it.
            let ours = route.contains("unreachable") || route.contains("No route to host") || route.contains("Network is unreachable");
            if !ours {
                println!("{a}: this machine routes it itself ({}); not probed", route.trim());
            }
            ours
        })
        .collect();
    assert!(guarded.len() >= TEST_PREFIXES.len(), "the guard routes are missing: {guarded:?}");
    // A capture on each default interface for packets to any test range.
    let filter = TEST_PREFIXES.iter().map(|p| format!("dst net {p}")).collect::<Vec<_>>().join(" or ");
    let mut captures = Vec::new();
    for fam in ["-4", "-6"] {
        if let Some(dev) = default_dev(fam) {
            if captures.iter().any(|(d, _)| *d == dev) {
                continue;
            }
            let c = Command::new("tcpdump")
                .args(["-i", &dev, "-n", "-l", "-p", "--immediate-mode", &filter])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("tcpdump (scripts/setup.sh)");
            captures.push((dev, c));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut refused = 0;
    for a in &guarded {
        let bind: SocketAddr = if a.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
        let u = std::net::UdpSocket::bind(bind).unwrap();
        let sent = u.send_to(b"must not leave", SocketAddr::new(*a, 9));
        let tcp = std::net::TcpStream::connect_timeout(&SocketAddr::new(*a, 80), Duration::from_millis(500));
        println!("{a}: udp {:?}, tcp {:?}", sent.as_ref().map_err(|e| e.kind()), tcp.as_ref().map(|_| ()).map_err(|e| e.kind()));
        assert!(sent.is_err() && tcp.is_err(), "{a}: a send from the host's namespace went somewhere");
        refused += 1;
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut seen = String::new();
    for (dev, c) in captures {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        let o = c.wait_with_output().unwrap();
        let lines = stdout(&o);
        println!("{dev}: {} packets to test ranges captured", lines.lines().filter(|l| !l.trim().is_empty()).count());
        seen += &lines;
    }
    println!("{refused} test addresses probed from the host's namespace, all refused at once");
    assert!(seen.trim().is_empty(), "test traffic left by the default route:\n{seen}");
}

/// The guard leaves the machine's own resolvers reachable (a resolver in 10/8, reached by the
/// default route, was cut off while tests ran: the Go module proxy with it).
#[test]
fn the_machines_resolvers_stay_reachable_under_the_guard() {
    if !vectorlb_testkit::is_root() {
        panic!("needs root (routes in the host's namespace)");
    }
    contain_test_traffic();
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    for a in vectorlb_testkit::resolver_addrs(&resolv) {
        let o = Command::new("ip").args(["route", "get", &a.to_string()]).output().unwrap();
        let route = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
        println!("resolver {a}: {}", route.trim());
        assert!(o.status.success() && !route.contains("unreachable"), "resolver {a} is cut off by the guard: {route}");
    }
}
