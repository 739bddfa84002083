//! A real Kubernetes node for the tests: the kubelet built with the control plane
//! (`scripts/k8s-bins.sh`), Debian's containerd and runc under it (a private containerd: its own
//! socket, root and state in the test's directory), and Pods networked by the CNI reference
//! plugins Debian ships (bridge and host-local) onto a bridge of the test's topology.
//!
//! What this machine needs and why (docs/kubernetes.md, "A real kubelet"):
//! - cgroup v1 and no systemd: the kubelet runs with `cgroupDriver: cgroupfs` and
//!   `failCgroupV1: false`, containerd's runc with `SystemdCgroup = false`.
//! - Processes here lack CAP_SYS_RESOURCE, so no process may lower its OOM score below its
//!   parent's; the kubelet asks -998 for every Pod sandbox, which runc then fails to set ("can't
//!   get final child's PID from pipe"). containerd's `restrict_oom_score_adj` keeps each
//!   container's score at or above containerd's own.
//! - No registry: the Pod sandbox image (deploy/kubernetes/image/pause.sh) and every image a Pod
//!   names are imported into containerd first; Pods use `imagePullPolicy: Never` or a tag that
//!   is present.
//! - containerd runs inside the topology's switch namespace (`nsenter --net`, the host's mount
//!   namespace kept), so the bridge plugin finds the topology's bridge and Pods sit on the same
//!   segment as the daemon's backends. The kubelet stays in the host's namespace, next to the
//!   API server on loopback.

use crate::k8s::{tail, ControlPlane};
use crate::repo;
use crate::wait_for;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where a node's Pods are plugged: a bridge in a network namespace, and the address range
/// host-local hands out on it.
pub struct PodNetwork {
    /// The network namespace (its name under /var/run/netns) holding `bridge`.
    pub netns: String,
    pub bridge: String,
    /// e.g. "10.1.0.0/24".
    pub subnet: String,
    pub range_start: String,
    pub range_end: String,
    /// The Pods' default route.
    pub gateway: String,
}

/// Why a real node cannot run here, if it cannot: the missing programs.
pub fn unavailable() -> Option<String> {
    let mut missing = Vec::new();
    for p in
        ["/usr/bin/containerd", "/usr/bin/ctr", "/usr/bin/containerd-shim-runc-v2", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/usr/bin/nsenter"]
    {
        if !Path::new(p).exists() {
            missing.push(p.to_string());
        }
    }
    if Command::new("runc").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        missing.push("runc".into());
    }
    (!missing.is_empty()).then(|| format!("missing {} (scripts/setup.sh installs containerd, runc and containernetworking-plugins)", missing.join(", ")))
}

/// Builds the Pod sandbox image once per test process; returns its tar.
pub fn pause_image() -> PathBuf {
    static TAR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TAR.get_or_init(|| {
        let out = std::env::temp_dir().join(format!("vectorlb-pause-{}.tar", std::process::id()));
        let o = Command::new("bash").arg(repo().join("deploy/kubernetes/image/pause.sh")).arg(&out).output().unwrap();
        assert!(o.status.success(), "pause.sh: {}", String::from_utf8_lossy(&o.stderr));
        out
    })
    .clone()
}

/// vectorlb's own image built here (deploy/kubernetes/image/build.sh) from the test's
/// binaries, as an OCI tar in `dir`.
pub fn our_image(dir: &Path, reference: &str) -> PathBuf {
    let out = dir.join("vectorlb-image.tar");
    let bins = Path::new(crate::bin()).parent().unwrap();
    let o = Command::new("bash").arg(repo().join("deploy/kubernetes/image/build.sh")).arg(bins).arg(&out).arg(reference).output().unwrap();
    assert!(o.status.success(), "build.sh: {}", String::from_utf8_lossy(&o.stderr));
    out
}

pub struct RealNode {
    pub name: String,
    pub dir: PathBuf,
    sock: PathBuf,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    kubectl: crate::k8s::Kubectl,
    netns_before: Vec<String>,
    /// The cgroup tree of a cluster node's kubelet (one directory per v1 hierarchy).
    cgroups: Vec<PathBuf>,
}

/// A kubelet that is one node of a cluster of several (the Kubernetes e2e run): it runs in the
/// node's network namespace, serves on the node's address (kube-apiserver reaches it there
/// with its client certificate: exec, logs, port-forward), points Pods at the cluster's DNS,
/// and keeps its Pods' cgroups in a tree of its own (`/vectorlb-NAME`): a kubelet kills the
/// processes of Pod cgroups it does not know, so two kubelets must never share `kubepods`.
pub struct ClusterKubelet {
    /// The node's addresses (InternalIP, one per family), the first the one it serves on.
    pub node_ips: Vec<String>,
    /// The `kube-dns` Service's cluster IP.
    pub cluster_dns: String,
}

fn netns_names() -> Vec<String> {
    std::fs::read_dir("/var/run/netns").map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default()
}

impl RealNode {
    /// Starts containerd (in `net.netns`), imports `images` (OCI tars) besides the sandbox
    /// image, starts the kubelet as node `name` and waits until the node is Ready; then lifts
    /// the not-ready taint the API server put on it at registration (the node lifecycle
    /// controller that would is not run: the fake nodes of other tests have no heartbeat).
    pub fn start(cp: &ControlPlane, name: &str, net: &PodNetwork, images: &[&Path]) -> RealNode {
        let dir = cp.dir.join(format!("node-{name}"));
        let ipam = dir.join("ipam");
        let cni = json!({"cniVersion": "1.0.0", "name": format!("vectorlb-{name}"), "plugins": [
            {"type": "bridge", "bridge": net.bridge, "isGateway": false, "ipMasq": false, "hairpinMode": true,
             "ipam": {"type": "host-local", "dataDir": ipam,
                      "ranges": [[{"subnet": net.subnet, "rangeStart": net.range_start, "rangeEnd": net.range_end, "gateway": net.gateway}]],
                      "routes": [{"dst": "0.0.0.0/0", "gw": net.gateway}]}},
            {"type": "loopback"}]});
        RealNode::start_with(cp, name, &net.netns, Path::new("/usr/lib/cni"), &cni, images)
    }

    /// [`RealNode::start`] with the node's CNI configuration list `cni` (plugins found in
    /// `cni_bin`; `dir/ipam` is there for host-local's files), containerd in network namespace
    /// `netns`.
    pub fn start_with(cp: &ControlPlane, name: &str, netns: &str, cni_bin: &Path, cni: &Value, images: &[&Path]) -> RealNode {
        RealNode::start_node(cp, name, netns, cni_bin, cni, images, None)
    }

    /// [`RealNode::start_with`], the kubelet as `cluster` says when given (else in the test's
    /// own namespace on 127.0.0.1 and a free port).
    pub fn start_node(cp: &ControlPlane, name: &str, netns: &str, cni_bin: &Path, cni: &Value, images: &[&Path], cluster: Option<&ClusterKubelet>) -> RealNode {
        if let Some(why) = unavailable() {
            panic!("a real node cannot run: {why}");
        }
        let dir = cp.dir.join(format!("node-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["cni", "ipam", "root", "state", "kubelet", "pods"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let sock = dir.join("containerd.sock");
        let d = |f: &str| dir.join(f).to_str().unwrap().to_string();
        std::fs::write(
            dir.join("containerd.toml"),
            format!(
                "version = 2\nroot = \"{}\"\nstate = \"{}\"\n[grpc]\n  address = \"{}\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\"]\n  restrict_oom_score_adj = true\n  sandbox_image = \"vectorlb.local/pause:1\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n    runtime_type = \"io.containerd.runc.v2\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n      SystemdCgroup = false\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = \"{}\"\n    conf_dir = \"{}\"\n",
                d("root"),
                d("state"),
                sock.display(),
                cni_bin.display(),
                d("cni")
            ),
        )
        .unwrap();
        std::fs::write(dir.join("cni/10-vectorlb.conflist"), serde_json::to_string_pretty(cni).unwrap()).unwrap();
        let netns_before = netns_names();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let mut containerd = Command::new("nsenter");
        containerd.arg(format!("--net=/var/run/netns/{netns}"));
        if cluster.is_some() {
            // A node of a cluster has its own host name (its node's name), which hostNetwork
            // Pods share: containerd in a UTS namespace of its own, named so.
            containerd.args(["unshare", "--uts", "sh", "-c", "hostname \"$0\" && exec containerd --config \"$1\"", name, &d("containerd.toml")]);
        } else {
            containerd.args(["containerd", "--config", &d("containerd.toml")]);
        }
        let containerd = containerd.stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
        let mut node = RealNode {
            name: name.to_string(),
            dir: dir.clone(),
            sock: sock.clone(),
            containerd: Some(containerd),
            kubelet: None,
            kubectl: cp.kubectl_for("admin"),
            netns_before,
            cgroups: Vec::new(),
        };
        wait_for(Duration::from_secs(20), "containerd's socket", || sock.exists().then_some(()));
        node.import(&pause_image());
        for i in images {
            node.import(i);
        }
        let (address, port) = match cluster {
            Some(c) => (c.node_ips[0].clone(), 10250),
            None => ("127.0.0.1".to_string(), crate::k8s::free_port()),
        };
        let mut extra = String::new();
        let mut resolv = "/etc/resolv.conf".to_string();
        if let Some(c) = cluster {
            // The node's own cgroup tree, in every v1 hierarchy (cpuset's first values copied
            // from the root: a new cpuset cgroup has none).
            let root = format!("vectorlb-{name}");
            for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
                let p = h.path();
                if p.join("cgroup.procs").exists() {
                    let d = p.join(&root);
                    // The kubelet makes its tree in the unified hierarchy itself; it is
                    // removed with the others.
                    if !p.ends_with("unified") {
                        let _ = std::fs::create_dir(&d);
                    }
                    if p.ends_with("cpuset") {
                        for f in ["cpuset.cpus", "cpuset.mems"] {
                            let _ = std::fs::write(d.join(f), std::fs::read_to_string(p.join(f)).unwrap_or_default().trim());
                        }
                    }
                    node.cgroups.push(d);
                }
            }
            // Pods of `dnsPolicy: Default` get no upstream resolver: nothing here reaches one.
            resolv = d("resolv.conf");
            std::fs::write(&resolv, "options ndots:1\n").unwrap();
            // No kubelet iptables chains: their KUBE-FIREWALL drops connections to 127/8 from
            // the node's other addresses unless conntrack DNAT'd them (a guard for kube-proxy's
            // route_localnet, which vectorlb does not set); a loopback host port is the daemon's
            // relay, which such a client reaches only without that chain.
            extra = format!(
                "makeIPTablesUtilChains: false\ncgroupRoot: /{root}\nclusterDNS: [\"{}\"]\nclusterDomain: cluster.local\n\
                 authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\n  x509:\n    clientCAFile: {}\n",
                c.cluster_dns,
                cp.dir.join("ca.crt").display()
            );
        } else {
            extra += "authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\n";
        }
        let cfg = dir.join("kubelet.yaml");
        std::fs::write(
            &cfg,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\nfailCgroupV1: false\nfailSwapOn: false\n\
                 containerRuntimeEndpoint: unix://{}\naddress: {address}\nport: {port}\nreadOnlyPort: 0\nhealthzPort: 0\n\
                 {extra}authorization:\n  mode: AlwaysAllow\n\
                 resolvConf: {resolv}\nenforceNodeAllocatable: []\ncgroupsPerQOS: true\npodLogsDir: {}\n\
                 imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
                 evictionHard:\n  memory.available: \"1Mi\"\n  nodefs.available: \"1%\"\n  imagefs.available: \"1%\"\n\
                 serializeImagePulls: false\nnodeStatusUpdateFrequency: 2s\n",
                sock.display(),
                d("pods")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("kubelet.log")).unwrap();
        let mut kubelet = match cluster {
            Some(c) => {
                let mut k = crate::k8s::command_in(Some(netns), &cp.bin("kubelet"));
                k.arg(format!("--node-ip={}", c.node_ips.join(",")));
                k
            }
            None => Command::new(cp.bin("kubelet")),
        };
        node.kubelet = Some(
            kubelet
                .args(["--config", cfg.to_str().unwrap(), "--kubeconfig", cp.kubeconfig("admin").to_str().unwrap(), "--hostname-override", name])
                .arg(format!("--root-dir={}", d("kubelet")))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let t = Instant::now();
        while !node.ready(cp) {
            if let Some(st) = node.kubelet.as_mut().unwrap().try_wait().unwrap() {
                panic!("the kubelet exited ({st}):\n{}", tail(&node.log(), 30));
            }
            assert!(t.elapsed() < Duration::from_secs(90), "node {name} not Ready after 90 s:\n{}", tail(&node.log(), 30));
            std::thread::sleep(Duration::from_millis(300));
        }
        let _ = cp.kubectl(&["taint", "node", name, "node.kubernetes.io/not-ready:NoSchedule-"]);
        node
    }

    fn ready(&self, cp: &ControlPlane) -> bool {
        let n = cp.kubectl(&["get", "node", &self.name, "-o", "json"]);
        n.status.success()
            && serde_json::from_slice::<Value>(&n.stdout)
                .ok()
                .and_then(|n| n["status"]["conditions"].as_array().cloned())
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr").arg("--address").arg(&self.sock).args(["-n", "k8s.io"]).args(args).output().unwrap()
    }

    /// Imports an OCI image tar into the node's containerd.
    pub fn import(&self, tar: &Path) {
        let o = self.ctr(&["images", "import", tar.to_str().unwrap()]);
        assert!(o.status.success(), "ctr images import {}: {}", tar.display(), String::from_utf8_lossy(&o.stderr));
    }

    /// The kubelet's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kubelet.log")).unwrap_or_default()
    }

    /// containerd's log.
    pub fn runtime_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }
}

impl Drop for RealNode {
    /// Every Pod on the node deleted through the API and stopped by the kubelet (their sandboxes
    /// torn down by the CNI plugins), then the kubelet and containerd stopped, then whatever is
    /// left killed and unmounted: no container, mount or network namespace outlives the test.
    fn drop(&mut self) {
        let kubectl = |args: &[&str]| self.kubectl.command().args(args).stderr(Stdio::null()).output();
        let selector = format!("spec.nodeName={}", self.name);
        let _ = kubectl(&["delete", "pods", "-A", "--field-selector", &selector, "--grace-period=1", "--wait=false"]);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            let left = kubectl(&["get", "pods", "-A", "--field-selector", &selector, "-o", "name"]).map(|o| o.stdout.is_empty()).unwrap_or(true);
            if left {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        if let Some(mut k) = self.kubelet.take() {
            let _ = k.kill();
            let _ = k.wait();
        }
        // Leftovers (a Pod the API server still listed): killed through containerd.
        let tasks = self.ctr(&["tasks", "ls", "-q"]);
        for id in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
            let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
        }
        std::thread::sleep(Duration::from_millis(500));
        for id in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
            let _ = self.ctr(&["tasks", "delete", "-f", id]);
        }
        if let Some(mut c) = self.containerd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Mounts under the node's directory (container root file systems, sandbox shm), deepest first.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = self.dir.to_string_lossy().into_owned();
        let mut points: Vec<&str> = mounts.lines().filter_map(|l| l.split(' ').nth(1)).filter(|p| p.starts_with(&prefix)).collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = Command::new("umount").args(["-l", p]).status();
        }
        // The kubelet's cgroup tree, deepest first (a cgroup goes only once empty).
        for root in &self.cgroups {
            let mut dirs = Vec::new();
            let mut stack = vec![root.clone()];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
                dirs.push(d);
            }
            dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for d in dirs {
                let _ = std::fs::remove_dir(d);
            }
        }
        // Sandbox network namespaces containerd made (cni-...) and did not remove.
        for n in netns_names() {
            if n.starts_with("cni-") && !self.netns_before.contains(&n) {
                let _ = Command::new("ip").args(["netns", "delete", &n]).status();
            }
        }
    }
}
