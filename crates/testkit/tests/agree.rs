//! Two daemons started from one configuration file choose the same backend for every flow
//! (docs/scale-out.md, "The same choice on every node"): each runs in a network namespace of
//! its own (its own process, its own random session-table key) from the same file, with the
//! same 100,000 spoofed mid-flow segments sent to it by `vectorlb-tools gen --ack-flood`
//! (whose sources repeat from run to run); stateless continuation gives each segment the
//! backend its flow's consistent hash picks, and the two daemons' session tables, read through
//! their APIs, must agree on every flow, for each scheduler that can agree (maglev, sh).

use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;
use vectorlb_testkit::*;

const FLOWS: u64 = 100_000;
/// (VIP, scheduler).
const SERVICES: [(&str, &str); 2] = [("10.100.0.1", "maglev"), ("10.100.0.2", "sh")];

/// Every session of daemon `d` on `vip`: client (address:port) -> backend.
fn sessions(d: &Daemon, vip: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut cursor = 0u64;
    loop {
        let page = d.get(&format!("/v1/sessions?worker=0&family=4&limit=10000&cursor={cursor}"));
        for x in page["sessions"].as_array().unwrap() {
            if x["vip"].as_str().unwrap().starts_with(&format!("{vip}:")) {
                out.insert(x["client"].as_str().unwrap().to_string(), x["backend"].as_str().unwrap().to_string());
            }
        }
        match page["next_cursor"].as_u64() {
            Some(c) => cursor = c,
            None => return out,
        }
    }
}

#[test]
fn two_daemons_from_one_file_choose_the_same_backend_for_every_flow() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let t = Topo::new("vag", Shape::Scale, 1500);
    // One file; relative paths, so that each daemon keeps its socket in its own directory.
    let mut text = String::from(
        "[global]\ncluster_key = \"agreement-test-cluster-key\"\nmax_sessions = 1000000\ncontinuation_share = 0.25\n\n\
         [runtime]\napi = \"unix:api.sock\"\nrun_dir = \".\"\nmbufs = 16383\nidle_sleep_us = 100\n\n\
         [[ports]]\nname = \"int\"\ndevice = \"net_af_xdp0,iface=int0\"\naddrs = [\"10.1.0.1/24\"]\n\n",
    );
    for (vip, sched) in SERVICES {
        text += &format!(
            "[[services]]\nvip = \"{vip}\"\nport = 9000\nproto = \"tcp\"\nmode = \"dr\"\nscheduler = \"{sched}\"\n\
             backends = [{{ addr = \"10.1.0.11\" }}, {{ addr = \"10.1.0.12\" }}, {{ addr = \"10.1.0.13\" }}]\n\n"
        );
    }
    let file = t.dir.join("agree.toml");
    std::fs::write(&file, text).unwrap();
    let mut daemons = Vec::new();
    for k in 1..=2 {
        let dir = t.dir.join(format!("lb{k}"));
        std::fs::create_dir_all(&dir).unwrap();
        let name = format!("lb{k}");
        daemons.push(Daemon::spawn(&name, &dir, t.cmd(&name, &[bin(), "run", "--config", file.to_str().unwrap()]).current_dir(&dir)));
    }
    for d in &mut daemons {
        d.wait_healthy(Duration::from_secs(20));
    }
    // The same segments to each daemon's port, from the router's side of the bridge.
    for (k, d) in daemons.iter().enumerate() {
        let mac = stdout(&t.run(&format!("lb{}", k + 1), &["cat", "/sys/class/net/int0/address"])).trim().to_string();
        for (vip, _) in SERVICES {
            let args = [
                tools(),
                "gen",
                "--tx",
                "net_af_packet0,iface=rs0",
                "--dst-mac",
                &mac,
                "--dst-ip",
                vip,
                "--dst-port",
                "9000",
                "--ack-flood",
                "--count",
                "100000",
                "--rate",
                "100000",
                "--seconds",
                "10",
                "--json",
            ];
            let g = t.run("rt", &args);
            let j: Value =
                stdout(&g).lines().rev().find_map(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| panic!("gen: {}{}", stdout(&g), String::from_utf8_lossy(&g.stderr)));
            assert_eq!(j["sent"].as_u64(), Some(FLOWS), "{j}");
        }
        let st = d.get("/v1/stats");
        eprintln!("lb{}: {} sessions, {} continued", k + 1, st["sessions"], st["continued"]);
    }
    std::thread::sleep(Duration::from_millis(300));
    for (vip, sched) in SERVICES {
        let (a, b) = (sessions(&daemons[0], vip), sessions(&daemons[1], vip));
        // (The flood's few repeated sources make one session each: fewer flows than segments.)
        assert!(a.len() as u64 > FLOWS * 9 / 10, "{sched}: lb1 has {} of {FLOWS} flows", a.len());
        let both: Vec<&String> = a.keys().filter(|c| b.contains_key(*c)).collect();
        assert!(both.len() as u64 > FLOWS * 9 / 10, "{sched}: {} flows on both", both.len());
        let differ = both.iter().filter(|c| a[**c] != b[**c]).count();
        let mut per: HashMap<&String, usize> = HashMap::new();
        for c in &both {
            *per.entry(&a[*c]).or_default() += 1;
        }
        println!("{}", serde_json::json!({ "agreement": { "scheduler": sched, "flows": both.len(), "different_backend": differ, "per_backend": per } }));
        assert_eq!(differ, 0, "{sched}: the two daemons chose different backends for {differ} of {} flows", both.len());
        assert_eq!(per.len(), 3, "{sched}: every backend chosen: {per:?}");
    }
}
