//! A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager
//! and kube-scheduler built from the Kubernetes Go module (`scripts/k8s-bins.sh`), on loopback,
//! with certificates made here by openssl, and kubectl from the same build.
//!
//! There is no kubelet: [`FakeKubelet`] plays one for the fake [`ControlPlane::add_node`] nodes
//! as kwok does (it sets the Pods' status), except that each Pod is real: a network namespace
//! plugged into the topology's backend bridge at the Pod's IP, with nginx answering every path
//! with the Pod's name. A Pod being deleted runs its `preStop` sleep, then nginx stops
//! gracefully, and only then is the Pod removed, as a kubelet does.

use crate::openssl;
use crate::{repo, sh, stdout};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The directory with the control plane's binaries, built by `scripts/k8s-bins.sh` if needed.
pub fn bins() -> PathBuf {
    static BINS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BINS.get_or_init(|| {
        let o = Command::new("bash").arg(repo().join("scripts/k8s-bins.sh")).stderr(Stdio::inherit()).output().expect("run scripts/k8s-bins.sh");
        assert!(o.status.success(), "scripts/k8s-bins.sh failed (see above)");
        PathBuf::from(stdout(&o).trim())
    })
    .clone()
}

/// A free TCP port on loopback (bound and released; good enough for one test at a time).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A P-256 key and a certificate signed by the test CA in `dir` (`ca.crt`, `ca.key`).
fn issue(dir: &Path, name: &str, subject: &str, ext: &str) {
    let key = dir.join(format!("{name}.key"));
    let csr = dir.join(format!("{name}.csr"));
    let crt = dir.join(format!("{name}.crt"));
    let extf = dir.join(format!("{name}.ext"));
    std::fs::write(&extf, ext).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    openssl(&["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", subject, "-keyout", &s(&key), "-out", &s(&csr)]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &s(&csr),
        "-CA",
        &s(&dir.join("ca.crt")),
        "-CAkey",
        &s(&dir.join("ca.key")),
        "-CAcreateserial",
        "-days",
        "3",
        "-extfile",
        &s(&extf),
        "-out",
        &s(&crt),
    ]);
}

/// Users the tests act as: (file name, subject). `admin` is in system:masters; the others get
/// only what RBAC grants them.
const USERS: &[(&str, &str)] = &[
    ("admin", "/O=system:masters/CN=admin"),
    // Its controllers act as itself (no per-controller service accounts, whose tokens no
    // token controller here would make): it needs more than its bootstrap role gives.
    ("kcm", "/O=system:masters/CN=system:kube-controller-manager"),
    ("scheduler", "/CN=system:kube-scheduler"),
    ("controller", "/CN=system:serviceaccount:vectorlb-system:vectorlb-controller"),
];

/// One named process of the control plane, restartable with the same arguments.
struct Proc {
    name: &'static str,
    args: Vec<String>,
    child: Option<Child>,
}

pub struct ControlPlane {
    pub dir: PathBuf,
    bins: PathBuf,
    /// kube-apiserver's secure port on [`ControlPlane::address`].
    pub port: u16,
    /// The address kube-apiserver listens on and advertises: 127.0.0.1, or the one given in
    /// [`Options::netns`].
    pub address: String,
    /// The network namespace the control plane runs in (none: the test's own).
    pub netns: Option<String>,
    procs: Vec<Proc>,
}

/// How [`ControlPlane::start_with`] runs the control plane.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A network namespace (its name under /var/run/netns) and an address of it: every process
    /// of the control plane (and kubectl) runs there, kube-apiserver on that address. None: the
    /// test's own namespace, on 127.0.0.1.
    pub netns: Option<(String, String)>,
    /// A cluster of real kubelets for the Kubernetes e2e suite: the ServiceAccount admission
    /// plugin (Pods get tokens), kube-controller-manager's default controllers (token, root CA
    /// publisher, Endpoints, EndpointSlice mirroring, node lifecycle, ...), dual-stack service
    /// ranges (10.96.0.0/16, fd00:96::/112), and kube-apiserver reaching the kubelets with a
    /// client certificate (exec, logs, port-forward). The other tests' fake nodes have no
    /// heartbeat, so they run without it.
    pub full: bool,
}

/// kubectl with a kubeconfig: the one way the tests run it.
#[derive(Debug, Clone)]
pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    /// Run in this network namespace (the control plane's).
    pub netns: Option<String>,
}

/// `program` run in network namespace `netns` (by nsenter, which execs it: same process).
pub fn command_in(netns: Option<&str>, program: &Path) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/var/run/netns/{ns}")).arg(program);
            c
        }
        None => Command::new(program),
    }
}

impl Kubectl {
    pub fn command(&self) -> Command {
        let mut c = command_in(self.netns.as_deref(), &self.bin);
        c.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    /// With `input` on its standard input (`apply -f -`).
    pub fn run_with(&self, args: &[&str], input: &[u8]) -> Output {
        crate::output_with_input(self.command().args(args), input)
    }
}

impl ControlPlane {
    /// Certificates, etcd, kube-apiserver (waits for `/readyz`), kube-controller-manager and
    /// kube-scheduler, in `dir` (emptied first).
    pub fn start(dir: &Path) -> ControlPlane {
        ControlPlane::start_with(dir, &Options::default())
    }

    /// [`ControlPlane::start`] as `opts` say.
    pub fn start_with(dir: &Path, opts: &Options) -> ControlPlane {
        crate::contain_test_traffic();
        let bins = bins();
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let d = |f: &str| dir.join(f).to_str().unwrap().to_string();
        crate::self_signed(&dir.join("ca.crt"), &dir.join("ca.key"), "vectorlb-test-ca", &[]);
        let (netns, address) = match &opts.netns {
            Some((ns, a)) => (Some(ns.clone()), a.clone()),
            None => (None, "127.0.0.1".to_string()),
        };
        // Pods reach kube-apiserver at the `kubernetes` Service's cluster IPs too.
        issue(
            dir,
            "apiserver",
            "/CN=kube-apiserver",
            &format!(
                "subjectAltName=IP:127.0.0.1,IP:{address},IP:10.96.0.1,IP:fd00:96::1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n"
            ),
        );
        for (name, subject) in USERS {
            issue(dir, name, subject, "extendedKeyUsage=clientAuth\n");
        }
        openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &d("sa.key")]);
        openssl(&["ec", "-in", &d("sa.key"), "-pubout", "-out", &d("sa.pub")]);
        let port = free_port();
        let (etcd_client, etcd_peer) = (free_port(), free_port());
        let mut cp = ControlPlane { dir: dir.to_path_buf(), bins, port, address: address.clone(), netns, procs: Vec::new() };
        for (name, _) in USERS {
            cp.write_kubeconfig(name);
        }
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        cp.add(
            "etcd",
            &[
                "--name=t",
                &format!("--data-dir={}", d("etcd")),
                &format!("--listen-client-urls={etcd_url}"),
                &format!("--advertise-client-urls={etcd_url}"),
                &format!("--listen-peer-urls={peer_url}"),
                &format!("--initial-advertise-peer-urls={peer_url}"),
                &format!("--initial-cluster=t={peer_url}"),
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        );
        let mut apiserver: Vec<String> = [
            &format!("--etcd-servers={etcd_url}"),
            &format!("--bind-address={address}"),
            &format!("--advertise-address={address}"),
            &format!("--secure-port={port}"),
            &format!("--tls-cert-file={}", d("apiserver.crt")),
            &format!("--tls-private-key-file={}", d("apiserver.key")),
            &format!("--client-ca-file={}", d("ca.crt")),
            "--authorization-mode=RBAC",
            &format!("--service-account-issuer=https://127.0.0.1:{port}"),
            &format!("--service-account-key-file={}", d("sa.pub")),
            &format!("--service-account-signing-key-file={}", d("sa.key")),
            "--allow-privileged=true",
            "--profiling=false",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if opts.full {
            apiserver.extend([
                "--service-cluster-ip-range=10.96.0.0/16,fd00:96::/112".to_string(),
                format!("--kubelet-client-certificate={}", d("admin.crt")),
                format!("--kubelet-client-key={}", d("admin.key")),
                // The kubelets by their addresses: their names are in no DNS here.
                "--kubelet-preferred-address-types=InternalIP,Hostname".to_string(),
            ]);
        } else {
            apiserver.extend([
                "--service-cluster-ip-range=10.96.0.0/16".to_string(),
                // No token controller runs and Pods need no tokens: no kubelet mounts them.
                "--disable-admission-plugins=ServiceAccount".to_string(),
            ]);
        }
        cp.add("kube-apiserver", &apiserver.iter().map(String::as_str).collect::<Vec<_>>());
        cp.wait_ready(Duration::from_secs(90));
        let kcm = format!("--kubeconfig={}", d("kcm.kubeconfig"));
        let (sa_key, root_ca) = (format!("--service-account-private-key-file={}", d("sa.key")), format!("--root-ca-file={}", d("ca.crt")));
        let controllers = if opts.full {
            vec!["--controllers=*", sa_key.as_str(), root_ca.as_str()]
        } else {
            // Without a kubelet, the node lifecycle controller would mark every node NotReady
            // and evict its Pods: only what the tests need runs.
            vec!["--controllers=endpointslice-controller,deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller"]
        };
        let mut args = vec![kcm.as_str(), "--leader-elect=false", "--use-service-account-credentials=false", "--secure-port=0"];
        args.extend(controllers);
        cp.add("kube-controller-manager", &args);
        cp.add("kube-scheduler", &[&format!("--kubeconfig={}", d("scheduler.kubeconfig")), "--leader-elect=false", "--secure-port=0"]);
        cp
    }

    fn add(&mut self, name: &'static str, args: &[&str]) {
        self.procs.push(Proc { name, args: args.iter().map(|s| s.to_string()).collect(), child: None });
        self.start_proc(name);
    }

    fn start_proc(&mut self, name: &str) {
        let bin = self.bins.join(name);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{name}.log"))).unwrap();
        let p = self.procs.iter_mut().find(|p| p.name == name).expect("known process");
        assert!(p.child.is_none(), "{name} is running");
        let c = command_in(self.netns.as_deref(), &bin)
            .args(&p.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        p.child = Some(c);
    }

    /// Kills one process of the control plane (SIGKILL) and waits for it.
    pub fn kill(&mut self, name: &str) {
        let p = self.procs.iter_mut().find(|p| p.name == name).expect("known process");
        if let Some(mut c) = p.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed process again with the same arguments (kube-apiserver: waits for ready).
    pub fn restart(&mut self, name: &str) {
        self.kill(name);
        self.start_proc(name);
        if name == "kube-apiserver" {
            self.wait_ready(Duration::from_secs(60));
        }
    }

    /// The log of one process so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    fn write_kubeconfig(&self, user: &str) {
        let d = |f: &str| self.dir.join(f).to_str().unwrap().to_string();
        // JSON is YAML: kubectl, the Go components and kube-rs all read this.
        let kc = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": format!("https://{}:{}", self.address, self.port), "certificate-authority": d("ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate": d(&format!("{user}.crt")), "client-key": d(&format!("{user}.key"))}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
        });
        std::fs::write(self.kubeconfig(user), serde_json::to_vec_pretty(&kc).unwrap()).unwrap();
    }

    /// A user more (a client certificate of `subject`, e.g. `/O=system:nodes/CN=system:node:a`)
    /// and its kubeconfig, named `name`: it gets what RBAC grants it.
    pub fn add_user(&self, name: &str, subject: &str) -> PathBuf {
        issue(&self.dir, name, subject, "extendedKeyUsage=clientAuth\n");
        self.write_kubeconfig(name);
        self.kubeconfig(name)
    }

    /// The kubeconfig of one of [`USERS`]: "admin", "controller" (the vectorlb controller's
    /// service account, bound only by deploy/kubernetes RBAC), "kcm", "scheduler".
    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        self.dir.join(format!("{user}.kubeconfig"))
    }

    pub fn wait_ready(&self, limit: Duration) {
        let t = Instant::now();
        loop {
            let o = self.kubectl(&["get", "--raw", "/readyz"]);
            if o.status.success() && stdout(&o).trim() == "ok" {
                return;
            }
            assert!(t.elapsed() < limit, "kube-apiserver not ready after {limit:?}: {}\n{}", String::from_utf8_lossy(&o.stderr), tail(&self.log("kube-apiserver"), 30));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as("admin", args)
    }

    /// kubectl as `user`, to run later or from another thread.
    pub fn kubectl_for(&self, user: &str) -> Kubectl {
        Kubectl { bin: self.bins.join("kubectl"), kubeconfig: self.kubeconfig(user), netns: self.netns.clone() }
    }

    pub fn kubectl_as(&self, user: &str, args: &[&str]) -> Output {
        self.kubectl_for(user).run(args)
    }

    /// kubectl that must succeed; its stdout.
    pub fn k(&self, args: &[&str]) -> String {
        let o = self.kubectl(args);
        assert!(o.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        stdout(&o)
    }

    /// `kubectl apply -f -` of one or more objects (JSON is YAML).
    pub fn apply(&self, objects: &[Value]) -> Result<String, String> {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        self.apply_text(&serde_json::to_string(&list).unwrap())
    }

    pub fn apply_text(&self, text: &str) -> Result<String, String> {
        let o = self.kubectl_for("admin").run_with(&["apply", "-f", "-"], text.as_bytes());
        if o.status.success() {
            Ok(stdout(&o))
        } else {
            Err(String::from_utf8_lossy(&o.stderr).into_owned())
        }
    }

    /// `kubectl get -o json` of one object or a list.
    pub fn get(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.k(&a)).unwrap()
    }

    /// A binary of the control plane's build (kubectl, kubelet, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bins.join(name)
    }

    /// A Node that is Ready and schedulable, with `ip` as its InternalIP. No kubelet keeps its
    /// status: none of the controllers that would check it runs.
    pub fn add_node(&self, name: &str, ip: &str) {
        self.apply(&[json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "vectorlb.io/fake": "true"}}})]).unwrap();
        let status = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake kubelet (vectorlb testkit)"}],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "250"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "250"},
        }});
        self.k(&["patch", "node", name, "--subresource=status", "--type=merge", "-p", &status.to_string()]);
        // The TaintNodesByCondition admission plugin taints a new node not-ready; the node
        // lifecycle controller (not run) would lift it.
        let _ = self.kubectl(&["taint", "node", name, "node.kubernetes.io/not-ready:NoSchedule-"]);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            if let Some(mut c) = p.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One Pod that the fake kubelet runs.
struct PodRt {
    ns: String,
    ip: Ipv4Addr,
    dir: PathBuf,
    deleting: bool,
}

struct KubeletState {
    pods: HashMap<String, PodRt>,
    free: std::collections::VecDeque<Ipv4Addr>,
}

/// Runs the Pods bound to the fake nodes (see the module's documentation). Pods get addresses
/// from `pool` on the topology's backend bridge (`<prefix>-sw`, br0), with `gateway` as their
/// default route.
pub struct FakeKubelet {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    state: Arc<Mutex<KubeletState>>,
    watch: Arc<Mutex<Option<Child>>>,
}

#[derive(Clone)]
struct KubeletCfg {
    kubectl: Kubectl,
    prefix: String,
    dir: PathBuf,
    gateway: String,
    certs: PathBuf,
    port: u16,
}

impl KubeletCfg {
    fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl.run(args)
    }

    /// A merge patch of a Pod's status, by curl (a kubelet's one request; kubectl would cost a
    /// process start of its own).
    fn patch_status(&self, namespace: &str, name: &str, status: &Value) -> Result<(), String> {
        let d = |f: &str| self.certs.join(f).to_str().unwrap().to_string();
        let url = format!("https://127.0.0.1:{}/api/v1/namespaces/{namespace}/pods/{name}/status", self.port);
        let o = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "--cacert", &d("ca.crt"), "--cert", &d("admin.crt"), "--key", &d("admin.key")])
            .args(["-X", "PATCH", "-H", "Content-Type: application/merge-patch+json", "--data-binary", &status.to_string(), &url])
            .output()
            .map_err(|e| e.to_string())?;
        match stdout(&o).trim() {
            "200" => Ok(()),
            code => Err(format!("PATCH {url}: {code} {}", String::from_utf8_lossy(&o.stderr))),
        }
    }
}

impl FakeKubelet {
    pub fn start(cp: &ControlPlane, prefix: &str, pool: std::ops::RangeInclusive<Ipv4Addr>, gateway: &str) -> FakeKubelet {
        let (a, b) = (u32::from(*pool.start()), u32::from(*pool.end()));
        // Handed out in order and reused last, as host-local IPAM goes round its range.
        let free = (a..=b).map(Ipv4Addr::from).collect();
        let state = Arc::new(Mutex::new(KubeletState { pods: HashMap::new(), free }));
        let cfg = KubeletCfg {
            kubectl: cp.kubectl_for("admin"),
            prefix: prefix.to_string(),
            dir: cp.dir.join("pods"),
            gateway: gateway.to_string(),
            certs: cp.dir.clone(),
            port: cp.port,
        };
        std::fs::create_dir_all(&cfg.dir).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let watch: Arc<Mutex<Option<Child>>> = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, state, watch) = (stop.clone(), state.clone(), watch.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // A watch ends when kube-apiserver restarts: watch again (a new watch
                    // lists every Pod first; handling is idempotent).
                    let child =
                        cfg.kubectl.command().args(["get", "pods", "-A", "--watch", "--output-watch-events", "-o", "json"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn();
                    let Ok(mut child) = child else {
                        std::thread::sleep(Duration::from_millis(500));
                        continue;
                    };
                    let out = child.stdout.take().unwrap();
                    *watch.lock().unwrap() = Some(child);
                    for ev in serde_json::Deserializer::from_reader(BufReader::new(out)).into_iter::<Value>() {
                        let Ok(ev) = ev else { break };
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        handle(&cfg, &state, &ev);
                    }
                    if let Some(mut c) = watch.lock().unwrap().take() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            })
        };
        FakeKubelet { stop, thread: Some(thread), state, watch }
    }

    /// How many Pods run now.
    pub fn running(&self) -> usize {
        self.state.lock().unwrap().pods.values().filter(|p| !p.deleting).count()
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(mut c) = self.watch.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let pods: Vec<PodRt> = self.state.lock().unwrap().pods.drain().map(|(_, p)| p).collect();
        for p in pods {
            stop_pod(&p, false);
        }
    }
}

fn handle(cfg: &KubeletCfg, state: &Arc<Mutex<KubeletState>>, ev: &Value) {
    let pod = &ev["object"];
    let (Some(uid), Some(name), Some(namespace)) = (pod["metadata"]["uid"].as_str(), pod["metadata"]["name"].as_str(), pod["metadata"]["namespace"].as_str()) else { return };
    if pod["spec"]["nodeName"].as_str().is_none() {
        return; // not scheduled yet
    }
    let (uid, name, namespace) = (uid.to_string(), name.to_string(), namespace.to_string());
    if ev["type"] == "DELETED" {
        let p = state.lock().unwrap().pods.remove(&uid);
        if let Some(p) = p {
            stop_pod(&p, false);
            state.lock().unwrap().free.push_back(p.ip);
        }
        return;
    }
    let deleting = pod["metadata"]["deletionTimestamp"].is_string();
    let known = state.lock().unwrap().pods.get(&uid).map(|p| p.deleting);
    match (known, deleting) {
        (None, false) => {
            let Some(ip) = state.lock().unwrap().free.pop_front() else {
                eprintln!("fake kubelet: no address left for {namespace}/{name}");
                return;
            };
            let short: String = uid.chars().filter(|c| c.is_ascii_hexdigit()).take(8).collect();
            let rt = PodRt { ns: format!("{}-pod-{short}", cfg.prefix), ip, dir: cfg.dir.join(&short), deleting: false };
            let ports: Vec<u64> = pod["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
                .filter(|p| p["protocol"].as_str().unwrap_or("TCP") == "TCP")
                .filter_map(|p| p["containerPort"].as_u64())
                .collect();
            let ports = if ports.is_empty() { vec![80] } else { ports };
            // Known at once (a second event for it starts nothing); started on a thread of its
            // own, as a kubelet starts Pods side by side.
            state.lock().unwrap().pods.insert(uid.clone(), PodRt { ns: rt.ns.clone(), ip, dir: rt.dir.clone(), deleting: false });
            let (cfg, state, pod) = (cfg.clone(), state.clone(), pod.clone());
            std::thread::spawn(move || {
                if let Err(e) = start_pod(&cfg, &rt, &name, &ports) {
                    eprintln!("fake kubelet: {namespace}/{name}: {e}");
                    stop_pod(&rt, false);
                    if state.lock().unwrap().pods.remove(&uid).is_some() {
                        state.lock().unwrap().free.push_back(ip);
                    }
                    return;
                }
                if !state.lock().unwrap().pods.contains_key(&uid) {
                    // Deleted while it started.
                    stop_pod(&rt, false);
                    return;
                }
                let now = chrono_now();
                let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
                let status = json!({"status": {
                    "phase": "Running",
                    "hostIP": pod["status"]["hostIP"].as_str().unwrap_or("10.1.0.1"),
                    "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
                    "startTime": now,
                    "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
                    "containerStatuses": pod["spec"]["containers"].as_array().into_iter().flatten().map(|c| json!({
                        "name": c["name"], "image": c["image"], "imageID": "", "ready": true, "started": true, "restartCount": 0,
                        "state": {"running": {"startedAt": now}}})).collect::<Vec<_>>(),
                }});
                if let Err(e) = cfg.patch_status(&namespace, &name, &status) {
                    eprintln!("fake kubelet: status of {namespace}/{name}: {e}");
                }
            });
        }
        (Some(false), true) => {
            state.lock().unwrap().pods.get_mut(&uid).unwrap().deleting = true;
            let sleep = pod["spec"]["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64().unwrap_or(0);
            let grace = pod["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
            let (cfg, state) = (cfg.clone(), state.clone());
            std::thread::spawn(move || {
                // As a kubelet: the preStop hook, then SIGTERM (nginx: finish what is in
                // flight), then the Pod object goes.
                std::thread::sleep(Duration::from_secs(sleep.min(grace)));
                let p = state.lock().unwrap().pods.remove(&uid);
                if let Some(p) = p {
                    stop_pod(&p, true);
                    state.lock().unwrap().free.push_back(p.ip);
                }
                let _ = cfg.kubectl(&["-n", &namespace, "delete", "pod", &name, "--grace-period=0", "--force", "--wait=false"]);
            });
        }
        _ => {}
    }
}

/// RFC 3339 time now, UTC (no chrono here: from the Unix time).
fn chrono_now() -> String {
    let s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (s.div_euclid(86400), s.rem_euclid(86400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

fn start_pod(cfg: &KubeletCfg, p: &PodRt, name: &str, ports: &[u64]) -> Result<(), String> {
    let run = |args: &[&str]| -> Result<(), String> {
        let o = Command::new(args[0]).args(&args[1..]).output().map_err(|e| e.to_string())?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!("{args:?}: {}", String::from_utf8_lossy(&o.stderr)))
        }
    };
    let short = &p.ns[p.ns.len() - 8..];
    let (host, peer) = (format!("vp{short}"), format!("vq{short}"));
    let sw = format!("{}-sw", cfg.prefix);
    run(&["ip", "netns", "add", &p.ns])?;
    run(&["ip", "link", "add", &host, "type", "veth", "peer", "name", &peer])?;
    run(&["ip", "link", "set", &host, "netns", &sw])?;
    run(&["ip", "link", "set", &peer, "netns", &p.ns, "name", "eth0"])?;
    run(&["ip", "netns", "exec", &sw, "ip", "link", "set", &host, "master", "br0", "up"])?;
    run(&["ip", "netns", "exec", &p.ns, "ip", "link", "set", "lo", "up"])?;
    // As CNI plugins do, the Pod announces its address when its interface comes up (a
    // gratuitous ARP): neighbours that knew the address on an earlier Pod's MAC follow.
    run(&["ip", "netns", "exec", &p.ns, "sysctl", "-qw", "net.ipv4.conf.eth0.arp_notify=1"])?;
    run(&["ip", "netns", "exec", &p.ns, "ip", "addr", "add", &format!("{}/24", p.ip), "dev", "eth0"])?;
    run(&["ip", "netns", "exec", &p.ns, "ip", "link", "set", "eth0", "up"])?;
    run(&["ip", "netns", "exec", &p.ns, "ip", "route", "add", "default", "via", &cfg.gateway])?;
    // Generic offloads off, as on the topology's own veths (AF_XDP in copy mode on the far side).
    let _ = run(&["ip", "netns", "exec", &p.ns, "ethtool", "-K", "eth0", "tx", "off", "rx", "off", "gso", "off", "tso", "off", "gro", "off"]);
    std::fs::create_dir_all(&p.dir).map_err(|e| e.to_string())?;
    let d = p.dir.display();
    let listens: String = ports.iter().map(|port| format!("  listen {port} reuseport backlog=4096;\n")).collect();
    let conf = format!(
        "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\ndaemon on;\nevents {{ worker_connections 4096; }}\n\
         http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n fastcgi_temp_path {d}/fcgi;\n\
         uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n default_type text/plain;\n\
         server {{\n{listens}  location / {{ return 200 \"{name}\\n\"; }}\n }}\n}}\n"
    );
    std::fs::write(p.dir.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
    run(&["ip", "netns", "exec", &p.ns, "nginx", "-c", &format!("{d}/nginx.conf"), "-p", &d.to_string()])
}

/// Stops a Pod's nginx (gracefully: `nginx -s quit`, in-flight requests finish; else at once)
/// and removes its namespace and veth.
fn stop_pod(p: &PodRt, graceful: bool) {
    let pid = std::fs::read_to_string(p.dir.join("nginx.pid")).ok().and_then(|s| s.trim().parse::<i32>().ok());
    if let Some(pid) = pid {
        // SAFETY: kill(2) with a pid read from our own nginx's pid file; no memory is involved.
        unsafe { libc::kill(pid, if graceful { libc::SIGQUIT } else { libc::SIGTERM }) };
        let t = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Deleting the namespace kills what is left in it and removes the veth pair.
    for pid in stdout(&sh(&["ip", "netns", "pids", &p.ns])).split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    let _ = Command::new("ip").args(["netns", "del", &p.ns]).status();
}

/// The endpoints of a Service's EndpointSlices: address → (ready, serving, terminating).
pub fn endpoints(cp: &ControlPlane, ns: &str, svc: &str) -> BTreeMap<String, (bool, bool, bool)> {
    let v = cp.get(&["-n", ns, "endpointslices", "-l", &format!("kubernetes.io/service-name={svc}")]);
    let mut m = BTreeMap::new();
    for s in v["items"].as_array().into_iter().flatten() {
        for e in s["endpoints"].as_array().into_iter().flatten() {
            let c = &e["conditions"];
            for a in e["addresses"].as_array().into_iter().flatten() {
                m.insert(a.as_str().unwrap_or_default().to_string(), (c["ready"] == true, c["serving"] == true, c["terminating"] == true));
            }
        }
    }
    m
}
