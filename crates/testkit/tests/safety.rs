//! Safe to operate, tried as a careless operator and a hostile local user would (root; network
//! namespaces): a second instance, a SIGKILL and a restart, a removed XDP program, the host's
//! own traffic beside NAT and SNAT, absurd sizes, an unauthenticated or unprivileged API
//! client, a restart under load.

use std::time::{Duration, Instant};
use vectorlb_testkit::*;

fn fnat(t: &Topo) -> String {
    t.base_config(None) + &service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 80))
}

fn no_errors(t: &Topo, n: usize, what: &str) {
    let r = t.http("http://10.0.0.100/", n, 4);
    assert_eq!(r["errors"], 0, "{what}: {r}\n{}", t.lb_log());
    assert_eq!(r["requests"], n as u64, "{what}: {r}");
}

#[test]
fn a_second_instance_a_sigkill_and_a_lost_xdp_program() {
    let mut t = Topo::new("vs", Shape::TwoArm, 1500);
    t.nginx();
    let c = fnat(&t);
    t.start_lb(&c);
    no_errors(&t, 100, "first instance");

    // The same interfaces, another API: refused before anything is touched.
    let second = t.dir.join("second.toml");
    std::fs::write(&second, c.replace("api.sock", "api2.sock")).unwrap();
    let o = t.run("lb", &[bin(), "run", "--config", second.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("ports[0]: ext0 is in use by another vectorlb (pid"), "{err}");
    assert!(t.lb_alive(), "the first daemon is unaffected");
    no_errors(&t, 100, "after a second instance on the same interfaces");
    assert_eq!(t.get("/v1/health")["status"], "ok");

    // The same API path, other interfaces: refused too, and the first socket stays.
    let third = t.dir.join("third.toml");
    std::fs::write(&third, c.replace("iface=ext0", "iface=lo").replace("iface=int0", "iface=nosuch0")).unwrap();
    let o = t.run("lb", &[bin(), "run", "--config", third.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("runtime.api: unix:") && err.contains("in use by another vectorlb"), "{err}");
    no_errors(&t, 100, "after a second instance on the same API path");

    // SIGKILL: the XDP programs and the XDP object stay behind; one start clears them.
    let pid = t.lb_pid();
    sh(&["kill", "-9", &pid.to_string()]);
    std::thread::sleep(Duration::from_millis(300));
    let stale = t.dir.join(format!("vectorlb_xdp.{pid}.o"));
    assert!(stale.exists(), "a killed daemon leaves its XDP object");
    t.start_lb(&c);
    assert!(t.lb_log().contains("removed the XDP program"), "{}", t.lb_log());
    assert!(!stale.exists(), "stale files are cleared");
    no_errors(&t, 100, "the first start after SIGKILL");

    // Someone removes the XDP program: health says so within a second, and the track
    // script (ctl --ha) fails, so keepalived would move the VIPs.
    assert_eq!(t.get("/v1/health")["status"], "ok");
    sh(&["ip", "netns", "exec", &t.ns("lb"), "ip", "link", "set", "dev", "ext0", "xdp", "off"]);
    let start = Instant::now();
    let (s, v) = t.call("GET", "/v1/health", None);
    assert_eq!(s, 503, "{v}");
    assert!(v["problems"].to_string().contains("ext0 has no XDP program"), "{v}");
    assert!(start.elapsed() < Duration::from_secs(1));
    let o = t.run("lb", &[bin(), "ctl", "--api", &t.api(), "--ha"]);
    assert!(!o.status.success(), "the track script fails");
    assert!(String::from_utf8_lossy(&o.stderr).contains("degraded"), "{}", String::from_utf8_lossy(&o.stderr));
    t.stop_lb();
}

#[test]
fn the_host_keeps_its_traffic_beside_nat_and_snat() {
    let mut t = Topo::new("vh", Shape::TwoArm, 1500);
    t.nginx();
    // NAT (the backends' replies cross the LB) and SNAT for the whole backend network: the
    // flow director must still leave the host's own traffic (10.1.0.250) to the kernel.
    let mut c = t.base_config(None) + &service("10.0.0.100", 80, "tcp", "nat", "maglev", None, &backends(false, 80));
    c = c.replace("backends = [", "health = { kind = \"http\", path = \"/\", interval = 0.5, fall = 2, rise = 1 }\nbackends = [");
    c += "[[snat]]\nsource = \"10.1.0.0/24\"\naddrs = [\"10.0.0.200\"]\n";
    t.start_lb(&c);
    std::thread::sleep(Duration::from_secs(3));
    let services = t.get("/v1/services");
    for b in services[0]["backends"].as_array().unwrap() {
        assert_eq!(b["health"]["state"], "up", "the host's health checks reach {}: {b}", b["addr"]);
    }
    for be in BE4 {
        let o = t.run("lb", &["ping", "-c", "2", "-i", "0.2", "-W", "2", be]);
        assert!(o.status.success(), "the host pings {be}: {}", stdout(&o));
    }
    no_errors(&t, 100, "NAT with SNAT configured");
    t.stop_lb();
}

#[test]
fn absurd_sizes_and_an_unauthenticated_or_unprivileged_api_client() {
    let mut t = Topo::new("va", Shape::TwoArm, 1500);
    t.nginx();
    let c = fnat(&t);
    // 4 billion sessions: refused by check and by run alike, with the memory it would need.
    let huge = t.dir.join("huge.toml");
    std::fs::write(&huge, c.replace("max_sessions = 200000", "max_sessions = 4000000000")).unwrap();
    for cmd in ["check", "run"] {
        let o = t.run("lb", &[bin(), cmd, "--config", huge.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("global.max_sessions:") && err.contains("MiB"), "{cmd}: {err}");
    }
    // A TCP API without its token file is refused; with it, requests need the token.
    let tcp = c.replace(&format!("api = \"{}\"", t.api()), "api = \"127.0.0.1:9191\"");
    let no_token = t.dir.join("no-token.toml");
    std::fs::write(&no_token, &tcp).unwrap();
    let o = t.run("lb", &[bin(), "check", "--config", no_token.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("runtime.api: a TCP API needs runtime.api_token_file"), "{}", String::from_utf8_lossy(&o.stderr));
    let token = t.dir.join("api.token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let with_token = tcp.replace("api = \"127.0.0.1:9191\"", &format!("api = \"127.0.0.1:9191\"\napi_token_file = \"{}\"", token.display()));
    let cfg = t.dir.join("tcp.toml");
    std::fs::write(&cfg, &with_token).unwrap();
    let o = t.run("lb", &[bin(), "run", "--config", cfg.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("lets others read it"), "a token others can read is refused: {}", String::from_utf8_lossy(&o.stderr));
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut lb = t.cmd("lb", &[bin(), "run", "--config", cfg.to_str().unwrap()]).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let ctl = |args: &[&str]| t.run("lb", &[&[bin(), "ctl", "--api", "127.0.0.1:9191"], args].concat());
    let t0 = Instant::now();
    while !ctl(&["--token-file", token.to_str().unwrap(), "-Ln"]).status.success() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the TCP API came up");
        std::thread::sleep(Duration::from_millis(200));
    }
    let o = ctl(&["-D", "-t", "10.0.0.100:80"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("401"), "no token, no change: {}", String::from_utf8_lossy(&o.stderr));
    let o = ctl(&["--token-file", token.to_str().unwrap(), "-Ln"]);
    assert!(stdout(&o).contains("10.0.0.100:80"), "the service is still there: {}", stdout(&o));
    let _ = sh(&["kill", "-TERM", &lb.id().to_string()]);
    let _ = lb.wait();

    // The unix socket: root only. `nobody` can neither list nor change anything.
    t.start_lb(&c);
    let sock = t.api();
    let o = t.run("lb", &["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", bin(), "ctl", "--api", &sock, "-D", "-t", "10.0.0.100:80"]);
    assert!(!o.status.success(), "nobody cannot use the API");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot reach the API") && err.contains("Permission denied"), "refused by the socket's mode: {err}");
    assert_eq!(t.get("/v1/services").as_array().unwrap().len(), 1);

    // 100 connections that drip a byte every half second do not lock operators out: 30
    // `ctl -Ln` in a row all succeed meanwhile.
    let path = sock.strip_prefix("unix:").unwrap().to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drips: Vec<_> = (0..100)
        .map(|_| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                use std::io::Write;
                let Ok(mut c) = std::os::unix::net::UnixStream::connect(&path) else { return };
                for b in b"GET /v1/services HTTP/1.1\r\n".iter().cycle().take(40) {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) || c.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for k in 0..30 {
        let o = t.run("lb", &[bin(), "ctl", "--api", &sock, "-Ln"]);
        assert!(o.status.success() && stdout(&o).contains("10.0.0.100:80"), "ctl -Ln #{k} while 100 clients drip: {}", String::from_utf8_lossy(&o.stderr));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for d in drips {
        let _ = d.join();
    }
    t.stop_lb();
}

#[test]
fn a_restart_under_load_fails_no_request_after_it() {
    let mut t = Topo::new("vr2", Shape::TwoArm, 1500);
    t.nginx();
    let c = fnat(&t);
    t.start_lb(&c);
    // Connections leave TIME_WAIT entries on the backends for the local ports they used.
    no_errors(&t, 300, "before the restart");
    t.stop_lb();
    t.start_lb(&c);
    // The new instance starts its local ports elsewhere: none meets an old TIME_WAIT.
    no_errors(&t, 300, "right after the restart");
    t.stop_lb();
}
