// grpc-health-server: a gRPC server from grpc-go (not written here) serving the standard
// health service, grpc.health.v1.Health/Check answering SERVING. The gRPC backend of the
// proxy's benchmark (bench/tls.py: unary requests per second through vectorlb proxy and
// through nginx grpc_pass). Built by scripts/setup.sh --bench into /opt/vectorlb/bin.
package main

import (
	"flag"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:50051", "address to serve on")
	flag.Parse()
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	log.Fatal(s.Serve(l))
}
