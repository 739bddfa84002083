//! High availability with the real keepalived: two LB nodes share the VIP through VRRP;
//! keepalived's notify scripts switch the data plane between MASTER and BACKUP through
//! `vectorlb ctl --ha-state`, and a track script notices a dead daemon.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vectorlb_testkit::*;

/// An LB node: its daemon and the keepalived that tracks it.
struct Node {
    name: &'static str,
    dir: PathBuf,
    lb: Option<Daemon>,
    keepalived: Option<Child>,
}

impl Node {
    fn lb(&self) -> &Daemon {
        self.lb.as_ref().expect("the node's daemon runs")
    }

    fn api(&self) -> String {
        self.lb().api()
    }

    fn ha_state(&self) -> String {
        match self.lb().try_call("GET", "/v1/ha", None) {
            Ok((200, v)) => v["state"].as_str().unwrap_or("").to_string(),
            _ => "unreachable".into(),
        }
    }

    fn sync(&self) -> serde_json::Value {
        self.lb().get("/v1/sync")
    }

    fn stats(&self) -> serde_json::Value {
        self.lb().stats()
    }

    /// SIGKILL to the daemon.
    fn kill_lb(&mut self) {
        if let Some(mut d) = self.lb.take() {
            d.kill();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(c) = self.keepalived.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub const SYNC_KEY: &str = "test-sync-key-0123456789";

/// `group`: sync over this multicast group instead of unicast to the other node.
fn lb_config(t: &Topo, dir: &Path, k: u8, group: Option<&str>) -> String {
    let me = if k == 1 { "10.1.0.251" } else { "10.1.0.252" };
    let peer = group.unwrap_or(if k == 1 { "10.1.0.252" } else { "10.1.0.251" });
    // A multicast group's members: only they may send.
    let sources = if group.is_some() { "sync_sources = [\"10.1.0.251\", \"10.1.0.252\"]\n" } else { "" };
    format!(
        "[runtime]\napi = \"unix:{d}/api.sock\"\nrun_dir = \"{d}\"\nmbufs = 16383\nidle_sleep_us = 100\nha_state = \"backup\"\n\n\
         [ha]\nsync_listen = \"{me}:7788\"\nsync_peers = [\"{peer}:7788\"]\n{sources}sync_key = \"{SYNC_KEY}\"\n\n\
         [[ports]]\nname = \"ext\"\ndevice = \"net_af_xdp0,iface=ext0\"\naddrs = [\"10.0.0.{a}/24\"]\n\n\
         [[ports]]\nname = \"int\"\ndevice = \"net_af_xdp1,iface=int0\"\naddrs = [\"10.1.0.{a}/24\"]\n\n{svc}",
        d = dir.display(),
        a = if k == 1 { 1 } else { 3 },
        svc = service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 80))
            + &service("10.0.0.100", 9000, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 9000)),
    )
    .replace("{t}", &t.p)
}

fn keepalived_config(dir: &Path, k: u8, api: &str) -> String {
    let ctl = format!("{} ctl --api {api}", bin());
    let (me, peer, prio) = if k == 1 { ("10.0.0.251", "10.0.0.252", 150) } else { ("10.0.0.252", "10.0.0.251", 100) };
    format!(
        "global_defs {{\n  router_id lb{k}\n  script_user root\n  enable_script_security\n  vrrp_version 3\n}}\n\
         vrrp_script vectorlb_alive {{\n  script \"{ctl} --ha\"\n  interval 1\n  timeout 1\n  fall 1\n  rise 1\n}}\n\
         vrrp_instance VI_1 {{\n  state BACKUP\n  interface ext0\n  virtual_router_id 51\n  priority {prio}\n  advert_int 0.2\n\
         \x20 unicast_src_ip {me}\n  unicast_peer {{\n    {peer}\n  }}\n  track_script {{\n    vectorlb_alive\n  }}\n\
         \x20 virtual_ipaddress {{\n    192.0.2.100/32 dev lo\n  }}\n\
         \x20 notify_master \"{ctl} --ha-state master\"\n  notify_backup \"{ctl} --ha-state backup\"\n  notify_fault \"{ctl} --ha-state backup\"\n}}\n"
    )
    .replace("{dir}", &dir.display().to_string())
}

fn start_node(t: &Topo, k: u8) -> Node {
    start_node_with(t, k, None)
}

fn start_node_with(t: &Topo, k: u8, group: Option<&str>) -> Node {
    let name = if k == 1 { "lb1" } else { "lb2" };
    let dir = t.dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("lb.toml");
    std::fs::write(&cfg, lb_config(t, &dir, k, group)).unwrap();
    let lb = Daemon::spawn(name, &dir, &mut t.cmd(name, &[bin(), "run", "--config", cfg.to_str().unwrap()]));
    let mut node = Node { name, dir: dir.clone(), lb: Some(lb), keepalived: None };
    wait_until(Duration::from_secs(20), &format!("{name}'s API"), || node.ha_state() != "unreachable");
    let kc = dir.join("keepalived.conf");
    std::fs::write(&kc, keepalived_config(&dir, k, &node.api())).unwrap();
    let klog = std::fs::File::create(dir.join("keepalived.log")).unwrap();
    let ka = t
        .cmd(name, &["keepalived", "-n", "-l", "-D", "-P", "-f", kc.to_str().unwrap(), "-p", dir.join("k.pid").to_str().unwrap(), "-r", dir.join("v.pid").to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(klog.try_clone().unwrap())
        .stderr(klog)
        .spawn()
        .unwrap();
    node.keepalived = Some(ka);
    node
}

/// Both nodes started, lb1 the master and lb2 the backup.
fn pair(t: &Topo) -> (Node, Node) {
    let lb1 = start_node(t, 1);
    let lb2 = start_node(t, 2);
    wait_state(&lb1, "master", Duration::from_secs(15));
    wait_state(&lb2, "backup", Duration::from_secs(5));
    (lb1, lb2)
}

fn wait_state(n: &Node, want: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let s = n.ha_state();
        if s == want {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "{} is {s}, not {want}, after {limit:?}; keepalived log:\n{}",
            n.name,
            std::fs::read_to_string(n.dir.join("keepalived.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn vrrp_moves_the_vip_to_the_standby_when_the_active_lb_dies() {
    let mut t = Topo::new("va", Shape::Ha, 1500);
    t.nginx();
    let (mut lb1, lb2) = pair(&t);
    std::thread::sleep(Duration::from_millis(300));
    let r = t.http("http://10.0.0.100/", 200, 4);
    assert_eq!(r["errors"], 0, "{r}");
    assert_spread(&r, 200);
    assert!(lb1.stats()["sessions_created"].as_u64().unwrap() >= 200, "the MASTER serves");
    assert_eq!(lb2.stats()["sessions_created"], 0, "the BACKUP is silent");

    // SIGKILL the active LB: keepalived's track script fails, lb1 resigns, lb2 becomes
    // MASTER and announces the VIP; new connections go to it.
    let killed = Instant::now();
    lb1.kill_lb();
    loop {
        let r = t.probe(&["http", "--url", "http://10.0.0.100/", "--requests", "1", "--concurrency", "1", "--timeout-ms", "200", "--json"]);
        if r["errors"] == 0 {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(15), "no failover in 15 s: lb2 is {}", lb2.ha_state());
    }
    let failover_ms = killed.elapsed().as_millis();
    eprintln!("new connections served by the standby {failover_ms} ms after SIGKILL of the active LB");
    assert_eq!(lb2.ha_state(), "master");
    let r = t.http("http://10.0.0.100/", 200, 4);
    assert_eq!(r["errors"], 0, "{r}");
    assert!(lb2.stats()["sessions_created"].as_u64().unwrap() >= 200);
}

fn assert_spread(r: &serde_json::Value, total: u64) {
    let s = spread(r);
    assert_eq!(s.len(), 3, "{r}");
    assert!(s.iter().all(|(_, n)| *n * 100 >= total * 15), "{r}");
}

/// Starts `probe hold` (100 connections, 50 streaming, 8 s) and waits until they are open.
fn hold_connections(t: &Topo) -> std::thread::JoinHandle<serde_json::Value> {
    let ready = t.dir.join("ready");
    let _ = std::fs::remove_file(&ready);
    let ns = t.ns("cl");
    let ready2 = ready.clone();
    let h = std::thread::spawn(move || {
        let o = Command::new("ip")
            .args(["netns", "exec", &ns, tools(), "probe", "hold", "--target", "10.0.0.100:9000", "--connections", "100", "--streaming", "50", "--seconds", "8", "--ready-file"])
            .arg(&ready2)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        serde_json::from_str::<serde_json::Value>(out.lines().last().unwrap_or("{}")).unwrap_or_else(|_| panic!("hold: {out} {}", String::from_utf8_lossy(&o.stderr)))
    });
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "connections did not open");
        std::thread::sleep(Duration::from_millis(20));
    }
    h
}

#[test]
fn a_graceful_switchover_keeps_every_connection() {
    let mut t = Topo::new("vg2", Shape::Ha, 1500);
    t.echo(9000);
    let (lb1, lb2) = pair(&t);
    let hold = hold_connections(&t);
    std::thread::sleep(Duration::from_millis(1500));
    // Lower lb1's priority and make keepalived re-read its configuration: lb2 preempts.
    let kc = lb1.dir.join("keepalived.conf");
    let conf = std::fs::read_to_string(&kc).unwrap().replace("priority 150", "priority 50");
    std::fs::write(&kc, conf).unwrap();
    let pid = lb1.keepalived.as_ref().unwrap().id();
    sh(&["kill", "-HUP", &pid.to_string()]);
    wait_state(&lb2, "master", Duration::from_secs(5));
    wait_state(&lb1, "backup", Duration::from_secs(5));
    let r = hold.join().unwrap();
    let survived = r["survived"].as_u64().unwrap();
    eprintln!("HA switchover survived={survived}/100 max_stall_ms={}", r["max_stall_ms"]);
    assert_eq!(survived, 100, "{r}");
    assert!(lb2.stats()["rx"].as_u64().unwrap() > 0, "the new MASTER carries the traffic");
}

#[test]
fn connections_survive_the_active_lb_being_killed() {
    let mut t = Topo::new("vs", Shape::Ha, 1500);
    t.echo(9000);
    let (mut lb1, lb2) = pair(&t);
    // The standby asked for the table and got it (empty so far).
    let t0 = Instant::now();
    while lb2.sync()["bulk"]["completed"].as_u64().unwrap_or(0) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no bulk transfer: {}", lb2.sync());
        std::thread::sleep(Duration::from_millis(50));
    }
    // 100 long-lived connections through the VIP: 50 stream a message every 50 ms, 50 stay
    // idle and must still work at the end.
    let hold = hold_connections(&t);
    std::thread::sleep(Duration::from_millis(1500));
    let installed = lb2.sync()["installed"].as_u64().unwrap();
    assert!(installed >= 100, "the standby holds the sessions before the failover: {}", lb2.sync());
    lb1.kill_lb();
    let r = hold.join().unwrap();
    let survived = r["survived"].as_u64().unwrap();
    let failover_ms = r["max_stall_ms"].as_u64().unwrap();
    assert_eq!(lb2.ha_state(), "master");
    let st = lb2.sync();
    assert_eq!(st["refused"]["bad_hmac"], 0);
    eprintln!("standby sync: {st}");
    eprintln!("HA OK survived={survived}/100 failover_ms={failover_ms}");
    assert!(survived >= 99, "{r}");
}

#[test]
fn forged_truncated_and_replayed_sync_messages_change_nothing() {
    let mut t = Topo::new("vf2", Shape::Ha, 1500);
    t.echo(9000);
    let (_lb1, lb2) = pair(&t);
    // The client namespace cannot reach the sync network: send from lb1's host address.
    let inject = |mode: &str, first: u16| {
        let o = t.run("lb1", &[tools(), "probe", "sync-inject", "--to", "10.1.0.252:7788", "--key", SYNC_KEY, "--mode", mode, "--first-port", &first.to_string()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(300));
        (lb2.sync(), lb2.stats()["sessions"].as_u64().unwrap())
    };
    let (s0, n0) = (lb2.sync(), lb2.stats()["sessions"].as_u64().unwrap());
    let (s1, n1) = inject("bad-mac", 31000);
    assert_eq!(n1, n0, "a message sealed under another key installs nothing");
    assert_eq!(s1["refused"]["bad_hmac"].as_u64().unwrap(), s0["refused"]["bad_hmac"].as_u64().unwrap() + 1);
    let (s2, n2) = inject("truncated", 32000);
    assert_eq!(n2, n0);
    assert_eq!(s2["refused"]["truncated"].as_u64().unwrap(), s1["refused"]["truncated"].as_u64().unwrap() + 1, "{s2}");
    // A valid message installs its 4 sessions; the same message again is a replay. (The
    // injected messages come from lb1's address with a newer epoch, as if lb1 had restarted:
    // lb1's own messages of its older epoch are refused as replays from then on too, so the
    // replay counter only grows; what was installed is the measure.)
    let (s3, n3) = inject("replay", 33000);
    assert_eq!(n3, n0 + 4, "{s3}");
    assert!(s3["refused"]["replayed"].as_u64().unwrap() > s2["refused"]["replayed"].as_u64().unwrap(), "{s3}");
    assert_eq!(s3["installed"].as_u64().unwrap(), s2["installed"].as_u64().unwrap() + 4);
    // Sent again from another port of the same address: still a replay, installed once (the
    // window was per socket address: a new port started a new window, and the records came
    // back).
    let (s4, n4) = inject("replay-new-port", 34000);
    assert_eq!(n4, n3 + 4, "{s4}");
    assert_eq!(s4["installed"].as_u64().unwrap(), s3["installed"].as_u64().unwrap() + 4, "a replay from a new port was taken: {s4}");
    assert!(s4["refused"]["replayed"].as_u64().unwrap() > s3["refused"]["replayed"].as_u64().unwrap(), "{s4}");
    // From an address that is not a peer (lb2's own, as a pod or anyone on the sync network
    // would): dropped before any cryptography, even sealed under the key.
    let o = t.run("lb2", &[tools(), "probe", "sync-inject", "--to", "10.1.0.252:7788", "--key", SYNC_KEY, "--mode", "good", "--first-port", "35000"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::thread::sleep(Duration::from_millis(300));
    let (s5, n5) = (lb2.sync(), lb2.stats()["sessions"].as_u64().unwrap());
    assert_eq!(n5, n4, "a stranger's message installed sessions: {s5}");
    assert_eq!(s5["refused"]["foreign"].as_u64().unwrap(), s4["refused"]["foreign"].as_u64().unwrap() + 1, "{s5}");
    assert_eq!(s5["refused"]["bad_hmac"], s4["refused"]["bad_hmac"]);
    // Sealed under the key but two minutes old by its sender's clock (a captured message
    // replayed to a node whose windows a restart emptied): refused.
    let (s6, n6) = inject("outdated", 36000);
    assert_eq!(n6, n5, "an outdated message installed sessions: {s6}");
    assert_eq!(s6["refused"]["outdated"].as_u64().unwrap(), s5["refused"]["outdated"].as_u64().unwrap() + 1, "{s6}");
    // The end of a bulk transfer this node did not ask for (a replayed BULK_DONE once made a
    // starting group node ready without the group's sessions): not taken.
    let (s7, _) = inject("bulk-done", 37000);
    assert_eq!(s7["bulk"]["unrequested"].as_u64().unwrap(), s6["bulk"]["unrequested"].as_u64().unwrap() + 1, "{s7}");
    assert_eq!(s7["bulk"]["completed"], s6["bulk"]["completed"], "{s7}");
}

#[test]
fn a_standby_that_joins_late_gets_the_table_in_bulk() {
    let mut t = Topo::new("vb", Shape::Ha, 1500);
    t.echo(9000);
    let mut lb1 = start_node(&t, 1);
    wait_state(&lb1, "master", Duration::from_secs(15));
    // The connections open while lb1 is alone; lb2 joins afterwards and must ask for them.
    let hold = hold_connections(&t);
    // What a listener on the sync network sees of the transfer.
    let pcap = t.dir.join("sync.pcap");
    let mut capture = Command::new("ip")
        .args(["netns", "exec", &t.ns("lb2"), "tcpdump", "-i", "int0", "-n", "-p", "-U", "--immediate-mode", "-w"])
        .arg(&pcap)
        .args(["udp", "port", "7788"])
        .stderr(Stdio::null())
        .spawn()
        .expect("tcpdump (scripts/setup.sh)");
    // tcpdump writes the file's 24-byte header once it captures: a fixed pause was not always
    // long enough on a loaded machine.
    let t0 = Instant::now();
    while std::fs::metadata(&pcap).map(|m| m.len()).unwrap_or(0) < 24 {
        assert!(t0.elapsed() < Duration::from_secs(20), "tcpdump did not start capturing");
        std::thread::sleep(Duration::from_millis(50));
    }
    let lb2 = start_node(&t, 2);
    wait_state(&lb2, "backup", Duration::from_secs(10));
    let t0 = Instant::now();
    while lb2.sync()["bulk"]["records_received"].as_u64().unwrap_or(0) < 100 {
        assert!(t0.elapsed() < Duration::from_secs(5), "no bulk transfer: {}", lb2.sync());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The records are sealed: neither the client's address nor the VIP's appears in the
    // datagrams (in wire version 2 every record carried both in the clear). Without
    // --immediate-mode the kernel hands tcpdump its packets a block at a time, up to a second
    // late, and those still in the ring when it is stopped are never written.
    let t0 = Instant::now();
    while std::fs::metadata(&pcap).map(|m| m.len()).unwrap_or(0) <= 100 * 98 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(capture.id() as i32, libc::SIGINT) };
    capture.wait().unwrap();
    let wire = std::fs::read(&pcap).unwrap();
    assert!(wire.len() > 100 * 98, "the capture holds the transfer ({} bytes)", wire.len());
    for (what, a) in [("the client", [10u8, 0, 0, 2]), ("the VIP", [10, 0, 0, 100])] {
        assert!(!wire.windows(4).any(|w| w == a), "{what}'s address is readable in the sync traffic ({} bytes captured)", wire.len());
    }
    lb1.kill_lb();
    let r = hold.join().unwrap();
    eprintln!("late standby: {}", lb2.sync());
    assert!(r["survived"].as_u64().unwrap() >= 99, "{r}");
}

#[test]
fn sessions_sync_over_a_multicast_group_too() {
    let mut t = Topo::new("vm2", Shape::Ha, 1500);
    t.echo(9000);
    let mut lb1 = start_node_with(&t, 1, Some("239.7.7.7"));
    let lb2 = start_node_with(&t, 2, Some("239.7.7.7"));
    wait_state(&lb1, "master", Duration::from_secs(15));
    wait_state(&lb2, "backup", Duration::from_secs(5));
    let hold = hold_connections(&t);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(lb2.sync()["installed"].as_u64().unwrap() >= 100, "{}", lb2.sync());
    lb1.kill_lb();
    let r = hold.join().unwrap();
    assert!(r["survived"].as_u64().unwrap() >= 99, "{r}");
}
