//! `vectorlb replay` end to end: a pcap in, per-port pcaps and a JSON summary out.

use std::path::PathBuf;
use std::process::Command;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::tcp::flags::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vectorlb-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const ROUTER: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];
const LB: [u8; 6] = [2, 0, 0, 0, 0, 1];

#[test]
fn replay_writes_per_port_captures_and_a_summary() {
    let dir = tmpdir("replay");
    let input = dir.join("in.pcap");
    let mut w = vectorlb_pcap::Writer::new(std::fs::File::create(&input).unwrap()).unwrap();
    let syn = Builder::tcp("198.51.100.7:40000", "10.0.0.100:80", SYN).macs(ROUTER, LB).build();
    w.write(1_000_000_000, &syn).unwrap();
    w.write(1_000_100_000, &syn[..30]).unwrap();
    let ping = Builder::icmp("198.51.100.7", "10.0.0.100", 8, 0, [0, 1, 0, 1]).macs(ROUTER, LB).build();
    w.write(1_000_200_000, &ping).unwrap();
    drop(w);
    let out = dir.join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_vectorlb"))
        .args(["replay", "--config"])
        .arg(root().join("examples/fnat-demo.toml"))
        .arg("--in")
        .arg(&input)
        .arg("--out-dir")
        .arg(&out)
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["packets"], 3);
    assert_eq!(s["tx"]["int"], 1);
    assert_eq!(s["tx"]["ext"], 1);
    assert_eq!(s["drop_reasons"]["truncated"], 1);
    assert_eq!(s["sessions_created"], 1);
    // The SYN left on "int", translated to a local address and a backend.
    let recs: Vec<_> = vectorlb_pcap::Reader::new(std::fs::File::open(out.join("int.pcap")).unwrap()).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].ts_ns, 1_000_000_000);
    let f = &recs[0].data;
    assert_eq!(&f[14 + 12..14 + 16], &[10, 1, 0, 200], "source is the local address");
    assert_eq!(&f[14 + 16..14 + 19], &[10, 1, 0], "destination is a backend");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tmpdir("bad");
    let bin = env!("CARGO_BIN_EXE_vectorlb");
    // A config with a typo.
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[[services]]\nvip = \"10.0.0.1\"\nproto = \"tcp\"\nmode = \"fnatt\"\n").unwrap();
    let o = Command::new(bin).args(["check", "--config"]).arg(&cfg).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("services[0].mode"), "{err}");
    // A file that is not a pcap.
    let notpcap = dir.join("x.pcap");
    std::fs::write(&notpcap, b"hello, this is not a capture").unwrap();
    let o =
        Command::new(bin).args(["replay", "--config"]).arg(root().join("examples/fnat-demo.toml")).arg("--in").arg(&notpcap).arg("--out-dir").arg(dir.join("o")).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a pcap file"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_rejects_nonsense() {
    let o = Command::new(env!("CARGO_BIN_EXE_vectorlb")).args(["bench", "pipeline", "--sessions", "0", "--json"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--sessions"));
}

#[test]
fn bench_cps_runs_complete_lifecycles() {
    let o = Command::new(env!("CARGO_BIN_EXE_vectorlb")).args(["bench", "cps", "--seconds", "0.2", "--rounds", "2", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["errors"], 0);
    assert!(r["connections"].as_u64().unwrap() > 0);
    // Every completed connection's session was removed at its last ACK.
    let created = r["sessions_created"].as_u64().unwrap();
    let removed = r["sessions_removed"].as_u64().unwrap();
    let left = r["sessions_left"].as_u64().unwrap();
    assert_eq!(created, removed + left);
}

#[test]
fn bench_pipeline_forwards_every_packet() {
    for mode in ["nat", "fnat", "dr", "tun"] {
        let o = Command::new(env!("CARGO_BIN_EXE_vectorlb"))
            .args(["bench", "pipeline", "--mode", mode, "--family", "6", "--proto", "tcp"])
            .args(["--sessions", "5000", "--seconds", "0.1", "--rounds", "1", "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{mode}: {}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["not_forwarded"], 0, "{mode}");
        assert_eq!(r["sessions"], 5000);
    }
}

#[test]
fn the_production_binary_carries_no_test_tools() {
    let help = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_vectorlb")).args(args).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };
    let top = help(&["--help"]);
    assert!(top.contains("run") && top.contains("ctl"), "{top}");
    for tool in ["probe", "gen", "rfc2544", "garbage", "sync-inject"] {
        assert!(!top.contains(tool), "`vectorlb --help` lists {tool}:\n{top}");
        assert!(!help(&["bench", "--help"]).contains(tool), "`vectorlb bench --help` lists {tool}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_vectorlb")).args(["probe", "http"]).output().unwrap();
    assert!(!o.status.success(), "`vectorlb probe` is not a command");
}

#[test]
fn check_refuses_nonsense_naming_the_field() {
    let base = std::fs::read_to_string(root().join("examples/fnat-demo.toml")).unwrap();
    let dir = tmpdir("nonsense");
    let cases: Vec<(String, &str)> = vec![
        (base.replace("vip = \"10.0.0.100\"", "vip = \"0.0.0.0\""), "services[0].vip: '0.0.0.0' is the unspecified address"),
        (base.replace("vip = \"10.0.0.100\"", "vip = \"255.255.255.255\""), "services[0].vip: '255.255.255.255' is the broadcast address"),
        (base.replace("vip = \"10.0.0.100\"", "vip = \"::ffff:10.0.0.100\""), "services[0].vip: '::ffff:10.0.0.100' is an IPv4-mapped"),
        (
            base.replace("{ addr = \"10.1.0.11\", port = 8080", "{ addr = \"10.0.0.100\", port = 80"),
            "services[0].backends[0].addr: '10.0.0.100' is a local address of this load balancer, or a VIP with a service on that port",
        ),
        (base.replace("mac = \"02:00:00:00:01:11\"", "mac = \"ff:ff:ff:ff:ff:ff\""), "neighbors[2].mac: 'ff:ff:ff:ff:ff:ff' is a group"),
        (base.replace("local_addrs = [\"10.1.0.200\"]", "local_addrs = [\"10.1.0.200\", \"10.1.0.200\"]"), "services[0].local_addrs[1]: '10.1.0.200' is listed twice"),
        (base.replace("max_sessions = 100000", "max_sessions = 100000\nbatch = 99999"), "global.batch"),
        (base.replace("port = 80\n", "port = 70000\n"), "expected an integer in 0..=65535"),
        // Memory is checked even for a file without devices: replay builds the same tables.
        (base.replace("max_sessions = 100000", "max_sessions = 4000000000"), "global.max_sessions: 4000000000 sessions per worker"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        assert_ne!(text, &base, "case {i} changed the file");
        let p = dir.join(format!("c{i}.toml"));
        std::fs::write(&p, text).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_vectorlb")).args(["check", "--config"]).arg(&p).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "case {i}: want `{want}`, got: {err}");
    }
    // Not regular files: refused at once, never read (a FIFO would block, urandom never ends).
    let start = std::time::Instant::now();
    for p in ["/dev/urandom", "/dev/null"] {
        let o = Command::new(env!("CARGO_BIN_EXE_vectorlb")).args(["check", "--config", p]).output().unwrap();
        assert!(String::from_utf8_lossy(&o.stderr).contains("not a regular file"), "{p}");
    }
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&dir);
}
