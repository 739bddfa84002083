//! The benchmark kit end to end (root): the generator through the daemon and through
//! dpdk-testpmd on the AF_XDP generator topology (bench/rfc2544.sh), with short trials.
//! These check that the kit measures (counts add up, every packet is accounted for, the
//! search's result is one of its passing trials), not how fast anything is.

use serde_json::Value;
use std::process::Command;
use std::sync::Mutex;

use vectorlb_testkit::{bin, tools};
static SERIAL: Mutex<()> = Mutex::new(());

fn kit(dut: &str, args: &[&str], gen_args: Option<&str>) -> Vec<Value> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(vectorlb_testkit::is_root(), "the benchmark-kit tests need root (network namespaces, AF_XDP)");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut c = Command::new("bash");
    c.arg(repo.join("bench/rfc2544.sh")).arg(dut).args(args).env("BIN", bin()).env("TOOLS", tools());
    if let Some(g) = gen_args {
        c.env("GEN_ARGS", g);
    }
    let out = c.output().expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{dut}: {}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).expect("JSON line")).collect()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {v}"))
}

#[test]
fn generator_through_the_daemon_udp_and_tcp() {
    for proto in ["udp", "tcp"] {
        let r = kit("vectorlb", &[], Some(&format!("--rate 20000 --seconds 1 --flows 64 --proto {proto}")));
        assert_eq!(r.len(), 1, "{r:?}");
        let r = &r[0];
        let (sent, received) = (f(r, "sent"), f(r, "received"));
        assert!((16_000.0..=20_001.0).contains(&sent), "{proto}: paced at 20 kpps for 1 s (late packets are skipped): {r}");
        // A light load on a shared machine: everything (or nearly) comes back, through the
        // LB's full NAT (the source port rewritten), in order, with a latency.
        assert!(received >= 0.99 * sent && received <= sent, "{proto}: {r}");
        assert_eq!(f(r, "lost"), sent - received);
        assert_eq!(f(r, "reordered"), 0.0, "{proto}: {r}");
        let l = &r["latency_us"];
        assert!(f(l, "min") > 0.0 && f(l, "min") <= f(l, "p50") && f(l, "p50") <= f(l, "p99") && f(l, "p99") <= f(l, "max"), "{l}");
    }
}

#[test]
fn rfc2544_search_through_the_daemon_and_testpmd() {
    for dut in ["vectorlb", "testpmd"] {
        let rs = kit(dut, &["64,512", "0.3", "1", "0.25"], None);
        assert_eq!(rs.len(), 2, "{dut}: one line per size: {rs:?}");
        for (r, size) in rs.iter().zip([64.0, 512.0]) {
            assert_eq!((r["dut"].as_str(), f(r, "frame_bytes")), (Some(dut), size));
            let (max, ndr, pdr, offered) = (f(r, "max_mpps"), f(r, "ndr_mpps"), f(r, "pdr_mpps"), f(r, "offered_mpps"));
            assert!(max > 0.0 && offered > 0.0 && ndr <= pdr && pdr <= offered * 1.001, "{dut}: {r}");
            let trials = r["trials"].as_array().unwrap();
            assert!(!trials.is_empty());
            // A confirmed NDR is a rate that passed a trial with no loss.
            if r["confirmed"] == Value::Bool(true) && ndr > 0.0 {
                let ndr_pps = (ndr * 1e6).round();
                assert!(
                    trials.iter().any(|t| t["pass"] == Value::Bool(true) && t["allowed"] == 0.0 && (f(t, "rate_pps") - ndr_pps).abs() < 1.0),
                    "{dut}: NDR {ndr_pps} is not a passing trial: {r}"
                );
            }
            for t in trials {
                let loss = f(t, "loss_ratio");
                assert_eq!(t["pass"].as_bool(), Some(loss <= f(t, "allowed")), "{t}");
            }
        }
    }
}

#[test]
fn generator_sends_and_receives_jumbo_frames_on_af_packet() {
    // AF_XDP in DPDK 22.11 has no multi-buffer frames; af_packet on a 9000-MTU veth pair takes
    // the generator's largest frames (9000 bytes without FCS), sent on one end, received on the
    // other.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(vectorlb_testkit::is_root(), "needs root (network namespaces)");
    let ns = "vlbjumbo";
    let sh = |args: &[&str]| {
        let o = Command::new(args[0]).args(&args[1..]).output().expect("spawn");
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
    sh(&["ip", "netns", "add", ns]);
    struct Del(&'static str);
    impl Drop for Del {
        fn drop(&mut self) {
            vectorlb_testkit::remove_netns(self.0);
        }
    }
    let _del = Del(ns);
    sh(&["ip", "netns", "exec", ns, "ip", "link", "add", "ja", "type", "veth", "peer", "name", "jb"]);
    for d in ["ja", "jb"] {
        sh(&["ip", "netns", "exec", ns, "ip", "link", "set", d, "mtu", "9000", "up"]);
    }
    let mac = sh(&["ip", "netns", "exec", ns, "cat", "/sys/class/net/jb/address"]);
    let dev = |n: u8, i: &str| format!("net_af_packet{n},iface={i},framesz=16384,blocksz=16384,framecnt=256");
    let out = sh(&[
        "ip",
        "netns",
        "exec",
        ns,
        tools(),
        "gen",
        "--tx",
        &dev(0, "ja"),
        "--rx",
        &dev(1, "jb"),
        "--dst-mac",
        mac.trim(),
        "--size",
        "9000",
        "--rate",
        "5000",
        "--seconds",
        "0.5",
        "--json",
    ]);
    let r: Value = serde_json::from_str(out.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(f(&r, "size"), 9000.0);
    assert!(f(&r, "sent") >= 1000.0, "{r}");
    assert_eq!(f(&r, "received"), f(&r, "sent"), "every 9000-byte frame comes back: {r}");
}
