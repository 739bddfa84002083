// The Gateway API conformance suite (this module's pinned release) against vectorlb's
// GatewayClass. scripts/gateway-conformance.sh builds this test into a binary; the ignored test
// `gateway_conformance` in crates/testkit/tests/kubernetes.rs (`make conformance`) runs it
// against a control plane with a real kubelet, vectorlb's daemon and its proxy.
//
// Two things differ from the suite's own entry point:
//   - The suite's base manifests are read from the module, less the UDP test server's
//     Deployment: its image (CoreDNS) cannot be pulled here, and it serves only UDPRoute tests,
//     which vectorlb's proxy does not claim.
//   - With VECTORLB_CLIENT_NETNS set (a network namespace's path), the suite's HTTP and gRPC
//     requests to a Gateway leave from that namespace (the test topology's client side, behind
//     which the Gateways' addresses are served); the suite still reaches the API server from
//     here. GRPCRouteWeight, whose clients cannot be pointed there, is skipped.
package conformance_test

import (
	"bytes"
	"context"
	"io/fs"
	"net"
	"os"
	"runtime"
	"testing"
	"testing/fstest"
	"time"

	"golang.org/x/sys/unix"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/gateway-api/conformance"
	confgrpc "sigs.k8s.io/gateway-api/conformance/utils/grpc"
	"sigs.k8s.io/gateway-api/conformance/utils/roundtripper"
)

const baseManifests = "base/manifests.yaml"

func TestVectorlbConformance(t *testing.T) {
	opts := conformance.DefaultOptions(t)
	base, err := fs.ReadFile(&conformance.Manifests, baseManifests)
	if err != nil {
		t.Fatalf("reading the suite's %s: %v", baseManifests, err)
	}
	filtered, dropped := withoutUDPServer(base)
	if dropped != 1 {
		t.Fatalf("expected to drop one UDP server Deployment from %s, dropped %d", baseManifests, dropped)
	}
	// One file system: the suite concatenates a path's contents from every file system given.
	opts.ManifestFS = []fs.FS{overlay{FS: &conformance.Manifests, path: baseManifests, data: filtered}}
	if ns := os.Getenv("VECTORLB_CLIENT_NETNS"); ns != "" {
		opts.RoundTripper = &roundtripper.DefaultRoundTripper{
			Debug:             opts.Debug,
			TimeoutConfig:     opts.TimeoutConfig,
			CustomDialContext: dialFrom(ns),
		}
		opts.GRPCClient = &grpcFrom{dial: dialFrom(ns)}
		// This test makes its own gRPC clients, not the one given: they would dial the Gateway's
		// address from the host, where it is not routed to the test's topology (the requests
		// would leave the machine by the host's default route). Skipped rather than run there.
		opts.SkipTests = append(opts.SkipTests, "GRPCRouteWeight")
	}
	conformance.RunConformanceWithOptions(t, opts)
}

// overlay is a file system with one file replaced.
type overlay struct {
	fs.FS
	path string
	data []byte
}

func (o overlay) Open(name string) (fs.File, error) {
	if name == o.path {
		return fstest.MapFS{name: {Data: o.data}}.Open(name)
	}
	return o.FS.Open(name)
}

// grpcFrom is the suite's gRPC client with its connections dialled from another namespace. The
// suite shares one given client among parallel tests and closes it after each, where its own
// default is a fresh client per test: here each RPC gets a client and connection of its own
// (the suite's client makes a connection only when it has none, so the one made here is used).
type grpcFrom struct {
	dial func(context.Context, string, string) (net.Conn, error)
}

func (c *grpcFrom) SendRPC(t *testing.T, address string, expected confgrpc.ExpectedResponse, timeout time.Duration) (*confgrpc.Response, error) {
	opts := []grpcgo.DialOption{
		grpcgo.WithTransportCredentials(insecure.NewCredentials()),
		grpcgo.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return c.dial(ctx, "tcp", addr) }),
	}
	if m := expected.RequestMetadata; m != nil && m.Authority != "" {
		opts = append(opts, grpcgo.WithAuthority(m.Authority))
	}
	conn, err := grpcgo.NewClient("passthrough:///"+address, opts...)
	if err != nil {
		return &confgrpc.Response{}, err
	}
	one := &confgrpc.DefaultClient{Conn: conn}
	defer one.Close()
	return one.SendRPC(t, address, expected, timeout)
}

// Close has nothing to close: every RPC closed its own connection.
func (c *grpcFrom) Close() {}

// withoutUDPServer drops the CoreDNS Deployment from a multi-document YAML file.
func withoutUDPServer(all []byte) ([]byte, int) {
	var out [][]byte
	dropped := 0
	for _, doc := range bytes.Split(all, []byte("\n---\n")) {
		if bytes.Contains(doc, []byte("\nkind: Deployment\n")) && bytes.Contains(doc, []byte("image: registry.k8s.io/coredns/")) {
			dropped++
			continue
		}
		out = append(out, doc)
	}
	return bytes.Join(out, []byte("\n---\n")), dropped
}

// dialFrom returns a dialer whose sockets are created inside the network namespace at nsPath.
// The socket is made on an OS thread moved into that namespace; the thread is never moved
// back, and Go ends it when its goroutine exits still locked to it, so no other goroutine ever
// runs in the wrong namespace. A connection keeps the namespace it was created in.
func dialFrom(nsPath string) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			// Not unlocked on purpose: see above.
			f, err := os.Open(nsPath)
			if err != nil {
				done <- result{nil, err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				done <- result{nil, err}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			done <- result{c, err}
		}()
		r := <-done
		return r.c, r.err
	}
}
