//! `vectorlb kube` against a real control plane (crates/testkit/src/k8s.rs): kube-apiserver,
//! kube-controller-manager and kube-scheduler built from the Kubernetes Go module, etcd, and
//! Pods run by the test's fake kubelet in network namespaces behind a real vectorlb daemon
//! (AF_XDP, two-arm topology). The controller runs as its own service account with only the
//! rights deploy/kubernetes/rbac.yaml gives it.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vectorlb_testkit::k8s::{endpoints, tail, ControlPlane, FakeKubelet, Kubectl};
use vectorlb_testkit::node::{PodNetwork, RealNode};
use vectorlb_testkit::wait_for;
use vectorlb_testkit::{bin, repo, self_signed, stdout, tools, Shape, Topo};

const POOL: &str = "10.0.0.100-10.0.0.149";

fn controller_config(topo: &Topo, dir: &Path, metrics_port: u16) -> PathBuf {
    let path = dir.join(format!("controller-{metrics_port}.toml"));
    let text = format!(
        "classless = true\nlease_seconds = 6\nresync_seconds = 5\nmetrics = \"127.0.0.1:{metrics_port}\"\n\n\
         [[daemons]]\nname = \"lb\"\napi = \"{}\"\nlocal_addrs = [\"10.1.0.200\", \"2001:db8:1::200\"]\n",
        topo.api()
    );
    std::fs::write(&path, text).unwrap();
    path
}

struct Controller {
    child: Option<Child>,
    log: PathBuf,
    args: Vec<String>,
}

impl Controller {
    fn start(cp: &ControlPlane, config: &Path, identity: &str) -> Controller {
        let log = cp.dir.join(format!("controller-{identity}.log"));
        let args = vec![
            "kube".to_string(),
            "run".into(),
            "--config".into(),
            config.display().to_string(),
            "--kubeconfig".into(),
            cp.kubeconfig("controller").display().to_string(),
            "--identity".into(),
            identity.into(),
        ];
        let mut c = Controller { child: None, log, args };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(bin())
            .args(&self.args)
            .env("RUST_LOG", std::env::var("VECTORLB_TEST_CONTROLLER_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process ignores SIGPIPE (its `SigIgn` mask in /proc).
    fn ignores_sigpipe(&self) -> bool {
        let Some(c) = &self.child else { return false };
        let status = std::fs::read_to_string(format!("/proc/{}/status", c.id())).unwrap_or_default();
        let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:")).and_then(|m| u64::from_str_radix(m.trim(), 16).ok()).unwrap_or(0);
        mask & (1 << (libc::SIGPIPE - 1)) != 0
    }

    /// Each thread's name, state and wait channel (what a stuck controller waits on).
    fn threads(&self) -> String {
        let Some(c) = &self.child else { return String::new() };
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", c.id())) else { return String::new() };
        dir.flatten()
            .map(|t| {
                let r = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default().trim().to_string();
                let stat = r("stat");
                let state = stat.rsplit_once(") ").map_or("", |(_, rest)| &rest[..1]).to_string();
                format!("{}:{}:{}", r("comm"), state, r("wchan"))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- controller log ---\n{}", tail(&self.log(), 60));
        }
    }
}

fn deployment(name: &str, replicas: u32) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "terminationGracePeriodSeconds": 10,
                "containers": [{"name": "web", "image": "vectorlb.local/nginx", "ports": [{"containerPort": 80, "name": "http"}],
                    // The endpoint is drained (terminating) while the Pod still serves.
                    "lifecycle": {"preStop": {"sleep": {"seconds": 2}}}}]}}}})
}

fn lb_service(name: &str, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
}

/// The Service's address from its status.
fn address(cp: &ControlPlane, name: &str) -> Option<String> {
    let v = cp.get(&["-n", "default", "service", name]);
    v["status"]["loadBalancer"]["ingress"][0]["ip"].as_str().map(str::to_string)
}

/// Pod names that answered through the VIP (`requests` requests from the client).
fn backends_seen(topo: &Topo, ip: &str, requests: usize) -> (Vec<String>, u64) {
    let r = topo.http(&format!("http://{ip}/"), requests, 4);
    let mut names: Vec<String> = r["backends"].as_object().map(|m| m.keys().map(|k| k.trim().to_string()).collect()).unwrap_or_default();
    names.sort();
    (names, r["errors"].as_u64().unwrap_or(u64::MAX))
}

fn pods(cp: &ControlPlane, app: &str) -> Vec<String> {
    let v = cp.get(&["-n", "default", "pods", "-l", &format!("app={app}")]);
    let mut names: Vec<String> =
        v["items"].as_array().unwrap().iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).map(|p| p["metadata"]["name"].as_str().unwrap().to_string()).collect();
    names.sort();
    names
}

/// HTTP load from the client for `secs` seconds, in the background: 400 new connections a
/// second, so that the daemon's one local address never reuses a port on a Pod still holding
/// it in TIME_WAIT (60 s; see docs/kubernetes.md).
fn load(topo: &Topo, ip: &str, secs: f64) -> Child {
    topo.cmd(
        "cl",
        &[tools(), "probe", "http", "--url", &format!("http://{ip}/"), "--duration-s", &secs.to_string(), "--concurrency", "8", "--rate", "400", "--timeout-ms", "3000", "--json"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap()
}

fn finish(c: Child) -> Value {
    let o = c.wait_with_output().unwrap();
    let out = stdout(&o);
    serde_json::from_str(out.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON from the load: {out}"))).unwrap()
}

fn events(cp: &ControlPlane, name: &str) -> Vec<(String, String)> {
    let v = cp.get(&["-n", "default", "events", "--field-selector", &format!("involvedObject.name={name}")]);
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["reason"].as_str().unwrap_or("").to_string(), e["message"].as_str().or(e["note"].as_str()).unwrap_or("").to_string()))
        .collect()
}

fn wait_event(cp: &ControlPlane, name: &str, reason: &str) -> String {
    wait_for(Duration::from_secs(15), &format!("a {reason} event on {name}"), || events(cp, name).into_iter().find(|(r, _)| r == reason).map(|(_, m)| m))
}

/// The daemon (no services), a control plane with vectorlb's resource definition and RBAC, and
/// one fake node; the seconds the control plane took to be ready.
/// The daemon, the control plane (its start-up time) and vectorlb's resource definition and RBAC.
fn control_plane(topo: &mut Topo) -> (ControlPlane, f64) {
    topo.start_lb(&topo.base_config(None));
    let t0 = Instant::now();
    let cp = ControlPlane::start(&topo.dir.join("k8s"));
    let ready_s = t0.elapsed().as_secs_f64();
    cp.apply_text(&std::fs::read_to_string(repo().join("deploy/kubernetes/crds.yaml")).unwrap()).unwrap();
    cp.apply_text(&std::fs::read_to_string(repo().join("deploy/kubernetes/rbac.yaml")).unwrap()).unwrap();
    (cp, ready_s)
}

/// The control plane with one fake node (the fake kubelet's).
fn cluster(topo: &mut Topo) -> (ControlPlane, f64) {
    let (cp, ready_s) = control_plane(topo);
    cp.add_node("node-1", "10.1.0.250");
    wait_for(Duration::from_secs(10), "the AddressPool resource", || cp.kubectl(&["get", "addresspools"]).status.success().then_some(()));
    (cp, ready_s)
}

#[test]
fn services_endpoints_and_pools_program_the_daemon() {
    let mut topo = Topo::new("k8", Shape::TwoArm, 1500);
    let (cp, control_plane_s) = cluster(&mut topo);
    // The deployment manifests are valid for this control plane (server-side dry run).
    for f in ["controller.yaml", "dataplane.yaml"] {
        let path = repo().join("deploy/kubernetes").join(f);
        let o = cp.kubectl(&["apply", "--dry-run=server", "-f", path.to_str().unwrap()]);
        assert!(o.status.success(), "deploy/kubernetes/{f}: {}", String::from_utf8_lossy(&o.stderr));
    }
    // Without the Gateway API's role the controller reads no Secret (it once read every
    // Secret of every namespace whatever it served).
    for verb in ["get", "list", "watch"] {
        let o = cp.kubectl(&["auth", "can-i", verb, "secrets", "-A", "--as=system:serviceaccount:vectorlb-system:vectorlb-controller"]);
        assert_eq!(stdout(&o).trim(), "no", "the controller may {verb} Secrets with rbac.yaml alone");
    }
    let _kubelet = FakeKubelet::start(&cp, &topo.p, "10.1.0.100".parse().unwrap()..="10.1.0.199".parse().unwrap(), "10.1.0.1");
    cp.apply(&[json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "default"}, "spec": {"addresses": [POOL]}})]).unwrap();
    let cfg = controller_config(&topo, &cp.dir, vectorlb_testkit::k8s::free_port());
    let mut ctl = Controller::start(&cp, &cfg, "a");

    eprintln!("== control plane up in {:.1} s (etcd, kube-apiserver, kube-controller-manager, kube-scheduler v1.34.0); vectorlb kube leading", control_plane_s);
    // A Deployment of 3 and its Service: an address within 2 s, all three Pods behind it.
    let t = Instant::now();
    cp.apply(&[deployment("web", 3), lb_service("web", json!({}))]).unwrap();
    let ip = wait_for(Duration::from_secs(10), "an address in the status", || address(&cp, "web"));
    let address_s = t.elapsed().as_secs_f64();
    assert!(address_s < 2.0, "the address took {address_s:.2} s");
    assert!(ip.starts_with("10.0.0.1"), "{ip} is from the pool");
    let three = wait_for(Duration::from_secs(30), "3 Pods answering through the VIP", || {
        let (seen, _) = backends_seen(&topo, &ip, 60);
        (seen.len() == 3).then_some(seen)
    });
    assert_eq!(three, pods(&cp, "web"), "the answers come from the Deployment's Pods");
    let first_success_s = t.elapsed().as_secs_f64();
    let svc = &topo.get("/v1/services")[0];
    assert_eq!((svc["mode"].as_str(), svc["scheduler"].as_str(), svc["vip"].as_str()), (Some("fnat"), Some("maglev"), Some(ip.as_str())), "{svc}");

    eprintln!(
        "== kubectl apply: Deployment web (3 replicas) + Service type LoadBalancer: address {} after {:.2} s, Pods {:?} answering through it after {:.2} s",
        ip, address_s, three, first_success_s
    );
    // Scaling to 5 and to 1 moves the backends.
    cp.k(&["-n", "default", "scale", "deployment", "web", "--replicas=5"]);
    wait_for(Duration::from_secs(30), "5 Pods answering", || (backends_seen(&topo, &ip, 100).0.len() == 5).then_some(()));
    cp.k(&["-n", "default", "scale", "deployment", "web", "--replicas=1"]);
    let one = wait_for(Duration::from_secs(30), "1 Pod answering", || {
        let (seen, errors) = backends_seen(&topo, &ip, 40);
        (seen.len() == 1 && errors == 0).then_some(seen)
    });
    assert_eq!(one, pods(&cp, "web"));
    cp.k(&["-n", "default", "scale", "deployment", "web", "--replicas=3"]);
    wait_for(Duration::from_secs(30), "3 Pods answering again", || (backends_seen(&topo, &ip, 60).0.len() == 3).then_some(()));

    eprintln!("== scaled to 5 and to 1 and back to 3: the backends followed");
    // A Pod deleted under load: its endpoint drains (terminating) before it stops; no request fails.
    let l = load(&topo, &ip, 8.0);
    std::thread::sleep(Duration::from_secs(1));
    let victim = pods(&cp, "web")[0].clone();
    cp.k(&["-n", "default", "delete", "pod", &victim, "--wait=false"]);
    let r = finish(l);
    println!("{}", json!({"kubernetes": {"event": "pod_deleted_under_load", "requests": r["requests"], "errors": r["errors"], "error_kinds": r["error_kinds"]}}));
    assert_eq!(r["errors"], 0, "requests failed while a Pod was deleted: {r}\nstats: {}\nservices: {}", topo.stats(), topo.get("/v1/services"));
    wait_for(Duration::from_secs(30), "3 ready endpoints after the deletion", || (endpoints(&cp, "default", "web").values().filter(|c| c.0).count() == 3).then_some(()));

    let r = finish(load(&topo, &ip, 3.0));
    println!("{}", json!({"kubernetes": {"event": "baseline", "requests": r["requests"], "errors": r["errors"], "latency_ms": r["latency_ms"]}}));
    eprintln!("== a Pod deleted under load: its endpoint drained, no request failed");
    // The controller killed and restarted under load: no request fails, the address stays.
    let l = load(&topo, &ip, 8.0);
    std::thread::sleep(Duration::from_secs(1));
    ctl.kill();
    std::thread::sleep(Duration::from_secs(2));
    ctl.spawn();
    let r = finish(l);
    println!("{}", json!({"kubernetes": {"event": "controller_restarted_under_load", "requests": r["requests"], "errors": r["errors"]}}));
    assert_eq!(r["errors"], 0, "requests failed while the controller restarted: {r}\nstats: {}\nservices: {}", topo.stats(), topo.get("/v1/services"));
    assert_eq!(address(&cp, "web").as_deref(), Some(ip.as_str()), "the address changed");
    assert!(ctl.alive(), "the controller exited:\n{}", ctl.log());

    eprintln!("== the controller killed and restarted under load: no request failed, {} kept", ip);
    // kube-apiserver restarted: the controller reconnects and converges on what changed meanwhile.
    let mut cp = cp;
    cp.restart("kube-apiserver");
    cp.apply(&[deployment("api", 2), lb_service("api", json!({"vectorlb.io/scheduler": "rr"}))]).unwrap();
    let ip2 = wait_for(Duration::from_secs(20), "an address for a Service made after the restart", || address(&cp, "api"));
    wait_for(Duration::from_secs(30), "2 Pods answering through the second VIP", || (backends_seen(&topo, &ip2, 40).0.len() == 2).then_some(()));
    assert_ne!(ip, ip2);
    let on_daemon = |vip: &str| topo.get("/v1/services").as_array().unwrap().iter().find(|s| s["vip"] == vip).cloned().unwrap_or(Value::Null);
    assert_eq!(on_daemon(&ip2)["scheduler"], "rr");

    eprintln!("== kube-apiserver restarted: Service api (scheduler rr) created after it answers at {}", ip2);
    // Bad input: each gets an Event naming the problem and disturbs nothing else.
    cp.apply(&[lb_service("outside", json!({"vectorlb.io/load-balancer-ips": "192.0.2.7"}))]).unwrap();
    let m = wait_event(&cp, "outside", "AddressNotInPool");
    assert!(m.contains("192.0.2.7"), "{m}");
    let mut empty = lb_service("empty", json!({}));
    empty["spec"]["sessionAffinity"] = json!("ClientIP");
    cp.apply(&[empty]).unwrap();
    let m = wait_event(&cp, "empty", "NoEndpoints");
    assert!(m.contains("80"), "{m}");
    let ip3 = address(&cp, "empty").expect("a Service without endpoints still gets its address");
    let s3 = wait_for(Duration::from_secs(10), "the empty Service on the daemon", || Some(on_daemon(&ip3)).filter(|v| !v.is_null()));
    assert_eq!(
        (s3["scheduler"].as_str(), s3["affinity_timeout_s"].as_u64(), s3["backends"].as_array().map(Vec::len)),
        (Some("maglev"), Some(10_800), Some(0)),
        "sessionAffinity ClientIP is client affinity with Kubernetes' default timeout: {s3}"
    );
    cp.apply(&[json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "clash", "namespace": "default", "annotations": {"vectorlb.io/load-balancer-ips": ip, "vectorlb.io/allow-shared-ip": "k"}},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}})])
    .unwrap();
    let m = wait_event(&cp, "clash", "AddressInUse");
    assert!(m.contains("default/web"), "{m}");
    cp.apply(&[json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "overlap"}, "spec": {"addresses": ["10.0.0.140/30"]}})]).unwrap();
    let cond = wait_for(Duration::from_secs(15), "the overlapping pool's condition", || {
        let v = cp.get(&["addresspool", "overlap"]);
        v["status"]["conditions"][0]["reason"].as_str().map(str::to_string)
    });
    assert_eq!(cond, "Overlap");
    cp.apply(&[json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sctp", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}, {"name": "s", "port": 9, "protocol": "SCTP"}]}})])
        .unwrap();
    wait_event(&cp, "sctp", "UnsupportedProtocol");
    // ... and the first Service still serves, from the same address.
    let (seen, errors) = backends_seen(&topo, &ip, 60);
    assert_eq!((seen.len(), errors), (3, 0));
    assert_eq!(address(&cp, "web").as_deref(), Some(ip.as_str()));

    eprintln!("== bad input (address outside every pool, no endpoints, address in use, overlapping pool, SCTP): each has its Event; web still serves at {}", ip);
    // Health checks by annotation: HTTPS against nginx's plain HTTP fails (every backend down),
    // then HTTP succeeds (every backend up, serving again).
    let states = |want: &str| {
        let s = on_daemon(&ip);
        let b = s["backends"].as_array().cloned().unwrap_or_default();
        (b.len() == 3 && b.iter().all(|x| x["health"]["state"] == want)).then_some(s)
    };
    cp.k(&["-n", "default", "annotate", "--overwrite", "service", "web", "vectorlb.io/health-check=https", "vectorlb.io/health-interval=1"]);
    let t_h = Instant::now();
    let s = loop {
        if let Some(s) = states("down") {
            break s;
        }
        assert!(t_h.elapsed() < Duration::from_secs(15), "every backend down by its HTTPS check: {}\n{}", on_daemon(&ip), tail(&ctl.log(), 20));
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((s["health"]["kind"].as_str(), s["health"]["interval_ms"].as_u64()), (Some("https"), Some(1000)), "{s}");
    cp.k(&["-n", "default", "annotate", "--overwrite", "service", "web", "vectorlb.io/health-check=http:/"]);
    wait_for(Duration::from_secs(15), "every backend up by its HTTP check", || states("up"));
    let t_up = Instant::now();
    loop {
        let (seen, errors) = backends_seen(&topo, &ip, 60);
        if (seen.len(), errors) == (3, 0) {
            break;
        }
        assert!(t_up.elapsed() < Duration::from_secs(15), "serving again after the check passes: {seen:?} {errors} errors\n{}", on_daemon(&ip));
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("== serving again {:.2} s after every backend was up", t_up.elapsed().as_secs_f64());
    eprintln!("== health checks by annotation: https (fails on plain HTTP) took the 3 Pods down, http:/ brought them back");
    // Deleting a Service removes it from the daemon.
    cp.k(&["-n", "default", "delete", "service", "api"]);
    wait_for(Duration::from_secs(15), "the deleted Service gone from the daemon", || {
        (!topo.get("/v1/services").as_array().unwrap().iter().any(|s| s["vip"] == ip2.as_str())).then_some(())
    });
    println!("{}", json!({"kubernetes": {"control_plane_start_s": control_plane_s, "address_after_apply_s": address_s, "first_success_after_apply_s": first_success_s}}));
    assert!(ctl.alive(), "the controller exited:\n{}", ctl.log());
}

/// The controller's metrics, or None when it does not answer.
/// Seconds within which every change is programmed once kube-apiserver answers again.
const CONVERGE_BOUND: Duration = Duration::from_secs(15);

/// `kubectl apply` (or `delete`) until kube-apiserver takes it: what an operator's pipeline does
/// while a control-plane upgrade restarts it.
fn kubectl_until(kubectl: &Kubectl, args: &[&str], input: Option<&Value>) {
    let t = Instant::now();
    loop {
        let o = kubectl.run_with(args, input.map(|v| v.to_string()).unwrap_or_default().as_bytes());
        if o.status.success() {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(90), "kubectl {args:?} never went through: {}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The test's own random numbers (xorshift; the seed is printed).
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Whether the cluster's Services and the daemon agree with `want` (name → scheduler): every
/// Service has an address, the daemon has exactly those addresses (and `keep`'s), each with
/// its scheduler. What is still missing, or None.
fn disagreement(cp: &ControlPlane, topo: &Topo, want: &std::collections::BTreeMap<String, &'static str>, keep: &str) -> Option<String> {
    let o = cp.kubectl(&["-n", "default", "get", "services", "-o", "json"]);
    if !o.status.success() {
        return Some("kube-apiserver does not answer".into());
    }
    let list: Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut ips = std::collections::BTreeMap::new();
    for s in list["items"].as_array().unwrap() {
        let name = s["metadata"]["name"].as_str().unwrap().to_string();
        if s["spec"]["type"] != "LoadBalancer" || name == keep {
            continue;
        }
        ips.insert(name, s["status"]["loadBalancer"]["ingress"][0]["ip"].as_str().map(str::to_string));
    }
    let names: Vec<&String> = ips.keys().collect();
    if names != want.keys().collect::<Vec<_>>() {
        return Some(format!("the cluster has {names:?}, the test made {:?}", want.keys().collect::<Vec<_>>()));
    }
    let daemon = topo.get("/v1/services");
    let on_daemon: std::collections::BTreeMap<String, String> =
        daemon.as_array().unwrap().iter().map(|s| (s["vip"].as_str().unwrap_or("").to_string(), s["scheduler"].as_str().unwrap_or("").to_string())).collect();
    let mut vips = Vec::new();
    for (name, sched) in want {
        let Some(ip) = &ips[name] else { return Some(format!("{name} has no address")) };
        match on_daemon.get(ip) {
            Some(s) if s == sched => vips.push(ip.clone()),
            Some(s) => return Some(format!("{name} ({ip}) has scheduler {s} on the daemon, not {sched}")),
            None => return Some(format!("{name} ({ip}) is not on the daemon")),
        }
    }
    let extra: Vec<&String> = on_daemon.keys().filter(|v| !vips.contains(v) && address(cp, keep).as_deref() != Some(v.as_str())).collect();
    if !extra.is_empty() {
        return Some(format!("the daemon still has {extra:?}"));
    }
    None
}

#[test]
fn the_controller_converges_after_kube_apiserver_restarts() {
    // 20 restarts at random moments (VECTORLB_APISERVER_RESTARTS), the whole run repeated
    // VECTORLB_APISERVER_RUNS times in a row (1 in `make test`; `make kube-restarts`: 10).
    let restarts: usize = std::env::var("VECTORLB_APISERVER_RESTARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let runs: usize = std::env::var("VECTORLB_APISERVER_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let mut topo = Topo::new("kr", Shape::TwoArm, 1500);
    let (mut cp, _) = cluster(&mut topo);
    let _kubelet = FakeKubelet::start(&cp, &topo.p, "10.1.0.100".parse().unwrap()..="10.1.0.199".parse().unwrap(), "10.1.0.1");
    cp.apply(&[json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "default"}, "spec": {"addresses": [POOL]}})]).unwrap();
    let metrics_port = vectorlb_testkit::k8s::free_port();
    let cfg = controller_config(&topo, &cp.dir, metrics_port);
    let mut ctl = Controller::start(&cp, &cfg, "a");
    // A server: kube-apiserver closing a connection while the controller writes is an error on
    // that connection. (It was SIGPIPE's default: the controller died, silently, in some of the
    // restarts, and in CI after the one restart of the Services test.)
    std::thread::sleep(Duration::from_millis(300));
    assert!(ctl.ignores_sigpipe(), "vectorlb kube run does not ignore SIGPIPE");
    // The load: a Service with two Pods, served throughout.
    cp.apply(&[deployment("web", 2), lb_service("web", json!({}))]).unwrap();
    let ip = wait_for(Duration::from_secs(10), "an address for web", || address(&cp, "web"));
    wait_for(Duration::from_secs(30), "2 Pods answering through the VIP", || (backends_seen(&topo, &ip, 40).0.len() == 2).then_some(()));
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("== {runs} run(s) of {restarts} kube-apiserver restarts; seed {seed}");
    let mut dice = Dice(seed);
    let kubectl = cp.kubectl_for("admin");
    let mut want: std::collections::BTreeMap<String, &'static str> = Default::default();
    let mut next = 0usize;
    for run in 0..runs {
        let (mut worst, mut times, mut requests, mut errors) = (Duration::ZERO, Vec::new(), 0u64, 0u64);
        let started = Instant::now();
        for k in 0..restarts {
            // Requests through the VIP while kube-apiserver goes away and comes back.
            let load = topo
                .cmd(
                    "cl",
                    &[tools(), "probe", "http", "--url", &format!("http://{ip}/"), "--duration-s", "6", "--concurrency", "4", "--rate", "100", "--timeout-ms", "3000", "--json"],
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // The changes of this step: a Service made, one changed (its scheduler), one
            // deleted (past four), each at a random moment around the restart.
            let mut ops: Vec<(Vec<String>, Option<Value>)> = Vec::new();
            let name = format!("s{next:03}");
            next += 1;
            ops.push((vec!["apply".into(), "-f".into(), "-".into()], Some(lb_service(&name, json!({"vectorlb.io/scheduler": "maglev"})))));
            want.insert(name, "maglev");
            let names: Vec<String> = want.keys().cloned().collect();
            let changed = names[dice.below(names.len() as u64) as usize].clone();
            let sched = if want[&changed] == "maglev" { "rr" } else { "maglev" };
            ops.push((vec!["apply".into(), "-f".into(), "-".into()], Some(lb_service(&changed, json!({"vectorlb.io/scheduler": sched})))));
            want.insert(changed, sched);
            if want.len() > 4 {
                let gone = want.keys().next().unwrap().clone();
                want.remove(&gone);
                // (A delete whose answer was lost to the restart is done: --ignore-not-found.)
                ops.push((vec!["-n".into(), "default".into(), "delete".into(), "--ignore-not-found".into(), "service".into(), gone], None));
            }
            let delays: Vec<u64> = ops.iter().map(|_| dice.below(3000)).collect();
            let kc = kubectl.clone();
            let changes = std::thread::spawn(move || {
                let t = Instant::now();
                for ((args, input), d) in ops.into_iter().zip(delays) {
                    let at = Duration::from_millis(d);
                    if let Some(w) = at.checked_sub(t.elapsed()) {
                        std::thread::sleep(w);
                    }
                    let a: Vec<&str> = args.iter().map(String::as_str).collect();
                    kubectl_until(&kc, &a, input.as_ref());
                }
            });
            std::thread::sleep(Duration::from_millis(dice.below(2000)));
            cp.restart("kube-apiserver");
            let back = Instant::now();
            changes.join().unwrap();
            // Every change programmed within the bound of kube-apiserver answering again.
            loop {
                match disagreement(&cp, &topo, &want, "web") {
                    None => break,
                    Some(why) => {
                        assert!(
                            back.elapsed() < std::env::var("VECTORLB_CONVERGE_BOUND_S").ok().and_then(|v| v.parse().ok()).map_or(CONVERGE_BOUND, Duration::from_secs),
                            "run {run}, restart {k}: not converged {:?} after kube-apiserver answered again: {why}\ncontroller alive: {}, threads: {}\n{}",
                            back.elapsed(),
                            ctl.alive(),
                            ctl.threads(),
                            tail(&ctl.log(), 40)
                        );
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
            let took = back.elapsed();
            worst = worst.max(took);
            times.push(took.as_secs_f64());
            assert!(ctl.alive(), "the controller exited:\n{}", tail(&ctl.log(), 40));
            // Its liveness: the loop goes round.
            let o = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", &format!("http://127.0.0.1:{metrics_port}/healthz")])
                .output()
                .unwrap();
            assert_eq!(stdout(&o).trim(), "200", "the controller's /healthz after restart {k}");
            let r = finish(load);
            assert_eq!(r["errors"], 0, "run {run}, restart {k}: requests through the VIP failed while kube-apiserver restarted: {r}");
            requests += r["requests"].as_u64().unwrap_or(0);
            errors += r["errors"].as_u64().unwrap_or(0);
        }
        times.sort_by(f64::total_cmp);
        let restarts_seen = metrics(metrics_port).and_then(|m| m.lines().find_map(|l| l.strip_prefix("vectorlb_kube_watch_restarts_total ").map(str::to_string)));
        println!(
            "{}",
            json!({"kubernetes": {"event": "apiserver_restarts", "run": run, "restarts": restarts, "seconds": started.elapsed().as_secs_f64().round(),
                "converged_after_s_p50": times[times.len() / 2], "converged_after_s_max": worst.as_secs_f64(), "bound_s": CONVERGE_BOUND.as_secs(),
                "services_made": next, "watch_restarts": restarts_seen, "requests": requests, "errors": errors}})
        );
    }
    ctl.kill();
}

fn metrics(port: u16) -> Option<String> {
    let o = Command::new("curl").args(["-sf", "--max-time", "2", &format!("http://127.0.0.1:{port}/metrics")]).output().ok()?;
    o.status.success().then(|| stdout(&o))
}

fn leads(port: u16) -> bool {
    metrics(port).is_some_and(|m| m.lines().any(|l| l == "vectorlb_kube_leader 1"))
}

#[test]
fn two_replicas_never_both_lead_and_a_restarted_daemon_is_programmed_again() {
    let mut topo = Topo::new("k9", Shape::TwoArm, 1500);
    let (cp, _) = cluster(&mut topo);
    let _kubelet = FakeKubelet::start(&cp, &topo.p, "10.1.0.100".parse().unwrap()..="10.1.0.199".parse().unwrap(), "10.1.0.1");
    cp.apply(&[json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "default"}, "spec": {"addresses": [POOL]}})]).unwrap();
    let (pa, pb) = (vectorlb_testkit::k8s::free_port(), vectorlb_testkit::k8s::free_port());
    let mut a = Controller::start(&cp, &controller_config(&topo, &cp.dir, pa), "a");
    wait_for(Duration::from_secs(10), "replica a leading", || leads(pa).then_some(()));
    let mut b = Controller::start(&cp, &controller_config(&topo, &cp.dir, pb), "b");
    wait_for(Duration::from_secs(10), "replica b's metrics", || metrics(pb));
    cp.apply(&[deployment("web", 2), lb_service("web", json!({}))]).unwrap();
    let ip = wait_for(Duration::from_secs(10), "an address", || address(&cp, "web"));
    wait_for(Duration::from_secs(30), "2 Pods answering", || (backends_seen(&topo, &ip, 40).0.len() == 2).then_some(()));
    for _ in 0..10 {
        assert!(!(leads(pa) && leads(pb)), "both replicas lead");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(leads(pa) && !leads(pb));
    let m = metrics(pa).unwrap();
    for series in ["vectorlb_kube_rounds_total", "vectorlb_kube_services 1", "vectorlb_kube_daemon_rounds_total{daemon=\"lb\"}"] {
        assert!(m.contains(series), "{series} missing from:\n{m}");
    }

    // The leader killed (no chance to give the Lease up): the other takes over once the Lease
    // expires (6 s here) and programs what changed meanwhile.
    let t = Instant::now();
    a.kill();
    cp.apply(&[deployment("api", 1), lb_service("api", json!({}))]).unwrap();
    wait_for(Duration::from_secs(20), "replica b leading", || leads(pb).then_some(()));
    let takeover_s = t.elapsed().as_secs_f64();
    let ip2 = wait_for(Duration::from_secs(10), "an address from the new leader", || address(&cp, "api"));
    wait_for(Duration::from_secs(30), "the new Service answering", || (backends_seen(&topo, &ip2, 10).0.len() == 1).then_some(()));
    assert_eq!(address(&cp, "web").as_deref(), Some(ip.as_str()), "the new leader kept the address");

    // The old leader comes back: it waits. The leader stopped cleanly gives the Lease up at once.
    a.spawn();
    std::thread::sleep(Duration::from_secs(3));
    assert!(!leads(pa) && leads(pb), "a returning replica must not take a held Lease");
    let t = Instant::now();
    sh_kill("TERM", b.child.as_ref().unwrap().id());
    wait_for(Duration::from_secs(20), "replica a leading after b's clean stop", || leads(pa).then_some(()));
    let handover_s = t.elapsed().as_secs_f64();
    assert!(b.child.as_mut().unwrap().wait().unwrap().success(), "SIGTERM is a clean stop");
    b.child = None;

    // The daemon restarted: it comes back with its file's (empty) configuration and the
    // controller programs it again.
    topo.stop_lb();
    let t = Instant::now();
    topo.start_lb(&topo.base_config(None));
    wait_for(Duration::from_secs(30), "the Service programmed on the restarted daemon", || {
        topo.get("/v1/services").as_array().unwrap().iter().any(|s| s["vip"] == ip.as_str() && s["backends"].as_array().unwrap().len() == 2).then_some(())
    });
    let reprogrammed_s = t.elapsed().as_secs_f64();
    let (seen, errors) = backends_seen(&topo, &ip, 40);
    assert_eq!((seen.len(), errors), (2, 0));
    assert!(handover_s < 4.0, "a released Lease is taken at the follower's next try, not after it expires: {handover_s:.1} s");
    println!(
        "{}",
        json!({"kubernetes": {"event": "replicas", "takeover_after_kill_s": takeover_s, "handover_after_sigterm_s": handover_s, "daemon_reprogrammed_after_restart_s": reprogrammed_s}})
    );
    assert!(a.alive(), "{}", a.log());
}

fn sh_kill(sig: &str, pid: u32) {
    let _ = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status();
}

/// A thread in namespace `ns` (`ip netns` name) runs `f`: the test's own client, without a
/// process per request.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: setns(2) on a valid namespace descriptor changes only this thread's network
        // namespace; no memory is shared with the call.
        let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
}

/// One HTTP GET over a new connection; true on a 200.
fn http_ok(addr: std::net::SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(n) if n >= 12 && &buf[..12] == b"HTTP/1.1 200")
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p / 100.0).round() as usize]
}

fn rss_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// `make bench-kubernetes`: time from `kubectl apply` to the first successful request over 100
/// Services (each with a one-Pod Deployment, applied at once), and the programming rate and the
/// controller's memory with 1,000 Services and 20,000 endpoints created at once (EndpointSlices
/// written by the test, as an external endpoint manager would). JSON lines.
#[test]
#[ignore = "a benchmark: make bench-kubernetes"]
fn bench_apply_to_first_request_and_programming_rate() {
    let mut topo = Topo::new("kb", Shape::TwoArm, 1500);
    let (cp, _) = cluster(&mut topo);
    let _kubelet = FakeKubelet::start(&cp, &topo.p, "10.1.0.20".parse().unwrap()..="10.1.0.199".parse().unwrap(), "10.1.0.1");
    cp.apply(&[
        json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "near"}, "spec": {"addresses": ["10.0.0.100-10.0.0.249"]}}),
        json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "far"}, "spec": {"addresses": ["10.200.0.0/20"], "autoAssign": false}}),
    ])
    .unwrap();
    let cfg = controller_config(&topo, &cp.dir, vectorlb_testkit::k8s::free_port());
    let ctl = Controller::start(&cp, &cfg, "bench");
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        .unwrap_or_default();

    // 100 Services at once, each with its own one-Pod Deployment.
    let n = 100;
    let mut objs = Vec::new();
    for i in 0..n {
        objs.push(deployment(&format!("s{i}"), 1));
        objs.push(lb_service(&format!("s{i}"), json!({})));
    }
    let t0 = Instant::now();
    cp.apply(&objs).unwrap();
    let applied_s = t0.elapsed().as_secs_f64();
    let mut ips: Vec<Option<std::net::SocketAddr>> = vec![None; n];
    let mut first_ok: Vec<Option<f64>> = vec![None; n];
    let mut ready: Vec<Option<f64>> = vec![None; n];
    let client = format!("{}-cl", topo.p);
    while first_ok.iter().any(Option::is_none) {
        // When each Service's endpoint became ready (the fake kubelet's part is before that).
        let slices = cp.get(&["-n", "default", "endpointslices"]);
        for sl in slices["items"].as_array().unwrap() {
            let svc = sl["metadata"]["labels"]["kubernetes.io/service-name"].as_str().unwrap_or("");
            let any_ready = sl["endpoints"].as_array().is_some_and(|e| e.iter().any(|e| e["conditions"]["ready"] == true));
            if let Some(i) = svc.strip_prefix('s').and_then(|x| x.parse::<usize>().ok()).filter(|i| *i < n) {
                if any_ready && ready[i].is_none() {
                    ready[i] = Some(t0.elapsed().as_secs_f64());
                }
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "not every Service answered in 300 s: {first_ok:?}");
        let list = cp.get(&["-n", "default", "services"]);
        for s in list["items"].as_array().unwrap() {
            let name = s["metadata"]["name"].as_str().unwrap_or("");
            if let (Some(i), Some(ip)) = (name.strip_prefix('s').and_then(|x| x.parse::<usize>().ok()), s["status"]["loadBalancer"]["ingress"][0]["ip"].as_str()) {
                if i < n {
                    ips[i] = Some(format!("{ip}:80").parse().unwrap());
                }
            }
        }
        let pending: Vec<(usize, std::net::SocketAddr)> = (0..n).filter(|i| first_ok[*i].is_none()).filter_map(|i| ips[i].map(|a| (i, a))).collect();
        // One client thread per pending Service, so that a slow one does not delay the others.
        let tries: Vec<_> = pending.into_iter().map(|(i, a)| (i, in_netns(&client, move || http_ok(a)))).collect();
        let ok: Vec<usize> = tries.into_iter().filter_map(|(i, t)| t.join().unwrap().then_some(i)).collect();
        let now = t0.elapsed().as_secs_f64();
        for i in ok {
            first_ok[i] = Some(now);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let t: Vec<f64> = first_ok.iter().map(|x| x.unwrap()).collect();
    // From the endpoint's readiness (as the test saw it, polling) to the first success.
    let after_ready: Vec<f64> = (0..n).map(|i| (t[i] - ready[i].unwrap_or(t[i])).max(0.0)).collect();
    println!(
        "{}",
        json!({"bench": "kubernetes_apply_to_first_request", "services": n, "apply_s": applied_s, "p50_s": pct(&t, 50.0), "p99_s": pct(&t, 99.0), "max_s": pct(&t, 100.0),
            "after_endpoint_ready_p50_s": pct(&after_ready, 50.0), "after_endpoint_ready_p99_s": pct(&after_ready, 99.0), "cpu": cpu})
    );

    // 1,000 Services and 20,000 endpoints at once: Services without selectors and their
    // EndpointSlices, as an endpoint manager other than the cluster's would write them.
    let (ns_count, per) = (1000usize, 20usize);
    let mut objs = Vec::new();
    for i in 0..ns_count {
        let name = format!("b{i}");
        objs.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default", "annotations": {"vectorlb.io/address-pool": "far"}},
            "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80}]}}));
        let eps: Vec<Value> = (0..per).map(|j| json!({"addresses": [format!("10.{}.{}.{}", 16 + i / 250, i % 250, j + 1)], "conditions": {"ready": true}})).collect();
        objs.push(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": format!("{name}-1"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": "bench.vectorlb.io"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps}));
    }
    let file = cp.dir.join("bench-1000.json");
    std::fs::write(&file, serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": objs})).unwrap()).unwrap();
    let pid = ctl.child.as_ref().unwrap().id();
    let rss_before = rss_kb(pid, "VmRSS:");
    let t0 = Instant::now();
    cp.k(&["create", "-f", file.to_str().unwrap()]);
    let created_s = t0.elapsed().as_secs_f64();
    let mut peak = 0;
    let programmed_s = loop {
        peak = peak.max(rss_kb(pid, "VmRSS:"));
        let v = topo.get("/v1/services");
        let far: Vec<&Value> = v.as_array().unwrap().iter().filter(|s| s["vip"].as_str().is_some_and(|a| a.starts_with("10.200."))).collect();
        let backends: usize = far.iter().map(|s| s["backends"].as_array().map_or(0, Vec::len)).sum();
        if far.len() == ns_count && backends == ns_count * per {
            break t0.elapsed().as_secs_f64();
        }
        assert!(t0.elapsed() < Duration::from_secs(600), "{} services and {backends} backends after 600 s", far.len());
        std::thread::sleep(Duration::from_millis(200));
    };
    let statuses_s = wait_for(Duration::from_secs(300), "every status written", || {
        let list = cp.get(&["-n", "default", "services"]);
        let done = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["metadata"]["name"].as_str().is_some_and(|n| n.starts_with('b')))
            .filter(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"].is_string())
            .count();
        (done == ns_count).then(|| t0.elapsed().as_secs_f64())
    });
    println!(
        "{}",
        json!({"bench": "kubernetes_programming", "services": ns_count, "endpoints": ns_count * per, "created_s": created_s, "programmed_s": programmed_s,
            "statuses_written_s": statuses_s, "services_per_second": ns_count as f64 / programmed_s, "endpoints_per_second": (ns_count * per) as f64 / programmed_s,
            "controller_rss_mb_before": rss_before as f64 / 1024.0, "controller_rss_mb_peak": peak as f64 / 1024.0, "controller_hwm_mb": rss_kb(pid, "VmHWM:") as f64 / 1024.0,
            "daemon_rss_mb": rss_kb(topo.lb_pid(), "VmRSS:") as f64 / 1024.0, "cpu": cpu})
    );
}

/// A `vectorlb proxy` for Gateways in the first backend's namespace (10.1.0.11), started with
/// only its `[admin]` section (a unix socket) and waiting for its configuration.
struct GatewayProxy {
    dir: PathBuf,
    sock: PathBuf,
    base: PathBuf,
    cfg: PathBuf,
}

/// A child process killed when dropped.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl GatewayProxy {
    fn new(dir: &Path) -> GatewayProxy {
        let (sock, base) = (dir.join("gw-proxy.sock"), dir.join("gw-base.toml"));
        std::fs::write(&base, format!("workers = 1\n[admin]\naddress = \"unix:{}\"\n", sock.display())).unwrap();
        GatewayProxy { dir: dir.to_path_buf(), sock, base, cfg: dir.join("gw-proxy.toml") }
    }

    /// Starts a fresh proxy (its configuration file back to the base: nothing programmed) and
    /// waits for its admin socket.
    fn start(&self, topo: &Topo) -> Kill {
        std::fs::copy(&self.base, &self.cfg).unwrap();
        let _ = std::fs::remove_file(&self.sock);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("gw-proxy.log")).unwrap();
        let child = topo.cmd("be1", &[bin(), "proxy", "--config", self.cfg.to_str().unwrap()]).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
        let proxy = Kill(child);
        wait_for(Duration::from_secs(10), "the proxy's admin socket", || self.sock.exists().then_some(()));
        proxy
    }

    /// The controller's configuration with a `[gateway]` section for this proxy.
    fn controller_config(&self, topo: &Topo, ports: &str) -> PathBuf {
        let cfg = controller_config(topo, &self.dir, vectorlb_testkit::k8s::free_port());
        let mut text = std::fs::read_to_string(&cfg).unwrap();
        text += &format!(
            "\n[gateway]\nbase_file = \"{}\"\nports = \"{ports}\"\n[[gateway.proxies]]\nname = \"p1\"\nadmin = \"unix:{}\"\naddress = \"10.1.0.11\"\n",
            self.base.display(),
            self.sock.display()
        );
        std::fs::write(&cfg, text).unwrap();
        cfg
    }
}

/// The Gateway API's standard resource definitions, from its Go module (scripts/gateway-crds.sh).
fn gateway_crds(cp: &ControlPlane) {
    let o = vectorlb_testkit::sh(&["bash", repo().join("scripts/gateway-crds.sh").to_str().unwrap()]);
    let dir = stdout(&o).trim().to_string();
    assert!(o.status.success() && !dir.is_empty(), "gateway-crds.sh: {}", String::from_utf8_lossy(&o.stderr));
    for kind in ["gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants"] {
        // `create`: the HTTPRoute definition is larger than apply's annotation allows.
        let f = format!("{dir}/gateway.networking.k8s.io_{kind}.yaml");
        let o = cp.kubectl(&["create", "-f", &f]);
        assert!(o.status.success(), "{f}: {}", String::from_utf8_lossy(&o.stderr));
    }
    wait_for(Duration::from_secs(15), "the Gateway API's resources", || cp.kubectl(&["get", "gateways,httproutes,gatewayclasses", "-A"]).status.success().then_some(()));
    // The controller's rights over them (and the Secrets they name): a role of their own.
    cp.apply_text(&std::fs::read_to_string(repo().join("deploy/kubernetes/rbac-gateway.yaml")).unwrap()).unwrap();
}

fn cluster_ip_service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
}

/// A condition of a status object: (status, reason).
fn condition(conds: &Value, t: &str) -> Option<(String, String)> {
    conds.as_array()?.iter().find(|c| c["type"] == t).map(|c| (c["status"].as_str().unwrap_or("").to_string(), c["reason"].as_str().unwrap_or("").to_string()))
}

fn curl_from(topo: &Topo, args: &[&str]) -> (u16, String) {
    let mut a = vec!["curl", "-sS", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code} %header{x-route}"];
    a.extend_from_slice(args);
    let o = topo.run("cl", &a);
    let out = stdout(&o);
    let (code, rest) = out.split_once(' ').unwrap_or((out.as_str(), ""));
    (code.trim().parse().unwrap_or(0), rest.trim().to_string())
}

#[test]
fn gateway_api_routes_are_served_by_the_proxy_behind_the_daemon() {
    let mut topo = Topo::new("kg", Shape::TwoArm, 1500);
    let (cp, _) = cluster(&mut topo);
    gateway_crds(&cp);
    let _kubelet = FakeKubelet::start(&cp, &topo.p, "10.1.0.100".parse().unwrap()..="10.1.0.199".parse().unwrap(), "10.1.0.1");
    cp.apply(&[json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "default"}, "spec": {"addresses": [POOL]}})]).unwrap();

    // One proxy, in the first backend's namespace (10.1.0.11), waiting for its configuration.
    let dir = cp.dir.clone();
    let gwp = GatewayProxy::new(&dir);
    let mut proxy = gwp.start(&topo);
    let _ctl = Controller::start(&cp, &gwp.controller_config(&topo, "30000-30099"), "g");

    // Backends: v1 (2 Pods) and v2 (1), as ClusterIP Services; a certificate in a Secret, and
    // a Secret that holds no certificate.
    cp.apply(&[deployment("v1", 2), deployment("v2", 1), cluster_ip_service("v1"), cluster_ip_service("v2")]).unwrap();
    let (crt, key) = (dir.join("shop.crt"), dir.join("shop.key"));
    self_signed(&crt, &key, "shop.example", &["DNS:shop.example"]);
    cp.k(&["-n", "default", "create", "secret", "tls", "shop-tls", "--cert", crt.to_str().unwrap(), "--key", key.to_str().unwrap()]);
    cp.k(&["-n", "default", "create", "secret", "generic", "broken-tls", "--type=kubernetes.io/tls", "--from-literal=tls.crt=not a certificate", "--from-literal=tls.key=no key"]);

    let t = Instant::now();
    let gw = "gateway.networking.k8s.io/v1";
    cp.apply(&[
        json!({"apiVersion": gw, "kind": "GatewayClass", "metadata": {"name": "vectorlb"}, "spec": {"controllerName": "vectorlb.io/gateway"}}),
        json!({"apiVersion": gw, "kind": "Gateway", "metadata": {"name": "web", "namespace": "default"}, "spec": {"gatewayClassName": "vectorlb", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "shop.example", "tls": {"certificateRefs": [{"name": "shop-tls"}]}},
            {"name": "bad", "port": 8443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "broken-tls"}]}}]}}),
        json!({"apiVersion": gw, "kind": "HTTPRoute", "metadata": {"name": "shop", "namespace": "default"}, "spec": {"parentRefs": [{"name": "web"}], "rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/app"}}],
             "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "x-route", "value": "shop"}]}}],
             "backendRefs": [{"name": "v1", "port": 80, "weight": 3}, {"name": "v2", "port": 80, "weight": 1}]}]}}),
        json!({"apiVersion": gw, "kind": "HTTPRoute", "metadata": {"name": "dangling", "namespace": "default"}, "spec": {"parentRefs": [{"name": "web"}],
            "hostnames": ["dangling.example"], "rules": [{"backendRefs": [{"name": "nope", "port": 80}]}]}}),
    ])
    .unwrap();

    // The address, and the conditions the specification asks for.
    let ip = wait_for(Duration::from_secs(20), "the Gateway's address and Programmed", || {
        let g = cp.get(&["-n", "default", "gateway", "web"]);
        let prog = condition(&g["status"]["conditions"], "Programmed");
        (prog == Some(("True".into(), "Programmed".into()))).then(|| g["status"]["addresses"][0]["value"].as_str().unwrap_or_default().to_string())
    });
    let address_s = t.elapsed().as_secs_f64();
    assert!(ip.starts_with("10.0.0.1"), "{ip} is from the pool");
    eprintln!("== kubectl apply: GatewayClass, Gateway web (HTTP, HTTPS, a broken Secret), 2 HTTPRoutes: Gateway Programmed at {ip} after {address_s:.2} s");
    let g = cp.get(&["-n", "default", "gateway", "web"]);
    assert_eq!(condition(&g["status"]["conditions"], "Accepted"), Some(("True".into(), "Accepted".into())), "{g}");
    let listener = |n: &str| g["status"]["listeners"].as_array().unwrap().iter().find(|l| l["name"] == n).unwrap().clone();
    assert_eq!(listener("http")["attachedRoutes"], 2, "{g}");
    assert_eq!(listener("https")["attachedRoutes"], 1, "dangling.example is not shop.example: {g}");
    assert_eq!(condition(&listener("bad")["conditions"], "ResolvedRefs"), Some(("False".into(), "InvalidCertificateRef".into())), "{g}");
    assert_eq!(condition(&listener("bad")["conditions"], "Programmed"), Some(("False".into(), "Invalid".into())), "{g}");
    let class = cp.get(&["gatewayclass", "vectorlb"]);
    assert_eq!(condition(&class["status"]["conditions"], "Accepted"), Some(("True".into(), "Accepted".into())), "{class}");
    let route = |n: &str, t: &str| {
        let r = cp.get(&["-n", "default", "httproute", n]);
        condition(&r["status"]["parents"][0]["conditions"], t)
    };
    wait_for(Duration::from_secs(10), "the routes' status", || route("shop", "Accepted").filter(|c| c.0 == "True"));
    assert_eq!(route("shop", "ResolvedRefs"), Some(("True".into(), "ResolvedRefs".into())));
    wait_for(Duration::from_secs(10), "BackendNotFound on the dangling route", || route("dangling", "ResolvedRefs").filter(|c| c.1 == "BackendNotFound"));

    // Served: the client through the daemon's VIP to the proxy, split 3:1 over the Pods.
    let split = wait_for(Duration::from_secs(30), "all three Pods through the Gateway", || {
        let r = topo.http(&format!("http://{ip}/app"), 400, 4);
        let b = r["backends"].as_object().cloned().unwrap_or_default();
        (b.len() == 3 && r["errors"] == 0).then_some(b)
    });
    let count = |app: &str| split.iter().filter(|(k, _)| k.trim().starts_with(app)).map(|(_, v)| v.as_u64().unwrap()).sum::<u64>();
    let (v1, v2) = (count("v1-"), count("v2-"));
    assert_eq!(v1 + v2, 400, "{split:?}");
    assert!((250..=350).contains(&v1), "3:1 over 400 requests: v1 {v1}, v2 {v2}");
    let served_s = t.elapsed().as_secs_f64();
    eprintln!("== through the daemon to vectorlb proxy: /app split v1 {v1} : v2 {v2} (weights 3:1), served {served_s:.2} s after the apply");
    assert_eq!(curl_from(&topo, &[&format!("http://{ip}/app")]), (200, "shop".into()), "the response header modifier");
    assert_eq!(curl_from(&topo, &[&format!("http://{ip}/other")]).0, 404);
    assert_eq!(curl_from(&topo, &["-H", "Host: dangling.example", &format!("http://{ip}/")]).0, 500, "a missing backend answers 500");
    let https = curl_from(&topo, &["--cacert", crt.to_str().unwrap(), "--resolve", &format!("shop.example:443:{ip}"), "https://shop.example/app"]);
    assert_eq!(https, (200, "shop".into()), "HTTPS with the Secret's certificate");

    // gRPC: a GRPCRoute on the HTTPS listener to a Service whose endpoints are two gRPC servers
    // (grpcio, in the other backends' namespaces; a Service without selector and its own
    // EndpointSlice), called by grpcio's client through the Gateway.
    let peer = repo().join("crates/proxy/tests/grpc_peer.py");
    let mut servers = Vec::new();
    for (i, ns) in [(2, "be2"), (3, "be3")] {
        let c = topo
            .cmd(ns, &["env", "PYTHONPATH=/opt/vectorlb/pylib", "python3", peer.to_str().unwrap(), "server", &format!("echo{i}"), "50051", &format!("10.1.0.1{i}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        servers.push(Kill(c));
    }
    for s in &mut servers {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(s.0.stdout.as_mut().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the gRPC server did not start");
    }
    cp.apply(&[
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": "default"}, "spec": {"ports": [{"name": "grpc", "port": 50051, "targetPort": 50051}]}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "echo-1", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "echo", "endpointslice.kubernetes.io/managed-by": "vectorlb-test"}},
            "addressType": "IPv4", "ports": [{"name": "grpc", "port": 50051, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.1.0.12"], "conditions": {"ready": true}}, {"addresses": ["10.1.0.13"], "conditions": {"ready": true}}]}),
        json!({"apiVersion": gw, "kind": "GRPCRoute", "metadata": {"name": "echo", "namespace": "default"}, "spec": {"parentRefs": [{"name": "web", "sectionName": "https"}],
            "rules": [{"matches": [{"method": {"service": "test.Echo"}}], "backendRefs": [{"name": "echo", "port": 50051}]}]}}),
    ])
    .unwrap();
    let grpc_route = |t: &str| {
        let r = cp.get(&["-n", "default", "grpcroute", "echo"]);
        condition(&r["status"]["parents"][0]["conditions"], t)
    };
    wait_for(Duration::from_secs(10), "the GRPCRoute accepted", || grpc_route("Accepted").filter(|c| c.0 == "True"));
    assert_eq!(grpc_route("ResolvedRefs"), Some(("True".into(), "ResolvedRefs".into())));
    let o = topo.run("cl", &["env", "PYTHONPATH=/opt/vectorlb/pylib", "python3", peer.to_str().unwrap(), "client", &format!("{ip}:443"), crt.to_str().unwrap(), "shop.example"]);
    let out = stdout(&o);
    let g: Value = serde_json::from_str(out.lines().last().unwrap_or("{}")).unwrap_or_else(|_| panic!("grpc client: {out} {}", String::from_utf8_lossy(&o.stderr)));
    let backends = g["unary_backends"].as_object().unwrap_or_else(|| panic!("{g}"));
    assert_eq!(backends.len(), 2, "unary calls over both servers: {g}");
    assert_eq!(backends.values().map(|v| v.as_u64().unwrap()).sum::<u64>(), 300, "{g}");
    assert_eq!(g["server_stream"].as_array().map(|a| a.len()), Some(5), "{g}");
    assert_eq!(g["bidi"].as_array().map(|a| a.len()), Some(4), "{g}");
    assert_eq!(g["deadline"], "DEADLINE_EXCEEDED", "{g}");
    assert_eq!((g["fail"].as_str(), g["fail_trailers"]["x-why"].as_str()), (Some("NOT_FOUND"), Some("because")), "{g}");
    assert_eq!(g["unimplemented"], "UNIMPLEMENTED", "a service no route takes: {g}");
    eprintln!("== GRPCRoute over HTTPS: 300 unary calls by server {backends:?}, streams, deadline, error trailers");

    // A change of weights under load: reloaded without failing a request, then all to v2.
    let l = load(&topo, &format!("{ip}/app"), 6.0);
    std::thread::sleep(Duration::from_secs(2));
    cp.k(&["-n", "default", "patch", "httproute", "shop", "--type=json", "-p", r#"[{"op": "replace", "path": "/spec/rules/0/backendRefs/0/weight", "value": 0}]"#]);
    let r = finish(l);
    assert_eq!(r["errors"], 0, "reload under load: {r}");
    wait_for(Duration::from_secs(10), "every request to v2", || {
        let r = topo.http(&format!("http://{ip}/app"), 40, 2);
        r["backends"].as_object().is_some_and(|b| b.keys().all(|k| k.trim().starts_with("v2-"))).then_some(())
    });
    // A proxy replaced by a fresh one (its configuration file gone): programmed again.
    drop(proxy);
    let t_re = Instant::now();
    proxy = gwp.start(&topo);
    wait_for(Duration::from_secs(20), "the fresh proxy programmed again", || (curl_from(&topo, &[&format!("http://{ip}/app")]).0 == 200).then_some(()));
    let reprogrammed_s = t_re.elapsed().as_secs_f64();
    eprintln!("== a fresh proxy without configuration: programmed and serving again after {reprogrammed_s:.2} s");
    drop(proxy);
    println!(
        "{}",
        json!({"kubernetes": {"event": "gateway", "fresh_proxy_programmed_s": reprogrammed_s, "address_after_apply_s": address_s, "served_after_apply_s": served_s, "split_v1_v2": [v1, v2], "grpc_unary_by_backend": backends, "reload_under_load_requests": r["requests"], "reload_under_load_errors": r["errors"]}})
    );
}

fn pod_network(topo: &Topo) -> PodNetwork {
    PodNetwork {
        netns: topo.ns("sw"),
        bridge: "br0".into(),
        subnet: "10.1.0.0/24".into(),
        range_start: "10.1.0.100".into(),
        range_end: "10.1.0.199".into(),
        gateway: "10.1.0.1".into(),
    }
}

/// Pods run by a real kubelet (built with the control plane) on Debian's containerd and runc,
/// from vectorlb's own image, networked by the CNI reference plugins onto the daemon's backend
/// segment: a Service of type LoadBalancer over them is served through vectorlb, a Pod deleted
/// under load (its preStop sleep drains it) fails no request, and scaling moves the backends.
#[test]
fn a_real_kubelet_runs_pods_of_our_image_behind_a_loadbalancer_service() {
    if let Some(why) = vectorlb_testkit::node::unavailable() {
        panic!("{why}");
    }
    let mut topo = Topo::new("kr", Shape::TwoArm, 1500);
    let (cp, _) = control_plane(&mut topo);
    let image = vectorlb_testkit::node::our_image(&cp.dir, "vectorlb.local/vectorlb:test");
    let t = Instant::now();
    let node = RealNode::start(&cp, "real-1", &pod_network(&topo), &[&image]);
    let node_ready_s = t.elapsed().as_secs_f64();
    eprintln!("== a real kubelet (containerd, runc, CNI bridge onto the backend segment): node Ready after {node_ready_s:.1} s");
    cp.apply(&[json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "default"}, "spec": {"addresses": [POOL]}})]).unwrap();
    let cfg = controller_config(&topo, &cp.dir, vectorlb_testkit::k8s::free_port());
    let _ctl = Controller::start(&cp, &cfg, "r");

    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "terminationGracePeriodSeconds": 10,
                "containers": [{"name": "web", "image": "vectorlb.local/vectorlb:test", "imagePullPolicy": "Never",
                    "command": ["/usr/local/bin/vectorlb-tools", "probe", "serve-http", "--listen", "0.0.0.0:8080", "--name", "$(POD_NAME)"],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "lifecycle": {"preStop": {"sleep": {"seconds": 2}}}}]}}}});
    let t = Instant::now();
    cp.apply(&[deployment, lb_service("web", json!({}))]).unwrap();
    let ip = wait_for(Duration::from_secs(10), "an address in the status", || address(&cp, "web"));
    let address_s = t.elapsed().as_secs_f64();
    let three = wait_for(Duration::from_secs(60), "3 real Pods answering through the VIP", || {
        let (seen, _) = backends_seen(&topo, &ip, 60);
        (seen.len() == 3).then_some(seen)
    });
    let first_success_s = t.elapsed().as_secs_f64();
    assert_eq!(three, pods(&cp, "web"), "the answers come from the Deployment's Pods");
    let ips: Vec<String> =
        cp.get(&["-n", "default", "pods", "-l", "app=web"])["items"].as_array().unwrap().iter().map(|p| p["status"]["podIP"].as_str().unwrap_or_default().to_string()).collect();
    assert!(ips.iter().all(|i| i.starts_with("10.1.0.1")), "Pod IPs from the CNI range: {ips:?}");
    eprintln!(
        "== Deployment of 3 (vectorlb's image) + Service type LoadBalancer: address {ip} after {address_s:.2} s, Pods {three:?} at {ips:?} answering after {first_success_s:.2} s"
    );

    // A Pod deleted under load: the kubelet runs its preStop sleep while the endpoint drains.
    let l = load(&topo, &ip, 8.0);
    std::thread::sleep(Duration::from_secs(2));
    let victim = three[0].clone();
    cp.k(&["-n", "default", "delete", "pod", &victim, "--wait=false"]);
    let r = finish(l);
    assert_eq!(r["errors"], 0, "a Pod deleted under load: {r}");
    let replaced = wait_for(Duration::from_secs(60), "3 Pods answering, the deleted one replaced", || {
        let (seen, _) = backends_seen(&topo, &ip, 60);
        (seen.len() == 3 && !seen.contains(&victim)).then_some(seen)
    });
    eprintln!("== Pod {victim} deleted under load: {} requests, 0 failed; now {replaced:?}", r["requests"]);
    cp.k(&["-n", "default", "scale", "deployment", "web", "--replicas=1"]);
    let one = wait_for(Duration::from_secs(60), "1 Pod answering", || {
        let (seen, errors) = backends_seen(&topo, &ip, 40);
        (seen.len() == 1 && errors == 0).then_some(seen)
    });
    assert_eq!(one, pods(&cp, "web"));
    eprintln!("== scaled to 1: only {one:?} answers");
    println!(
        "{}",
        json!({"kubernetes": {"event": "real_kubelet", "node_ready_s": node_ready_s, "address_after_apply_s": address_s, "three_pods_answering_after_apply_s": first_success_s,
            "pod_deleted_under_load_requests": r["requests"], "pod_deleted_under_load_errors": r["errors"]}})
    );
    drop(node);
    let left: Vec<String> =
        std::fs::read_dir("/var/run/netns").unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("cni-")).collect();
    assert!(left.is_empty(), "sandbox namespaces left behind: {left:?}");
}

/// The Gateway API conformance suite (its Go module, the release tools/gateway-api pins; built
/// by scripts/gateway-conformance.sh) against the GatewayClass `vectorlb`: Pods of the suite's
/// echo server run by a real kubelet, Gateways served by the daemon and the proxy, the suite's
/// requests sent from the topology's client side. GATEWAY-HTTP and GATEWAY-GRPC with the features
/// vectorlb claims (about two minutes once built): every test it runs must pass. Prints the
/// passed, failed and skipped counts, and the failed tests by name (`make conformance` keeps
/// the line in bench/results/conformance.jsonl).
#[test]
fn gateway_conformance() {
    if let Some(why) = vectorlb_testkit::node::unavailable() {
        panic!("{why}");
    }
    let o = vectorlb_testkit::sh(&["bash", repo().join("scripts/gateway-conformance.sh").to_str().unwrap()]);
    assert!(o.status.success(), "gateway-conformance.sh: {}", String::from_utf8_lossy(&o.stderr));
    let suite = PathBuf::from(stdout(&o).trim());
    let gomod = std::fs::read_to_string(repo().join("tools/gateway-api/go.mod")).unwrap();
    let version = gomod.split_whitespace().skip_while(|w| *w != "sigs.k8s.io/gateway-api").nth(1).unwrap_or("?").to_string();
    let profiles = std::env::var("VECTORLB_CONFORMANCE_PROFILES").unwrap_or_else(|_| "GATEWAY-HTTP,GATEWAY-GRPC".into());
    // What vectorlb's proxy implements beyond the profile's core (docs/kubernetes.md).
    let features = std::env::var("VECTORLB_CONFORMANCE_FEATURES")
        .unwrap_or_else(|_| "Gateway,HTTPRoute,ReferenceGrant,GRPCRoute,GatewayPort8080,HTTPRouteResponseHeaderModification,HTTPRouteRequestTimeout,HTTPRouteSchemeRedirect,HTTPRoutePortRedirect,HTTPRoutePathRedirect".into());

    let mut topo = Topo::new("kc", Shape::TwoArm, 1500);
    let (cp, _) = control_plane(&mut topo);
    gateway_crds(&cp);
    let node = RealNode::start(&cp, "real-1", &pod_network(&topo), &[&suite.join("echo-basic.tar")]);
    cp.apply(&[json!({"apiVersion": "vectorlb.io/v1alpha1", "kind": "AddressPool", "metadata": {"name": "default"}, "spec": {"addresses": [POOL]}})]).unwrap();

    let dir = cp.dir.clone();
    let gwp = GatewayProxy::new(&dir);
    let proxy = gwp.start(&topo);
    let _ctl = Controller::start(&cp, &gwp.controller_config(&topo, "30000-30999"), "c");
    cp.apply(&[json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "vectorlb"}, "spec": {"controllerName": "vectorlb.io/gateway"}})])
        .unwrap();

    let report = dir.join("conformance-report.yaml");
    let log_path = dir.join("conformance.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let t = Instant::now();
    let st = Command::new(suite.join("conformance.test"))
        .env("KUBECONFIG", cp.kubeconfig("admin"))
        .env("VECTORLB_CLIENT_NETNS", format!("/var/run/netns/{}", topo.ns("cl")))
        .args(["-test.v", "-test.timeout", "90m", "-test.run", "TestVectorlbConformance"])
        .arg("--gateway-class=vectorlb")
        .arg(format!("--conformance-profiles={profiles}"))
        .arg(format!("--supported-features={features}"))
        .args(["--organization=vectorlb", "--project=vectorlb", "--url=https://vectorlb.invalid/", "--version=dev", "--contact=vectorlb"])
        .arg(format!("--report-output={}", report.display()))
        .arg("--cleanup-base-resources=false")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    let out = std::fs::read_to_string(&log_path).unwrap_or_default();
    let (mut passed, mut failed, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    for l in out.lines() {
        let l = l.trim_start();
        for (tag, list) in [("--- PASS: ", &mut passed), ("--- FAIL: ", &mut failed), ("--- SKIP: ", &mut skipped)] {
            if let Some(rest) = l.strip_prefix(tag) {
                let name = rest.split_whitespace().next().unwrap_or_default();
                // The suite's own tests: TestVectorlbConformance/<Test>, not their sub-steps.
                if let Some(test) = name.strip_prefix("TestVectorlbConformance/") {
                    if !test.contains('/') {
                        list.push(test.to_string());
                    }
                }
            }
        }
    }
    drop(proxy);
    drop(node);
    let _ = std::fs::copy(&report, std::env::temp_dir().join("vectorlb-conformance-report.yaml"));
    let _ = std::fs::copy(&log_path, std::env::temp_dir().join("vectorlb-conformance.log"));
    println!(
        "{}",
        json!({"conformance": {"suite": format!("sigs.k8s.io/gateway-api {version}"), "profiles": profiles, "features": features, "passed": passed.len(), "failed": failed.len(),
            "skipped": skipped.len(), "failed_tests": failed, "minutes": t.elapsed().as_secs_f64() / 60.0, "suite_exit": st.code()}})
    );
    eprintln!("report: {} (copied to /tmp/vectorlb-conformance-report.yaml), log /tmp/vectorlb-conformance.log", report.display());
    assert!(!passed.is_empty(), "the suite passed no test:\n{}", tail(&out, 40));
    assert!(failed.is_empty() && st.success(), "conformance tests failed: {failed:?} (log: /tmp/vectorlb-conformance.log)\n{}", tail(&out, 40));
}
