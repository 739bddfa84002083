# vectorlb — see README.md. Every target works from a fresh clone on Debian as root.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
BIN := target/release/vectorlb
OUT := out

.PHONY: all setup build install demo demo-pods demo-mesh demo-two-tier demo-kubernetes bench-kubernetes bench-pods bench-policy bench-mesh conformance conformance-mesh conformance-kubernetes conformance-network-policy k8s-bins attack-proxy kube-restarts bench-tls bench-dispatch bench-queue-sets demo-offline test test-e2e test-ha fuzz fuzz-api bench bench-core bench-wrk bench-cps-peers bench-quick bench-profile bench-profile-io bench-memif bench-synflood bench-report clean image

all: build

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release --bins --examples

# The binaries, the systemd unit and an example configuration (PREFIX=/usr/local, DESTDIR=).
install: build
	@bash scripts/install.sh

# The load balancer on AF_XDP ports in network namespaces, real HTTP through it (root).
demo: build
	@bash demo/demo.sh
	@bash demo/two-tier.sh
	@python3 demo/queue-sets.py
	@bash demo/scale-out.sh
	@bash demo/pods.sh
	@bash demo/mesh.sh
	@$(MAKE) --no-print-directory demo-kubernetes

# The pod network: cnitool runs vectorlb-cni for three pods (one with a memif by annotation), a
# ClusterIP over two of them, asked by the host and a pod. Ends with PODS OK ... (root).
demo-pods: build
	@bash demo/pods.sh

# The mesh (docs/mesh.md): two nodes, their node proxies, mutual TLS between them, a denied
# identity, no nftables rule. Ends with MESH OK ... (root).
demo-mesh: build
	@bash demo/mesh.sh

# Three active nodes behind an FRR router (BGP through BIRD, ECMP): one killed, one drained
# while connections run; prints what broke. Ends with SCALE-OUT OK ... (root).
demo-scale-out: build
	@bash demo/scale-out.sh

# The Kubernetes control plane the tests run (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl from the Kubernetes Go module; etcd): built once, cached
# (docs/kubernetes.md; ~6 min on a fresh machine).
k8s-bins:
	@bash scripts/k8s-bins.sh

# `vectorlb kube` against that control plane: a Deployment and a LoadBalancer Service through
# the daemon, scaling, a Pod deleted and the controller restarted under load, bad input; then a
# Gateway with HTTPRoutes and a GRPCRoute on vectorlb proxy behind the daemon; then Pods of
# vectorlb's image run by a real kubelet (containerd, runc) behind a LoadBalancer Service; then
# two real nodes whose pod network and Services are vectorlb's alone (no kube-proxy): a
# NodePort answered from the other node, externalTrafficPolicy Local, dual stack, a Service
# without endpoints refusing, client affinity; then the mesh run from Kubernetes objects on
# those two nodes (its authority, node agents and proxies; denials; rotation under load).
# Ends with KUBERNETES OK (root; ~8 min once built, ~6 more to build the e2e images once).
demo-kubernetes: build k8s-bins
	@bash scripts/gateway-crds.sh >/dev/null
	@bash scripts/k8s-e2e.sh >/dev/null
	@$(CARGO) test --release -q -p vectorlb-testkit --test kubernetes -- services_endpoints gateway_api a_real_kubelet --nocapture 2>&1 | grep -E '^(==|\{|test result)'; test $${PIPESTATUS[0]} -eq 0
	@$(CARGO) test --release -q -p vectorlb-testkit --test k8s_conformance -- services_on_two_nodes a_mesh_run_from_kubernetes_objects --nocapture 2>&1 | grep -E '^(==|\{|test result)'; test $${PIPESTATUS[0]} -eq 0 && echo "KUBERNETES OK"

# The Gateway API conformance suite (its Go module; GATEWAY-HTTP and GATEWAY-GRPC) against the
# GatewayClass `vectorlb`, its echo servers in Pods run by a real kubelet: passed, failed and
# skipped in bench/results/conformance.jsonl (root; ~3 min once built, ~4 more to build the
# suite). Also part of `make test`. See docs/kubernetes.md.
conformance: build k8s-bins
	@mkdir -p bench/results
	@$(CARGO) test --release -q -p vectorlb-testkit --test kubernetes gateway_conformance -- --nocapture 2>&1 | grep '"conformance"' | tee bench/results/conformance.jsonl; test $${PIPESTATUS[0]} -eq 0

# The Gateway API conformance suite's MESH-HTTP and MESH-GRPC profiles (the Gateway API for meshes: routes
# whose parent is a Service) on the two real nodes, the suite's namespaces meshed, its clients
# Istio's echo application built here (scripts/istio-echo.sh): the summary line in
# bench/results/mesh-conformance.jsonl, the suite's report in bench/results (root; ~2 min once
# built, ~1 more to build the echo application). Also part of `make test`. See docs/mesh.md.
conformance-mesh: build k8s-bins
	@mkdir -p bench/results
	@bash scripts/k8s-e2e.sh >/dev/null
	@bash scripts/istio-echo.sh >/dev/null
	@$(CARGO) test --release -q -p vectorlb-testkit --test k8s_conformance gateway_api_mesh_conformance -- --nocapture 2>&1 | grep '"conformance"' | tee bench/results/mesh-conformance.jsonl; test $${PIPESTATUS[0]} -eq 0
	@cp /tmp/vectorlb-mesh-conformance-report.yaml bench/results/mesh-conformance-report.yaml

# Kubernetes' own network conformance: the e2e suite's [sig-network] tests (every [Conformance]
# one, then Services, EndpointSlice, Networking, Conntrack and DNS without what
# tools/k8s-e2e/skips.txt leaves out) against two real nodes whose pod network and Services are
# vectorlb's alone, no kube-proxy. Prints the failing tests and one summary line, kept in
# bench/results/kubernetes-e2e.jsonl (root; ~6 min to build the suite once; the conformance
# tests take ~10 min and are also part of `make test`, the whole selection about an hour).
# docs/kubernetes.md.
#   make conformance-kubernetes                  the whole selection
#   E2E_FOCUS='\[Conformance\]' make conformance-kubernetes   a part of it (a regular expression)
conformance-kubernetes: build k8s-bins
	@mkdir -p bench/results
	@bash scripts/k8s-e2e.sh >/dev/null
	@VECTORLB_E2E_FOCUS="$(E2E_FOCUS)" $(CARGO) test --release -q -p vectorlb-testkit --test k8s_conformance kubernetes_network_conformance -- --ignored --nocapture 2>&1 | grep -E '^(==|FAILED:|\{"kubernetes_e2e")' | tee /tmp/vectorlb-k8s-e2e.out; test $${PIPESTATUS[0]} -eq 0; rc=$$?; grep '"kubernetes_e2e"' /tmp/vectorlb-k8s-e2e.out >> bench/results/kubernetes-e2e.jsonl; exit $$rc

# Kubernetes' NetworkPolicy e2e tests ([sig-network] Netpol), then the SIG's admin-policy
# conformance suite (network-policy-api v0.3.0, ClusterNetworkPolicy), on the same two real
# nodes, the policies enforced by the data plane (docs/network-policy.md). One summary line
# per suite: {"network_policy_e2e": {...}}; the admin suite's report in bench/results.
conformance-network-policy: build k8s-bins
	@mkdir -p bench/results
	@bash scripts/k8s-e2e.sh >/dev/null
	@bash scripts/network-policy-api.sh >/dev/null
	@VECTORLB_E2E_FOCUS="$(E2E_FOCUS)" $(CARGO) test --release -q -p vectorlb-testkit --test k8s_conformance -- --ignored --nocapture --test-threads=1 network_policy_e2e cluster_network_policy_conformance 2>&1 | grep -E '^(==|FAILED:|\{"network_policy_e2e")' | tee /tmp/vectorlb-netpol-e2e.out; test $${PIPESTATUS[0]} -eq 0; rc=$$?; grep '"network_policy_e2e"' /tmp/vectorlb-netpol-e2e.out >> bench/results/network-policy-e2e.jsonl; exit $$rc

# vectorlb's container image from the release binaries, without a base image: an OCI layout
# in target/vectorlb-image.tar (ctr images import, podman load). See docs/kubernetes.md.
image: build
	@bash deploy/kubernetes/image/build.sh

# Apply to first request over 100 Services; 1,000 Services and 20,000 endpoints programmed at
# once, the controller's memory (bench/results/kubernetes.jsonl).
bench-kubernetes: build k8s-bins
	@mkdir -p bench/results
	@$(CARGO) test --release -q -p vectorlb-testkit --test kubernetes bench -- --ignored --nocapture 2>&1 | grep '"bench":"kubernetes' | tee bench/results/kubernetes.jsonl; test $${PIPESTATUS[0]} -eq 0
	@echo "$$(git rev-parse --short HEAD) $$(date -u +%Y-%m-%d)" > bench/results/kubernetes-measured-at.txt
	@$(PY) bench/report.py --machine > bench/results/kubernetes-machine.txt

# The pod network against kube-proxy (nftables) and the bridge plugin, side by side: connections
# per second and latency to a ClusterIP, pod-to-pod UDP at 64 and 1,500 bytes, memif against
# interface pods (bench/results/pods.jsonl; docs/pod-network.md). The daemon's workers sleep as
# shipped (runtime.idle_sleep_us = 200; the tests' configuration says 100).
bench-pods: build k8s-bins
	@bash scripts/setup.sh --bench >/dev/null
	@bash scripts/cni-bins.sh >/dev/null
	@mkdir -p bench/results
	@VECTORLB_BENCH_IDLE_US=200 $(CARGO) test --release -q -p vectorlb-testkit --test pods bench_pods -- --ignored --nocapture 2>&1 | grep '"bench":"pods' | tee bench/results/pods.jsonl; test $${PIPESTATUS[0]} -eq 0
	@echo "$$(git rev-parse --short HEAD) $$(date -u +%Y-%m-%d)" > bench/results/pods-measured-at.txt
	@$(PY) bench/report.py --machine > bench/results/pods-machine.txt

# The mesh (docs/mesh.md): pod to pod across two nodes with no mesh, vectorlb's node proxies and
# HAProxy sidecars, at a fixed load and at saturation (HTTP/1.1 with a connection per request
# and with keep-alive, gRPC unary calls to Istio's echo server), and full handshakes per CPU
# second; the summary line carries the ratios (root; ~12 min).
bench-mesh: build
	@bash scripts/setup.sh --bench >/dev/null
	@bash scripts/cni-bins.sh >/dev/null
	@mkdir -p bench/results
	@VECTORLB_BENCH_IDLE_US=200 $(CARGO) test --release -q -p vectorlb-testkit --test pods bench_mesh -- --ignored --nocapture 2>&1 | grep '"bench":"mesh' | tee bench/results/mesh.jsonl; test $${PIPESTATUS[0]} -eq 0
	@echo "$$(git rev-parse --short HEAD) $$(date -u +%Y-%m-%d)" > bench/results/mesh-measured-at.txt
	@$(PY) bench/report.py --machine > bench/results/mesh-machine.txt

# NetworkPolicy at 0, 100 and 10,000 policies selecting the pods: connections per second to a
# ClusterIP and pod-to-pod UDP packets per second, vectorlb against kube-network-policies (built
# from its Go module, scripts/kube-network-policies.sh) on the bridge plugin and kube-proxy,
# side by side; then instructions per packet of an established session by callgrind
# (bench/results/policy.jsonl; docs/network-policy.md).
bench-policy: build k8s-bins
	@bash scripts/setup.sh --bench >/dev/null
	@bash scripts/cni-bins.sh >/dev/null
	@bash scripts/kube-network-policies.sh >/dev/null
	@mkdir -p bench/results
	@VECTORLB_BENCH_IDLE_US=200 $(CARGO) test --release -q -p vectorlb-testkit --test pods bench_policy -- --ignored --nocapture 2>&1 | grep '"bench":"policy' | tee bench/results/policy.jsonl; test $${PIPESTATUS[0]} -eq 0
	@bash bench/policy-profile.sh | tee -a bench/results/policy.jsonl
	@echo "$$(git rev-parse --short HEAD) $$(date -u +%Y-%m-%d)" > bench/results/policy-measured-at.txt
	@$(PY) bench/report.py --machine > bench/results/policy-machine.txt

# The two tiers of an ingress: the L4 LB (full NAT, Maglev) in front of two TLS-terminating
# proxies in front of nginx; HTTPS from curl and h2load. Ends with TWO-TIER OK ... (root).
demo-two-tier: build
	@bash demo/two-tier.sh

# The proxy (and the daemon's API) attacked as hostile clients, upstreams and careless operators
# would, through the real binary on loopback, rounds one and two (~2 min, root; also part of
# `make test`). VECTORLB_BIN=PATH attacks another build.
attack-proxy: setup
	$(CARGO) test -p vectorlb --test attack_proxy --test attack_proxy_round2 -- --nocapture

# The controller against kube-apiserver restarted 20 times at random moments under load, 10
# runs in a row (~25 min, root; one run is part of `make test`). One JSON line per run.
kube-restarts: setup
	$(CARGO) build --bins
	bash scripts/k8s-bins.sh >/dev/null
	VECTORLB_APISERVER_RUNS=10 $(CARGO) test -p vectorlb-testkit --test kubernetes the_controller_converges -- --nocapture

# Full TLS handshakes per second: the proxy's providers against nginx and HAProxy, one core
# each, h2load on the other; keep-alive requests per second (bench/results/tls.jsonl).
bench-tls: build
	@mkdir -p bench/results
	@python3 bench/tls.py --out bench/results/tls.jsonl

# Priority (software queue and DPDK event_sw) against FIFO dispatch in the proxy: a CDN mix of 1 KB-1 MB objects from an open-loop
# client at 50/80/95 % of a capacity measured in the same round, 5 paired rounds (bench/results/dispatch.jsonl, docs/img/dispatch.png).
bench-dispatch: build
	@mkdir -p bench/results
	@$(PY) bench/dispatch.py --out bench/results/dispatch.jsonl
	@echo "$$(git rev-parse --short HEAD) $$(date -u +%Y-%m-%d)" > bench/results/dispatch-measured-at.txt
	@$(PY) bench/report.py --machine > bench/results/dispatch-machine.txt

# Queue sets (seed 002): memcached's P99.99 behind the LB with bulk UDP through it, with and
# without a queue set, by request rate (root; ~3 min; bench/results/queue-sets.jsonl,
# docs/img/queue-sets.png).
bench-queue-sets: build
	@mkdir -p bench/results
	@python3 bench/queue_sets.py --out bench/results/queue-sets.jsonl

# The pipeline offline: a capture replayed through a configuration, and two short benchmarks.
demo-offline: build
	@mkdir -p $(OUT)
	@target/release/examples/demo_pcap $(OUT)/demo.pcap
	@echo "== vectorlb replay: examples/fnat-demo.toml over $(OUT)/demo.pcap"
	@$(BIN) replay --config examples/fnat-demo.toml --in $(OUT)/demo.pcap --out-dir $(OUT)/demo
	@echo "== 1 s in-memory benchmark, full NAT, 100k sessions"
	@$(BIN) bench pipeline --mode fnat --sessions 100000 --seconds 1 --json
	@$(BIN) bench cps --seconds 1 --json

test: setup
	$(CARGO) build --bins --examples
	bash scripts/k8s-bins.sh >/dev/null
	bash scripts/gateway-crds.sh >/dev/null
	bash scripts/gateway-conformance.sh >/dev/null
	bash scripts/cni-bins.sh >/dev/null
	bash scripts/k8s-e2e.sh >/dev/null
	bash scripts/istio-echo.sh >/dev/null
	$(CARGO) test --workspace --no-fail-fast 2>&1 | tee $(OUT).test.log; test $${PIPESTATUS[0]} -eq 0
	bash scripts/asan-memif.sh 2>&1 | tee -a $(OUT).test.log; test $${PIPESTATUS[0]} -eq 0
	bash scripts/leftovers.sh
	@grep -h "^test result:" $(OUT).test.log | awk '{p+=$$4; f+=$$6} END {print "total: " p " passed, " f " failed"}'
	@rm -f $(OUT).test.log

# The control API against docs/openapi.json (schemathesis; root, DPDK null devices).
fuzz-api:
	bash scripts/fuzz-api.sh

# Every fuzz target, 1,000,000 runs each (installs cargo-fuzz on first use).
fuzz:
	bash scripts/fuzz.sh

PY := $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)

# The whole benchmark kit (root; each step prints its elapsed time, memif the longest at ~20 min): in-memory pipeline, scaling, profiles, RFC 2544
# through vectorlb and dpdk-testpmd, real-TCP CPS against nftables/HAProxy/nginx, wrk, idle, memif against DPDK's net_memif;
# then docs/benchmarks.md and docs/img/*.png from bench/results/.
bench: build
	@bash scripts/setup.sh --bench
	@bash bench/all.sh

# Only the in-memory figures (bench/results/core.jsonl), then the report.
bench-core: build
	@bash scripts/setup.sh --bench
	@BENCH_STEPS=core bash bench/all.sh

# Instructions per packet and per connection by stage (callgrind; bench/results/profile.json).
bench-profile: build
	@bash scripts/setup.sh --bench
	@BENCH_STEPS=profile bash bench/all.sh

# The daemon's worker and testpmd sampled by perf at full load: time per packet by part, I/O
# included (bench/results/profile-io.jsonl).
bench-profile-io: build
	@bash scripts/setup.sh --bench
	@BENCH_STEPS=profile-io bash bench/all.sh

# memif: vectorlb's memif server (cpu and dma engines) against DPDK's net_memif in testpmd, by
# frame size, MTU 1500 and 9000, one core per side, then 25 rounds head to head at 64 and
# 1500 B (19.5 min on 2026-11-26; bench/results/memif.jsonl, memif-focus.jsonl).
bench-memif: build
	@bash scripts/setup.sh --bench
	@BENCH_STEPS=memif bash bench/all.sh

# Only the SYN floods in memory (bench/results/synflood.jsonl), then the report.
bench-synflood: build
	@BENCH_STEPS=synflood bash bench/all.sh

# docs/benchmarks.md (and docs/img/*.png) again from bench/results/ and bench/notes/ alone.
bench-report:
	@$(PY) bench/report.py

# wrk for 20 s through the demo's full-NAT VIP (bench/results/wrk-fnat.txt; docs/benchmarks.md).
bench-wrk: build
	@mkdir -p bench/results
	@DEMO_WRK=20 WRK_OUT=bench/results/wrk-fnat.txt bash demo/demo.sh

# High availability: two LB nodes with keepalived, session sync, SIGKILL of the active one
# (root). Last line: HA OK survived=<n>/100 failover_ms=<ms>.
test-ha: setup
	$(CARGO) build --bins --examples
	$(CARGO) test -p vectorlb-testkit --test ha -- --test-threads=1 --nocapture 2>&1 | tee $(OUT).ha.log; test $${PIPESTATUS[0]} -eq 0
	@grep -h "^HA OK" $(OUT).ha.log | tail -1; rm -f $(OUT).ha.log

# Reduced benchmark suite (50 s after the build): last line one JSON object with lb_mpps, testpmd_mpps,
# lb_vs_testpmd, lb_cps, nft_cps, haproxy_cps (root; installs the peers through setup).
bench-quick: build
	@bash bench/quick.sh 2>/dev/null

# Connections per second with real TCP: vectorlb, nftables, HAProxy, nginx stream side by side.
bench-cps-peers: build
	@mkdir -p bench/results
	bash bench/cps-peers.sh 5 16 | tee bench/results/cps-peers.jsonl
	$(PY) bench/report.py

# Only the end-to-end suite (root; network namespaces, AF_XDP, nginx).
test-e2e: setup
	$(CARGO) build --bins --examples
	$(CARGO) test -p vectorlb-testkit --test e2e -- --test-threads=1

clean:
	$(CARGO) clean
	rm -rf $(OUT) fuzz/target
