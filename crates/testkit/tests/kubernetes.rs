//! `vectorlb kube` against a real control plane (crates/testkit/src/k8s.rs): kube-apiserver,
//! kube-controller-manager and kube-scheduler built from the Kubernetes Go module, etcd, Pods
//! run by the test's fake kubelet in network namespaces behind the load balancer.

use serde_json::json;
use std::time::Duration;
use vectorlb_testkit::k8s::{endpoints, wait_for, ControlPlane, FakeKubelet};
use vectorlb_testkit::{Shape, Topo};

#[test]
fn control_plane_runs_a_deployment() {
    let topo = Topo::new("k8", Shape::TwoArm, 1500);
    let t = std::time::Instant::now();
    let cp = ControlPlane::start(&topo.dir.join("k8s"));
    eprintln!("control plane ready in {:?}", t.elapsed());
    cp.add_node("node-1", "10.1.0.250");
    let _kubelet = FakeKubelet::start(&cp, &topo.p, "10.1.0.100".parse().unwrap()..="10.1.0.239".parse().unwrap(), "10.1.0.1");
    cp.apply(&[
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}]}}}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 80}]}}),
    ])
    .unwrap();
    let eps = wait_for(Duration::from_secs(30), "3 ready endpoints", || {
        let e = endpoints(&cp, "default", "web");
        (e.values().filter(|c| c.0).count() == 3).then_some(e)
    });
    eprintln!("endpoints after {:?}: {eps:?}", t.elapsed());
}
