//! The test kit: topologies in network namespaces (built by `scripts/netns.sh`, the one
//! topology builder the tests, the demo and the benchmarks share), real servers (nginx, the
//! echo probes of `vectorlb-tools`), the daemon, and clients, all torn down on drop. The
//! end-to-end, HA and benchmark-kit tests in `tests/` use it; [`browser`] drives headless
//! Chromium for the status page's test.

pub mod browser;
pub mod k8s;
pub mod node;
pub mod relay;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A workspace binary built beside the running test (`target/<profile>/NAME`): `cargo test
/// --workspace` builds them all; run `cargo build --bins` first when testing this crate alone.
fn binary(name: &str) -> String {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let p = dir.join(name);
    assert!(p.exists(), "{} is missing: build the workspace's binaries first (cargo build --bins)", p.display());
    p.display().to_string()
}

/// Whether this process runs as root (network namespaces and AF_XDP need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The production binary, `vectorlb`.
pub fn bin() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| binary("vectorlb"))
}

/// The CNI plugin, `vectorlb-cni`.
pub fn cni_plugin() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| binary("vectorlb-cni"))
}

/// The test tools, `vectorlb-tools`.
pub fn tools() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| binary("vectorlb-tools"))
}

/// An example program of the workspace (`target/<profile>/examples/NAME`; `make test` builds
/// them: cargo build --examples).
pub fn example(name: &str) -> String {
    binary(&format!("examples/{name}"))
}

/// One request to a daemon's API (`ADDRESS:PORT` or `unix:PATH`): (status, body).
pub fn api_call(api: &str, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Vec<u8>), vectorlb_client::Error> {
    let req = vectorlb_client::Request {
        method: vectorlb_client::Method::from_bytes(method.as_bytes()).expect("an HTTP method"),
        path: path.to_string(),
        host: "vectorlb".into(),
        body: body.map(|b| b.to_string().into_bytes()),
        content_type: "application/json",
        bearer: None,
    };
    let r = vectorlb_client::request_blocking(&api.parse()?, &req, &vectorlb_client::Options::default())?;
    Ok((r.status.as_u16(), r.body.to_vec()))
}

/// Waits until `f` gives `Some`, polling every 50 ms, for at most `limit`: the one wait of the
/// tests.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`wait_for`] a condition; how long it took.
pub fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    wait_for(limit, what, || f().then_some(()));
    t.elapsed()
}

/// Runs `c` with `input` on its standard input; its output (stdout and stderr piped).
pub fn output_with_input(c: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    // A command that exits before reading all of it closes the pipe: its status says why.
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

/// A `vectorlb run` a test started, with its API at `unix:DIR/api.sock` and its output in
/// `DIR/lb.log`: the one daemon handle of the tests. Killed when dropped, whatever way the test
/// ends; its log printed when the test failed.
pub struct Daemon {
    /// For messages: `lb`, `lb1`, ...
    pub name: String,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    /// Starts `cmd` (`vectorlb run ...`, in its namespace), its output to `DIR/lb.log`.
    pub fn spawn(name: &str, dir: &Path, cmd: &mut Command) -> Daemon {
        std::fs::create_dir_all(dir).unwrap();
        let log = std::fs::File::create(dir.join("lb.log")).unwrap();
        let child = cmd.stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap_or_else(|e| panic!("{name}: {e}"));
        Daemon { name: name.to_string(), dir: dir.to_path_buf(), child: Some(child) }
    }

    pub fn api(&self) -> String {
        format!("unix:{}/api.sock", self.dir.display())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("lb.log")).unwrap_or_default()
    }

    /// One request: (status, body), or why there was no answer.
    pub fn try_call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), vectorlb_client::Error> {
        api_call(&self.api(), method, path, body).map(|(s, b)| (s, serde_json::from_slice(&b).unwrap_or(Value::Null)))
    }

    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.try_call(method, path, body).unwrap_or_else(|e| panic!("{}: {method} {path}: {e}\n{}", self.name, self.log()))
    }

    /// `GET path`, which must answer 200.
    pub fn get(&self, path: &str) -> Value {
        let (s, v) = self.call("GET", path, None);
        assert_eq!(s, 200, "{}: GET {path}: {v}", self.name);
        v
    }

    /// Global counters, after the workers' next publication (every 100 ms).
    pub fn stats(&self) -> Value {
        std::thread::sleep(Duration::from_millis(250));
        self.get("/v1/stats")
    }

    /// Waits until `GET /v1/health` answers 200; panics with the log if the daemon exits or
    /// `limit` passes.
    pub fn wait_healthy(&mut self, limit: Duration) {
        let t = Instant::now();
        while !matches!(self.try_call("GET", "/v1/health", None), Ok((200, _))) {
            if let Some(st) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("{} exited ({st}):\n{}", self.name, self.log());
            }
            assert!(t.elapsed() < limit, "{} did not come up in {limit:?}:\n{}", self.name, self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a running daemon").id()
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Reaps a daemon the test killed itself.
    pub fn forget(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// SIGTERM; the daemon must exit cleanly within 10 s.
    pub fn term(&mut self) {
        if let Some(mut c) = self.child.take() {
            // `ip netns exec` execs the daemon, so the child's pid is the daemon's.
            sh(&["kill", "-TERM", &c.id().to_string()]);
            let t = Instant::now();
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    assert!(st.success(), "{} exited with {st} after SIGTERM:\n{}", self.name, self.log());
                    return;
                }
                assert!(t.elapsed() < Duration::from_secs(10), "{} did not stop on SIGTERM", self.name);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() && std::thread::panicking() {
            eprintln!("--- {} log ({}) ---\n{}", self.name, self.dir.display(), self.log());
        }
        self.kill();
    }
}

/// `vectorlb-tools gen` from the client's `cl0` to `dst`:`port` through the next hop `mac`,
/// printing its JSON line; `more` says what to send (`--syn-flood`, `--count N`, ...).
pub fn gen_from_client(mac: &str, dst: &str, port: u16, more: &[&str]) -> Vec<String> {
    let mut a: Vec<String> =
        [tools(), "gen", "--tx", "net_af_packet0,iface=cl0", "--dst-mac", mac, "--dst-ip", dst, "--dst-port", &port.to_string(), "--json"].iter().map(|s| s.to_string()).collect();
    a.extend(more.iter().map(|s| s.to_string()));
    a
}

/// Runs openssl; panics with its message if it fails.
pub fn openssl(args: &[&str]) {
    let o = Command::new("openssl").args(args).output().expect("openssl (scripts/setup.sh)");
    assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A self-signed P-256 certificate for `cn` (and `sans`, as `DNS:name` or `IP:addr`) and its
/// key, written to `cert` and `key`, valid for three days: the one recipe the tests use.
pub fn self_signed(cert: &Path, key: &Path, cn: &str, sans: &[&str]) {
    let subj = format!("/CN={cn}");
    let san = format!("subjectAltName={}", sans.join(","));
    let mut args = vec!["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", &subj, "-days", "3"];
    if !sans.is_empty() {
        args.extend(["-addext", &san]);
    }
    let (k, c) = (key.to_str().unwrap(), cert.to_str().unwrap());
    args.extend(["-keyout", k, "-out", c]);
    openssl(&args);
}

/// Runs a command; panics with its output if it fails.
pub fn sh(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    if !out.status.success() {
        panic!("{args:?} failed: {}\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    out
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The address ranges of the tests' topologies, pools, pod networks and traffic generators.
pub const TEST_PREFIXES: [&str; 5] = ["10.0.0.0/8", "192.168.77.0/24", "198.18.0.0/15", "2001:db8::/32", "fd00::/8"];

/// The metric of the guard routes: the highest, so that a route the machine has of its own for
/// the same range wins (only the default route, a shorter prefix, loses to them).
const GUARD_METRIC: &str = "4294967295";

/// While tests run, a packet that the host's own namespace sends to a test address never leaves
/// by the default route (a test's client once dialled a pool address from the host, which had
/// no route to the topology, and its requests went out to the world): an `unreachable` route
/// for each of [`TEST_PREFIXES`] in the host's namespace, so that such a send fails at once.
/// Routes the machine has for those ranges (a LAN in 10/8), and the routes tests add to reach
/// their topologies (longer prefixes), still win. Installed once per process, removed when it
/// exits. Every topology and control plane calls it.
pub fn contain_test_traffic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    static KEPT: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    extern "C" fn remove() {
        for p in TEST_PREFIXES {
            let fam = if p.contains(':') { "-6" } else { "-4" };
            let _ = Command::new("ip").args([fam, "route", "del", "unreachable", p, "metric", GUARD_METRIC]).output();
        }
        for a in KEPT.get().into_iter().flatten() {
            let _ = Command::new("ip").args(["route", "del", a, "metric", GUARD_METRIC]).output();
        }
    }
    ONCE.call_once(|| {
        // The machine's own resolvers inside a guarded range (one in 10/8, reached by the
        // default route) keep their way out: a route of their own, as the kernel routes them now.
        let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let mut kept = Vec::new();
        for a in resolver_addrs(&resolv).into_iter().filter(|a| in_test_prefixes(*a)) {
            // As the kernel routes it now, or (the guard left by a run that was killed) by the
            // default route of its family.
            let fam = if a.is_ipv4() { "-4" } else { "-6" };
            let now = Command::new("ip").args(["-o", "route", "get", &a.to_string()]).output().ok().and_then(|o| route_via(&stdout(&o)));
            let via = now.or_else(|| Command::new("ip").args([fam, "-o", "route", "show", "default"]).output().ok().and_then(|o| route_via(stdout(&o).lines().next()?)));
            let Some(via) = via else { continue };
            let mut args = vec!["route".to_string(), "replace".into(), a.to_string()];
            args.extend(via);
            args.extend(["metric".into(), GUARD_METRIC.into()]);
            if Command::new("ip").args(&args).output().is_ok_and(|o| o.status.success()) {
                kept.push(a.to_string());
            }
        }
        let _ = KEPT.set(kept);
        for p in TEST_PREFIXES {
            let fam = if p.contains(':') { "-6" } else { "-4" };
            // Already there (a run killed before it could remove them): as good.
            let _ = Command::new("ip").args([fam, "route", "add", "unreachable", p, "metric", GUARD_METRIC]).output();
        }
        // SAFETY: `remove` is an extern "C" fn without arguments, as atexit takes; it runs
        // commands and touches no state of this process that exit has torn down.
        unsafe { libc::atexit(remove) };
    });
}

/// The `nameserver` addresses of a resolv.conf.
pub fn resolver_addrs(text: &str) -> Vec<std::net::IpAddr> {
    text.lines().filter_map(|l| l.trim().strip_prefix("nameserver")).filter_map(|a| a.trim().split('%').next()?.parse().ok()).collect()
}

/// Whether `a` falls in one of [`TEST_PREFIXES`].
pub fn in_test_prefixes(a: std::net::IpAddr) -> bool {
    TEST_PREFIXES.iter().any(|p| {
        let (net, len) = p.split_once('/').expect("prefix");
        let (net, len): (std::net::IpAddr, u32) = (net.parse().expect("address"), len.parse().expect("length"));
        match (net, a) {
            (std::net::IpAddr::V4(n), std::net::IpAddr::V4(x)) => (u32::from(n) ^ u32::from(x)).checked_shr(32 - len).unwrap_or(0) == 0,
            (std::net::IpAddr::V6(n), std::net::IpAddr::V6(x)) => (u128::from(n) ^ u128::from(x)).checked_shr(128 - len).unwrap_or(0) == 0,
            _ => false,
        }
    })
}

/// `via GW dev DEV` (or `dev DEV`) of an `ip -o route get` line; None for a route that is not
/// out of the machine (unreachable, local).
pub fn route_via(line: &str) -> Option<Vec<String>> {
    let w: Vec<&str> = line.split_whitespace().collect();
    if w.first().is_some_and(|f| ["unreachable", "local", "blackhole", "prohibit"].contains(f)) {
        return None;
    }
    let after = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1)).map(|s| s.to_string());
    let dev = after("dev")?;
    Some(match after("via") {
        Some(gw) => vec!["via".into(), gw, "dev".into(), dev],
        None => vec!["dev".into(), dev],
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Shape {
    TwoArm,
    OneArm,
    /// Two LB nodes (lb1, lb2) between an outside bridge with the client and the backends.
    Ha,
    /// A router running FRR (rt) between the client and a bridge with three LB nodes
    /// (lb1..lb3) and the backends (scripts/netns.sh, docs/scale-out.md).
    Scale,
}

pub struct Topo {
    pub p: String,
    pub dir: PathBuf,
    pub shape: Shape,
    /// Processes the test started; killed with the topology.
    pub children: Vec<Child>,
    lb: Option<Daemon>,
    /// Held while the topology exists (tests that build topologies run one at a time); the
    /// second node of a test that holds it already ([`Topo::another`]) has none.
    _serial: Option<MutexGuard<'static, ()>>,
}

impl Topo {
    pub fn new(p: &str, shape: Shape, backend_mtu: u16) -> Topo {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        Topo::build(p, shape, backend_mtu, Some(serial))
    }

    /// A second topology (another node) in a test that holds one already.
    pub fn another(&self, p: &str, shape: Shape, backend_mtu: u16) -> Topo {
        assert_ne!(p, self.p);
        Topo::build(p, shape, backend_mtu, None)
    }

    fn build(p: &str, shape: Shape, backend_mtu: u16, serial: Option<MutexGuard<'static, ()>>) -> Topo {
        assert!(is_root(), "the end-to-end tests need root (network namespaces, AF_XDP)");
        contain_test_traffic();
        let dir = std::env::temp_dir().join(format!("vectorlb-e2e-{p}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let script = repo().join("scripts/netns.sh");
        let s = match shape {
            Shape::OneArm => "one-arm",
            Shape::TwoArm => "two-arm",
            Shape::Ha => "ha",
            Shape::Scale => "scale",
        };
        sh(&[script.to_str().unwrap(), "up", p, s, &backend_mtu.to_string()]);
        Topo { p: p.to_string(), dir, shape, children: Vec::new(), lb: None, _serial: serial }
    }

    pub fn ns(&self, n: &str) -> String {
        format!("{}-{n}", self.p)
    }

    /// A command inside namespace `n`.
    pub fn cmd(&self, n: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(n)]).args(args);
        c
    }

    pub fn run(&self, n: &str, args: &[&str]) -> Output {
        self.cmd(n, args).output().unwrap()
    }

    pub fn spawn(&mut self, n: &str, args: &[&str]) {
        let c = self.cmd(n, args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        self.children.push(c);
    }

    /// nginx in each backend, answering every path with its name ("be1".."be3").
    pub fn nginx(&mut self) {
        for i in 1..=3 {
            self.start_nginx(i);
        }
    }

    pub fn start_nginx(&mut self, i: usize) {
        {
            let d = self.dir.join(format!("be{i}"));
            std::fs::create_dir_all(&d).unwrap();
            let d = d.display();
            let (cert, key) = self.tls_files();
            let conf = format!(
                "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{ worker_connections 4096; }}\n\
                 http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n fastcgi_temp_path {d}/fcgi;\n\
                 uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n default_type text/plain;\n\
                 server {{\n  listen 80;\n  listen [::]:80;\n  listen 443 ssl;\n  ssl_certificate {cert};\n  ssl_certificate_key {key};\n\
                 \x20 location / {{ return 200 \"be{i}\\n\"; }}\n }}\n}}\n"
            );
            let path = format!("{d}/nginx.conf");
            std::fs::write(&path, conf).unwrap();
            let o = self.run(&format!("be{i}"), &["nginx", "-c", &path, "-p", &d.to_string()]);
            assert!(o.status.success(), "nginx in be{i}: {}", String::from_utf8_lossy(&o.stderr));
        }
    }

    /// A self-signed certificate and key for the backends' HTTPS (made once per topology).
    fn tls_files(&self) -> (String, String) {
        let cert = self.dir.join("cert.pem");
        let key = self.dir.join("key.pem");
        if !cert.exists() {
            self_signed(&cert, &key, "backend", &[]);
        }
        (cert.display().to_string(), key.display().to_string())
    }

    /// Kills every nginx process (master and workers) of backend `i`.
    pub fn kill_nginx(&self, i: usize) {
        let pids = sh(&["ip", "netns", "pids", &self.ns(&format!("be{i}"))]);
        for pid in stdout(&pids).split_whitespace() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "nginx" {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
    }

    /// UDP and TCP echo servers in each backend on `port` (v4 and v6).
    pub fn echo(&mut self, port: u16) {
        self.echo_idle(port, 30);
    }

    /// [`Topo::echo`] whose TCP servers close a connection silent for `idle_s` seconds.
    pub fn echo_idle(&mut self, port: u16, idle_s: u32) {
        for i in 1..=3 {
            let n = format!("be{i}");
            let name = format!("be{i}");
            // One dual-stack socket serves both families.
            self.spawn(&n, &[tools(), "probe", "serve-udp", "--listen", &format!("[::]:{port}"), "--name", &name]);
            self.spawn(&n, &[tools(), "probe", "serve-tcp", "--listen", &format!("[::]:{port}"), "--name", &name, "--idle-timeout-s", &idle_s.to_string()]);
        }
        std::thread::sleep(Duration::from_millis(300));
    }

    /// UDP echo servers bound to specific addresses (DR: the VIP on the backend's loopback).
    pub fn echo_bound(&mut self, port: u16, addrs: &[&str]) {
        for i in 1..=3 {
            let n = format!("be{i}");
            let name = format!("be{i}");
            for a in addrs {
                let l = if a.contains(':') { format!("[{a}]:{port}") } else { format!("{a}:{port}") };
                self.spawn(&n, &[tools(), "probe", "serve-udp", "--listen", &l, "--name", &name]);
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }

    pub fn api(&self) -> String {
        format!("unix:{}/api.sock", self.dir.display())
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("lb.toml")
    }

    /// The runtime and port sections for this topology; services are appended by the test.
    pub fn base_config(&self, int_mtu: Option<u16>) -> String {
        let mut c = format!("[global]\nmax_sessions = 200000\n\n[runtime]\napi = \"{}\"\nmbufs = 16383\nrun_dir = \"{}\"\nidle_sleep_us = 100\n\n", self.api(), self.dir.display());
        if self.shape == Shape::TwoArm {
            c += "[[ports]]\nname = \"ext\"\ndevice = \"net_af_xdp0,iface=ext0\"\naddrs = [\"10.0.0.1/24\", \"2001:db8::1/64\"]\n\n";
        }
        c += "[[ports]]\nname = \"int\"\ndevice = \"net_af_xdp1,iface=int0\"\naddrs = [\"10.1.0.1/24\", \"2001:db8:1::1/64\"]\n";
        if let Some(m) = int_mtu {
            c += &format!("mtu = {m}\n");
        }
        c + "\n"
    }

    /// Writes the configuration and starts the daemon; waits until its API answers and its
    /// backends are resolved.
    pub fn start_lb(&mut self, config: &str) {
        std::fs::write(self.config_path(), config).unwrap();
        let cfg = self.config_path();
        let mut d = Daemon::spawn("vectorlb run", &self.dir.clone(), &mut self.cmd("lb", &[bin(), "run", "--config", cfg.to_str().unwrap()]));
        d.wait_healthy(Duration::from_secs(20));
        self.lb = Some(d);
        // Next hops resolve within a second or two (ARP / ND from the LB).
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let v = self.get("/v1/services");
            let all = v.as_array().unwrap().iter().all(|s| s["backends"].as_array().unwrap().iter().all(|b| b["resolved"] == true));
            if all {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("backends not resolved in 10 s: {}\n{}", self.get("/v1/services"), self.lb_log());
    }

    pub fn lb_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("lb.log")).unwrap_or_default()
    }

    pub fn lb_alive(&mut self) -> bool {
        self.lb.as_mut().is_some_and(Daemon::alive)
    }

    /// Forgets a daemon the test killed itself (reaps it), so that another can start.
    pub fn forget_lb(&mut self) {
        if let Some(mut d) = self.lb.take() {
            d.forget();
        }
    }

    pub fn lb_pid(&self) -> u32 {
        self.lb.as_ref().unwrap().pid()
    }

    /// Kills the daemon (SIGKILL) without letting it clean up.
    pub fn kill_lb(&mut self) {
        if let Some(mut d) = self.lb.take() {
            d.kill();
        }
    }

    /// Stops the daemon with SIGTERM and checks it exits cleanly.
    pub fn stop_lb(&mut self) {
        if let Some(mut d) = self.lb.take() {
            d.term();
        }
    }

    /// A request to the daemon's API (whether or not one runs now).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let (s, b) = api_call(&self.api(), method, path, body).unwrap();
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    pub fn get(&self, path: &str) -> Value {
        let (s, v) = self.call("GET", path, None);
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }

    /// Global counters, after the workers' next publication (every 100 ms).
    pub fn stats(&self) -> Value {
        std::thread::sleep(Duration::from_millis(250));
        self.get("/v1/stats")
    }

    /// `vectorlb-tools probe ...` in the client namespace; returns its JSON line.
    pub fn probe(&self, args: &[&str]) -> Value {
        let mut a = vec![tools(), "probe"];
        a.extend_from_slice(args);
        let o = self.run("cl", &a);
        let out = stdout(&o);
        let line = out
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or_else(|| panic!("probe {args:?} printed no JSON: {out}\n{}\nLB log:\n{}", String::from_utf8_lossy(&o.stderr), self.lb_log()));
        serde_json::from_str(line).unwrap()
    }

    pub fn http(&self, url: &str, requests: usize, concurrency: usize) -> Value {
        self.probe(&["http", "--url", url, "--requests", &requests.to_string(), "--concurrency", &concurrency.to_string(), "--json"])
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        // The daemon's log is printed as it is dropped, when the test failed.
        if std::thread::panicking() && self.lb.is_none() {
            eprintln!("--- LB log ({}) ---\n{}", self.p, self.lb_log());
        }
        drop(self.lb.take());
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let script = repo().join("scripts/netns.sh");
        let _ = Command::new(script).args(["down", &self.p]).status();
    }
}

/// Removes a network namespace a test made, after killing every process inside it (a process
/// in a deleted namespace runs on, unreachable, after the test).
pub fn remove_netns(name: &str) {
    if let Ok(o) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: kill(2) on a pid read just now from the namespace; at worst it is gone.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = Command::new("ip").args(["netns", "del", name]).output();
}

/// Counts per backend name from a probe's "backends" object.
pub fn spread(v: &Value) -> Vec<(String, u64)> {
    v["backends"].as_object().map(|m| m.iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap())).collect()).unwrap_or_default()
}

pub fn service(vip: &str, port: u16, proto: &str, mode: &str, sched: &str, laddr: Option<&str>, backends: &[(&str, u16, u32)]) -> String {
    let mut s = format!("[[services]]\nvip = \"{vip}\"\nport = {port}\nproto = \"{proto}\"\nmode = \"{mode}\"\nscheduler = \"{sched}\"\n");
    if let Some(l) = laddr {
        s += &format!("local_addrs = [\"{l}\"]\n");
    }
    s += "backends = [\n";
    for (a, p, w) in backends {
        s += &format!("    {{ addr = \"{a}\", port = {p}, weight = {w} }},\n");
    }
    s + "]\n\n"
}

pub const BE4: [&str; 3] = ["10.1.0.11", "10.1.0.12", "10.1.0.13"];
pub const BE6: [&str; 3] = ["2001:db8:1::11", "2001:db8:1::12", "2001:db8:1::13"];

pub fn backends(v6: bool, port: u16) -> Vec<(&'static str, u16, u32)> {
    (if v6 { BE6 } else { BE4 }).iter().map(|a| (*a, port, 1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_keeps_the_machines_resolvers() {
        let r = resolver_addrs("# comment\nnameserver 10.255.255.53\nsearch x\nnameserver fe80::1%eth0\nnameserver  8.8.8.8 \n");
        assert_eq!(r, vec!["10.255.255.53".parse::<std::net::IpAddr>().unwrap(), "fe80::1".parse().unwrap(), "8.8.8.8".parse().unwrap()]);
        assert!(in_test_prefixes("10.255.255.53".parse().unwrap()));
        assert!(in_test_prefixes("fd00:244:1::5".parse().unwrap()));
        assert!(!in_test_prefixes("8.8.8.8".parse().unwrap()));
        assert!(!in_test_prefixes("192.168.78.1".parse().unwrap()));
        assert_eq!(route_via("10.255.255.53 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \\    cache "), Some(vec!["via".into(), "192.0.2.1".into(), "dev".into(), "eth0".into()]));
        assert_eq!(route_via("10.1.2.3 dev eth1 src 10.1.2.1 uid 0"), Some(vec!["dev".into(), "eth1".into()]));
        assert_eq!(route_via("unreachable 10.255.255.53 table main"), None);
        assert_eq!(route_via("local 127.0.0.1 dev lo"), None);
    }
}
